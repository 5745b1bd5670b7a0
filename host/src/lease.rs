//! Leases: who reads which shard, and where each shard's checkpoint lives.
//!
//! A lease exists per subscription name + stream + shard ([`LeaseKey`]). The
//! [`LeaseStore`] trait is the storage contract; every lease write is
//! conditional on what the writer last saw, so two hosts can never both
//! believe they hold a shard, and a host that lost a lease can never write
//! its checkpoint:
//! - `acquire` takes a lease only if it is still as the caller observed it
//!   (absent, free, its own, or expired by the caller's observation);
//! - `renew`, `checkpoint` and `release` require the caller to still be the
//!   owner **and** the lease counter to be the one it last saw. Each bumps
//!   the counter.
//!
//! # Heartbeats: liveness per instance, not per lease
//! Each instance also writes a [`Heartbeat`] per subscription, on its own
//! timer (`renew_every`): one unconditional write that bumps the
//! heartbeat's counter and publishes the instance's load. A healthy fleet
//! writes one heartbeat per instance per interval and no lease at all; a
//! lease is written only to take it, hand it over, checkpoint it (when the
//! position moved) and release it. (KCL renews every lease every interval,
//! and so did earlier versions here.)
//!
//! **The rule.** Another owner's lease is expired when its counter has not
//! moved for a lease duration **and** its owner's heartbeat (if it has one)
//! has not moved either, both as observed on the taker's own clock
//! (KCL's rule: never comparing clocks of different hosts), measured from
//! the answer of the read that first showed the value to the question of
//! the latest read that still showed it ([`planner`]).
//!
//! **The holder's side.** A lease is surely ours until (the moment we
//! *sent* the later of our last landed heartbeat and our last landed write
//! of that lease) + `lease_duration`: a taker needs both to stand still for
//! a lease duration, and its watch of each began after the write was sent.
//! The keeper publishes that deadline to the shard's reader, which hands
//! out nothing past it.
//!
//! **Why it fences exactly as before.** A heartbeat that lands extends the
//! deadline only of leases whose deadline had not passed when its answer
//! arrived: then the heartbeat landed before any taker could have seen it
//! stand still for a lease duration, so none has taken (or will take,
//! without watching the new value for another lease duration) any of our
//! leases. A lease whose deadline passed first (the process was paused, its
//! heartbeats were failing) may have been taken meanwhile, and the
//! heartbeat proves nothing about it: it is verified by a conditional
//! renewal of its own, which either moves its counter (no taker got it, and
//! none can now without another lease duration) or finds it changed (lost:
//! its reader stops, and nothing more of it is written). Checkpoints stay
//! conditional on owner and counter, so a paused instance that resumes
//! writes nothing another's checkpoint already passed. An instance whose
//! heartbeats fail loses every lease at once, at the one deadline they
//! share. Taking a lease is a conditional write on the lease as observed,
//! so two takers never both succeed.
//!
//! **Hand-overs and losses are learnt at the sync** (every
//! `shard_sync_every`, which reads the whole group in one query): a lease
//! marked with a hand-over request starts a graceful hand-over, and a lease
//! whose counter moved past ours under another owner is lost.
//!
//! **Mixed versions.** An instance of an earlier version judges leases by
//! their counters alone. While any owner without a heartbeat holds a live
//! lease, every instance of this version also renews each lease it holds
//! on the timer, as earlier versions did, so a rolling upgrade that
//! replaces earlier instances one by one takes nothing from anyone; once
//! the last earlier instance is gone, the renewals stop by themselves. An
//! earlier instance that *starts* (or holds nothing) while this version
//! runs without renewals cannot be seen, and would take idle leases of
//! this version after a lease duration (both would read the shard until
//! the holder's next sync; checkpoints stay fenced): roll back by stopping
//! this version's instances first (a `Recreate` rollout), never one by
//! one. Tables need no upgrade: heartbeats are added as instances start,
//! and earlier versions ignore them. Leases imported from KCL
//! (`import-kcl`) are free leases with checkpoints, as before.
//!
//! **Two processes with the same `owner_id`** (a misconfiguration) share
//! one heartbeat: the leases one holds that the other does not are judged
//! by their own counters by the other (rule 5 of the planner), so an idle
//! one can be taken from under it after a lease duration; its checkpoint
//! write is then refused and its reader stops. Give each instance its own
//! id (the default is host name, pid and a random suffix).
//!
//! # Hand-over
//! An instance below its fair share (or far below another's load) asks
//! an owner to hand a lease over (`request_handoff` marks the lease without
//! touching its counter). The owner learns of it at its next sync (or
//! write of the lease), stops that shard's reader, lets what is in flight
//! settle, writes the final checkpoint and releases the lease, leaving the
//! request on it as the asker's reservation; the asker takes it at its next
//! sync and starts after that checkpoint, and others leave it alone for a
//! lease duration.
//!
//! Backends live in `lease/*`: [`memory::MemoryLeaseStore`] (this process
//! only), [`file::FileLeaseStore`] (embedded, crash-safe, one instance),
//! [`dynamodb::DynamoDbLeaseStore`] (a table shared by a fleet). The
//! [`planner`] decides which leases to take and which to ask for; the
//! [`keeper`] task owns the leases a subscription holds: it discovers shards,
//! takes leases, tells the reader pool which shards to read
//! ([`Assignment`]), heartbeats on its own timer and writes the checkpoints
//! settlement asks for ([`CheckpointRequest`]).
//!
//! Floor 4 (leases) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

