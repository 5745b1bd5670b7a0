//! Running the host as a service: plugin hot-swap under load (file and
//! admin API), the admin token, metrics, readiness, and the status page in
//! a real headless Chromium.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use shardlane_testkit::{HostProcess, Kinesis, LogLine, guests, unique_name};
use tokio::task::JoinHandle;

use crate::common::{admin_addr, config, field, http, shardlane_bin, subscription, trickle};

/// (version, data, lane) of every handled record in log order: v1 is the
/// retry guest (`handled data=…`), v2 the echo guest (`echo … data="…"`).
fn handled(lines: &[LogLine]) -> Vec<(u8, String, u64)> {
    lines
        .iter()
        .filter(|l| field(l, "target") == "guest")
        .filter_map(|l| {
            let m = field(l, "message");
            let lane = l["lane"].as_u64().unwrap_or(0);
            if let Some(rest) = m.strip_prefix("handled data=") {
                Some((1, rest.rsplit_once(" attempt=").unwrap().0.to_owned(), lane))
            } else if m.starts_with("echo ") {
                let data = m
                    .split_once(" data=")
                    .unwrap()
                    .1
                    .trim_matches('"')
                    .to_owned();
                Some((2, data, lane))
            } else {
                None
            }
        })
        .collect()
}

fn producer(kinesis: &Kinesis, stream: &str) -> (Arc<AtomicBool>, JoinHandle<Vec<String>>) {
    // A steady trickle of records throughout the swap.
    trickle(kinesis, stream, 5, Duration::from_millis(40), |n| {
        let data = format!("r{n}");
        (format!("key-{}", n % 12), data.clone().into_bytes(), data)
    })
}

/// Replaces `path` atomically (write beside, then rename), as a deploy
/// would; returns when it happened.
fn replace(path: &Path, bytes: &[u8]) -> SystemTime {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
    SystemTime::now()
}

fn check_exactly_once_and_switch_per_lane(put: &[String], lines: &[LogLine]) {
    let handled = handled(lines);
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (_, data, _) in &handled {
        *count.entry(data.as_str()).or_default() += 1;
    }
    for data in put {
        assert_eq!(
            count.get(data.as_str()),
            Some(&1),
            "{data} handled exactly once"
        );
    }
    let mut per_lane: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (version, _, lane) in &handled {
        per_lane.entry(*lane).or_default().push(*version);
    }
    for (lane, versions) in per_lane {
        let first_new = versions
            .iter()
            .position(|&v| v == 2)
            .unwrap_or(versions.len());
        assert!(
            versions[first_new..].iter().all(|&v| v == 2),
            "lane {lane}: the old version ran after the new one"
        );
    }
}

/// Waits until `more` records beyond those handled so far are handled.
async fn handle_more(host: &mut HostProcess, what: &str, more: usize) {
    let seen = handled(&host.lines()).len();
    host.wait_for(what, Duration::from_secs(30), |lines| {
        handled(lines).len() >= seen + more
    })
    .await
    .unwrap();
}

