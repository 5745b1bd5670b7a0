//! The quarantine (`on_failure = "quarantine"`): a record that runs out of
//! attempts or age parks **its key**; it and every later record of that
//! key go to the dead-letter stream (envelope reason `quarantined`, in
//! order), while every other key flows on.
//!
//! # Where parked keys live
//! In the subscription's lease store, one item per parked key
//! ([`ParkedKey`]: when, why, by whom, how many records, the first and
//! the last, its parking's identity), each written conditionally on its
//! own revision: a park is one small write, however many keys are
//! parked. Each instance keeps the set of parked keys in memory, read
//! again from the store when one of its readers starts a shard (a lease
//! taken, a restart) and changed by every write it makes.
//!
//! # Protocol, and why a key's later record never runs before its parked one
//! Parking a record (the first, or a later one of a parked key) is, in
//! this order: (1) the store write that parks the key or counts the record
//! as its latest, **fenced on the shard's lease** (only its holder may
//! park; see "Items" in `crate::lease`); (2) the dead-letter put; (3)
//! settling the record. So:
//! - **The checkpoint passes a parked record only once it is durably
//!   dead-lettered and its key durably parked.** A crash between the steps
//!   leaves the record unsettled; it is read again, finds its key parked,
//!   and is parked again: the item does not change (a record at or before
//!   the key's latest was counted; see `crate::parked`), and the dead
//!   letter, put again, carries the same id, which redrive hands back once
//!   — so neither a duplicate nor a reordering reaches the plugin.
//! - **A lane whose lease was lost parks nothing**: the fenced write is
//!   refused, and the record is left unsettled for the shard's new owner
//!   (its session is over; settlement ignores it).
//! - **In one instance**, a key's records reach one lane in order
//!   (sequential or `by_key` dispatch), and the lane parks a record before
//!   it takes the next: the next finds the key in the set and is parked
//!   behind it.
//! - **Across a hand-over or restart**, the instance that parked the key
//!   wrote the store before it settled the record, and so before its last
//!   checkpoint passed it; the next owner reads the store when its reader
//!   starts the shard, before handing out a record. A split's children
//!   start only after their parent ended, so after the parent's parks.
//! - **A release** (`shardlane redrive --key`) deletes the key's item only
//!   if the redrive handled the key's parked records from the item's
//!   `first` on, at least as many as it counts, and the item is still at
//!   the revision the redrive read (so no record was parked since the last
//!   one it handled).
//! - **Concurrent reads**: the in-memory set notes when this instance
//!   learnt of each key; a read of the store that began before a park
//!   cannot undo it. An instance that still thinks a key parked learns
//!   otherwise at its next record of the key: counting that record finds
//!   the item gone, and the record is handled.
//!
//! With `workers = n` (no `by_key`) a key's records may be in two lanes at
//! once, so the order of its records was never kept, and is not here
//! either; with batches, records of the key in the poison record's own
//! batch were handled in that batch, and every later batch's are parked.
//!
//! # Bounds
//! At most `quarantine.max_keys` keys (default 100, up to 100,000) are
//! parked at once, as this instance last read them, and each holds at
//! most `quarantine.max_records` (default 100,000). Past them nothing is
//! dropped and no order is broken: a record that would park a key past
//! `max_keys` blocks its lane as `on_failure = "block"` does (retried,
//! logged), and a later record of a key at `max_records` waits until the
//! key is released. Either way the lane waits, and, once its inbox is
//! full, the subscription (see the book's "Failures and limits"). A
//! shard's reader reads every parked key before it starts (one paginated
//! read: 10,000 keys of 256 bytes are about 6 MB, six DynamoDB pages).
//!
//! A `reject` is dead-lettered (reason `rejected: …`) without parking the
//! key: the handler judged that one record, not its key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;

