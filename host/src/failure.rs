//! The failure policy: when a lane gives up on a record, and what giving up
//! does (skip it, or put it to a dead-letter stream first).
//!
//! Attempts are `retry` outcomes, traps and timeouts; a record is given up
//! on when it has used `max_attempts` or is older than `max_record_age`.
//! Then `on_failure` decides:
//!
//! | `on_failure` | on running out of attempts or age | on `reject` |
//! |---|---|---|
//! | `block` (default) | keep retrying (the shard and lane wait; logged as blocked) | skip |
//! | `skip` | settle, with an error log and a count | skip |
//! | `dead_letter` | put to `dead_letter_stream`, then settle | put to `dead_letter_stream`, then settle |
//!
//! A dead-letter put that fails is retried with backoff; the record is not
//! settled until the put succeeds, so nothing is ever settled without being
//! acked, durably dead-lettered, or skipped by policy. A put can therefore
//! only wait on the destination, never on the envelope itself: every
//! envelope fits a record (see "Size").
//!
//! # Dead-letter format
//! One Kinesis record per failed record, with the **same partition key**,
//! whose data is a JSON object:
//!
//! ```json
//! {
//!   "id": "shardId-000000000001/4968…",
//!   "reason": "guest trapped: ...",
//!   "attempts": 3,
//!   "subscription": "orders-audit",
//!   "plugin": "sha256:…",
//!   "failed_at": 1764633600123,
//!   "source": {
//!     "stream": "orders", "shard_id": "shardId-000000000001",
//!     "sequence_number": "4968…", "sub_sequence_number": null,
//!     "partition_key": "customer-7", "approximate_arrival": 1764633599000
//!   },
//!   "data_bytes": 12,
//!   "data_omitted": false,
//!   "data_base64": "eyJhbW91bnQiOjEyfQ=="
//! }
//! ```
//!
//! `id` names the record by its place in its source (`shard/sequence`,
//! with `/sub` for a KPL user record): a record dead-lettered twice (a
//! crash between the put and the checkpoint) carries the same id both
//! times, and redrive hands it back once. A quarantined record's envelope
//! also carries `parking`, the identity of its key's parking (see
//! `crate::parked`), and the first of a parking `cause`.
//! `sub_sequence_number` is the user record's index in its KPL aggregate
//! (`null` for a plain record; `data_base64` is then the user record's
//! data and `partition_key` its own key). `data_base64` is the original data, unchanged, base64-encoded (standard
//! alphabet, padded), and `data_bytes` its length; `failed_at` and
//! `approximate_arrival` are milliseconds since the Unix epoch. `plugin` is
//! the digest of the version whose attempt failed last (after a swap, or
//! with a canary, the version that handled this record's key), `null` for a
//! handler that is not a plugin.
//!
//! # Size
//! A Kinesis record holds at most [`MAX_RECORD_BYTES`] (1 MiB), partition
//! key and data counted together, and base64 makes data a third larger: a
//! record of more than about 768 KiB cannot travel whole in an envelope. So
//! every envelope is built to fit:
//! - `reason`, the one string a guest chooses (a `retry`/`reject` reason, a
//!   trap message), is cut to [`MAX_GUEST_TEXT`]
//!   and marked `…[truncated]`. Every other string is the host's or bounded
//!   by Kinesis (stream and shard names, a sequence number of up to 129
//!   digits, a partition key of up to 256 characters), so an envelope
//!   without data is a few KiB at most.
//! - When the data does not fit beside the rest, it is left out:
//!   `data_base64` is `null` and `data_omitted` is `true`, with
//!   `data_bytes` still telling its size. The record can then be read again
//!   from `source.stream` at `source.shard_id` / `source.sequence_number`
//!   (`GetShardIterator` with `AT_SEQUENCE_NUMBER`) for as long as the
//!   stream retains it (24 h by default).
//! - Should the destination still refuse an envelope with data as invalid
//!   (a smaller limit than Kinesis's), it is put again at once without the
//!   data; a refusal is never retried with the same envelope.
//!
//! Floor 7 (dispatch) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod quarantine;

pub(crate) use quarantine::{ParkError, Parking, Quarantine, decode as decode_parked};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::channel::Record;
use crate::clock::now_ms;
use crate::config::{FailurePolicy, OnFailure};
use crate::ids::{PluginDigest, ShardId, StreamName, SubscriptionName};
use crate::kinesis::{Kinesis, KinesisError};
use crate::logging::{MAX_GUEST_TEXT, capped};