/// Stops the producer, waits until the host has handled all it put, and
/// stops the host cleanly: what was put, and the host's log.
async fn drain(
    mut host: HostProcess,
    stop: Arc<AtomicBool>,
    producer: JoinHandle<Vec<String>>,
) -> (Vec<String>, Vec<LogLine>) {
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    host.wait_for("everything handled", Duration::from_secs(60), |lines| {
        handled(lines).len() >= put.len()
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    (put, lines)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_swap_under_load_loses_nothing_and_handles_nothing_twice() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("swap");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("handler.wasm");
    std::fs::copy(&guests.retry, &plugin).unwrap();
    let cfg = config(
        "swap",
        &stream,
        &plugin,
        "start = \"trim_horizon\"\nworkers = 3\nby_key = true",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let (stop, producer) = producer(&kinesis, &stream);
    host.wait_for("v1 at work", Duration::from_secs(60), |lines| {
        handled(lines).len() >= 100
    })
    .await
    .unwrap();

    let changed_at = replace(&plugin, &std::fs::read(&guests.echo).unwrap());
    host.wait_for("v2 at work", Duration::from_secs(30), |lines| {
        handled(lines).iter().filter(|h| h.0 == 2).count() >= 50
    })
    .await
    .unwrap();
    let lines = host.lines();
    let swapped = lines
        .iter()
        .find(|l| field(l, "message").starts_with("plugin swapped"))
        .unwrap();
    let swapped_at = humantime::parse_rfc3339_weak(field(swapped, "timestamp")).unwrap();
    let live = swapped_at.duration_since(changed_at).unwrap_or_default();
    eprintln!(
        "file swap: live {live:?} after the rename ({} ms compile and validation)",
        swapped["live_after_ms"]
    );
    assert!(
        live <= Duration::from_secs(1),
        "live within 1 s of the file change, took {live:?}"
    );

    // An invalid version is refused; the running one keeps handling.
    replace(&plugin, b"definitely not wasm");
    host.wait_for("the refusal", Duration::from_secs(30), |lines| {
        lines
            .iter()
            .any(|l| field(l, "message") == "new plugin version refused; the running version stays")
    })
    .await
    .unwrap();
    handle_more(&mut host, "still handling", 50).await;

    let (put, lines) = drain(host, stop, producer).await;
    check_exactly_once_and_switch_per_lane(&put, &lines);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_api_needs_its_token_and_swaps_like_a_file() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("admin");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let cfg = config(
        "admin-swap",
        &stream,
        &guests.retry,
        "start = \"trim_horizon\"\nworkers = 2\nby_key = true",
    )
    .replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret\"",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let (stop, producer) = producer(&kinesis, &stream);
    host.wait_for("v1 at work", Duration::from_secs(60), |lines| {
        handled(lines).len() >= 50
    })
    .await
    .unwrap();
    let addr = admin_addr(&host);
    let echo = std::fs::read(&guests.echo).unwrap();
    let path = "/subscriptions/admin-swap/plugin";

    let (status, _) = http(&addr, "PUT", path, None, &echo);
    assert_eq!(status, 401, "no token");
    let (status, _) = http(&addr, "PUT", path, Some("wrong"), &echo);
    assert_eq!(status, 401, "wrong token");
    assert!(
        handled(&host.lines()).iter().all(|h| h.0 == 1),
        "unauthenticated calls change nothing"
    );
    let (status, body) = http(
        &addr,
        "PUT",
        "/subscriptions/nobody/plugin",
        Some("s3cret"),
        &echo,
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(&addr, "PUT", path, Some("s3cret"), b"not wasm");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("not a WebAssembly file"), "{body}");

    let (status, body) = http(&addr, "PUT", path, Some("s3cret"), &echo);
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(report["changed"], true);
    assert!(report["new"].as_str().unwrap().starts_with("sha256:"));
    eprintln!("admin swap: live after {} ms", report["live_after_ms"]);
    // Reading the plugin file (as other processes do) is no change to it:
    // the watcher must not reload it and undo the admin swap.
    std::fs::read(&guests.retry).unwrap();
    // Longer than the watcher's debounce.
    tokio::time::sleep(Duration::from_millis(500)).await;
    host.wait_for("v2 at work", Duration::from_secs(30), |lines| {
        handled(lines).iter().filter(|h| h.0 == 2).count() >= 30
    })
    .await
    .unwrap();
    let (put, lines) = drain(host, stop, producer).await;
    let swaps = lines
        .iter()
        .filter(|l| field(l, "message").starts_with("plugin swapped"))
        .count();
    assert_eq!(
        swaps, 1,
        "only the admin swap; reading the file swapped nothing back"
    );
    check_exactly_once_and_switch_per_lane(&put, &lines);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_readiness_and_the_status_page() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("ops");
    kinesis.create_stream(&stream, 3).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..60)
        .map(|i| (format!("k{i}"), format!("r{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "ops",
        &stream,
        &guests.retry,
        "start = \"trim_horizon\"\nworkers = 2",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for(
        "60 records and a checkpoint on every shard",
        Duration::from_secs(60),
        |lines| {
            let checkpointed: std::collections::HashSet<&str> = lines
                .iter()
                .filter(|l| field(l, "message") == "checkpoint written")
                .map(|l| field(l, "shard_id"))
                .collect();
            handled(lines).len() >= 60 && checkpointed.len() == 3
        },
    )
    .await
    .unwrap();
    let addr = admin_addr(&host);

    assert_eq!(http(&addr, "GET", "/healthz", None, b"").0, 200);
    let (status, body) = http(&addr, "GET", "/readyz", None, b"");
    assert_eq!(status, 200, "{body}");
    // A handler's log line is written during its call, the counters after
    // it returns: poll until the last calls are counted.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (status, metrics) = http(&addr, "GET", "/metrics", None, b"");
        assert_eq!(status, 200);
        let counted = metrics
            .contains("shardlane_records_total{subscription=\"ops\",outcome=\"ack\"} 60")
            && metrics
                .contains("shardlane_handler_duration_seconds_count{subscription=\"ops\"} 60");
        if counted || std::time::Instant::now() > deadline {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for series in [
        "shardlane_records_total{subscription=\"ops\",outcome=\"ack\"} 60",
        "# TYPE shardlane_handler_duration_seconds histogram",
        "shardlane_handler_duration_seconds_count{subscription=\"ops\"} 60",
        "shardlane_leases_held{subscription=\"ops\"} 3",
        "shardlane_records_unsettled{subscription=\"ops\"}",
        "shardlane_channel_fill{subscription=\"ops\"}",
        "shardlane_millis_behind_latest{subscription=\"ops\",shard_id=\"shardId-000000000000\"}",
        "shardlane_checkpoint_age_seconds{subscription=\"ops\",shard_id=",
        "shardlane_plugin_info{subscription=\"ops\",digest=\"sha256:",
        "shardlane_lane_calls_total{subscription=\"ops\",lane=\"1\"}",
    ] {
        assert!(metrics.contains(series), "missing {series} in\n{metrics}");
    }
    // Writes are off without a token.
    assert_eq!(
        http(&addr, "PUT", "/subscriptions/ops/plugin", Some("x"), b"").0,
        403
    );

    // The status page, rendered by a real browser.
    let profile = tempfile::tempdir().unwrap();
    let output = std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        // Lets the page's script poll a few times before the DOM is dumped.
        .arg("--virtual-time-budget=7000")
        .arg("--dump-dom")
        .arg(format!("http://{addr}/"))
        .output()
        .expect(
            "headless Chromium (Debian package `chromium`) must be installed: .ci/run installs it",
        );
    let dom = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    for shard in 0..3 {
        assert!(
            dom.contains(&format!("data-shard=\"shardId-00000000000{shard}\"")),
            "shard {shard} missing:\n{dom}"
        );
    }
    assert!(dom.contains("data-name=\"ops\""), "{dom}");
    assert!(dom.contains("class=\"digest\">sha256:"), "{dom}");
    assert!(dom.contains("<td class=\"state\">reading</td>"), "{dom}");
    assert!(dom.contains("workers = 2"), "{dom}");
    // Live: the script polled /status.json, updated the page in place and
    // drew a lag chart per shard and a calls-per-second chart.
    assert!(dom.contains("id=\"updated\">updated 20"), "{dom}");
    // 3 lag and 3 records/s charts, one per shard; calls/s; the stable
    // version's records/s and share not acked; 2 lanes' calls/s.
    assert!(
        dom.matches("<svg class=\"spark\"").count() >= 11,
        "a lag and a records chart per shard, a calls chart, the version's two and a chart per lane:\n{dom}"
    );
    assert!(dom.contains("<polyline"), "{dom}");
    // The fleet's version history: the config's plugin, declared at start.
    assert!(
        dom.contains("<tr class=\"change\">") && dom.contains("<td>declared</td>"),
        "{dom}"
    );
    assert!(
        dom.contains("<tr class=\"version stable\" data-role=\"stable\">"),
        "{dom}"
    );
    assert!(dom.contains("<td class=\"ack num\">60</td>"), "{dom}");
    // Each shard's lease taken here, listed.
    assert_eq!(
        dom.matches("<tr class=\"lease-change\">").count(),
        3,
        "{dom}"
    );
    let (status, json) = http(&addr, "GET", "/status.json", None, b"");
    assert_eq!(status, 200);
    let snapshot: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(snapshot["subscriptions"][0]["name"], "ops");
    let sub = &snapshot["subscriptions"][0];
    let shards = sub["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 3);
    let read: u64 = shards.iter().map(|s| s["records"].as_u64().unwrap()).sum();
    assert_eq!(read, 60, "each record read once: {json}");
    assert_eq!(sub["versions"][0]["ack"], 60, "{json}");
    let changes = sub["lease_changes"].as_array().unwrap();
    assert_eq!(changes.len(), 3, "{json}");
    assert!(
        changes
            .iter()
            .all(|c| c["from"].is_null() && c["to"] == shards[0]["owner"]),
        "every lease taken here from nobody: {json}"
    );
    host.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn compiled_components_are_cached_across_starts() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("cache");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let cache = tempfile::tempdir().unwrap();
    let cfg = format!(
        "[engine]\ncache_dir = \"{}\"\n{}",
        cache.path().display(),
        config("cache", &stream, &guests.echo, "")
    );
    let mut times = Vec::new();
    for (run, want) in [(1, "miss"), (2, "hit")] {
        let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
        host.wait_for("the plugin loaded", Duration::from_secs(60), |lines| {
            lines.iter().any(|l| field(l, "cache") == want)
        })
        .await
        .unwrap_or_else(|e| panic!("run {run}: {e}"));
        let line = host
            .lines()
            .into_iter()
            .find(|l| field(l, "cache") == want)
            .unwrap();
        times.push((want, line["elapsed_ms"].as_f64().unwrap()));
        assert!(host.terminate().await.unwrap().success());
    }
    eprintln!(
        "echo plugin (Rust): compile {:.1} ms (cache miss), load {:.1} ms (cache hit)",
        times[0].1, times[1].1
    );
    let entries = std::fs::read_dir(cache.path()).unwrap().count();
    assert_eq!(entries, 1, "one entry for one component and engine");
}

/// (version, data number, partition key) of every handled record in log
/// order (versions as in [`handled`]).
fn handled_by_key(lines: &[LogLine]) -> Vec<(u8, u64, String)> {
    lines
        .iter()
        .filter(|l| field(l, "target") == "guest")
        .filter_map(|l| {
            let m = field(l, "message");
            let version = if m.starts_with("handled data=") {
                1
            } else if m.starts_with("echo ") {
                2
            } else {
                return None;
            };
            let data = handled(std::slice::from_ref(l)).pop()?.1;
            let n = data.trim_start_matches('r').parse().ok()?;
            Some((version, n, field(l, "partition_key").to_owned()))
        })
        .collect()
}

/// Index of the first log line whose message starts with `prefix`.
fn position(lines: &[LogLine], prefix: &str) -> usize {
    lines
        .iter()
        .position(|l| field(l, "message").starts_with(prefix))
        .unwrap_or_else(|| panic!("no log line {prefix:?}"))
}

/// Per key, in `handled` (log order): the version switches from `from` to
/// `to` at most once, never back.
fn switches_once(handled: &[(u8, u64, String)], from: u8, to: u8, window: &str) {
    let mut seen_to: HashMap<&str, bool> = HashMap::new();
    for (version, n, key) in handled {
        let switched = seen_to.entry(key.as_str()).or_default();
        if *version == to {
            *switched = true;
        } else {
            assert!(
                *version == from && !*switched,
                "{window}: key {key} went back to v{version} at r{n}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_canary_keeps_its_keys_and_rolls_back_and_promotes_without_loss() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("canary");
    kinesis.create_stream(&stream, 2).await.unwrap();
    // Stable: the retry guest (v1); candidate: echo (v2).
    let cfg = config(
        "canary",
        &stream,
        &guests.retry,
        &format!(
            "start = \"trim_horizon\"\nworkers = 3\nby_key = true\ncanary = {{ plugin = \"{}\", key_fraction = 0.3 }}",
            guests.echo.display()
        ),
    )
    .replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret\"",
    );
    let slice = shardlane::KeySlice::new(0.3).unwrap();
    let in_slice = |key: &str| slice.contains(&shardlane::PartitionKey::from(key));
    let keys: Vec<String> = (0..12).map(|i| format!("key-{i}")).collect();
    assert!(
        keys.iter().any(|k| in_slice(k)) && keys.iter().any(|k| !in_slice(k)),
        "the producer's keys fall on both sides of the slice"
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let (stop, producer) = producer(&kinesis, &stream);
    host.wait_for("both versions at work", Duration::from_secs(60), |lines| {
        handled(lines).len() >= 150
    })
    .await
    .unwrap();
    let addr = admin_addr(&host);

    // While the canary runs, keys in the slice only ever see the candidate.
    let during = handled_by_key(&host.lines());
    for (version, n, key) in &during {
        let want = if in_slice(key) { 2 } else { 1 };
        assert_eq!(*version, want, "r{n} of {key} ran on v{version}");
    }
    let (status, metrics) = http(&addr, "GET", "/metrics", None, b"");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("shardlane_canary_records_total{subscription=\"canary\",version=\"candidate\",outcome=\"ack\"}")
            && metrics.contains("role=\"candidate\"} 1"),
        "{metrics}"
    );
    // The status page's versions: the stable one's and the candidate's
    // outcomes since the canary began, side by side.
    let (status, json) = http(&addr, "GET", "/status.json", None, b"");
    assert_eq!(status, 200);
    let snapshot: serde_json::Value = serde_json::from_str(&json).unwrap();
    let versions = snapshot["subscriptions"][0]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{json}");
    assert_eq!(versions[0]["role"], "stable", "{json}");
    assert_eq!(versions[1]["role"], "candidate", "{json}");
    assert_ne!(versions[0]["digest"], versions[1]["digest"], "{json}");
    let acked = |v: &serde_json::Value| v["ack"].as_u64().unwrap();
    assert!(
        acked(&versions[0]) > 0 && acked(&versions[1]) > 0,
        "both versions handled records: {json}"
    );

    // Rollback: a token is needed; then every key returns to v1.
    let rollback = "/subscriptions/canary/canary/rollback";
    assert_eq!(http(&addr, "POST", rollback, None, b"").0, 401);
    let (status, body) = http(&addr, "POST", rollback, Some("s3cret"), b"");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(&addr, "POST", rollback, Some("s3cret"), b"");
    assert_eq!(status, 409, "no canary left: {body}");
    handle_more(&mut host, "after the rollback", 100).await;

    // A canary through the API, on half the keys, then promoted.
    let echo = std::fs::read(&guests.echo).unwrap();
    let canary = "/subscriptions/canary/canary?key_fraction=0.5";
    let (status, body) = http(
        &addr,
        "PUT",
        "/subscriptions/canary/canary",
        Some("s3cret"),
        &echo,
    );
    assert_eq!(status, 400, "key_fraction is required: {body}");
    let (status, body) = http(&addr, "PUT", canary, Some("s3cret"), b"not wasm");
    assert_eq!(status, 422, "{body}");
    // The candidate may take its first records before "canary started" is
    // logged: the window closes where the request was made.
    let second = host.lines().len();
    let (status, body) = http(&addr, "PUT", canary, Some("s3cret"), &echo);
    assert_eq!(status, 200, "{body}");
    handle_more(&mut host, "the second canary", 60).await;
    let (status, body) = http(
        &addr,
        "POST",
        "/subscriptions/canary/canary/promote",
        Some("s3cret"),
        b"",
    );
    assert_eq!(status, 200, "{body}");
    handle_more(&mut host, "after the promotion", 100).await;

    let (put, lines) = drain(host, stop, producer).await;

    // Nothing lost, nothing twice, every key in order throughout.
    let all = handled_by_key(&lines);
    let mut count: HashMap<u64, usize> = HashMap::new();
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (_, n, key) in &all {
        *count.entry(*n).or_default() += 1;
        let previous = last.insert(key.as_str(), *n).unwrap_or(0);
        assert!(previous < *n, "{key}: r{n} after r{previous}");
    }
    for data in &put {
        let n: u64 = data[1..].parse().unwrap();
        assert_eq!(count.get(&n), Some(&1), "{data} handled exactly once");
    }

    // Between rollback and the second canary: keys only move back to v1.
    let rolled_back = position(&lines, "canary rolled back");
    // (The config's canary starts too, at start-up: the API's is the last.)
    let started = lines
        .iter()
        .rposition(|l| field(l, "message").starts_with("canary started"))
        .expect("a canary started");
    assert!(rolled_back < second && second <= started);
    let promoted = position(&lines, "canary promoted");
    let window = handled_by_key(&lines[rolled_back..second]);
    switches_once(&window, 2, 1, "rollback");
    assert!(
        window.iter().any(|(v, _, k)| *v == 1 && in_slice(k)),
        "keys of the slice returned to the stable version"
    );
    // After the promotion: keys only move on to v2, and all end there.
    let after = handled_by_key(&lines[promoted..]);
    switches_once(&after, 1, 2, "promotion");
    let mut final_version: HashMap<&str, u8> = HashMap::new();
    for (version, _, key) in &after {
        final_version.insert(key.as_str(), *version);
    }
    assert!(
        final_version.values().all(|&v| v == 2),
        "every key ends on the promoted version: {final_version:?}"
    );
}

/// The innermost span of a JSON log line, when it has one.
fn innermost_span(line: &LogLine) -> Option<&serde_json::Value> {
    line["spans"].as_array().and_then(|spans| spans.last())
}

/// Guest lines logged during a handler call carry the call's span, with
/// OpenTelemetry's messaging fields (JSON logs list the spans of a line).
#[tokio::test(flavor = "multi_thread")]
async fn handler_calls_run_in_spans_with_opentelemetry_messaging_fields() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("spans");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| (format!("k{i}"), format!("r{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "spans",
        &stream,
        &guests.echo,
        "start = \"trim_horizon\"\nworkers = 2\nby_key = true",
    ) + &subscription(
        "spans-batch",
        &stream,
        &guests.batch,
        "start = \"trim_horizon\"\nbatch_size = 5",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let guest_lines = |lines: &[LogLine], sub: &str, prefix: &str| -> Vec<LogLine> {
        lines
            .iter()
            .filter(|l| {
                field(l, "target") == "guest"
                    && field(l, "subscription") == sub
                    && field(l, "message").starts_with(prefix)
            })
            .cloned()
            .collect()
    };
    host.wait_for(
        "both subscriptions done",
        Duration::from_secs(60),
        |lines| {
            guest_lines(lines, "spans", "echo").len() >= 20
                && guest_lines(lines, "spans-batch", "item").len() >= 20
        },
    )
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();

    // handle: one `process` span per record, naming the message.
    for line in guest_lines(&lines, "spans", "echo") {
        let span = innermost_span(&line).unwrap_or_else(|| panic!("no span: {line}"));
        assert_eq!(span["name"], "process", "{line}");
        assert_eq!(span["otel.kind"], "consumer", "{line}");
        assert_eq!(span["otel.name"], format!("process {stream}"), "{line}");
        assert_eq!(span["messaging.system"], "aws_kinesis", "{line}");
        assert_eq!(span["messaging.operation.type"], "process", "{line}");
        assert_eq!(span["messaging.operation.name"], "handle", "{line}");
        assert_eq!(
            span["messaging.destination.name"],
            stream.as_str(),
            "{line}"
        );
        assert_eq!(
            span["messaging.destination.partition.id"],
            field(&line, "shard_id"),
            "{line}"
        );
        assert_eq!(
            span["messaging.message.id"],
            field(&line, "sequence_number"),
            "{line}"
        );
        assert_eq!(span["messaging.consumer.group.name"], "spans", "{line}");
        assert_eq!(span["attempt"], 1, "{line}");
    }

    // handle-batch: one span per batch, with its size.
    let batches = guest_lines(&lines, "spans-batch", "batch size=");
    assert!(!batches.is_empty());
    let mut counted = 0;
    for line in &batches {
        let span = innermost_span(line).unwrap_or_else(|| panic!("no span: {line}"));
        let size: u64 = field(line, "message")["batch size=".len()..]
            .parse()
            .unwrap();
        assert_eq!(span["name"], "process", "{line}");
        assert_eq!(span["messaging.operation.name"], "handle-batch", "{line}");
        assert_eq!(span["messaging.batch.message_count"], size, "{line}");
        assert_eq!(
            span["messaging.consumer.group.name"], "spans-batch",
            "{line}"
        );
        assert_eq!(
            span["messaging.destination.name"],
            stream.as_str(),
            "{line}"
        );
        counted += size;
    }
    assert_eq!(counted, 20, "the batch spans account for every record");
}

/// A dead-letter envelope names the version that failed the record: with a
/// canary, the candidate for keys in its slice.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_name_the_version_that_failed_them() {
    let guests = guests::build().unwrap();
    let examples = shardlane_testkit::build_examples(shardlane_testkit::Language::Rust).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let (stream, dlq) = (unique_name("dlq-version"), unique_name("dlq-version-dlq"));
    kinesis.create_stream(&stream, 1).await.unwrap();
    kinesis.create_stream(&dlq, 1).await.unwrap();
    // Stable: echo, which acks everything; candidate: poison, which
    // rejects `bad`. Only keys in the candidate's slice are dead-lettered.
    let slice = shardlane::KeySlice::new(0.5).unwrap();
    let keys: Vec<String> = (0..16).map(|i| format!("key-{i}")).collect();
    let in_slice: Vec<&String> = keys
        .iter()
        .filter(|k| slice.contains(&shardlane::PartitionKey::from(k.as_str())))
        .collect();
    assert!(!in_slice.is_empty() && in_slice.len() < keys.len());
    let records: Vec<(String, Vec<u8>)> =
        keys.iter().map(|k| (k.clone(), b"bad".to_vec())).collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "dlq-version",
        &stream,
        &guests.echo,
        &format!(
            "start = \"trim_horizon\"\non_failure = \"dead_letter\"\ndead_letter_stream = \"{dlq}\"\ncanary = {{ plugin = \"{}\", key_fraction = 0.5 }}",
            examples.poison.display()
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("every record settled", Duration::from_secs(60), |lines| {
        let guest = lines
            .iter()
            .filter(|l| field(l, "target") == "guest")
            .count();
        let dead = lines
            .iter()
            .filter(|l| field(l, "message") == "record dead-lettered")
            .count();
        guest >= keys.len() && dead >= in_slice.len()
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());

    let candidate = shardlane::PluginDigest::of(&std::fs::read(&examples.poison).unwrap());
    let mut dead_keys = Vec::new();
    for (key, data) in kinesis.read_all(&dlq).await.unwrap() {
        let envelope: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(envelope["plugin"], candidate.to_string(), "{envelope}");
        assert_eq!(envelope["reason"], "rejected: bad record", "{envelope}");
        dead_keys.push(key);
    }
    dead_keys.sort();
    let mut want: Vec<String> = in_slice.into_iter().cloned().collect();
    want.sort();
    assert_eq!(dead_keys, want, "exactly the keys of the candidate's slice");
}
