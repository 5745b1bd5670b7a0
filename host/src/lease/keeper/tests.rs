//! The keeper driven by the memory store (wrapped to be slow or to count
//! calls where a test needs it), a scripted shard list and a paused clock:
//! what it assigns, when it renews, what it stops, what it writes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Assignment, Keeper, ShardSource, StopReason, merge};
use crate::config::Config;
use crate::config::StartPosition;
use crate::ids::{
    OwnerId, PartitionKey, Position, SequenceNumber, SessionId, ShardId, StreamName,
    SubscriptionName,
};
use crate::kinesis::{KinesisError, ReadFrom, ShardInfo};
use crate::lease::StateWrite;
use crate::lease::memory::MemoryLeaseStore;
use crate::lease::{
    CheckpointRequest, Heartbeat, HeldLease, Lease, LeaseError, LeaseKey, LeaseStore, Load, Survey,
};
use crate::progress::Checkpoint;
use crate::telemetry::Telemetry;

const LEASE: Duration = Duration::from_secs(10);
const RENEW: Duration = Duration::from_secs(3);
const SYNC: Duration = Duration::from_secs(10);

/// The stream's shards as the test sets them; listing can be made slow,
/// or fail.
struct Shards {
    shards: Mutex<Vec<ShardInfo>>,
    delay: Mutex<Duration>,
    failing: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl ShardSource for Shards {
    async fn list_shards(&self, _stream: &StreamName) -> Result<Vec<ShardInfo>, KinesisError> {
        let delay = *self.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if self.failing.load(Ordering::SeqCst) {
            return Err(KinesisError::Failed("listing refused by the test".into()));
        }
        Ok(self.shards.lock().unwrap().clone())
    }
}

fn shard(id: &str, parent: Option<&str>, closed: bool) -> ShardInfo {
    ShardInfo {
        id: ShardId::from(id),
        parent: parent.map(ShardId::from),
        adjacent_parent: None,
        closed,
        hash_keys: None,
    }
}

/// The memory store, with checkpoint writes of one shard made slow and
/// renewals counted per shard.
#[derive(Default)]
struct Store {
    inner: MemoryLeaseStore,
    slow_checkpoints: Mutex<Option<(ShardId, Duration)>>,
    renewals: Mutex<Vec<ShardId>>,
    checkpoints: AtomicUsize,
    /// Checkpoint writes still to fail (the store unreachable).
    failing_checkpoints: AtomicUsize,
    /// Renewals still to fail at once (the store refusing them).
    failing_renewals: AtomicUsize,
    /// Heartbeats written (or tried).
    heartbeats: AtomicUsize,
    /// Heartbeats fail while set.
    failing_heartbeats: std::sync::atomic::AtomicBool,
    /// Each heartbeat takes this long to land.
    beat_delay: Mutex<Duration>,
}

#[async_trait]
impl LeaseStore for Store {
    async fn read_items(
        &self,
        subscription: &SubscriptionName,
        kind: crate::lease::ItemKind,
    ) -> Result<Vec<crate::lease::Item>, LeaseError> {
        self.inner.read_items(subscription, kind).await
    }

    async fn read_item(
        &self,
        subscription: &SubscriptionName,
        kind: crate::lease::ItemKind,
        key: &str,
    ) -> Result<Option<crate::lease::Item>, LeaseError> {
        self.inner.read_item(subscription, kind, key).await
    }

    async fn write_item(
        &self,
        subscription: &SubscriptionName,
        kind: crate::lease::ItemKind,
        key: &str,
        revision: u64,
        doc: String,
        fence: Option<&crate::lease::Fence>,
    ) -> Result<crate::lease::ItemWrite, LeaseError> {
        self.inner
            .write_item(subscription, kind, key, revision, doc, fence)
            .await
    }

    async fn delete_item(
        &self,
        subscription: &SubscriptionName,
        kind: crate::lease::ItemKind,
        key: &str,
        revision: u64,
    ) -> Result<bool, LeaseError> {
        self.inner
            .delete_item(subscription, kind, key, revision)
            .await
    }