/// The most a Kinesis record may hold: partition key and data together
/// (1,048,576 bytes). Every envelope fits (module docs, "Size").
pub(crate) const MAX_RECORD_BYTES: usize = 1 << 20;

/// What a lane does after a failed attempt. Giving up carries where the
/// record goes, so the decision and its sink cannot disagree.
#[derive(Clone, Copy)]
pub(crate) enum Next<'a> {
    /// Try again after a backoff.
    Retry,
    /// Out of attempts or age, but the policy blocks: try again anyway.
    Blocked,
    /// Put to the dead-letter stream, then settle.
    DeadLetter(&'a dyn DeadLetterSink),
    /// Park the record's key (see [`Quarantine`]), then settle.
    Quarantine(&'a Quarantine),
    /// Settle with an error log.
    Skip,
}

impl std::fmt::Debug for Next<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Next::Retry => f.write_str("Retry"),
            Next::Blocked => f.write_str("Blocked"),
            Next::DeadLetter(sink) => write!(f, "DeadLetter({})", sink.stream()),
            Next::Quarantine(q) => write!(f, "Quarantine({})", q.stream()),
            Next::Skip => f.write_str("Skip"),
        }
    }
}

/// What giving up on a record does, fixed when the policy is made.
#[derive(Clone)]
enum GiveUp {
    Block,
    Skip,
    DeadLetter(Arc<dyn DeadLetterSink>),
    Quarantine(Arc<Quarantine>),
}

/// A subscription's failure policy, ready to apply: the config's
/// [`FailurePolicy`] with its dead-letter sink in place.
#[derive(Clone)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Policy {
    max_attempts: Option<u32>,
    max_record_age: Option<Duration>,
    give_up: GiveUp,
    /// Failed batches are split in halves, each retried on its own.
    pub bisect_on_error: bool,
}

impl Policy {
    /// The policy `config` describes; `sink` makes the dead-letter sink
    /// for its `dead_letter_stream` (called only for `on_failure =
    /// "dead_letter"`); a quarantine policy is made by
    /// [`Policy::with_quarantine`].
    #[cfg(any(test, feature = "bench-internals"))]
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn new(
        config: &FailurePolicy,
        sink: impl FnOnce(&StreamName) -> Arc<dyn DeadLetterSink>,
    ) -> Self {
        Self::with_quarantine(config, sink, |_| {
            unreachable!("on_failure = \"quarantine\" is made with its quarantine")
        })
    }

    /// `Policy::new`, with what makes the quarantine from its sink.
    pub(crate) fn with_quarantine(
        config: &FailurePolicy,
        sink: impl FnOnce(&StreamName) -> Arc<dyn DeadLetterSink>,
        quarantine: impl FnOnce(Arc<dyn DeadLetterSink>) -> Arc<Quarantine>,
    ) -> Self {
        Self {
            max_attempts: config.max_attempts,
            max_record_age: config.max_record_age,
            give_up: match &config.on_failure {
                OnFailure::Block => GiveUp::Block,
                OnFailure::Skip => GiveUp::Skip,
                OnFailure::DeadLetter(stream) => GiveUp::DeadLetter(sink(stream)),
                OnFailure::Quarantine(stream) => GiveUp::Quarantine(quarantine(sink(stream))),
            },
            bisect_on_error: config.bisect_on_error,
        }
    }

    /// The quarantine, for `on_failure = "quarantine"`.
    pub(crate) fn quarantine(&self) -> Option<&Arc<Quarantine>> {
        match &self.give_up {
            GiveUp::Quarantine(q) => Some(q),
            _ => None,
        }
    }

    /// The attempts a record may use, if limited.
    pub(crate) fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    fn give_up(&self) -> Next<'_> {
        match &self.give_up {
            GiveUp::Block => Next::Blocked,
            GiveUp::Skip => Next::Skip,
            GiveUp::DeadLetter(sink) => Next::DeadLetter(&**sink),
            GiveUp::Quarantine(q) => Next::Quarantine(q),
        }
    }

    /// After attempt number `attempt` failed (retry outcome, trap,
    /// timeout) on a record of age `age`.
    pub(crate) fn after_failure(&self, attempt: u32, age: Option<Duration>) -> Next<'_> {
        let out_of_attempts = self.max_attempts.is_some_and(|max| attempt >= max);
        let too_old = matches!((self.max_record_age, age), (Some(max), Some(age)) if age > max);
        if out_of_attempts || too_old {
            self.give_up()
        } else {
            Next::Retry
        }
    }

    /// After the handler rejected a record: block does not apply, and a
    /// quarantine dead-letters the record without parking its key.
    pub(crate) fn after_reject(&self) -> Next<'_> {
        match &self.give_up {
            GiveUp::DeadLetter(sink) => Next::DeadLetter(&**sink),
            GiveUp::Quarantine(q) => Next::DeadLetter(q.sink()),
            GiveUp::Block | GiveUp::Skip => Next::Skip,
        }
    }
}

