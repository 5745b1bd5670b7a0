//! The live status of each subscription, as the status page and `/readyz`
//! read it: its plugin versions, and per shard who holds it, its
//! checkpoint, its lag and a typed [`ShardState`].
//!
//! One owner decides every shard's state: [`SubscriptionStatus`]. The
//! stages only report facts to it, each in its own terms — the lease keeper
//! what happened to a lease ([`SubscriptionStatus::lease_taken`],
//! [`checkpointed`](SubscriptionStatus::checkpointed),
//! [`released`](SubscriptionStatus::released),
//! [`held_elsewhere`](SubscriptionStatus::held_elsewhere)), a shard reader
//! where it stands ([`reader_positioned`](SubscriptionStatus::reader_positioned),
//! [`reader_stopped`](SubscriptionStatus::reader_stopped),
//! [`lag`](SubscriptionStatus::lag)), the plugin slot its versions — and
//! the transitions (e.g. an ended shard stays ended when its lease is
//! released) are written once, here. Updates come on lease and read events,
//! not per record, so small maps behind std mutexes (never held across an
//! `.await`) do.
//!
//! For the page's rates it also holds counter handles the stages count
//! with anyway: each shard's records read, each lane's calls, and the
//! handler outcomes per plugin version ([`VersionCounts`]: the
//! subscription's totals, or the stable and candidate versions' while a
//! canary runs). Every change of a shard's lease owner this instance sees
//! is kept in a short history ([`LeaseChange`]), the newest first.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Counter;
use crate::ids::{OwnerId, ShardId};
use crate::progress::Checkpoint;

/// Where a shard stands, as this instance sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ShardState {
    /// Leased here; the reader is opening its iterator. Not ready yet.
    #[default]
    Opening,
    /// Leased here and read.
    Reading,
    /// Its reader here stopped (lease lost, handed over, shutting down).
    Stopped,
    /// Read to its end (a closed shard): nothing more to read, ever.
    Ended,
    /// Another instance holds it (or nobody does yet).
    Elsewhere,
    /// Released here.
    Released,
}

impl fmt::Display for ShardState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShardState::Opening => "opening",
            ShardState::Reading => "reading",
            ShardState::Stopped => "stopped",
            ShardState::Ended => "ended",
            ShardState::Elsewhere => "elsewhere",
            ShardState::Released => "released",
        })
    }
}

/// A shard as the status page shows it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShardStatus {
    /// Who holds its lease (this instance's id while we read it).
    pub owner: Option<OwnerId>,
    /// The last checkpoint written or seen.
    pub checkpoint: Option<Checkpoint>,
    /// When this instance last wrote it.
    pub checkpoint_at: Option<Instant>,
    /// Where it stands.
    pub state: ShardState,
    /// How far behind the tip the last read was, in ms.
    pub behind_ms: Option<u64>,
    /// Records its readers here handed out (`shardlane_records_read_total`).
    pub records: Counter,
}

/// How many lease owner changes the page lists.
const LEASE_CHANGES_KEPT: usize = 20;

/// A change of a shard's lease owner, as this instance saw it: taken
/// here, released here, or seen moving at a sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseChange {
    /// When, in ms since the Unix epoch.
    pub at_ms: u64,
    /// The shard.
    pub shard: ShardId,
    /// Who held it before (none: nobody, or released).
    pub from: Option<OwnerId>,
    /// Who holds it now.
    pub to: Option<OwnerId>,
}

/// The outcome counters of one plugin version (or of all of them).
#[derive(Debug, Clone, Default)]
pub(crate) struct VersionCounts {
    /// Records acked.
    pub ack: Counter,
    /// Record attempts the handler asked to retry.
    pub retry: Counter,
    /// Records rejected.
    pub reject: Counter,
    /// Failed calls (trap, timeout, guest error), summed.
    pub failed: Vec<Counter>,
}

/// A version's outcomes so far, as the page reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Outcomes {
    /// Records acked.
    pub ack: u64,
    /// Record attempts retried.
    pub retry: u64,
    /// Records rejected.
    pub reject: u64,
    /// Failed calls (a failed batch call counts its records while a
    /// canary runs, once otherwise).
    pub failed: u64,
}

impl VersionCounts {
    fn read(&self) -> Outcomes {
        Outcomes {
            ack: self.ack.get(),
            retry: self.retry.get(),
            reject: self.reject.get(),
            failed: self.failed.iter().map(Counter::get).sum(),
        }
    }
}

