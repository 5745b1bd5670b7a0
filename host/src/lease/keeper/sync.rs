//! The keeper's shard sync: list the shards and the lease table, plan,
//! take leases, ask for hand-overs, and assign what was taken to readers
//! (see "On its own timers" in [`super`]).

use std::collections::{HashMap, HashSet};

use tokio::sync::watch;
use tokio::time::Instant;

use super::calls::{Io, bounded};
use super::{Assignment, Holding, Keeper, SyncRound};
use crate::config::StartPosition;
use crate::ids::{OwnerId, SessionId, ShardId};
use crate::kinesis::{HashKeyRange, KinesisError, ReadFrom, ShardInfo};
use crate::lease::planner::Inputs;
use crate::lease::{Heartbeat, HeldLease, Lease, LeaseError, Survey};
use crate::logging::LogGate;
use crate::progress::Checkpoint;

impl Keeper {
    /// Starts a sync: lists the stream's shards and the lease table in a
    /// task (unless the previous sync is still under way).
    pub(super) fn sync(&mut self) {
        if self.stopping || self.listing || self.round.is_some() {
            return;
        }
        self.listing = true;
        let shards = self.shards.clone();
        let store = self.store.clone();
        let stream = self.subscription.stream.clone();
        let sub = self.subscription.name.clone();
        let limit = self.lease.lease_duration;
        self.io.spawn(async move {
            let sent_at = Instant::now();
            let (shards, survey) = tokio::join!(
                async {
                    tokio::time::timeout(limit, shards.list_shards(&stream))
                        .await
                        .unwrap_or_else(|_| {
                            Err(KinesisError::Failed(
                                format!("no answer within {limit:?}").into(),
                            ))
                        })
                },
                bounded(limit, store.survey(&sub, &stream)),
            );
            Io::Listed {
                shards,
                survey,
                sent_at,
            }
        });
    }

    pub(super) fn on_listed(
        &mut self,
        shards: Result<Vec<ShardInfo>, KinesisError>,
        survey: Result<Survey, LeaseError>,
        sent_at: Instant,
    ) {
        self.listing = false;
        // Stopping: take nothing, ask nobody.
        if self.stopping {
            return;
        }
        let shards = match shards {
            Ok(shards) => {
                self.last_shards = Some(shards.clone());
                shards
            }
            Err(e) => {
                let known = self.last_shards.clone();
                self.warn_listing(&e, known.is_some());
                match known {
                    Some(shards) => shards,
                    None => return,
                }
            }
        };
        let (leases, heartbeats): (HashMap<ShardId, Lease>, Vec<Heartbeat>) = match survey {
            Ok(survey) => (
                survey
                    .leases
                    .into_iter()
                    .map(|l| (l.key.shard.clone(), l))
                    .collect(),
                survey.heartbeats,
            ),
            Err(e) => {
                self.warn_failed("listing", None, &e, "cannot read leases; will retry");
                return;
            }
        };
        self.check_held(&leases);
        for (shard, lease) in &leases {
            if !self.held.contains_key(shard) {
                self.status
                    .held_elsewhere(shard, lease.owner.as_ref(), lease.checkpoint.as_ref());
            }
        }
        let round = self.plan(shards, &leases, &heartbeats, sent_at);
        self.round = Some(round);
        self.finish_round_if_done();
    }

    /// Logs a failed shard listing, at most once every 10 s.
    fn warn_listing(&mut self, e: &KinesisError, planning_anyway: bool) {
        let gate = self
            .failure_log
            .entry("shard listing")
            .or_insert_with(|| LogGate::every(crate::throttle::LOG_INTERVAL));
        if let Some(suppressed) = gate.note(std::time::Instant::now()) {
            let message = if planning_anyway {
                "cannot list shards; planning with the last listing, will retry (logged at most once every 10 s; suppressed: since the last line)"
            } else {
                "cannot list shards; will retry (logged at most once every 10 s; suppressed: since the last line)"
            };
            tracing::warn!(subscription = %self.subscription.name, stream = %self.subscription.stream, error = %e, suppressed, "{message}");
        }
    }

    /// What the table says of the leases held here. With no renewals, a
    /// sync is where the owner learns of a hand-over request, and of a lease
    /// another instance took (one whose counter moved past ours under
    /// another owner: a table read before our own latest write shows a
    /// lower counter, and is no news).
    fn check_held(&mut self, leases: &HashMap<ShardId, Lease>) {
        let mut taken = Vec::new();
        let mut asked = Vec::new();
        for (shard, holding) in &self.held {
            let Some(lease) = leases.get(shard) else {
                continue;
            };
            if lease.owner.as_ref() != Some(&self.owner) {
                if lease.counter > holding.lease.counter {
                    taken.push(shard.clone());
                }
            } else if let Some(to) = &lease.handoff
                && holding.releasing.is_none()
            {
                asked.push((shard.clone(), to.clone()));
            }
        }
        for shard in taken {
            self.lose(&shard, "taken by another instance");
        }
        for (shard, to) in asked {
            if let Some(holding) = self.held.get_mut(&shard) {
                holding.lease.handoff = Some(to.clone());
            }
            self.hand_over(&shard, &to);
        }
    }

