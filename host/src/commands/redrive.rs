//! `shardlane redrive`: dead letters handed back to a plugin version, as
//! the records they carry, in their original per-key order; and, with
//! `--key`, a parked key's records brought back and the key released.
//!
//! # What runs
//! A repair run (as a replay's, see `replay`) of the subscription
//! over its **dead-letter stream**, under its own name —
//! `<subscription>~redrive`, or `<subscription>~redrive~<hash of the
//! key>` with `--key` — from `--since` (default: as far back as the
//! stream keeps) to each shard's tip, where it keeps its place with an
//! ordinary checkpoint (an open-ended range, see `crate::reader::range`),
//! so the next redrive starts there. Its readers turn
//! each envelope back into the record it carries (data, partition key,
//! source stream, shard, sequence and sub-sequence numbers, arrival) and
//! drop the envelopes it does not redrive: another subscription's; records
//! of parked keys (reason `quarantined`: `--key` brings those back,
//! releasing the key); with `--key`, everything but the key's current
//! parking's records. An envelope whose data was left out
//! (`data_omitted`) is read back from its source stream at its sequence
//! number. A read that fails for a passing reason — throttling, a timeout,
//! the network, an answer that does not reach the record yet — is tried
//! again with a backoff until it succeeds or the redrive is interrupted
//! (the record is then left for the next run: nothing is skipped). The
//! record is **gone** only when the stream says so — the shard no longer
//! exists, the sequence number is refused, or the stream answers with
//! later records than it (past its retention) — and then the redrive says
//! so, naming both records, counts it in the summary as gone, and goes
//! on.
//!
//! # Order, and nothing twice
//! A key's dead letters are on one shard of the dead-letter stream (same
//! partition key), in the order its records were given up on, which is
//! their order in the source (sequential and `by_key` dispatch give a
//! key's records up in order; a quarantine parks them in order). The
//! redrive reads each shard in order and dispatches by key (`workers = n`
//! runs as `workers = n, by_key = true`), so each key's records reach the
//! plugin in their original order. Its checkpoints, in the lease store
//! under its own name, record what it handled: run again, it goes on
//! after them, so nothing is handled twice.
//!
//! A record dead-lettered twice — a crash between its put and the
//! checkpoint that passed it, or a parked record parked again after a
//! crash — has two envelopes with the same `id` (its place in the source,
//! see `crate::failure`). A redrive hands each id back once: it remembers
//! the ids it handed out (the latest [`IDS_KEPT`](envelopes::IDS_KEPT); a second envelope
//! follows its first within a crash's recovery, far closer than that),
//! and skips and counts the second, so neither a duplicate nor a record
//! out of order reaches the plugin.
//!
//! # The policy, state and effects
//! The subscription's failure policy applies (a quarantine dead-letters
//! again instead of parking); outputs are put as the service puts them;
//! `--dry-run` puts and writes nothing. A redrive runs **without per-key
//! state**: state is applied exactly once with the source's checkpoints,
//! which a redrive does not own, so a plugin's state calls answer that no
//! state is granted.
//!
//! # Releasing a parked key (`--key`)
//! It reads the key's item (see `crate::parked`) and takes the
//! `quarantined` envelopes of the key's current parking (the item's
//! `parking`, which every one of its dead letters carries; an earlier
//! parking's were redriven when it was released), reading the dead-letter
//! stream from the first of them (the item's `first_put`: that shard,
//! from that sequence number; the whole stream when the item does not
//! say). Nothing is decided by a host's clock. Once it handled every one
//! up to the stream's tip, it releases the key **only if** it found them
//! all (from the item's `first` on, at least as many as it counts, none
//! gone from its source), every one was acked, and the item is still as
//! read when the last was handed out — a conditional delete on its
//! revision, so a record parked meanwhile keeps the key parked; otherwise
//! the key stays parked and the summary says why. The service's next
//! record of the key is then handled as usual, after all of those. A
//! key's redrive keeps no progress: interrupted, it brings every parked
//! record back again when run again (at least once; the key stays parked
//! meanwhile, so the order holds); released, the key has nothing left to
//! redrive.
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod envelopes;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};

