//! Leases that survive restarts and scale out: the file store across
//! `kill -9`, a fleet of host processes sharing a DynamoDB table (balancing,
//! hand-over on SIGTERM, takeover after `kill -9`, fencing after SIGSTOP),
//! and resharding.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use shardlane::Checkpoint;
use shardlane::FileLeaseStore;
use shardlane::LeaseStore;
use shardlane_testkit::{Dynalite, HostProcess, Kinesis, LogLine, guests, unique_name};
use tokio::task::JoinHandle;

use crate::common::{admin_addr, field, guest_lines, http, seq_key, shardlane_bin, trickle};

/// The data of a `handled data=<data> attempt=<n>` guest line.
pub(crate) fn handled_data(line: &LogLine) -> &str {
    field(line, "message")["handled data=".len()..]
        .rsplit_once(" attempt=")
        .expect("a handled line names its attempt")
        .0
}

/// One handled record: (data, shard, sequence number), in log order.
pub(crate) fn handled(lines: &[LogLine]) -> Vec<(String, String, String)> {
    guest_lines(lines, "handled data=")
        .iter()
        .map(|l| {
            (
                handled_data(l).to_owned(),
                field(l, "shard_id").to_owned(),
                field(l, "sequence_number").to_owned(),
            )
        })
        .collect()
}

/// Puts records of `keys` keys, data `<key>#<n>`, every 50 ms until
/// stopped; returns every data string put, in order.
pub(crate) fn producer(
    kinesis: &Kinesis,
    stream: &str,
    keys: usize,
    per_tick: usize,
) -> (Arc<AtomicBool>, JoinHandle<Vec<String>>) {
    let mut counters = vec![0u32; keys];
    // The producer's pace: a steady trickle while the fleet changes.
    trickle(
        kinesis,
        stream,
        per_tick,
        Duration::from_millis(50),
        move |n| {
            let k = (n - 1) % keys;
            counters[k] += 1;
            let data = format!("key-{k}#{}", counters[k]);
            (format!("key-{k}"), data.clone().into_bytes(), data)
        },
    )
}

/// The lease settings fleet tests use: quick expiry and syncs.
pub(crate) const QUICK_LEASES: &str = r#"lease_duration = "3s"
renew_every = "1s"
shard_sync_every = "1s""#;

pub(crate) fn fleet_config(
    owner: &str,
    table: &str,
    stream: &str,
    plugin: &Path,
    extra: &str,
) -> String {
    dynamodb_config(owner, table, stream, plugin, QUICK_LEASES, extra)
}

/// One host of a fleet on the DynamoDB table `table`, subscription
/// `fleet`, with `lease` lines in `[lease]` and `extra` in the
/// subscription.
pub(crate) fn dynamodb_config(
    owner: &str,
    table: &str,
    stream: &str,
    plugin: &Path,
    lease: &str,
    extra: &str,
) -> String {
    format!(
        r#"
[aws]
region = "us-east-1"

[admin]
listen = "127.0.0.1:0"

[lease]
store = "dynamodb"
table = "{table}"
create_table = true
owner_id = "{owner}"
{lease}

[[subscription]]
name = "fleet"
stream = "{stream}"
plugin = "{plugin}"
start = "trim_horizon"
poll_idle = "50ms"
max_reads_per_second = 20
checkpoint_every = "200ms"
log_rate = 1000000
{extra}
"#,
        plugin = plugin.display()
    )
}

/// The lease table: shard → (owner, counter, checkpoint).
pub(crate) async fn lease_table(
    dynalite: &Dynalite,
    table: &str,
) -> BTreeMap<String, (Option<String>, u64, Option<String>)> {
    try_lease_table(dynalite, table)
        .await
        .expect("scan the lease table")
}

type Table = BTreeMap<String, (Option<String>, u64, Option<String>)>;

