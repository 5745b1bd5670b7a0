//! The lease keeper: one task per subscription that owns the leases it
//! holds — planning, taking, renewing, handing over and releasing them, and
//! writing their fenced checkpoints — and says which shards to read.
//!
//! It speaks through typed, bounded channels only: it sends
//! [`Assignment`]s (read this shard from there while the lease is valid;
//! stop reading it) to the reader pool, and takes [`CheckpointRequest`]s
//! from settlement. It holds no record channel and no settlement sender,
//! and reports lease facts to the subscription's status
//! ([`SubscriptionStatus`]) in typed calls.
//!
//! On its own timers, never inside a reader:
//! - every `shard_sync_every` (and at start): list the stream's shards, read
//!   the lease table, and let the [`Planner`] decide which leases to take
//!   (free or expired ones, up to the fair share; children only after their
//!   parents reached `SHARD_END`) and whom to ask for one (balancing). A
//!   listing that fails (Kinesis slow or unreachable) does not hold the
//!   lease table back: the sync plans with the last listing that
//!   succeeded, so leases are still taken, handed over and balanced. Each
//!   lease taken is assigned to a reader ([`Assignment::Read`]) after the
//!   lease's checkpoint, or, for a child of a split or merge, at the
//!   child's beginning.
//! - every `renew_every`: write this instance's heartbeat (see
//!   "Heartbeats" in [`super`]), which moves the validity deadline of every
//!   held lease at once; a lease whose deadline passed before the heartbeat
//!   landed is verified by a renewal of its own. Heartbeats that keep
//!   failing past the deadline lose every lease, together. While an
//!   instance of an earlier version is live, every held lease is renewed
//!   on this timer too. A lease found taken by another owner (at a sync, or
//!   by a refused write) is lost: its reader is told to stop
//!   ([`Assignment::Stop`]) and its validity deadline is dropped, and
//!   nothing more is checkpointed for it. A hand-over request, seen at a
//!   sync or on any landed write of the lease, starts a graceful hand-over.
//!
//! # Validity: a reader never hands out records on a lapsed lease
//! The protocol and why it fences are argued once, in [`super`]
//! ("Heartbeats": the rule, the holder's side, why it fences); here is how
//! the keeper carries it out. It publishes each held lease's deadline
//! (the holder's side) to the shard's reader on a `watch` channel, and the reader
//! sends nothing into the channel, and opens no iterator, past it: it waits
//! for the next heartbeat (which moves the deadline) or for the keeper to
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
//! `drained` kept) and is tried again after a backoff (below).
//!
//! # Failed writes back off
//! A write of a lease (renewal, checkpoint, release) that fails for a
//! transient reason — the store unreachable, an error, throttling — is tried
//! again after a jittered, capped backoff of its own (from 200 ms up to
//! `renew_every`), never at once: whatever the SDK's retry quota says, a
//! failing store sees no more writes per lease than a healthy one, and a
//! fleet's retries spread out instead of arriving together. The backoff
//! resets at the next write that lands. Each kind of failure is logged at
//! WARN at most once every 10 s with the number of failures kept back
//! (throttling has its own gate and counter, as for GetRecords).
//!
//! # Graceful release (hand-over and shutdown)
//! The shard's reader is told to stop; it tells settlement how far it got;
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
//! nothing else: heartbeats go out on their timer while a sync or a
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
//! A lease lost because no heartbeat landed for a lease duration (the
//! store unreachable, a slow network) still names this instance if nobody
//! else took it; the planner takes it back, after its checkpoint, once its
//! counter has stood still for a lease duration (see [`super::planner`]). After each sync the
//! keeper records how many eligible shards nobody holds; `/readyz` fails,
//! and `shardlane_shards_unread` says so, when some stay unread, or no sync
//! succeeds, for longer than a lease duration plus two syncs.
//!
//! Outgoing assignments wait in a queue of the keeper's own (at most a few
//! per held shard) until the bounded channel to the pool takes them, so the
//! keeper's loop never waits on the pool either.
//!
//! # Shutdown
//! In order: stop taking leases and close the assignment channel (the pool
//! then stops every reader, and with them the record channel closes) →
//! write what settlement sends until it is done, releasing each shard as it
//! drains (renewing meanwhile) → wait for store calls under way → release
//! whatever is left. The keeper ends when settlement's requests end: no
//! stage has to drop a sender for another to finish.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod beat;
mod calls;
mod sync;
#[cfg(test)]
mod tests;
mod writes;

#[cfg(test)]
use writes::merge;

use calls::Io;