use super::repair_run::{
    Capture, RepairRun, check_reads_per_second, compile, progress_store, repair_subscription,
    retention_of, run_repair, short_hash, version_to_run,
};
use super::replay::{describe, parse_edge};
use super::subscription;
use crate::clock::now_ms;
use crate::config::{Config, DispatchMode, LeaseBackend, SubscriptionConfig};
use crate::failure::decode_parked;
use crate::ids::{PartitionKey, SequenceNumber, ShardId, StreamName, SubscriptionName};
use crate::kinesis::Kinesis;
use crate::lease::{ItemKind, LeaseStore};
use crate::parked::{ParkedKey, ReleaseRefused};
use crate::reader::Decode;
use crate::reader::range::{Edge, Range};
use crate::supervisor::{open_store, plugin_host};
use crate::telemetry::Telemetry;
use envelopes::{Envelopes, Parking};

/// What `shardlane redrive` was asked (its command line).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct RedriveOptions {
    /// The subscription's name.
    #[arg(long, short)]
    pub(crate) subscription: String,
    /// Only dead letters put since this time (RFC 3339, or -2h).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) since: Option<String>,
    /// The plugin version to run (default: the version the fleet runs).
    #[arg(long)]
    pub(crate) plugin: Option<PathBuf>,
    /// Put, write and release nothing: count and print a summary.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// A parked key (`shardlane quarantine list`): bring its records
    /// back in order, then release it.
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// GetRecords per dead-letter shard per second (default 5).
    #[arg(long)]
    pub(crate) reads_per_second: Option<f64>,
}

/// `shardlane redrive`.
#[derive(clap::Args)]
pub(crate) struct RedriveArgs {
    /// The TOML config file.
    #[arg(long, short, env = "SHARDLANE_CONFIG")]
    config: PathBuf,
    #[command(flatten)]
    options: RedriveOptions,
    /// Log output format (the log goes to stdout, progress to stderr).
    #[arg(long, value_enum, default_value_t = super::bootstrap::Format::Text)]
    log_format: super::bootstrap::Format,
}

impl RedriveArgs {
    pub(crate) fn run(self) -> anyhow::Result<std::process::ExitCode> {
        let Self {
            config,
            options,
            log_format,
        } = self;
        super::repair_run::run_command(&config, log_format, |config, interrupt| async move {
            let report = redrive(&config, &options, interrupt).await?;
            Ok(("redrive:".to_owned(), report.lines, report.finished))
        })
    }
}

/// How a redrive ended.
#[derive(Debug)]
pub(crate) struct RedriveReport {
    /// False when interrupted (run it again to go on).
    pub(crate) finished: bool,
    /// The summary, one line each.
    pub(crate) lines: Vec<String>,
}

/// `shardlane redrive` (module docs).
///
/// # Errors
/// One line, before anything is read: an unknown subscription, one without
/// a dead-letter stream, a dead-letter stream that does not exist, a
/// `--since` that is not a time, a `--key` that is not parked, a plugin
/// that cannot run.
pub(crate) async fn redrive(
    config: &Config,
    options: &RedriveOptions,
    interrupt: impl Future<Output = ()>,
) -> anyhow::Result<RedriveReport> {
    let redrive = Redrive::plan(config, options).await?;
    let (finished, lines) = redrive.run(interrupt).await?;
    Ok(redrive.report(finished, lines).await)
}

/// A parked key being brought back.
struct KeyRedrive {
    key: PartitionKey,
    /// Its item as the redrive began.
    parked: ParkedKey,
}

/// One redrive, planned (every check done, nothing read yet), then run and
/// reported: a method per step.
struct Redrive<'a> {
    config: &'a Config,
    options: &'a RedriveOptions,
    sub: &'a SubscriptionConfig,
    dlq: StreamName,
    kinesis: Kinesis,
    /// Opened for `--key` and for a DynamoDB fleet.
    store: Option<Arc<dyn LeaseStore>>,
    key: Option<KeyRedrive>,
    /// Where reading the dead-letter stream starts.
    from: Edge,
    reads_per_second: f64,
    envelopes: Arc<Envelopes>,
    telemetry: Arc<Telemetry>,
    /// `redrive`, or `redrive-<hash of the key>`.
    name: String,
    /// The run's subscription name.
    derived: SubscriptionName,
}

