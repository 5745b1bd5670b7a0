//! The quarantine (`on_failure = "quarantine"`): a record that runs out of
//! attempts or age parks **its key**; it and every later record of that
//! key go to the dead-letter stream (envelope reason `quarantined`, in
//! order), while every other key flows on.
//!
//! # Where parked keys live
//! In the subscription's lease store, one document ([`ParkedKeys`]: each
//! key with when, why, by whom, how many records, the first and last),
//! written conditionally on its revision. Each instance keeps the set of
//! parked keys in memory, read again from the store when one of its
//! readers starts a shard (a lease taken, a restart) and replaced by every
//! write it makes.
//!
//! # Protocol, and why a key's later record never runs before its parked one
//! Parking a record (the first, or a later one of a parked key) is, in
//! this order: (1) the store write that parks the key or counts the record
//! as its latest; (2) the dead-letter put; (3) settling the record. So:
//! - **The checkpoint passes a parked record only once it is durably
//!   dead-lettered and its key durably parked.** A crash between the steps
//!   leaves the record unsettled; it is read again, finds its key parked,
//!   and is parked again (the store counts a record only once; the
//!   dead-letter stream may hold it twice).
//! - **In one instance**, a key's records reach one lane in order
//!   (sequential or `by_key` dispatch), and the lane parks a record before
//!   it takes the next: the next finds the key in the set and is parked
//!   behind it.
//! - **Across a hand-over or restart**, the instance that parked the key
//!   wrote the store before it settled the record, and so before its last
//!   checkpoint passed it; the next owner reads the store when its reader
//!   starts the shard, before handing out a record. A split's children
//!   start only after their parent ended, so after the parent's parks.
//! - **A release** (`shardlane redrive --key`) lands only if the redrive
//!   handled the key's parked records from the document's `first` on, at
//!   least as many as it counts, and no record was parked since the last
//!   one it handled (the document's `last`), so no parked record is left
//!   behind.
//! - **Concurrent reads**: the in-memory set keeps the revision it came
//!   from and never takes an older one, so a refresh that raced a park
//!   cannot undo it. An instance that still thinks the
//!   key parked learns otherwise at its next record of the key: counting
//!   that record in the store finds the key gone, and the record is handled.
//!
//! With `workers = n` (no `by_key`) a key's records may be in two lanes at
//! once, so the order of its records was never kept, and is not here
//! either; with batches, records of the key in the poison record's own
//! batch were handled in that batch, and every later batch's are parked.
//!
//! # Bounds
//! At most `quarantine.max_keys` keys (default 100, at most 300: the
//! document is one DynamoDB item) are parked at once, and each holds at
//! most `quarantine.max_records` (default 100,000). Past
//! them nothing is dropped and no order is broken: a record that would
//! park a key past `max_keys` blocks its lane as `on_failure = "block"`
//! does (retried, logged), and a later record of a key at `max_records`
//! waits until the key is released. Either way the lane waits, and,
//! once its inbox is full, the subscription (see the README's "Failures
//! and limits").
//!
//! A `reject` is dead-lettered (reason `rejected: …`) without parking the
//! key: the handler judged that one record, not its key.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;

use super::{DeadLetterSink, LastFailure};
use crate::channel::Record;
use crate::clock::now_ms;
use crate::ids::{PartitionKey, ShardId, StreamName, SubscriptionName};
use crate::kinesis::KinesisError;
use crate::lease::{DocKind, LeaseError, LeaseStore, read_typed};
use crate::logging::capped;
use crate::parked::{ParkLimits, ParkRefused, ParkedKeys, Source};
use crate::reader::BeforeRead;
use crate::telemetry::{Counter, Gauge, SubscriptionStatus, Telemetry};

/// Tries of a conditional write that lost to another writer before the
/// park is reported failed (and the lane tries again after a backoff).
const WRITE_TRIES: u32 = 8;

/// Parked keys the status page lists.
const SHOWN: usize = 20;

/// Bytes of the parking failure kept in the lease store (the whole of it,
/// up to 8 KiB, is in the first envelope's `cause`): at `max_keys` = 300
/// keys of 256-byte partition keys the document stays well under
/// DynamoDB's 400 KB item.
const REASON_KEPT: usize = 128;

/// What parking a record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parking {
    /// Parked and dead-lettered: settle it.
    Parked,
    /// Its key is not parked (released meanwhile): handle it.
    Released,
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

