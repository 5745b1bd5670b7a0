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
//! - every `renew_every`: renew each held lease (unless a checkpoint write
//!   landed since, which moved its counter just as well). A lease found
//!   taken by another owner, or not renewed for a whole lease duration
//!   (transient store errors are retried until then), is lost: its reader
//!   is cancelled at once, and nothing more is checkpointed for it. Any
//!   landed write (renewal or checkpoint) that reports a hand-over request
//!   starts a graceful hand-over.
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
//! lease (the shard is done). A request names the reader session it covers
//! and is written only for that taking of the lease. A write that fails
//! for a transient reason goes back in line (a newer request covering it,
//! `drained` kept) and is tried again at the next renewal tick.
//!
//! # Graceful release (hand-over and shutdown)
//! The shard's reader is cancelled; it tells settlement how far it got;
//! once everything it handed out has settled, settlement sends the shard's
//! final checkpoint marked `drained`; the keeper writes it and releases the
//! lease, so the next owner starts right after it. A release that takes
//! longer than `shutdown_timeout` is forced (records still in flight are
//! then read again by the next owner) as soon as the lease's write under
//! way lands. A sync that answers once shutdown began takes nothing and
//! asks nobody.
//!
//! # Store calls never block the keeper
//! Every store call (listing, acquire, renew, checkpoint, release, hand-over
//! request) runs in a task of the keeper's own [`JoinSet`], bounded by a
//! lease duration, and reports back as an [`Io`] message; the keeper's
//! loop only decides. So a slow store (or a slow network to it) delays
//! nothing else: renewals go out on their timer while a sync or a
//! checkpoint retry is still under way, and the shards renew concurrently,
//! not one after another.
//!
//! Writes of one lease are serialized: each is conditional on the counter
//! the previous one left, so two at once would refuse each other. A lease
//! has at most one write in flight; a checkpoint requested meanwhile waits
//! (newer requests replace older ones — a checkpoint covers every earlier
//! one — keeping `drained`), and a renewal due meanwhile follows it. A
//! checkpoint write moves the counter like a renewal does, so it also moves
//! the validity deadline (from when it was sent). Results carry the
//! holding's session, so a result for a lease lost and since taken again
//! is ignored.
//!
//! # Taking back what was lost
//! A lease lost because its renewals failed for a lease duration (the
//! store unreachable, a slow network) still names this instance if nobody
//! else took it; the planner takes it back, after its checkpoint, once its
//! counter has stood still for a lease duration (see [`super::planner`]). After each sync the
//! keeper records how many eligible shards nobody holds; `/readyz` fails,
//! and `shardlane_shards_unread` says so, when some stay unread, or no sync
//! succeeds, for longer than a lease duration plus two syncs.
//!
//! Shutdown, in order: stop taking leases → cancel every reader and join
//! them (serving checkpoint requests meanwhile) → drop this task's senders
//! (so the channel and settlement can close) → write what settlement sends
//! until it is done, releasing each shard as it drains (renewing
//! meanwhile) → wait for store calls under way → release whatever is
//! left.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::Client;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod calls;

use calls::{Io, bounded, checkpoint, renew};

use super::planner::Planner;
use super::{HeldLease, Lease, LeaseError, LeaseKey, LeaseStore};
use crate::config::{LeaseConfig, StartPosition, SubscriptionConfig};
use crate::ids::{OwnerId, ShardId};
use crate::kinesis::{ShardInfo, list_shards};
use crate::logging::LogGate;
use crate::reader::{ReaderContext, ReaderExit, ShardReader};
use crate::settlement::{Checkpoint, CheckpointRequest, SessionId};
use crate::telemetry::{Gauge, SubscriptionStatus, Telemetry};

/// Checkpoint requests queued to the keeper; settlement coalesces them to
/// about one per shard per `checkpoint_every`, so this is plenty.
pub const CHECKPOINT_QUEUE: usize = 256;

