//! The rollout stage with real plugins (the test guests), the memory lease
//! store shared by two "instances" (two stages on one store, as a fleet
//! shares a DynamoDB table) and a folder artifact store.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::{ArtifactLocation, ArtifactsConfig, LeaseBackend};
use crate::dispatch::{Handler, HandlerFactory};
use crate::fleet_versions::Action;
use crate::ids::LaneId;
use crate::lease::memory::MemoryLeaseStore;
use crate::plugin::PluginHost;
use crate::state::CallState;

fn guest(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// One instance ("owner" `name`): a slot loaded from `plugin` (copied into
/// `dir`, its config's plugin), and its rollout stage on `store` and
/// `artifacts`.
fn instance(
    dir: &Path,
    plugin: &Path,
    store: &Arc<MemoryLeaseStore>,
    artifacts: Option<Arc<ArtifactStore>>,
    name: &str,
) -> (Arc<Rollout>, Arc<PluginSlot>, Arc<Telemetry>) {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::copy(plugin, &path).unwrap();
    let sandbox = crate::tests::subscription("").sandbox.clone();
    let host = PluginHost::new(sandbox.max_memory, 100, false).unwrap();
    let loaded = host
        .load(&path, "s".into(), Duration::from_secs(5), sandbox.clone())
        .unwrap();
    let telemetry = Telemetry::new();
    let status = telemetry.subscription(&"s".into(), "sequential".into());
    let slot = Arc::new(PluginSlot::new(
        host,
        loaded,
        Duration::from_secs(5),
        sandbox,
        status,
        telemetry.clone(),
    ));
    let rollout = Arc::new(Rollout::new(
        slot.clone(),
        store.clone(),
        artifacts,
        OwnerId::new(name),
        Declaration {
            stable: slot.current(),
            filter: None,
            canary: None,
            lone: false,
        },
        &telemetry,
    ));
    (rollout, slot, telemetry)
}

async fn open(location: Option<ArtifactLocation>, lease: LeaseBackend) -> Arc<ArtifactStore> {
    let config = ArtifactsConfig {
        location,
        timeouts: crate::config::ArtifactTimeouts::default(),
    };
    Arc::new(
        crate::artifacts::open(&config, &lease, |_| async { unreachable!() })
            .await
            .unwrap(),
    )
}

async fn folder(dir: &Path) -> Arc<ArtifactStore> {
    open(
        Some(ArtifactLocation::Folder(dir.join("artifacts"))),
        LeaseBackend::Memory,
    )
    .await
}

fn blob(dir: &Path, digest: &PluginDigest) -> std::path::PathBuf {
    dir.join("artifacts")
        .join(format!("sha256-{}.wasm", digest.hex()))
}

fn ready(rollout: &Rollout) -> bool {
    rollout.readiness().borrow().is_ready()
}

/// Two instances ("a", "b") of `noop` sharing a memory store and a folder
/// artifact store, both converged once.
struct Two {
    store: Arc<MemoryLeaseStore>,
    artifacts: Arc<ArtifactStore>,
    a: Arc<Rollout>,
    b: (Arc<Rollout>, Arc<PluginSlot>, Arc<Telemetry>),
}

async fn two(dir: &Path, guests: &shardlane_testkit::guests::Guests) -> Two {
    let store = Arc::new(MemoryLeaseStore::new());
    let artifacts = folder(dir).await;
    let (a, _, _) = instance(dir, &guests.noop, &store, Some(artifacts.clone()), "a");
    let b = instance(dir, &guests.noop, &store, Some(artifacts.clone()), "b");
    a.converge().await.unwrap();
    b.0.converge().await.unwrap();
    Two {
        store,
        artifacts,
        a,
        b,
    }
}

/// Catches: a version deployed through one instance that another sharing
/// the store never runs (the fleet must follow whichever instance a
/// change reached), one that restarts back to its config's plugin, or a
/// rollback that does not reach the others.
#[tokio::test]
async fn a_deploy_through_one_instance_reaches_another_and_survives_its_restart() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Two {
        store,
        artifacts,
        a,
        b: (b, b_slot, _),
    } = two(dir.path(), &guests).await;
    let noop = PluginDigest::of(&guest(&guests.noop));
    let retry = guest(&guests.retry);
    let versions = a.deploy(retry.clone(), None, "test").await.unwrap();
    assert_eq!(versions.stable, Some(PluginDigest::of(&retry)));
    assert_eq!(versions.artifacts, Some(artifacts.location()));
    b.converge().await.unwrap();
    assert_eq!(
        b_slot.current().digest(),
        &PluginDigest::of(&retry),
        "fetched from the folder"
    );
    // "b" restarts with its config's plugin (noop): the fleet has a
    // version, so it runs that one.
    let (b2, b2_slot, _) = instance(dir.path(), &guests.noop, &store, Some(artifacts), "b");
    b2.converge().await.unwrap();
    assert!(ready(&b2));
    assert_eq!(b2_slot.current().digest(), &PluginDigest::of(&retry));
    // A rollback through "b2" reaches "b" at its next poll.
    let back = b2
        .change(Command::Rollback { to: None }, "test")
        .await
        .unwrap();
    assert_eq!(back.stable, Some(noop.clone()));
    b.converge().await.unwrap();
    assert_eq!(b_slot.current().digest(), &noop);
    let actions: Vec<_> = back.history.iter().map(|c| c.action).collect();
    assert_eq!(
        actions,
        [Action::Declared, Action::Deploy, Action::Rollback]
    );
}

