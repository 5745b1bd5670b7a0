//! The rollout stage with real plugins (the test guests), the memory lease
//! store shared by two "instances" (two stages on one store, as a fleet
//! shares a DynamoDB table) and a folder artifact store.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::ArtifactLocation;
use crate::lease::memory::MemoryLeaseStore;
use crate::plugin::PluginHost;
use crate::versions::Action;

fn guest(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// One instance: a slot loaded from `plugin` (copied into `dir`), and its
/// rollout stage on `store` and `artifacts`.
fn instance(
    dir: &Path,
    plugin: &Path,
    store: &Arc<MemoryLeaseStore>,
    artifacts: Option<Arc<dyn ArtifactStore>>,
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
        "orders".into(),
        store.clone(),
        artifacts,
        name.to_owned(),
        &telemetry,
    ));
    (rollout, slot, telemetry)
}

async fn folder(dir: &Path) -> Arc<dyn ArtifactStore> {
    let location = ArtifactLocation::Folder(dir.join("artifacts"));
    Arc::from(crate::artifacts::open(&location, || async { unreachable!() }).await)
}

/// Two instances ("a", "b") of `noop` sharing a memory store and a folder
/// artifact store, both started.
struct Two {
    store: Arc<MemoryLeaseStore>,
    artifacts: Arc<dyn ArtifactStore>,
    a: Arc<Rollout>,
    b: (Arc<Rollout>, Arc<PluginSlot>, Arc<Telemetry>),
}

async fn two(dir: &Path, guests: &shardlane_testkit::guests::Guests) -> Two {
    let store = Arc::new(MemoryLeaseStore::new());
    let artifacts = folder(dir).await;
    let (a, _, _) = instance(dir, &guests.noop, &store, Some(artifacts.clone()), "a");
    let b = instance(dir, &guests.noop, &store, Some(artifacts.clone()), "b");
    a.start(None).await;
    b.0.start(None).await;
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
    b.converge().await.unwrap();
    assert_eq!(
        b_slot.current().digest(),
        &PluginDigest::of(&retry),
        "fetched from the folder"
    );
    // "b" restarts with its config's plugin (noop, declared before): it
    // runs the fleet's version.
    let (b2, b2_slot, _) = instance(dir.path(), &guests.noop, &store, Some(artifacts), "b");
    b2.start(None).await;
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

/// Catches: bytes run that are not the version the store names (a blob
/// replaced in the artifact store), or a version that cannot be had taking
/// the running one down with it.
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
    let digest = artifacts.store(retry.clone()).await.unwrap();
    // Someone replaces the blob with another valid component.
    let blob = dir
        .path()
        .join("artifacts")
        .join(format!("sha256-{}.wasm", digest.hex()));
    std::fs::write(&blob, guest(&guests.echo)).unwrap();
    update_versions(
        &*store,
        &"s".into(),
        Command::Deploy(digest.clone()),
        "test",
    )
    .await
    .unwrap();
    let running = b_slot.current().digest().clone();
    assert!(matches!(
        b.converge().await,
        Err(RolloutError::Artifact(ArtifactError::WrongDigest { .. }))
    ));
    b.converge_now().await;
    assert_eq!(b_slot.current().digest(), &running);
    assert!(
        b_telemetry
            .render()
            .contains("shardlane_version_failures_total{subscription=\"s\"} 1"),
        "{}",
        b_telemetry.render()
    );
    // Other bytes that are not a plugin at all: refused the same way.
    std::fs::write(&blob, b"not wasm").unwrap();
    assert!(b.converge().await.is_err());
    // A version whose own bytes (digest and all) are not a plugin: never
    // run either.
    let junk = artifacts.store(b"not a component".to_vec()).await.unwrap();
    let fleet = update_versions(&*store, &"s".into(), Command::Rollback { to: None }, "t")
        .await
        .unwrap();
    assert_eq!(
        fleet.stable.as_ref(),
        Some(&PluginDigest::of(&guest(&guests.noop)))
    );
    let junk_fleet = fleet.apply(Command::Deploy(junk), "t", 0).unwrap();
    store
        .write_versions(&"s".into(), &junk_fleet)
        .await
        .unwrap();
    assert!(matches!(b.converge().await, Err(RolloutError::Plugin(_))));
    assert_eq!(b_slot.current().digest(), &running);
    update_versions(&*store, &"s".into(), Command::Deploy(digest.clone()), "t")
        .await
        .unwrap();
    // The right bytes back: it runs.
    std::fs::write(&blob, &retry).unwrap();
    b.converge().await.unwrap();
    assert_eq!(b_slot.current().digest(), &digest);
}

/// Catches: a plugin file change that stays on the instance whose file
/// changed (it is a deploy for every instance sharing the store), or a
/// broken file recorded as a version.
#[tokio::test]
async fn a_plugin_file_change_is_a_deploy_and_a_broken_file_is_not() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryLeaseStore::new());
    let (a, a_slot, _) = instance(dir.path(), &guests.noop, &store, None, "a");
    a.start(None).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(a.clone().run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
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