    async fn read_doc(
        &self,
        subscription: &SubscriptionName,
        kind: crate::lease::DocKind,
    ) -> Result<Option<String>, LeaseError> {
        self.inner.read_doc(subscription, kind).await
    }

    async fn write_doc(
        &self,
        subscription: &SubscriptionName,
        kind: crate::lease::DocKind,
        revision: u64,
        doc: String,
    ) -> Result<bool, LeaseError> {
        self.inner
            .write_doc(subscription, kind, revision, doc)
            .await
    }

    async fn survey(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
    ) -> Result<Survey, LeaseError> {
        self.inner.survey(subscription, stream).await
    }

    async fn heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        load: &Load,
    ) -> Result<Heartbeat, LeaseError> {
        self.heartbeats.fetch_add(1, Ordering::SeqCst);
        let delay = *self.beat_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if self.failing_heartbeats.load(Ordering::SeqCst) {
            return Err(LeaseError::Store("scripted outage".into()));
        }
        self.inner
            .heartbeat(subscription, stream, owner, load)
            .await
    }

    async fn retire_heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        counter: u64,
    ) -> Result<(), LeaseError> {
        self.inner
            .retire_heartbeat(subscription, stream, owner, counter)
            .await
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
        self.inner.read(key).await
    }

    async fn acquire(
        &self,
        key: &LeaseKey,
        owner: &OwnerId,
        seen: Option<&Lease>,
    ) -> Result<HeldLease, LeaseError> {
        self.inner.acquire(key, owner, seen).await
    }

    async fn renew(&self, held: &HeldLease) -> Result<HeldLease, LeaseError> {
        self.renewals.lock().unwrap().push(held.key.shard.clone());
        if self
            .failing_renewals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(LeaseError::Store("scripted refusal".into()));
        }
        self.inner.renew(held).await
    }

    async fn request_handoff(&self, seen: &Lease, to: &OwnerId) -> Result<(), LeaseError> {
        self.inner.request_handoff(seen, to).await
    }

    async fn checkpoint(
        &self,
        held: &HeldLease,
        checkpoint: &Checkpoint,
        state: &[StateWrite],
    ) -> Result<HeldLease, LeaseError> {
        let slow = self.slow_checkpoints.lock().unwrap().clone();
        if let Some((shard, delay)) = slow
            && shard == held.key.shard
        {
            tokio::time::sleep(delay).await;
        }
        if self
            .failing_checkpoints
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(LeaseError::Store("scripted outage".into()));
        }
        self.checkpoints.fetch_add(1, Ordering::SeqCst);
        self.inner.checkpoint(held, checkpoint, state).await
    }

    async fn load_state(
        &self,
        subscription: &SubscriptionName,
        key: &PartitionKey,
    ) -> Result<Option<Vec<u8>>, LeaseError> {
        self.inner.load_state(subscription, key).await
    }

    async fn release(&self, held: &HeldLease) -> Result<(), LeaseError> {
        self.inner.release(held).await
    }
}

impl Store {
    fn renewals_of(&self, shard: &str) -> usize {
        self.renewals
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.as_str() == shard)
            .count()
    }
}

fn key(shard: &str) -> LeaseKey {
    LeaseKey {
        subscription: SubscriptionName::from("s"),
        stream: StreamName::from("orders"),
        shard: ShardId::from(shard),
    }
}

fn seq(n: u64) -> Checkpoint {
    Checkpoint::At(Position::whole(
        SequenceNumber::parse(&n.to_string()).unwrap(),
    ))
}