/// Catches: an instance that starts while the fleet's version cannot be
/// had and runs its config's plugin instead (the bug this stage exists to
/// prevent), or one that never recovers once the bytes are back.
#[tokio::test]
async fn a_starting_instance_runs_the_fleets_version_or_nothing() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Two {
        store,
        artifacts,
        a,
        ..
    } = two(dir.path(), &guests).await;
    let retry = guest(&guests.retry);
    let digest = PluginDigest::of(&retry);
    a.deploy(retry.clone(), None, "test").await.unwrap();
    // The store loses the bytes (down, emptied): a fresh instance whose
    // config names noop must not run noop.
    std::fs::rename(blob(dir.path(), &digest), dir.path().join("aside")).unwrap();
    let (c, c_slot, _) = instance(dir.path(), &guests.noop, &store, Some(artifacts), "c");
    assert!(c.converge().await.is_err());
    assert!(!ready(&c), "not ready: its pipeline never starts");
    match &*c.readiness().borrow() {
        Readiness::Waiting(why) => assert!(why.contains(&digest.to_string()), "{why}"),
        Readiness::Ready => unreachable!(),
    }
    // The next try waits for its backoff, whatever polls come between.
    assert!(matches!(
        c.converge().await,
        Err(RolloutError::Retrying { .. })
    ));
    // The bytes come back: after the backoff, it runs the fleet's version.
    std::fs::rename(dir.path().join("aside"), blob(dir.path(), &digest)).unwrap();
    tokio::time::sleep(RETRY_MAX).await;
    c.converge().await.unwrap();
    assert!(ready(&c));
    assert_eq!(c_slot.current().digest(), &digest);
}

/// Catches: bytes run that are not the version the store names (a blob
/// replaced in the artifact store), or a version that cannot be had taking
/// the running one down at once.
#[tokio::test]
async fn other_bytes_under_a_digest_are_never_run_and_the_running_version_stays() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Two {
        store,
        artifacts,
        b: (b, b_slot, b_telemetry),
        ..
    } = two(dir.path(), &guests).await;
    let retry = guest(&guests.retry);
    let digest = artifacts.publish(retry.clone()).await.unwrap();
    // Someone replaces the blob with another valid component.
    std::fs::write(blob(dir.path(), &digest), guest(&guests.echo)).unwrap();
    let stored = Stored {
        digest: digest.clone(),
        location: Some(artifacts.location()),
    };
    update_versions(&*store, &"s".into(), Command::Deploy(stored), "test")
        .await
        .unwrap();
    let running = b_slot.current().digest().clone();
    assert!(matches!(
        b.converge().await,
        Err(RolloutError::Artifact(ArtifactError::WrongDigest { .. }))
    ));
    assert_eq!(b_slot.current().digest(), &running);
    assert!(ready(&b), "within SWITCH_WITHIN the running version stays");
    assert!(
        b_telemetry
            .render()
            .contains("shardlane_version_failures_total{subscription=\"s\"} 1"),
        "{}",
        b_telemetry.render()
    );
    // The right bytes back: it runs.
    std::fs::write(blob(dir.path(), &digest), &retry).unwrap();
    tokio::time::sleep(RETRY_MAX).await;
    b.converge().await.unwrap();
    assert_eq!(b_slot.current().digest(), &digest);
}

