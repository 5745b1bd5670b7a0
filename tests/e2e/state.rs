//! Per-key state (contract 0.2.0 `state`), exactly once with the
//! checkpoint: totals kept by the `running-total` example stay exact across
//! `kill -9` restarts with the file store, in a DynamoDB fleet of two under
//! `kill -9` and a SIGTERM hand-over, and across a split and a merge; the
//! writes of attempts that retry, trap or reject never persist.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use shardlane_testkit::{
    Dynalite, HostProcess, Kinesis, Language, LogLine, build_examples, guests, unique_name,
};
use tokio::task::JoinHandle;

use crate::common::{field, guest_lines, shardlane_bin, trickle};
use crate::leases::{env, fleet_config, split_then_merge, wait_counts};

const KEYS: usize = 50;

/// A file-store config for subscription `totals` on `stream`.
fn file_config(dir: &Path, stream: &str, plugin: &Path) -> String {
    format!(
        r#"
[admin]
listen = "127.0.0.1:0"

[lease]
store = "file"
path = "{}"

[[subscription]]
name = "totals"
stream = "{stream}"
plugin = "{}"
start = "trim_horizon"
poll_idle = "50ms"
max_reads_per_second = 20
checkpoint_every = "100ms"
log_rate = 1000000
state = {{ max_value = "1KiB" }}
"#,
        dir.join("leases").display(),
        plugin.display()
    )
}

/// Puts `{"amount": n}` records over [`KEYS`] keys, 25 every 100 ms, until
/// stopped; returns every (key, amount) put.
fn amounts(kinesis: &Kinesis, stream: &str) -> (Arc<AtomicBool>, JoinHandle<Vec<(String, i64)>>) {
    trickle(kinesis, stream, 25, Duration::from_millis(100), |n| {
        let (key, amount) = (format!("key-{}", n % KEYS), (n % 9) as i64 + 1);
        let data = format!("{{\"amount\": {amount}}}").into_bytes();
        (key.clone(), data, (key, amount))
    })
}

/// Each key's total as a guest logged it last (`total key=<k> total=<t>`).
fn logged_totals<'a>(lines: impl Iterator<Item = &'a LogLine>) -> BTreeMap<String, i64> {
    let mut totals = BTreeMap::new();
    for line in lines {
        let message = field(line, "message");
        let Some(rest) = message.strip_prefix("total key=") else {
            continue;
        };
        let (key, rest) = rest.split_once(" total=").expect("total line");
        let total = rest.split(' ').next().unwrap().parse().expect("a total");
        totals.insert(key.to_owned(), total);
    }
    totals
}

/// The committed totals of `keys` of subscription `totals`, read by
/// `shardlane state get`.
fn committed_totals(config: &Path, keys: &[String]) -> BTreeMap<String, i64> {
    committed_totals_of(config, "totals", keys, &[])
}