/// Why a record is being dead-lettered, as its envelope tells it.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct LastFailure<'a> {
    /// The last failure (`rejected: …`, `retry: …`, a trap).
    pub reason: &'a str,
    /// Attempts used.
    pub attempts: u32,
    /// The plugin version whose attempt failed last.
    pub version: Option<&'a PluginDigest>,
    /// For a quarantined record (reason `quarantined`): the failure that
    /// parked its key, on the record that parked it.
    pub cause: Option<&'a str>,
    /// For a quarantined record: its key's parking
    /// ([`crate::parked::ParkedKey::parking`]).
    pub parking: Option<&'a str>,
}

/// A record's id in its envelope (`"id"`): its place in its source,
/// `shard/sequence[/sub]` (see [`crate::parked::Source::id`]), the same
/// however often it is dead-lettered, so redrive hands it back once.
pub(crate) fn record_id(record: &Record) -> String {
    match record.sub_sequence {
        Some(sub) => format!("{}/{}/{sub}", record.shard, record.sequence),
        None => format!("{}/{}", record.shard, record.sequence),
    }
}

/// Where given-up records go: the dead-letter stream
/// ([`DeadLetters`]), or a fake in tests.
#[async_trait]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) trait DeadLetterSink: Send + Sync + 'static {
    /// The stream it puts to.
    fn stream(&self) -> &StreamName;

    /// Puts `record`'s envelope.
    ///
    /// # Errors
    /// Why it was not put; the caller retries with backoff, the record
    /// unsettled meanwhile.
    async fn put(&self, record: &Record, failure: LastFailure<'_>) -> Result<Put, KinesisError>;
}

/// How old a record is, if Kinesis told its arrival time.
pub(crate) fn age(record: &Record) -> Option<Duration> {
    (record.arrival_ms > 0)
        .then(|| Duration::from_millis(now_ms().saturating_sub(record.arrival_ms)))
}

/// Puts given-up records to the dead-letter stream.
#[derive(Clone)]
pub(crate) struct DeadLetters {
    kinesis: Kinesis,
    stream: StreamName,
    subscription: SubscriptionName,
}

impl DeadLetters {
    /// A sink for `stream`, for records of `subscription`.
    pub(crate) fn new(
        kinesis: Kinesis,
        stream: StreamName,
        subscription: SubscriptionName,
    ) -> Self {
        Self {
            kinesis,
            stream,
            subscription,
        }
    }

    /// The envelope (module docs) for one record given up as `failure`
    /// says: with the data when it fits in one record beside the partition
    /// key, without it otherwise.
    pub(crate) fn envelope(&self, record: &Record, failure: LastFailure<'_>) -> Envelope {
        let key = record.partition_key.as_str().len();
        // Base64 of n bytes is 4⌈n/3⌉ characters: skip encoding data that
        // cannot fit anyway.
        if key + 4 * record.data.len().div_ceil(3) < MAX_RECORD_BYTES {
            let bytes = self.envelope_bytes(record, failure, true);
            if key + bytes.len() <= MAX_RECORD_BYTES {
                return Envelope {
                    bytes,
                    data_omitted: false,
                };
            }
        }
        Envelope {
            bytes: self.envelope_bytes(record, failure, false),
            data_omitted: true,
        }
    }

    fn envelope_bytes(
        &self,
        record: &Record,
        failure: LastFailure<'_>,
        with_data: bool,
    ) -> Vec<u8> {
        let LastFailure {
            reason,
            attempts,
            version: plugin,
            cause,
            parking,
        } = failure;
        let mut envelope = serde_json::json!({
            "id": record_id(record),
            "reason": capped(reason, MAX_GUEST_TEXT),
            "attempts": attempts,
            "subscription": self.subscription.as_str(),
            "plugin": plugin.map(ToString::to_string),
            "failed_at": now_ms(),
            "source": {
                "stream": record.stream.as_str(),
                "shard_id": record.shard.as_str(),
                "sequence_number": record.sequence.as_str(),
                "sub_sequence_number": record.sub_sequence,
                "partition_key": record.partition_key.as_str(),
                "approximate_arrival": record.arrival_ms,
            },
            "data_bytes": record.data.len(),
            "data_omitted": !with_data,
            "data_base64": with_data.then(|| aws_smithy_types::base64::encode(&record.data)),
        });
        if let Some(cause) = cause {
            envelope["cause"] = capped(cause, MAX_GUEST_TEXT).into();
        }
        if let Some(parking) = parking {
            envelope["parking"] = parking.into();
        }
        // A JSON value of strings and numbers always serializes.
        serde_json::to_vec(&envelope).expect("envelope serializes")
    }
}