/// Catches: a fleet's version run although its own bytes are no plugin,
/// and a running instance that keeps an old version for ever when the new
/// one cannot run here (past `SWITCH_WITHIN` it must stop and say why).
#[tokio::test]
async fn a_version_that_cannot_run_stops_the_subscription_here_after_the_switch_window() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Two {
        store,
        artifacts,
        b: (b, b_slot, _),
        ..
    } = two(dir.path(), &guests).await;
    let junk = artifacts
        .publish(b"not a component".to_vec())
        .await
        .unwrap();
    let stored = Stored {
        digest: junk,
        location: Some(artifacts.location()),
    };
    update_versions(&*store, &"s".into(), Command::Deploy(stored), "t")
        .await
        .unwrap();
    let running = b_slot.current().digest().clone();
    assert!(matches!(b.converge().await, Err(RolloutError::Plugin(_))));
    assert!(ready(&b));
    // The window passes (the switch is dated back rather than waited for).
    if let Some((_, since)) = &mut *b.switching.lock().unwrap() {
        *since -= SWITCH_WITHIN;
    }
    assert!(b.converge().await.is_err());
    assert!(!ready(&b), "past the window: the subscription stops here");
    assert_eq!(b_slot.current().digest(), &running, "never the junk");
}

/// Catches: a config's plugin declared over a fleet that has versions (a
/// stray instance with other bytes would deploy them fleet-wide).
#[tokio::test]
async fn the_configs_plugin_is_only_the_first_declaration_of_an_empty_fleet() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Two {
        store, artifacts, ..
    } = two(dir.path(), &guests).await;
    let (other, other_slot, _) =
        instance(dir.path(), &guests.retry, &store, Some(artifacts), "other");
    other.converge().await.unwrap();
    let noop = PluginDigest::of(&guest(&guests.noop));
    assert_eq!(other_slot.current().digest(), &noop);
    let versions = store.read_versions(&"s".into()).await.unwrap().unwrap();
    assert_eq!(
        versions.revision, 1,
        "only the first declaration: {versions:?}"
    );
}

/// Catches: a version recorded although no store holds its bytes (the
/// admin API on a DynamoDB fleet without `[artifacts]`).
#[tokio::test]
async fn a_deploy_without_an_artifact_store_is_refused() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryLeaseStore::new());
    let (a, _, _) = instance(dir.path(), &guests.noop, &store, None, "a");
    a.converge().await.unwrap();
    assert!(matches!(
        a.deploy(guest(&guests.retry), None, "test").await,
        Err(RolloutError::NoStore)
    ));
    let versions = store.read_versions(&"s".into()).await.unwrap().unwrap();
    assert_eq!((versions.revision, versions.artifacts), (1, None));
}

/// Handles `n` records of distinct keys through a lane's handler of
/// `slot`.
async fn handle(slot: &PluginSlot, n: u64) {
    let mut handler = slot.create(LaneId(0)).await.unwrap();
    for i in 0..n {
        let record = crate::tests::delivery(&format!("k{i}"), 1000 + i).record;
        handler
            .handle(&record, 1, &mut CallState::default())
            .await
            .unwrap();
    }
}

/// The fleet's counts of the running canary, as the judge sums them.
async fn fleet_counts(rollout: &Rollout) -> crate::fleet_versions::CanaryCounts {
    let plan = rollout
        .latest
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|v| v.canary.clone())
        .unwrap();
    rollout.fleet_counts(&plan).await.unwrap()
}

