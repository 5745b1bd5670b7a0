//! What replays and redrives share: a **repair run** of a subscription —
//! one pipeline ([`crate::pipeline`]) under a name of its own, its readers
//! carrying a range ([`crate::reader::range`]), one plugin version, its
//! own read budget and checkpoints — with its progress on the terminal
//! ([`view`]) and its summary, and a dry run's captured effects
//! ([`capture`]).
//!
//! The subscription runs as its config describes it (dispatch mode,
//! batching, failure policy, sandbox limits and grants) but polls within
//! the run's budget, runs no canary, checkpoints every second, and
//! dead-letters instead of parking keys ([`repair_subscription`]). The
//! run is done once every shard of its stream ended in it or truly ended
//! before; an interrupt stops it in order (final checkpoints, leases
//! released), so it can go on from there.
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod capture;
mod view;

pub(super) use capture::Capture;
use view::View;

use std::collections::BTreeSet;
use std::future::Future;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use sha2::{Digest as _, Sha256};

use crate::config::{Config, LeaseBackend, OnFailure, ReadMode, StartPosition, SubscriptionConfig};
use crate::filter::Filter;
use crate::ids::{OwnerId, PluginDigest, ShardId, StreamName, SubscriptionName};
use crate::kinesis::{Kinesis, KinesisError};
use crate::lease::LeaseStore;
use crate::lease::file::FileLeaseStore;
use crate::lease::memory::MemoryLeaseStore;
use crate::pipeline::{Effects, Parts, Pipeline, Source};
use crate::plugin::{Plugin, PluginHost, World};
use crate::progress::Checkpoint;
use crate::reader::Decode;
use crate::reader::filter_feed::ActiveFilter;
use crate::reader::range::Range;
use crate::slot::PluginSlot;
use crate::supervisor::{check_stream, hostname, open_artifacts, open_store};
use crate::telemetry::Telemetry;

/// How often a repair run checkpoints (see `replay`, "Progress and
/// resuming").
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// How often a repair run's keeper looks for shards to take: children start
/// within this of their parents' end.
const SHARD_SYNC_EVERY: Duration = Duration::from_secs(2);

/// How often progress is drawn.
const DRAW_EVERY: Duration = Duration::from_millis(250);

/// How often a repair run checks whether every shard ended.
const DONE_EVERY: Duration = Duration::from_secs(1);
/// The subscription `sub` as a repair run (a replay, a redrive) runs it
/// under `name`: polling within `reads_per_second`, no canary, its own
/// checkpoints every second (module docs).
pub(super) fn repair_subscription(
    sub: &SubscriptionConfig,
    name: &SubscriptionName,
    reads_per_second: f64,
) -> SubscriptionConfig {
    let mut run_sub = sub.clone();
    run_sub.name = name.clone();
    run_sub.read = ReadMode::Polling;
    run_sub.canary = None;
    run_sub.start = StartPosition::TrimHorizon;
    run_sub.max_reads_per_second = reads_per_second;
    run_sub.checkpoint_every = CHECKPOINT_EVERY;
    // A repair run parks no key: its dead letters go to the stream, where
    // `redrive` finds them (their `subscription` is the run's name).
    if let OnFailure::Quarantine(stream) = &run_sub.failure.on_failure {
        run_sub.failure.on_failure = OnFailure::DeadLetter(stream.clone());
    }
    run_sub
}

/// What one repair run (a replay, a redrive) is made of.
pub(super) struct RepairRun<'a> {
    pub config: &'a Config,
    /// The subscription as it runs ([`repair_subscription`]).
    pub sub: Arc<SubscriptionConfig>,
    pub plugins: PluginHost,
    pub plugin: Plugin,
    pub telemetry: Arc<Telemetry>,
    pub kinesis: Kinesis,
    /// Where its progress lives.
    pub store: Arc<dyn LeaseStore>,
    pub range: Arc<Range>,
    /// A dry run's effects.
    pub capture: Option<Arc<Capture>>,
    pub decode: Option<Arc<dyn Decode>>,
    /// Its name, for messages.
    pub name: &'a str,
}