pub(crate) mod dynamodb;
pub(crate) mod file;
mod keeper;
pub(crate) mod memory;
mod planner;

pub(crate) use keeper::{
    ASSIGNMENT_QUEUE, Assignment, CHECKPOINT_QUEUE, Keeper, ShardSource, StopReason,
};

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::cause::Cause;
use crate::fleet_versions::{Command, FleetVersions, VersionsError};
use crate::ids::{OwnerId, PartitionKey, SessionId, ShardId, StreamName, SubscriptionName};
use crate::progress::Checkpoint;

/// A checkpoint for the lease keeper to write, as settlement asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct CheckpointRequest {
    /// The shard.
    pub shard: ShardId,
    /// The reader session whose records it covers: the keeper writes it
    /// only for the same taking of the lease (a request of a session lost
    /// meanwhile must not move a newer taking's checkpoint, nor release it).
    pub session: SessionId,
    /// The new checkpoint; `None` only for a drained shard of which no
    /// record settled.
    pub checkpoint: Option<Checkpoint>,
    /// The shard's reader stopped and everything it handed out has settled:
    /// this is its last checkpoint, and its lease may be released.
    pub drained: bool,
}

/// A key's state as a checkpoint commits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    /// The partition key.
    pub key: PartitionKey,
    /// Its whole state, stored form; `None`: no value left (the stored
    /// state goes).
    pub state: Option<Vec<u8>>,
}

/// The per-key state that goes with a shard's checkpoints: the seam
/// through which the [`Keeper`] opens and closes a shard's state as it
/// takes and loses the lease, and commits the state's writes in the same
/// fenced write as each checkpoint (see `crate::state`, "Commit
/// protocol"). Defined here and implemented one floor up by the state
/// stage, so the keeper never names it (see "Layers" in the crate docs).
pub(crate) trait CheckpointState: Send + Sync {
    /// The keeper took `shard`'s lease for reader `session`: its state
    /// starts afresh from the store.
    fn open(&self, shard: &ShardId, session: SessionId);

    /// `shard`'s `session` ended (lease lost, released, handed over): what
    /// it staged and did not commit is dropped.
    fn close(&self, shard: &ShardId, session: SessionId);

    /// The state writes that go with checkpoint `upto` of `shard` in
    /// `session` (empty for a session no longer current). They are in
    /// flight until [`committed`](Self::committed) says they landed; a
    /// later call for the shard replaces them (the write failed and is
    /// tried again). The keeper writes one checkpoint of a shard at a time.
    fn commit(&self, shard: &ShardId, session: SessionId, upto: &Checkpoint) -> Vec<StateWrite>;

    /// The checkpoint `upto`, with the writes [`commit`](Self::commit)
    /// gave for it, is durable; the write took `took`.
    fn committed(&self, shard: &ShardId, session: SessionId, upto: &Checkpoint, took: Duration);
}