/// Catches: canary counts that start again when an instance restarts
/// (the decision would be skewed), or a canary deployed again with the
/// same bytes that inherits the earlier one's counts or decision.
#[tokio::test]
async fn canary_counts_outlive_a_restart_and_belong_to_their_canary() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Two {
        store,
        artifacts,
        a,
        b: (_, b_slot, _),
    } = two(dir.path(), &guests).await;
    let rules = CanaryRules {
        rollback_failure_rate: Some(0.5),
        min_records: 1_000_000,
        promote_after_ms: None,
    };
    let canary = |rules: &CanaryRules| Some((KeySlice::new(0.5).unwrap(), rules.clone()));
    let first = a
        .deploy(guest(&guests.retry), canary(&rules), "test")
        .await
        .unwrap();
    let first_id = first.canary.as_ref().unwrap().id;
    a.converge().await.unwrap();
    let (_, a_slot, _) = (a.clone(), a.slot.clone(), ());
    handle(&a_slot, 40).await;
    a.judge().await;
    let counted = fleet_counts(&a).await;
    assert_eq!(counted.rollout, first_id);
    assert_eq!(counted.stable_records + counted.candidate_records, 40);

    // "a" restarts under the same owner id: its counts go on from there.
    let (a2, a2_slot, _) = instance(
        dir.path(),
        &guests.noop,
        &store,
        Some(artifacts.clone()),
        "a",
    );
    a2.converge().await.unwrap();
    handle(&a2_slot, 10).await;
    a2.judge().await;
    let after = fleet_counts(&a2).await;
    assert_eq!(after.stable_records + after.candidate_records, 50);
    drop(b_slot);

    // Rolled back, and deployed again with the same bytes: a new canary,
    // its counts from nothing, and a decision about the first refused.
    a2.change(Command::DropCanary, "test").await.unwrap();
    let again = a2
        .deploy(guest(&guests.retry), canary(&rules), "test")
        .await
        .unwrap();
    let second_id = again.canary.as_ref().unwrap().id;
    assert_ne!(second_id, first_id);
    a2.converge().await.unwrap();
    a2.judge().await;
    let fresh = fleet_counts(&a2).await;
    assert_eq!(fresh.stable_records + fresh.candidate_records, 0);
    let stale = Command::Decided {
        rollout: first_id,
        promote: false,
        note: "the first canary's figures".into(),
    };
    assert!(matches!(
        a2.change(stale, "test").await,
        Err(RolloutError::Refused(VersionsError::OtherCanary(_)))
    ));
}

/// Catches: a plugin file change that stays on the instance whose file
/// changed (it is a deploy for every instance sharing the store), or a
/// broken file recorded as a version.
#[tokio::test]
async fn a_plugin_file_change_is_a_deploy_and_a_broken_file_is_not() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryLeaseStore::new());
    let artifacts = open(None, LeaseBackend::Memory).await;
    let (a, a_slot, _) = instance(dir.path(), &guests.noop, &store, Some(artifacts), "a");
    let stop = CancellationToken::new();
    let task = tokio::spawn(a.clone().run(stop.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ready(&a) {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let path = dir.path().join("a.wasm");
    let next = dir.path().join("next.wasm");
    std::fs::write(&next, b"broken").unwrap();
    std::fs::rename(&next, &path).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let versions = store.read_versions(&"s".into()).await.unwrap().unwrap();
    assert_eq!(
        versions.revision, 1,
        "only the config's declaration: {versions:?}"
    );
    let retry = guest(&guests.retry);
    std::fs::write(&next, &retry).unwrap();
    std::fs::rename(&next, &path).unwrap();
    while a_slot.current().digest() != &PluginDigest::of(&retry) {
        assert!(
            std::time::Instant::now() < deadline,
            "the new file was not deployed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let versions = store.read_versions(&"s".into()).await.unwrap().unwrap();
    assert_eq!(versions.stable, Some(PluginDigest::of(&retry)));
    stop.cancel();
    task.await.unwrap();
}
