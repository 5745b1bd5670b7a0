//! `shardlane redrive`: dead letters handed back to a plugin version, as
//! the records they carry, in their original per-key order; and, with
//! `--key`, a parked key's records brought back and the key released.
//!
//! # What runs
//! A bounded pipeline (as a replay's, see `replay`) of the subscription
//! over its **dead-letter stream**, under its own name —
//! `<subscription>~redrive`, or `<subscription>~redrive~<hash of the
//! key>` with `--key` — from `--since` (default: as far back as the
//! stream keeps) to the stream's tip when it started. Its readers turn
//! each envelope back into the record it carries (data, partition key,
//! source stream, shard, sequence and sub-sequence numbers, arrival) and
//! drop the envelopes it does not redrive: another subscription's; records
//! of parked keys (reason `quarantined`: `--key` brings those back,
//! releasing the key); with `--key`, everything but that key's parked
//! records. An envelope whose data was left out (`data_omitted`) is read
//! back from its source stream at its sequence number while the stream
//! still has it; when it no longer does, the redrive says so, naming both
//! records, and goes on.
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
//! # The policy, state and effects
//! The subscription's failure policy applies (a quarantine dead-letters
//! again instead of parking); outputs are put as the service puts them;
//! `--dry-run` puts and writes nothing. A redrive runs **without per-key
//! state**: state is applied exactly once with the source's checkpoints,
//! which a redrive does not own, so a plugin's state calls answer that no
//! state is granted.
//!
//! # Releasing a parked key (`--key`)
//! Once the redrive handled every parked record of the key up to the
//! dead-letter stream's tip, it releases the key **only if** every one
//! was acked and no record was parked after the last one it handled (the
//! release names it, see `crate::parked`); otherwise the key stays parked
//! and the summary says why. The service's next record of the key is then
//! handled as usual, after all of those.
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::replay::{
    Bounded, Capture, bounded_subscription, compile, describe, parse_edge, progress_store,
    read_plugin, run_bounded, running_bytes,
};
use super::subscription;
use crate::channel::Record;
use crate::clock::now_ms;
use crate::config::{Config, DispatchMode, LeaseBackend, OnFailure};
use crate::ids::{PartitionKey, Position, SequenceNumber, ShardId, StreamName, SubscriptionName};
use crate::kinesis::{Kinesis, KinesisError, ReadFrom};
use crate::lease::{DocKind, LeaseStore, read_typed};
use crate::parked::{ParkedKeys, ReleaseRefused, Source};
use crate::reader::Decode;
use crate::reader::range::{Edge, Range};
use crate::supervisor::{open_store, plugin_host};
use crate::telemetry::Telemetry;

/// Tries of the release's conditional write against other writers.
const RELEASE_TRIES: u32 = 8;

/// What `shardlane redrive` was asked.
#[derive(Debug, Clone, Default)]
pub struct RedriveOptions {
    /// The subscription.
    pub subscription: String,
    /// Dead letters put from this time on (default: all the stream keeps).
    pub since: Option<String>,
    /// The plugin version to run; `None`: the one the fleet runs.
    pub plugin: Option<PathBuf>,
    /// Put nothing, write nothing, release nothing.
    pub dry_run: bool,
    /// Bring back this parked key's records and release it.
    pub key: Option<String>,
    /// GetRecords per shard per second on the dead-letter stream (default
    /// 5: nothing else reads it).
    pub reads_per_second: Option<f64>,
}

/// How a redrive ended.
#[derive(Debug)]
pub struct RedriveReport {
    /// False when interrupted (run it again to go on).
    pub finished: bool,
    /// The summary, one line each.
    pub lines: Vec<String>,
}

