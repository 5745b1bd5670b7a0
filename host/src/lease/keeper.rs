//! The lease keeper: one task per subscription that owns the leases it
//! holds and the shard readers they entitle it to.
//!
//! On its own timers, never inside a reader:
//! - every `shard_sync_every` (and at start): list the stream's shards, read
//!   the lease table, and take every lease that is free, expired or not yet
//!   created, for shards whose parents are done (a child of a split or merge
//!   waits until each parent still in the stream is checkpointed at
//!   `SHARD_END`, so a key's records keep their order across resharding).
//!   Each lease taken starts a [`ShardReader`] after the lease's checkpoint.
//! - every `renew_every`: renew each held lease. A lease found taken by
//!   another owner, or not renewed for a whole lease duration, is lost: its
//!   reader is cancelled at once.
//!
//! It also writes the checkpoints settlement requests, in order, through the
//! store's owner-and-counter-fenced write; `SHARD_END` also releases the
//! lease (the shard is done).
//!
//! Expiry follows KCL: another owner's lease is expired when its counter has
//! not moved for `lease_duration` as observed by this keeper's own clock, so
//! clock skew between hosts does not matter.
//!
//! Shutdown, in order: stop taking leases → cancel and join every reader →
//! drop this task's senders (so the channel and settlement can close) → keep
//! writing the checkpoints settlement sends until it is done (renewing
//! meanwhile) → release every lease.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::Client;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{HeldLease, Lease, LeaseError, LeaseKey, LeaseStore};
use crate::config::{LeaseConfig, SubscriptionConfig};
use crate::ids::{OwnerId, ShardId};
use crate::kinesis::{ShardInfo, list_shards};
use crate::reader::{ReaderContext, ReaderExit, ShardReader};
use crate::settlement::{Checkpoint, CheckpointRequest, SessionId};

/// Checkpoint requests queued to the keeper; settlement coalesces them to
/// about one per shard per `checkpoint_every`, so this is plenty.
pub const CHECKPOINT_QUEUE: usize = 256;

/// Tries of a checkpoint write that fails for a transient reason.
const CHECKPOINT_TRIES: u32 = 3;

struct Holding {
    lease: HeldLease,
    renewed_at: Instant,
    cancel: CancellationToken,
}

/// The lease keeper of one subscription (see the module docs).
pub struct Keeper {
    subscription: Arc<SubscriptionConfig>,
    lease: LeaseConfig,
    owner: OwnerId,
    store: Arc<dyn LeaseStore>,
    client: Client,
    reader_ctx: Option<ReaderContext>,
    held: HashMap<ShardId, Holding>,
    readers: JoinSet<(ShardId, ReaderExit)>,
    /// Other owners' leases as last seen: counter, and since when.
    observed: HashMap<ShardId, (u64, Instant)>,
    next_session: SessionId,
    readers_cancel: CancellationToken,
}

impl Keeper {
    /// A keeper that starts readers with `reader_ctx`.
    pub fn new(
        subscription: Arc<SubscriptionConfig>,
        lease: LeaseConfig,
        owner: OwnerId,
        store: Arc<dyn LeaseStore>,
        reader_ctx: ReaderContext,
    ) -> Self {
        Self {
            client: reader_ctx.client.clone(),
            subscription,
            lease,
            owner,
            store,
            reader_ctx: Some(reader_ctx),
            held: HashMap::new(),
            readers: JoinSet::new(),
            observed: HashMap::new(),
            next_session: 1,
            readers_cancel: CancellationToken::new(),
        }
    }

    fn key(&self, shard: &ShardId) -> LeaseKey {
        LeaseKey {
            subscription: self.subscription.name.clone(),
            stream: self.subscription.stream.clone(),
            shard: shard.clone(),
        }
    }

    /// Runs until `shutdown`, then shuts down in order (module docs).
    pub async fn run(
        mut self,
        mut checkpoints: mpsc::Receiver<CheckpointRequest>,
        shutdown: CancellationToken,
    ) {
        let mut sync = tokio::time::interval(self.lease.shard_sync_every);
        let mut renew = tokio::time::interval(self.lease.renew_every);
        for timer in [&mut sync, &mut renew] {
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        renew.reset(); // the first renewal is one interval after taking.
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = sync.tick() => self.sync().await,
                _ = renew.tick() => self.renew_all().await,
                Some(request) = checkpoints.recv() => {
                    self.write_checkpoint(request).await;
                }
                Some(joined) = self.readers.join_next() => self.reader_finished(joined),
            }
        }

