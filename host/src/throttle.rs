//! Throttling, made visible: a per-shard counter of AWS calls refused for
//! throughput; a throttled stage says so at WARN at most once per
//! [`LOG_INTERVAL`], through a [`crate::logging::LogGate`].
//!
//! Throttling is a normal event for a stream consumer (other consumers
//! share a shard's read budget; a DynamoDB table has its capacity), so it
//! is not an error — but an operator must be able to see it. Readers count
//! Kinesis throttles per shard, the lease keeper counts DynamoDB throttles
//! per lease (an empty `shard_id` for table-wide calls) in
//! `shardlane_throttles_total{subscription, service, shard_id}`. GetRecords
//! is sent without the SDK's retries (`kinesis.rs`), so every refused read
//! counts; of other calls, only those the SDK gave up on count: its own
//! retries (up to three attempts) absorb brief bursts.
//!
//! Floor 3 (sinks and clients) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::time::Duration;

use crate::telemetry::{Counter, Telemetry};

/// How often a throttled stage may log that it is throttled.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The throttle counter of one service and shard.
pub(crate) fn counter(
    telemetry: &Telemetry,
    subscription: &str,
    service: &str,
    shard: &str,
) -> Counter {
    telemetry.counter(
        "shardlane_throttles_total",
        "AWS calls refused for throughput (throttling), by service and shard: every refused GetRecords; of other calls, those refused after the SDK's own retries.",
        &[
            ("subscription", subscription),
            ("service", service),
            ("shard_id", shard),
        ],
    )
}
