//! The lease keeper: one task per subscription that owns the leases it
//! holds and the shard readers they entitle it to.
//!
//! On its own timers, never inside a reader:
//! - every `shard_sync_every` (and at start): list the stream's shards, read
//!   the lease table, and let the [`Planner`] decide which leases to take
//!   (free or expired ones, up to the fair share; children only after their
//!   parents reached `SHARD_END`) and whom to ask for one (balancing). Each
//!   lease taken starts a [`ShardReader`] after the lease's checkpoint, or,
//!   for a child of a split or merge, at the child's beginning.
//! - every `renew_every`: renew each held lease. A lease found taken by
//!   another owner, or not renewed for a whole lease duration (transient
//!   store errors are retried until then), is lost: its reader is cancelled
//!   at once, and nothing more is checkpointed for it. A renewal that
//!   reports a hand-over request starts a graceful hand-over.
//!
//! # Validity: a reader never hands out records on a lapsed lease
//! Another instance takes a lease only after watching its counter stand
//! still for a lease duration, starting no earlier than our last write of
//! it. So the lease is surely ours until (the moment we *started* our last
//! successful acquire or renewal) + `lease_duration`. The keeper publishes
//! that deadline to the shard's reader on a `watch` channel, and the reader
//! sends nothing into the channel, and opens no iterator, past it: it waits
//! for the next renewal (which moves the deadline) or for the keeper to
//! find the lease lost (which stops it). This is what fences an instance
//! that was paused (SIGSTOP, a long GC-like stall, a VM freeze): when it
//! resumes, its readers' clocks say the deadline has passed, so they wait
//! for the keeper instead of racing it with reads of a shard that may have
//! changed hands. Records already in the channel or in a handler when the
//! pause began are still handled, as with any crash in flight.
//!
//! It also writes the checkpoints settlement requests, in order, through the
//! store's owner-and-counter-fenced write; `SHARD_END` also releases the
//! lease (the shard is done).
//!
//! # Graceful release (hand-over and shutdown)
//! The shard's reader is cancelled; it tells settlement how far it got;
//! once everything it handed out has settled, settlement sends the shard's
//! final checkpoint marked `drained`; the keeper writes it and releases the
//! lease, so the next owner starts right after it. A release that takes
//! longer than `shutdown_timeout` is forced (records still in flight are
//! then read again by the next owner).
//!
//! Shutdown, in order: stop taking leases → cancel every reader and join
//! them (serving checkpoint requests meanwhile) → drop this task's senders
//! (so the channel and settlement can close) → write what settlement sends
//! until it is done, releasing each shard as it drains (renewing
//! meanwhile) → release whatever is left.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::Client;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::planner::Planner;
use super::{HeldLease, Lease, LeaseError, LeaseKey, LeaseStore};
use crate::config::{LeaseConfig, StartPosition, SubscriptionConfig};
use crate::ids::{OwnerId, ShardId};
use crate::kinesis::list_shards;
use crate::reader::{ReaderContext, ReaderExit, ShardReader};
use crate::settlement::{Checkpoint, CheckpointRequest, SessionId};
use crate::telemetry::{Gauge, SubscriptionStatus};

/// Checkpoint requests queued to the keeper; settlement coalesces them to
/// about one per shard per `checkpoint_every`, so this is plenty.
pub const CHECKPOINT_QUEUE: usize = 256;

/// Tries of a checkpoint write that fails for a transient reason.
const CHECKPOINT_TRIES: u32 = 3;

fn leases_gauge(ctx: &ReaderContext) -> Gauge {
    ctx.telemetry.gauge(
        "shardlane_leases_held",
        "Shard leases this instance holds.",
        &[("subscription", ctx.subscription.name.as_str())],
    )
}