fn leases_gauge(ctx: &ReaderContext) -> Gauge {
    ctx.telemetry.gauge(
        "shardlane_leases_held",
        "Shard leases this instance holds.",
        &[("subscription", ctx.subscription.name.as_str())],
    )
}

struct Holding {
    lease: HeldLease,
    /// Which taking of the lease this is (the reader's session): results of
    /// store calls made for an earlier one are ignored.
    session: SessionId,
    /// When the last successful write was sent, plus `lease_duration`:
    /// until then the lease is surely ours (module docs). The reader
    /// watches it; a renewal failing past it loses the lease.
    valid_until: watch::Sender<Instant>,
    cancel: CancellationToken,
    /// Being given up (hand-over or shutdown) since then.
    releasing: Option<Instant>,
    /// A write (renewal or checkpoint) is under way.
    writing: bool,
    /// The checkpoint to write when the write under way lands.
    pending: Option<CheckpointRequest>,
    /// A renewal is due: set by the renewal timer, cleared when a write
    /// (renewal or checkpoint) lands.
    renew_due: bool,
    /// Given up for longer than `shutdown_timeout`: released as soon as the
    /// write under way lands.
    force_release: bool,
}

impl Holding {
    /// Moves the validity deadline to `sent_at + duration`, never back.
    fn extend(&self, sent_at: Instant, duration: Duration) {
        let until = sent_at + duration;
        self.valid_until.send_if_modified(|v| {
            let later = until > *v;
            if later {
                *v = until;
            }
            later
        });
    }
}