/// `shardlane redrive` (module docs).
///
/// # Errors
/// One line, before anything is read: an unknown subscription, one without
/// a dead-letter stream, a dead-letter stream that does not exist, a
/// `--since` that is not a time, a `--key` that is not parked, a plugin
/// that cannot run.
pub async fn redrive(
    config: &Config,
    options: &RedriveOptions,
    interrupt: impl Future<Output = ()>,
) -> anyhow::Result<RedriveReport> {
    let sub = subscription(config, &options.subscription)?;
    let Some(dlq) = sub.failure.on_failure.dead_letter_stream().cloned() else {
        bail!(
            "subscription {:?} has no dead_letter_stream: only on_failure = \"dead_letter\" or \"quarantine\" puts dead letters",
            sub.name.as_str()
        );
    };
    let reads_per_second = options.reads_per_second.unwrap_or(5.0);
    anyhow::ensure!(
        reads_per_second > 0.0 && reads_per_second <= 5.0,
        "--reads-per-second {reads_per_second}: out of range, above 0 and at most 5 (Kinesis's limit per shard)"
    );
    let kinesis = Kinesis::connect(&config.aws).await;
    let retention = kinesis.retention(&dlq).await.map_err(|e| match e {
        KinesisError::NotFound(_) => {
            anyhow!("dead_letter_stream {:?} does not exist", dlq.as_str())
        }
        e => anyhow!("cannot describe dead_letter_stream {:?}: {e}", dlq.as_str()),
    })?;
    let now = now_ms();
    let since = match &options.since {
        None => now.saturating_sub(retention.as_millis() as u64),
        Some(text) => match parse_edge("--since", text, now)? {
            Edge::Time(ms) if ms <= now + 1_000 => ms,
            Edge::Time(_) => bail!("--since {text}: in the future"),
            Edge::Sequences(_) => bail!("--since {text:?}: a time, not sequence numbers"),
        },
    };
    let store = open_store(config).await?;
    let key = match &options.key {
        None => None,
        Some(key) => {
            let parked: ParkedKeys = read_typed(&*store, &sub.name, DocKind::Parked)
                .await
                .context("cannot read the parked keys")?
                .unwrap_or_default();
            anyhow::ensure!(
                parked.is_parked(key),
                "key {key:?} is not parked in subscription {:?}: `shardlane quarantine list` shows the parked keys",
                sub.name.as_str()
            );
            Some(PartitionKey::new(key.as_str()))
        }
    };

    let telemetry = Telemetry::new();
    let plugins = plugin_host(config, Some(telemetry.clone()))?;
    let live = matches!(config.lease.store, LeaseBackend::DynamoDb { .. }).then(|| store.clone());
    let (bytes, path) = match options.plugin.as_deref() {
        Some(path) => (read_plugin(path, "--plugin")?, path),
        None => (
            running_bytes(config, sub, live.as_deref()).await?,
            sub.plugin.as_path(),
        ),
    };
    let name = match &key {
        None => "redrive".to_owned(),
        Some(key) => {
            let hash = Sha256::digest(key.as_str().as_bytes());
            let hex: String = hash.iter().take(4).map(|b| format!("{b:02x}")).collect();
            format!("redrive-{hex}")
        }
    };
    let derived = SubscriptionName::new(format!(
        "{}~{}",
        sub.name,
        name.replacen("redrive-", "redrive~", 1)
    ));
    let plugin = compile(&plugins, sub, path, &bytes, &derived)?;
    let progress = progress_store(config, live, &name, options.dry_run).await?;

    let mut bounded = bounded_subscription(sub, &derived, reads_per_second);
    bounded.stream = dlq.clone();
    Arc::make_mut(&mut bounded.sandbox.grants).state = None;
    if let OnFailure::Quarantine(stream) = &bounded.failure.on_failure {
        bounded.failure.on_failure = OnFailure::DeadLetter(stream.clone());
    }
    if let DispatchMode::Workers(n) = bounded.dispatch {
        bounded.dispatch = DispatchMode::ByKey(n);
    }
    let bounded = Arc::new(bounded);
    let envelopes = Arc::new(Envelopes {
        subscription: sub.name.clone(),
        key: key.clone(),
        kinesis: kinesis.clone(),
        counts: Counts::default(),
        last: Mutex::new(None),
    });
    let range = Arc::new(Range::new(Edge::Time(since), Edge::Time(now)));
    eprintln!(
        "redrive of {} from dead_letter_stream {}{}: dead letters put since {}{}",
        sub.name,
        dlq,
        key.as_ref()
            .map(|k| format!(", parked key {k}"))
            .unwrap_or_default(),
        describe(&Edge::Time(since)),
        if options.dry_run {
            ", dry run (nothing is put, written or released)"
        } else {
            ""
        },
    );
    let (finished, mut lines) = run_bounded(
        Bounded {
            config,
            sub: bounded.clone(),
            plugins,
            plugin,
            telemetry: telemetry.clone(),
            kinesis,
            store: progress,
            range,
            capture: options.dry_run.then(|| Arc::new(Capture::new(sub))),
            decode: Some(envelopes.clone() as Arc<dyn Decode>),
            name: &name,
        },
        interrupt,
    )
    .await?;
    let counts = &envelopes.counts;
    let redriven = counts.redriven.load(Ordering::Relaxed);
    lines.insert(
        0,
        format!(
            "dead letters: {redriven} redriven, {} of other subscriptions or keys left, {} parked (left for redrive --key), {} whose record is gone from its stream, {} not envelopes",
            counts.other.load(Ordering::Relaxed),
            counts.parked.load(Ordering::Relaxed),
            counts.gone.load(Ordering::Relaxed),
            counts.unreadable.load(Ordering::Relaxed),
        ),
    );
    if let Some(key) = &key
        && finished
        && !options.dry_run
    {
        let acked = telemetry
            .counter(
                "shardlane_records_total",
                "Records handled, by the handler's outcome (retry counts each attempt).",
                &[("subscription", derived.as_str()), ("outcome", "ack")],
            )
            .get();
        let last = envelopes
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        lines.push(release(&*store, &sub.name, key, acked, redriven, last).await);
    }
    if !finished {
        lines.push("interrupted: run the same command again to go on where it stopped".into());
    }
    Ok(RedriveReport { finished, lines })
}

