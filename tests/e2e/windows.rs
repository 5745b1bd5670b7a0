//! Windows (contract 0.3.0 `close-window`), exactly once with the
//! checkpoint: the `windowed` fixture adds each window's sum to its key's
//! total at the window's close, so a key's committed total is its sum of
//! amounts only if every window was closed exactly once — across `kill -9`
//! restarts with the file store (`by = "key"` lanes) and in a DynamoDB
//! fleet of two under `kill -9` and a hand-over, on a quiet shard
//! closed by its grace (`by = "shard"`), and across a split and a merge
//! (a parent's windows close before its children start).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use shardlane_testkit::{Dynalite, HostProcess, Kinesis, LogLine, guests, unique_name};
use tokio::task::JoinHandle;

use crate::common::{field, guest_lines, shardlane_bin, trickle};
use crate::leases::{env, fleet_config, split_then_merge, wait_counts};
use crate::state::{committed_totals_of, put_zero_per_key, sums};

const KEYS: usize = 30;

/// A file-store config for subscription `windows` on `stream`, with
/// `window` and `dispatch` lines.
fn config(dir: &Path, stream: &str, plugin: &Path, window: &str, dispatch: &str) -> String {
    format!(
        r#"
[admin]
listen = "127.0.0.1:0"

[lease]
store = "file"
path = "{}"
shard_sync_every = "1s"

[[subscription]]
name = "windows"
stream = "{stream}"
plugin = "{}"
start = "trim_horizon"
poll_idle = "50ms"
poll_idle_max = "100ms"
max_reads_per_second = 20
checkpoint_every = "100ms"
log_rate = 1000000
state = {{ max_value = "1KiB" }}
window = {window}
{dispatch}
"#,
        dir.join("leases").display(),
        plugin.display()
    )
}

/// Puts `{"amount": n}` records over [`KEYS`] keys, 20 every 100 ms, until
/// stopped; returns every (key, amount) put.
fn amounts(kinesis: &Kinesis, stream: &str) -> (Arc<AtomicBool>, JoinHandle<Vec<(String, i64)>>) {
    trickle(kinesis, stream, 20, Duration::from_millis(100), |n| {
        let (key, amount) = (format!("key-{}", n % KEYS), (n % 7) as i64 + 1);
        let data = format!("{{\"amount\": {amount}}}").into_bytes();
        (key.clone(), data, (key, amount))
    })
}

/// Each key's total as a close logged it last (`closed key=<k> ...
/// total=<t>`).
fn closed_totals<'a>(lines: impl Iterator<Item = &'a LogLine>) -> BTreeMap<String, i64> {
    let mut totals = BTreeMap::new();
    for line in lines {
        let message = field(line, "message");
        let Some(rest) = message.strip_prefix("closed key=") else {
            continue;
        };
        let key = rest.split(' ').next().unwrap();
        let total = rest
            .split(" total=")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .expect("a total")
            .parse()
            .expect("a number");
        totals.insert(key.to_owned(), total);
    }
    totals
}

/// No close ever saw a total above its key's sum: no window added twice.
fn never_over(lines: &[LogLine], expected: &BTreeMap<String, i64>) {
    for line in guest_lines(lines, "closed key=") {
        for (key, total) in closed_totals(std::iter::once(line)) {
            assert!(
                total <= expected[&key],
                "{key} reached {total}, more than its sum {}: a window was closed twice",
                expected[&key]
            );
        }
    }
}