/// A running keeper and the ends of its channels.
struct Rig {
    store: Arc<Store>,
    shards: Arc<Shards>,
    assignments: mpsc::Receiver<Assignment>,
    checkpoints: Option<mpsc::Sender<CheckpointRequest>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

const ME: &str = "me";

fn start(store: Arc<Store>, shards: Vec<ShardInfo>) -> Rig {
    let config = Config::parse(
        &format!(
            "[lease]\nstore = \"memory\"\nlease_duration = \"{}s\"\nrenew_every = \"{}s\"\nshard_sync_every = \"{}s\"\n\n[[subscription]]\nname = \"s\"\nstream = \"orders\"\nplugin = \"p.wasm\"\n",
            LEASE.as_secs(),
            RENEW.as_secs(),
            SYNC.as_secs()
        ),
        std::path::Path::new("test.toml"),
    )
    .unwrap();
    let telemetry = Telemetry::new();
    let sub = Arc::new(config.subscriptions[0].clone());
    let status = telemetry.subscription(&sub.name, sub.mode());
    let shards = Arc::new(Shards {
        shards: Mutex::new(shards),
        delay: Mutex::new(Duration::ZERO),
        failing: std::sync::atomic::AtomicBool::new(false),
    });
    let keeper = Keeper::new(
        sub,
        config.lease.clone(),
        OwnerId::from(ME),
        store.clone(),
        shards.clone(),
        status,
        telemetry,
    );
    let (assign_tx, assignments) = mpsc::channel(4);
    let (ck_tx, ck_rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let task = tokio::spawn(keeper.run(assign_tx, ck_rx, stop.clone()));
    Rig {
        store,
        shards,
        assignments,
        checkpoints: Some(ck_tx),
        stop,
        task,
    }
}

impl Rig {
    /// The next assignment, within `within` (of paused time).
    async fn next(&mut self, within: Duration) -> Option<Assignment> {
        tokio::time::timeout(within, self.assignments.recv())
            .await
            .ok()
            .flatten()
    }

    async fn lease(&self, shard: &str) -> Lease {
        self.store.read(&key(shard)).await.unwrap().unwrap()
    }

    async fn request(
        &self,
        shard: &str,
        session: SessionId,
        checkpoint: Checkpoint,
        drained: bool,
    ) {
        self.checkpoints
            .as_ref()
            .unwrap()
            .send(CheckpointRequest {
                shard: ShardId::from(shard),
                session,
                checkpoint: Some(checkpoint),
                drained,
            })
            .await
            .unwrap();
    }
}

/// A lease left by an earlier owner at `checkpoint`, free now.
async fn left_at(store: &Store, shard: &str, checkpoint: Checkpoint) {
    let other = OwnerId::from("earlier");
    let held = store.acquire(&key(shard), &other, None).await.unwrap();
    let held = store.checkpoint(&held, &checkpoint, &[]).await.unwrap();
    store.release(&held).await.unwrap();
}

fn read_of(
    a: Option<Assignment>,
) -> (
    ShardId,
    SessionId,
    ReadFrom,
    tokio::sync::watch::Receiver<Instant>,
) {
    match a {
        Some(Assignment::Read {
            shard,
            session,
            from,
            valid_until,
            ..
        }) => (shard, session, from, valid_until),
        other => panic!("expected a read assignment, got {other:?}"),
    }
}

/// Catches: a shard read from its start instead of its checkpoint (records
/// handled twice), a free shard left unread, or a read assigned without
/// the lease being taken in the store.
#[tokio::test(start_paused = true)]
async fn takes_every_free_shard_and_assigns_it_from_its_checkpoint() {
    let store = Arc::new(Store::default());
    left_at(&store, "s1", seq(42)).await;
    let mut rig = start(
        store,
        vec![shard("s0", None, false), shard("s1", None, false)],
    );
    let mut reads = [
        read_of(rig.next(Duration::from_secs(1)).await),
        read_of(rig.next(Duration::from_secs(1)).await),
    ];
    reads.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(reads[0].0, ShardId::from("s0"));
    assert_eq!(reads[0].2, ReadFrom::Start(StartPosition::Latest));
    assert_eq!(reads[1].0, ShardId::from("s1"));
    assert_eq!(
        reads[1].2,
        ReadFrom::After(Position::whole(SequenceNumber::parse("42").unwrap()))
    );
    assert_ne!(reads[0].1, reads[1].1, "each taking is its own session");
    for s in ["s0", "s1"] {
        assert_eq!(rig.lease(s).await.owner, Some(OwnerId::from(ME)));
    }
}

/// Catches: a sync that gives up when the shard listing fails (Kinesis
/// slow or refusing ListShards), so a lease freed meanwhile stays unread
/// although the store answers: the sync plans with the last listing.
#[tokio::test(start_paused = true)]
async fn a_failed_listing_plans_with_the_last_one() {
    let store = Arc::new(Store::default());
    let other = OwnerId::from("other");
    store.acquire(&key("s1"), &other, None).await.unwrap();
    let mut rig = start(
        store.clone(),
        vec![shard("s0", None, false), shard("s1", None, false)],
    );
    let (first, ..) = read_of(rig.next(Duration::from_secs(1)).await);
    assert_eq!(first, ShardId::from("s0"));
    rig.shards.failing.store(true, Ordering::SeqCst);
    // Whatever the planner made of "other" (an ask, or nothing), its lease
    // is free once released; only a sync can find that.
    let theirs = store.read(&key("s1")).await.unwrap().unwrap();
    let held = HeldLease {
        key: key("s1"),
        owner: other,
        counter: theirs.counter,
        checkpoint: theirs.checkpoint,
        handoff: theirs.handoff,
    };
    store.release(&held).await.unwrap();
    let (second, ..) = read_of(rig.next(SYNC * 3).await);
    assert_eq!(second, ShardId::from("s1"));
    assert_eq!(rig.lease("s1").await.owner, Some(OwnerId::from(ME)));
}

/// Catches: heartbeats that do not happen on their timer (every lease
/// lapses and another instance takes them), a validity deadline they do
/// not move (the readers stall after one lease duration), or leases still
/// written one by one while nothing changes (a write per shard per
/// renewal, the cost heartbeats remove).
#[tokio::test(start_paused = true)]
async fn heartbeats_move_every_lease_and_write_none_of_them() {
    let mut rig = start(
        Arc::new(Store::default()),
        vec![shard("s0", None, false), shard("s1", None, false)],
    );
    let mut valid = Vec::new();
    for _ in 0..2 {
        let (_, _, _, v) = read_of(rig.next(Duration::from_secs(1)).await);
        valid.push(v);
    }
    let first: Vec<Instant> = valid.iter_mut().map(|v| *v.borrow_and_update()).collect();
    let counters = (rig.lease("s0").await.counter, rig.lease("s1").await.counter);
    let beats = rig.store.heartbeats.load(Ordering::SeqCst);
    tokio::time::sleep(RENEW * 3 + Duration::from_millis(100)).await;
    assert_eq!(rig.store.heartbeats.load(Ordering::SeqCst) - beats, 3);
    assert_eq!(rig.store.renewals_of("s0") + rig.store.renewals_of("s1"), 0);
    assert_eq!(
        (rig.lease("s0").await.counter, rig.lease("s1").await.counter),
        counters,
        "no lease written"
    );
    for (v, first) in valid.iter_mut().zip(first) {
        let now = *v.borrow_and_update();
        assert!(now >= first + RENEW * 3, "{:?}", now - first);
    }
}

/// Catches: a heartbeat retried at once in a loop when the store fails,
/// or leases kept past their validity while no heartbeat lands.
#[tokio::test(start_paused = true)]
async fn failed_heartbeats_back_off_and_every_lease_is_lost_at_once() {
    let store = Arc::new(Store::default());
    let mut rig = start(
        store.clone(),
        vec![shard("s0", None, false), shard("s1", None, false)],
    );
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (shard, session, _, _) = read_of(rig.next(Duration::from_secs(1)).await);
        sessions.push((shard, session));
    }
    store.failing_heartbeats.store(true, Ordering::SeqCst);
    let beats = store.heartbeats.load(Ordering::SeqCst);
    // Every heartbeat fails from 3 s on: tried again after 0.1–0.2,
    // 0.2–0.4, 0.4–0.8, 0.8–1.6, 1.5–3 s…, never at once.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let tries = store.heartbeats.load(Ordering::SeqCst) - beats;
    assert!(
        (3..=7).contains(&tries),
        "{tries} heartbeats in 3 s of failures"
    );
    // The last one landed at 0: past 10 s (at the first heartbeat that
    // fails after it, within `renew_every`), both leases go, together.
    let mut stopped = Vec::new();
    for _ in 0..2 {
        match rig.next(Duration::from_secs(8)).await {
            Some(Assignment::Stop { shard, why, .. }) => {
                assert_eq!(why, StopReason::Lost);
                stopped.push(shard);
            }
            other => panic!("expected a stop, got {other:?}"),
        }
    }
    stopped.sort();
    assert_eq!(stopped, vec![ShardId::from("s0"), ShardId::from("s1")]);
    assert_eq!(store.renewals_of("s0") + store.renewals_of("s1"), 0);
}

/// Catches: an instance that resumes after a pause longer than a lease
/// duration and goes on with leases taken meanwhile — the heartbeat that
/// lands after the pause says it is alive, not that its leases are still
/// its own; and a checkpoint of the paused session written over the new
/// owner's.
#[tokio::test(start_paused = true)]
async fn after_a_pause_lapsed_leases_are_verified_one_by_one() {
    let store = Arc::new(Store::default());
    let mut rig = start(
        store.clone(),
        vec![shard("s0", None, false), shard("s1", None, false)],
    );
    let mut sessions = std::collections::HashMap::new();
    for _ in 0..2 {
        let (shard, session, _, _) = read_of(rig.next(Duration::from_secs(1)).await);
        sessions.insert(shard, session);
    }
    // From the tick at 3 s, the heartbeat takes 9.5 s to land (a stalled
    // process, a frozen VM): our leases lapse at 10 s.
    *store.beat_delay.lock().unwrap() = Duration::from_millis(9_500);
    tokio::time::sleep(Duration::from_secs(11)).await;
    // Another instance saw our heartbeat stand still, took s0 and
    // checkpointed past where we are.
    let seen = rig.lease("s0").await;
    let thief = store
        .acquire(&key("s0"), &OwnerId::from("thief"), Some(&seen))
        .await
        .unwrap();
    store.checkpoint(&thief, &seq(10), &[]).await.unwrap();
    *store.beat_delay.lock().unwrap() = Duration::ZERO;
    // Our paused session asks for its checkpoint 5.
    rig.request("s0", sessions[&ShardId::from("s0")], seq(5), false)
        .await;
    // The heartbeat lands at 12.5 s, after the leases lapsed: each is
    // renewed on its own, conditionally; s0 is found taken.
    match rig.next(Duration::from_secs(5)).await {
        Some(Assignment::Stop { shard, why, .. }) => {
            assert_eq!(shard, ShardId::from("s0"));
            assert_eq!(why, StopReason::Lost);
        }
        other => panic!("expected s0 stopped, got {other:?}"),
    }
    // Past the heartbeat's landing at 12.5 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s0 = rig.lease("s0").await;
    assert_eq!(s0.owner, Some(OwnerId::from("thief")));
    assert_eq!(
        s0.checkpoint,
        Some(seq(10)),
        "nothing of ours written over it"
    );
    assert!(store.renewals_of("s1") >= 1, "s1 verified by a renewal");
    assert_eq!(
        rig.lease("s1").await.owner,
        Some(OwnerId::from(ME)),
        "and kept"
    );
}

/// Catches: a reader that keeps handing out records of a shard another
/// instance took.
#[tokio::test(start_paused = true)]
async fn a_lease_taken_by_another_instance_stops_its_reader_at_the_next_sync() {
    let mut rig = start(Arc::new(Store::default()), vec![shard("s0", None, false)]);
    let (_, session, _, mut valid_until) = read_of(rig.next(Duration::from_secs(1)).await);
    let seen = rig.lease("s0").await;
    rig.store
        .acquire(&key("s0"), &OwnerId::from("thief"), Some(&seen))
        .await
        .unwrap();
    match rig.next(SYNC + Duration::from_secs(1)).await {
        Some(Assignment::Stop {
            shard,
            session: stopped,
            why,
        }) => {
            assert_eq!(shard, ShardId::from("s0"));
            assert_eq!(stopped, session);
            assert_eq!(why, StopReason::Lost);
        }
        other => panic!("expected a stop, got {other:?}"),
    }
    // The validity channel closes with the lease (after any extension
    // not yet seen).
    tokio::time::timeout(LEASE, async {
        while valid_until.changed().await.is_ok() {}
    })
    .await
    .expect("the validity channel closes");
    assert_eq!(rig.lease("s0").await.owner, Some(OwnerId::from("thief")));
}

/// Catches: a hand-over that releases before the in-flight records settled
/// (the next owner would read them again), or never releases, or releases
/// without leaving the lease to the instance that asked.
#[tokio::test(start_paused = true)]
async fn a_hand_over_stops_the_reader_and_releases_after_the_drained_checkpoint() {
    let mut rig = start(Arc::new(Store::default()), vec![shard("s0", None, false)]);
    let (_, session, _, _) = read_of(rig.next(Duration::from_secs(1)).await);
    let seen = rig.lease("s0").await;
    rig.store
        .request_handoff(&seen, &OwnerId::from("asker"))
        .await
        .unwrap();
    match rig.next(SYNC + Duration::from_secs(1)).await {
        Some(Assignment::Stop { why, .. }) => assert_eq!(why, StopReason::HandOver),
        other => panic!("expected a stop, got {other:?}"),
    }
    // Still ours until what was handed out has settled.
    tokio::time::sleep(RENEW).await;
    assert_eq!(rig.lease("s0").await.owner, Some(OwnerId::from(ME)));
    rig.request("s0", session, seq(7), true).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let lease = rig.lease("s0").await;
    assert_eq!(lease.owner, None, "released once drained");
    assert_eq!(lease.checkpoint, Some(seq(7)), "after its final checkpoint");
    assert_eq!(
        lease.handoff,
        Some(OwnerId::from("asker")),
        "reserved for the asker"
    );
}

/// Catches: heartbeats queued behind a slow store call of a shard or
/// behind a slow shard listing (every lease would lapse together).
#[tokio::test(start_paused = true)]
async fn heartbeats_never_wait_behind_a_slow_checkpoint_or_a_slow_sync() {
    let store = Arc::new(Store::default());
    *store.slow_checkpoints.lock().unwrap() = Some((ShardId::from("s0"), Duration::from_secs(60)));
    let mut rig = start(
        store,
        vec![shard("s0", None, false), shard("s1", None, false)],
    );
    let mut sessions = std::collections::HashMap::new();
    let mut valid = std::collections::HashMap::new();
    for _ in 0..2 {
        let (shard, session, _, v) = read_of(rig.next(Duration::from_secs(1)).await);
        sessions.insert(shard.clone(), session);
        valid.insert(shard, v);
    }
    *rig.shards.delay.lock().unwrap() = Duration::from_secs(60);
    rig.request("s0", sessions[&ShardId::from("s0")], seq(5), false)
        .await;
    let before = rig.store.heartbeats.load(Ordering::SeqCst);
    tokio::time::sleep(RENEW * 5 + Duration::from_millis(100)).await;
    assert_eq!(
        rig.store.heartbeats.load(Ordering::SeqCst) - before,
        5,
        "a heartbeat on every tick while s0's checkpoint and a sync hang"
    );
    assert!(*valid[&ShardId::from("s1")].borrow() > Instant::now());
    assert_eq!(rig.lease("s1").await.owner, Some(OwnerId::from(ME)));
}

/// Catches: a shutdown that releases leases before their final
/// checkpoints (records read again by the next owner), or never ends.
#[tokio::test(start_paused = true)]
async fn shutdown_closes_assignments_writes_final_checkpoints_and_releases() {
    let mut rig = start(
        Arc::new(Store::default()),
        vec![shard("s0", None, false), shard("s1", None, false)],
    );
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (shard, session, _, _) = read_of(rig.next(Duration::from_secs(1)).await);
        sessions.push((shard, session));
    }
    rig.stop.cancel();
    assert!(
        rig.next(Duration::from_secs(1)).await.is_none(),
        "the assignment channel closes: every reader stops"
    );
    for (i, (shard, session)) in sessions.iter().enumerate() {
        rig.request(shard.as_str(), *session, seq(100 + i as u64), true)
            .await;
    }
    drop(rig.checkpoints.take());
    tokio::time::timeout(Duration::from_secs(30), rig.task)
        .await
        .expect("the keeper ends once settlement's requests end")
        .unwrap();
    for (i, (shard, _)) in sessions.iter().enumerate() {
        let lease = rig.store.read(&key(shard.as_str())).await.unwrap().unwrap();
        assert_eq!(lease.owner, None);
        assert_eq!(lease.checkpoint, Some(seq(100 + i as u64)));
    }
}