use super::{DeadLetterSink, LastFailure};
use crate::channel::Record;
use crate::clock::now_ms;
use crate::ids::{OwnerId, PartitionKey, ShardId, StreamName, SubscriptionName};
use crate::kinesis::KinesisError;
use crate::lease::{Fence, Item, ItemKind, ItemWrite, LeaseError, LeaseKey, LeaseStore};
use crate::logging::capped;
use crate::parked::{ParkLimits, ParkRefused, ParkedKey, Put, Source};
use crate::reader::BeforeRead;
use crate::telemetry::{Counter, Gauge, SubscriptionStatus, Telemetry};

/// Tries of a conditional write that lost to another writer before the
/// park is reported failed (and the lane tries again after a backoff).
const WRITE_TRIES: u32 = 8;

/// Parked keys the status page lists.
const SHOWN: usize = 20;

/// Bytes of the parking failure kept in the key's item (the whole of it,
/// up to 8 KiB, is in the first envelope's `cause`).
const REASON_KEPT: usize = 128;

/// What parking a record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parking {
    /// Parked and dead-lettered: settle it.
    Parked,
    /// Its key is not parked (released meanwhile): handle it.
    Released,
    /// The shard's lease is not this instance's: leave the record
    /// unsettled for its new owner.
    Fenced,
}