/// A sync whose acquires are still under way.
struct SyncRound {
    shards: Vec<ShardInfo>,
    fair_share: usize,
    /// Acquires not answered yet.
    acquiring: HashSet<ShardId>,
    /// Eligible shards nobody held when planned.
    free: HashSet<ShardId>,
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
    /// Store calls under way.
    io: JoinSet<Io>,
    /// A listing is under way.
    listing: bool,
    round: Option<SyncRound>,
    planner: Planner,
    next_session: SessionId,
    readers_cancel: CancellationToken,
    status: Arc<SubscriptionStatus>,
    leases_held: Gauge,
    unread: Gauge,
    telemetry: Arc<Telemetry>,
    throttle_log: LogGate,
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
        let sub = subscription.name.as_str();
        let unread = reader_ctx.telemetry.gauge(
            "shardlane_shards_unread",
            "Shards of the stream that no instance held after this instance's last shard sync.",
            &[("subscription", sub)],
        );
        reader_ctx
            .status
            .coverage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .grace = lease.lease_duration + 2 * lease.shard_sync_every;
        Self {
            status: reader_ctx.status.clone(),
            handed_over: HashMap::new(),
            leases_held: leases_gauge(&reader_ctx),
            unread,
            telemetry: reader_ctx.telemetry.clone(),
            throttle_log: LogGate::every(crate::throttle::LOG_INTERVAL),
            client: reader_ctx.client.clone(),
            subscription,
            lease,
            owner,
            store,
            reader_ctx: Some(reader_ctx),
            held: HashMap::new(),
            readers: JoinSet::new(),
            io: JoinSet::new(),
            listing: false,
            round: None,
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
                _ = sync.tick() => self.sync(),
                _ = renew.tick() => self.renew_all(),
                Some(request) = checkpoints.recv() => self.on_request(request),
                Some(io) = self.io.join_next() => self.on_io(io),
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
                Some(request) = checkpoints.recv() => self.on_request(request),
                Some(io) = self.io.join_next() => self.on_io(io),
                _ = renew.tick() => self.renew_all(),
            }
        }
        // Our copies of the channel and settlement senders: once dropped,
        // the channel closes when it is empty and settlement ends after its
        // final checkpoint requests.
        self.reader_ctx = None;
        let mut requests_open = true;
        while requests_open || !self.io.is_empty() {
            tokio::select! {
                request = checkpoints.recv(), if requests_open => match request {
                    Some(request) => self.on_request(request),
                    None => {
                        requests_open = false;
                        // Nothing to renew for any more: what is left is
                        // released once the writes under way land.
                        for holding in self.held.values_mut() {
                            holding.renew_due = false;
                        }
                    }
                },
                Some(io) = self.io.join_next() => self.on_io(io),
                _ = renew.tick(), if requests_open => self.renew_all(),
            }
        }
        for (shard, holding) in std::mem::take(&mut self.held) {
            self.release(&shard, holding.lease);
        }
        while let Some(io) = self.io.join_next().await {
            self.on_io(io);
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

    fn on_io(&mut self, joined: Result<Io, tokio::task::JoinError>) {
        let io = match joined {
            Ok(io) => io,
            Err(e) => {
                tracing::error!(subscription = %self.subscription.name, error = %e, "lease store call failed");
                return;
            }
        };
        match io {
            Io::Listed { shards, leases } => self.on_listed(shards, leases),
            Io::Acquired {
                shard,
                seen,
                sent_at,
                result,
            } => self.on_acquired(shard, seen, sent_at, result),
            Io::Renewed {
                shard,
                session,
                sent_at,
                result,
            } => self.on_renewed(shard, session, sent_at, result),
            Io::Checkpointed {
                request,
                sent_at,
                result,
            } => self.on_checkpointed(request, sent_at, result),
            Io::Released { shard, result } => match result {
                Ok(()) => {
                    tracing::info!(subscription = %self.subscription.name, shard_id = %shard, held = self.held.len(), "lease released")
                }
                Err(e) => {
                    self.note_store_error(Some(&shard), &e);
                    tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, "lease not released; it will expire")
                }
            },
            Io::Asked {
                lease,
                fair_share,
                live,
                result,
            } => match result {
                Ok(()) => tracing::info!(
                    subscription = %self.subscription.name, shard_id = %lease.key.shard,
                    from = lease.owner.as_ref().map(OwnerId::as_str), fair_share, live,
                    "asked for a lease hand-over"
                ),
                Err(e) => {
                    tracing::debug!(subscription = %self.subscription.name, shard_id = %lease.key.shard, error = %e, "hand-over request not placed")
                }
            },
        }
    }

    /// Counts a throttled store call (of one shard's lease, or of the
    /// table: `None`) and says so at most once an interval.
    fn note_store_error(&mut self, shard: Option<&ShardId>, e: &LeaseError) {
        if let LeaseError::Throttled(why) = e {
            crate::throttle::counter(
                &self.telemetry,
                self.subscription.name.as_str(),
                "dynamodb",
                shard.map_or("", ShardId::as_str),
            )
            .inc();
            if let Some(suppressed) = self.throttle_log.note(std::time::Instant::now()) {
                tracing::warn!(subscription = %self.subscription.name, service = "dynamodb", suppressed, why = %why, "lease store calls throttled; backing off (logged at most once every 10 s; suppressed: since the last line)");
            }
        }
    }

    /// Starts a sync: lists the stream's shards and the lease table in a
    /// task (unless the previous sync is still under way).
    fn sync(&mut self) {
        if self.reader_ctx.is_none() || self.listing || self.round.is_some() {
            return;
        }
        self.listing = true;
        let client = self.client.clone();
        let store = self.store.clone();
        let stream = self.subscription.stream.clone();
        let sub = self.subscription.name.clone();
        let limit = self.lease.lease_duration;
        self.io.spawn(async move {
            let (shards, leases) = tokio::join!(
                async {
                    tokio::time::timeout(limit, list_shards(&client, &stream))
                        .await
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {limit:?}")))
                },
                bounded(limit, store.list(&sub, &stream)),
            );
            Io::Listed { shards, leases }
        });
    }

    fn on_listed(
        &mut self,
        shards: anyhow::Result<Vec<ShardInfo>>,
        leases: Result<Vec<Lease>, LeaseError>,
    ) {
        self.listing = false;
        // Stopping: take nothing, ask nobody.
        if self.reader_ctx.is_none() || self.readers_cancel.is_cancelled() {
            return;
        }
        let shards = match shards {
            Ok(shards) => shards,
            Err(e) => {
                tracing::warn!(subscription = %self.subscription.name, stream = %self.subscription.stream, error = %format!("{e:#}"), "cannot list shards; will retry");
                return;
            }
        };
        let leases: HashMap<ShardId, Lease> = match leases {
            Ok(leases) => leases
                .into_iter()
                .map(|l| (l.key.shard.clone(), l))
                .collect(),
            Err(e) => {
                self.note_store_error(None, &e);
                tracing::warn!(subscription = %self.subscription.name, error = %e, "cannot read leases; will retry");
                return;
            }
        };
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
        let (mut keeping, mut releasing) = (HashSet::new(), HashSet::new());
        for (shard, holding) in &self.held {
            match holding.releasing {
                None => keeping.insert(shard.clone()),
                Some(_) => releasing.insert(shard.clone()),
            };
        }
        let plan = self.planner.plan(
            &self.owner,
            &keeping,
            &releasing,
            &shards,
            &leases,
            self.lease.lease_duration,
            Instant::now(),
        );
        let cooldown = self.lease.lease_duration;
        self.handed_over.retain(|_, at| at.elapsed() < cooldown);
        let mut round = SyncRound {
            shards,
            fair_share: plan.fair_share,
            acquiring: HashSet::new(),
            // Held here, though the table (read before our latest writes
            // landed) may say otherwise: read, not free.
            free: plan
                .free
                .into_iter()
                .filter(|s| !self.held.contains_key(s))
                .collect(),
        };
        for (shard, seen) in plan.take {
            // Held here (the table may lag our view: taking it again would
            // start a second reader), or handed over a moment ago: not
            // taken now.
            if self.held.contains_key(&shard) || self.handed_over.contains_key(&shard) {
                continue;
            }
            round.acquiring.insert(shard.clone());
            let key = self.key(&shard);
            let store = self.store.clone();
            let owner = self.owner.clone();
            let limit = self.lease.lease_duration;
            self.io.spawn(async move {
                let sent_at = Instant::now();
                let result = bounded(limit, store.acquire(&key, &owner, seen.as_ref())).await;
                Io::Acquired {
                    shard,
                    seen,
                    sent_at,
                    result,
                }
            });
        }
        if let Some(lease) = plan.ask {
            let store = self.store.clone();
            let owner = self.owner.clone();
            let limit = self.lease.lease_duration;
            let (fair_share, live) = (plan.fair_share, plan.live);
            self.io.spawn(async move {
                let result = bounded(limit, store.request_handoff(&lease, &owner)).await;
                Io::Asked {
                    lease,
                    fair_share,
                    live,
                    result,
                }
            });
        }
        self.round = Some(round);
        self.finish_round_if_done();
    }

    fn on_acquired(
        &mut self,
        shard: ShardId,
        seen: Option<Lease>,
        sent_at: Instant,
        result: Result<HeldLease, LeaseError>,
    ) {
        let stopping = self.readers_cancel.is_cancelled();
        let (Some(round), Some(reader_ctx), false) =
            (self.round.as_mut(), self.reader_ctx.clone(), stopping)
        else {
            // Stopping: a lease taken meanwhile is not wanted any more.
            self.round = None;
            if let Ok(lease) = result {
                self.release(&shard, lease);
            }
            return;
        };
        round.acquiring.remove(&shard);
        match result {
            Ok(lease) => {
                round.free.remove(&shard);
                let present: HashSet<&ShardId> = round.shards.iter().map(|s| &s.id).collect();
                let info = round.shards.iter().find(|s| s.id == shard);
                // A child of a consumed parent starts at its own beginning,
                // so nothing between the parent's end and the child's start
                // is skipped.
                let start = if info.is_some_and(|i| i.parents().any(|p| present.contains(p))) {
                    StartPosition::TrimHorizon
                } else {
                    self.subscription.start
                };
                let fair_share = round.fair_share;
                let previous = seen.as_ref().and_then(|l| l.owner.clone());
                self.start_reader(&reader_ctx, lease, sent_at, start, previous, fair_share);
            }
            Err(LeaseError::Lost(_)) => {
                // Someone else reads it now.
                round.free.remove(&shard);
                tracing::debug!(subscription = %self.subscription.name, shard_id = %shard, "lease taken by another instance first");
            }
            Err(e) => {
                self.note_store_error(Some(&shard), &e);
                tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, "cannot take lease; will retry");
            }
        }
        self.finish_round_if_done();
    }

    /// Once every acquire of the sync has answered: the sync is done, and
    /// what is still free is read by nobody.
    fn finish_round_if_done(&mut self) {
        if self.round.as_ref().is_none_or(|r| !r.acquiring.is_empty()) {
            return;
        }
        let Some(round) = self.round.take() else {
            return;
        };
        let unread = round.free.len();
        self.unread.set(unread as u64);
        let newly = {
            let mut coverage = self
                .status
                .coverage
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let was = coverage.unread;
            coverage.synced(unread, std::time::Instant::now());
            unread > 0 && was == 0
        };
        if newly {
            let shards: Vec<&str> = round.free.iter().map(ShardId::as_str).take(8).collect();
            tracing::info!(subscription = %self.subscription.name, unread, ?shards, "shards held by nobody after this sync");
        }
        self.status
            .synced
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.leases_held.set(self.held.len() as u64);
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
        let (valid_until, valid_rx) = watch::channel(acquired_at + self.lease.lease_duration);
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
                session,
                valid_until,
                cancel,
                releasing: None,
                writing: false,
                pending: None,
                renew_due: false,
                force_release: false,
            },
        );
        self.leases_held.set(self.held.len() as u64);
    }

    /// A renewal round: every held lease renews at once, each in its own
    /// task; a lease being given up for longer than `shutdown_timeout` is
    /// released instead (once the write under way, if any, lands).
    fn renew_all(&mut self) {
        let shards: Vec<ShardId> = self.held.keys().cloned().collect();
        let now = Instant::now();
        for shard in shards {
            let Some(holding) = self.held.get_mut(&shard) else {
                continue;
            };
            if let Some(since) = holding.releasing
                && now.duration_since(since) >= self.subscription.shutdown_timeout
            {
                holding.force_release = true;
                if !holding.writing {
                    self.force_release(&shard);
                }
                continue;
            }
            holding.renew_due = true;
            self.next_write(&shard);
        }
    }

    fn force_release(&mut self, shard: &ShardId) {
        tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, "in-flight records did not settle within shutdown_timeout; releasing the lease anyway (the next owner reads them again)");
        if let Some(holding) = self.held.remove(shard) {
            if holding.lease.handoff.is_some() {
                self.handed_over.insert(shard.clone(), Instant::now());
            }
            self.release(shard, holding.lease);
        }
    }

    /// Starts the next write of a lease, if none is under way: the pending
    /// checkpoint first (it renews too), else a due renewal.
    fn next_write(&mut self, shard: &ShardId) {
        let Some(holding) = self.held.get_mut(shard) else {
            return;
        };
        if holding.writing {
            return;
        }
        if holding.force_release {
            self.force_release(shard);
            return;
        }
        let store = self.store.clone();
        let owner = self.owner.clone();
        let lease = holding.lease.clone();
        let session = holding.session;
        let limit = self.lease.lease_duration;
        if let Some(request) = holding.pending.take() {
            let Some(point) = request.checkpoint.clone() else {
                // Drained with nothing new to write: settled as it stands.
                self.drained(shard, None);
                // Still held (not being given up): a due renewal goes on.
                self.next_write(shard);
                return;
            };
            holding.writing = true;
            self.io.spawn(async move {
                let sent_at = Instant::now();
                let result = checkpoint(&*store, &owner, &lease, &point, limit).await;
                Io::Checkpointed {
                    request,
                    sent_at,
                    result,
                }
            });
        } else if holding.renew_due {
            holding.writing = true;
            let shard = shard.clone();
            self.io.spawn(async move {
                let sent_at = Instant::now();
                let result = bounded(limit, renew(&*store, &owner, &lease)).await;
                Io::Renewed {
                    shard,
                    session,
                    sent_at,
                    result,
                }
            });
        }
    }

    /// A write of the lease (renewal or checkpoint) landed, sent at
    /// `sent_at`: the lease as it now stands is ours until `sent_at` plus a
    /// lease duration, and a hand-over it carries starts now.
    fn landed(&mut self, shard: &ShardId, lease: HeldLease, sent_at: Instant, moved: bool) {
        let duration = self.lease.lease_duration;
        let Some(holding) = self.held.get_mut(shard) else {
            return;
        };
        let handoff = lease.handoff.clone();
        holding.lease = lease;
        if moved {
            holding.extend(sent_at, duration);
            holding.renew_due = false;
        }
        if let Some(to) = handoff
            && holding.releasing.is_none()
        {
            tracing::info!(subscription = %self.subscription.name, shard_id = %shard, to = %to, "handing the lease over: reader stopping, in-flight records settling");
            holding.releasing = Some(Instant::now());
            holding.cancel.cancel();
        }
    }

    /// A write failed for a transient reason: the lease is lost once its
    /// validity deadline has passed; true when it still is held.
    fn failed(&mut self, shard: &ShardId, e: &LeaseError, what: &str) -> bool {
        let overdue = self
            .held
            .get(shard)
            .is_some_and(|h| Instant::now() >= *h.valid_until.borrow());
        self.note_store_error(Some(shard), e);
        tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, error = %e, overdue, "{what}");
        if overdue {
            self.lose(shard, "not renewed within a lease duration");
        }
        !overdue
    }

    fn on_renewed(
        &mut self,
        shard: ShardId,
        session: SessionId,
        sent_at: Instant,
        result: Result<(HeldLease, bool), LeaseError>,
    ) {
        // Only for the same taking of the lease.
        let Some(holding) = self.held.get_mut(&shard).filter(|h| h.session == session) else {
            return;
        };
        holding.writing = false;
        match result {
            Ok((lease, wrote)) => self.landed(&shard, lease, sent_at, wrote),
            Err(LeaseError::Lost(_)) => {
                self.lose(&shard, "taken by another instance");
                return;
            }
            Err(e) => {
                if !self.failed(&shard, &e, "lease renewal failed") {
                    return;
                }
            }
        }
        self.next_write(&shard);
    }

    /// Stops the shard's reader at once: the lease is no longer ours.
    fn lose(&mut self, shard: &ShardId, why: &str) {
        if let Some(holding) = self.held.remove(shard) {
            self.leases_held.set(self.held.len() as u64);
            holding.cancel.cancel();
            tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, why, held = self.held.len(), "lease lost; reader stopped");
        }
    }

    /// Releases a lease no longer held (in a task).
    fn release(&mut self, shard: &ShardId, lease: HeldLease) {
        self.leases_held.set(self.held.len() as u64);
        self.status.shard(shard.as_str(), |s| {
            s.owner.clear();
            if s.state != "ended" {
                s.state = "released".into();
            }
        });
        let store = self.store.clone();
        let limit = self.lease.lease_duration;
        let shard = shard.clone();
        self.io.spawn(async move {
            let result = bounded(limit, store.release(&lease)).await;
            Io::Released { shard, result }
        });
    }

    /// Queues a checkpoint request behind the lease's write under way.
    fn on_request(&mut self, request: CheckpointRequest) {
        let Some(holding) = self
            .held
            .get_mut(&request.shard)
            .filter(|h| h.session == request.session)
        else {
            if let Some(checkpoint) = &request.checkpoint {
                tracing::warn!(subscription = %self.subscription.name, shard_id = %request.shard, checkpoint = checkpoint.as_str(), "checkpoint for a shard no longer held (or a reader session since replaced); not written");
            }
            return;
        };
        let shard = request.shard.clone();
        holding.pending = Some(merge(holding.pending.take(), request));
        self.next_write(&shard);
    }

    fn on_checkpointed(
        &mut self,
        request: CheckpointRequest,
        sent_at: Instant,
        result: Result<HeldLease, LeaseError>,
    ) {
        let shard = request.shard.clone();
        let session = request.session;
        let Some(holding) = self.held.get_mut(&shard).filter(|h| h.session == session) else {
            return;
        };
        holding.writing = false;
        let Some(point) = request.checkpoint.clone() else {
            return;
        };
        match result {
            Ok(lease) => {
                tracing::debug!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = point.as_str(), "checkpoint written");
                self.status.shard(shard.as_str(), |s| {
                    s.checkpoint = point.as_str().to_owned();
                    s.checkpoint_at = Some(std::time::Instant::now());
                });
                if point == Checkpoint::ShardEnd {
                    // The shard is done: nobody needs to read it again.
                    if self.held.remove(&shard).is_some() {
                        self.release(&shard, lease);
                    }
                    return;
                }
                self.landed(&shard, lease, sent_at, true);
                if request.drained {
                    self.drained(&shard, Some(&point));
                    if !self.held.contains_key(&shard) {
                        return;
                    }
                }
            }
            Err(LeaseError::Lost(_)) => {
                self.lose(&shard, "checkpoint refused: lease changed hands");
                return;
            }
            Err(e) => {
                if !self.failed(
                    &shard,
                    &e,
                    "checkpoint not written; tried again at the next renewal",
                ) {
                    return;
                }
                // Back in line, behind nothing newer: a newer request
                // covers it, keeping `drained`. Tried at the next tick.
                if let Some(holding) = self.held.get_mut(&shard) {
                    holding.pending = Some(match holding.pending.take() {
                        Some(newer) => merge(Some(request), newer),
                        None => request,
                    });
                    if holding.force_release {
                        self.force_release(&shard);
                    }
                }
                return;
            }
        }
        self.next_write(&shard);
    }

    /// Everything the shard's reader handed out has settled and its final
    /// checkpoint is written: a lease being given up is released now.
    fn drained(&mut self, shard: &ShardId, checkpoint: Option<&Checkpoint>) {
        let releasing = self.held.get(shard).and_then(|h| h.releasing);
        let Some(since) = releasing else {
            return;
        };
        if let Some(holding) = self.held.remove(shard) {
            tracing::info!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.map(Checkpoint::as_str), drain = ?since.elapsed(), "final checkpoint written");
            if holding.lease.handoff.is_some() {
                self.handed_over.insert(shard.clone(), Instant::now());
            }
            self.release(shard, holding.lease);
        }
    }
}