/// A running canary, as the page shows it.
#[derive(Debug, Clone)]
pub(crate) struct CanaryView {
    /// Its digest and share of the keys, in words.
    pub describe: String,
    /// The candidate's digest.
    pub digest: String,
    /// The stable version's outcomes while the canary runs.
    pub stable: VersionCounts,
    /// The candidate's.
    pub candidate: VersionCounts,
}

/// One version's row on the page.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct VersionOutcomes {
    /// `stable` or `candidate`.
    pub role: &'static str,
    /// Its digest.
    pub digest: String,
    /// Its outcomes so far (since the canary began, while one runs).
    #[serde(flatten)]
    pub outcomes: Outcomes,
}

/// What the keeper's syncs say about the shards nobody reads.
#[derive(Debug, Default, Clone)]
pub(super) struct Coverage {
    /// How long shards may go unread, or syncs fail, before the
    /// subscription stops counting as ready; zero: never (not yet set).
    pub grace: Duration,
    /// When the last sync succeeded.
    pub last_sync: Option<Instant>,
    /// Eligible shards nobody held after the last sync.
    pub unread: usize,
    /// Since when some shard has been unread, sync after sync.
    pub unread_since: Option<Instant>,
}

impl Coverage {
    /// Why the subscription is not covered at `now`, if it is not: some
    /// shard unread for longer than the grace, or no successful sync for
    /// that long.
    pub(super) fn problem(&self, now: Instant) -> Option<String> {
        if self.grace.is_zero() {
            return None;
        }
        if let Some(since) = self.unread_since
            && now.duration_since(since) > self.grace
        {
            return Some(format!(
                "{} shard(s) read by nobody for {:?}",
                self.unread,
                now.duration_since(since)
            ));
        }
        if let Some(at) = self.last_sync
            && now.duration_since(at) > self.grace
        {
            return Some(format!(
                "no successful shard sync for {:?}",
                now.duration_since(at)
            ));
        }
        None
    }

    /// Records a sync that left `unread` shards unheld at `now`.
    pub(super) fn synced(&mut self, unread: usize, now: Instant) {
        self.last_sync = Some(now);
        self.unread = unread;
        if unread == 0 {
            self.unread_since = None;
        } else {
            self.unread_since.get_or_insert(now);
        }
    }
}

/// A shadow candidate as the status page shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ShadowView {
    /// Its digest.
    pub digest: String,
    /// Calls made again and compared.
    pub calls: u64,
    /// Calls dropped because it fell behind.
    pub dropped: u64,
    /// Calls whose outcomes differed.
    pub outcome: u64,
    /// Calls whose outputs differed.
    pub output: u64,
    /// Calls whose state writes differed.
    pub state: u64,
}

/// Entries of the fleet's version history the status page shows.
pub(crate) const HISTORY_SHOWN: usize = 10;

/// A subscription as the status page and `/readyz` see it (module docs).
#[derive(Debug, Default)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct SubscriptionStatus {
    mode: String,
    digest: Mutex<String>,
    canary: Mutex<Option<CanaryView>>,
    outcomes: Mutex<VersionCounts>,
    shards: Mutex<BTreeMap<ShardId, ShardStatus>>,
    lanes: Mutex<BTreeMap<u32, Counter>>,
    lease_changes: Mutex<VecDeque<LeaseChange>>,
    /// The latest entries of the fleet's version history, newest first.
    history: Mutex<Vec<crate::fleet_versions::Change>>,
    /// Why the fleet's versions do not run here, while they do not.
    version_problem: Mutex<Option<String>>,
    /// Why the subscription runs nothing here (it waits for its version),
    /// while it does not: not ready then.
    waiting: Mutex<Option<String>>,
    /// The shadow candidate and its counts, while one runs.
    shadow: Mutex<Option<ShadowView>>,
    /// Parked keys: how many, and the first few.
    parked: Mutex<(usize, Vec<String>)>,
    synced: AtomicBool,
    coverage: Mutex<Coverage>,
}

impl SubscriptionStatus {
    /// A subscription dispatching in `mode` (as [`crate::config::SubscriptionConfig::mode`]
    /// writes it).
    pub(crate) fn new(mode: String) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// Applies `update` to `shard`'s status, noting a change of owner
    /// (a shard first seen counts only when it is taken here).
    fn update(&self, shard: &ShardId, update: impl FnOnce(&mut ShardStatus)) {
        let mut shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        let known = shards.contains_key(shard);
        let status = shards.entry(shard.clone()).or_default();
        let before = status.owner.clone();
        update(status);
        if status.owner != before && (known || status.state == ShardState::Opening) {
            let change = LeaseChange {
                at_ms: crate::clock::now_ms(),
                shard: shard.clone(),
                from: before,
                to: status.owner.clone(),
            };
            drop(shards);
            let mut changes = self.lease_changes.lock().unwrap_or_else(|e| e.into_inner());
            changes.push_front(change);
            changes.truncate(LEASE_CHANGES_KEPT);
        }
    }

