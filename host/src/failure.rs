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
//!   "reason": "guest trapped: ...",
//!   "attempts": 3,
//!   "subscription": "orders-audit",
//!   "plugin": "sha256:…",
//!   "failed_at": 1764633600123,
//!   "source": {
//!     "stream": "orders", "shard_id": "shardId-000000000001",
//!     "sequence_number": "4968…", "partition_key": "customer-7",
//!     "approximate_arrival": 1764633599000
//!   },
//!   "data_bytes": 12,
//!   "data_omitted": false,
//!   "data_base64": "eyJhbW91bnQiOjEyfQ=="
//! }
//! ```
//!
//! `data_base64` is the original data, unchanged, base64-encoded (standard
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
//!   trap message), is cut to [`MAX_GUEST_TEXT`](crate::logging::MAX_GUEST_TEXT)
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

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;

use aws_sdk_kinesis::error::{ProvideErrorMetadata as _, SdkError};
use aws_sdk_kinesis::operation::put_record::PutRecordError;

use crate::channel::Record;
use crate::config::{FailurePolicy, OnFailure};
use crate::ids::{StreamName, SubscriptionName};
use crate::logging::{MAX_GUEST_TEXT, capped};
use crate::plugin::PluginDigest;

/// The most a Kinesis record may hold: partition key and data together
/// (1,048,576 bytes). Every envelope fits (module docs, "Size").
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// What a lane does after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try again after a backoff.
    Retry,
    /// Out of attempts or age, but the policy blocks: try again anyway.
    Blocked,
    /// Put to the dead-letter stream, then settle.
    DeadLetter,
    /// Settle with an error log.
    Skip,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How old a record is, if Kinesis told its arrival time.
pub fn age(record: &Record) -> Option<Duration> {
    (record.arrival_ms > 0)
        .then(|| Duration::from_millis(now_ms().saturating_sub(record.arrival_ms)))
}

fn give_up(policy: &FailurePolicy) -> Next {
    match policy.on_failure {
        OnFailure::Block => Next::Blocked,
        OnFailure::Skip => Next::Skip,
        OnFailure::DeadLetter(_) => Next::DeadLetter,
    }
}

/// After attempt number `attempt` failed (retry outcome, trap, timeout) on
/// a record of age `age`.
pub fn after_failure(policy: &FailurePolicy, attempt: u32, age: Option<Duration>) -> Next {
    let out_of_attempts = policy.max_attempts.is_some_and(|max| attempt >= max);
    let too_old = matches!((policy.max_record_age, age), (Some(max), Some(age)) if age > max);
    if out_of_attempts || too_old {
        give_up(policy)
    } else {
        Next::Retry
    }
}

/// After the handler rejected a record: block does not apply.
pub fn after_reject(policy: &FailurePolicy) -> Next {
    match policy.on_failure {
        OnFailure::DeadLetter(_) => Next::DeadLetter,
        OnFailure::Block | OnFailure::Skip => Next::Skip,
    }
}

/// Puts given-up records to the dead-letter stream.
#[derive(Clone)]
pub struct DeadLetters {
    client: Client,
    stream: StreamName,
    subscription: SubscriptionName,
}

impl DeadLetters {
    /// A sink for `stream`, for records of `subscription`.
    pub fn new(client: Client, stream: StreamName, subscription: SubscriptionName) -> Self {
        Self {
            client,
            stream,
            subscription,
        }
    }

    /// The stream it puts to.
    pub fn stream(&self) -> &StreamName {
        &self.stream
    }

    /// The envelope (module docs) for one record, failed last by the
    /// plugin version `plugin`: with the data when it fits in one record
    /// beside the partition key, without it otherwise.
    pub fn envelope(
        &self,
        record: &Record,
        reason: &str,
        attempts: u32,
        plugin: Option<&PluginDigest>,
    ) -> Envelope {
        let key = record.partition_key.as_str().len();
        // Base64 of n bytes is 4⌈n/3⌉ characters: skip encoding data that
        // cannot fit anyway.
        if key + 4 * record.data.len().div_ceil(3) < MAX_RECORD_BYTES {
            let bytes = self.envelope_bytes(record, reason, attempts, plugin, true);
            if key + bytes.len() <= MAX_RECORD_BYTES {
                return Envelope {
                    bytes,
                    data_omitted: false,
                };
            }
        }
        Envelope {
            bytes: self.envelope_bytes(record, reason, attempts, plugin, false),
            data_omitted: true,
        }
    }

