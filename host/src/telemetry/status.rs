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

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Counter;
use crate::ids::{OwnerId, ShardId};
use crate::lease::Checkpoint;

/// Where a shard stands, as this instance sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardState {
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
pub struct ShardStatus {
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

/// A subscription as the status page and `/readyz` see it (module docs).
#[derive(Debug, Default)]
pub struct SubscriptionStatus {
    mode: String,
    digest: Mutex<String>,
    canary: Mutex<Option<String>>,
    shards: Mutex<BTreeMap<ShardId, ShardStatus>>,
    lanes: Mutex<BTreeMap<u32, Counter>>,
    synced: AtomicBool,
    coverage: Mutex<Coverage>,
}

impl SubscriptionStatus {
    /// A subscription dispatching in `mode` (as [`crate::config::SubscriptionConfig::mode`]
    /// writes it).
    pub fn new(mode: String) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    fn update(&self, shard: &ShardId, update: impl FnOnce(&mut ShardStatus)) {
        let mut shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        update(shards.entry(shard.clone()).or_default());
    }

    // Facts from the lease keeper.

    /// `owner` (this instance) took the lease; its reader opens after
    /// `checkpoint`.
    pub fn lease_taken(&self, shard: &ShardId, owner: &OwnerId, checkpoint: Option<&Checkpoint>) {
        self.update(shard, |s| {
            s.owner = Some(owner.clone());
            s.checkpoint = checkpoint.cloned();
            s.state = ShardState::Opening;
        });
    }

    /// This instance wrote `checkpoint`.
    pub fn checkpointed(&self, shard: &ShardId, checkpoint: &Checkpoint) {
        self.update(shard, |s| {
            s.checkpoint = Some(checkpoint.clone());
            s.checkpoint_at = Some(Instant::now());
        });
    }

    /// This instance let the lease go (an ended shard stays ended).
    pub fn released(&self, shard: &ShardId) {
        self.update(shard, |s| {
            s.owner = None;
            if s.state != ShardState::Ended {
                s.state = ShardState::Released;
            }
        });
    }

    /// A sync saw the lease held by `owner` (or by nobody), at
    /// `checkpoint`, and this instance does not hold it.
    pub fn held_elsewhere(
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
    pub fn synced(&self, unread: usize, now: Instant) -> bool {
        self.synced.store(true, Ordering::Relaxed);
        let mut coverage = self.coverage.lock().unwrap_or_else(|e| e.into_inner());
        let was = coverage.unread;
        coverage.synced(unread, now);
        unread > 0 && was == 0
    }

    /// How long shards may stay unread, or syncs fail, before the
    /// subscription is not ready.
    pub fn set_coverage_grace(&self, grace: Duration) {
        self.coverage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .grace = grace;
    }

    // Facts from a shard reader.

    /// The reader opened its iterator and reads.
    pub fn reader_positioned(&self, shard: &ShardId) {
        self.update(shard, |s| s.state = ShardState::Reading);
    }

    /// The reader stopped; `ended` when it read a closed shard to its end.
    pub fn reader_stopped(&self, shard: &ShardId, ended: bool) {
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
    pub fn lag(&self, shard: &ShardId, behind_ms: u64) {
        self.update(shard, |s| s.behind_ms = Some(behind_ms));
    }

    // Facts from dispatch and the plugin slot.

    /// The call counter of a lane, shown on the page.
    pub fn add_lane(&self, lane: u32, calls: Counter) {
        self.lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lane, calls);
    }

    /// The versions running: the stable digest, and a canary's candidate
    /// and share of the keys.
    pub fn set_versions(&self, digest: String, canary: Option<String>) {
        *self.digest.lock().unwrap_or_else(|e| e.into_inner()) = digest;
        *self.canary.lock().unwrap_or_else(|e| e.into_inner()) = canary;
    }

    // What the page and /readyz read.

    /// How it dispatches.
    pub fn mode(&self) -> &str {
        &self.mode
    }

    /// The stable plugin digest.
    pub fn digest(&self) -> String {
        self.digest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The canary, while one runs.
    pub fn canary(&self) -> Option<String> {
        self.canary
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every shard seen, by id.
    pub fn shards(&self) -> Vec<(ShardId, ShardStatus)> {
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect()
    }

    /// Calls per lane.
    pub fn lanes(&self) -> Vec<(u32, u64)> {
        self.lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(lane, calls)| (*lane, calls.get()))
            .collect()
    }

    /// Ready: synced, every shard of the stream read by someone (see
    /// [`Coverage::problem`]), and every shard this instance reads
    /// positioned.
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
            && self
                .coverage
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .problem(Instant::now())
                .is_none()
            && self
                .shards
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .all(|s| s.state != ShardState::Opening)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_fails_only_past_the_grace() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let mut c = Coverage::default();
        assert_eq!(c.problem(s(100)), None, "no grace set: no verdict");
        c.grace = Duration::from_secs(5);
        c.synced(0, t0);
        assert_eq!(c.problem(s(4)), None);
        c.synced(2, s(4));
        assert_eq!(c.problem(s(8)), None, "unread, within the grace");
        c.synced(1, s(8));
        let problem = c.problem(s(10)).expect("unread since 4 s, for 6 s");
        assert!(problem.contains("1 shard(s) read by nobody"), "{problem}");
        c.synced(0, s(10));
        assert_eq!(c.problem(s(11)), None, "read again");
        let stale = c.problem(s(16)).expect("no sync for 6 s");
        assert!(stale.contains("no successful shard sync"), "{stale}");
    }

    #[test]
    fn a_subscription_with_shards_nobody_reads_is_not_ready() {
        let status = SubscriptionStatus::new("sequential".into());
        status.set_coverage_grace(Duration::from_secs(1));
        assert!(!status.synced(0, Instant::now()));
        assert!(status.ready());
        assert!(
            status.synced(2, Instant::now() - Duration::from_secs(2)),
            "newly unread"
        );
        assert!(!status.ready());
    }

    #[test]
    fn readiness_needs_a_sync_and_positioned_readers() {
        let s = SubscriptionStatus::new("sequential".into());
        let shard = ShardId::from("shard-0");
        assert!(!s.ready(), "no sync yet");
        s.synced(0, Instant::now());
        s.lease_taken(&shard, &OwnerId::from("me"), None);
        assert!(!s.ready(), "a reader still opening");
        s.reader_positioned(&shard);
        assert!(s.ready());
    }

    #[test]
    fn an_ended_shard_stays_ended_when_released_or_seen_again() {
        let s = SubscriptionStatus::new("sequential".into());
        let shard = ShardId::from("shard-0");
        s.lease_taken(&shard, &OwnerId::from("me"), None);
        s.reader_stopped(&shard, true);
        s.released(&shard);
        s.held_elsewhere(&shard, None, None);
        let (_, status) = s.shards().pop().unwrap();
        assert_eq!(status.state, ShardState::Ended);
        assert_eq!(status.owner, None);
        let other = ShardId::from("shard-1");
        s.lease_taken(&other, &OwnerId::from("me"), None);
        s.reader_stopped(&other, false);
        s.released(&other);
        assert_eq!(s.shards()[1].1.state, ShardState::Released);
        s.held_elsewhere(
            &other,
            Some(&OwnerId::from("them")),
            Some(&Checkpoint::ShardEnd),
        );
        assert_eq!(s.shards()[1].1.state, ShardState::Ended);
    }
}