/// Catches: a shutdown that releases a lease whose final checkpoint
/// failed once (its records read again by the next owner) instead of
/// trying it again.
#[tokio::test(start_paused = true)]
async fn at_shutdown_a_final_checkpoint_that_failed_is_tried_again_before_release() {
    let store = Arc::new(Store::default());
    let mut rig = start(store.clone(), vec![shard("s0", None, false)]);
    let (_, session, _, _) = read_of(rig.next(Duration::from_secs(1)).await);
    store.failing_checkpoints.store(2, Ordering::SeqCst);
    rig.stop.cancel();
    assert!(rig.next(Duration::from_secs(1)).await.is_none());
    rig.request("s0", session, seq(9), true).await;
    drop(rig.checkpoints.take());
    tokio::time::timeout(Duration::from_secs(30), rig.task)
        .await
        .expect("the keeper ends once the final checkpoint is written")
        .unwrap();
    let lease = rig.store.read(&key("s0")).await.unwrap().unwrap();
    assert_eq!(lease.checkpoint, Some(seq(9)), "written at the third try");
    assert_eq!(lease.owner, None, "then released");
}

/// Catches: a reader that stopped on its own (not told to) leaving its
/// lease held and its shard read by nobody.
#[tokio::test(start_paused = true)]
async fn a_reader_that_stopped_on_its_own_has_its_lease_released_and_taken_again() {
    let mut rig = start(Arc::new(Store::default()), vec![shard("s0", None, false)]);
    let (_, session, _, _) = read_of(rig.next(Duration::from_secs(1)).await);
    rig.request("s0", session, seq(5), true).await;
    let (shard, again, from, _) = read_of(rig.next(SYNC * 2).await);
    assert_eq!(shard, ShardId::from("s0"));
    assert_ne!(again, session, "a new session");
    assert_eq!(
        from,
        ReadFrom::After(Position::whole(SequenceNumber::parse("5").unwrap()))
    );
}