/// Which lease: one per subscription, stream and shard.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey {
    /// The subscription (application) name.
    pub subscription: SubscriptionName,
    /// The stream.
    pub stream: StreamName,
    /// The shard.
    pub shard: ShardId,
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.subscription, self.stream, self.shard)
    }
}

/// A lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Which lease.
    pub key: LeaseKey,
    /// Who holds it, if anyone.
    pub owner: Option<OwnerId>,
    /// Bumped by every write; a counter that stops moving means its owner
    /// is gone.
    pub counter: u64,
    /// Where processing of the shard stands.
    pub checkpoint: Option<Checkpoint>,
    /// Another instance asked the owner to hand this lease over.
    pub handoff: Option<OwnerId>,
}

/// An instance's proof that it is alive, one per instance per
/// subscription and stream, written on its own timer (see "Heartbeats"
/// in the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    /// The instance.
    pub owner: OwnerId,
    /// Bumped by every heartbeat; one that stops moving means the
    /// instance is gone.
    pub counter: u64,
    /// What the instance reads, as of this heartbeat (for balancing by
    /// load).
    pub load: Load,
    /// Hand-over requests placed on the instance's leases so far: a change
    /// tells it, at its next heartbeat, to look at its leases now rather
    /// than at its next sync.
    pub asks: u64,
}

/// The records an instance reads a second, smoothed, as its heartbeat
/// publishes them: the total, and the busiest shards it holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    /// Records a second over every shard the instance holds.
    pub total: f64,
    /// The busiest shards it holds, busiest first, at most
    /// [`Load::HOTTEST`]; a held shard not listed reads no more than the
    /// last one listed.
    pub hottest: Vec<(ShardId, f64)>,
    /// Every shard it holds has been measured long enough for its rate to
    /// mean something (a shard just taken reads as quiet at first):
    /// nothing moves for load on an unsettled figure.
    pub settled: bool,
}

impl Load {
    /// How many shards a heartbeat lists: enough to move the hot ones,
    /// small enough that a heartbeat stays one write unit (1 KB).
    pub const HOTTEST: usize = 16;

    /// The stored form: `{"total": 12.5, "hottest": [["shardId-1", 9.0]],
    /// "settled": true}` (a heartbeat stays well under one write unit,
    /// 1 KB). An earlier version's `"canary"` is ignored: canary counts
    /// live in the lease store's tallies now (`crate::rollout`).
    pub(crate) fn to_json(&self) -> String {
        serde_json::json!({
            "total": self.total,
            "hottest": self.hottest.iter().map(|(s, r)| (s.as_str(), r)).collect::<Vec<_>>(),
            "settled": self.settled,
        })
        .to_string()
    }

    /// From the stored form; `None` when it does not parse.
    pub(crate) fn from_json(text: &str) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Wire {
            total: f64,
            hottest: Vec<(String, f64)>,
            #[serde(default)]
            settled: bool,
        }
        let wire: Wire = serde_json::from_str(text).ok()?;
        Some(Self {
            total: wire.total,
            hottest: wire
                .hottest
                .into_iter()
                .map(|(s, r)| (ShardId::new(s), r))
                .collect(),
            settled: wire.settled,
        })
    }

    /// The rate the load lists for `shard`; zero for a shard it does not
    /// list (one of the quiet ones).
    pub(crate) fn rate_of(&self, shard: &ShardId) -> f64 {
        self.hottest
            .iter()
            .find(|(s, _)| s == shard)
            .map_or(0.0, |(_, r)| *r)
    }
}

/// The first counter of a new heartbeat: the wall clock in milliseconds, so
/// an instance whose heartbeat was retired (at its shutdown, or by another
/// as long stale) and that comes back under the same id never repeats a
/// value an observer remembers, which would read as standing still.
pub(crate) fn heartbeat_base() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2))
}

/// A subscription's leases and the heartbeats of the instances sharing
/// them, as one sync reads them.
#[derive(Debug, Clone, Default)]
pub struct Survey {
    /// Every lease.
    pub leases: Vec<Lease>,
    /// Every instance's heartbeat.
    pub heartbeats: Vec<Heartbeat>,
}

