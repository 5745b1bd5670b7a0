//! `shardlane redrive`: dead letters handed back to a plugin version, as
//! the records they carry, in their original per-key order; and, with
//! `--key`, a parked key's records brought back and the key released.
//!
//! # What runs
//! A bounded pipeline (as a replay's, see `replay`) of the subscription
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
//! It reads the dead-letter stream from a minute before the key was
//! parked and takes the key's `quarantined` envelopes put since (an
//! earlier parking's were redriven when it was released). Once it handled
//! every one up to the stream's tip, it releases the key **only if** it
//! found them all (from the first parked on, at least as many as were
//! parked, none gone from its source), every one was acked, and no record
//! was parked after the last one it handled
//! (the release names it, see `crate::parked`); otherwise the key stays
//! parked and the summary says why. The service's next record of the key
//! is then handled as usual, after all of those. A key's redrive keeps no
//! progress: interrupted, it brings every parked record back again when
//! run again (at least once; the key stays parked meanwhile, so the order
//! holds); released, the key has nothing left to redrive.
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, bail};
use async_trait::async_trait;
use serde::Deserialize;

use super::bounded::{
    Bounded, Capture, bounded_subscription, check_reads_per_second, compile, progress_store,
    retention_of, run_bounded, short_hash, version_to_run,
};
use super::replay::{describe, parse_edge};
use super::subscription;
use crate::channel::Record;
use crate::clock::now_ms;
use crate::config::{Config, DispatchMode, LeaseBackend};
use crate::ids::{PartitionKey, Position, SequenceNumber, ShardId, StreamName, SubscriptionName};
use crate::kinesis::{Kinesis, ReadFrom};
use crate::lease::{DocKind, LeaseStore, read_typed};
use crate::parked::{ParkedKeys, ReleaseRefused, Source};
use crate::reader::Decode;
use crate::reader::range::{Edge, Range};
use crate::supervisor::{open_store, plugin_host};
use crate::telemetry::Telemetry;

/// Tries of the release's conditional write against other writers.
const RELEASE_TRIES: u32 = 8;

/// Tries of reading an envelope's record back from its stream.
const READ_BACK_TRIES: u32 = 4;

/// Empty pages followed when reading a record back (Kinesis may answer
/// empty before it reaches the sequence number).
const READ_BACK_PAGES: u32 = 5;

