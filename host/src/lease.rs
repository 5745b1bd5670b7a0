//! Leases: who reads which shard, and where each shard's checkpoint lives.
//!
//! A lease exists per subscription name + stream + shard ([`LeaseKey`]). The
//! [`LeaseStore`] trait is the storage contract; every write is conditional
//! on what the writer last saw, so two hosts can never both believe they
//! hold a shard, and a host that lost a lease can never write its
//! checkpoint:
//! - `acquire` takes a lease only if it is still as the caller observed it
//!   (absent, free, its own, or expired by the caller's observation);
//! - `renew`, `checkpoint` and `release` require the caller to still be the
//!   owner **and** the lease counter to be the one it last saw. Each bumps
//!   the counter, so a lease whose counter stops moving is dead (KCL's rule:
//!   expiry is judged by the taker watching the counter, never by comparing
//!   clocks of different hosts).
//!
//! Hand-over: an instance below its fair share may ask an owner to hand a
//! lease over (`request_handoff` marks the lease without touching its
//! counter). The owner learns of it at its next renewal, stops that shard's
//! reader, lets what is in flight settle, writes the final checkpoint and
//! releases the lease; the asker takes it at its next sync and starts after
//! that checkpoint.
//!
//! Backends live in `lease/*`: [`memory::MemoryLeaseStore`] (this process
//! only), [`file::FileLeaseStore`] (embedded, crash-safe, one instance),
//! [`dynamodb::DynamoDbLeaseStore`] (a table shared by a fleet). The
//! [`planner`] decides which leases to take and which to ask for; the
//! [`keeper`] task owns the leases a subscription holds: it discovers shards,
//! takes leases, tells the reader pool which shards to read
//! ([`Assignment`]), renews on its own timer and writes the checkpoints
//! settlement asks for ([`CheckpointRequest`]).
//!
//! Floor 4 (leases) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

pub(crate) mod dynamodb;
pub(crate) mod file;
mod keeper;
pub(crate) mod memory;
mod planner;

pub(crate) use keeper::{ASSIGNMENT_QUEUE, Assignment, CHECKPOINT_QUEUE, Keeper, StopReason};

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::cause::Cause;
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

    /// Releasing: no owner, no pending request.
    pub(crate) fn release(lease: &mut Lease) {
        lease.owner = None;
        lease.handoff = None;
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
}

/// Storage for leases and checkpoints (see the module docs for the rules
/// every backend keeps).
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Every lease of a subscription on a stream.
    async fn list(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
    ) -> Result<Vec<Lease>, LeaseError>;

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
    /// request.
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
}