use super::planner::Planner;
use super::{CheckpointRequest, CheckpointState, HeldLease, LeaseError, LeaseKey, LeaseStore};
use crate::backoff::Backoff;
use crate::config::{LeaseConfig, SubscriptionConfig};
use crate::ids::{OwnerId, SessionId, ShardId, StreamName};
use crate::kinesis::{HashKeyRange, Kinesis, KinesisError, ReadFrom, ShardInfo};
use crate::logging::LogGate;
use crate::telemetry::{Gauge, SubscriptionStatus, Telemetry};

/// Checkpoint requests queued to the keeper; settlement coalesces them to
/// about one per shard per `checkpoint_every`, so this is plenty.
pub(crate) const CHECKPOINT_QUEUE: usize = 256;

/// Assignments queued to the reader pool. The pool only starts and stops
/// tasks, so it keeps up; the keeper's own queue absorbs a burst (a sync
/// that took many leases).
pub(crate) const ASSIGNMENT_QUEUE: usize = 64;

/// The first wait before a failed lease write is tried again (module
/// docs, "Failed writes back off").
const RETRY_FIRST: Duration = Duration::from_millis(200);

/// Sleeps until `at`, or forever when there is nothing to wait for (a
/// `select!` branch that never fires).
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What the keeper tells the reader pool.
#[derive(Debug)]
pub(crate) enum Assignment {
    /// Read `shard` from `from` in reader session `session`, acting on the
    /// lease only while `valid_until` lies ahead (module docs, "Validity");
    /// the channel closes when the lease is lost.
    Read {
        /// The shard.
        shard: ShardId,
        /// This taking of its lease.
        session: SessionId,
        /// Where to open it.
        from: ReadFrom,
        /// Its hash keys, as the shard listing said (KPL user records are
        /// checked against them).
        hash_keys: Option<HashKeyRange>,
        /// Until when the lease is surely ours.
        valid_until: watch::Receiver<Instant>,
    },
    /// Stop reading `shard` (the reader of `session` only: a newer session
    /// of the same shard keeps reading).
    Stop {
        /// The shard.
        shard: ShardId,
        /// The session to stop.
        session: SessionId,
        /// Why.
        why: StopReason,
    },
}

/// Why a reader is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The lease was lost: nothing more may be handed out.
    Lost,
    /// Another instance asked for the shard: settle what is in flight,
    /// then the lease is released.
    HandOver,
}

/// Where the keeper lists a stream's shards: Kinesis, or a fake in tests.
#[async_trait]
pub(crate) trait ShardSource: Send + Sync + 'static {
    /// Every shard of `stream`.
    async fn list_shards(&self, stream: &StreamName) -> Result<Vec<ShardInfo>, KinesisError>;
}

#[async_trait]
impl ShardSource for Kinesis {
    async fn list_shards(&self, stream: &StreamName) -> Result<Vec<ShardInfo>, KinesisError> {
        Kinesis::list_shards(self, stream).await
    }
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
    /// The last write failed for a transient reason: no write of this lease
    /// before then (module docs, "Failed writes back off").
    retry_at: Option<Instant>,
    /// The wait before the next try after a failure; reset by a success.
    backoff: Backoff,
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
pub(crate) struct Keeper {
    subscription: Arc<SubscriptionConfig>,
    lease: LeaseConfig,
    owner: OwnerId,
    store: Arc<dyn LeaseStore>,
    shards: Arc<dyn ShardSource>,
    held: HashMap<ShardId, Holding>,
    /// Store calls under way.
    io: JoinSet<Io>,
    /// A listing is under way.
    listing: bool,
    /// The last listing of the stream's shards that succeeded: a sync whose
    /// listing fails plans with it (the shards change rarely; leases in the
    /// store can still be taken, handed over and balanced while Kinesis is
    /// slow to answer ListShards).
    last_shards: Option<Vec<ShardInfo>>,
    round: Option<SyncRound>,
    planner: Planner,
    next_session: u64,
    /// Shutdown began: take nothing, ask nobody.
    stopping: bool,
    /// Assignments not yet taken by the pool's channel.
    outbox: VecDeque<Assignment>,
    status: Arc<SubscriptionStatus>,
    leases_held: Gauge,
    unread: Gauge,
    telemetry: Arc<Telemetry>,
    throttle_log: LogGate,
    /// One gate per kind of failing store call (renewal, checkpoint,
    /// release, acquire, listing): each logged at most once an interval.
    failure_log: HashMap<&'static str, LogGate>,
    /// Shards this instance handed over, and when: not taken back for a
    /// lease duration, so the instance that asked gets them (an instance
    /// with no lease yet is invisible to the planner's live count, and
    /// would otherwise lose the race to the giver's next sync forever).
    handed_over: HashMap<ShardId, Instant>,
    /// The subscription's per-key state, committed with each checkpoint.
    state: Option<Arc<dyn CheckpointState>>,
    /// This instance's heartbeat.
    beat: beat::Beat,
    /// What it reads, published with the heartbeat.
    load: beat::LoadMeter,
    /// A live owner has no heartbeat (an earlier version): every held
    /// lease is renewed on the timer too, as earlier versions expect.
    legacy: bool,
    /// A sync before the timer's: someone asked us for a lease (we learnt
    /// it at a heartbeat), or we asked someone and the lease will soon be
    /// free for us.
    resync_at: Option<Instant>,
}

impl Keeper {
    /// Commits `state`'s writes with each checkpoint, and opens and closes
    /// its shard sessions as leases are taken and lost.
    pub(crate) fn with_state(mut self, state: Option<Arc<dyn CheckpointState>>) -> Self {
        self.state = state;
        self
    }