/// A lease this process holds, as of its last successful write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    /// Which lease.
    pub key: LeaseKey,
    /// This process.
    pub owner: OwnerId,
    /// The counter after our last write.
    pub counter: u64,
    /// The checkpoint when we took it (where the reader starts).
    pub checkpoint: Option<Checkpoint>,
    /// Who asked us to hand it over, as of our last write.
    pub handoff: Option<OwnerId>,
}

impl HeldLease {
    /// This holder's view after a write that left the lease as `now`.
    fn after(&self, now: &Lease) -> Self {
        Self {
            counter: now.counter,
            handoff: now.handoff.clone(),
            ..self.clone()
        }
    }
}

/// The contract's rules as pure transitions from a lease's current stored
/// value to its next one. Backends that store whole lease values (memory,
/// file) read the current value, apply a rule and store the result inside
/// one critical section or transaction; DynamoDB states the same rules as
/// condition expressions.
pub(crate) mod rules {
    use super::{HeldLease, Lease, LeaseError, LeaseKey};
    use crate::ids::OwnerId;

    /// Writing a subscription's document: only over the revision the new
    /// one (`revision`) was made from, `current` being the stored one.
    pub(crate) fn write_doc(current: Option<&str>, revision: u64) -> bool {
        current.map_or(0, super::revision_of) + 1 == revision
    }

    /// Writing an item (see "Items" in [`super`]): as a document, and,
    /// with a fence, only while `lease` (its stored value) is held by the
    /// fence's owner.
    pub(crate) fn write_item(
        current: Option<&str>,
        revision: u64,
        fence: Option<(&super::Fence, Option<&Lease>)>,
    ) -> super::ItemWrite {
        if let Some((fence, lease)) = fence
            && lease.and_then(|l| l.owner.as_ref()) != Some(&fence.owner)
        {
            return super::ItemWrite::Fenced;
        }
        if write_doc(current, revision) {
            super::ItemWrite::Written
        } else {
            super::ItemWrite::Changed
        }
    }

    /// Taking the lease for `owner`, if it is still exactly as `seen`.
    pub(crate) fn acquire(
        current: Option<Lease>,
        key: &LeaseKey,
        owner: &OwnerId,
        seen: Option<&Lease>,
    ) -> Result<(Lease, HeldLease), LeaseError> {
        if current.as_ref() != seen {
            return Err(LeaseError::Lost(key.clone()));
        }
        let mut lease = current.unwrap_or(Lease {
            key: key.clone(),
            owner: None,
            counter: 0,
            checkpoint: None,
            handoff: None,
        });
        lease.owner = Some(owner.clone());
        lease.handoff = None;
        lease.counter += 1;
        let held = HeldLease {
            key: key.clone(),
            owner: owner.clone(),
            counter: lease.counter,
            checkpoint: lease.checkpoint.clone(),
            handoff: None,
        };
        Ok((lease, held))
    }

    /// A write by the holder (renew, checkpoint, release): allowed only
    /// while it is still the owner at the counter it last saw; bumps the
    /// counter.
    pub(crate) fn update_held(
        current: Option<Lease>,
        held: &HeldLease,
        update: impl FnOnce(&mut Lease),
    ) -> Result<(Lease, HeldLease), LeaseError> {
        match current {
            Some(mut lease)
                if lease.owner.as_ref() == Some(&held.owner) && lease.counter == held.counter =>
            {
                update(&mut lease);
                lease.counter += 1;
                let now = held.after(&lease);
                Ok((lease, now))
            }
            _ => Err(LeaseError::Lost(held.key.clone())),
        }
    }

    /// Marking an owned lease, unchanged since `seen`, with a hand-over
    /// request for `to`; the counter stays.
    pub(crate) fn request_handoff(
        current: Option<Lease>,
        seen: &Lease,
        to: &OwnerId,
    ) -> Result<Lease, LeaseError> {
        match current {
            Some(lease)
                if lease.owner.is_some()
                    && lease.owner == seen.owner
                    && lease.counter == seen.counter
                    && lease.handoff.is_none() =>
            {
                Ok(Lease {
                    handoff: Some(to.clone()),
                    ..lease
                })
            }
            _ => Err(LeaseError::Lost(seen.key.clone())),
        }
    }