/// The table, or an error while the hosts have not created it yet.
pub(crate) async fn try_lease_table(dynalite: &Dynalite, table: &str) -> anyhow::Result<Table> {
    let items = dynalite
        .client()
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await?
        .items
        .unwrap_or_default();
    let s = |item: &HashMap<String, AttributeValue>, k: &str| {
        item.get(k).and_then(|v| v.as_s().ok()).cloned()
    };
    Ok(items
        .iter()
        // Leases only: per-key state, commit manifests and the instances'
        // heartbeats (`!live#<owner>`) share the table.
        .filter(|item| item.contains_key("counter"))
        .filter(|item| !s(item, "shard_id").is_some_and(|k| k.starts_with("!live#")))
        .map(|item| {
            (
                s(item, "shard_id").unwrap(),
                (
                    s(item, "owner"),
                    item.get("counter")
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse().ok())
                        .unwrap(),
                    s(item, "checkpoint"),
                ),
            )
        })
        .collect())
}

/// Leases held per owner.
async fn held_counts(dynalite: &Dynalite, table: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (owner, _, _) in try_lease_table(dynalite, table)
        .await
        .unwrap_or_default()
        .into_values()
    {
        if let Some(owner) = owner {
            *counts.entry(owner).or_default() += 1;
        }
    }
    counts
}

pub(crate) async fn wait_counts(
    dynalite: &Dynalite,
    table: &str,
    want: &[usize],
    within: Duration,
) -> BTreeMap<String, usize> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let counts = held_counts(dynalite, table).await;
        let mut got: Vec<usize> = counts.values().copied().collect();
        got.sort();
        if got == want {
            return counts;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "leases never spread as {want:?}: {counts:?}"
        );
        // Polling the lease table while the fleet converges.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every record put was handled; returns how many were handled twice.
