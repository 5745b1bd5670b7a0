//! The keeper's writes of held leases: renewals on the timer, checkpoints
//! as settlement asks, hand-overs and releases, one write per lease at a
//! time (see "Store calls never block the keeper" in [`super`]).

use tokio::time::Instant;

use super::calls::{Io, bounded, checkpoint, release, renew};
use super::{Assignment, Keeper, StopReason};
use crate::ids::{SessionId, ShardId};
use crate::lease::{CheckpointRequest, HeldLease, LeaseError};
use crate::progress::Checkpoint;

impl Keeper {
    /// The renewal timer: the heartbeat, and with an earlier version in
    /// the fleet a renewal of every lease too.
    pub(super) fn on_renew_tick(&mut self) {
        self.beat();
        self.renew_all(self.legacy);
    }

    /// A renewal round: with `renew`, every held lease renews at once, each
    /// in its own task; a lease being given up for longer than
    /// `shutdown_timeout` is released instead (once the write under way,
    /// if any, lands).
    pub(super) fn renew_all(&mut self, renew: bool) {
        let shards: Vec<ShardId> = self.held.keys().cloned().collect();
        let now = Instant::now();
        for shard in shards {
            let Some(holding) = self.held.get_mut(&shard) else {
                continue;
            };
            // A hand-over that does not drain in time is forced. Not at
            // shutdown: there settlement's requests end once dispatch is cut
            // at the same timeout, with the final checkpoints, and releasing
            // before them would lose them.
            if let Some(since) = holding.releasing
                && !self.stopping
                && now.duration_since(since) >= self.subscription.shutdown_timeout
            {
                holding.force_release = true;
                if !holding.writing {
                    self.force_release(&shard);
                }
                continue;
            }
            if renew {
                holding.renew_due = true;
                self.next_write(&shard);
            }
        }
    }

    /// At shutdown, once settlement's requests have ended: tries again the
    /// checkpoint writes that failed (a lease whose writes keep failing is
    /// lost at its validity deadline, and then released no more).
    pub(super) fn retry_pending(&mut self) {
        let shards: Vec<ShardId> = self
            .held
            .iter()
            .filter(|(_, h)| h.pending.is_some() && !h.writing)
            .map(|(s, _)| s.clone())
            .collect();
        for shard in shards {
            self.next_write(&shard);
        }
    }

    /// True while a checkpoint write is waiting to be tried again.
    pub(super) fn has_pending(&self) -> bool {
        self.held.values().any(|h| h.pending.is_some())
    }