/// A subscription's quarantine (module docs).
pub(crate) struct Quarantine {
    subscription: SubscriptionName,
    store: Arc<dyn LeaseStore>,
    sink: Arc<dyn DeadLetterSink>,
    limits: ParkLimits,
    owner: String,
    /// The parked keys, with the revision of the document they came from.
    parked: RwLock<(u64, HashSet<PartitionKey>)>,
    /// Whether any key is parked: the one check a record pays otherwise.
    any: AtomicBool,
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
        owner: String,
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
            parked: RwLock::new((0, HashSet::new())),
            any: AtomicBool::new(false),
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
                .parked
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .contains(key)
    }

    /// Reads the parked keys from the store.
    ///
    /// # Errors
    /// The store's.
    pub(crate) async fn refresh(&self) -> Result<(), LeaseError> {
        let doc = read_typed(&*self.store, &self.subscription, DocKind::Parked).await?;
        self.remember(&doc.unwrap_or_default());
        Ok(())
    }

    /// Takes `doc` as the parked keys, unless a newer revision is held
    /// already: a read that raced a park must not undo it.
    fn remember(&self, doc: &ParkedKeys) {
        let mut held = self.parked.write().unwrap_or_else(|e| e.into_inner());
        if doc.revision < held.0 {
            return;
        }
        let keys: HashSet<PartitionKey> = doc
            .keys
            .keys()
            .map(|k| PartitionKey::new(k.as_str()))
            .collect();
        self.any.store(!keys.is_empty(), Ordering::Release);
        self.keys.set(keys.len() as u64);
        self.status
            .set_parked(keys.len(), doc.keys.keys().take(SHOWN).cloned().collect());
        *held = (doc.revision, keys);
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
        let key = record.partition_key.as_str();
        let source = Source {
            shard: record.shard.as_str().to_owned(),
            sequence: record.sequence.as_str().to_owned(),
            sub: record.sub_sequence,
        };
        let mut written = false;
        for _ in 0..WRITE_TRIES {
            let current: ParkedKeys = read_typed(&*self.store, &self.subscription, DocKind::Parked)
                .await?
                .unwrap_or_default();
            let next = if first {
                current.park(
                    key,
                    source.clone(),
                    &capped(failure.reason, REASON_KEPT),
                    &self.owner,
                    now_ms(),
                    self.limits,
                )?
            } else {
                match current.add(key, source.clone(), self.limits)? {
                    Some(next) => next,
                    None => {
                        self.remember(&current);
                        return Ok(Parking::Released);
                    }
                }
            };
            let doc = serde_json::to_string(&next)
                .map_err(|e| LeaseError::Store(crate::cause::Cause::new(e)))?;
            if self
                .store
                .write_doc(&self.subscription, DocKind::Parked, next.revision, doc)
                .await?
            {
                self.remember(&next);
                written = true;
                break;
            }
        }
        if !written {
            return Err(ParkError::Store(LeaseError::Store(
                format!("the parked keys changed {WRITE_TRIES} times under this write").into(),
            )));
        }
        let cause = if first { Some(failure.reason) } else { None };
        let put = self
            .sink
            .put(
                record,
                LastFailure {
                    reason: "quarantined",
                    cause,
                    ..failure
                },
            )
            .await?;
        self.records.inc();
        tracing::warn!(
            subscription = %self.subscription, shard_id = %record.shard, sequence_number = %record.sequence,
            partition_key = %record.partition_key, first, dead_letter_stream = %self.sink.stream(),
            dead_letter_sequence = put.sequence, "record parked: its key is quarantined"
        );
        Ok(Parking::Parked)
    }

    /// The stream parked records go to.
    pub(crate) fn stream(&self) -> &StreamName {
        self.sink.stream()
    }
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
    use super::*;
    use crate::lease::memory::MemoryLeaseStore;
    use crate::parked::ParkLimits;

    struct Nowhere(StreamName);

    #[async_trait]
    impl DeadLetterSink for Nowhere {
        fn stream(&self) -> &StreamName {
            &self.0
        }

        async fn put(
            &self,
            _: &Record,
            _: LastFailure<'_>,
        ) -> Result<super::super::Put, KinesisError> {
            Ok(super::super::Put {
                sequence: "1".into(),
                data_omitted: false,
            })
        }
    }

    /// Catches: a read of the parked keys that raced a park (begun before
    /// it, answered after) undoing it in memory, so the key's next record
    /// would be handled before its parked one.
    #[tokio::test]
    async fn an_older_read_never_undoes_a_newer_park() {
        let telemetry = Telemetry::new();
        let q = Quarantine::new(
            "s".into(),
            Arc::new(MemoryLeaseStore::new()),
            Arc::new(Nowhere("dlq".into())),
            ParkLimits {
                max_keys: 10,
                max_records: 10,
            },
            "me".into(),
            &telemetry,
            Arc::new(SubscriptionStatus::default()),
        );
        let stale = ParkedKeys::default();
        let record = Record {
            stream: "orders".into(),
            shard: "shardId-000000000000".into(),
            partition_key: PartitionKey::new("k"),
            sequence: crate::ids::SequenceNumber::parse("1000").unwrap(),
            sub_sequence: None,
            arrival_ms: 0,
            data: Vec::new(),
        };
        let failure = LastFailure {
            reason: "trap",
            attempts: 3,
            version: None,
            cause: None,
        };
        assert_eq!(
            q.park(&record, failure, true).await.unwrap(),
            Parking::Parked
        );
        assert!(q.is_parked(&PartitionKey::new("k")));
        q.remember(&stale);
        assert!(q.is_parked(&PartitionKey::new("k")), "revision 0 is older");
        q.refresh().await.unwrap();
        assert!(q.is_parked(&PartitionKey::new("k")));
    }
}
