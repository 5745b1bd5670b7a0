//! Versions are fleet state: `shardlane deploy`, `rollback` and
//! `versions` against a fleet of three on one dynalite lease table, the
//! bytes in a folder artifact store; bad input refused with one line and
//! nothing recorded. Bounded in time, on loopback.

use std::path::Path;
use std::process::Output;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shardlane::PluginDigest;
use shardlane_testkit::{
    Dynalite, HostProcess, Kinesis, LogLine, Registry, S3Emulator, guests, unique_name,
};

use crate::common::{admin_addr, field, guest_lines, http, shardlane_bin};
use crate::leases::{QUICK_LEASES, check_all_handled, dynamodb_config, env, handled, producer};

/// What every test here starts: the emulators, a stream, a lease table's
/// name and a folder.
pub(crate) struct Rig {
    pub(crate) guests: guests::Guests,
    pub(crate) kinesis: Kinesis,
    pub(crate) dynalite: Dynalite,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) stream: String,
    pub(crate) table: String,
}

impl Rig {
    pub(crate) async fn start(name: &str, shards: i32) -> Self {
        let rig = Self {
            guests: guests::build().unwrap(),
            kinesis: Kinesis::start().await.unwrap(),
            dynalite: Dynalite::start().await.unwrap(),
            dir: tempfile::tempdir().unwrap(),
            stream: unique_name(name),
            table: unique_name("leases"),
        };
        rig.kinesis
            .create_stream(&rig.stream, shards)
            .await
            .unwrap();
        rig
    }
}

