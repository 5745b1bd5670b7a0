//! Tracing spans for handler calls, with OpenTelemetry's messaging
//! semantic-convention fields: a layer that exports spans to OpenTelemetry
//! (e.g. `tracing-opentelemetry`) maps `otel.kind`, `otel.name` and the
//! `messaging.*` fields onto a consumer span as the conventions name them.
//!
//! A call of `handle` is a `process` span of one message
//! (`messaging.message.id` = the sequence number, the shard as
//! `messaging.destination.partition.id`); a call of `handle-batch` is one
//! span for the batch (`messaging.batch.message_count`, the first record's
//! shard). `messaging.consumer.group.name` is the subscription: it plays
//! the role of a consumer group (KCL's application name).
//!
//! All spans use [`TARGET`], so a filter can turn them off without
//! touching other logs (`RUST_LOG=info,shardlane::otel=off`). With logging
//! off, or the target filtered out, a span costs one cached interest check.

use std::sync::Arc;

use tracing::Span;

use crate::channel::Record;
use crate::config::SubscriptionConfig;
use crate::ids::LaneId;

/// The target of every handler-call span.
pub(crate) const TARGET: &str = "shardlane::otel";

/// The value of `messaging.system` for Kinesis.
pub(crate) const MESSAGING_SYSTEM: &str = "aws_kinesis";

/// The span around one GetRecords call of a shard's reader
/// (`messaging.batch.message_count` is recorded when it returns).
pub(crate) fn receive(sub: &SubscriptionConfig, shard: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "receive",
        otel.kind = "consumer",
        otel.name = %format_args!("receive {}", sub.stream),
        messaging.system = MESSAGING_SYSTEM,
        messaging.operation.type = "receive",
        messaging.operation.name = "GetRecords",
        messaging.destination.name = sub.stream.as_str(),
        messaging.destination.partition.id = shard,
        messaging.consumer.group.name = sub.name.as_str(),
        messaging.batch.message_count = tracing::field::Empty,
    )
}

/// The span around one `handle` call.
pub(crate) fn process(
    sub: &SubscriptionConfig,
    lane: LaneId,
    record: &Record,
    attempt: u32,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        "process",
        otel.kind = "consumer",
        otel.name = %format_args!("process {}", record.stream),
        messaging.system = MESSAGING_SYSTEM,
        messaging.operation.type = "process",
        messaging.operation.name = "handle",
        messaging.destination.name = record.stream.as_str(),
        messaging.destination.partition.id = record.shard.as_str(),
        messaging.message.id = record.sequence.as_str(),
        messaging.consumer.group.name = sub.name.as_str(),
        lane = lane.0,
        attempt,
    )
}

/// The span around one `handle-batch` call.
pub(crate) fn process_batch(
    sub: &SubscriptionConfig,
    lane: LaneId,
    records: &[(Arc<Record>, u32)],
) -> Span {
    let first = records.first().map(|(r, _)| &**r);
    tracing::info_span!(
        target: TARGET,
        "process",
        otel.kind = "consumer",
        otel.name = %format_args!("process {}", first.map(|r| r.stream.as_str()).unwrap_or_default()),
        messaging.system = MESSAGING_SYSTEM,
        messaging.operation.type = "process",
        messaging.operation.name = "handle-batch",
        messaging.destination.name = first.map(|r| r.stream.as_str()),
        messaging.destination.partition.id = first.map(|r| r.shard.as_str()),
        messaging.batch.message_count = records.len(),
        messaging.consumer.group.name = sub.name.as_str(),
        lane = lane.0,
    )
}