    // Facts from the lease keeper.

    /// `owner` (this instance) took the lease; its reader opens after
    /// `checkpoint`.
    pub(crate) fn lease_taken(
        &self,
        shard: &ShardId,
        owner: &OwnerId,
        checkpoint: Option<&Checkpoint>,
    ) {
        self.update(shard, |s| {
            s.owner = Some(owner.clone());
            s.checkpoint = checkpoint.cloned();
            s.state = ShardState::Opening;
        });
    }

    /// This instance wrote `checkpoint`.
    pub(crate) fn checkpointed(&self, shard: &ShardId, checkpoint: &Checkpoint) {
        self.update(shard, |s| {
            s.checkpoint = Some(checkpoint.clone());
            s.checkpoint_at = Some(Instant::now());
        });
    }

    /// This instance let the lease go (an ended shard stays ended).
    pub(crate) fn released(&self, shard: &ShardId) {
        self.update(shard, |s| {
            s.owner = None;
            if s.state != ShardState::Ended {
                s.state = ShardState::Released;
            }
        });
    }

    /// A sync saw the lease held by `owner` (or by nobody), at
    /// `checkpoint`, and this instance does not hold it.
    pub(crate) fn held_elsewhere(
        &self,
        shard: &ShardId,
        owner: Option<&OwnerId>,
        checkpoint: Option<&Checkpoint>,
    ) {
        self.update(shard, |s| {
            s.owner = owner.cloned();
            s.checkpoint = checkpoint.cloned();
            if s.state != ShardState::Ended {
                s.state = if checkpoint == Some(&Checkpoint::ShardEnd) {
                    ShardState::Ended
                } else {
                    ShardState::Elsewhere
                };
            }
        });
    }

    /// A shard sync finished, leaving `unread` eligible shards held by
    /// nobody; true when that is news (none were unread before).
    pub(crate) fn synced(&self, unread: usize, now: Instant) -> bool {
        self.synced.store(true, Ordering::Relaxed);
        let mut coverage = self.coverage.lock().unwrap_or_else(|e| e.into_inner());
        let was = coverage.unread;
        coverage.synced(unread, now);
        unread > 0 && was == 0
    }

    /// How long shards may stay unread, or syncs fail, before the
    /// subscription is not ready.
    pub(crate) fn set_coverage_grace(&self, grace: Duration) {
        self.coverage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .grace = grace;
    }

    // Facts from a shard reader.

    /// The reader opened its iterator and reads.
    pub(crate) fn reader_positioned(&self, shard: &ShardId) {
        self.update(shard, |s| s.state = ShardState::Reading);
    }

    /// The reader stopped; `ended` when it read a closed shard to its end.
    pub(crate) fn reader_stopped(&self, shard: &ShardId, ended: bool) {
        self.update(shard, |s| {
            s.state = if ended {
                ShardState::Ended
            } else {
                ShardState::Stopped
            };
            s.behind_ms = None;
        });
    }

    /// The last read was `behind_ms` behind the shard's tip.
    pub(crate) fn lag(&self, shard: &ShardId, behind_ms: u64) {
        self.update(shard, |s| s.behind_ms = Some(behind_ms));
    }

    /// The counter the shard's reader counts the records it hands out
    /// with, shown on the page as records per second.
    pub(crate) fn count_records(&self, shard: &ShardId, records: Counter) {
        self.update(shard, |s| s.records = records);
    }

    // Facts from dispatch and the plugin slot.