    fn force_release(&mut self, shard: &ShardId) {
        tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, "in-flight records did not settle within shutdown_timeout; releasing the lease anyway (the next owner reads them again)");
        if let Some(holding) = self.held.remove(shard) {
            self.close_state(shard, holding.session);
            if holding.lease.handoff.is_some() {
                self.handed_over.insert(shard.clone(), Instant::now());
            }
            self.release(shard, holding.lease);
        }
    }

    /// Starts the next write of a lease, if none is under way: the pending
    /// checkpoint first (it renews too), else a due renewal.
    pub(super) fn next_write(&mut self, shard: &ShardId) {
        let Some(holding) = self.held.get_mut(shard) else {
            return;
        };
        // One write at a time; after a failure, not before its backoff
        // (the keeper's retry timer calls again then).
        if holding.writing || holding.retry_at.is_some_and(|at| at > Instant::now()) {
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
                // Drained with nothing new to write: settled as it stands,
                // and the lease is released.
                self.drained(shard, None);
                return;
            };
            holding.writing = true;
            // The state writes of the records the checkpoint passes go in
            // the same write (see `crate::state`, "Commit protocol").
            let writes = self
                .state
                .as_ref()
                .map(|state| state.commit(shard, session, &point))
                .unwrap_or_default();
            self.io.spawn(async move {
                let sent_at = Instant::now();
                let result = checkpoint(&*store, &owner, &lease, &point, &writes, limit).await;
                Io::Checkpointed {
                    request,
                    state_writes: writes.len(),
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
        holding.retry_at = None;
        holding.backoff.reset();
        if moved {
            holding.extend(sent_at, duration);
            holding.renew_due = false;
        }
        if let Some(to) = handoff {
            self.hand_over(shard, &to);
        }
    }

    /// Starts handing `shard` over to `to` (unless it already is being
    /// given up): its reader stops, and once what is in flight settles the
    /// final checkpoint is written and the lease released.
    pub(super) fn hand_over(&mut self, shard: &ShardId, to: &crate::ids::OwnerId) {
        let Some(holding) = self.held.get_mut(shard) else {
            return;
        };
        if holding.releasing.is_some() {
            return;
        }
        tracing::info!(subscription = %self.subscription.name, shard_id = %shard, to = %to, "handing the lease over: reader stopping, in-flight records settling");
        holding.releasing = Some(Instant::now());
        let session = holding.session;
        self.outbox.push_back(Assignment::Stop {
            shard: shard.clone(),
            session,
            why: StopReason::HandOver,
        });
    }

    /// A write of kind `what` failed for a transient reason: the lease is
    /// lost once its validity deadline has passed; else its next write
    /// waits out a backoff (module docs, "Failed writes back off"). True
    /// when it still is held.
    fn failed(
        &mut self,
        shard: &ShardId,
        e: &LeaseError,
        what: &'static str,
        message: &str,
    ) -> bool {
        let now = Instant::now();
        let overdue = match self.held.get_mut(shard) {
            Some(h) => {
                h.retry_at = Some(now + h.backoff.next_wait());
                now >= *h.valid_until.borrow()
            }
            None => false,
        };
        self.warn_failed(what, Some(shard), e, message);
        if overdue {
            self.lose(shard, "not renewed within a lease duration");
        }
        !overdue
    }

    pub(super) fn on_renewed(
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
                if !self.failed(
                    &shard,
                    &e,
                    "renewal",
                    "lease renewal failed; retrying after a backoff",
                ) {
                    return;
                }
            }
        }
        self.next_write(&shard);
    }

    /// Stops the shard's reader at once: the lease is no longer ours.
    pub(super) fn lose(&mut self, shard: &ShardId, why: &str) {
        if let Some(holding) = self.held.remove(shard) {
            self.close_state(shard, holding.session);
            self.leases_held.set(self.held.len() as u64);
            // Dropping the holding closes the reader's validity channel, so
            // the reader stops handing out records even before it gets this.
            self.outbox.push_back(Assignment::Stop {
                shard: shard.clone(),
                session: holding.session,
                why: StopReason::Lost,
            });
            tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, why, held = self.held.len(), "lease lost; reader stopped");
        }
    }

    /// The shard's session ended here: state it staged and did not commit
    /// goes (the next taker reads from the checkpoint).
    fn close_state(&self, shard: &ShardId, session: SessionId) {
        if let Some(state) = &self.state {
            state.close(shard, session);
        }
    }

    /// Releases a lease no longer held (in a task), trying again after a
    /// backoff while the store fails, for at most a lease duration (the
    /// lease has expired by then anyway).
    pub(super) fn release(&mut self, shard: &ShardId, lease: HeldLease) {
        self.leases_held.set(self.held.len() as u64);
        self.status.released(shard);
        let store = self.store.clone();
        let limit = self.lease.lease_duration;
        let backoff = self.write_backoff();
        let shard = shard.clone();
        self.io.spawn(async move {
            let result = release(&*store, &lease, limit, backoff).await;
            Io::Released { shard, result }
        });
    }

    /// Queues a checkpoint request behind the lease's write under way.
    pub(super) fn on_request(&mut self, request: CheckpointRequest) {
        let Some(holding) = self
            .held
            .get_mut(&request.shard)
            .filter(|h| h.session == request.session)
        else {
            if let Some(checkpoint) = &request.checkpoint {
                tracing::warn!(subscription = %self.subscription.name, shard_id = %request.shard, checkpoint = %checkpoint, "checkpoint for a shard no longer held (or a reader session since replaced); not written");
            }
            return;
        };
        let shard = request.shard.clone();
        holding.pending = Some(merge(holding.pending.take(), request));
        self.next_write(&shard);
    }

    pub(super) fn on_checkpointed(
        &mut self,
        request: CheckpointRequest,
        state_writes: usize,
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
                tracing::debug!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = %point, state_writes, "checkpoint written");
                if let Some(state) = &self.state {
                    state.committed(&shard, session, &point, sent_at.elapsed());
                }
                self.status.checkpointed(&shard, &point);
                if point == Checkpoint::ShardEnd {
                    // The shard is done: nobody needs to read it again.
                    if let Some(holding) = self.held.remove(&shard) {
                        self.close_state(&shard, holding.session);
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
                    "checkpoint",
                    "checkpoint not written; retrying after a backoff",
                ) {
                    return;
                }
                // Back in line, behind nothing newer: a newer request
                // covers it, keeping `drained`. Tried again once the
                // backoff has passed (the keeper's retry timer).
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
        let Some(holding) = self.held.remove(shard) else {
            return;
        };
        self.close_state(shard, holding.session);
        match holding.releasing {
            Some(since) => {
                tracing::info!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.map(tracing::field::display), drain = ?since.elapsed(), "final checkpoint written");
                if holding.lease.handoff.is_some() {
                    self.handed_over.insert(shard.clone(), Instant::now());
                }
            }
            // Nobody told its reader to stop: it stopped on its own (a
            // malformed answer from Kinesis). Held on, the shard would be
            // read by nobody; released, it is taken afresh at a sync.
            None => {
                tracing::warn!(subscription = %self.subscription.name, shard_id = %shard, checkpoint = checkpoint.map(tracing::field::display), "the shard's reader stopped on its own; lease released after its final checkpoint, to be taken afresh");
            }
        }
        self.release(shard, holding.lease);
    }
}

/// A newer checkpoint request in place of an older one of the same session:
/// the newer checkpoint covers the older, and `drained` stays.
pub(super) fn merge(
    older: Option<CheckpointRequest>,
    newer: CheckpointRequest,
) -> CheckpointRequest {
    match older {
        Some(older) => CheckpointRequest {
            checkpoint: newer.checkpoint.or(older.checkpoint),
            drained: newer.drained || older.drained,
            ..newer
        },
        None => newer,
    }
}
