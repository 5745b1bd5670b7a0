//! A replay's progress: a bar per shard on a terminal (`indicatif`),
//! plain lines otherwise.

use std::collections::BTreeMap;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::ids::ShardId;
use crate::reader::range::{Range, ShardProgress};

/// How often, off a terminal, progress is printed as a line.
const LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Progress on a terminal (a bar per shard), or plain lines.
pub(super) struct View {
    name: String,
    bars: Option<(MultiProgress, BTreeMap<ShardId, ProgressBar>)>,
    last_line: std::time::Instant,
}

impl View {
    pub(super) fn new(terminal: bool, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            bars: terminal.then(|| {
                (
                    MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
                    BTreeMap::new(),
                )
            }),
            last_line: std::time::Instant::now(),
        }
    }

    /// A shard's estimated total: what it read over the range's fraction
    /// it covered.
    fn estimate(range: &Range, p: &ShardProgress) -> Option<u64> {
        let fraction = range.fraction(p)?;
        Some(((p.read as f64 / fraction).round() as u64).max(p.read))
    }

    pub(super) fn draw(&mut self, range: &Range) {
        let progress = range.progress();
        match &mut self.bars {
            Some((multi, bars)) => {
                for (shard, p) in &progress {
                    let bar = bars.entry(shard.clone()).or_insert_with(|| {
                        let bar = multi.add(ProgressBar::new(0));
                        bar.set_style(
                            ProgressStyle::with_template(
                                "{prefix} [{bar:30}] {pos}/{len} records {msg}",
                            )
                            .expect("a valid template")
                            .progress_chars("=> "),
                        );
                        bar.set_prefix(shard.to_string());
                        bar
                    });
                    bar.set_length(Self::estimate(range, p).unwrap_or(p.read));
                    bar.set_position(p.read);
                    bar.set_message(if p.done { "done" } else { "(estimate)" });
                }
            }
            None => {
                if self.last_line.elapsed() >= LINE_EVERY {
                    self.last_line = std::time::Instant::now();
                    eprintln!("{}", self.line(range, &progress));
                }
            }
        }
    }

    fn line(&self, range: &Range, progress: &BTreeMap<ShardId, ShardProgress>) -> String {
        let read: u64 = progress.values().map(|p| p.read).sum();
        let shards: Vec<String> = progress
            .iter()
            .map(|(shard, p)| match (p.done, Self::estimate(range, p)) {
                (true, _) => format!("{shard} done ({})", p.read),
                (false, Some(total)) => format!("{shard} {} of ~{total}", p.read),
                (false, None) => format!("{shard} {}", p.read),
            })
            .collect();
        format!(
            "replay {}: {read} records read; {}",
            self.name,
            shards.join(", ")
        )
    }

    pub(super) fn finish(&mut self, range: &Range) {
        self.draw(range);
        match &mut self.bars {
            Some((_, bars)) => {
                for bar in bars.values() {
                    bar.finish();
                }
            }
            None => eprintln!("{}", self.line(range, &range.progress())),
        }
    }
}