    /// The call counter of a lane, shown on the page.
    pub(crate) fn add_lane(&self, lane: u32, calls: Counter) {
        self.lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lane, calls);
    }

    /// The subscription's outcome counters (every version's), which the
    /// page shows for the stable version while no canary runs.
    pub(crate) fn set_outcomes(&self, counts: VersionCounts) {
        *self.outcomes.lock().unwrap_or_else(|e| e.into_inner()) = counts;
    }

    /// The versions running: the stable digest, and a canary's candidate,
    /// share of the keys and outcome counters.
    pub(crate) fn set_versions(&self, digest: String, canary: Option<CanaryView>) {
        *self.digest.lock().unwrap_or_else(|e| e.into_inner()) = digest;
        *self.canary.lock().unwrap_or_else(|e| e.into_inner()) = canary;
    }

    /// The fleet's version history as last read: the page shows the
    /// latest [`HISTORY_SHOWN`] entries.
    pub(crate) fn set_history(&self, history: &[crate::fleet_versions::Change]) {
        let latest = history.iter().rev().take(HISTORY_SHOWN).cloned().collect();
        *self.history.lock().unwrap_or_else(|e| e.into_inner()) = latest;
    }

    /// The shadow candidate and its counts (`None`: no shadow runs).
    pub(crate) fn set_shadow(&self, shadow: Option<ShadowView>) {
        *self.shadow.lock().unwrap_or_else(|e| e.into_inner()) = shadow;
    }

    /// The shadow candidate and its counts, while one runs.
    pub(crate) fn shadow(&self) -> Option<ShadowView> {
        self.shadow
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The parked keys (on_failure = "quarantine"): how many, and the
    /// first few.
    pub(crate) fn set_parked(&self, count: usize, shown: Vec<String>) {
        *self.parked.lock().unwrap_or_else(|e| e.into_inner()) = (count, shown);
    }

    /// The parked keys: how many, and the first few.
    pub(crate) fn parked(&self) -> (usize, Vec<String>) {
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Why the fleet's versions cannot run here (`None`: they do).
    pub(crate) fn set_version_problem(&self, problem: Option<String>) {
        *self
            .version_problem
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = problem;
    }

    /// The latest entries of the fleet's version history, newest first.
    pub(crate) fn history(&self) -> Vec<crate::fleet_versions::Change> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Why the fleet's versions do not run here, while they do not.
    pub(crate) fn version_problem(&self) -> Option<String> {
        self.version_problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    // What the page and /readyz read.

    /// How it dispatches.
    pub(crate) fn mode(&self) -> &str {
        &self.mode
    }

    /// The stable plugin digest.
    pub(crate) fn digest(&self) -> String {
        self.digest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The canary, in words, while one runs.
    pub(crate) fn canary(&self) -> Option<String> {
        self.canary
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|c| c.describe.clone())
    }

    /// Each running version's outcomes: the stable version's and the
    /// candidate's while a canary runs, else every record's under the
    /// stable digest.
    pub(crate) fn versions(&self) -> Vec<VersionOutcomes> {
        let digest = self.digest();
        let canary = self.canary.lock().unwrap_or_else(|e| e.into_inner());
        match canary.as_ref() {
            Some(c) => vec![
                VersionOutcomes {
                    role: "stable",
                    digest,
                    outcomes: c.stable.read(),
                },
                VersionOutcomes {
                    role: "candidate",
                    digest: c.digest.clone(),
                    outcomes: c.candidate.read(),
                },
            ],
            None => vec![VersionOutcomes {
                role: "stable",
                digest,
                outcomes: self
                    .outcomes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .read(),
            }],
        }
    }

    /// The latest lease owner changes seen, the newest first.
    pub(crate) fn lease_changes(&self) -> Vec<LeaseChange> {
        self.lease_changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Every shard seen, by id.
    pub(crate) fn shards(&self) -> Vec<(ShardId, ShardStatus)> {
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect()
    }

    /// Calls per lane.
    pub(crate) fn lanes(&self) -> Vec<(u32, u64)> {
        self.lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(lane, calls)| (*lane, calls.get()))
            .collect()
    }

    /// Marks the subscription as running nothing here and why (`None`:
    /// it runs): it waits for the fleet's version (`crate::rollout`).
    pub(crate) fn set_waiting(&self, why: Option<String>) {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Why it runs nothing here, while it does not.
    pub(crate) fn waiting(&self) -> Option<String> {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Ready: running its fleet's version, synced, every shard of the
    /// stream read by someone (see [`Coverage::problem`]), and every shard
    /// this instance reads positioned.
    pub(crate) fn ready(&self) -> bool {
        self.not_ready().is_none()
    }

    /// Why it is not ready, if it is not: the first reason of those
    /// [`Self::ready`] names.
    pub(crate) fn not_ready(&self) -> Option<String> {
        if let Some(why) = self.waiting() {
            return Some(format!("runs nothing here: {why}"));
        }
        if !self.synced.load(Ordering::Relaxed) {
            return Some("its first shard sync has not completed".to_owned());
        }
        if let Some(problem) = self
            .coverage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .problem(Instant::now())
        {
            return Some(problem);
        }
        let opening = self
            .shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|s| s.state == ShardState::Opening)
            .count();
        (opening > 0).then(|| format!("{opening} shard(s) it took are still opening"))
    }
}

#[cfg(test)]
mod tests;