/// The committed totals of `keys` of `subscription`, read by `shardlane
/// state get` with `env`.
pub(crate) fn committed_totals_of(
    config: &Path,
    subscription: &str,
    keys: &[String],
    env: &[(&str, &str)],
) -> BTreeMap<String, i64> {
    let mut cmd = Command::new(shardlane_bin());
    cmd.args(["state", "get", "--subscription", subscription, "--config"])
        .arg(config)
        // As the host processes run: the emulators take any credentials.
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .envs(env.iter().copied());
    for key in keys {
        cmd.args(["--key", key]);
    }
    let out = cmd.output().expect("shardlane state get runs");
    assert!(
        out.status.success(),
        "shardlane state get: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut parts = l.split('\t');
            let (key, name, value) = (parts.next()?, parts.next()?, parts.next()?);
            (name == "total").then(|| (key.to_owned(), value.parse().expect("a total")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn running_totals_are_exact_across_kill_9_restarts_with_the_file_store() {
    let examples = build_examples(Language::Rust).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("state-file");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shardlane.toml");
    let cfg = file_config(dir.path(), &stream, &examples.running_total);
    std::fs::write(&config, &cfg).unwrap();

    let (stop, producer) = amounts(&kinesis, &stream);
    let mut earlier: Vec<LogLine> = Vec::new();
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    for kill in 0..10 {
        host.wait_for("records handled", Duration::from_secs(60), |lines| {
            guest_lines(lines, "total key=").len() >= 20
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
    // A killed process may have logged totals it never committed: the last
    // process must reach every total itself. A zero amount per key, put
    // now, reaches each key's total in the last process's log.
    put_zero_per_key(&kinesis, &stream, expected.keys()).await;
    host.wait_for("every key's total", Duration::from_secs(120), |lines| {
        logged_totals(lines.iter()) == expected
    })
    .await
    .unwrap_or_else(|e| {
        let got = logged_totals(host.lines().iter());
        panic!("{e:#}: logged {got:?}, expected {expected:?}")
    });
    assert!(host.terminate().await.unwrap().success());

    // No record counted twice, ever: every total a guest saw is at most
    // the key's final sum.
    let all: Vec<LogLine> = earlier.into_iter().chain(host.lines()).collect();
    for line in guest_lines(&all, "total key=") {
        let seen = logged_totals(std::iter::once(line));
        for (key, total) in seen {
            assert!(
                total <= expected[&key],
                "{key} reached {total}, more than its sum {}",
                expected[&key]
            );
        }
    }
    let keys: Vec<String> = expected.keys().cloned().collect();
    assert_eq!(committed_totals(&config, &keys), expected);
    eprintln!(
        "state across 10 kill -9: {} records over {} keys, {} handled (redeliveries included), totals exact",
        put.len(),
        expected.len(),
        guest_lines(&all, "total key=").len()
    );
}

/// What each attempt of a run over `records` (key, data), one shard, the
/// file store, `plugin` and `extra`, saw: every guest `total key=` line of
/// `key` in log order, per key; and the committed totals. Runs until the
/// logged totals are `totals`, then stops the host gracefully.
async fn attempts(
    plugin: &Path,
    records: &[(&str, &str)],
    extra: &str,
    totals: &BTreeMap<String, i64>,
) -> (BTreeMap<String, Vec<String>>, BTreeMap<String, i64>) {
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("state-outcomes");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = records
        .iter()
        .map(|(k, d)| (k.to_string(), d.as_bytes().to_vec()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shardlane.toml");
    let cfg = file_config(dir.path(), &stream, plugin)
        + "retry_backoff = { initial = \"10ms\", max = \"50ms\" }\n"
        + extra;
    std::fs::write(&config, &cfg).unwrap();
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("every record", Duration::from_secs(60), |lines| {
        logged_totals(lines.iter()) == *totals
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}: {:?}", logged_totals(host.lines().iter())));
    assert!(host.terminate().await.unwrap().success());
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in guest_lines(&host.lines(), "total key=") {
        let message = field(line, "message");
        let key = message["total key=".len()..].split(' ').next().unwrap();
        seen.entry(key.to_owned())
            .or_default()
            .push(message.to_owned());
    }
    let keys: Vec<String> = totals.keys().cloned().collect();
    (seen, committed_totals(&config, &keys))
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_of_attempts_that_retry_trap_or_reject_do_not_persist() {
    let guests = guests::build().unwrap();
    let totals = BTreeMap::from([("j".to_owned(), 7), ("k".to_owned(), 10_111)]);
    let (seen, committed) = attempts(
        &guests.stateful,
        &[
            ("k", "add=1"),
            ("j", "add=5;reject"),
            ("k", "add=10;retry-once"),
            ("k", "add=100;trap-once"),
            ("j", "add=7"),
            ("k", "add=1000;reject"),
            ("k", "add=10000"),
        ],
        "",
        &totals,
    )
    .await;
    // What each attempt saw: the discarded writes never show.
    assert_eq!(
        seen["k"],
        [
            "total key=k total=1 attempt=1 then=",
            "total key=k total=11 attempt=1 then=retry-once",
            "total key=k total=11 attempt=2 then=retry-once",
            "total key=k total=111 attempt=1 then=trap-once",
            "total key=k total=111 attempt=2 then=trap-once",
            "total key=k total=1111 attempt=1 then=reject",
            "total key=k total=10111 attempt=1 then=",
        ]
    );
    assert_eq!(
        seen["j"],
        [
            "total key=j total=5 attempt=1 then=reject",
            "total key=j total=7 attempt=1 then="
        ]
    );
    assert_eq!(committed, totals);
}

#[tokio::test(flavor = "multi_thread")]
async fn in_a_batch_a_key_s_records_after_a_failed_writer_are_handled_again() {
    let guests = guests::build().unwrap();
    let totals = BTreeMap::from([("j".to_owned(), 75), ("k".to_owned(), 1_111)]);
    // One batch: everything was put before the host starts.
    let (seen, committed) = attempts(
        &guests.stateful_batch,
        &[
            ("k", "add=1"),
            ("k", "add=10;retry-once"),
            ("j", "add=5"),
            ("k", "add=100"),
            ("j", "add=7;reject"),
            ("k", "add=1000"),
            ("j", "add=70"),
        ],
        "batch_size = 10\nbatch_window = \"500ms\"\n",
        &totals,
    )
    .await;
    // k: the retried record's write is discarded, and so are the writes of
    // the later records of k that saw it: they are handled again after it.
    assert_eq!(
        seen["k"],
        [
            "total key=k total=1 attempt=1 then=",
            "total key=k total=11 attempt=1 then=retry-once",
            "total key=k total=111 attempt=1 then=",
            "total key=k total=1111 attempt=1 then=",
            "total key=k total=11 attempt=2 then=retry-once",
            "total key=k total=111 attempt=2 then=",
            "total key=k total=1111 attempt=2 then=",
        ]
    );
    // j: a rejected record's write is discarded and the next one, which
    // saw it, is handled again; j's first record is not.
    assert_eq!(
        seen["j"],
        [
            "total key=j total=5 attempt=1 then=",
            "total key=j total=12 attempt=1 then=reject",
            "total key=j total=82 attempt=1 then=",
            "total key=j total=75 attempt=2 then=",
        ]
    );
    assert_eq!(committed, totals);
}

/// Puts `{"amount": 0}` under each of `keys`: it leaves every total as it
/// is, and is handled after every earlier record of its key.
pub(crate) async fn put_zero_per_key<'a>(
    kinesis: &Kinesis,
    stream: &str,
    keys: impl Iterator<Item = &'a String>,
) {
    let client = kinesis.client();
    for key in keys {
        client
            .put_record()
            .stream_name(stream)
            .partition_key(key)
            .data(aws_sdk_kinesis::primitives::Blob::new(
                &b"{\"amount\": 0}"[..],
            ))
            .send()
            .await
            .expect("PutRecord");
    }
}

/// Every key's sum of the amounts put.
pub(crate) fn sums(put: &[(String, i64)]) -> BTreeMap<String, i64> {
    let mut sums: BTreeMap<String, i64> = BTreeMap::new();
    for (key, amount) in put {
        *sums.entry(key.clone()).or_default() += amount;
    }
    sums
}

/// No guest ever saw a total above its key's sum: nothing counted twice.
fn never_over(lines: &[LogLine], expected: &BTreeMap<String, i64>) {
    for line in guest_lines(lines, "total key=") {
        for (key, total) in logged_totals(std::iter::once(line)) {
            assert!(
                total <= expected[&key],
                "{key} reached {total}, more than its sum {}",
                expected[&key]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn running_totals_are_exact_in_a_dynamodb_fleet_under_kill_9_and_hand_over() {
    let examples = build_examples(Language::Rust).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("state-fleet");
    let table = unique_name("state-leases");
    kinesis.create_stream(&stream, 4).await.unwrap();
    let env = env(&kinesis, &dynalite);
    let dir = tempfile::tempdir().unwrap();
    let config = |owner: &str| {
        fleet_config(
            owner,
            &table,
            &stream,
            &examples.running_total,
            "state = {}",
        )
    };
    std::fs::write(dir.path().join("a.toml"), config("host-a")).unwrap();
    let start =
        |owner: &str| HostProcess::start_with(shardlane_bin(), &config(owner), &env).unwrap();
    let mut hosts = [start("host-a"), start("host-b")];
    let (stop, producer) = amounts(&kinesis, &stream);
    wait_counts(&dynalite, &table, &[2, 2], Duration::from_secs(60)).await;
    let mut all: Vec<LogLine> = Vec::new();
    // Kill -9 one instance at a time, by a fixed pseudo-random pick, and
    // start it again.
    let mut pick = 0x9e37_79b9u32;
    for kill in 0..10 {
        pick ^= pick << 13;
        pick ^= pick >> 17;
        pick ^= pick << 5;
        let victim = (pick % 2) as usize;
        let before = guest_lines(&hosts[victim].lines(), "total key=").len();
        hosts[victim]
            .wait_for("records handled", Duration::from_secs(60), |lines| {
                guest_lines(lines, "total key=").len() >= before + 5
            })
            .await
            .unwrap_or_else(|e| panic!("before kill {kill}: {e:#}"));
        hosts[victim].kill9().unwrap();
        all.extend(hosts[victim].lines());
        hosts[victim] = start(if victim == 0 { "host-a" } else { "host-b" });
    }
    // A graceful hand-over: host-b stops, host-a takes every shard.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(hosts[1].terminate().await.unwrap().success());
    all.extend(hosts[1].lines());
    wait_counts(&dynalite, &table, &[4], Duration::from_secs(60)).await;
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    let expected = sums(&put);
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
        // Polling the committed state while host-a catches up.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(hosts[0].terminate().await.unwrap().success());
    all.extend(hosts[0].lines());
    never_over(&all, &expected);
    assert_eq!(
        committed_totals_of(&a_config, "fleet", &keys, &env),
        expected
    );
    eprintln!(
        "state in a DynamoDB fleet, 10 kill -9 and a hand-over: {} records over {} keys, {} handled, totals exact",
        put.len(),
        expected.len(),
        guest_lines(&all, "total key=").len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn running_totals_follow_their_keys_across_a_split_and_a_merge() {
    let examples = build_examples(Language::Rust).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("state-reshard");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shardlane.toml");
    let cfg = file_config(dir.path(), &stream, &examples.running_total)
        .replace("[lease]\n", "[lease]\nshard_sync_every = \"1s\"\n");
    std::fs::write(&config, &cfg).unwrap();
    let (stop, producer) = amounts(&kinesis, &stream);
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("records handled", Duration::from_secs(60), |lines| {
        guest_lines(lines, "total key=").len() >= 50
    })
    .await
    .unwrap();
    split_then_merge(&kinesis, &stream).await;
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    let expected = sums(&put);
    host.wait_for("every key's total", Duration::from_secs(120), |lines| {
        logged_totals(lines.iter()) == expected
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}: logged {:?}", logged_totals(host.lines().iter())));
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    never_over(&lines, &expected);
    let shards: std::collections::HashSet<&str> = guest_lines(&lines, "total key=")
        .iter()
        .map(|l| field(l, "shard_id"))
        .collect();
    assert!(
        shards.len() >= 5,
        "parents and children handled records: {shards:?}"
    );
    let keys: Vec<String> = expected.keys().cloned().collect();
    assert_eq!(committed_totals(&config, &keys), expected);
}