#[async_trait]
impl DeadLetterSink for DeadLetters {
    fn stream(&self) -> &StreamName {
        &self.stream
    }

    /// Puts one record's envelope, with the record's partition key; an
    /// envelope with data that the stream refuses is put again at once
    /// without it (module docs, "Size").
    async fn put(&self, record: &Record, failure: LastFailure<'_>) -> Result<Put, KinesisError> {
        let envelope = self.envelope(record, failure);
        let data_omitted = envelope.data_omitted;
        let key = &record.partition_key;
        match self
            .kinesis
            .put_record(&self.stream, key, envelope.bytes)
            .await
        {
            Err(KinesisError::Refused(_)) if !data_omitted => {
                let bytes = self.envelope_bytes(record, failure, false);
                let (shard, sequence) = self.kinesis.put_record(&self.stream, key, bytes).await?;
                Ok(Put {
                    shard,
                    sequence,
                    data_omitted: true,
                })
            }
            put => put.map(|(shard, sequence)| Put {
                shard,
                sequence,
                data_omitted,
            }),
        }
    }
}

/// One record's envelope, built to fit (module docs, "Size").
#[derive(Debug)]
pub(crate) struct Envelope {
    /// The JSON.
    pub bytes: Vec<u8>,
    /// True when the data was left out.
    pub data_omitted: bool,
}