impl<'a> Redrive<'a> {
    /// Checks everything and plans the run (the errors of [`redrive`]).
    async fn plan(config: &'a Config, options: &'a RedriveOptions) -> anyhow::Result<Self> {
        let sub = subscription(config, &options.subscription)?;
        let Some(dlq) = sub.failure.on_failure.dead_letter_stream().cloned() else {
            bail!(
                "subscription {:?} has no dead_letter_stream: only on_failure = \"dead_letter\" or \"quarantine\" puts dead letters",
                sub.name.as_str()
            );
        };
        let reads_per_second = options.reads_per_second.unwrap_or(5.0);
        check_reads_per_second(reads_per_second)?;
        let kinesis = Kinesis::connect(&config.aws).await;
        let retention = retention_of(&kinesis, &dlq, "dead_letter_stream").await?;
        let since = since(options, now_ms(), retention)?;
        // The lease store: for a key's item, and (DynamoDB) the fleet's
        // version and the redrive's progress. A file store a running host
        // holds is not needed otherwise.
        let dynamodb = matches!(config.lease.store, LeaseBackend::DynamoDb { .. });
        let store = if options.key.is_some() || dynamodb {
            Some(open_store(config).await?)
        } else {
            None
        };
        let key = match (&options.key, &store) {
            (Some(key), Some(store)) => Some(parked_key(&**store, sub, key).await?),
            _ => None,
        };
        let from = match (&key, options.since.is_some()) {
            (Some(k), false) => first_put(&k.parked).unwrap_or(Edge::Time(since)),
            _ => Edge::Time(since),
        };
        let name = match &key {
            None => "redrive".to_owned(),
            Some(k) => format!("redrive-{}", short_hash(k.key.as_str())),
        };
        let derived = SubscriptionName::new(format!(
            "{}~{}",
            sub.name,
            name.replacen("redrive-", "redrive~", 1)
        ));
        let envelopes = Arc::new(Envelopes::new(
            sub.name.clone(),
            key.as_ref().map(|k| Parking {
                key: k.key.clone(),
                parking: k.parked.parking.clone(),
            }),
            kinesis.clone(),
        ));
        Ok(Self {
            config,
            options,
            sub,
            dlq,
            kinesis,
            store,
            key,
            from,
            reads_per_second,
            envelopes,
            telemetry: Telemetry::new(),
            name,
            derived,
        })
    }

    /// The repair run over the dead-letter stream: whether it finished,
    /// and the run's summary.
    async fn run(
        &self,
        interrupt: impl Future<Output = ()>,
    ) -> anyhow::Result<(bool, Vec<String>)> {
        let (config, sub, options) = (self.config, self.sub, self.options);
        let plugins = plugin_host(config, Some(self.telemetry.clone()))?;
        let dynamodb = matches!(config.lease.store, LeaseBackend::DynamoDb { .. });
        let live = self.store.clone().filter(|_| dynamodb);
        let (bytes, path, filter) =
            version_to_run(config, sub, options.plugin.as_deref(), live.as_deref()).await?;
        let plugin = compile(&plugins, sub, path, &bytes, &self.derived)?;
        // A key's redrive keeps no progress: run again after an
        // interruption, it brings every parked record back again (the key
        // stays parked meanwhile, so their order holds), and once released
        // it has nothing left to do.
        let progress = progress_store(
            config,
            live,
            &self.name,
            options.dry_run || self.key.is_some(),
        )
        .await?;
        let mut run_sub = repair_subscription(sub, &self.derived, self.reads_per_second);
        run_sub.stream = self.dlq.clone();
        run_sub.filter = filter;
        Arc::make_mut(&mut run_sub.sandbox.grants).state = None;
        if let DispatchMode::Workers(n) = run_sub.dispatch {
            run_sub.dispatch = DispatchMode::ByKey(n);
        }
        let range = Arc::new(Range::open_ended(self.from.clone()));
        self.announce();
        run_repair(
            RepairRun {
                config,
                sub: Arc::new(run_sub),
                plugins,
                plugin,
                telemetry: self.telemetry.clone(),
                kinesis: self.kinesis.clone(),
                store: progress,
                range,
                capture: options.dry_run.then(|| Arc::new(Capture::new(sub))),
                decode: Some(self.envelopes.clone() as Arc<dyn Decode>),
                name: &self.name,
            },
            interrupt,
        )
        .await
    }

    /// The line on stderr saying what runs.
    fn announce(&self) {
        eprintln!(
            "redrive of {} from dead_letter_stream {}{}: dead letters from {}{}",
            self.sub.name,
            self.dlq,
            self.key
                .as_ref()
                .map(|k| format!(", parked key {} (parking {})", k.key, k.parked.parking))
                .unwrap_or_default(),
            describe(&self.from),
            if self.options.dry_run {
                ", dry run (nothing is put, written or released)"
            } else {
                ""
            },
        );
    }