/// Catches: a child shard read before its parent ended (per-key order
/// broken across a reshard), or read from `latest` (records between the
/// parent's end and the child's start skipped).
#[tokio::test(start_paused = true)]
async fn a_child_waits_for_its_parent_and_starts_at_its_beginning() {
    let mut rig = start(
        Arc::new(Store::default()),
        vec![
            shard("parent", None, true),
            shard("child", Some("parent"), false),
        ],
    );
    let (shard_id, session, _, _) = read_of(rig.next(Duration::from_secs(1)).await);
    assert_eq!(shard_id, ShardId::from("parent"));
    assert!(
        rig.next(SYNC + Duration::from_secs(1)).await.is_none(),
        "the child waits"
    );
    rig.request("parent", session, Checkpoint::ShardEnd, false)
        .await;
    let (child, _, from, _) = read_of(rig.next(SYNC * 2).await);
    assert_eq!(child, ShardId::from("child"));
    assert_eq!(from, ReadFrom::Start(StartPosition::TrimHorizon));
    assert_eq!(
        rig.lease("parent").await.owner,
        None,
        "an ended shard is released"
    );
}

fn merge_request(checkpoint: Option<&str>, drained: bool) -> CheckpointRequest {
    CheckpointRequest {
        shard: "s".into(),
        session: SessionId(3),
        checkpoint: checkpoint.map(|c| Checkpoint::parse(c).unwrap()),
        drained,
    }
}

#[test]
fn a_newer_request_covers_an_older_one_and_drained_stays() {
    assert_eq!(
        merge(None, merge_request(Some("5"), false)),
        merge_request(Some("5"), false)
    );
    assert_eq!(
        merge(
            Some(merge_request(Some("5"), true)),
            merge_request(Some("9"), false)
        ),
        merge_request(Some("9"), true),
        "a drained request is never lost behind a newer one"
    );
    assert_eq!(
        merge(
            Some(merge_request(Some("5"), false)),
            merge_request(None, true)
        ),
        merge_request(Some("5"), true),
        "drained with nothing new keeps the checkpoint still to write"
    );
}