/// Runs a repair run's pipeline until every shard of its stream ended, or
/// `interrupt` (then it stops in order, resumable); returns whether it
/// finished, and the summary.
///
/// # Errors
/// When a pipeline task failed.
pub(super) async fn run_repair(
    run: RepairRun<'_>,
    interrupt: impl Future<Output = ()>,
) -> anyhow::Result<(bool, Vec<String>)> {
    let RepairRun {
        config,
        sub,
        plugins,
        plugin,
        telemetry,
        kinesis,
        store,
        range,
        capture,
        decode,
        name,
    } = run;
    let mut lease = config.lease.clone();
    lease.shard_sync_every = SHARD_SYNC_EVERY;
    lease.max_leases_per_instance = None;
    let status = telemetry.subscription(&sub.name, sub.mode());
    let filter = ActiveFilter::fixed(&telemetry, &sub.name, plugin.digest(), sub.filter.clone());
    let slot = Arc::new(PluginSlot::new(
        plugins,
        plugin,
        sub.handler_timeout,
        sub.sandbox.clone(),
        status,
        telemetry.clone(),
    ));
    let pipeline = Pipeline::start(Parts {
        subscription: sub.clone(),
        slot,
        source: Source::Kinesis {
            kinesis: kinesis.clone(),
            fan_out: None,
            effects: capture.clone().map(|c| Effects {
                outputs: c.clone(),
                dead_letters: c,
            }),
        },
        store: store.clone(),
        lease,
        owner: OwnerId::new(format!(
            "{}@{}-{}",
            sub.name,
            hostname(),
            std::process::id()
        )),
        telemetry: telemetry.clone(),
        range: Some(range.clone()),
        decode,
        filter: filter.clone(),
    });
    let finished = watch(&range, &*store, &kinesis, &sub, name, interrupt).await;
    if !pipeline.shutdown().await {
        bail!("{name}: a pipeline task failed (see the log); run it again to resume");
    }
    let shards: Vec<ShardId> = range.progress().into_keys().collect();
    Ok((
        finished,
        summary(
            &telemetry,
            &sub,
            &shards,
            &filter.borrow(),
            capture.as_deref(),
        ),
    ))
}

/// Runs a repair command (replay, redrive) from the command line: logs as
/// `run` does (stdout), progress on stderr, then its title and summary
/// lines on stdout; exits 130 when SIGINT or SIGTERM interrupted it.
///
/// # Errors
/// The config's, the log's, or the command's own (one line, before
/// anything is read).
pub(super) fn run_command<F, Fut>(
    config: &Path,
    format: super::bootstrap::Format,
    run: F,
) -> anyhow::Result<std::process::ExitCode>
where
    F: FnOnce(Config, std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = anyhow::Result<(String, Vec<String>, bool)>>,
{
    let config = super::bootstrap::config(config)?;
    let _log = super::bootstrap::logging(format, None)?;
    let (title, lines, finished) = super::bootstrap::service(|mut signals| {
        run(config, Box::pin(async move { signals.next().await }))
    })?;
    println!("{title}");
    for line in &lines {
        println!("  {line}");
    }
    Ok(if finished {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(130)
    })
}

/// `--reads-per-second`: from 0.01 (as the config's `max_reads_per_second`)
/// to 5 (Kinesis's limit per shard).
pub(super) fn check_reads_per_second(reads: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.01..=5.0).contains(&reads),
        "--reads-per-second {reads}: out of range, 0.01 to 5 (Kinesis's limit per shard)"
    );
    Ok(())
}
/// Every stream a repair run puts to exists (its outputs, its
/// dead-letter stream), as the service checks them at start.
pub(super) async fn check_streams(
    kinesis: &Kinesis,
    sub: &SubscriptionConfig,
) -> anyhow::Result<()> {
    for output in &sub.sandbox.grants.outputs {
        check_stream(kinesis, output, "outputs").await?;
    }
    if let Some(dlq) = sub.failure.on_failure.dead_letter_stream() {
        check_stream(kinesis, dlq, "dead_letter_stream").await?;
    }
    Ok(())
}

/// How long `stream` keeps records; `key` names it in the error.
///
/// # Errors
/// One line: the stream does not exist, or Kinesis cannot say.
pub(super) async fn retention_of(
    kinesis: &Kinesis,
    stream: &StreamName,
    key: &str,
) -> anyhow::Result<Duration> {
    kinesis.retention(stream).await.map_err(|e| match e {
        KinesisError::NotFound(_) => anyhow!("{key} {:?} does not exist", stream.as_str()),
        e => anyhow!("cannot describe {key} {:?}: {e}", stream.as_str()),
    })
}