/// A dead letter put.
#[derive(Debug)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Put {
    /// The dead-letter stream's shard it went to.
    pub shard: ShardId,
    /// Its sequence number there.
    pub sequence: String,
    /// True when its envelope went without the data.
    pub data_omitted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_attempts: Option<u32>, max_age: Option<u64>, on_failure: OnFailure) -> Policy {
        let config = FailurePolicy {
            max_attempts,
            max_record_age: max_age.map(Duration::from_secs),
            on_failure,
            bisect_on_error: false,
            quarantine: crate::parked::ParkLimits {
                max_keys: 1,
                max_records: 1,
            },
        };
        Policy::new(&config, |stream| {
            let mut sink = dead_letters();
            sink.stream = stream.clone();
            Arc::new(sink)
        })
    }

    /// What `next` says, with the dead-letter stream it names.
    fn said(next: Next<'_>) -> String {
        match next {
            Next::DeadLetter(sink) => format!("dead_letter {}", sink.stream()),
            other => format!("{other:?}"),
        }
    }

    fn dead_letters() -> DeadLetters {
        let config = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
            .build();
        DeadLetters::new(
            Kinesis::from_client(aws_sdk_kinesis::Client::from_conf(config)),
            StreamName::new("dlq"),
            SubscriptionName::new("orders-audit"),
        )
    }

    fn record(key: &str, data: Vec<u8>) -> Record {
        Record {
            window: None,
            stream: StreamName::new("orders"),
            shard: crate::ids::ShardId::new("shardId-000000000001"),
            partition_key: crate::ids::PartitionKey::new(key),
            sequence: crate::ids::SequenceNumber::parse(&"4".repeat(56)).unwrap(),
            sub_sequence: None,
            arrival_ms: 1_764_633_599_000,
            data,
        }
    }

    /// A failure as the tests give it.
    fn failed(reason: &str, attempts: u32) -> LastFailure<'_> {
        LastFailure {
            reason,
            attempts,
            version: None,
            cause: None,
            parking: None,
        }
    }

    fn parse(envelope: &Envelope) -> serde_json::Value {
        serde_json::from_slice(&envelope.bytes).unwrap()
    }

    /// Partition key plus data, as Kinesis counts a record.
    fn record_size(key: &str, envelope: &Envelope) -> usize {
        key.len() + envelope.bytes.len()
    }

    #[test]
    fn a_small_record_travels_whole() {
        let r = record("customer-7", b"{\"amount\":12}".to_vec());
        let e = dead_letters().envelope(&r, failed("rejected: no", 1));
        assert!(!e.data_omitted);
        let v = parse(&e);
        assert_eq!(v["data_base64"], "eyJhbW91bnQiOjEyfQ==");
        assert_eq!(v["data_bytes"], 13);
        assert_eq!(v["data_omitted"], false);
        assert_eq!(v["source"]["sequence_number"], "4".repeat(56));
        assert_eq!(
            v["id"],
            format!("shardId-000000000001/{}", "4".repeat(56)),
            "the same record's id whenever it is dead-lettered"
        );
    }

    #[test]
    fn a_record_too_large_to_carry_leaves_its_data_out_and_says_where_it_is() {
        // Kinesis accepts 1,000,000 bytes of data; base64 of it is 1,333,336.
        let key = "k".repeat(256);
        let r = record(&key, vec![0xAB; 1_000_000]);
        let reason = format!("rejected: {}", "x".repeat(10_000_000));
        let e = dead_letters().envelope(&r, failed(&reason, 1));
        assert!(e.data_omitted);
        assert!(record_size(&key, &e) <= MAX_RECORD_BYTES);
        assert!(e.bytes.len() < 16 * 1024, "{} bytes", e.bytes.len());
        let v = parse(&e);
        assert_eq!(v["data_base64"], serde_json::Value::Null);
        assert_eq!(v["data_omitted"], true);
        assert_eq!(v["data_bytes"], 1_000_000);
        assert_eq!(v["source"]["stream"], "orders");
        assert_eq!(v["source"]["shard_id"], "shardId-000000000001");
        assert_eq!(v["source"]["sequence_number"], "4".repeat(56));
        let reason = v["reason"].as_str().unwrap();
        assert!(reason.len() <= MAX_GUEST_TEXT, "{}", reason.len());
        assert!(reason.ends_with("…[truncated]"));
    }

    #[test]
    fn data_is_carried_up_to_the_record_limit_and_never_past_it() {
        let key = "customer-7";
        let d = dead_letters();
        let fits = |n: usize| {
            let e = d.envelope(&record(key, vec![7; n]), failed("guest trapped: x", 3));
            assert!(record_size(key, &e) <= MAX_RECORD_BYTES, "{n}");
            !e.data_omitted
        };
        // The largest data that travels whole: about 3/4 of a MiB, less the
        // rest of the envelope.
        let (mut lo, mut hi) = (0, 1_048_576);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if fits(mid) { lo = mid } else { hi = mid }
        }
        assert!((780_000..786_432).contains(&lo), "{lo}");
        let whole = d.envelope(&record(key, vec![7; lo]), failed("guest trapped: x", 3));
        assert!(
            MAX_RECORD_BYTES - record_size(key, &whole) < 8,
            "as full as base64 allows"
        );
    }

    #[test]
    fn unlimited_by_default_retries_forever() {
        let p = policy(None, None, OnFailure::Block);
        assert_eq!(
            said(p.after_failure(1_000_000, Some(Duration::from_secs(86_400)))),
            "Retry"
        );
    }

    #[test]
    fn attempts_run_out_at_max() {
        let p = policy(Some(3), None, OnFailure::Skip);
        assert_eq!(said(p.after_failure(1, None)), "Retry");
        assert_eq!(said(p.after_failure(2, None)), "Retry");
        assert_eq!(said(p.after_failure(3, None)), "Skip");
        let p = policy(Some(3), None, OnFailure::DeadLetter("dlq-7".into()));
        assert_eq!(
            said(p.after_failure(3, None)),
            "dead_letter dlq-7",
            "giving up carries the configured sink"
        );
        let p = policy(Some(3), None, OnFailure::Block);
        assert_eq!(said(p.after_failure(3, None)), "Blocked");
    }

    #[test]
    fn age_runs_out_past_max() {
        let p = policy(None, Some(60), OnFailure::Skip);
        assert_eq!(
            said(p.after_failure(1, Some(Duration::from_secs(59)))),
            "Retry"
        );
        assert_eq!(
            said(p.after_failure(1, Some(Duration::from_secs(61)))),
            "Skip"
        );
        assert_eq!(
            said(p.after_failure(1, None)),
            "Retry",
            "unknown age never expires"
        );
    }

    #[test]
    fn rejects_never_block() {
        assert_eq!(
            said(policy(None, None, OnFailure::Block).after_reject()),
            "Skip"
        );
        assert_eq!(
            said(policy(None, None, OnFailure::Skip).after_reject()),
            "Skip"
        );
        assert_eq!(
            said(policy(None, None, OnFailure::DeadLetter("d".into())).after_reject()),
            "dead_letter d"
        );
    }
}
