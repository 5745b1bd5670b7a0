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
//! acked, durably dead-lettered, or skipped by policy.
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
//!   "data_base64": "eyJhbW91bnQiOjEyfQ=="
//! }
//! ```
//!
//! `data_base64` is the original data, unchanged, base64-encoded (standard
//! alphabet, padded); `failed_at` and `approximate_arrival` are milliseconds
//! since the Unix epoch. `plugin` is the digest of the version whose
//! attempt failed last (after a swap, or with a canary, the version that
//! handled this record's key), `null` for a handler that is not a plugin.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;

use crate::channel::Record;
use crate::config::{FailurePolicy, OnFailure};
use crate::ids::{StreamName, SubscriptionName};
use crate::plugin::PluginDigest;

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
    /// plugin version `plugin`.
    pub fn envelope(
        &self,
        record: &Record,
        reason: &str,
        attempts: u32,
        plugin: Option<&PluginDigest>,
    ) -> Vec<u8> {
        let envelope = serde_json::json!({
            "reason": reason,
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
            "data_base64": aws_smithy_types::base64::encode(&record.data),
        });
        // A JSON value of strings and numbers always serializes.
        serde_json::to_vec(&envelope).expect("envelope serializes")
    }

    /// Puts one record's envelope, with the record's partition key.
    ///
    /// # Errors
    /// The SDK's error, as text; the caller retries.
    pub async fn put(
        &self,
        record: &Record,
        reason: &str,
        attempts: u32,
        plugin: Option<&PluginDigest>,
    ) -> Result<String, String> {
        let output = self
            .client
            .put_record()
            .stream_name(self.stream.as_str())
            .partition_key(record.partition_key.as_str())
            .data(Blob::new(self.envelope(record, reason, attempts, plugin)))
            .send()
            .await
            .map_err(|e| format!("{}", aws_sdk_kinesis::error::DisplayErrorContext(&e)))?;
        Ok(output.sequence_number().to_owned())
    }
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
