//! The plugin slot with real plugins (the test guests, compiled by the
//! engine as the service compiles them): versions set and compiled,
//! refusals, the file watcher's reports, and a canary's slice. No stream: lanes are stood in for by calling
//! the slot's handlers directly.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::dispatch::{Handler, HandlerFactory};
use crate::ids::{LaneId, PartitionKey};
use crate::telemetry::Telemetry;
use crate::tests::delivery;

/// What a slot installs.
fn installed(
    stable: Arc<Plugin>,
    canary: Option<(Arc<Plugin>, KeySlice, u64)>,
    shadow: Option<(Arc<Plugin>, u64)>,
) -> Installed {
    Installed {
        stable,
        canary,
        shadow,
    }
}

/// The test guests' bytes.
fn guest(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// A slot running `noop`, loaded from a file in a fresh folder (kept
/// alive by the returned guard).
fn slot() -> (
    Arc<PluginSlot>,
    tempfile::TempDir,
    shardlane_testkit::guests::Guests,
) {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugin.wasm");
    std::fs::copy(&guests.noop, &path).unwrap();
    let sandbox = crate::tests::subscription("").sandbox.clone();
    let host = PluginHost::new(sandbox.max_memory, 100, false).unwrap();
    let plugin = host
        .load(&path, "s".into(), Duration::from_secs(5), sandbox.clone())
        .unwrap();
    let telemetry = Telemetry::new();
    let status = telemetry.subscription(&"s".into(), "sequential".into());
    let slot = PluginSlot::new(
        host,
        plugin,
        Duration::from_secs(5),
        sandbox,
        status,
        telemetry,
    );
    (Arc::new(slot), dir, guests)
}

/// Catches a change that does not reach the lanes (the generation must
/// move so each lane drops its instance) or that "changes" to the
/// versions already running.
#[tokio::test]
async fn setting_new_versions_reaches_the_lanes_and_the_same_ones_change_nothing() {
    let (slot, _dir, guests) = slot();
    let before = slot.generation();
    let retry = guest(&guests.retry);
    let plugin = slot.prepare(retry.clone(), "test").await.unwrap();
    assert_eq!(slot.generation(), before, "preparing installs nothing");
    slot.set(
        installed(plugin.clone(), None, None),
        "test",
        Instant::now(),
    )
    .await;
    assert_eq!(slot.current().digest(), &PluginDigest::of(&retry));
    assert!(slot.generation() > before, "lanes see the change");
    let generation = slot.generation();
    slot.set(installed(plugin, None, None), "test", Instant::now())
        .await;
    assert_eq!(slot.generation(), generation);
}

/// Catches a slot that accepts what it could not use: bytes that are no
/// plugin, or a plugin of another world (a lane would then call an export
/// that is not there).
#[tokio::test]
async fn a_version_that_fails_to_compile_or_changes_world_is_refused() {
    let (slot, _dir, guests) = slot();
    assert!(slot.prepare(b"not wasm".to_vec(), "test").await.is_err());
    assert!(
        slot.prepare(guest(&guests.noop_batch), "test")
            .await
            .is_err(),
        "a batch-handler cannot replace a record-handler"
    );
}

/// Catches a canary that sends the wrong keys to the candidate, one that
/// loses its counters when the same canary is set again, and a promotion
/// or rollback that keeps the wrong version.
#[tokio::test]
async fn a_canary_sends_its_slice_to_the_candidate_until_promoted_or_rolled_back() {
    let (slot, _dir, guests) = slot();
    let stable = slot.current();
    let retry = guest(&guests.retry);
    let candidate = slot.prepare(retry.clone(), "test").await.unwrap();
    let slice = KeySlice::new(0.5).unwrap();
    slot.set(
        installed(stable.clone(), Some((candidate.clone(), slice, 7)), None),
        "test",
        Instant::now(),
    )
    .await;
    let generation = slot.generation();
    slot.set(
        installed(stable.clone(), Some((candidate.clone(), slice, 7)), None),
        "test",
        Instant::now(),
    )
    .await;
    assert_eq!(
        slot.generation(),
        generation,
        "the same canary again is no change"
    );
    let handler = slot.create(LaneId(0)).await.unwrap();
    for i in 0..50 {
        let key = format!("key-{i}");
        let d = delivery(&key, i);
        let expected = if slice.contains(&PartitionKey::new(key.as_str())) {
            candidate.digest()
        } else {
            stable.digest()
        };
        assert_eq!(handler.version(&d.record).as_ref(), Some(expected), "{key}");
    }
    let counts = slot.canary_counts().unwrap();
    assert_eq!(counts.rollout, 7, "counts carry their canary's identity");
    // The same bytes and slice as another canary (deployed again): a new
    // canary, not the same one.
    slot.set(
        installed(stable.clone(), Some((candidate.clone(), slice, 9)), None),
        "test",
        Instant::now(),
    )
    .await;
    assert!(slot.generation() > generation, "another canary is a change");
    assert_eq!(slot.canary_counts().unwrap().rollout, 9);
    slot.set(
        installed(stable.clone(), None, None),
        "rollback",
        Instant::now(),
    )
    .await;
    assert_eq!(slot.current().digest(), stable.digest());
    assert!(slot.canary_counts().is_none());
    slot.set(
        installed(candidate.clone(), None, None),
        "promote",
        Instant::now(),
    )
    .await;
    assert_eq!(slot.current().digest(), candidate.digest());
}

/// Catches a watcher that misses a new version written to the plugin
/// file (as a deploy renames one in place), or that reports a file it
/// cannot read, or the running version's own bytes, as a change.
#[tokio::test]
async fn a_new_file_is_reported_and_an_unreadable_one_is_not() {
    let (slot, dir, guests) = slot();
    let stop = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel(4);
    let watcher = tokio::spawn(slot.clone().watch(stop.clone(), tx));
    // Let the watcher register before the file changes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let path = dir.path().join("plugin.wasm");
    let next = dir.path().join("next.wasm");
    // The running version's bytes written again: no change.
    std::fs::write(&next, guest(&guests.noop)).unwrap();
    std::fs::rename(&next, &path).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(rx.try_recv().is_err(), "the running bytes are no change");
    let retry = guest(&guests.retry);
    std::fs::write(&next, &retry).unwrap();
    std::fs::rename(&next, &path).unwrap();
    let (bytes, _) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the new file was not reported")
        .unwrap();
    assert_eq!(bytes, retry);
    stop.cancel();
    watcher.await.unwrap();
}

/// Catches: a shadow whose answers are not compared (or compared with the
/// wrong call), a difference miscounted, or a shadow that holds the live
/// path back when it falls behind (it must drop calls instead).
#[tokio::test]
async fn a_shadow_counts_exactly_the_calls_that_differ_and_drops_when_behind() {
    let (slot, _dir, guests) = slot();
    let stable = slot.prepare(guest(&guests.retry), "test").await.unwrap();
    let shadow = slot
        .prepare_shadow(guest(&guests.noop), "test")
        .await
        .unwrap();
    slot.set(
        installed(stable, None, Some((shadow, 1))),
        "test",
        Instant::now(),
    )
    .await;
    let mut handler = slot.create(LaneId(0)).await.unwrap();
    // The retry guest retries data starting with "retry" on its first
    // attempt; noop acks everything: 3 outcome differences in 10 calls.
    for i in 0..10u64 {
        let data = if i % 4 == 0 { "retry-me" } else { "fine" };
        let mut d = delivery(&format!("key-{i}"), i);
        Arc::get_mut(&mut d.record).unwrap().data = data.as_bytes().to_vec();
        let mut state = crate::state::CallState::default();
        handler.handle(&d.record, 1, &mut state).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, [calls, dropped, outcome, output, state]) = slot.shadow().unwrap();
        if calls == 10 {
            assert_eq!((dropped, outcome, output, state), (0, 3, 0, 0));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the shadow made {calls} of 10 calls"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A shadow that sleeps 100 ms a call behind a live version that does
    // not: the live calls never wait, and what the shadow cannot take is
    // dropped.
    let noop = slot.prepare(guest(&guests.noop), "test").await.unwrap();
    let slow = slot
        .prepare_shadow(guest(&guests.slow), "test")
        .await
        .unwrap();
    slot.set(
        installed(noop, None, Some((slow, 2))),
        "test",
        Instant::now(),
    )
    .await;
    let mut handler = slot.create(LaneId(0)).await.unwrap();
    let calls = super::shadow::QUEUE as u64 + 50;
    for i in 0..calls {
        let mut d = delivery("key", i);
        Arc::get_mut(&mut d.record).unwrap().data = b"sleep=100;".to_vec();
        let mut state = crate::state::CallState::default();
        handler.handle(&d.record, 1, &mut state).await.unwrap();
    }
    let (_, [_, dropped, ..]) = slot.shadow().unwrap();
    assert!(dropped >= 40, "{dropped} of {calls} dropped");
}

/// Catches: a shadow queue bounded by count only (256 calls of large
/// records would hold gigabytes), admission decided after the copies, or
/// bytes never given back once the shadow made its calls.
#[tokio::test]
async fn a_shadow_holds_no_more_bytes_than_its_bound() {
    let (slot, _dir, guests) = slot();
    let slow = slot
        .prepare_shadow(guest(&guests.slow), "test")
        .await
        .unwrap();
    let counters = shadow::ShadowCounters::new(&Telemetry::new(), "s");
    let bound = 4 << 20;
    let shadow = shadow::Shadow::with_budget(slow, 1, counters.clone(), bound);
    let big = |i: u64| {
        let mut d = delivery("key", i);
        Arc::get_mut(&mut d.record).unwrap().data = vec![b'x'; 1 << 20];
        vec![(d.record, 1)]
    };
    let mut admitted = 0;
    for i in 0..20u64 {
        let records = big(i);
        if let Some(admission) = shadow.admit(&records) {
            admitted += 1;
            let live = shadow::Live {
                outcomes: Ok(vec![crate::dispatch::Outcome::Ack]),
                outputs: Vec::new(),
                writes: Vec::new(),
            };
            let call =
                shadow::ShadowCall::new(records, false, crate::state::CallState::default(), live);
            shadow.offer(admission, call);
        }
    }
    assert_eq!(admitted, 3, "4 MiB holds three calls of 1 MiB records");
    let [_, dropped, ..] = counters.totals();
    assert_eq!(dropped, 17, "the rest dropped before anything was copied");
    // Once the shadow made its calls, their bytes are back.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while counters.totals()[0] < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the shadow made no calls"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(shadow.admit(&big(99)).is_some(), "the budget is given back");
}