struct Holding {
    lease: HeldLease,
    /// When the last successful acquire or renewal was sent, plus
    /// `lease_duration`: until then the lease is surely ours (module docs).
    /// The reader watches it; a renewal failing past it loses the lease.
    valid_until: tokio::sync::watch::Sender<Instant>,
    cancel: CancellationToken,
    /// Being given up (hand-over or shutdown) since then.
    releasing: Option<Instant>,
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
    planner: Planner,
    next_session: SessionId,
    readers_cancel: CancellationToken,
    status: Arc<SubscriptionStatus>,
    leases_held: Gauge,
    /// Shards this instance handed over, and when: not taken back for a
    /// lease duration, so the instance that asked gets them (an instance
    /// with no lease yet is invisible to the planner's live count, and
    /// would otherwise lose the race to the giver's next sync forever).
    handed_over: HashMap<ShardId, Instant>,
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
            status: reader_ctx.status.clone(),
            handed_over: HashMap::new(),
            leases_held: leases_gauge(&reader_ctx),
            client: reader_ctx.client.clone(),
            subscription,
            lease,
            owner,
            store,
            reader_ctx: Some(reader_ctx),
            held: HashMap::new(),
            readers: JoinSet::new(),
            planner: Planner::new(),
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
                Some(request) = checkpoints.recv() => self.on_request(request).await,
                Some(joined) = self.readers.join_next() => self.reader_finished(joined),
            }
        }

        tracing::info!(subscription = %self.subscription.name, leases = self.held.len(), "stopping readers");
        let now = Instant::now();
        for holding in self.held.values_mut() {
            holding.releasing.get_or_insert(now);
        }
        self.readers_cancel.cancel();
        loop {
            tokio::select! {
                joined = self.readers.join_next() => match joined {
                    Some(joined) => self.reader_finished(joined),
                    None => break,
                },
                Some(request) = checkpoints.recv() => self.on_request(request).await,
            }
        }
        // Our copies of the channel and settlement senders: once dropped,
        // the channel closes when it is empty and settlement ends after its
        // final checkpoint requests.
        self.reader_ctx = None;
        loop {
            tokio::select! {
                request = checkpoints.recv() => match request {
                    Some(request) => self.on_request(request).await,
                    None => break,
                },
                _ = renew.tick() => self.renew_all().await,
            }
        }
        for (shard, holding) in std::mem::take(&mut self.held) {
            self.release(&shard, holding.lease).await;
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
        let keeping: HashSet<ShardId> = self
            .held
            .iter()
            .filter(|(_, h)| h.releasing.is_none())
            .map(|(s, _)| s.clone())
            .collect();
        for (shard, lease) in &leases {
            if !self.held.contains_key(shard) {
                self.status.shard(shard.as_str(), |s| {
                    s.owner = lease
                        .owner
                        .as_ref()
                        .map(|o| o.to_string())
                        .unwrap_or_default();
                    s.checkpoint = lease
                        .checkpoint
                        .as_ref()
                        .map(|c| c.as_str().to_owned())
                        .unwrap_or_default();
                    if s.state != "ended" {
                        s.state = if lease.checkpoint == Some(Checkpoint::ShardEnd) {
                            "ended".into()
                        } else {
                            "elsewhere".into()
                        };
                    }
                });
            }
        }
        let plan = self.planner.plan(
            &self.owner,
            &keeping,
            &shards,
            &leases,
            self.lease.lease_duration,
            Instant::now(),
        );
        let present: HashSet<&ShardId> = shards.iter().map(|s| &s.id).collect();
        let cooldown = self.lease.lease_duration;
        self.handed_over.retain(|_, at| at.elapsed() < cooldown);
        for (shard, seen) in plan.take {
            if self.handed_over.contains_key(&shard) {
                continue;
            }
            let key = self.key(&shard);
            let sent_at = Instant::now();
            match self.store.acquire(&key, &self.owner, seen.as_ref()).await {
                Ok(lease) => {
                    let info = shards.iter().find(|s| s.id == shard);
                    // A child of a consumed parent starts at its own
                    // beginning, so nothing between the parent's end and
                    // the child's start is skipped.
                    let start = if info.is_some_and(|i| i.parents().any(|p| present.contains(p))) {
                        StartPosition::TrimHorizon
                    } else {
                        self.subscription.start
                    };
                    let previous = seen.as_ref().and_then(|l| l.owner.clone());
                    self.start_reader(
                        &reader_ctx,
                        lease,
                        sent_at,
                        start,
                        previous,
                        plan.fair_share,
                    );
                }
                Err(LeaseError::Lost(_)) => {
                    tracing::debug!(subscription = %self.subscription.name, shard_id = %shard, "lease taken by another instance first");
                }
                Err(e) => {
                    tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, "cannot take lease; will retry");
                }
            }
        }
        self.status
            .synced
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.leases_held.set(self.held.len() as u64);
        if let Some(lease) = plan.ask {
            match self.store.request_handoff(&lease, &self.owner).await {
                Ok(()) => tracing::info!(
                    subscription = %self.subscription.name, shard_id = %lease.key.shard,
                    from = lease.owner.as_ref().map(OwnerId::as_str), fair_share = plan.fair_share, live = plan.live,
                    "asked for a lease hand-over"
                ),
                Err(e) => {
                    tracing::debug!(subscription = %self.subscription.name, shard_id = %lease.key.shard, error = %e, "hand-over request not placed")
                }
            }
        }
    }

    fn start_reader(
        &mut self,
        reader_ctx: &ReaderContext,
        lease: HeldLease,
        acquired_at: Instant,
        start: StartPosition,
        previous_owner: Option<OwnerId>,
        fair_share: usize,
    ) {
        let shard = lease.key.shard.clone();
        let (valid_until, valid_rx) =
            tokio::sync::watch::channel(acquired_at + self.lease.lease_duration);
        let session = self.next_session;
        self.next_session += 1;
        let cancel = self.readers_cancel.child_token();
        tracing::info!(
            subscription = %self.subscription.name, stream = %self.subscription.stream, shard_id = %shard,
            checkpoint = lease.checkpoint.as_ref().map(Checkpoint::as_str),
            previous_owner = previous_owner.as_ref().map(OwnerId::as_str),
            held = self.held.len() + 1, fair_share,
            "lease taken; reader starting"
        );
        let reader = ShardReader::new(
            reader_ctx.clone(),
            shard.clone(),
            session,
            lease.checkpoint.clone(),
            start,
            cancel.clone(),
            valid_rx,
        );
        let id = shard.clone();
        let owner = self.owner.to_string();
        let checkpoint = lease
            .checkpoint
            .as_ref()
            .map(|c| c.as_str().to_owned())
            .unwrap_or_default();
        self.status.shard(shard.as_str(), |s| {
            s.owner = owner;
            s.checkpoint = checkpoint;
            s.state = "opening".into();
        });
        self.readers.spawn(async move { (id, reader.run().await) });
        self.held.insert(
            shard,
            Holding {
                lease,
                valid_until,
                cancel,
                releasing: None,
            },
        );
    }

    async fn renew_all(&mut self) {
        let shards: Vec<ShardId> = self.held.keys().cloned().collect();
        let now = Instant::now();
        for shard in shards {
            let Some(holding) = self.held.get(&shard) else {
                continue;
            };
            if let Some(since) = holding.releasing
                && now.duration_since(since) >= self.subscription.shutdown_timeout
            {
                tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, "in-flight records did not settle within shutdown_timeout; releasing the lease anyway (the next owner reads them again)");
                if let Some(holding) = self.held.remove(&shard) {
                    if holding.lease.handoff.is_some() {
                        self.handed_over.insert(shard.clone(), Instant::now());
                    }
                    self.release(&shard, holding.lease).await;
                }
                continue;
            }
            let sent_at = Instant::now();
            // `wrote`: this renewal moved the counter after `sent_at`. A
            // recovered lease is ours, but its last write is older: it keeps
            // its deadline until the next renewal lands.
            let (renewed, wrote) = match self.store.renew(&holding.lease).await {
                Err(LeaseError::Lost(_)) => (self.recover(&holding.lease).await, false),
                other => (other, true),
            };
            match renewed {
                Ok(lease) => {
                    let handoff = lease.handoff.clone();
                    if let Some(holding) = self.held.get_mut(&shard) {
                        holding.lease = lease;
                        if wrote {
                            holding
                                .valid_until
                                .send_replace(sent_at + self.lease.lease_duration);
                        }
                        if let Some(to) = handoff
                            && holding.releasing.is_none()
                        {
                            tracing::info!(subscription = %self.subscription.name, shard_id = %shard, to = %to, "handing the lease over: reader stopping, in-flight records settling");
                            holding.releasing = Some(Instant::now());
                            holding.cancel.cancel();
                        }
                    }
                }
                Err(LeaseError::Lost(_)) => self.lose(&shard, "taken by another instance"),
                Err(e) => {
                    let overdue = Instant::now() >= *holding.valid_until.borrow();
                    tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, overdue, "lease renewal failed");
                    if overdue {
                        self.lose(&shard, "not renewed within a lease duration");
                    }
                }
            }
        }
    }

    /// After a refused write: if the lease is still ours (our own earlier
    /// write landed but its answer was lost), carry on with its counter;
    /// otherwise it is lost.
    async fn recover(&self, held: &HeldLease) -> Result<HeldLease, LeaseError> {
        match self.store.read(&held.key).await? {
            Some(lease) if lease.owner.as_ref() == Some(&self.owner) => Ok(HeldLease {
                counter: lease.counter,
                handoff: lease.handoff,
                ..held.clone()
            }),
            _ => Err(LeaseError::Lost(held.key.clone())),
        }
    }

    /// Stops the shard's reader at once: the lease is no longer ours.
    fn lose(&mut self, shard: &ShardId, why: &str) {
        if let Some(holding) = self.held.remove(shard) {
            self.leases_held.set(self.held.len() as u64);
            holding.cancel.cancel();
            tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, why, held = self.held.len(), "lease lost; reader stopped");
        }
    }

    async fn release(&self, shard: &ShardId, lease: HeldLease) {
        self.leases_held.set(self.held.len() as u64);
        self.status.shard(shard.as_str(), |s| {
            s.owner.clear();
            if s.state != "ended" {
                s.state = "released".into();
            }
        });
        match self.store.release(&lease).await {
            Ok(()) => {
                tracing::info!(subscription = %self.subscription.name, shard_id = %shard, held = self.held.len(), "lease released")
            }
            Err(e) => {
                tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, "lease not released; it will expire")
            }
        }
    }

    async fn on_request(&mut self, request: CheckpointRequest) {
        let CheckpointRequest {
            shard,
            checkpoint,
            drained,
        } = request;
        let written = match &checkpoint {
            Some(checkpoint) => self.write_checkpoint(&shard, checkpoint).await,
            None => self.held.contains_key(&shard),
        };
        if drained && written {
            let releasing = self.held.get(&shard).is_some_and(|h| h.releasing.is_some());
            if releasing && let Some(holding) = self.held.remove(&shard) {
                if let Some(since) = holding.releasing {
                    tracing::info!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.as_ref().map(Checkpoint::as_str), drain = ?since.elapsed(), "final checkpoint written");
                }
                if holding.lease.handoff.is_some() {
                    self.handed_over.insert(shard.clone(), Instant::now());
                }
                self.release(&shard, holding.lease).await;
            }
        }
    }

    /// Writes a checkpoint; true when it was written.
    async fn write_checkpoint(&mut self, shard: &ShardId, checkpoint: &Checkpoint) -> bool {
        let mut wait = Duration::from_millis(100);
        for attempt in 1..=CHECKPOINT_TRIES {
            let Some(holding) = self.held.get(shard) else {
                tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.as_str(), "checkpoint for a shard no longer held; not written");
                return false;
            };
            let written = match self.store.checkpoint(&holding.lease, checkpoint).await {
                Err(LeaseError::Lost(_)) => match self.recover(&holding.lease).await {
                    Ok(lease) => self.store.checkpoint(&lease, checkpoint).await,
                    Err(e) => Err(e),
                },
                other => other,
            };
            match written {
                Ok(lease) => {
                    tracing::debug!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.as_str(), "checkpoint written");
                    self.status.shard(shard.as_str(), |s| {
                        s.checkpoint = checkpoint.as_str().to_owned();
                        s.checkpoint_at = Some(std::time::Instant::now());
                    });
                    if *checkpoint == Checkpoint::ShardEnd {
                        // The shard is done: nobody needs to read it again.
                        self.held.remove(shard);
                        self.release(shard, lease).await;
                    } else if let Some(holding) = self.held.get_mut(shard) {
                        holding.lease = lease;
                    }
                    return true;
                }
                Err(LeaseError::Lost(_)) => {
                    self.lose(shard, "checkpoint refused: lease changed hands");
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
