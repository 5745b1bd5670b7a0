//! Fixtures the unit tests of several stages share: a subscription as the
//! config makes it, a delivery, and a reader's context over a fake
//! Kinesis. Test-only (the layer check skips it, as it skips every test).

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::channel::{Delivery, DeliveryReceiver, Record, channel};
use crate::config::{Config, SubscriptionConfig};
use crate::ids::{PartitionKey, SequenceNumber, SessionId, ShardId, StreamName};
use crate::progress::Ticket;
use crate::reader::{ReaderContext, ShardReads, ShardSubscriber};
use crate::settlement::SettlementMsg;
use crate::telemetry::Telemetry;

/// Subscription `s` of stream `orders` with plugin `p.wasm`, and `extra`
/// config lines, validated as the config validates it.
pub(crate) fn subscription(extra: &str) -> Arc<SubscriptionConfig> {
    let toml = format!(
        "[[subscription]]\nname = \"s\"\nstream = \"orders\"\nplugin = \"p.wasm\"\n{extra}\n"
    );
    let config = Config::parse(&toml, std::path::Path::new("test.toml")).unwrap();
    Arc::new(config.subscriptions[0].clone())
}

/// Record `seq` of key `key` on `shard-0` of `orders`, delivered in
/// reader session 1 at offset `seq`.
pub(crate) fn delivery(key: &str, seq: u64) -> Delivery {
    Delivery {
        record: Arc::new(Record {
            window: None,
            stream: StreamName::from("orders"),
            shard: ShardId::from("shard-0"),
            partition_key: PartitionKey::new(key),
            sequence: SequenceNumber::parse(&seq.to_string()).unwrap(),
            sub_sequence: None,
            arrival_ms: 0,
            data: Vec::new(),
        }),
        ticket: Ticket {
            shard: ShardId::from("shard-0"),
            session: SessionId(1),
            offset: seq,
        },
    }
}

/// A reader's context over `reads` (and `fan_out`), and the far ends of
/// its channel and of its settlement queue.
pub(crate) fn reader_context(
    reads: Arc<dyn ShardReads>,
    fan_out: Option<Arc<dyn ShardSubscriber>>,
) -> (
    ReaderContext,
    DeliveryReceiver,
    mpsc::Receiver<SettlementMsg>,
) {
    let subscription = subscription("");
    let telemetry = Telemetry::new();
    let status = telemetry.subscription(&subscription.name, subscription.mode());
    let (deliveries_tx, deliveries) = channel();
    let (settlement_tx, settlement) = mpsc::channel(64);
    let filter = crate::reader::filter_feed::ActiveFilter::fixed(
        &telemetry,
        &subscription.name,
        &crate::ids::PluginDigest::of(b"test"),
        subscription.filter.clone(),
    );
    let ctx = ReaderContext {
        reads,
        fan_out,
        subscription,
        deliveries: deliveries_tx,
        settlement: settlement_tx,
        telemetry,
        status,
        range: None,
        before_read: None,
        decode: None,
        filter,
    };
    (ctx, deliveries, settlement)
}
