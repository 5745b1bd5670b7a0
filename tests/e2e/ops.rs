//! Running the host as a service: plugin hot-swap under load (file and
//! admin API), the admin token, metrics, readiness, and the status page in
//! a real headless Chromium.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use shardlane_testkit::{HostProcess, Kinesis, LogLine, guests, unique_name};
use tokio::task::JoinHandle;

use crate::common::{config, field, shardlane_bin};

/// The admin server's address, from the host's log.
fn admin_addr(host: &HostProcess) -> String {
    host.lines()
        .iter()
        .find(|l| field(l, "message").starts_with("admin listening"))
        .map(|l| field(l, "addr").to_owned())
        .expect("the host logs where admin listens")
}

/// One HTTP/1.1 request; returns (status, body).
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to admin");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

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
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let client = kinesis.client();
    let stream = stream.to_owned();
    let task = tokio::spawn(async move {
        let mut put = Vec::new();
        let mut n = 0;
        while !flag.load(Ordering::SeqCst) {
            for _ in 0..5 {
                n += 1;
                let data = format!("r{n}");
                client
                    .put_record()
                    .stream_name(&stream)
                    .partition_key(format!("key-{}", n % 12))
                    .data(aws_sdk_kinesis::primitives::Blob::new(
                        data.clone().into_bytes(),
                    ))
                    .send()
                    .await
                    .expect("PutRecord");
                put.push(data);
            }
            // A steady trickle of records throughout the swap.
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        put
    });
    (stop, task)
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
    let before = handled(&host.lines()).len();
    host.wait_for("still handling", Duration::from_secs(30), |lines| {
        handled(lines).len() >= before + 50
    })
    .await
    .unwrap();

    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    host.wait_for("everything handled", Duration::from_secs(60), |lines| {
        handled(lines).len() >= put.len()
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    check_exactly_once_and_switch_per_lane(&put, &host.lines());
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
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    host.wait_for("everything handled", Duration::from_secs(60), |lines| {
        handled(lines).len() >= put.len()
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
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
    let (status, metrics) = http(&addr, "GET", "/metrics", None, b"");
    assert_eq!(status, 200);
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
    assert!(dom.contains("<td>reading</td>"), "{dom}");
    assert!(dom.contains("workers = 2"), "{dom}");
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