    /// The summary: what the readers did with the envelopes, the run's
    /// lines, and, for a key, its release.
    async fn report(&self, finished: bool, mut lines: Vec<String>) -> RedriveReport {
        lines.insert(0, self.envelopes.counts.describe());
        if let Some(key) = &self.key
            && finished
            && !self.options.dry_run
        {
            lines.push(self.release(key).await);
        }
        if !finished {
            lines.push("interrupted: run the same command again to go on where it stopped".into());
        }
        RedriveReport { finished, lines }
    }

    /// Releases `key` after its redrive (module docs, "Releasing"): a line
    /// saying what happened.
    async fn release(&self, key: &KeyRedrive) -> String {
        let k = &key.key;
        let acked = self
            .telemetry
            .counter(
                "shardlane_records_total",
                "Records handled, by the handler's outcome (retry counts each attempt).",
                &[("subscription", self.derived.as_str()), ("outcome", "ack")],
            )
            .get();
        let seen = self.envelopes.seen();
        if let Err(why) = seen.complete(&key.parked, acked) {
            return format!("key {k} stays parked: {why}");
        }
        let Some(store) = self.store.as_deref() else {
            return format!("key {k} stays parked: no lease store");
        };
        let current = match store
            .read_item(&self.sub.name, ItemKind::Parked, k.as_str())
            .await
        {
            Ok(Some(item)) => match decode_parked(&item) {
                Ok(current) => current,
                Err(e) => return format!("key {k} stays parked: {e}"),
            },
            Ok(None) => return format!("key {k} was released already"),
            Err(e) => return format!("key {k} stays parked: cannot read its item: {e}"),
        };
        let last = seen.last.clone().unwrap_or_else(|| key.parked.last.clone());
        if let Err(e @ ReleaseRefused::Moved { .. }) = current.release(k.as_str(), &last) {
            return format!("key {k} stays parked: {e}; run redrive --key {k} again");
        }
        match store
            .delete_item(
                &self.sub.name,
                ItemKind::Parked,
                k.as_str(),
                current.revision,
            )
            .await
        {
            Ok(true) => {
                tracing::warn!(subscription = %self.sub.name, partition_key = %k, records = seen.redriven, "parked key released: its records were redriven");
                format!(
                    "key {k} released: its {} parked records were redriven in order",
                    seen.redriven
                )
            }
            Ok(false) => format!(
                "key {k} stays parked: it parked another record meanwhile; run redrive --key {k} again"
            ),
            Err(e) => format!("key {k} stays parked: cannot release it: {e}"),
        }
    }
}

/// Where reading starts by time: `--since`, or all the stream keeps.
fn since(
    options: &RedriveOptions,
    now: u64,
    retention: std::time::Duration,
) -> anyhow::Result<u64> {
    Ok(match &options.since {
        None => now.saturating_sub(retention.as_millis() as u64),
        Some(text) => match parse_edge("--since", text, now)? {
            Edge::Time(ms) if ms <= now + 1_000 => ms,
            Edge::Time(_) => bail!("--since {text}: in the future"),
            Edge::Sequences(_) => bail!("--since {text:?}: a time, not sequence numbers"),
        },
    })
}

/// The item of parked key `key`.
///
/// # Errors
/// The key is not parked; the store cannot be read.
async fn parked_key(
    store: &dyn LeaseStore,
    sub: &SubscriptionConfig,
    key: &str,
) -> anyhow::Result<KeyRedrive> {
    let item = store
        .read_item(&sub.name, ItemKind::Parked, key)
        .await
        .context("cannot read the parked keys")?;
    let Some(item) = item else {
        bail!(
            "key {key:?} is not parked in subscription {:?}: `shardlane quarantine list` shows the parked keys",
            sub.name.as_str()
        );
    };
    Ok(KeyRedrive {
        key: PartitionKey::new(key),
        parked: decode_parked(&item).context("cannot read the parked keys")?,
    })
}

/// Where a parking's first dead letter lies, as a range start: that shard
/// of the dead-letter stream, from that sequence number.
fn first_put(parked: &ParkedKey) -> Option<Edge> {
    let put = parked.first_put.as_ref()?;
    let sequence = SequenceNumber::parse(&put.sequence).ok()?;
    Some(Edge::Sequences(std::collections::BTreeMap::from([(
        ShardId::new(put.shard.as_str()),
        sequence,
    )])))
}