    /// Releasing: no owner. A hand-over request stays, as the reservation
    /// of the instance that asked (the planner leaves such a free lease to
    /// it for a while); taking the lease clears it.
    pub(crate) fn release(lease: &mut Lease) {
        lease.owner = None;
    }

    /// The next heartbeat of `owner`, from its stored one (if any).
    pub(crate) fn heartbeat(
        current: Option<super::Heartbeat>,
        owner: &OwnerId,
        load: &super::Load,
    ) -> super::Heartbeat {
        super::Heartbeat {
            owner: owner.clone(),
            counter: current
                .as_ref()
                .map_or_else(super::heartbeat_base, |h| h.counter + 1),
            load: load.clone(),
            asks: current.map_or(0, |h| h.asks),
        }
    }
}

/// Why a lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone else changed the lease since we saw it: it is not (or no
    /// longer) ours.
    #[error("lease {0} changed hands: it is no longer ours to write")]
    Lost(LeaseKey),
    /// The store could not be reached or failed; worth retrying. The
    /// store's own error is the source.
    #[error("lease store failed: {0}")]
    Store(#[source] Cause),
    /// The store refused the call for throughput (DynamoDB throttling);
    /// worth retrying after a while.
    #[error("lease store throttled: {0}")]
    Throttled(#[source] Cause),
    /// A subscription's fleet versions changed since they were read (see
    /// [`LeaseStore::write_versions`]): read them again and decide again.
    #[error("the versions of subscription {0} changed since they were read")]
    VersionsChanged(SubscriptionName),
}

/// Storage for leases and checkpoints (see the module docs for the rules
/// every backend keeps).
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Every lease of a subscription on a stream, and the heartbeats of
    /// the instances sharing them, in one read.
    async fn survey(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
    ) -> Result<Survey, LeaseError>;

    /// Every lease of a subscription on a stream.
    async fn list(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
    ) -> Result<Vec<Lease>, LeaseError> {
        Ok(self.survey(subscription, stream).await?.leases)
    }

    /// Writes `owner`'s heartbeat for a subscription on a stream: bumps
    /// its counter (creating it at 1) and stores `load`. Unconditional:
    /// only `owner` writes it.
    async fn heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        load: &Load,
    ) -> Result<Heartbeat, LeaseError>;

    /// Deletes a heartbeat if its counter is still `counter` (an instance
    /// retiring its own at shutdown, or one long dead).
    async fn retire_heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        counter: u64,
    ) -> Result<(), LeaseError>;

    /// One lease, if it exists.
    async fn read(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError>;

    /// Takes the lease for `owner` if it is still exactly as `seen` (`None`:
    /// it does not exist yet).
    async fn acquire(
        &self,
        key: &LeaseKey,
        owner: &OwnerId,
        seen: Option<&Lease>,
    ) -> Result<HeldLease, LeaseError>;

    /// Proves the holder is alive: bumps the counter. The result carries any
    /// hand-over request.
    async fn renew(&self, held: &HeldLease) -> Result<HeldLease, LeaseError>;

    /// Asks the owner of a lease, as `seen`, to hand it over to `to`. Does
    /// not move the counter; refused when the lease changed or already has a
    /// request. Then bumps the `asks` of the owner's heartbeat, if it has
    /// one, so it learns of the request at its next heartbeat (a hint: the
    /// request stands whether or not this lands).
    async fn request_handoff(&self, seen: &Lease, to: &OwnerId) -> Result<(), LeaseError>;

    /// Writes the shard's checkpoint (and bumps the counter), and with it,
    /// in the same atomic write, the state of the keys in `state` (see
    /// [`crate::state`], "Commit protocol"): either everything lands or
    /// nothing does.
    async fn checkpoint(
        &self,
        held: &HeldLease,
        checkpoint: &Checkpoint,
        state: &[StateWrite],
    ) -> Result<HeldLease, LeaseError>;

    /// The committed state of partition key `key` in `subscription`, in
    /// its stored form ([`crate::state::KeyState`]); `None` when it has
    /// none.
    async fn load_state(
        &self,
        subscription: &SubscriptionName,
        key: &PartitionKey,
    ) -> Result<Option<Vec<u8>>, LeaseError>;

    /// Gives the lease up so another instance may take it at once.
    async fn release(&self, held: &HeldLease) -> Result<(), LeaseError>;

    /// A subscription's document of `kind`, as stored (JSON with a
    /// top-level `revision`); `None` before the first write. Strongly
    /// consistent.
    async fn read_doc(
        &self,
        subscription: &SubscriptionName,
        kind: DocKind,
    ) -> Result<Option<String>, LeaseError>;

    /// Stores `doc`, whose revision is `revision`, if the stored one's is
    /// still `revision - 1` (none stored for revision 1): true when it was
    /// stored, false when another write came first.
    async fn write_doc(
        &self,
        subscription: &SubscriptionName,
        kind: DocKind,
        revision: u64,
        doc: String,
    ) -> Result<bool, LeaseError>;

    /// Every item of a subscription's collection `kind`. Strongly
    /// consistent.
    async fn read_items(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
    ) -> Result<Vec<Item>, LeaseError>;

    /// One item; `None` when there is none. Strongly consistent.
    async fn read_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
    ) -> Result<Option<Item>, LeaseError>;

    /// Stores `doc` (whose revision is `revision`) as item `key` if the
    /// stored one's revision is still `revision - 1` (none stored for
    /// revision 1) and, with `fence`, while the fence's lease is held by
    /// its owner (see "Items").
    async fn write_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
        revision: u64,
        doc: String,
        fence: Option<&Fence>,
    ) -> Result<ItemWrite, LeaseError>;

    /// Deletes item `key` if its revision is still `revision`: true when
    /// it was deleted (or was not there).
    async fn delete_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
        revision: u64,
    ) -> Result<bool, LeaseError>;

    /// A subscription's fleet versions (see [`crate::fleet_versions`]); `None`
    /// before the first change. Strongly consistent.
    async fn read_versions(
        &self,
        subscription: &SubscriptionName,
    ) -> Result<Option<FleetVersions>, LeaseError> {
        read_typed(self, subscription, DocKind::Versions).await
    }

    /// Stores `next` if the stored revision is still the one `next` was
    /// made from (`next.revision - 1`; none stored for revision 1);
    /// [`LeaseError::VersionsChanged`] otherwise. Use [`update_versions`].
    async fn write_versions(
        &self,
        subscription: &SubscriptionName,
        next: &FleetVersions,
    ) -> Result<(), LeaseError> {
        let doc = serde_json::to_string(next).map_err(|e| LeaseError::Store(Cause::new(e)))?;
        if self
            .write_doc(subscription, DocKind::Versions, next.revision, doc)
            .await?
        {
            Ok(())
        } else {
            Err(LeaseError::VersionsChanged(subscription.clone()))
        }
    }
}