/// `shardlane deploy -c <config> -s fleet <extra…> <plugin>`, which must
/// succeed.
pub(crate) fn deploy(config: &str, env: &[(&str, &str)], extra: &[&str], plugin: &Path) {
    let mut args = vec!["deploy", "-c", config, "-s", "fleet"];
    args.extend_from_slice(extra);
    args.push(plugin.to_str().unwrap());
    let out = cli(&args, env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until `first` and `others` between them handled every record of
/// `put` (the data `data` finds in their lines).
pub(crate) async fn everything_handled(
    first: &mut HostProcess,
    others: &[&HostProcess],
    put: &[String],
    data: fn(&[LogLine]) -> Vec<String>,
) {
    first
        .wait_for("everything handled", Duration::from_secs(60), |lines| {
            let mut seen: std::collections::HashSet<String> = data(lines).into_iter().collect();
            for other in others {
                seen.extend(data(&other.lines()));
            }
            put.iter().all(|d| seen.contains(d))
        })
        .await
        .unwrap();
}

/// The data of each record the retry guest handled.
pub(crate) fn retry_data(lines: &[LogLine]) -> Vec<String> {
    handled(lines).into_iter().map(|(d, _, _)| d).collect()
}

/// The config of one host of the fleet, with the artifact store `artifacts`.
fn config(owner: &str, table: &str, stream: &str, plugin: &Path, artifacts: &Path) -> String {
    let artifacts = format!("\n[artifacts]\nlocation = \"{}\"\n", artifacts.display());
    dynamodb_config(owner, table, stream, plugin, QUICK_LEASES, &artifacts)
}

/// Runs `shardlane <args>` with `env`.
pub(crate) fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = std::process::Command::new(shardlane_bin());
    command
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

/// The versions (short digests) the guest lines of `lines` were handled by.
pub(crate) fn handled_by(lines: &[LogLine]) -> Vec<String> {
    guest_lines(lines, "handled data=")
        .iter()
        .map(|l| field(l, "plugin").to_owned())
        .collect()
}

/// Waits until every host handles a record with `digest` (a short one);
/// returns how long that took.
pub(crate) async fn all_run(
    hosts: &mut [&mut HostProcess],
    digest: &str,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    for host in hosts.iter_mut() {
        host.wait_for(&format!("a record handled by {digest}"), within, |lines| {
            handled_by(lines).iter().any(|d| d == digest)
        })
        .await
        .unwrap();
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deploy_reaches_the_fleet_survives_kill_9_and_rolls_back() {
    let Rig {
        guests,
        kinesis,
        dynalite,
        dir,
        stream,
        table,
    } = Rig::start("deploy", 4).await;
    let artifacts = dir.path().join("artifacts");
    let v2 = guests::variant(&guests.retry, "v2", dir.path()).unwrap();
    let (v1_digest, v2_digest) = (
        PluginDigest::of(&std::fs::read(&guests.retry).unwrap()),
        PluginDigest::of(&std::fs::read(&v2).unwrap()),
    );
    let env = env(&kinesis, &dynalite);
    let (stop, producer) = producer(&kinesis, &stream, 16, 2);
    let start = |name: &str| {
        HostProcess::start_with(
            shardlane_bin(),
            &config(name, &table, &stream, &guests.retry, &artifacts),
            &env,
        )
        .unwrap()
    };
    let (mut a, mut b, mut c) = (start("a"), start("b"), start("c"));
    let v1 = v1_digest.short().to_owned();
    all_run(&mut [&mut a, &mut b, &mut c], &v1, Duration::from_secs(60)).await;

    // The operator's config: the same file the fleet runs.
    let cli_config = dir.path().join("operator.toml");
    std::fs::write(
        &cli_config,
        config("operator", &table, &stream, &guests.retry, &artifacts),
    )
    .unwrap();
    let cli_config = cli_config.to_str().unwrap();
    deploy(cli_config, &env, &[], &v2);
    let v2s = v2_digest.short().to_owned();
    let took = all_run(&mut [&mut a, &mut b, &mut c], &v2s, Duration::from_secs(30)).await;
    eprintln!(
        "deploy: the whole fleet of three runs the new version {took:?} after the command returned"
    );

    // Up to here (start, balancing by graceful hand-overs, the deploy)
    // nothing was handled twice: lanes switch versions at a record
    // boundary, and settlement never sees a version change.
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for host in [&a, &b, &c] {
        for data in retry_data(&host.lines()) {
            *seen.entry(data).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "handled twice before any crash: {twice:?}"
    );

    // kill -9 one; a restart with the config's (older) plugin runs the
    // deployed version from its first record.
    c.kill9().unwrap();
    let mut c2 = start("c");
    c2.wait_for(
        "records handled after the restart",
        Duration::from_secs(60),
        |lines| !handled_by(lines).is_empty(),
    )
    .await
    .unwrap();
    let restarted = handled_by(&c2.lines());
    assert!(
        restarted.iter().all(|d| *d == v2s),
        "the restarted instance ran its config's plugin: {restarted:?}"
    );

    // A rollback: every instance back on the first version.
    let out = cli(
        &[
            "rollback",
            "--config",
            cli_config,
            "--subscription",
            "fleet",
        ],
        &env,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let took = all_run(&mut [&mut a, &mut b, &mut c2], &v1, Duration::from_secs(30)).await;
    eprintln!("rollback: the whole fleet back {took:?} after the command returned");

    let out = cli(
        &[
            "versions",
            "--config",
            cli_config,
            "--subscription",
            "fleet",
        ],
        &env,
    );
    let table_text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table_text.contains(&format!("stable:  {v1_digest}")),
        "{table_text}"
    );
    for action in ["declared", "deploy", "rollback"] {
        assert!(
            table_text.contains(action),
            "{action} missing: {table_text}"
        );
    }

    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    everything_handled(&mut a, &[&b, &c, &c2], &put, retry_data).await;
    for host in [&mut a, &mut b, &mut c2] {
        assert!(host.terminate().await.unwrap().success());
    }
    check_all_handled(&put, &[&a, &b, &c, &c2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_deploys_get_one_line_and_record_nothing() {
    let Rig {
        guests,
        kinesis,
        dynalite,
        dir,
        stream,
        table,
    } = Rig::start("baddeploy", 1).await;
    let env = env(&kinesis, &dynalite);
    let artifacts = dir.path().join("artifacts");
    let with = dir.path().join("with.toml");
    std::fs::write(
        &with,
        config("cli", &table, &stream, &guests.retry, &artifacts),
    )
    .unwrap();
    let without = dir.path().join("without.toml");
    std::fs::write(
        &without,
        dynamodb_config("cli", &table, &stream, &guests.retry, QUICK_LEASES, ""),
    )
    .unwrap();
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not a component").unwrap();
    let (with, without) = (with.to_str().unwrap(), without.to_str().unwrap());
    let retry = guests.retry.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["deploy", "-c", with, "-s", "fleet", junk.to_str().unwrap()],
            "junk.wasm",
        ),
        (
            &[
                "deploy",
                "-c",
                with,
                "-s",
                "fleet",
                guests.batch.to_str().unwrap(),
            ],
            "batch-handler",
        ),
        (
            &["deploy", "-c", with, "-s", "nobody", retry],
            "no subscription named \"nobody\"",
        ),
        (
            &["deploy", "-c", without, "-s", "fleet", retry],
            "[artifacts] location",
        ),
        (
            &[
                "deploy", "-c", with, "-s", "fleet", "--canary", "1.5", retry,
            ],
            "key fraction 1.5",
        ),
    ];
    for (args, says) in cases {
        let out = cli(args, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // Nothing was recorded.
    let out = cli(&["versions", "-c", with, "-s", "fleet"], &env);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("no fleet versions yet"), "{text}");
    let out = cli(&["rollback", "-c", with, "-s", "fleet"], &env);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no version has been deployed yet"));
}

/// Replaces the blob of a version in an artifact store, behind its back.
enum Tamper<'a> {
    S3(&'a S3Emulator, &'a str),
    Oci(&'a Registry),
}

impl Tamper<'_> {
    async fn put(&self, digest: &PluginDigest, bytes: Vec<u8>) {
        match self {
            Self::S3(s3, bucket) => s3
                .put(
                    bucket,
                    &format!("orders/sha256-{}.wasm", digest.hex()),
                    bytes,
                )
                .await
                .unwrap(),
            Self::Oci(registry) => std::fs::write(registry.blob_path(digest.hex()), bytes).unwrap(),
        }
    }
}

/// A deploy through the artifact store at `location` reaches a host; a
/// version whose blob holds other bytes is never run, and runs once the
/// right bytes are back; a missing bucket or registry is one line.
async fn through_an_artifact_store(
    location: &str,
    extra_env: &[(&str, &str)],
    tamper: Tamper<'_>,
    missing: &str,
) {
    let Rig {
        guests,
        kinesis,
        dynalite,
        dir,
        stream,
        table,
    } = Rig::start("artifacts", 2).await;
    let mut env: Vec<(&str, &str)> = env(&kinesis, &dynalite).to_vec();
    env.extend_from_slice(extra_env);
    // Each its own compile cache: a host must get the version from the
    // store, not from a cache the CLI's deploy filled.
    let config = |owner: &str, location: &str| {
        let artifacts = format!(
            "\n[artifacts]\nlocation = \"{location}\"\n\n[engine]\ncache_dir = \"{}\"\n",
            dir.path().join(format!("cache-{owner}")).display()
        );
        dynamodb_config(
            owner,
            &table,
            &stream,
            &guests.retry,
            QUICK_LEASES,
            &artifacts,
        )
    };
    let cli_config = dir.path().join("operator.toml");
    std::fs::write(&cli_config, config("operator", location)).unwrap();
    let cli_config = cli_config.to_str().unwrap();
    let (stop, producer) = producer(&kinesis, &stream, 8, 1);
    let mut host = HostProcess::start_with(shardlane_bin(), &config("a", location), &env).unwrap();
    let v1 = PluginDigest::of(&std::fs::read(&guests.retry).unwrap());
    all_run(&mut [&mut host], v1.short(), Duration::from_secs(60)).await;

    let v2 = guests::variant(&guests.retry, "v2", dir.path()).unwrap();
    deploy(cli_config, &env, &[], &v2);
    let v2 = PluginDigest::of(&std::fs::read(&v2).unwrap());
    let took = all_run(&mut [&mut host], v2.short(), Duration::from_secs(30)).await;
    eprintln!("{location}: deployed and running {took:?} after the command returned");

    // Stopped; v3 deployed, then its blob replaced by another valid
    // component's bytes: the restarted host never runs it, and runs
    // nothing else either (not its config's plugin, not an older version):
    // it takes no lease, and /readyz says why.
    assert!(host.terminate().await.unwrap().success());
    let v3_path = guests::variant(&guests.retry, "v3", dir.path()).unwrap();
    let v3_bytes = std::fs::read(&v3_path).unwrap();
    let v3 = PluginDigest::of(&v3_bytes);
    deploy(cli_config, &env, &[], &v3_path);
    tamper.put(&v3, std::fs::read(&guests.echo).unwrap()).await;
    let mut again = HostProcess::start_with(shardlane_bin(), &config("a", location), &env).unwrap();
    again
        .wait_for(
            "the refusal of the replaced blob",
            Duration::from_secs(60),
            |lines| {
                lines.iter().any(|l| {
                    field(l, "message").starts_with("cannot run the fleet's versions")
                        && field(l, "error").contains(&v3.to_string())
                })
            },
        )
        .await
        .unwrap();
    let (status, body) = http(&admin_addr(&again), "GET", "/readyz", None, b"");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("runs nothing here") && body.contains(&v3.to_string()),
        "{body}"
    );
    // Records keep arriving meanwhile; none may be handled.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        handled_by(&again.lines()).is_empty(),
        "records handled while the fleet's version cannot run"
    );
    assert!(
        !again
            .lines()
            .iter()
            .any(|l| field(l, "message") == "lease taken; reader starting"),
        "a lease taken while the fleet's version cannot run"
    );
    // The right bytes back: it runs within its retry backoff and a poll.
    tamper.put(&v3, v3_bytes).await;
    all_run(&mut [&mut again], v3.short(), Duration::from_secs(30)).await;
    assert!(
        handled_by(&again.lines()).iter().all(|d| d == v3.short()),
        "only the fleet's version ran"
    );

    // A bucket or registry that is not there: one line, nothing recorded.
    let wrong = dir.path().join("wrong.toml");
    std::fs::write(&wrong, config("operator", missing)).unwrap();
    let v4 = guests::variant(&guests.retry, "v4", dir.path()).unwrap();
    let out = cli(
        &[
            "deploy",
            "-c",
            wrong.to_str().unwrap(),
            "-s",
            "fleet",
            v4.to_str().unwrap(),
        ],
        &env,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot store plugin"), "{stderr}");
    let out = cli(&["versions", "-c", cli_config, "-s", "fleet"], &env);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("stable:  {v3}")), "{text}");

    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    everything_handled(&mut again, &[&host], &put, retry_data).await;
    assert!(again.terminate().await.unwrap().success());
    check_all_handled(&put, &[&host, &again]);
}

#[tokio::test(flavor = "multi_thread")]
async fn versions_travel_through_s3_checked_by_digest() {
    let s3 = S3Emulator::start().await.unwrap();
    s3.create_bucket("team-artifacts").await.unwrap();
    through_an_artifact_store(
        "s3://team-artifacts/orders",
        &[("AWS_ENDPOINT_URL_S3", s3.endpoint())],
        Tamper::S3(&s3, "team-artifacts"),
        "s3://no-such-bucket/orders",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn versions_travel_through_an_oci_registry_checked_by_digest() {
    let registry = Registry::start().await.unwrap();
    let location = format!("oci+http://{}/team/orders", registry.authority());
    // A port nothing listens on: a registry that is not there.
    let missing = format!(
        "oci+http://127.0.0.1:{}/team/orders",
        shardlane_testkit::free_port()
    );
    through_an_artifact_store(&location, &[], Tamper::Oci(&registry), &missing).await;
}

/// The data of every record handled in `lines`, by the retry guest
/// (`handled data=<d> attempt=<n>`) or the echo guest (`echo … data="<d>"`).
fn handled_data(lines: &[LogLine]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| field(l, "target") == "guest")
        .filter_map(|l| {
            let m = field(l, "message");
            if let Some(rest) = m.strip_prefix("handled data=") {
                Some(rest.rsplit_once(" attempt=")?.0.to_owned())
            } else if m.starts_with("echo ") {
                Some(m.split_once(" data=")?.1.trim_matches('"').to_owned())
            } else {
                None
            }
        })
        .collect()
}

/// `shardlane versions` until `done(output)`, polling every 500 ms;
/// returns the output and how long it took.
async fn versions_until(
    args: &[&str],
    env: &[(&str, &str)],
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> (String, Duration) {
    let started = Instant::now();
    loop {
        let out = cli(args, env);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if done(&text) {
            return (text, started.elapsed());
        }
        assert!(started.elapsed() < within, "not within {within:?}:\n{text}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_canary_is_rolled_back_by_itself_and_a_healthy_one_promoted() {
    let Rig {
        guests,
        kinesis,
        dynalite,
        dir,
        stream,
        table,
    } = Rig::start("autocanary", 4).await;
    let artifacts = dir.path().join("artifacts");
    let env = env(&kinesis, &dynalite);
    // The stable version (echo) acks everything; the first candidate (the
    // chaos guest) traps on every record whose data starts with "trap": a
    // fifth of the records. Attempts are unlimited (the default), so a
    // record the candidate trapped on is tried again until the rollback
    // sends it to the stable version: nothing is lost. A trapped record
    // holds its lane (sequential dispatch) between attempts, so the
    // candidate's records come slowly: the rule judges after 10.
    let (stop, producer) =
        crate::common::trickle(&kinesis, &stream, 2, Duration::from_millis(50), |n| {
            let data = if n % 5 == 0 {
                format!("trap-{n}")
            } else {
                format!("ok-{n}")
            };
            (format!("key-{}", n % 16), data.clone().into_bytes(), data)
        });
    let start = |name: &str| {
        HostProcess::start_with(
            shardlane_bin(),
            &config(name, &table, &stream, &guests.echo, &artifacts),
            &env,
        )
        .unwrap()
    };
    let (mut a, mut b) = (start("a"), start("b"));
    let echo = PluginDigest::of(&std::fs::read(&guests.echo).unwrap());
    all_run_lines(&mut [&mut a, &mut b], echo.short()).await;
    let cli_config = dir.path().join("operator.toml");
    std::fs::write(
        &cli_config,
        config("operator", &table, &stream, &guests.echo, &artifacts),
    )
    .unwrap();
    let cli_config = cli_config.to_str().unwrap();
    let versions = ["versions", "-c", cli_config, "-s", "fleet"];

    let rule = ["--canary", "0.5", "--rollback-on-failure-rate", "0.05"];
    deploy(
        cli_config,
        &env,
        &[&rule[..], &["--min-records", "10"]].concat(),
        &guests.chaos,
    );
    let (text, took) = versions_until(&versions, &env, Duration::from_secs(60), |t| {
        t.contains("auto-rollback")
    })
    .await;
    eprintln!(
        "a canary trapping on 20 % of its records: rolled back by its rule {took:?} after the deploy returned\n{text}"
    );
    assert!(!text.contains("canary:  "), "no canary left: {text}");
    assert!(text.contains(&format!("stable:  {echo}")), "{text}");
    assert!(
        text.contains("candidate failed"),
        "the figures are in the history: {text}"
    );

    // A healthy candidate (the echo guest under another digest) is
    // promoted after its window.
    let v2 = guests::variant(&guests.echo, "v2", dir.path()).unwrap();
    let v2_digest = PluginDigest::of(&std::fs::read(&v2).unwrap());
    let healthy = [&rule[..], &["--min-records", "20", "--promote-after", "5s"]].concat();
    deploy(cli_config, &env, &healthy, &v2);
    let (text, took) = versions_until(&versions, &env, Duration::from_secs(60), |t| {
        t.contains("auto-promote")
    })
    .await;
    eprintln!(
        "a healthy canary with promote_after = 5s: promoted {took:?} after the deploy returned\n{text}"
    );
    assert!(text.contains(&format!("stable:  {v2_digest}")), "{text}");
    all_run_lines(&mut [&mut a, &mut b], v2_digest.short()).await;

    // Nothing lost through either decision.
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    everything_handled(&mut a, &[&b], &put, handled_data).await;
    // The chaos guest logs a record before it traps on it: every record it
    // trapped on must have been acked by echo since.
    let echoed: std::collections::HashSet<String> = [&a, &b]
        .iter()
        .flat_map(|h| h.lines())
        .filter(|l| field(l, "message").starts_with("echo "))
        .filter_map(|l| {
            Some(
                field(&l, "message")
                    .split_once(" data=")?
                    .1
                    .trim_matches('"')
                    .to_owned(),
            )
        })
        .collect();
    let trapped: Vec<&String> = put
        .iter()
        .filter(|d| d.starts_with("trap-") && !echoed.contains(*d))
        .collect();
    assert!(
        trapped.is_empty(),
        "trapped on and never handled since: {trapped:?}"
    );
    for host in [&mut a, &mut b] {
        assert!(host.terminate().await.unwrap().success());
    }
}

/// Starts a host on `cfg` (admin token `s3cret`) and, through its admin
/// API, a shadow of subscription `name` from `shadow`'s bytes; the host
/// and its admin address.
async fn shadowed(
    cfg: &str,
    kinesis: &Kinesis,
    name: &str,
    shadow: &[u8],
) -> (HostProcess, String) {
    let mut host = HostProcess::start(shardlane_bin(), cfg, kinesis.endpoint()).unwrap();
    host.wait_for("admin listening", Duration::from_secs(60), |lines| {
        lines
            .iter()
            .any(|l| field(l, "message").starts_with("admin listening"))
    })
    .await
    .unwrap();
    let addr = crate::common::admin_addr(&host);
    let path = format!("/subscriptions/{name}/shadow");
    let (status, body) =
        shardlane_testkit::admin::http(&addr, "PUT", &path, Some("s3cret"), shadow);
    assert_eq!(status, 200, "{body}");
    (host, addr)
}

/// `/metrics` once the shadow has made at least `calls` calls.
async fn shadow_calls_reach(addr: &str, calls: f64) -> String {
    use shardlane_testkit::admin::{http, metric_sum};
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, metrics) = http(addr, "GET", "/metrics", None, b"");
        if metric_sum(&metrics, "shardlane_shadow_calls_total", &[]) >= calls {
            return metrics;
        }
        assert!(
            Instant::now() < deadline,
            "the shadow did not make {calls} calls:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every host logs a guest line from version `digest` (short).
async fn all_run_lines(hosts: &mut [&mut HostProcess], digest: &str) {
    for host in hosts.iter_mut() {
        host.wait_for(
            &format!("a record handled by {digest}"),
            Duration::from_secs(60),
            |lines| {
                lines
                    .iter()
                    .any(|l| field(l, "target") == "guest" && field(l, "plugin") == digest)
            },
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shadow_is_compared_exactly_and_nothing_it_does_is_applied() {
    use shardlane_testkit::admin::metric_sum;
    let examples = shardlane_testkit::build_examples(shardlane_testkit::Language::Rust).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (unique_name("shadowed"), unique_name("totals"));
    kinesis.create_stream(&input, 2).await.unwrap();
    kinesis.create_stream(&output, 1).await.unwrap();
    // Live: echo (acks, writes nothing). Shadow: running-total, which
    // writes its key's total to state and publishes it, and rejects data
    // that is not an amount.
    let cfg = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret\"\n\n[lease]\nstore = \"file\"\npath = \"{}\"\n{}",
        dir.path().join("leases").display(),
        crate::common::subscription(
            "shadowed",
            &input,
            &examples.echo,
            &format!(
                "start = \"trim_horizon\"\nstate = {{}}\noutputs = [\"{output}\"]\nconfig = {{ output_stream = \"{output}\" }}"
            ),
        )
    );
    let config_path = dir.path().join("shardlane.toml");
    std::fs::write(&config_path, &cfg).unwrap();
    let shadow = std::fs::read(&examples.running_total).unwrap();
    let (mut host, addr) = shadowed(&cfg, &kinesis, "shadowed", &shadow).await;

    let (valid, invalid) = (30, 4);
    let mut records: Vec<(String, Vec<u8>)> = (0..valid)
        .map(|i| {
            (
                format!("k{}", i % 4),
                format!("{{\"amount\": {i}}}").into_bytes(),
            )
        })
        .collect();
    for i in 0..invalid {
        records.insert(i * 7, (format!("k{i}"), b"not an amount".to_vec()));
    }
    kinesis.put_records(&input, &records).await.unwrap();
    let total = (valid + invalid) as f64;
    let metrics = shadow_calls_reach(&addr, total).await;
    let diffs = |kind: &str| {
        metric_sum(
            &metrics,
            "shardlane_shadow_diffs_total",
            &[&format!("kind=\"{kind}\"")],
        )
    };
    assert_eq!(
        metric_sum(&metrics, "shardlane_shadow_calls_total", &[]),
        total
    );
    assert_eq!(
        diffs("outcome"),
        invalid as f64,
        "the shadow rejects what the live version acks"
    );
    assert_eq!(
        diffs("state"),
        valid as f64,
        "the shadow writes a total per amount"
    );
    assert_eq!(
        diffs("output"),
        valid as f64,
        "the shadow publishes a total per amount"
    );
    assert_eq!(
        metric_sum(&metrics, "shardlane_shadow_dropped_total", &[]),
        0.0
    );
    // The first differences are logged with shard and sequence number.
    let logged: Vec<_> = host
        .lines()
        .into_iter()
        .filter(|l| field(l, "message").starts_with("shadow differs"))
        .collect();
    assert!(!logged.is_empty() && logged.len() <= 10, "{}", logged.len());
    assert!(!field(&logged[0], "sequence_number").is_empty());
    // Nothing the shadow did was applied: no output, no state.
    assert!(host.terminate().await.unwrap().success());
    assert!(
        kinesis.read_all(&output).await.unwrap().is_empty(),
        "the shadow's outputs were published"
    );
    let out = cli(
        &[
            "state",
            "get",
            "-c",
            config_path.to_str().unwrap(),
            "-s",
            "shadowed",
            "-k",
            "k0",
            "-k",
            "k1",
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.matches("(no state)").count(),
        2,
        "the shadow's state was written: {text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shadow_may_only_get_head_and_options() {
    use shardlane_testkit::admin::metric_sum;
    use shardlane_testkit::http_server::HttpServer;
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let server = HttpServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (unique_name("shadowhttp"), unique_name("fetched"));
    kinesis.create_stream(&input, 1).await.unwrap();
    kinesis.create_stream(&output, 1).await.unwrap();
    // Live and shadow: the publisher guest, which GETs or POSTs what the
    // record says and publishes the answer.
    let cfg = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret\"\n\n[lease]\nstore = \"memory\"\n{}",
        crate::common::subscription(
            "fetch",
            &input,
            &guests.publisher,
            &format!(
                "start = \"trim_horizon\"\nhandler_timeout = \"10s\"\noutputs = [\"{output}\"]\nconfig = {{ out_stream = \"{output}\" }}\nhttp = {{ allow = [\"{}\"], timeout = \"2s\" }}",
                server.authority()
            ),
        )
    );
    let shadow = guests::variant(&guests.publisher, "shadow", dir.path()).unwrap();
    let (mut host, addr) =
        shadowed(&cfg, &kinesis, "fetch", &std::fs::read(&shadow).unwrap()).await;
    let records = vec![
        (
            "a".to_owned(),
            format!("get:{}", server.url("/ok")).into_bytes(),
        ),
        (
            "b".to_owned(),
            format!("post:{}", server.url("/ok")).into_bytes(),
        ),
    ];
    kinesis.put_records(&input, &records).await.unwrap();
    let metrics = shadow_calls_reach(&addr, 2.0).await;
    // Live: GET and POST reach the server; the shadow: only the GET.
    assert_eq!(server.requests(), 3);
    assert_eq!(
        metric_sum(
            &metrics,
            "shardlane_shadow_diffs_total",
            &["kind=\"output\""]
        ),
        1.0,
        "only the POST's answer differs (denied in the shadow)"
    );
    let denied = host
        .lines()
        .into_iter()
        .find(|l| field(l, "message").starts_with("shadow differs"))
        .expect("the difference is logged");
    assert!(
        field(&denied, "candidate").contains("HTTP-request-denied")
            || field(&denied, "candidate").contains("HttpRequestDenied"),
        "{denied:?}"
    );
    assert!(host.terminate().await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_shadow_never_holds_the_live_checkpoint() {
    use shardlane_testkit::admin::{http, metric_sum};
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = unique_name("slowshadow");
    kinesis.create_stream(&input, 1).await.unwrap();
    // Live: the retry guest, which acks these at once; shadow: the slow
    // guest, which sleeps 300 ms on each.
    let cfg = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret\"\n\n[lease]\nstore = \"memory\"\n{}",
        crate::common::subscription("live", &input, &guests.retry, "start = \"trim_horizon\"")
    );
    let slow = guests::variant(&guests.slow, "shadow", dir.path()).unwrap();
    let (mut host, addr) = shadowed(&cfg, &kinesis, "live", &std::fs::read(&slow).unwrap()).await;
    let records: Vec<(String, Vec<u8>)> = (0..400)
        .map(|i| (format!("k{}", i % 8), b"sleep=300;".to_vec()))
        .collect();
    kinesis.put_records(&input, &records).await.unwrap();
    host.wait_for(
        "every record handled live",
        Duration::from_secs(60),
        |lines| handled(lines).len() >= records.len(),
    )
    .await
    .unwrap();
    let last = handled(&host.lines())
        .into_iter()
        .map(|(_, _, seq)| seq)
        .max_by(|a, b| crate::common::seq_key(a).cmp(&crate::common::seq_key(b)))
        .unwrap();
    // The live checkpoint reaches the last record while the shadow has
    // made a fraction of the calls and dropped what it could not queue.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, json) = http(&addr, "GET", "/status.json", None, b"");
        let snapshot: serde_json::Value = serde_json::from_str(&json).unwrap();
        let checkpoint = snapshot["subscriptions"][0]["shards"][0]["checkpoint"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if checkpoint == last {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the checkpoint is at {checkpoint:?}, the last record at {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, metrics) = http(&addr, "GET", "/metrics", None, b"");
    let calls = metric_sum(&metrics, "shardlane_shadow_calls_total", &[]);
    let dropped = metric_sum(&metrics, "shardlane_shadow_dropped_total", &[]);
    assert!(calls < 100.0, "the shadow is behind: {calls} calls");
    assert!(dropped > 0.0, "what it cannot queue is dropped: {dropped}");
    eprintln!(
        "slow shadow: live checkpoint at the last of 400 records; shadow made {calls} calls, dropped {dropped}"
    );
    assert!(host.terminate().await.unwrap().success());
}