pub(crate) fn check_all_handled(put: &[String], hosts: &[&HostProcess]) -> usize {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for host in hosts {
        for (data, _, _) in handled(&host.lines()) {
            *seen.entry(data).or_default() += 1;
        }
    }
    let missing: Vec<&String> = put.iter().filter(|d| !seen.contains_key(*d)).collect();
    assert!(
        missing.is_empty(),
        "{} records never handled, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    seen.values().filter(|&&n| n > 1).count()
}

/// Per shard, the sequence numbers handled by all hosts, merged in time
/// order, never go backwards: no shard was read by two hosts at once.
fn check_one_reader_per_shard(hosts: &[&HostProcess]) {
    let mut events: Vec<(String, String, String, usize)> = Vec::new();
    for (h, host) in hosts.iter().enumerate() {
        for line in guest_lines(&host.lines(), "handled data=") {
            events.push((
                field(line, "timestamp").to_owned(),
                field(line, "shard_id").to_owned(),
                field(line, "sequence_number").to_owned(),
                h,
            ));
        }
    }
    events.sort();
    let mut last: HashMap<String, (String, usize)> = HashMap::new();
    for (ts, shard, seq, host) in events {
        if let Some((prev, prev_host)) = last.get(&shard) {
            assert!(
                seq_key(&seq) > seq_key(prev),
                "shard {shard}: host {host} handled {seq} at {ts} after host {prev_host} handled {prev}"
            );
        }
        last.insert(shard, (seq, host));
    }
}

pub(crate) fn env<'a>(
    kinesis: &'a Kinesis,
    dynalite: &'a Dynalite,
) -> [(&'static str, &'a str); 2] {
    [
        ("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint()),
        ("AWS_ENDPOINT_URL_DYNAMODB", dynalite.endpoint()),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn file_store_resumes_after_kill_9() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("file-store");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..400)
        .map(|i| (format!("k{}", i % 10), format!("sleep=5;r{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let cfg = format!(
        r#"
[admin]
listen = "127.0.0.1:0"

[lease]
store = "file"
path = "{}"

[[subscription]]
name = "file-store"
stream = "{stream}"
plugin = "{}"
start = "trim_horizon"
poll_idle = "50ms"
max_reads_per_second = 20
checkpoint_every = "100ms"
log_rate = 1000000
"#,
        state.path().display(),
        guests.slow.display()
    );
    let mut first = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    first
        .wait_for("150 records", Duration::from_secs(60), |lines| {
            guest_lines(lines, "exit ").len() >= 150
        })
        .await
        .unwrap();
    first.kill9().unwrap();
    let first_run: Vec<String> = guest_lines(&first.lines(), "exit data=")
        .iter()
        .map(|l| field(l, "sequence_number").to_owned())
        .collect();

    // The checkpoints as the killed process left them.
    let checkpoints: HashMap<String, String> = {
        let store = FileLeaseStore::open(state.path()).unwrap();
        store
            .list(&"file-store".into(), &stream.as_str().into())
            .await
            .unwrap()
            .into_iter()
            .filter_map(|l| match l.checkpoint {
                Some(Checkpoint::At(position)) => {
                    Some((l.key.shard.to_string(), position.to_string()))
                }
                _ => None,
            })
            .collect()
    };
    assert!(
        !checkpoints.is_empty(),
        "checkpoints were written before the kill"
    );

    let mut second = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    second
        .wait_for("the rest", Duration::from_secs(60), |lines| {
            let done: HashSet<&str> = guest_lines(lines, "exit data=")
                .iter()
                .map(|l| field(l, "sequence_number"))
                .chain(first_run.iter().map(String::as_str))
                .collect();
            done.len() >= 400
        })
        .await
        .unwrap();
    assert!(second.terminate().await.unwrap().success());
    let lines = second.lines();
    let again = guest_lines(&lines, "exit data=");
    let mut redelivered = 0;
    for line in &again {
        let (shard, seq) = (field(line, "shard_id"), field(line, "sequence_number"));
        if let Some(cp) = checkpoints.get(shard) {
            assert!(
                seq_key(seq) > seq_key(cp),
                "{seq} on {shard} is at or before the checkpoint {cp}: redelivered"
            );
        }
        if first_run.iter().any(|s| s == seq) {
            redelivered += 1;
        }
    }
    eprintln!(
        "file store: {} handled before kill -9, {} after; {redelivered} redelivered (in flight at the kill)",
        first_run.len(),
        again.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_shares_shards_balances_and_hands_over_on_sigterm() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("fleet");
    let table = unique_name("leases");
    kinesis.create_stream(&stream, 8).await.unwrap();
    let (stop, producer) = producer(&kinesis, &stream, 40, 10);
    let env = env(&kinesis, &dynalite);

    let mut a = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-a", &table, &stream, &guests.retry, ""),
        &env,
    )
    .unwrap();
    let mut b = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-b", &table, &stream, &guests.retry, ""),
        &env,
    )
    .unwrap();
    // Two hosts racing for eight free leases split them unevenly; each
    // later hand-over takes a sync, a renewal and a drain (a few seconds).
    // The bound is generous because CI runs this beside the rest of the
    // suite on two cores, where two cold host starts alone take seconds.
    let started = std::time::Instant::now();
    wait_counts(&dynalite, &table, &[4, 4], Duration::from_secs(120)).await;
    eprintln!("two hosts converged to [4, 4] in {:?}", started.elapsed());

    let mut c = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-c", &table, &stream, &guests.retry, ""),
        &env,
    )
    .unwrap();
    wait_counts(&dynalite, &table, &[2, 3, 3], Duration::from_secs(60)).await;
    // Converged: it stays that way (no ping-pong). Meanwhile, measure the
    // store's steady-state writes: every write bumps a lease's counter.
    let before = lease_table(&dynalite, &table).await;
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let after = lease_table(&dynalite, &table).await;
    let writes: u64 = after
        .iter()
        .map(|(shard, (_, c, _))| c - before[shard].1)
        .sum();
    eprintln!(
        "steady state: {:.0} lease-table writes per shard per minute (renew_every 1s, checkpoint_every 200ms)",
        writes as f64 / after.len() as f64 * 60.0 / window.as_secs_f64()
    );
    wait_counts(&dynalite, &table, &[2, 3, 3], Duration::from_secs(1)).await;

    let sigterm_at = std::time::Instant::now();
    assert!(a.terminate().await.unwrap().success());
    let counts = wait_counts(&dynalite, &table, &[4, 4], Duration::from_secs(60)).await;
    let handoff = sigterm_at.elapsed();
    assert!(!counts.contains_key("host-a"));
    eprintln!("SIGTERM hand-over: host-a's shards held by others {handoff:?} after SIGTERM");
    // Each survivor took some of host-a's shards, and its status page
    // lists those shards' owner changes, from host-a.
    for (name, host) in [("host-b", &b), ("host-c", &c)] {
        let (status, json) = http(&admin_addr(host), "GET", "/status.json", None, b"");
        assert_eq!(status, 200, "{name}: {json}");
        let snapshot: serde_json::Value = serde_json::from_str(&json).unwrap();
        let changes = snapshot["subscriptions"][0]["lease_changes"]
            .as_array()
            .unwrap();
        assert!(
            changes.iter().any(|c| c["from"] == "host-a"),
            "{name} lists no lease change from host-a: {json}"
        );
    }

    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    b.wait_for("everything handled", Duration::from_secs(60), |lines| {
        check_all_handled_quiet(&put, &[&a, &c], lines)
    })
    .await
    .unwrap();
    assert!(b.terminate().await.unwrap().success());
    assert!(c.terminate().await.unwrap().success());
    let duplicates = check_all_handled(&put, &[&a, &b, &c]);
    assert_eq!(duplicates, 0, "graceful hand-overs handle nothing twice");
    check_one_reader_per_shard(&[&a, &b, &c]);
    let table_after = lease_table(&dynalite, &table).await;
    assert!(
        table_after.values().all(|(owner, _, _)| owner.is_none()),
        "all released: {table_after:?}"
    );
    eprintln!("fleet: {} records put and handled", put.len());
}

/// `check_all_handled` as a predicate, for waiting.
fn check_all_handled_quiet(put: &[String], others: &[&HostProcess], lines_of: &[LogLine]) -> bool {
    let mut seen: HashSet<String> = handled(lines_of).into_iter().map(|(d, _, _)| d).collect();
    for host in others {
        seen.extend(handled(&host.lines()).into_iter().map(|(d, _, _)| d));
    }
    put.iter().all(|d| seen.contains(d))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_survivor_takes_over_after_kill_9_and_loses_nothing() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("takeover");
    let table = unique_name("leases");
    kinesis.create_stream(&stream, 4).await.unwrap();
    let (stop, producer) = producer(&kinesis, &stream, 20, 10);
    let env = env(&kinesis, &dynalite);
    let mut a = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-a", &table, &stream, &guests.retry, ""),
        &env,
    )
    .unwrap();
    let mut b = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-b", &table, &stream, &guests.retry, ""),
        &env,
    )
    .unwrap();
    wait_counts(&dynalite, &table, &[2, 2], Duration::from_secs(60)).await;
    let killed_at = std::time::Instant::now();
    a.kill9().unwrap();
    let counts = wait_counts(&dynalite, &table, &[4], Duration::from_secs(60)).await;
    eprintln!(
        "kill -9 takeover: host-a's shards held by host-b {:?} after the kill",
        killed_at.elapsed()
    );
    assert_eq!(counts.get("host-b"), Some(&4));
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    b.wait_for("everything handled", Duration::from_secs(60), |lines| {
        check_all_handled_quiet(&put, &[&a], lines)
    })
    .await
    .unwrap();
    assert!(b.terminate().await.unwrap().success());
    let duplicates = check_all_handled(&put, &[&a, &b]);
    eprintln!("kill -9 takeover: {duplicates} records handled twice (in flight at the kill)");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_instance_is_fenced_out_when_it_resumes() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("fencing");
    let table = unique_name("leases");
    kinesis.create_stream(&stream, 4).await.unwrap();
    let (stop, producer) = producer(&kinesis, &stream, 20, 5);
    let env = env(&kinesis, &dynalite);
    let mut a = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-a", &table, &stream, &guests.retry, ""),
        &env,
    )
    .unwrap();
    let mut b = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-b", &table, &stream, &guests.retry, ""),
        &env,
    )
    .unwrap();
    wait_counts(&dynalite, &table, &[2, 2], Duration::from_secs(60)).await;
    let before = lease_table(&dynalite, &table).await;
    let a_shards: Vec<String> = before
        .iter()
        .filter(|(_, (owner, _, _))| owner.as_deref() == Some("host-a"))
        .map(|(shard, _)| shard.clone())
        .collect();

    a.signal("STOP").unwrap();
    // One marker per key, put while host-a is stopped: on each shard, a
    // record at or after its first marker cannot have been read before the
    // pause.
    let client = kinesis.client();
    let mut put_while_paused: HashMap<String, String> = HashMap::new();
    for k in 0..20 {
        let out = client
            .put_record()
            .stream_name(&stream)
            .partition_key(format!("key-{k}"))
            .data(aws_sdk_kinesis::primitives::Blob::new(format!(
                "marker-{k}"
            )))
            .send()
            .await
            .unwrap();
        put_while_paused
            .entry(out.shard_id().to_owned())
            .or_insert_with(|| out.sequence_number().to_owned());
    }
    for shard in &a_shards {
        assert!(
            put_while_paused.contains_key(shard),
            "no marker landed on {shard}"
        );
    }
    // Past the lease duration (3 s), plus a sync for b to notice.
    wait_counts(&dynalite, &table, &[4], Duration::from_secs(30)).await;
    let taken = lease_table(&dynalite, &table).await;
    let resumed_at_line = a.lines().len();
    a.signal("CONT").unwrap();
    a.wait_for(
        "host-a learns it lost its leases",
        Duration::from_secs(30),
        |lines| {
            lines[resumed_at_line.min(lines.len())..]
                .iter()
                .filter(|l| field(l, "message") == "lease lost; reader stopped")
                .count()
                >= a_shards.len()
        },
    )
    .await
    .unwrap();
    // Give a resumed host-a every chance to misbehave.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Once resumed, host-a may legitimately take shards back through the
    // balancer (it now holds nothing); what it must never do is act on the
    // leases it lost: before it takes a shard anew, it writes no checkpoint
    // for it, does not read it, and hands out nothing it had not read
    // before the pause (records in flight at the pause may still finish).
    let after = lease_table(&dynalite, &table).await;
    for shard in &a_shards {
        let (owner, counter, checkpoint) = &after[shard];
        assert!(
            *counter > taken[shard].1 || owner.as_deref() == Some("host-b"),
            "{shard}: {after:?}"
        );
        if owner.as_deref() == Some("host-a") {
            assert!(
                *counter > taken[shard].1,
                "{shard} went back to host-a only through a new acquire"
            );
        }
        // Checkpoints only move forward.
        if let (Some(now), Some(then)) = (checkpoint, &taken[shard].2) {
            assert!(
                seq_key(now) >= seq_key(then),
                "{shard}: checkpoint went back from {then} to {now}"
            );
        }
    }
    let a_lines = a.lines();
    let after_resume = &a_lines[resumed_at_line.min(a_lines.len())..];
    for shard in &a_shards {
        for line in after_resume
            .iter()
            .filter(|l| field(l, "shard_id") == shard)
        {
            let message = field(line, "message");
            if message == "lease taken; reader starting" {
                break;
            }
            // A write refused by the lease's counter never logs this, so
            // one logged after the resume is a write sent before the pause
            // whose answer came after it: it landed while host-a held the
            // lease, before host-b took it, and so at or before the
            // checkpoint host-b took over.
            if message == "checkpoint written" {
                let written = field(line, "checkpoint");
                let took_over_at = taken[shard].2.as_deref().unwrap_or("");
                assert!(
                    seq_key(written) <= seq_key(took_over_at),
                    "host-a wrote a checkpoint for {shard} on a lost lease: {written}, past {took_over_at} where host-b took over"
                );
            }
            assert_ne!(
                message, "shard iterator opened",
                "host-a read {shard} on a lost lease"
            );
            if field(line, "target") == "guest" && message.starts_with("handled data=") {
                let seq = field(line, "sequence_number");
                assert!(
                    seq_key(seq) < seq_key(&put_while_paused[shard]),
                    "host-a handled {shard}/{seq}, put while it was paused, on a lost lease: {message}"
                );
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    b.wait_for("everything handled", Duration::from_secs(60), |lines| {
        check_all_handled_quiet(&put, &[&a], lines)
    })
    .await
    .unwrap();
    a.terminate().await.unwrap();
    b.terminate().await.unwrap();
    check_all_handled(&put, &[&a, &b]);
}

/// Splits the stream's first shard in two and waits until it is active.
pub(crate) async fn split_first_shard(kinesis: &Kinesis, stream: &str) {
    let client = kinesis.client();
    let shards = client
        .list_shards()
        .stream_name(stream)
        .send()
        .await
        .unwrap();
    let first = &shards.shards()[0];
    let range = first.hash_key_range().unwrap();
    let start: u128 = range.starting_hash_key().parse().unwrap();
    let end: u128 = range.ending_hash_key().parse().unwrap();
    client
        .split_shard()
        .stream_name(stream)
        .shard_to_split(first.shard_id())
        .new_starting_hash_key(((start + end) / 2).to_string())
        .send()
        .await
        .expect("SplitShard");
    kinesis.wait_active(stream).await.unwrap();
}

/// Splits the stream's first shard in two, lets records flow for 2 s, then
/// merges two adjacent open shards and lets them flow for 2 s more.
pub(crate) async fn split_then_merge(kinesis: &Kinesis, stream: &str) {
    split_first_shard(kinesis, stream).await;
    let client = kinesis.client();
    // Let records flow into the children for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Merge the second original shard with its adjacent child.
    let shards = client
        .list_shards()
        .stream_name(stream)
        .send()
        .await
        .unwrap();
    let open: Vec<_> = shards
        .shards()
        .iter()
        .filter(|s| {
            s.sequence_number_range()
                .and_then(|r| r.ending_sequence_number())
                .is_none()
        })
        .collect();
    let hash = |s: &aws_sdk_kinesis::types::Shard| -> (u128, u128) {
        let r = s.hash_key_range().unwrap();
        (
            r.starting_hash_key().parse().unwrap(),
            r.ending_hash_key().parse().unwrap(),
        )
    };
    let (left, right) = open
        .iter()
        .flat_map(|a| open.iter().map(move |b| (a, b)))
        .find(|(a, b)| hash(a).1.checked_add(1) == Some(hash(b).0))
        .expect("two adjacent open shards");
    client
        .merge_shards()
        .stream_name(stream)
        .shard_to_merge(left.shard_id())
        .adjacent_shard_to_merge(right.shard_id())
        .send()
        .await
        .expect("MergeShards");
    kinesis.wait_active(stream).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resharding_keeps_every_keys_order_across_parents_and_children() {
    resharding_keeps_order("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fan_out_resharding_keeps_every_keys_order_across_parents_and_children() {
    resharding_keeps_order("read = \"fan_out\"").await;
}

/// Split and merge under load, read with `read` (a config line, or none).
async fn resharding_keeps_order(read: &str) {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("reshard");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let (stop, producer) = producer(&kinesis, &stream, 20, 10);
    let state = tempfile::tempdir().unwrap();
    let cfg = format!(
        r#"
[admin]
listen = "127.0.0.1:0"

[lease]
store = "file"
path = "{}"
shard_sync_every = "1s"

[[subscription]]
name = "reshard"
stream = "{stream}"
plugin = "{}"
start = "trim_horizon"
poll_idle = "50ms"
max_reads_per_second = 20
checkpoint_every = "200ms"
workers = 4
by_key = true
log_rate = 1000000
{read}
"#,
        state.path().display(),
        guests.retry.display()
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("records flowing", Duration::from_secs(60), |lines| {
        guest_lines(lines, "handled ").len() >= 50
    })
    .await
    .unwrap();

    split_then_merge(&kinesis, &stream).await;
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    host.wait_for("everything handled", Duration::from_secs(90), |lines| {
        check_all_handled_quiet(&put, &[], lines)
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());

    let lines = host.lines();
    let handled = handled(&lines);
    let shards_seen: HashSet<&str> = handled.iter().map(|(_, s, _)| s.as_str()).collect();
    assert!(
        shards_seen.len() >= 4,
        "parents and children were read: {shards_seen:?}"
    );
    let mut last: HashMap<&str, u32> = HashMap::new();
    for (data, _, _) in &handled {
        let (key, n) = data.split_once('#').unwrap();
        let n: u32 = n.parse().unwrap();
        let prev = last.insert(key, n).unwrap_or(0);
        assert!(n > prev, "key {key}: record {n} handled after {prev}");
    }
    assert_eq!(
        check_all_handled(&put, &[&host]),
        0,
        "nothing handled twice"
    );
    let ended = lines
        .iter()
        .filter(|l| field(l, "message") == "shard read to its end")
        .count();
    assert!(
        ended >= 3,
        "the split parent and both merge parents were read to their end ({ended})"
    );
}
