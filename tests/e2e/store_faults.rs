//! The version you deployed, or none, whatever the artifact store does:
//! a fault proxy in front of moto's S3 and Debian's docker-registry
//! refuses, hangs (accepts and never answers) and lets through again,
//! while a fleet on one dynalite lease table reads a stream. Each fault
//! lasts a bounded time, on loopback only.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shardlane::PluginDigest;
use shardlane_testkit::proxy::{FaultProxy, Faults};
use shardlane_testkit::{HostProcess, Registry, S3Emulator, guests};

use crate::common::{admin_addr, field, http, shardlane_bin};
use crate::leases::{QUICK_LEASES, check_all_handled, dynamodb_config, env, producer};
use crate::versions::{Rig, all_run, cli, deploy, everything_handled, handled_by, retry_data};

/// The deadlines every host and command here gives the artifact store:
/// short, so a hung store fails a call in seconds.
const TIMEOUTS: &str =
    "connect_timeout = \"1s\"\nfirst_byte_timeout = \"2s\"\ntransfer_timeout = \"4s\"";

/// The config of fleet member `owner`, its artifacts at `location`, its
/// compile cache its own (a fresh node's is empty).
fn member(rig: &Rig, owner: &str, plugin: &Path, location: &str) -> String {
    let extra = format!(
        "shutdown_timeout = \"4s\"\n\n[artifacts]\nlocation = \"{location}\"\n{TIMEOUTS}\n\n[engine]\ncache_dir = \"{}\"\n",
        rig.dir.path().join(format!("cache-{owner}")).display()
    );
    dynamodb_config(owner, &rig.table, &rig.stream, plugin, QUICK_LEASES, &extra)
}

/// `/readyz` of `host`: (status, body).
fn readyz(host: &HostProcess) -> (u16, String) {
    http(&admin_addr(host), "GET", "/readyz", None, b"")
}

/// Waits until `/readyz` of `host` answers `status` with a body holding
/// `holding`; returns how long that took.
async fn ready_as(
    host: &mut HostProcess,
    status: u16,
    holding: &str,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    host.wait_for("the admin listener", within, |lines| {
        lines
            .iter()
            .any(|l| field(l, "message").starts_with("admin listening"))
    })
    .await
    .unwrap();
    loop {
        let (now, body) = readyz(host);
        if now == status && body.contains(holding) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "/readyz never answered {status} with {holding:?} within {within:?}: {now} {body}"
        );
        // Polling the readiness endpoint.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// moto's S3 with a bucket `fleet`, and a fault proxy in front of it.
async fn s3_behind_a_proxy() -> (S3Emulator, FaultProxy) {
    let s3 = S3Emulator::start().await.unwrap();
    s3.create_bucket("fleet").await.unwrap();
    let proxy = FaultProxy::start(s3.endpoint()).await.unwrap();
    (s3, proxy)
}

fn leases_taken(host: &HostProcess) -> usize {
    host.lines()
        .iter()
        .filter(|l| field(l, "message") == "lease taken; reader starting")
        .count()
}

/// Catches: an instance started on a fresh node while the artifact store
/// is down that runs its config's (older) plugin, or takes leases it
/// cannot serve; or one that does not recover once the store is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_instance_runs_the_fleets_version_or_nothing_while_the_store_is_down() {
    let rig = Rig::start("store-down", 4).await;
    let (_s3, proxy) = s3_behind_a_proxy().await;
    let endpoint = proxy.endpoint();
    let mut env: Vec<(&str, &str)> = env(&rig.kinesis, &rig.dynalite).to_vec();
    env.push(("AWS_ENDPOINT_URL_S3", &endpoint));
    let location = "s3://fleet/orders";
    let (stop, producer) = producer(&rig.kinesis, &rig.stream, 8, 1);
    let config_a = member(&rig, "a", &rig.guests.retry, location);
    let mut a = HostProcess::start_with(shardlane_bin(), &config_a, &env).unwrap();
    let v1 = PluginDigest::of(&std::fs::read(&rig.guests.retry).unwrap());
    all_run(&mut [&mut a], v1.short(), Duration::from_secs(60)).await;
    let v2_path = guests::variant(&rig.guests.retry, "v2", rig.dir.path()).unwrap();
    let operator = rig.dir.path().join("operator.toml");
    std::fs::write(
        &operator,
        member(&rig, "operator", &rig.guests.retry, location),
    )
    .unwrap();
    deploy(operator.to_str().unwrap(), &env, &[], &v2_path);
    let v2 = PluginDigest::of(&std::fs::read(&v2_path).unwrap());
    all_run(&mut [&mut a], v2.short(), Duration::from_secs(30)).await;

    // The store goes down; "b" starts on a fresh node (its config names v1).
    proxy.set(Faults {
        refuse: true,
        ..Faults::default()
    });
    let config_b = member(&rig, "b", &rig.guests.retry, location);
    let mut b = HostProcess::start_with(shardlane_bin(), &config_b, &env).unwrap();
    ready_as(&mut b, 503, &v2.to_string(), Duration::from_secs(30)).await;
    let (_, body) = readyz(&b);
    assert!(body.contains("fleet: runs nothing here"), "{body}");
    // Seconds of records arrive meanwhile: "a" handles them, "b" nothing.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        handled_by(&b.lines()).is_empty(),
        "b handled records without its version"
    );
    assert_eq!(leases_taken(&b), 0, "b took a lease it cannot serve");

    // The store comes back: "b" runs the fleet's version, never another.
    let back = Instant::now();
    proxy.clear();
    all_run(&mut [&mut b], v2.short(), Duration::from_secs(60)).await;
    eprintln!(
        "store back: the fresh instance ran the fleet's version {:?} after it",
        back.elapsed()
    );
    assert!(handled_by(&b.lines()).iter().all(|d| d == v2.short()));

    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    everything_handled(&mut a, &[&b], &put, retry_data).await;
    for host in [&mut a, &mut b] {
        assert!(host.terminate().await.unwrap().success());
    }
    check_all_handled(&put, &[&a, &b]);
}