    /// The keeper of `subscription`'s leases in `store`, held as `owner`,
    /// listing shards from `shards` and reporting to `status`.
    pub(crate) fn new(
        subscription: Arc<SubscriptionConfig>,
        lease: LeaseConfig,
        owner: OwnerId,
        store: Arc<dyn LeaseStore>,
        shards: Arc<dyn ShardSource>,
        status: Arc<SubscriptionStatus>,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let sub = subscription.name.as_str();
        let unread = telemetry.gauge(
            "shardlane_shards_unread",
            "Shards of the stream that no instance held after this instance's last shard sync.",
            &[("subscription", sub)],
        );
        let leases_held = telemetry.gauge(
            "shardlane_leases_held",
            "Shard leases this instance holds.",
            &[("subscription", sub)],
        );
        status.set_coverage_grace(lease.lease_duration + 2 * lease.shard_sync_every);
        Self {
            status,
            handed_over: HashMap::new(),
            leases_held,
            unread,
            telemetry,
            throttle_log: LogGate::every(crate::throttle::LOG_INTERVAL),
            failure_log: HashMap::new(),
            subscription,
            owner,
            store,
            shards,
            held: HashMap::new(),
            io: JoinSet::new(),
            listing: false,
            last_shards: None,
            round: None,
            planner: Planner::new(),
            next_session: 1,
            stopping: false,
            outbox: VecDeque::new(),
            state: None,
            beat: beat::Beat::new(lease.renew_every),
            load: beat::LoadMeter::default(),
            legacy: false,
            resync_at: None,
            lease,
        }
    }

    fn key(&self, shard: &ShardId) -> LeaseKey {
        LeaseKey {
            subscription: self.subscription.name.clone(),
            stream: self.subscription.stream.clone(),
            shard: shard.clone(),
        }
    }