/// How much earlier than a key was parked `--key` starts reading the
/// dead-letter stream (a host's clock and the stream's may differ).
const PARKED_READ_MARGIN_MS: u64 = 60_000;

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
    check_reads_per_second(reads_per_second)?;
    let kinesis = Kinesis::connect(&config.aws).await;
    let retention = retention_of(&kinesis, &dlq, "dead_letter_stream").await?;
    let now = now_ms();
    let since = match &options.since {
        None => now.saturating_sub(retention.as_millis() as u64),
        Some(text) => match parse_edge("--since", text, now)? {
            Edge::Time(ms) if ms <= now + 1_000 => ms,
            Edge::Time(_) => bail!("--since {text}: in the future"),
            Edge::Sequences(_) => bail!("--since {text:?}: a time, not sequence numbers"),
        },
    };
    // The lease store: for a key's parking, and (DynamoDB) the fleet's
    // version and the redrive's progress. A file store a running host holds
    // is not needed otherwise.
    let dynamodb = matches!(config.lease.store, LeaseBackend::DynamoDb { .. });
    let store = if options.key.is_some() || dynamodb {
        Some(open_store(config).await?)
    } else {
        None
    };
    // With --key: the key, and since when it is parked.
    let key = match &options.key {
        None => None,
        Some(key) => {
            let store = store.as_deref().expect("opened for --key");
            let parked: ParkedKeys = read_typed(store, &sub.name, DocKind::Parked)
                .await
                .context("cannot read the parked keys")?
                .unwrap_or_default();
            let Some(entry) = parked.keys.get(key) else {
                bail!(
                    "key {key:?} is not parked in subscription {:?}: `shardlane quarantine list` shows the parked keys",
                    sub.name.as_str()
                );
            };
            Some((
                PartitionKey::new(key.as_str()),
                entry.since_ms,
                entry.first.clone(),
                entry.records,
            ))
        }
    };
    // A key's parked records were all put since it was parked: read from a
    // minute before (clocks differ a little), keep those put since.
    let since = match &key {
        Some((_, parked_since, ..)) if options.since.is_none() => parked_since
            .saturating_sub(PARKED_READ_MARGIN_MS)
            .max(since),
        _ => since,
    };
    let parked_since = key.as_ref().map(|(_, since, ..)| *since);
    let parked_first = key
        .as_ref()
        .map(|(_, _, first, records)| (first.clone(), *records));
    let key = key.map(|(key, ..)| key);

    let telemetry = Telemetry::new();
    let plugins = plugin_host(config, Some(telemetry.clone()))?;
    let live = store.clone().filter(|_| dynamodb);
    let (bytes, path) =
        version_to_run(config, sub, options.plugin.as_deref(), live.as_deref()).await?;
    let name = match &key {
        None => "redrive".to_owned(),
        Some(key) => format!("redrive-{}", short_hash(key.as_str())),
    };
    let derived = SubscriptionName::new(format!(
        "{}~{}",
        sub.name,
        name.replacen("redrive-", "redrive~", 1)
    ));
    let plugin = compile(&plugins, sub, path, &bytes, &derived)?;
    // A key's redrive keeps no progress: run again after an interruption,
    // it brings every parked record back again (the key stays parked
    // meanwhile, so their order holds), and once released it has nothing
    // left to do.
    let progress = progress_store(config, live, &name, options.dry_run || key.is_some()).await?;

    let mut bounded = bounded_subscription(sub, &derived, reads_per_second);
    bounded.stream = dlq.clone();
    Arc::make_mut(&mut bounded.sandbox.grants).state = None;
    if let DispatchMode::Workers(n) = bounded.dispatch {
        bounded.dispatch = DispatchMode::ByKey(n);
    }
    let bounded = Arc::new(bounded);
    let envelopes = Arc::new(Envelopes {
        subscription: sub.name.clone(),
        key: key.clone(),
        kinesis: kinesis.clone(),
        counts: Counts::default(),
        first: Mutex::new(None),
        last: Mutex::new(None),
        parked_since,
    });
    let range = Arc::new(Range::open_ended(Edge::Time(since)));
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
        let seen = Seen {
            acked,
            redriven,
            gone: counts.gone.load(Ordering::Relaxed),
            first: envelopes
                .first
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            last: envelopes
                .last
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        };
        let store = store.as_deref().expect("opened for --key");
        let (first, records) = parked_first.expect("a parked key");
        lines.push(release(store, &sub.name, key, &seen, &first, records).await);
    }
    if !finished {
        lines.push("interrupted: run the same command again to go on where it stopped".into());
    }
    Ok(RedriveReport { finished, lines })
}

/// What a key's redrive saw.
struct Seen {
    acked: u64,
    redriven: u64,
    gone: u64,
    first: Option<Source>,
    last: Option<Source>,
}