/// The documents a lease store keeps per subscription beside its leases,
/// each one JSON value with a top-level `revision` that every write is
/// conditional on.
///
/// # Items
/// Beside them, collections of many small documents ([`ItemKind`]), one
/// per key, each conditional on its own revision. A write may be fenced
/// ([`Fence`]): it lands only while the writer holds a lease. The memory
/// and file stores check the fence and write in one critical section or
/// transaction. DynamoDB (on which the tests' emulator has no
/// transactions) reads the lease strongly consistently and then writes
/// the item conditionally: a writer that lost the lease before its read
/// writes nothing. One whose lease is taken between that read and its
/// write's arrival still writes; a taker takes a lease only after seeing
/// the holder's heartbeat and lease stand still for a lease duration, so
/// that is a writer whose read answered as its lease ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DocKind {
    /// The fleet's plugin versions ([`crate::fleet_versions`]).
    Versions,
}

impl DocKind {
    /// Its name in store keys: `versions`.
    pub fn name(self) -> &'static str {
        match self {
            DocKind::Versions => "versions",
        }
    }
}

/// The item collections a subscription keeps beside its leases (see
/// "Items" below): many small documents, one per key, each with its own
/// revision, so changing one is one small write however many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ItemKind {
    /// Parked keys, one item per partition key ([`crate::parked`]).
    Parked,
    /// Canary counts, one item per canary and instance (`crate::rollout`).
    Tally,
}

