//! `shardlane replay`: a range of a subscription's stream handled again,
//! through a version of the plugin, next to the running service and apart
//! from it.
//!
//! # What runs
//! One pipeline ([`crate::pipeline`]) of the subscription as its config
//! describes it — dispatch mode, batching, failure policy, sandbox limits,
//! grants — with four differences:
//! - its **name** is `<subscription>~replay~<name>`: its leases,
//!   checkpoints and per-key state are keyed by that name, so the
//!   service's leases, checkpoints and state are never read or written;
//! - its readers carry the **range** ([`crate::reader::range`]): each
//!   shard starts at the range's start (or after the replay's own
//!   checkpoint, when resumed) and ends at the range's end or the shard's
//!   tip; the lease keeper starts a split's children only once their
//!   parents ended, as for the service;
//! - it reads by polling within a **budget of its own**:
//!   [`DEFAULT_READS_PER_SECOND`] GetRecords per shard per second, so the
//!   service keeps four of each shard's five reads a second
//!   (`--reads-per-second` raises it, up to the 5 Kinesis allows), and a
//!   throttled read backs off and lowers the replay's rate, as a service
//!   reader's does;
//! - it runs **one version**, the one given (`--plugin`) or the one the
//!   fleet runs (the stable version in the lease store, fetched from
//!   `[artifacts]`; with a file or memory lease store, the config's
//!   `plugin`), never a canary or shadow, and follows no deploy.
//!
//! # State and effects
//! A replayed record sees the replay's own per-key state: empty when the
//! replay begins, then what the replay's earlier records wrote. Its writes
//! go there, committed with the replay's checkpoints (exactly once, as in
//! the service), and never into the service's state: `shardlane state get
//! --subscription <subscription>~replay~<name>` reads them. Outputs are put
//! to their streams as the service puts them (that is usually the point: a
//! fixed version's outputs), and records given up on go where the failure
//! policy says. `--dry-run` puts nothing: outputs and dead letters are
//! counted (with a few samples), state stays in memory, and progress is
//! not kept.
//!
//! # Progress and resuming
//! Progress is the replay's checkpoints: in the DynamoDB lease table for
//! a DynamoDB store (items of the replay's own lease group), in a file
//! beside the store's (`<path>.replay-<name>`) for a file store, and in
//! memory for a memory store (such a replay cannot resume). The range
//! and version are recorded under the replay's name; a replay interrupted
//! (Ctrl-C, SIGTERM, kill -9) goes on after its last checkpoint when run
//! again with `--name` (its range and version are then the recorded ones;
//! a different range or version is refused). Checkpoints are written every
//! second, each with the state written since the last, so state effects
//! stay exactly once across a crash, while outputs are at least once: a
//! record handled within the last second before a kill -9 is handled
//! again, as in the service. Ctrl-C checkpoints what settled and releases
//! the leases; after a kill -9 the leases lapse first (a lease duration).
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context as _, anyhow, bail};
use serde::{Deserialize, Serialize};

use super::repair_run::{
    Capture, RepairRun, check_reads_per_second, check_streams, compile, progress_store,
    repair_subscription, retention_of, run_repair, short_hash, version_to_run,
};
use super::subscription;
use crate::clock::now_ms;
use crate::config::{Config, LeaseBackend, SubscriptionConfig};
use crate::fleet_versions::{Command, FleetVersions};
use crate::ids::{PluginDigest, SequenceNumber, ShardId, StreamName, SubscriptionName};
use crate::kinesis::{Kinesis, ShardInfo};
use crate::lease::LeaseStore;
use crate::reader::range::{Edge, Range};
use crate::supervisor::{hostname, open_store, plugin_host};
use crate::telemetry::Telemetry;

/// A replay's GetRecords per shard per second, unless `--reads-per-second`
/// says otherwise: one of the five Kinesis allows, leaving the service
/// four.
pub(crate) const DEFAULT_READS_PER_SECOND: f64 = 1.0;

/// What `shardlane replay` was asked (its command line).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct ReplayOptions {
    /// The subscription's name.
    #[arg(long, short)]
    pub(crate) subscription: String,
    /// The range's start: a time (2026-12-06T10:00:00Z, or -2h for two
    /// hours ago), or sequence numbers per shard
    /// (shardId-000000000001=4959…,…; only the shards named are
    /// replayed). Needed to start a replay, not to resume one.
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) from: Option<String>,
    /// The range's end, included: a time (default: now), or sequence
    /// numbers per shard.
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) to: Option<String>,
    /// The plugin version to run (default: the version the fleet runs).
    #[arg(long)]
    pub(crate) plugin: Option<PathBuf>,
    /// Put and write nothing: count outputs, dead letters and state,
    /// print a summary with samples.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// The replay's name, to resume it (default: one made from the
    /// range and version, printed at the start).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// GetRecords per shard per second, at most 5 (default 1: the
    /// service keeps four of the five Kinesis allows).
    #[arg(long)]
    pub(crate) reads_per_second: Option<f64>,
}