/// Releases `key` after its redrive (module docs, "Releasing"), parked
/// from `first` with `records` records when the redrive began: a line
/// saying what happened.
async fn release(
    store: &dyn LeaseStore,
    subscription: &SubscriptionName,
    key: &PartitionKey,
    seen: &Seen,
    first: &Source,
    records: u64,
) -> String {
    let Seen {
        acked,
        redriven,
        gone,
        ..
    } = *seen;
    if gone > 0 {
        return format!(
            "key {key} stays parked: {gone} of its parked records are gone from their stream (see the log)"
        );
    }
    if acked < redriven {
        return format!(
            "key {key} stays parked: {} of its {redriven} records were not acked",
            redriven - acked
        );
    }
    if seen.first.as_ref() != Some(first) || redriven < records {
        return format!(
            "key {key} stays parked: {redriven} of its {records} parked records were found on the dead-letter stream, the first {} (the first parked is {first}): past the stream's retention, or before --since",
            seen.first
                .as_ref()
                .map_or("none".to_owned(), ToString::to_string)
        );
    }
    let Some(last) = seen.last.clone() else {
        return format!("key {key} stays parked: none of its parked records was found");
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
    /// The first and the latest parked record handed out (`--key`).
    first: Mutex<Option<Source>>,
    last: Mutex<Option<Source>>,
    /// `--key`: when the key was parked; envelopes put before belong to an
    /// earlier parking, redriven then.
    parked_since: Option<u64>,
}

/// A dead letter, as `crate::failure` writes it.
#[derive(Deserialize)]
struct Envelope {
    reason: String,
    subscription: String,
    #[serde(default)]
    failed_at: u64,
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
        // The subscription's own, and those its replays and redrives put
        // (`<subscription>~…`).
        let ours = envelope.subscription == self.subscription.as_str()
            || envelope
                .subscription
                .strip_prefix(self.subscription.as_str())
                .is_some_and(|rest| rest.starts_with('~'));
        if !ours {
            self.counts.other.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let parked = envelope.reason == "quarantined";
        let earlier = self
            .parked_since
            .is_some_and(|since| envelope.failed_at < since);
        match &self.key {
            Some(key) if !parked || earlier || envelope.source.partition_key != key.as_str() => {
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
        let Ok(sequence) = SequenceNumber::parse(&source.sequence_number) else {
            self.unreadable(dead_letter, "its source sequence number is not one");
            return None;
        };
        let stream = StreamName::new(source.stream.as_str());
        let shard = ShardId::new(source.shard_id.as_str());
        let data = match (envelope.data_omitted, envelope.data_base64) {
            (false, Some(b64)) => match aws_smithy_types::base64::decode(&b64) {
                Ok(data) => data,
                Err(_) => {
                    self.unreadable(dead_letter, "its data_base64 is not base64");
                    return None;
                }
            },
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

    /// Counts and logs a dead letter that is not a readable envelope.
    fn unreadable(&self, dead_letter: &Record, why: &str) {
        self.counts.unreadable.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(subscription = %self.subscription, dead_letter_shard = %dead_letter.shard, dead_letter_sequence = %dead_letter.sequence, why, "not a dead-letter envelope; left alone");
    }

    /// A record's data read back from its stream (AT_SEQUENCE_NUMBER),
    /// the user record's within a KPL aggregate: a failed call is tried
    /// again with backoff, and empty pages are followed a few times,
    /// before the record is taken for gone.
    async fn read_back(
        &self,
        stream: &StreamName,
        shard: &ShardId,
        sequence: &SequenceNumber,
        sub: Option<u32>,
    ) -> Result<Vec<u8>, String> {
        let mut backoff = crate::backoff::Backoff::new(
            std::time::Duration::from_millis(200),
            std::time::Duration::from_secs(5),
        );
        let mut last = String::new();
        for _ in 0..READ_BACK_TRIES {
            match self.read_back_once(stream, shard, sequence, sub).await {
                Ok(Some(data)) => return Ok(data),
                Ok(None) => return Err("the stream no longer holds it (past its retention)".into()),
                Err(e) => last = e,
            }
            tokio::time::sleep(backoff.next_wait()).await;
        }
        Err(last)
    }

    /// One try of [`Envelopes::read_back`]: `None` when the stream does
    /// not hold the record.
    async fn read_back_once(
        &self,
        stream: &StreamName,
        shard: &ShardId,
        sequence: &SequenceNumber,
        sub: Option<u32>,
    ) -> Result<Option<Vec<u8>>, String> {
        let mut iterator = Some(
            self.kinesis
                .open_iterator(stream, shard, &ReadFrom::At(sequence.clone()))
                .await
                .map_err(|e| e.to_string())?,
        );
        let mut found = None;
        for _ in 0..READ_BACK_PAGES {
            let Some(current) = iterator.take() else {
                break;
            };
            let page = self
                .kinesis
                .get_records(&current, 1)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(first) = page.records.into_iter().next() {
                found = (&first.sequence == sequence).then_some(first);
                break;
            }
            iterator = page.next_iterator;
        }
        let Some(found) = found else {
            return Ok(None);
        };
        match (sub, crate::kpl::unpack(&found.data)) {
            (None, _) => Ok(Some(found.data)),
            (Some(i), crate::kpl::Unpacked::Aggregate(records)) => records
                .into_iter()
                .nth(i as usize)
                .map(|r| Some(r.data))
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
                    self.first
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert_with(|| parked.clone());
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(parked);
                }
                out.push((record, position));
            }
        }
        out
    }
}