impl ItemKind {
    /// Its name in store keys: `parked-keys`, `tallies`.
    pub fn name(self) -> &'static str {
        match self {
            ItemKind::Parked => "parked-keys",
            ItemKind::Tally => "tallies",
        }
    }
}

/// One item: its key in its collection and its document (JSON with a
/// top-level `revision`, as a document's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Its key.
    pub key: String,
    /// The document's revision.
    pub revision: u64,
    /// The document.
    pub doc: String,
}

/// A write that must only land while its writer holds a lease (a park:
/// only the shard's holder may park its keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The lease.
    pub lease: LeaseKey,
    /// Who must hold it.
    pub owner: OwnerId,
}

/// What a conditional item write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemWrite {
    /// Stored.
    Written,
    /// Another write came first: read it again and decide again.
    Changed,
    /// The fence's lease is not (or no longer) the writer's: nothing was
    /// stored.
    Fenced,
}

/// A document of `kind`, decoded.
///
/// # Errors
/// The store's, or a stored document that does not decode.
pub(crate) async fn read_typed<S: LeaseStore + ?Sized, T: serde::de::DeserializeOwned>(
    store: &S,
    subscription: &SubscriptionName,
    kind: DocKind,
) -> Result<Option<T>, LeaseError> {
    store
        .read_doc(subscription, kind)
        .await?
        .map(|doc| serde_json::from_str(&doc).map_err(|e| LeaseError::Store(Cause::new(e))))
        .transpose()
}

/// The `revision` of a stored document (0 when it has none).
pub(crate) fn revision_of(doc: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(doc)
        .ok()
        .and_then(|v| v.get("revision").and_then(serde_json::Value::as_u64))
        .unwrap_or(0)
}

/// Why a change of a subscription's fleet versions did not land.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VersionsUpdateError {
    /// The rules refused it.
    #[error(transparent)]
    Refused(#[from] VersionsError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] LeaseError),
}

/// How many times [`update_versions`] reads again after another change
/// landed first.
const VERSIONS_TRIES: usize = 8;

/// Applies `command` by `by` to the stored fleet versions of
/// `subscription`: read, apply the rules, write conditionally on the
/// revision read; when another change landed in between, read again and
/// apply to what it left (the rules may then refuse). Returns the new value.
///
/// # Errors
/// The rules' refusal, or the store's failure (after [`VERSIONS_TRIES`]
/// conflicts, the last [`LeaseError::VersionsChanged`]).
pub(crate) async fn update_versions(
    store: &dyn LeaseStore,
    subscription: &SubscriptionName,
    command: Command,
    by: &str,
) -> Result<FleetVersions, VersionsUpdateError> {
    let mut last = None;
    for _ in 0..VERSIONS_TRIES {
        let current = store.read_versions(subscription).await?.unwrap_or_default();
        let next = current.apply(command.clone(), by, crate::clock::now_ms())?;
        match store.write_versions(subscription, &next).await {
            Ok(()) => return Ok(next),
            Err(e @ LeaseError::VersionsChanged(_)) => last = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last
        .unwrap_or_else(|| LeaseError::VersionsChanged(subscription.clone()))
        .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a heartbeat's load lost on the way through the store, or
    /// one of an earlier version (with `canary` counts, or without
    /// `settled`) that no longer parses (balancing by load would stop
    /// during a rolling upgrade).
    #[test]
    fn a_heartbeats_load_reads_back_and_reads_older_ones() {
        let load = Load {
            total: 12.5,
            hottest: vec![(ShardId::from("s1"), 9.0)],
            settled: true,
        };
        let json = load.to_json();
        assert!(json.len() < 1024, "one write unit: {json}");
        assert_eq!(Load::from_json(&json), Some(load));
        let older = Load::from_json(r#"{"total": 1.0, "hottest": [], "canary": {"candidate": null, "stable_records": 1, "stable_failures": 0, "candidate_records": 0, "candidate_failures": 0}}"#).unwrap();
        assert!(!older.settled);
    }
}