/// Why a record was not parked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParkError {
    /// The quarantine is full (module docs, "Bounds").
    #[error("quarantine full: {0}")]
    Full(#[from] ParkRefused),
    /// The lease store failed, or kept changing under the write.
    #[error("cannot record the parked key in the lease store: {0}")]
    Store(#[from] LeaseError),
    /// The dead-letter put failed.
    #[error("cannot put the parked record to the dead-letter stream: {0}")]
    Put(#[from] KinesisError),
}

/// The parked keys as this instance knows them (module docs,
/// "Concurrent reads").
#[derive(Default)]
struct Known {
    /// Each parked key, with the local step at which this instance learnt
    /// of it.
    keys: HashMap<PartitionKey, u64>,
    /// Moved on by every change.
    step: u64,
}

/// A subscription's quarantine (module docs).
pub(crate) struct Quarantine {
    subscription: SubscriptionName,
    store: Arc<dyn LeaseStore>,
    sink: Arc<dyn DeadLetterSink>,
    limits: ParkLimits,
    owner: OwnerId,
    known: RwLock<Known>,
    /// Whether any key is parked: the one check a record pays otherwise.
    any: AtomicBool,
    /// Tells parkings apart (with the owner and the time).
    parkings: AtomicU64,
    keys: Gauge,
    records: Counter,
    status: Arc<SubscriptionStatus>,
}

impl Quarantine {
    /// The quarantine of `subscription`, parking in `store` and putting to
    /// `sink`, as instance `owner`.
    pub(crate) fn new(
        subscription: SubscriptionName,
        store: Arc<dyn LeaseStore>,
        sink: Arc<dyn DeadLetterSink>,
        limits: ParkLimits,
        owner: OwnerId,
        telemetry: &Telemetry,
        status: Arc<SubscriptionStatus>,
    ) -> Self {
        let sub = subscription.as_str();
        Self {
            keys: telemetry.gauge(
                "shardlane_parked_keys",
                "Partition keys parked by the quarantine (on_failure = \"quarantine\"), as this instance last read them.",
                &[("subscription", sub)],
            ),
            records: telemetry.counter(
                "shardlane_records_parked_total",
                "Records put to the dead-letter stream because their key is parked.",
                &[("subscription", sub)],
            ),
            subscription,
            store,
            sink,
            limits,
            owner,
            known: RwLock::new(Known::default()),
            any: AtomicBool::new(false),
            parkings: AtomicU64::new(0),
            status,
        }
    }

    /// The dead-letter stream parked records go to.
    pub(crate) fn sink(&self) -> &dyn DeadLetterSink {
        &*self.sink
    }

    /// Whether any key is parked, as this instance knows.
    pub(crate) fn any_parked(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Whether `key` is parked, as this instance knows.
    pub(crate) fn is_parked(&self, key: &PartitionKey) -> bool {
        self.any_parked()
            && self
                .known
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .keys
                .contains_key(key)
    }

    /// Reads the parked keys from the store.
    ///
    /// # Errors
    /// The store's.
    pub(crate) async fn refresh(&self) -> Result<(), LeaseError> {
        let began = self.known.read().unwrap_or_else(|e| e.into_inner()).step;
        let items = self
            .store
            .read_items(&self.subscription, ItemKind::Parked)
            .await?;
        self.take_read(began, &items);
        Ok(())
    }

    /// Takes `items`, read from the store from local step `began` on, as
    /// the parked keys: keys learnt of since the read began stay, others
    /// are as read.
    fn take_read(&self, began: u64, items: &[Item]) {
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        let read: HashMap<PartitionKey, u64> = items
            .iter()
            .map(|item| (PartitionKey::new(item.key.as_str()), began))
            .collect();
        known
            .keys
            .retain(|key, at| *at > began || read.contains_key(key));
        for (key, at) in read {
            known.keys.entry(key).or_insert(at);
        }
        self.publish(&known);
    }

    /// Notes `key` parked (or, `parked` false, released).
    fn note(&self, key: &PartitionKey, parked: bool) {
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        known.step += 1;
        let step = known.step;
        if parked {
            known.keys.insert(key.clone(), step);
        } else {
            known.keys.remove(key);
        }
        self.publish(&known);
    }

    fn publish(&self, known: &Known) {
        self.any.store(!known.keys.is_empty(), Ordering::Release);
        self.keys.set(known.keys.len() as u64);
        let mut shown: Vec<String> = known.keys.keys().map(|k| k.as_str().to_owned()).collect();
        shown.sort_unstable();
        shown.truncate(SHOWN);
        self.status.set_parked(known.keys.len(), shown);
    }

    fn count(&self) -> usize {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys
            .len()
    }

    /// A new parking's identity: this instance, the time and a count.
    fn new_parking(&self) -> String {
        format!(
            "{}-{}-{}",
            self.owner,
            now_ms(),
            self.parkings.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Parks `record` (module docs, "Protocol"): the record that gave up
    /// (`first`, `failure` its last failure), or a later record of a
    /// parked key.
    ///
    /// # Errors
    /// [`ParkError`]: the caller keeps the record unsettled, and tries
    /// again after a backoff (a full quarantine: see "Bounds").
    pub(crate) async fn park(
        &self,
        record: &Record,
        failure: LastFailure<'_>,
        first: bool,
    ) -> Result<Parking, ParkError> {
        let source = Source {
            shard: record.shard.as_str().to_owned(),
            sequence: record.sequence.as_str().to_owned(),
            sub: record.sub_sequence,
        };
        let parked = match self.record_park(record, &source, failure, first).await? {
            Ok(parked) => parked,
            Err(parking) => return Ok(parking),
        };
        self.note(&record.partition_key, true);
        let cause = if first { Some(failure.reason) } else { None };
        let put = self
            .sink
            .put(
                record,
                LastFailure {
                    reason: "quarantined",
                    cause,
                    parking: Some(&parked.parking),
                    ..failure
                },
            )
            .await?;
        if parked.first == source && parked.first_put.is_none() {
            self.note_first_put(&record.partition_key, &parked, &put)
                .await;
        }
        self.records.inc();
        tracing::warn!(
            subscription = %self.subscription, shard_id = %record.shard, sequence_number = %record.sequence,
            partition_key = %record.partition_key, first, parking = %parked.parking, dead_letter_stream = %self.sink.stream(),
            dead_letter_sequence = put.sequence, "record parked: its key is quarantined"
        );
        Ok(Parking::Parked)
    }

    /// Step (1) of a park: the key's item as it stands once the record is
    /// counted in it (`Ok`), or why the record is not parked (`Err`:
    /// released, fenced).
    async fn record_park(
        &self,
        record: &Record,
        source: &Source,
        failure: LastFailure<'_>,
        first: bool,
    ) -> Result<Result<ParkedKey, Parking>, ParkError> {
        let key = record.partition_key.as_str();
        let fence = Fence {
            lease: LeaseKey {
                subscription: self.subscription.clone(),
                stream: record.stream.clone(),
                shard: record.shard.clone(),
            },
            owner: self.owner.clone(),
        };
        for _ in 0..WRITE_TRIES {
            let current = self
                .store
                .read_item(&self.subscription, ItemKind::Parked, key)
                .await?;
            let next = match (current, first) {
                (None, false) => {
                    self.note(&record.partition_key, false);
                    return Ok(Err(Parking::Released));
                }
                (None, true) => {
                    let count = self.count();
                    if count >= self.limits.max_keys {
                        return Err(ParkRefused::Keys(count).into());
                    }
                    let reason = capped(failure.reason, REASON_KEPT);
                    ParkedKey::new(
                        source.clone(),
                        self.new_parking(),
                        &reason,
                        self.owner.as_str(),
                        now_ms(),
                    )
                }
                (Some(item), _) => {
                    let parked = decode(&item)?;
                    match parked.park_again(source, self.limits)? {
                        Some(next) => next,
                        // Parked before (a crash came between): put again.
                        None => return Ok(Ok(parked)),
                    }
                }
            };
            match self.write(key, &next, Some(&fence)).await? {
                ItemWrite::Written => return Ok(Ok(next)),
                ItemWrite::Changed => continue,
                ItemWrite::Fenced => return Ok(Err(Parking::Fenced)),
            }
        }
        Err(ParkError::Store(LeaseError::Store(
            format!("the parked key changed {WRITE_TRIES} times under this write").into(),
        )))
    }

    async fn write(
        &self,
        key: &str,
        parked: &ParkedKey,
        fence: Option<&Fence>,
    ) -> Result<ItemWrite, LeaseError> {
        let doc = serde_json::to_string(parked)
            .map_err(|e| LeaseError::Store(crate::cause::Cause::new(e)))?;
        self.store
            .write_item(
                &self.subscription,
                ItemKind::Parked,
                key,
                parked.revision,
                doc,
                fence,
            )
            .await
    }

    /// Notes where the first dead letter of a parking lies (where
    /// `redrive --key` starts reading). Best effort: without it, redrive
    /// reads the whole dead-letter stream.
    async fn note_first_put(&self, key: &PartitionKey, parked: &ParkedKey, put: &super::Put) {
        let mut current = parked.clone();
        for _ in 0..WRITE_TRIES {
            let next = current.with_first_put(Put {
                shard: put.shard.as_str().to_owned(),
                sequence: put.sequence.clone(),
            });
            match self.write(key.as_str(), &next, None).await {
                Ok(ItemWrite::Written) | Ok(ItemWrite::Fenced) => return,
                Ok(ItemWrite::Changed) => {}
                Err(e) => {
                    tracing::warn!(subscription = %self.subscription, partition_key = %key, error = %e, "cannot note where the parking's first dead letter is; redrive --key reads the whole dead-letter stream for it");
                    return;
                }
            }
            match self
                .store
                .read_item(&self.subscription, ItemKind::Parked, key.as_str())
                .await
            {
                Ok(Some(item)) => match decode(&item) {
                    Ok(now) if now.parking == parked.parking && now.first_put.is_none() => {
                        current = now;
                    }
                    _ => return,
                },
                _ => return,
            }
        }
    }

    /// The stream parked records go to.
    pub(crate) fn stream(&self) -> &StreamName {
        self.sink.stream()
    }
}

/// A parked key's item, decoded.
///
/// # Errors
/// A stored item that does not decode.
pub(crate) fn decode(item: &Item) -> Result<ParkedKey, LeaseError> {
    serde_json::from_str(&item.doc).map_err(|e| LeaseError::Store(crate::cause::Cause::new(e)))
}

#[async_trait]
impl BeforeRead for Quarantine {
    /// Reads the parked keys before a shard's first record is handed out
    /// (module docs, "Protocol"), retrying while the store fails.
    async fn before_read(&self, shard: &ShardId) {
        let mut backoff = crate::backoff::Backoff::new(
            std::time::Duration::from_millis(200),
            std::time::Duration::from_secs(10),
        );
        while let Err(e) = self.refresh().await {
            let wait = backoff.next_wait();
            tracing::warn!(subscription = %self.subscription, shard_id = %shard, error = %e, ?wait, "cannot read the parked keys; the shard waits");
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::lease::memory::MemoryLeaseStore;

    /// Dead letters, kept in order.
    struct Kept {
        stream: StreamName,
        puts: Mutex<Vec<(String, Option<String>)>>,
    }

    impl Default for Kept {
        fn default() -> Self {
            Self {
                stream: "dlq".into(),
                puts: Mutex::default(),
            }
        }
    }

    #[async_trait]
    impl DeadLetterSink for Kept {
        fn stream(&self) -> &StreamName {
            &self.stream
        }

        async fn put(
            &self,
            record: &Record,
            failure: LastFailure<'_>,
        ) -> Result<super::super::Put, KinesisError> {
            let mut puts = self.puts.lock().unwrap();
            puts.push((
                super::super::record_id(record),
                failure.parking.map(str::to_owned),
            ));
            Ok(super::super::Put {
                shard: ShardId::new("shardId-000000000009"),
                sequence: format!("{}", 1000 + puts.len()),
                data_omitted: false,
            })
        }
    }

    struct Rig {
        q: Quarantine,
        store: Arc<MemoryLeaseStore>,
        sink: Arc<Kept>,
    }

    const SHARD: &str = "shardId-000000000000";

    /// A quarantine whose instance `me` holds the shard's lease.
    async fn rig(max_keys: usize) -> Rig {
        let store = Arc::new(MemoryLeaseStore::new());
        let lease = LeaseKey {
            subscription: "s".into(),
            stream: "orders".into(),
            shard: SHARD.into(),
        };
        store.acquire(&lease, &"me".into(), None).await.unwrap();
        let sink = Arc::new(Kept::default());
        let q = Quarantine::new(
            "s".into(),
            store.clone(),
            sink.clone(),
            ParkLimits {
                max_keys,
                max_records: 1_000,
            },
            "me".into(),
            &Telemetry::new(),
            Arc::new(SubscriptionStatus::default()),
        );
        Rig { q, store, sink }
    }

    fn record(key: &str, sequence: u32) -> Record {
        Record {
            window: None,
            stream: "orders".into(),
            shard: SHARD.into(),
            partition_key: PartitionKey::new(key),
            sequence: crate::ids::SequenceNumber::parse(&format!("{}", 1000 + sequence)).unwrap(),
            sub_sequence: None,
            arrival_ms: 0,
            data: Vec::new(),
        }
    }

    const FAILED: LastFailure<'static> = LastFailure {
        reason: "trap",
        attempts: 3,
        version: None,
        cause: None,
        parking: None,
    };

    async fn item(rig: &Rig, key: &str) -> Option<ParkedKey> {
        rig.store
            .read_item(&"s".into(), ItemKind::Parked, key)
            .await
            .unwrap()
            .map(|item| decode(&item).unwrap())
    }

    /// Catches: a read of the parked keys that raced a park (begun before
    /// it, answered after) undoing it in memory, so the key's next record
    /// would be handled before its parked one.
    #[tokio::test]
    async fn an_older_read_never_undoes_a_newer_park() {
        let rig = rig(10).await;
        let began = rig.q.known.read().unwrap().step;
        assert_eq!(
            rig.q.park(&record("k", 1), FAILED, true).await.unwrap(),
            Parking::Parked
        );
        rig.q.take_read(began, &[]);
        assert!(
            rig.q.is_parked(&PartitionKey::new("k")),
            "read before the park"
        );
        rig.q.refresh().await.unwrap();
        assert!(rig.q.is_parked(&PartitionKey::new("k")));
        // A key released elsewhere is forgotten by the next read.
        let parked = item(&rig, "k").await.unwrap();
        assert!(
            rig.store
                .delete_item(&"s".into(), ItemKind::Parked, "k", parked.revision)
                .await
                .unwrap()
        );
        rig.q.refresh().await.unwrap();
        assert!(!rig.q.is_parked(&PartitionKey::new("k")));
    }

    /// Catches: a record parked again after a crash (its put done, its
    /// settle lost) counted twice, or moving the key's `last` back; or a
    /// dead letter whose id differs between the two puts (redrive could
    /// not hand it back once).
    #[tokio::test]
    async fn a_record_parked_again_changes_nothing_but_is_put_again_under_its_id() {
        let rig = rig(10).await;
        for (n, first) in [(1, true), (2, false), (3, false)] {
            rig.q.park(&record("k", n), FAILED, first).await.unwrap();
        }
        let before = item(&rig, "k").await.unwrap();
        assert_eq!((before.records, before.last.sequence.as_str()), (3, "1003"));
        // The restart: the first two come again.
        rig.q.park(&record("k", 1), FAILED, true).await.unwrap();
        rig.q.park(&record("k", 2), FAILED, false).await.unwrap();
        let after = item(&rig, "k").await.unwrap();
        assert_eq!(after.records, 3);
        assert_eq!(after.last, before.last);
        let puts = rig.sink.puts.lock().unwrap().clone();
        let ids: Vec<&str> = puts.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "shardId-000000000000/1001",
                "shardId-000000000000/1002",
                "shardId-000000000000/1003",
                "shardId-000000000000/1001",
                "shardId-000000000000/1002"
            ]
        );
        assert!(
            puts.iter()
                .all(|(_, p)| p.as_deref() == Some(after.parking.as_str())),
            "every dead letter names the parking"
        );
        assert_eq!(
            after.first_put.map(|p| p.sequence),
            Some("1001".to_owned()),
            "where the parking's first dead letter lies"
        );
    }

    /// Catches: a lane that lost its shard's lease parking a key (the new
    /// owner would never know it and handle the key's later records).
    #[tokio::test]
    async fn only_the_lease_holder_parks() {
        let rig = rig(10).await;
        let mut other = record("k", 1);
        other.shard = "shardId-000000000001".into();
        assert_eq!(
            rig.q.park(&other, FAILED, true).await.unwrap(),
            Parking::Fenced
        );
        assert!(item(&rig, "k").await.is_none());
        assert!(rig.sink.puts.lock().unwrap().is_empty());
        assert!(!rig.q.is_parked(&PartitionKey::new("k")));
    }

    /// Catches: a quarantine that stops parking (or rewrites one growing
    /// document) long before its bound: 10,000 keys of 256 bytes on one
    /// shard, each one small write, then refused past `max_keys`.
    #[tokio::test]
    async fn ten_thousand_long_keys_park_one_item_each() {
        let rig = rig(10_000).await;
        let key = |i: u32| format!("{i:0>256}");
        for i in 0..10_000 {
            let parked = rig.q.park(&record(&key(i), i), FAILED, true).await.unwrap();
            assert_eq!(parked, Parking::Parked);
        }
        let items = rig
            .store
            .read_items(&"s".into(), ItemKind::Parked)
            .await
            .unwrap();
        assert_eq!(items.len(), 10_000);
        assert!(items.iter().all(|i| i.doc.len() < 1_024), "small items");
        assert!(matches!(
            rig.q.park(&record("one more", 10_001), FAILED, true).await,
            Err(ParkError::Full(ParkRefused::Keys(10_000)))
        ));
        rig.q.refresh().await.unwrap();
        assert!(rig.q.is_parked(&PartitionKey::new(key(9_999).as_str())));
    }
}