/// A newer checkpoint request in place of an older one of the same session:
/// the newer checkpoint covers the older, and `drained` stays.
fn merge(older: Option<CheckpointRequest>, newer: CheckpointRequest) -> CheckpointRequest {
    match older {
        Some(older) => CheckpointRequest {
            checkpoint: newer.checkpoint.or(older.checkpoint),
            drained: newer.drained || older.drained,
            ..newer
        },
        None => newer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SequenceNumber;

    fn request(checkpoint: Option<&str>, drained: bool) -> CheckpointRequest {
        CheckpointRequest {
            shard: "s".into(),
            session: 3,
            checkpoint: checkpoint.map(|c| Checkpoint::Sequence(SequenceNumber::parse(c).unwrap())),
            drained,
        }
    }

    #[test]
    fn a_newer_request_covers_an_older_one_and_drained_stays() {
        assert_eq!(
            merge(None, request(Some("5"), false)),
            request(Some("5"), false)
        );
        assert_eq!(
            merge(Some(request(Some("5"), true)), request(Some("9"), false)),
            request(Some("9"), true),
            "a drained request is never lost behind a newer one"
        );
        assert_eq!(
            merge(Some(request(Some("5"), false)), request(None, true)),
            request(Some("5"), true),
            "drained with nothing new keeps the checkpoint still to write"
        );
    }
}