/// Catches: a store call with no deadline (a registry that accepts and
/// never answers held an instance, which then ignored SIGTERM), or an
/// admin listener bound only after the store answered.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_hung_fetch_stops_within_shutdown_timeout() {
    let rig = Rig::start("store-hung", 2).await;
    let registry = Registry::start().await.unwrap();
    let proxy = FaultProxy::start(&format!("http://{}", registry.authority()))
        .await
        .unwrap();
    let env: Vec<(&str, &str)> = env(&rig.kinesis, &rig.dynalite).to_vec();
    let location = format!(
        "oci+http://{}/team/orders",
        proxy.endpoint().trim_start_matches("http://")
    );
    let operator = rig.dir.path().join("operator.toml");
    std::fs::write(
        &operator,
        member(&rig, "operator", &rig.guests.retry, &location),
    )
    .unwrap();
    let mut a = HostProcess::start_with(
        shardlane_bin(),
        &member(&rig, "a", &rig.guests.retry, &location),
        &env,
    )
    .unwrap();
    let v1 = PluginDigest::of(&std::fs::read(&rig.guests.retry).unwrap());
    ready_as(&mut a, 200, "ready", Duration::from_secs(60)).await;
    let v2_path = guests::variant(&rig.guests.retry, "v2", rig.dir.path()).unwrap();
    deploy(operator.to_str().unwrap(), &env, &[], &v2_path);
    assert!(a.terminate().await.unwrap().success());
    drop(v1);

    // The registry hangs; a fresh instance starts: its listeners answer at
    // once, it waits for the version, and SIGTERM stops it in time.
    proxy.set(Faults {
        hang: true,
        ..Faults::default()
    });
    let mut b = HostProcess::start_with(
        shardlane_bin(),
        &member(&rig, "b", &rig.guests.retry, &location),
        &env,
    )
    .unwrap();
    ready_as(&mut b, 503, "runs nothing here", Duration::from_secs(30)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.hung() == 0 {
        assert!(
            Instant::now() < deadline,
            "the fetch never reached the registry"
        );
        // Waiting for the fetch to hang in the registry.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked = Instant::now();
    b.signal("TERM").unwrap();
    let status = b.wait_exit(Duration::from_secs(5)).await.unwrap();
    eprintln!(
        "SIGTERM during a hung fetch: exited {:?} after it",
        asked.elapsed()
    );
    assert!(status.success(), "{}", b.stderr());
    assert!(handled_by(&b.lines()).is_empty());

    // A deploy through the hung registry: one line within the deadlines,
    // nothing recorded.
    let v3 = guests::variant(&rig.guests.retry, "v3", rig.dir.path()).unwrap();
    let started = Instant::now();
    let out = cli(
        &[
            "deploy",
            "-c",
            operator.to_str().unwrap(),
            "-s",
            "fleet",
            v3.to_str().unwrap(),
        ],
        &env,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no answer within"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    proxy.clear();
    let out = cli(
        &["versions", "-c", operator.to_str().unwrap(), "-s", "fleet"],
        &env,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v2 = PluginDigest::of(&std::fs::read(&v2_path).unwrap());
    assert!(text.contains(&format!("stable:  {v2}")), "{text}");
}

/// Catches: a canary whose candidate cannot be fetched holding the stable
/// version back on an instance (its keys must run on the stable version),
/// and a deploy through a store the fleet does not read being recorded.
#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_that_cannot_be_had_runs_on_stable_and_another_store_is_refused() {
    let rig = Rig::start("store-canary", 2).await;
    let (_s3, proxy) = s3_behind_a_proxy().await;
    let endpoint = proxy.endpoint();
    let mut env: Vec<(&str, &str)> = env(&rig.kinesis, &rig.dynalite).to_vec();
    env.push(("AWS_ENDPOINT_URL_S3", &endpoint));
    let location = "s3://fleet/orders";
    let operator = rig.dir.path().join("operator.toml");
    std::fs::write(
        &operator,
        member(&rig, "operator", &rig.guests.retry, location),
    )
    .unwrap();
    let (stop, producer) = producer(&rig.kinesis, &rig.stream, 8, 1);
    let mut a = HostProcess::start_with(
        shardlane_bin(),
        &member(&rig, "a", &rig.guests.retry, location),
        &env,
    )
    .unwrap();
    let v1 = PluginDigest::of(&std::fs::read(&rig.guests.retry).unwrap());
    all_run(&mut [&mut a], v1.short(), Duration::from_secs(60)).await;
    let v2_path = guests::variant(&rig.guests.retry, "v2", rig.dir.path()).unwrap();
    let v2 = PluginDigest::of(&std::fs::read(&v2_path).unwrap());
    // The store hangs as the canary is deployed... through another store,
    // which is refused at once; then through the fleet's, once it is back.
    let elsewhere = rig.dir.path().join("elsewhere.toml");
    let folder = rig.dir.path().join("other-artifacts");
    std::fs::write(
        &elsewhere,
        member(
            &rig,
            "operator",
            &rig.guests.retry,
            &folder.display().to_string(),
        ),
    )
    .unwrap();
    let out = cli(
        &[
            "deploy",
            "-c",
            elsewhere.to_str().unwrap(),
            "-s",
            "fleet",
            "--canary",
            "0.5",
            v2_path.to_str().unwrap(),
        ],
        &env,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("the fleet's versions are kept in s3://fleet/orders"),
        "{stderr}"
    );
    deploy(
        operator.to_str().unwrap(),
        &env,
        &["--canary", "0.5"],
        &v2_path,
    );
    all_run(&mut [&mut a], v2.short(), Duration::from_secs(30)).await;

    // "b" starts on a fresh node while the store hangs. Its config's
    // plugin is the stable version's bytes, so it runs that; the
    // candidate, which only the store holds, cannot be had: its keys run
    // on the stable version meanwhile, and the gauge says so.
    proxy.set(Faults {
        hang: true,
        ..Faults::default()
    });
    let mut b = HostProcess::start_with(
        shardlane_bin(),
        &member(&rig, "b", &rig.guests.retry, location),
        &env,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let by = handled_by(&b.lines());
        if by.len() >= 20 {
            assert!(by.iter().all(|d| d == v1.short()), "{by:?}");
            break;
        }
        assert!(Instant::now() < deadline, "b never ran its stable version");
        // Waiting for b's records.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = http(&admin_addr(&b), "GET", "/metrics", None, b"").1;
    assert!(
        metrics.contains("shardlane_version_missing{subscription=\"fleet\",role=\"candidate\"} 1"),
        "{metrics}"
    );
    // The store back: b runs the canary too.
    proxy.clear();
    all_run(&mut [&mut b], v2.short(), Duration::from_secs(60)).await;

    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    everything_handled(&mut a, &[&b], &put, retry_data).await;
    for host in [&mut a, &mut b] {
        assert!(host.terminate().await.unwrap().success());
    }
    check_all_handled(&put, &[&a, &b]);
}