/// Releases `key` after its redrive (module docs, "Releasing"): a line
/// saying what happened.
async fn release(
    store: &dyn LeaseStore,
    subscription: &SubscriptionName,
    key: &PartitionKey,
    acked: u64,
    redriven: u64,
    last: Option<Source>,
) -> String {
    if acked < redriven {
        return format!(
            "key {key} stays parked: {} of its {redriven} records were not acked",
            redriven - acked
        );
    }
    let Some(last) = last else {
        return format!(
            "key {key} stays parked: none of its parked records was found on the dead-letter stream (past its retention, or before --since)"
        );
    };
    for _ in 0..RELEASE_TRIES {
        let current: ParkedKeys = match read_typed(store, subscription, DocKind::Parked).await {
            Ok(doc) => doc.unwrap_or_default(),
            Err(e) => return format!("key {key} stays parked: cannot read the parked keys: {e}"),
        };
        let next = match current.release(key.as_str(), &last) {
            Ok(next) => next,
            Err(ReleaseRefused::NotParked(_)) => return format!("key {key} was released already"),
            Err(e @ ReleaseRefused::Moved { .. }) => {
                return format!("key {key} stays parked: {e}; run redrive --key {key} again");
            }
        };
        let doc = match serde_json::to_string(&next) {
            Ok(doc) => doc,
            Err(e) => return format!("key {key} stays parked: {e}"),
        };
        match store
            .write_doc(subscription, DocKind::Parked, next.revision, doc)
            .await
        {
            Ok(true) => {
                tracing::warn!(subscription = %subscription, partition_key = %key, records = redriven, "parked key released: its records were redriven");
                return format!(
                    "key {key} released: its {redriven} parked records were redriven in order"
                );
            }
            Ok(false) => continue,
            Err(e) => return format!("key {key} stays parked: cannot write the parked keys: {e}"),
        }
    }
    format!("key {key} stays parked: the parked keys kept changing; run redrive --key {key} again")
}

/// What a redrive's readers did with envelopes.
#[derive(Default)]
struct Counts {
    redriven: AtomicU64,
    other: AtomicU64,
    parked: AtomicU64,
    gone: AtomicU64,
    unreadable: AtomicU64,
}

/// Turns dead-letter envelopes back into records (module docs).
struct Envelopes {
    subscription: SubscriptionName,
    /// `--key`: only this key's parked records.
    key: Option<PartitionKey>,
    kinesis: Kinesis,
    counts: Counts,
    /// The latest parked record handed out (`--key`).
    last: Mutex<Option<Source>>,
}

/// A dead letter, as `crate::failure` writes it.
#[derive(Deserialize)]
struct Envelope {
    reason: String,
    subscription: String,
    source: EnvelopeSource,
    #[serde(default)]
    data_omitted: bool,
    data_base64: Option<String>,
}

#[derive(Deserialize)]
struct EnvelopeSource {
    stream: String,
    shard_id: String,
    sequence_number: String,
    sub_sequence_number: Option<u32>,
    partition_key: String,
    approximate_arrival: u64,
}