    fn envelope_bytes(
        &self,
        record: &Record,
        reason: &str,
        attempts: u32,
        plugin: Option<&PluginDigest>,
        with_data: bool,
    ) -> Vec<u8> {
        let envelope = serde_json::json!({
            "reason": capped(reason, MAX_GUEST_TEXT),
            "attempts": attempts,
            "subscription": self.subscription.as_str(),
            "plugin": plugin.map(ToString::to_string),
            "failed_at": now_ms(),
            "source": {
                "stream": record.stream.as_str(),
                "shard_id": record.shard.as_str(),
                "sequence_number": record.sequence.as_str(),
                "partition_key": record.partition_key.as_str(),
                "approximate_arrival": record.arrival_ms,
            },
            "data_bytes": record.data.len(),
            "data_omitted": !with_data,
            "data_base64": with_data.then(|| aws_smithy_types::base64::encode(&record.data)),
        });
        // A JSON value of strings and numbers always serializes.
        serde_json::to_vec(&envelope).expect("envelope serializes")
    }

    /// Puts one record's envelope, with the record's partition key; an
    /// envelope with data that the stream refuses as invalid is put again
    /// at once without it (module docs, "Size").
    ///
    /// # Errors
    /// The SDK's error, as text; the caller retries.
    pub async fn put(
        &self,
        record: &Record,
        reason: &str,
        attempts: u32,
        plugin: Option<&PluginDigest>,
    ) -> Result<Put, String> {
        let envelope = self.envelope(record, reason, attempts, plugin);
        let data_omitted = envelope.data_omitted;
        match self.put_envelope(record, envelope.bytes).await {
            Err(e) if !data_omitted && refused_as_invalid(&e) => {
                let bytes = self.envelope_bytes(record, reason, attempts, plugin, false);
                self.put_envelope(record, bytes)
                    .await
                    .map(|sequence| Put {
                        sequence,
                        data_omitted: true,
                    })
                    .map_err(|e| describe(&e))
            }
            put => put
                .map(|sequence| Put {
                    sequence,
                    data_omitted,
                })
                .map_err(|e| describe(&e)),
        }
    }

    async fn put_envelope(
        &self,
        record: &Record,
        bytes: Vec<u8>,
    ) -> Result<String, SdkError<PutRecordError>> {
        let output = self
            .client
            .put_record()
            .stream_name(self.stream.as_str())
            .partition_key(record.partition_key.as_str())
            .data(Blob::new(bytes))
            .send()
            .await?;
        Ok(output.sequence_number().to_owned())
    }
}

/// One record's envelope, built to fit (module docs, "Size").
#[derive(Debug)]
pub struct Envelope {
    /// The JSON.
    pub bytes: Vec<u8>,
    /// True when the data was left out.
    pub data_omitted: bool,
}

/// A dead letter put.
#[derive(Debug)]
pub struct Put {
    /// Its sequence number in the dead-letter stream.
    pub sequence: String,
    /// True when its envelope went without the data.
    pub data_omitted: bool,
}

/// True when Kinesis refused the put for what was sent (an invalid argument
/// or a failed validation, as for a record over its size), not for the
/// stream's state or the network: the same envelope would be refused again.
fn refused_as_invalid(e: &SdkError<PutRecordError>) -> bool {
    match e {
        SdkError::ServiceError(service) => {
            let err = service.err();
            err.is_invalid_argument_exception() || err.code() == Some("ValidationException")
        }
        _ => false,
    }
}