/// `shardlane replay`.
#[derive(clap::Args)]
pub(crate) struct ReplayArgs {
    /// The TOML config file.
    #[arg(long, short, env = "SHARDLANE_CONFIG")]
    config: PathBuf,
    #[command(flatten)]
    options: ReplayOptions,
    /// Log output format (the log goes to stdout, progress to stderr).
    #[arg(long, value_enum, default_value_t = super::bootstrap::Format::Text)]
    log_format: super::bootstrap::Format,
}

impl ReplayArgs {
    pub(crate) fn run(self) -> anyhow::Result<std::process::ExitCode> {
        let Self {
            config,
            options,
            log_format,
        } = self;
        super::repair_run::run_command(&config, log_format, |config, interrupt| async move {
            let report = replay(&config, &options, interrupt).await?;
            Ok((
                format!("replay {}:", report.name),
                report.lines,
                report.finished,
            ))
        })
    }
}

/// How a replay ended.
#[derive(Debug)]
pub(crate) struct ReplayReport {
    /// Its name (for `--name`).
    pub(crate) name: String,
    /// False when interrupted before every shard ended.
    pub(crate) finished: bool,
    /// The summary, one line each.
    pub(crate) lines: Vec<String>,
}

/// The range and version a replay was started with, recorded under its
/// name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Recorded {
    from: RecordedEdge,
    to: RecordedEdge,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RecordedEdge {
    TimeMs(u64),
    Sequences(BTreeMap<String, String>),
}

impl RecordedEdge {
    fn of(edge: &Edge) -> Self {
        match edge {
            Edge::Time(ms) => RecordedEdge::TimeMs(*ms),
            Edge::Sequences(map) => RecordedEdge::Sequences(
                map.iter()
                    .map(|(s, n)| (s.as_str().to_owned(), n.as_str().to_owned()))
                    .collect(),
            ),
        }
    }

    fn edge(&self) -> anyhow::Result<Edge> {
        Ok(match self {
            RecordedEdge::TimeMs(ms) => Edge::Time(*ms),
            RecordedEdge::Sequences(map) => Edge::Sequences(
                map.iter()
                    .map(|(s, n)| Ok((ShardId::new(s.as_str()), SequenceNumber::parse(n)?)))
                    .collect::<Result<_, crate::ids::SequenceNumberError>>()
                    .context("the recorded range")?,
            ),
        })
    }
}

/// `shardlane replay` (module docs): runs until every shard's part of the
/// range is handled, or `interrupt` completes (the replay then stops in
/// order, resumable).
///
/// # Errors
/// One line naming what is wrong, before anything is read: an unknown
/// subscription, a bad range (unparsable, its end before its start, past
/// the stream's retention, in the future, an unknown shard), a name in use
/// for another range or version, a plugin that cannot run, a stream that
/// does not exist.
pub(crate) async fn replay(
    config: &Config,
    options: &ReplayOptions,
    interrupt: impl Future<Output = ()>,
) -> anyhow::Result<ReplayReport> {
    let sub = subscription(config, &options.subscription)?;
    let reads_per_second = options.reads_per_second.unwrap_or(DEFAULT_READS_PER_SECOND);
    check_reads_per_second(reads_per_second)?;
    if let Some(name) = &options.name {
        check_name(name)?;
    }
    let kinesis = Kinesis::connect(&config.aws).await;
    let asked = asked_range(&kinesis, sub, options).await?;
    if !options.dry_run {
        check_streams(&kinesis, sub).await?;
    }

    let telemetry = Telemetry::new();
    let plugins = plugin_host(config, Some(telemetry.clone()))?;
    let live_store = match config.lease.store {
        LeaseBackend::DynamoDb { .. } => Some(open_store(config).await?),
        _ => None,
    };
    let given = options.plugin.as_deref();
    let (bytes, path, filter) = version_to_run(config, sub, given, live_store.as_deref()).await?;
    let digest = PluginDigest::of(&bytes);
    let name = match &options.name {
        Some(name) => name.clone(),
        None => {
            let (from, to) = asked.as_ref().expect("a new replay has its range");
            default_name(from, to, &digest, options.dry_run)
        }
    };
    let derived = SubscriptionName::new(format!("{}{REPLAY_INFIX}{name}", sub.name));
    let plugin = compile(&plugins, sub, path, &bytes, &derived)?;

    let store = progress_store(config, live_store, &name, options.dry_run).await?;
    let digest = plugin.digest();
    let (from, to) = record(&*store, &derived, &name, asked, digest, options.dry_run).await?;
    let range = Arc::new(Range::new(from.clone(), to.clone()));

    let mut replay_sub = repair_subscription(sub, &derived, reads_per_second);
    replay_sub.filter = filter;
    let replay_sub = Arc::new(replay_sub);
    let capture = options.dry_run.then(|| Arc::new(Capture::new(sub)));
    let dry = if options.dry_run {
        ", dry run (nothing is put or written)"
    } else {
        ""
    };
    eprintln!(
        "replay {name} of {} on stream {}: {} .. {}, {reads_per_second} reads per shard per second{dry}",
        sub.name,
        sub.stream,
        describe(&from),
        describe(&to),
    );
    run_replay(
        RepairRun {
            config,
            sub: replay_sub,
            plugins,
            plugin,
            telemetry,
            kinesis,
            store,
            range,
            capture,
            decode: None,
            name: &name,
        },
        interrupt,
    )
    .await
}