    /// Plans this sync's takes and hand-over requests against the table
    /// (read no earlier than `read_at`) and starts them; the round ends
    /// when every take has answered.
    fn plan(
        &mut self,
        shards: Vec<ShardInfo>,
        leases: &HashMap<ShardId, Lease>,
        heartbeats: &[Heartbeat],
        read_at: Instant,
    ) -> SyncRound {
        let (mut keeping, mut releasing) = (HashSet::new(), HashSet::new());
        for (shard, holding) in &self.held {
            match holding.releasing {
                None => keeping.insert(shard.clone()),
                Some(_) => releasing.insert(shard.clone()),
            };
        }
        let load = self.load.load();
        let plan = self.planner.plan(&Inputs {
            me: &self.owner,
            held: &keeping,
            releasing: &releasing,
            shards: &shards,
            leases,
            heartbeats,
            load: &load,
            lease_duration: self.lease.lease_duration,
            max_leases: self.lease.max_leases_per_instance,
            observed_at: Instant::now(),
            read_at,
        });
        if plan.legacy != self.legacy {
            tracing::info!(subscription = %self.subscription.name, legacy = plan.legacy, "{}", if plan.legacy {
                "an instance without heartbeats (an earlier version) holds leases: renewing every lease too, as it expects"
            } else {
                "every instance heartbeats: leases are no longer renewed one by one"
            });
            self.legacy = plan.legacy;
        }
        for beat in plan.retire {
            self.retire_other(beat);
        }
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
            self.acquire(shard, seen);
        }
        if !plan.ask.is_empty() {
            // The owners hear of it at their next heartbeat and release
            // once drained: look again soon rather than a sync later.
            self.resync_at = Some(Instant::now() + 2 * self.lease.renew_every);
        }
        for lease in plan.ask {
            self.ask(lease, plan.fair_share, plan.live);
        }
        round
    }

    /// Takes `shard`'s lease if it is still as `seen` (in a task).
    fn acquire(&mut self, shard: ShardId, seen: Option<Lease>) {
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

    /// Deletes the heartbeat of an instance long gone (in a task).
    fn retire_other(&mut self, beat: Heartbeat) {
        let store = self.store.clone();
        let (sub, stream) = (
            self.subscription.name.clone(),
            self.subscription.stream.clone(),
        );
        let limit = self.lease.lease_duration;
        self.io.spawn(async move {
            let result = bounded(
                limit,
                store.retire_heartbeat(&sub, &stream, &beat.owner, beat.counter),
            )
            .await;
            Io::Retired {
                owner: beat.owner,
                result,
            }
        });
    }

    /// Asks the owner of `lease` to hand it over (in a task).
    fn ask(&mut self, lease: Lease, fair_share: usize, live: usize) {
        let store = self.store.clone();
        let owner = self.owner.clone();
        let limit = self.lease.lease_duration;
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

    pub(super) fn on_acquired(
        &mut self,
        shard: ShardId,
        seen: Option<Lease>,
        sent_at: Instant,
        result: Result<HeldLease, LeaseError>,
    ) {
        let (Some(round), false) = (self.round.as_mut(), self.stopping) else {
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
                let hash_keys = info.and_then(|i| i.hash_keys);
                self.assign(lease, sent_at, start, hash_keys, previous, fair_share);
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
        if self.status.synced(unread, std::time::Instant::now()) {
            let shards: Vec<&str> = round.free.iter().map(ShardId::as_str).take(8).collect();
            tracing::info!(subscription = %self.subscription.name, unread, ?shards, "shards held by nobody after this sync");
        }
        self.leases_held.set(self.held.len() as u64);
    }

    /// Assigns a lease just taken to a reader, from its checkpoint or else
    /// at `start`.
    fn assign(
        &mut self,
        lease: HeldLease,
        acquired_at: Instant,
        start: StartPosition,
        hash_keys: Option<HashKeyRange>,
        previous_owner: Option<OwnerId>,
        fair_share: usize,
    ) {
        let shard = lease.key.shard.clone();
        let (valid_until, valid_rx) = watch::channel(acquired_at + self.lease.lease_duration);
        let session = SessionId(self.next_session);
        self.next_session += 1;
        tracing::info!(
            subscription = %self.subscription.name, stream = %self.subscription.stream, shard_id = %shard,
            checkpoint = lease.checkpoint.as_ref().map(tracing::field::display),
            previous_owner = previous_owner.as_ref().map(OwnerId::as_str),
            held = self.held.len() + 1, fair_share,
            "lease taken; reader starting"
        );
        let from = match &lease.checkpoint {
            Some(Checkpoint::At(position)) => ReadFrom::After(position.clone()),
            // A lease at SHARD_END is never taken (the planner skips ended
            // shards); were it, the shard's first read reports its end again.
            Some(Checkpoint::ShardEnd) | None => ReadFrom::Start(start),
        };
        self.status
            .lease_taken(&shard, &self.owner, lease.checkpoint.as_ref());
        if let Some(state) = &self.state {
            state.open(&shard, session);
        }
        self.outbox.push_back(Assignment::Read {
            shard: shard.clone(),
            session,
            from,
            hash_keys,
            valid_until: valid_rx,
        });
        self.held.insert(
            shard,
            Holding {
                lease,
                session,
                valid_until,
                releasing: None,
                writing: false,
                pending: None,
                renew_due: false,
                force_release: false,
                retry_at: None,
                backoff: self.write_backoff(),
            },
        );
        self.leases_held.set(self.held.len() as u64);
    }
}