/// The version a repair run runs: its plugin's bytes, the path that names
/// it, and its filter — `given` (`--plugin`) with the config's filter, or
/// the version the fleet runs (its plugin and its filter).
pub(super) async fn version_to_run<'a>(
    config: &Config,
    sub: &'a SubscriptionConfig,
    given: Option<&'a Path>,
    live: Option<&dyn LeaseStore>,
) -> anyhow::Result<(Vec<u8>, &'a Path, Option<Arc<Filter>>)> {
    Ok(match given {
        Some(path) => (read_plugin(path, "--plugin")?, path, sub.filter.clone()),
        None => {
            let (bytes, filter) = running_version(config, sub, live).await?;
            (bytes, sub.plugin.as_path(), filter)
        }
    })
}

/// The first 8 hex digits of `text`'s sha256: a short, stable name part.
pub(super) fn short_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The version a repair run runs (see `replay`, "What runs"), compiled
/// and checked against the subscription's batching.
pub(super) fn compile(
    plugins: &PluginHost,
    sub: &SubscriptionConfig,
    path: &Path,
    bytes: &[u8],
    name: &SubscriptionName,
) -> anyhow::Result<Plugin> {
    let plugin = plugins
        .load_bytes(
            path,
            bytes,
            name.clone(),
            sub.handler_timeout,
            sub.sandbox.clone(),
        )
        .with_context(|| format!("plugin {}", path.display()))?;
    match (plugin.world(), sub.batch) {
        (World::BatchHandler, None) => bail!(
            "plugin {} implements batch-handler, but subscription {} has no batch_size",
            path.display(),
            sub.name
        ),
        (World::RecordHandler, Some(_)) => bail!(
            "plugin {} implements record-handler, but subscription {} batches (batch_size)",
            path.display(),
            sub.name
        ),
        _ => {}
    }
    Ok(plugin)
}

fn read_plugin(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    crate::files::read_regular(path, crate::files::MAX_PLUGIN_BYTES)
        .with_context(|| format!("{what} {}", path.display()))
}

/// The version the fleet runs: the stable version recorded in a DynamoDB
/// lease store — its plugin's bytes (the config's file when it holds
/// them, else from `[artifacts]`) and its filter — or the config's
/// `plugin` and `filter`.
async fn running_version(
    config: &Config,
    sub: &SubscriptionConfig,
    live: Option<&dyn LeaseStore>,
) -> anyhow::Result<(Vec<u8>, Option<Arc<Filter>>)> {
    let own = read_plugin(&sub.plugin, "plugin")?;
    let Some(live) = live else {
        return Ok((own, sub.filter.clone()));
    };
    let versions = live
        .read_versions(&sub.name)
        .await
        .context("cannot read the fleet's versions")?;
    let Some((stable, versions)) = versions.and_then(|v| Some((v.stable.clone()?, v))) else {
        return Ok((own, sub.filter.clone()));
    };
    let filter = match versions.stable_filter()? {
        Some(text) => {
            Some(Arc::new(text.compile().with_context(|| {
                format!("the fleet's filter {}", text.digest)
            })?))
        }
        None => None,
    };
    if PluginDigest::of(&own) == stable {
        return Ok((own, filter));
    }
    let Some(artifacts) = open_artifacts(config).await else {
        bail!(
            "the fleet runs {stable}, which is not this config's plugin, and the config has no [artifacts] to fetch it from: give --plugin"
        );
    };
    let bytes = artifacts
        .fetch(&stable)
        .await
        .with_context(|| format!("cannot fetch the fleet's version {stable}"))?;
    Ok((bytes, filter))
}
/// Where the repair run `name` keeps its progress (see `replay`,
/// "Progress and resuming"): the live store `live` when it is the
/// DynamoDB one (opened when `None`); a file beside a file store's
/// (`<path>.replay-<name>`); memory otherwise, and for a dry run.
pub(super) async fn progress_store(
    config: &Config,
    live: Option<Arc<dyn LeaseStore>>,
    name: &str,
    dry_run: bool,
) -> anyhow::Result<Arc<dyn LeaseStore>> {
    if dry_run {
        return Ok(Arc::new(MemoryLeaseStore::new()));
    }
    Ok(match (&config.lease.store, live) {
        (LeaseBackend::DynamoDb { .. }, Some(live)) => live,
        (LeaseBackend::DynamoDb { .. }, None) => open_store(config).await?,
        (LeaseBackend::File { path }, _) => {
            let path = PathBuf::from(format!("{}.replay-{name}", path.display()));
            Arc::new(FileLeaseStore::open(&path)?)
        }
        _ => {
            eprintln!(
                "the memory lease store keeps this replay's progress in memory: it cannot resume once stopped"
            );
            Arc::new(MemoryLeaseStore::new())
        }
    })
}
/// Shows progress until every shard ended (true) or `interrupt` (false).
async fn watch(
    range: &Range,
    store: &dyn LeaseStore,
    kinesis: &Kinesis,
    sub: &SubscriptionConfig,
    name: &str,
    interrupt: impl Future<Output = ()>,
) -> bool {
    tokio::pin!(interrupt);
    let mut view = View::new(std::io::stderr().is_terminal(), name);
    let mut draw = tokio::time::interval(DRAW_EVERY);
    let mut checked = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = &mut interrupt => {
                view.finish(range);
                return false;
            }
            _ = draw.tick() => {}
        }
        view.draw(range);
        if checked.elapsed() >= DONE_EVERY {
            checked = tokio::time::Instant::now();
            if all_ended(range, store, kinesis, sub).await {
                view.finish(range);
                return true;
            }
        }
    }
}