/// The range asked for (`--from`, `--to`), checked against the stream;
/// `None` for a replay resumed by `--name` alone.
///
/// # Errors
/// A range that does not parse, ends before it starts, lies past the
/// stream's retention or in the future, or names a shard the stream does
/// not have; no `--from` and no `--name`.
async fn asked_range(
    kinesis: &Kinesis,
    sub: &SubscriptionConfig,
    options: &ReplayOptions,
) -> anyhow::Result<Option<(Edge, Edge)>> {
    let retention = retention_of(kinesis, &sub.stream, "stream").await?;
    let shards = kinesis
        .list_shards(&sub.stream)
        .await
        .with_context(|| format!("cannot list the shards of stream {:?}", sub.stream.as_str()))?;
    let now = now_ms();
    Ok(match &options.from {
        Some(from) => {
            let from = parse_edge("--from", from, now)?;
            let to = parse_edge("--to", options.to.as_deref().unwrap_or("now"), now)?;
            check_range(&from, &to, now, retention, &shards, &sub.stream)?;
            Some((from, to))
        }
        None if options.name.is_none() => {
            bail!("--from is needed to start a replay (or --name to resume one)")
        }
        None => None,
    })
}

/// Runs the replay `bounded` until its end or `interrupt`: its report.
///
/// # Errors
/// A pipeline task that failed.
async fn run_replay(
    bounded: RepairRun<'_>,
    interrupt: impl Future<Output = ()>,
) -> anyhow::Result<ReplayReport> {
    let name = bounded.name.to_owned();
    let (finished, mut lines) = run_repair(bounded, interrupt).await?;
    if !finished {
        lines.push(format!(
            "interrupted: run it again with --name {name} to go on where it stopped"
        ));
    }
    Ok(ReplayReport {
        name,
        finished,
        lines,
    })
}

/// A replay's name: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub(super) fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    anyhow::ensure!(
        ok,
        "--name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-'"
    );
    Ok(())
}

/// The name of a replay run without `--name`: its range, version and kind,
/// hashed.
fn default_name(from: &Edge, to: &Edge, digest: &PluginDigest, dry_run: bool) -> String {
    format!(
        "r-{}",
        short_hash(&format!("{from:?}|{to:?}|{digest}|{dry_run}"))
    )
}

/// Parses one edge: `shard=sequence[,shard=sequence…]`, or a time: RFC
/// 3339 (`2026-12-06T10:00:00Z`), `-<duration>` before now (`-2h`), or
/// `now`.
pub(super) fn parse_edge(flag: &str, text: &str, now: u64) -> anyhow::Result<Edge> {
    let text = text.trim();
    if text.contains('=') {
        let mut map = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (shard, sequence) = pair
                .split_once('=')
                .with_context(|| format!("{flag} {pair:?}: not shard=sequence"))?;
            let sequence = SequenceNumber::parse(sequence.trim())
                .map_err(|e| anyhow!("{flag} {pair:?}: {e}"))?;
            let shard = ShardId::new(shard.trim());
            anyhow::ensure!(
                map.insert(shard.clone(), sequence).is_none(),
                "{flag} names shard {shard} twice"
            );
        }
        return Ok(Edge::Sequences(map));
    }
    if text == "now" {
        return Ok(Edge::Time(now));
    }
    let bad = || {
        anyhow!(
            "{flag} {text:?}: not a time (RFC 3339 such as 2026-12-06T10:00:00Z, -2h for two hours ago, or now) nor sequence numbers (shardId-…=…,…)"
        )
    };
    if let Some(ago) = text.strip_prefix('-') {
        let ago = humantime::parse_duration(ago).map_err(|_| bad())?;
        return Ok(Edge::Time(now.saturating_sub(ago.as_millis() as u64)));
    }
    let at = humantime::parse_rfc3339_weak(text).map_err(|_| bad())?;
    let ms = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| bad())?
        .as_millis();
    Ok(Edge::Time(u64::try_from(ms).map_err(|_| bad())?))
}