        tracing::info!(subscription = %self.subscription.name, leases = self.held.len(), "stopping readers");
        self.readers_cancel.cancel();
        while let Some(joined) = self.readers.join_next().await {
            self.reader_finished(joined);
        }
        // Our copies of the channel and settlement senders: once dropped,
        // the channel closes when it is empty and settlement ends after its
        // final checkpoint requests.
        self.reader_ctx = None;
        loop {
            tokio::select! {
                request = checkpoints.recv() => match request {
                    Some(request) => {
                        let (shard, checkpoint) = (request.shard.clone(), request.checkpoint.clone());
                        if self.write_checkpoint(request).await {
                            tracing::info!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.as_str(), "final checkpoint written");
                        }
                    }
                    None => break,
                },
                _ = renew.tick() => self.renew_all().await,
            }
        }
        for (_, holding) in std::mem::take(&mut self.held) {
            match self.store.release(&holding.lease).await {
                Ok(()) => {
                    tracing::info!(subscription = %self.subscription.name, shard_id = %holding.lease.key.shard, "lease released")
                }
                Err(e) => {
                    tracing::warn!(subscription = %self.subscription.name, shard_id = %holding.lease.key.shard, error = %e, "lease not released; it will expire")
                }
            }
        }
    }

    fn reader_finished(&mut self, joined: Result<(ShardId, ReaderExit), tokio::task::JoinError>) {
        match joined {
            Ok((shard, exit)) => {
                tracing::debug!(subscription = %self.subscription.name, shard_id = %shard, ?exit, "reader finished");
            }
            Err(e) => {
                tracing::error!(subscription = %self.subscription.name, error = %e, "reader task failed");
            }
        }
    }

    async fn sync(&mut self) {
        let Some(reader_ctx) = self.reader_ctx.clone() else {
            return;
        };
        let shards = match list_shards(&self.client, &self.subscription.stream).await {
            Ok(shards) => shards,
            Err(e) => {
                tracing::warn!(subscription = %self.subscription.name, stream = %self.subscription.stream, error = %format!("{e:#}"), "cannot list shards; will retry");
                return;
            }
        };
        let leases: HashMap<ShardId, Lease> = match self
            .store
            .list(&self.subscription.name, &self.subscription.stream)
            .await
        {
            Ok(leases) => leases
                .into_iter()
                .map(|l| (l.key.shard.clone(), l))
                .collect(),
            Err(e) => {
                tracing::warn!(subscription = %self.subscription.name, error = %e, "cannot read leases; will retry");
                return;
            }
        };
        let present: HashSet<&ShardId> = shards.iter().map(|s| &s.id).collect();
        let now = Instant::now();
        for shard in &shards {
            if self.held.contains_key(&shard.id) || !self.may_start(shard, &present, &leases) {
                continue;
            }
            let seen = leases.get(&shard.id);
            if !self.is_free(&shard.id, seen, now) {
                continue;
            }
            let key = self.key(&shard.id);
            match self.store.acquire(&key, &self.owner, seen).await {
                Ok(lease) => self.start_reader(&reader_ctx, lease),
                Err(LeaseError::Lost(_)) => {
                    tracing::debug!(subscription = %self.subscription.name, shard_id = %shard.id, "lease taken by another instance first");
                }
                Err(e) => {
                    tracing::warn!(subscription = %self.subscription.name, shard_id = %shard.id, error = %e, "cannot take lease; will retry");
                }
            }
        }
        // Forget observations of shards that are gone.
        self.observed.retain(|shard, _| present.contains(shard));
    }

    /// A shard may start when it is not done and each parent still in the
    /// stream is done.
    fn may_start(
        &self,
        shard: &ShardInfo,
        present: &HashSet<&ShardId>,
        leases: &HashMap<ShardId, Lease>,
    ) -> bool {
        let done = |id: &ShardId| {
            leases
                .get(id)
                .is_some_and(|l| l.checkpoint == Some(Checkpoint::ShardEnd))
        };
        !done(&shard.id)
            && shard
                .parents()
                .all(|parent| !present.contains(parent) || done(parent))
    }

    /// Free: absent, unowned, ours from an earlier life, or another owner's
    /// whose counter has not moved for a lease duration on our clock.
    fn is_free(&mut self, shard: &ShardId, seen: Option<&Lease>, now: Instant) -> bool {
        let Some(lease) = seen else { return true };
        match &lease.owner {
            None => true,
            Some(owner) if owner == &self.owner => true,
            Some(_) => {
                let entry = self
                    .observed
                    .entry(shard.clone())
                    .or_insert((lease.counter, now));
                if entry.0 != lease.counter {
                    *entry = (lease.counter, now);
                }
                now.duration_since(entry.1) >= self.lease.lease_duration
            }
        }
    }

    fn start_reader(&mut self, reader_ctx: &ReaderContext, lease: HeldLease) {
        let shard = lease.key.shard.clone();
        let session = self.next_session;
        self.next_session += 1;
        let cancel = self.readers_cancel.child_token();
        tracing::info!(
            subscription = %self.subscription.name, stream = %self.subscription.stream, shard_id = %shard,
            checkpoint = lease.checkpoint.as_ref().map(Checkpoint::as_str), held = self.held.len() + 1,
            "lease taken; reader starting"
        );
        let reader = ShardReader::new(
            reader_ctx.clone(),
            shard.clone(),
            session,
            lease.checkpoint.clone(),
            cancel.clone(),
        );
        let id = shard.clone();
        self.readers.spawn(async move { (id, reader.run().await) });
        self.observed.remove(&shard);
        self.held.insert(
            shard,
            Holding {
                lease,
                renewed_at: Instant::now(),
                cancel,
            },
        );
    }

    async fn renew_all(&mut self) {
        let shards: Vec<ShardId> = self.held.keys().cloned().collect();
        for shard in shards {
            let Some(holding) = self.held.get(&shard) else {
                continue;
            };
            match self.store.renew(&holding.lease).await {
                Ok(lease) => {
                    if let Some(holding) = self.held.get_mut(&shard) {
                        holding.lease = lease;
                        holding.renewed_at = Instant::now();
                    }
                }
                Err(LeaseError::Lost(_)) => self.lose(&shard, "taken by another instance"),
                Err(e) => {
                    let overdue = holding.renewed_at.elapsed() >= self.lease.lease_duration;
                    tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, overdue, "lease renewal failed");
                    if overdue {
                        self.lose(&shard, "not renewed within a lease duration");
                    }
                }
            }
        }
    }

    /// Stops the shard's reader at once: the lease is no longer ours.
    fn lose(&mut self, shard: &ShardId, why: &str) {
        if let Some(holding) = self.held.remove(shard) {
            holding.cancel.cancel();
            tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, why, "lease lost; reader stopped");
        }
    }

    /// Writes a checkpoint; true when it was written.
    async fn write_checkpoint(&mut self, request: CheckpointRequest) -> bool {
        let CheckpointRequest { shard, checkpoint } = request;
        let mut wait = Duration::from_millis(100);
        for attempt in 1..=CHECKPOINT_TRIES {
            let Some(holding) = self.held.get(&shard) else {
                tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.as_str(), "checkpoint for a shard no longer held; not written");
                return false;
            };
            match self.store.checkpoint(&holding.lease, &checkpoint).await {
                Ok(lease) => {
                    tracing::debug!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.as_str(), "checkpoint written");
                    if checkpoint == Checkpoint::ShardEnd {
                        // The shard is done: nobody needs to read it again.
                        self.held.remove(&shard);
                        if let Err(e) = self.store.release(&lease).await {
                            tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, "ended shard's lease not released; it will expire");
                        }
                    } else if let Some(holding) = self.held.get_mut(&shard) {
                        holding.lease = lease;
                    }
                    return true;
                }
                Err(LeaseError::Lost(_)) => {
                    self.lose(&shard, "checkpoint refused: lease changed hands");
                    return false;
                }
                Err(e) if attempt < CHECKPOINT_TRIES => {
                    tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, attempt, "checkpoint write failed; retrying");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => {
                    tracing::error!(subscription = %self.subscription.name, shard_id = %shard, error = %e, "checkpoint not written; a later one will cover it");
                }
            }
        }
        false
    }
}
