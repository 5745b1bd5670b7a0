//! The subscription channel: the one bounded queue between a subscription's
//! shard readers and its dispatch stage, and the record type it carries.
//!
//! Every reader of a subscription sends into the same channel of
//! [`CHANNEL_CAPACITY`] deliveries. When the handlers fall behind the channel
//! fills, and every reader waits in `send`: no shard is read ahead of what the
//! service can handle, and the records held in memory stay bounded (a reader
//! holds at most one GetRecords response, `read_limit` records, while it
//! waits). A delivery is one record plus the [`Ticket`] that settles it.
//!
//! The channel is multi-consumer (`async-channel`) so that unordered
//! workers take from it directly, with no extra hop; the channel closes when
//! the last reader's sender is dropped, and dispatch drains what is left.

use std::sync::Arc;

use crate::ids::{PartitionKey, SequenceNumber, ShardId, StreamName};
use crate::settlement::Ticket;

/// Deliveries the channel holds before readers wait. 64 keeps a few
/// milliseconds of work queued for the handlers (so they never starve while
/// a reader's next GetRecords is in flight) without reading far ahead of
/// what is handled.
pub const CHANNEL_CAPACITY: usize = 64;

/// One record as read from Kinesis (or one user record of a KPL
/// aggregate, with its own partition key). Immutable and shared: a redelivery hands
/// out the same `Arc`, never a copy of the data.
#[derive(Debug)]
pub struct Record {
    /// The stream it was read from.
    pub stream: StreamName,
    /// The shard it was read from.
    pub shard: ShardId,
    /// The producer's partition key.
    pub partition_key: PartitionKey,
    /// Its sequence number within the shard (a KPL aggregate's, for a
    /// user record taken out of one).
    pub sequence: SequenceNumber,
    /// For a user record of a KPL aggregate: its index in the aggregate.
    pub sub_sequence: Option<u32>,
    /// When Kinesis accepted it, in ms since the Unix epoch.
    pub arrival_ms: u64,
    /// The payload.
    pub data: Vec<u8>,
}

/// A record on its way to a handler, with the ticket that settles it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The record.
    pub record: Arc<Record>,
    /// Where it settles.
    pub ticket: Ticket,
}

/// The sending half, one clone per reader.
pub(crate) type DeliverySender = async_channel::Sender<Delivery>;
/// The receiving half, owned by the dispatch stage. Multi-consumer: in
/// `workers` mode every lane takes from it directly.
pub(crate) type DeliveryReceiver = async_channel::Receiver<Delivery>;

/// Creates a subscription's channel.
pub fn channel() -> (DeliverySender, DeliveryReceiver) {
    async_channel::bounded(CHANNEL_CAPACITY)
}