fn describe(e: &SdkError<PutRecordError>) -> String {
    format!("{}", aws_sdk_kinesis::error::DisplayErrorContext(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(
        max_attempts: Option<u32>,
        max_age: Option<u64>,
        on_failure: OnFailure,
    ) -> FailurePolicy {
        FailurePolicy {
            max_attempts,
            max_record_age: max_age.map(Duration::from_secs),
            on_failure,
            bisect_on_error: false,
        }
    }

    fn dead_letters() -> DeadLetters {
        let config = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
            .build();
        DeadLetters::new(
            Client::from_conf(config),
            StreamName::new("dlq"),
            SubscriptionName::new("orders-audit"),
        )
    }

    fn record(key: &str, data: Vec<u8>) -> Record {
        Record {
            stream: StreamName::new("orders"),
            shard: crate::ids::ShardId::new("shardId-000000000001"),
            partition_key: crate::ids::PartitionKey::new(key),
            sequence: crate::ids::SequenceNumber::parse(&"4".repeat(56)).unwrap(),
            arrival_ms: 1_764_633_599_000,
            data,
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
        let e = dead_letters().envelope(&r, "rejected: no", 1, None);
        assert!(!e.data_omitted);
        let v = parse(&e);
        assert_eq!(v["data_base64"], "eyJhbW91bnQiOjEyfQ==");
        assert_eq!(v["data_bytes"], 13);
        assert_eq!(v["data_omitted"], false);
        assert_eq!(v["source"]["sequence_number"], "4".repeat(56));
    }

    #[test]
    fn a_record_too_large_to_carry_leaves_its_data_out_and_says_where_it_is() {
        // Kinesis accepts 1,000,000 bytes of data; base64 of it is 1,333,336.
        let key = "k".repeat(256);
        let r = record(&key, vec![0xAB; 1_000_000]);
        let reason = format!("rejected: {}", "x".repeat(10_000_000));
        let e = dead_letters().envelope(&r, &reason, 1, None);
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
            let e = d.envelope(&record(key, vec![7; n]), "guest trapped: x", 3, None);
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
        let whole = d.envelope(&record(key, vec![7; lo]), "guest trapped: x", 3, None);
        assert!(
            MAX_RECORD_BYTES - record_size(key, &whole) < 8,
            "as full as base64 allows"
        );
    }

    #[test]
    fn unlimited_by_default_retries_forever() {
        let p = policy(None, None, OnFailure::Block);
        assert_eq!(
            after_failure(&p, 1_000_000, Some(Duration::from_secs(86_400))),
            Next::Retry
        );
    }

    #[test]
    fn attempts_run_out_at_max() {
        let p = policy(Some(3), None, OnFailure::Skip);
        assert_eq!(after_failure(&p, 1, None), Next::Retry);
        assert_eq!(after_failure(&p, 2, None), Next::Retry);
        assert_eq!(after_failure(&p, 3, None), Next::Skip);
        let p = policy(Some(3), None, OnFailure::DeadLetter("dlq".into()));
        assert_eq!(after_failure(&p, 3, None), Next::DeadLetter);
        let p = policy(Some(3), None, OnFailure::Block);
        assert_eq!(after_failure(&p, 3, None), Next::Blocked);
    }

    #[test]
    fn age_runs_out_past_max() {
        let p = policy(None, Some(60), OnFailure::Skip);
        assert_eq!(
            after_failure(&p, 1, Some(Duration::from_secs(59))),
            Next::Retry
        );
        assert_eq!(
            after_failure(&p, 1, Some(Duration::from_secs(61))),
            Next::Skip
        );
        assert_eq!(
            after_failure(&p, 1, None),
            Next::Retry,
            "unknown age never expires"
        );
    }

    #[test]
    fn rejects_never_block() {
        assert_eq!(
            after_reject(&policy(None, None, OnFailure::Block)),
            Next::Skip
        );
        assert_eq!(
            after_reject(&policy(None, None, OnFailure::Skip)),
            Next::Skip
        );
        assert_eq!(
            after_reject(&policy(None, None, OnFailure::DeadLetter("d".into()))),
            Next::DeadLetter
        );
    }
}
