//! The plugin slot with real plugins (the test guests, compiled by the
//! engine as the service compiles them): swaps through the API and the
//! file, refusals that keep the running version, and a canary's slice,
//! promotion and rollback. No stream: lanes are stood in for by calling
//! the slot's handlers directly.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::dispatch::{Handler, HandlerFactory};
use crate::ids::{LaneId, PartitionKey};
use crate::telemetry::Telemetry;
use crate::tests::delivery;

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

/// Catches a swap that does not reach the lanes (the generation must move
/// so each lane drops its instance) or that recompiles and "changes" to
/// the version already running.
#[tokio::test]
async fn an_api_swap_installs_the_new_version_and_the_same_bytes_change_nothing() {
    let (slot, _dir, guests) = slot();
    let before = slot.generation();
    let retry = guest(&guests.retry);
    let report = slot.swap(retry.clone(), "test").await.unwrap();
    assert!(report.changed);
    assert_eq!(slot.current().digest(), &PluginDigest::of(&retry));
    assert!(slot.generation() > before, "lanes see the change");
    let generation = slot.generation();
    let again = slot.swap(retry, "test").await.unwrap();
    assert!(!again.changed);
    assert_eq!(slot.generation(), generation);
}

/// Catches a slot that installs what it could not use: bytes that are no
/// plugin, or a plugin of another world (a lane would then call an export
/// that is not there). The running version stays, and lanes keep theirs.
#[tokio::test]
async fn a_version_that_fails_to_compile_or_changes_world_is_refused_and_the_old_one_stays() {
    let (slot, _dir, guests) = slot();
    let running = slot.current().digest().clone();
    let generation = slot.generation();
    assert!(slot.swap(b"not wasm".to_vec(), "test").await.is_err());
    assert!(
        slot.swap(guest(&guests.noop_batch), "test").await.is_err(),
        "a batch-handler cannot replace a record-handler"
    );
    assert_eq!(slot.current().digest(), &running);
    assert_eq!(slot.generation(), generation);
}

/// Catches a canary that sends the wrong keys to the candidate, and a
/// promotion or rollback that keeps the wrong version.
#[tokio::test]
async fn a_canary_sends_its_slice_to_the_candidate_until_promoted_or_rolled_back() {
    let (slot, _dir, guests) = slot();
    let stable = slot.current().digest().clone();
    let retry = guest(&guests.retry);
    let candidate = PluginDigest::of(&retry);
    let slice = KeySlice::new(0.5).unwrap();
    slot.start_canary(retry, slice, "test").await.unwrap();
    let handler = slot.create(LaneId(0)).await.unwrap();
    for i in 0..50 {
        let key = format!("key-{i}");
        let d = delivery(&key, i);
        let expected = if slice.contains(&PartitionKey::new(key.as_str())) {
            &candidate
        } else {
            &stable
        };
        assert_eq!(handler.version(&d.record).as_ref(), Some(expected), "{key}");
    }
    slot.rollback("test").await.unwrap();
    assert_eq!(slot.current().digest(), &stable);
    assert!(matches!(
        slot.rollback("test").await,
        Err(CanaryError::NoCanary(_))
    ));
    slot.start_canary(guest(&guests.retry), slice, "test")
        .await
        .unwrap();
    slot.promote("test").await.unwrap();
    assert_eq!(slot.current().digest(), &candidate);
}

/// Catches a slot that misses a new version written to its file (as a
/// deploy renames one in place), or that takes a broken file for one.
#[tokio::test]
async fn a_new_file_is_swapped_in_and_a_broken_one_is_not() {
    let (slot, dir, guests) = slot();
    let stop = CancellationToken::new();
    let watcher = tokio::spawn(slot.clone().watch(stop.clone()));
    // Let the watcher register before the file changes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let path = dir.path().join("plugin.wasm");
    let next = dir.path().join("next.wasm");
    std::fs::write(&next, b"broken").unwrap();
    std::fs::rename(&next, &path).unwrap();
    let retry = guest(&guests.retry);
    // Polling the slot: the watcher debounces, then compiles.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_ne!(slot.current().digest(), &PluginDigest::of(&retry));
    assert_eq!(
        slot.current().digest(),
        &PluginDigest::of(&guest(&guests.noop))
    );
    std::fs::write(&next, &retry).unwrap();
    std::fs::rename(&next, &path).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while slot.current().digest() != &PluginDigest::of(&retry) {
        assert!(
            std::time::Instant::now() < deadline,
            "the new file was not swapped in"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    watcher.await.unwrap();
}