/// Puts a zero under every key (a window of its own in the last process),
/// waits until every key's last close shows its sum, stops the host, and
/// checks the committed totals.
async fn settle_and_check(
    kinesis: &Kinesis,
    stream: &str,
    host: &mut HostProcess,
    config_path: &Path,
    expected: &BTreeMap<String, i64>,
) {
    put_zero_per_key(kinesis, stream, expected.keys()).await;
    host.wait_for(
        "every key's windows closed",
        Duration::from_secs(120),
        |lines| closed_totals(lines.iter()) == *expected,
    )
    .await
    .unwrap_or_else(|e| {
        let got = closed_totals(host.lines().iter());
        panic!("{e:#}: closed {got:?}, expected {expected:?}")
    });
    assert!(host.terminate().await.unwrap().success());
    let keys: Vec<String> = expected.keys().cloned().collect();
    let committed = committed_totals_of(config_path, "windows", &keys, &[]);
    if committed != *expected {
        let warnings: Vec<String> = host
            .lines()
            .iter()
            .filter(|l| matches!(field(l, "level"), "WARN" | "ERROR"))
            .map(ToString::to_string)
            .collect();
        panic!(
            "committed {committed:?}, expected {expected:?}; warnings:\n{}",
            warnings.join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn window_totals_are_exact_across_kill_9_restarts_with_the_file_store() {
    let guests = guests::build().unwrap();
    let window = r#"{ size = "1s", by = "key", grace = "200ms" }"#;
    kill_9_five_times(&guests.windowed, window, "workers = 2\nby_key = true").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn batched_window_totals_are_exact_across_kill_9_restarts() {
    let guests = guests::build().unwrap();
    let window = r#"{ size = "1s", by = "shard", grace = "200ms" }"#;
    kill_9_five_times(&guests.windowed_batch, window, "batch_size = 10").await;
}

/// Runs `plugin` with `window` and `dispatch` on the file store while
/// amounts flow, kills it with SIGKILL five times, and checks the totals.
async fn kill_9_five_times(plugin: &Path, window: &str, dispatch: &str) {
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("windows-kill");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("shardlane.toml");
    let cfg = config(dir.path(), &stream, plugin, window, dispatch);
    std::fs::write(&config_path, &cfg).unwrap();
    let (stop, producer) = amounts(&kinesis, &stream);
    let mut earlier: Vec<LogLine> = Vec::new();
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    for kill in 0..5 {
        host.wait_for("windows closed", Duration::from_secs(60), |lines| {
            guest_lines(lines, "closed key=").len() >= 20
        })
        .await
        .unwrap_or_else(|e| panic!("before kill {kill}: {e:#}"));
        host.kill9().unwrap();
        earlier.extend(host.lines());
        host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    let expected = sums(&put);
    settle_and_check(&kinesis, &stream, &mut host, &config_path, &expected).await;
    let all: Vec<LogLine> = earlier.into_iter().chain(host.lines()).collect();
    never_over(&all, &expected);
    eprintln!(
        "windows across 5 kill -9: {} records over {} keys, {} closes (repeats after a crash included), totals exact",
        put.len(),
        expected.len(),
        guest_lines(&all, "closed key=").len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_shard_s_window_closes_after_its_grace_once_per_shard() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("windows-quiet");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("shardlane.toml");
    let plugin = dir.path().join("handler.wasm");
    std::fs::copy(&guests.windowed, &plugin).unwrap();
    let cfg = config(
        dir.path(),
        &stream,
        &plugin,
        r#"{ size = "2s", by = "shard", grace = "500ms" }"#,
        "",
    );
    std::fs::write(&config_path, &cfg).unwrap();
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("the reader at the tip", Duration::from_secs(30), |lines| {
        lines
            .iter()
            .any(|l| field(l, "message") == "shard iterator opened")
    })
    .await
    .unwrap();
    let client = kinesis.client();
    let keys = ["a", "b", "c"];
    for (i, key) in keys.iter().enumerate() {
        client
            .put_record()
            .stream_name(&stream)
            .partition_key(*key)
            .data(aws_sdk_kinesis::primitives::Blob::new(
                format!("{{\"amount\": {}}}", i + 1).into_bytes(),
            ))
            .send()
            .await
            .expect("PutRecord");
    }
    // Nothing follows: only the quiet shard's grace can close the window.
    host.wait_for("the window closed", Duration::from_secs(30), |lines| {
        guest_lines(lines, "closed key=").len() >= 3
    })
    .await
    .unwrap();
    let lines = host.lines();
    let closes = guest_lines(&lines, "closed key=");
    let windows: std::collections::BTreeSet<String> = closes
        .iter()
        .map(|l| field(l, "window_start").to_owned())
        .collect();
    assert!(
        windows.len() <= 2,
        "one close per window of the shard, naming its keys: {closes:?}"
    );
    let expected: BTreeMap<String, i64> = [
        ("a".to_owned(), 1),
        ("b".to_owned(), 2),
        ("c".to_owned(), 3),
    ]
    .into();
    assert_eq!(closed_totals(closes.iter().copied()), expected);
    assert!(host.terminate().await.unwrap().success());
    let keys: Vec<String> = expected.keys().cloned().collect();
    assert_eq!(
        committed_totals_of(&config_path, "windows", &keys, &[]),
        expected
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn window_totals_are_exact_across_a_split_and_a_merge() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("windows-reshard");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("shardlane.toml");
    let cfg = config(
        dir.path(),
        &stream,
        &guests.windowed,
        r#"{ size = "1s", by = "key", grace = "200ms" }"#,
        "workers = 2\nby_key = true",
    );
    std::fs::write(&config_path, &cfg).unwrap();
    let (stop, producer) = amounts(&kinesis, &stream);
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("windows closed", Duration::from_secs(60), |lines| {
        guest_lines(lines, "closed key=").len() >= 20
    })
    .await
    .unwrap();
    split_then_merge(&kinesis, &stream).await;
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    let expected = sums(&put);
    settle_and_check(&kinesis, &stream, &mut host, &config_path, &expected).await;
    let lines = host.lines();
    never_over(&lines, &expected);
    let shards: std::collections::HashSet<&str> = guest_lines(&lines, "closed key=")
        .iter()
        .map(|l| field(l, "shard_id"))
        .collect();
    assert!(
        shards.len() >= 5,
        "parents and children closed windows: {shards:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn window_totals_are_exact_in_a_dynamodb_fleet_under_kill_9_and_hand_over() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("windows-fleet");
    let table = unique_name("windows-leases");
    kinesis.create_stream(&stream, 4).await.unwrap();
    let env = env(&kinesis, &dynalite);
    let dir = tempfile::tempdir().unwrap();
    let config = |owner: &str| {
        fleet_config(
            owner,
            &table,
            &stream,
            &guests.windowed,
            "state = {}\nwindow = { size = \"1s\", by = \"key\", grace = \"200ms\" }\nworkers = 2\nby_key = true",
        )
    };
    std::fs::write(dir.path().join("a.toml"), config("host-a")).unwrap();
    let start =
        |owner: &str| HostProcess::start_with(shardlane_bin(), &config(owner), &env).unwrap();
    let mut hosts = [start("host-a"), start("host-b")];
    let (stop, producer) = amounts(&kinesis, &stream);
    wait_counts(&dynalite, &table, &[2, 2], Duration::from_secs(60)).await;
    let mut all: Vec<LogLine> = Vec::new();
    for (kill, victim) in [0, 1, 1].into_iter().enumerate() {
        let before = guest_lines(&hosts[victim].lines(), "closed key=").len();
        hosts[victim]
            .wait_for("windows closed", Duration::from_secs(60), |lines| {
                guest_lines(lines, "closed key=").len() >= before + 10
            })
            .await
            .unwrap_or_else(|e| panic!("before kill {kill}: {e:#}"));
        hosts[victim].kill9().unwrap();
        all.extend(hosts[victim].lines());
        hosts[victim] = start(if victim == 0 { "host-a" } else { "host-b" });
    }
    // A graceful hand-over: host-b stops with windows open, host-a takes
    // every shard and reads those windows again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(hosts[1].terminate().await.unwrap().success());
    all.extend(hosts[1].lines());
    wait_counts(&dynalite, &table, &[4], Duration::from_secs(60)).await;
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    let expected = sums(&put);
    put_zero_per_key(&kinesis, &stream, expected.keys()).await;
    let keys: Vec<String> = expected.keys().cloned().collect();
    let a_config = dir.path().join("a.toml");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let committed = committed_totals_of(&a_config, "fleet", &keys, &env);
        if committed == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "committed totals never reached the sums: {committed:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(hosts[0].terminate().await.unwrap().success());
    all.extend(hosts[0].lines());
    never_over(&all, &expected);
    eprintln!(
        "windows in a DynamoDB fleet, 3 kill -9 and a hand-over: {} records over {} keys, {} closes, totals exact",
        put.len(),
        expected.len(),
        guest_lines(&all, "closed key=").len()
    );
}

/// Each close's `(key, window start, sum)`, as logged.
fn closes(lines: &[LogLine]) -> std::collections::BTreeSet<(String, String, i64)> {
    guest_lines(lines, "closed key=")
        .iter()
        .map(|l| {
            let message = field(l, "message");
            let word = |name: &str| {
                message
                    .split(' ')
                    .find_map(|w| w.strip_prefix(name))
                    .unwrap_or_else(|| panic!("{name} in {message}"))
                    .to_owned()
            };
            let window = word("window=");
            let start = window.split("..").next().unwrap().to_owned();
            (word("key="), start, word("sum=").parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_of_the_stream_closes_the_same_windows_with_the_same_sums() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("windows-replay");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("shardlane.toml");
    let cfg = config(
        dir.path(),
        &stream,
        &guests.windowed,
        r#"{ size = "1s", by = "key", grace = "200ms" }"#,
        "workers = 2\nby_key = true",
    );
    std::fs::write(&config_path, &cfg).unwrap();
    let (stop, producer) = amounts(&kinesis, &stream);
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::SeqCst);
    let expected = sums(&producer.await.unwrap());
    // Every window of the live run closes: the last by its grace.
    host.wait_for(
        "every key's windows closed",
        Duration::from_secs(60),
        |lines| closed_totals(lines.iter()) == expected,
    )
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let live = closes(&host.lines());

    let args = [
        "--subscription",
        "windows",
        "--from",
        "-10m",
        "--name",
        "again",
    ];
    let env = [("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())];
    let mut replay =
        HostProcess::start_command(shardlane_bin(), "replay", &cfg, &args, &env).unwrap();
    let status = replay.wait_exit(Duration::from_secs(120)).await.unwrap();
    assert!(
        status.success(),
        "replay: {:?}\n{}",
        replay.lines(),
        replay.stderr()
    );
    assert_eq!(
        closes(&replay.lines()),
        live,
        "the same windows, the same sums"
    );
    let keys: Vec<String> = expected.keys().cloned().collect();
    assert_eq!(
        committed_totals_of(&config_path, "windows~replay~again", &keys, &[]),
        expected
    );
}