impl Envelopes {
    /// Whether this redrive hands `envelope`'s record out (module docs).
    fn selects(&self, envelope: &Envelope) -> bool {
        if envelope.subscription != self.subscription.as_str() {
            self.counts.other.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let parked = envelope.reason == "quarantined";
        match &self.key {
            Some(key) if !parked || envelope.source.partition_key != key.as_str() => {
                self.counts.other.fetch_add(1, Ordering::Relaxed);
                false
            }
            Some(_) => true,
            None if parked => {
                self.counts.parked.fetch_add(1, Ordering::Relaxed);
                false
            }
            None => true,
        }
    }

    /// The record `envelope` carries, its data read back from the source
    /// when the envelope left it out; `None` when it is gone.
    async fn record(&self, envelope: Envelope, dead_letter: &Record) -> Option<Record> {
        let source = envelope.source;
        let sequence = SequenceNumber::parse(&source.sequence_number).ok()?;
        let stream = StreamName::new(source.stream.as_str());
        let shard = ShardId::new(source.shard_id.as_str());
        let data = match (envelope.data_omitted, envelope.data_base64) {
            (false, Some(b64)) => aws_smithy_types::base64::decode(&b64).ok()?,
            _ => match self
                .read_back(&stream, &shard, &sequence, source.sub_sequence_number)
                .await
            {
                Ok(data) => data,
                Err(why) => {
                    self.counts.gone.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        subscription = %self.subscription, stream = %stream, shard_id = %shard, sequence_number = %sequence,
                        dead_letter_shard = %dead_letter.shard, dead_letter_sequence = %dead_letter.sequence, why,
                        "dead letter not redriven: its data was left out of the envelope and the record is no longer in its stream"
                    );
                    return None;
                }
            },
        };
        Some(Record {
            stream,
            shard,
            partition_key: PartitionKey::new(source.partition_key.as_str()),
            sequence,
            sub_sequence: source.sub_sequence_number,
            arrival_ms: source.approximate_arrival,
            data,
        })
    }

    /// A record's data read back from its stream (AT_SEQUENCE_NUMBER),
    /// the user record's within a KPL aggregate.
    async fn read_back(
        &self,
        stream: &StreamName,
        shard: &ShardId,
        sequence: &SequenceNumber,
        sub: Option<u32>,
    ) -> Result<Vec<u8>, String> {
        let iterator = self
            .kinesis
            .open_iterator(stream, shard, &ReadFrom::At(sequence.clone()))
            .await
            .map_err(|e| e.to_string())?;
        let page = self
            .kinesis
            .get_records(&iterator, 1)
            .await
            .map_err(|e| e.to_string())?;
        let found = page
            .records
            .into_iter()
            .find(|r| &r.sequence == sequence)
            .ok_or("the stream no longer holds it (past its retention)")?;
        match (sub, crate::kpl::unpack(&found.data)) {
            (None, _) => Ok(found.data),
            (Some(i), crate::kpl::Unpacked::Aggregate(records)) => records
                .into_iter()
                .nth(i as usize)
                .map(|r| r.data)
                .ok_or_else(|| format!("its aggregate holds no user record {i}")),
            (Some(i), _) => Err(format!("user record {i} of a record that is no aggregate")),
        }
    }
}

#[async_trait]
impl Decode for Envelopes {
    async fn decode(&self, records: Vec<(Record, Position)>) -> Vec<(Record, Position)> {
        let mut out = Vec::with_capacity(records.len());
        for (dead_letter, position) in records {
            let envelope: Envelope = match serde_json::from_slice(&dead_letter.data) {
                Ok(envelope) => envelope,
                Err(e) => {
                    self.counts.unreadable.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(subscription = %self.subscription, dead_letter_shard = %dead_letter.shard, dead_letter_sequence = %dead_letter.sequence, error = %e, "not a dead-letter envelope; left alone");
                    continue;
                }
            };
            if !self.selects(&envelope) {
                continue;
            }
            let parked = Source {
                shard: envelope.source.shard_id.clone(),
                sequence: envelope.source.sequence_number.clone(),
                sub: envelope.source.sub_sequence_number,
            };
            if let Some(record) = self.record(envelope, &dead_letter).await {
                self.counts.redriven.fetch_add(1, Ordering::Relaxed);
                if self.key.is_some() {
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(parked);
                }
                out.push((record, position));
            }
        }
        out
    }
}