/// Whether every shard of the stream is done: its range read in this run,
/// or a `SHARD_END` checkpoint from this run or an earlier one. False when
/// it cannot tell (a failed call is tried again).
async fn all_ended(
    range: &Range,
    store: &dyn LeaseStore,
    kinesis: &Kinesis,
    sub: &SubscriptionConfig,
) -> bool {
    let (Ok(shards), Ok(leases)) = (
        kinesis.list_shards(&sub.stream).await,
        store.list(&sub.name, &sub.stream).await,
    ) else {
        return false;
    };
    let progress = range.progress();
    let ended: BTreeSet<&ShardId> = leases
        .iter()
        .filter(|l| l.checkpoint == Some(Checkpoint::ShardEnd))
        .map(|l| &l.key.shard)
        .chain(progress.iter().filter(|(_, p)| p.done).map(|(s, _)| s))
        .collect();
    shards.iter().all(|s| ended.contains(&s.id))
}

/// The summary: outcomes by kind, then what was put (or, in a dry run,
/// captured).
pub(super) fn summary(
    t: &Telemetry,
    sub: &SubscriptionConfig,
    shards: &[ShardId],
    filter: &ActiveFilter,
    capture: Option<&Capture>,
) -> Vec<String> {
    let name = sub.name.as_str();
    let outcome = |o: &str| {
        t.counter(
            "shardlane_records_total",
            "Records handled, by the handler's outcome (retry counts each attempt).",
            &[("subscription", name), ("outcome", o)],
        )
        .get()
    };
    let failure = |k: &str| {
        t.counter(
            "shardlane_call_failures_total",
            "Handler calls that failed without an outcome, by kind.",
            &[("subscription", name), ("kind", k)],
        )
        .get()
    };
    let count = |metric: &'static str, help: &'static str| {
        t.counter(metric, help, &[("subscription", name)]).get()
    };
    let read: u64 = shards
        .iter()
        .map(|shard| {
            t.counter(
                "shardlane_records_read_total",
                "Records read from the shard and handed to dispatch (each KPL user record counts).",
                &[("subscription", name), ("shard_id", shard.as_str())],
            )
            .get()
        })
        .sum();
    let filtered = filter.filter.as_ref().map(|_| filter.filtered.get());
    let mut lines = vec![
        match filtered {
            Some(filtered) => format!("records read: {read}, filtered out: {filtered}"),
            None => format!("records read: {read}"),
        },
        format!(
            "outcomes: ack {}, reject {}, retry {}, trap {}, timeout {}, guest error {}",
            outcome("ack"),
            outcome("reject"),
            outcome("retry"),
            failure("trap"),
            failure("timeout"),
            failure("guest_error"),
        ),
        format!(
            "given up: dead-lettered {}, skipped {}",
            count(
                "shardlane_dead_lettered_total",
                "Records put to the dead-letter stream."
            ),
            count(
                "shardlane_records_skipped_total",
                "Records given up on and skipped."
            ),
        ),
    ];
    lines.extend(put_lines(t, sub, capture));
    lines
}

/// What was put to each output stream (or, in a dry run, captured).
fn put_lines(t: &Telemetry, sub: &SubscriptionConfig, capture: Option<&Capture>) -> Vec<String> {
    let name = sub.name.as_str();
    match capture {
        None => sub
            .sandbox
            .grants
            .outputs
            .iter()
            .map(|stream| {
                let put = t
                    .counter(
                        "shardlane_outputs_total",
                        "Plugin outputs put to their stream (durably accepted by Kinesis).",
                        &[("subscription", name), ("stream", stream.as_str())],
                    )
                    .get();
                format!("outputs put to {stream}: {put}")
            })
            .collect(),
        Some(capture) => capture.lines(t, name),
    }
}