/// An edge as the command prints it.
pub(super) fn describe(edge: &Edge) -> String {
    match edge {
        Edge::Time(ms) => {
            humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(*ms)).to_string()
        }
        Edge::Sequences(map) => map
            .iter()
            .map(|(s, n)| format!("{s}={n}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Refuses a range that cannot be replayed: its end before its start, a
/// start older than the stream keeps records, an end in the future, a
/// shard the stream does not have.
fn check_range(
    from: &Edge,
    to: &Edge,
    now: u64,
    retention: Duration,
    shards: &[ShardInfo],
    stream: &StreamName,
) -> anyhow::Result<()> {
    // A second of slack for clocks that disagree a little.
    const SLACK_MS: u64 = 1_000;
    let known: BTreeSet<&ShardId> = shards.iter().map(|s| &s.id).collect();
    for (flag, edge) in [("--from", from), ("--to", to)] {
        match edge {
            Edge::Time(ms) => {
                let oldest = now.saturating_sub(retention.as_millis() as u64);
                if flag == "--from" && *ms + SLACK_MS < oldest {
                    bail!(
                        "--from {}: older than stream {:?} keeps records ({} h): they are gone",
                        describe(edge),
                        stream.as_str(),
                        retention.as_secs() / 3_600
                    );
                }
                if *ms > now + SLACK_MS {
                    bail!(
                        "{flag} {}: in the future; a replay covers records already in the stream",
                        describe(edge)
                    );
                }
            }
            Edge::Sequences(map) => {
                anyhow::ensure!(!map.is_empty(), "{flag}: no shard=sequence given");
                if let Some(unknown) = map.keys().find(|s| !known.contains(s)) {
                    bail!(
                        "{flag} names shard {unknown}, which stream {:?} does not have",
                        stream.as_str()
                    );
                }
            }
        }
    }
    match (from, to) {
        (Edge::Time(f), Edge::Time(t)) if t < f => {
            bail!("--to {} is before --from {}", describe(to), describe(from))
        }
        (Edge::Sequences(starts), Edge::Sequences(ends)) => {
            for (shard, end) in ends {
                let Some(start) = starts.get(shard) else {
                    bail!("--to names shard {shard}, which --from does not");
                };
                anyhow::ensure!(
                    end >= start,
                    "--to {end} of shard {shard} is before its --from {start}"
                );
            }
        }
        _ => {}
    }
    Ok(())
}

/// Between a subscription's name and a replay's in the replay's
/// subscription name.
pub(super) const REPLAY_INFIX: &str = "~replay~";

/// Records the replay's range and version under its name, or checks them
/// against what was recorded when it began; returns the range to read.
async fn record(
    store: &dyn LeaseStore,
    derived: &SubscriptionName,
    name: &str,
    asked: Option<(Edge, Edge)>,
    digest: &PluginDigest,
    dry_run: bool,
) -> anyhow::Result<(Edge, Edge)> {
    let recorded = store
        .read_versions(derived)
        .await
        .context("cannot read the replay's record")?;
    if let Some(versions) = recorded
        && let Some(first) = versions.history.first()
    {
        let was: Recorded = serde_json::from_str(&first.note)
            .with_context(|| format!("replay {name}: its record is not one this version wrote"))?;
        if &first.digest != digest {
            bail!(
                "replay {name} runs {}, not {digest}: give --plugin with that version, or another --name",
                first.digest
            );
        }
        let (from, to) = (was.from.edge()?, was.to.edge()?);
        if let Some((asked_from, asked_to)) = asked
            && (asked_from != from || asked_to != to)
        {
            bail!(
                "replay {name} covers {} .. {}: give that range (or no --from/--to) to resume it, or another --name",
                describe(&from),
                describe(&to)
            );
        }
        eprintln!("resuming replay {name}");
        return Ok((from, to));
    }
    let Some((from, to)) = asked else {
        bail!("no replay named {name} was started: give --from (and --to) to start it");
    };
    if dry_run {
        return Ok((from, to));
    }
    let mut first = FleetVersions::default()
        .apply(
            Command::Deploy(digest.clone().into()),
            &format!("cli@{}", hostname()),
            now_ms(),
        )
        .context("the replay's record")?;
    if let Some(change) = first.history.last_mut() {
        change.note = serde_json::to_string(&Recorded {
            from: RecordedEdge::of(&from),
            to: RecordedEdge::of(&to),
        })?;
    }
    store
        .write_versions(derived, &first)
        .await
        .with_context(|| format!("cannot record replay {name}"))?;
    Ok((from, to))
}

#[cfg(test)]
mod tests;