    /// Runs until `stop`, then shuts down in order (module docs): ends once
    /// `checkpoints` is closed and every lease is released.
    pub(crate) async fn run(
        mut self,
        assignments: mpsc::Sender<Assignment>,
        mut checkpoints: mpsc::Receiver<CheckpointRequest>,
        stop: CancellationToken,
    ) {
        let mut sync = tokio::time::interval(self.lease.shard_sync_every);
        let mut renew = tokio::time::interval(self.lease.renew_every);
        for timer in [&mut sync, &mut renew] {
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        renew.reset(); // the first renewal is one interval after taking.
        // Heartbeat first, so the others count this instance at their next
        // sync, whether it takes a lease or not.
        self.beat();
        loop {
            let retry = self.next_retry();
            let resync = self.resync_at;
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = sync.tick() => self.sync(),
                () = sleep_until_some(resync) => {
                    self.resync_at = None;
                    self.sync();
                }
                _ = renew.tick() => self.on_renew_tick(),
                Some(request) = checkpoints.recv() => self.on_request(request),
                Some(io) = self.io.join_next() => self.on_io(io),
                () = sleep_until_some(retry) => self.retry_due(),
                permit = assignments.reserve(), if !self.outbox.is_empty() => match permit {
                    Ok(permit) => permit.send(self.outbox.pop_front().expect("checked non-empty")),
                    Err(_) => {
                        tracing::error!(subscription = %self.subscription.name, "reader pool is gone; no shard can be read");
                        self.outbox.clear();
                    }
                },
            }
        }

        tracing::info!(subscription = %self.subscription.name, leases = self.held.len(), "stopping readers");
        self.stopping = true;
        let now = Instant::now();
        for holding in self.held.values_mut() {
            holding.releasing.get_or_insert(now);
        }
        // Closing the channel stops every reader; an assignment not yet
        // taken is moot (its lease is released below, like the rest).
        self.outbox.clear();
        drop(assignments);
        let mut requests_open = true;
        while requests_open || !self.io.is_empty() || self.has_pending() {
            let retry = self.next_retry();
            tokio::select! {
                request = checkpoints.recv(), if requests_open => match request {
                    Some(request) => self.on_request(request),
                    None => {
                        requests_open = false;
                        // Nothing to renew for any more: what is left is
                        // released once the writes under way land (and a
                        // final checkpoint that failed is tried again).
                        for holding in self.held.values_mut() {
                            holding.renew_due = false;
                        }
                    }
                },
                Some(io) = self.io.join_next() => self.on_io(io),
                () = sleep_until_some(retry) => self.retry_due(),
                _ = renew.tick() => if requests_open {
                    self.on_renew_tick();
                } else {
                    self.retry_pending();
                },
            }
        }
        for (shard, holding) in std::mem::take(&mut self.held) {
            self.release(&shard, holding.lease);
        }
        while let Some(io) = self.io.join_next().await {
            self.on_io(io);
        }
        self.retire();
        while let Some(io) = self.io.join_next().await {
            self.on_io(io);
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
            Io::Listed {
                shards,
                survey,
                sent_at,
            } => self.on_listed(shards, survey, sent_at),
            Io::Beat { sent_at, result } => self.on_beat(sent_at, result),
            Io::Retired { owner, result } => match result {
                Ok(()) => {
                    tracing::debug!(subscription = %self.subscription.name, owner = %owner, "heartbeat retired")
                }
                Err(e) => {
                    tracing::debug!(subscription = %self.subscription.name, owner = %owner, error = %e, "heartbeat not retired")
                }
            },
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
                state_writes,
                sent_at,
                result,
            } => self.on_checkpointed(request, state_writes, sent_at, result),
            Io::Released { shard, result } => match result {
                Ok(()) => {
                    tracing::info!(subscription = %self.subscription.name, shard_id = %shard, held = self.held.len(), "lease released")
                }
                Err(e) => self.warn_failed(
                    "release",
                    Some(&shard),
                    &e,
                    "lease not released; it will expire",
                ),
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
                    held = self.held.len(),
                    "asked for a lease hand-over"
                ),
                Err(e) => {
                    tracing::debug!(subscription = %self.subscription.name, shard_id = %lease.key.shard, error = %e, "hand-over request not placed")
                }
            },
        }
    }

    /// The backoff of a lease's writes after a transient failure: from a
    /// fraction of `renew_every` up to `renew_every`, so a failing store
    /// sees no more writes of a lease than a healthy one does.
    pub(super) fn write_backoff(&self) -> Backoff {
        let cap = self.lease.renew_every;
        Backoff::new(RETRY_FIRST.min(cap), cap)
    }

    /// Counts a failed store call of kind `what` (of one shard's lease, or
    /// of the table: `None`) and logs it at WARN at most once an interval
    /// per kind, with how many were kept back (a throttled call is logged
    /// by [`Self::note_store_error`]'s own gate instead).
    pub(super) fn warn_failed(
        &mut self,
        what: &'static str,
        shard: Option<&ShardId>,
        e: &LeaseError,
        message: &str,
    ) {
        self.note_store_error(shard, e);
        if matches!(e, LeaseError::Throttled(_)) {
            return;
        }
        let gate = self
            .failure_log
            .entry(what)
            .or_insert_with(|| LogGate::every(crate::throttle::LOG_INTERVAL));
        if let Some(suppressed) = gate.note(std::time::Instant::now()) {
            tracing::warn!(
                subscription = %self.subscription.name,
                shard_id = shard.map(tracing::field::display),
                error = %e,
                suppressed,
                "{message} (logged at most once every 10 s; suppressed: since the last line)"
            );
        }
    }

    /// When the earliest lease write waiting out its backoff is due.
    fn next_retry(&self) -> Option<Instant> {
        self.held
            .values()
            .filter_map(|h| h.retry_at)
            .chain(self.beat.retry_at)
            .min()
    }

    /// Starts the writes whose backoff has passed.
    fn retry_due(&mut self) {
        let now = Instant::now();
        if self.beat.retry_at.is_some_and(|at| at <= now) {
            self.beat.retry_at = None;
            self.beat();
        }
        let due: Vec<ShardId> = self
            .held
            .iter()
            .filter(|(_, h)| h.retry_at.is_some_and(|at| at <= now))
            .map(|(s, _)| s.clone())
            .collect();
        for shard in due {
            if let Some(holding) = self.held.get_mut(&shard) {
                holding.retry_at = None;
            }
            self.next_write(&shard);
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
}
