//! Batch handlers: the size bound, the window bound, per-record outcomes,
//! and batches on by_key lanes.

use std::collections::HashMap;
use std::time::Duration;

use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{config, field, guest_lines, shardlane_bin, wait_checkpoint};

fn batch_sizes(lines: &[shardlane_testkit::LogLine]) -> Vec<usize> {
    guest_lines(lines, "batch size=")
        .iter()
        .map(|l| field(l, "message")["batch size=".len()..].parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_close_at_the_size_bound() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("batch-size");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..35)
        .map(|i| (format!("k{i}"), format!("r{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    // All 35 arrive in one read; a long window, so only the size closes the
    // first three batches, and the window the last.
    let cfg = config(
        "batch-size",
        &stream,
        &guests.batch,
        "start = \"trim_horizon\"\nbatch_size = 10\nbatch_window = \"1s\"",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("35 items", Duration::from_secs(60), |lines| {
        guest_lines(lines, "item ").len() >= 35
    })
    .await
    .unwrap();
    host.terminate().await.unwrap();
    assert_eq!(batch_sizes(&host.lines()), vec![10, 10, 10, 5]);
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_close_at_the_window_bound() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("batch-window");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let cfg = config(
        "batch-window",
        &stream,
        &guests.batch,
        "start = \"trim_horizon\"\nbatch_size = 1000\nbatch_window = \"300ms\"",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    for round in 0..3 {
        let records: Vec<(String, Vec<u8>)> = (0..4)
            .map(|i| (format!("k{i}"), format!("round{round}-{i}").into_bytes()))
            .collect();
        kinesis.put_records(&stream, &records).await.unwrap();
        // Well past the window: each round is its own batch.
        host.wait_for("the round's batch", Duration::from_secs(30), |lines| {
            guest_lines(lines, "item ").len() >= 4 * (round + 1)
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    host.terminate().await.unwrap();
    assert_eq!(
        batch_sizes(&host.lines()),
        vec![4, 4, 4],
        "far below batch_size: closed by the window"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mixed_outcomes_settle_record_by_record() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("batch-mixed");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let data = ["ok-1", "retry-2", "reject-3", "ok-4", "retry-5"];
    let records: Vec<(String, Vec<u8>)> = data
        .iter()
        .map(|d| ("k".to_owned(), d.as_bytes().to_vec()))
        .collect();
    let put = kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "batch-mixed",
        &stream,
        &guests.batch,
        "start = \"trim_horizon\"\nbatch_size = 10\nbatch_window = \"200ms\"\nretry_backoff = { initial = \"20ms\", max = \"50ms\" }",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let last = put.last().unwrap().1.clone();
    wait_checkpoint(
        &mut host,
        "checkpoint at the last record",
        &last,
        Duration::from_secs(30),
    )
    .await;
    host.terminate().await.unwrap();
    let lines = host.lines();
    assert_eq!(
        batch_sizes(&lines),
        vec![5, 2],
        "only the retried records are called again"
    );
    let items: Vec<&str> = guest_lines(&lines, "item ")
        .iter()
        .map(|l| field(l, "message"))
        .collect();
    assert_eq!(
        items,
        vec![
            "item data=ok-1 attempt=1",
            "item data=retry-2 attempt=1",
            "item data=reject-3 attempt=1",
            "item data=ok-4 attempt=1",
            "item data=retry-5 attempt=1",
            "item data=retry-2 attempt=2",
            "item data=retry-5 attempt=2",
        ]
    );
    // A reject under the default policy (block) is skipped at once.
    let rejected: Vec<_> = lines
        .iter()
        .filter(|l| field(l, "message") == "record skipped")
        .collect();
    assert_eq!(rejected.len(), 1);
    assert!(field(rejected[0], "reason").starts_with("rejected: "));
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_on_by_key_lanes_keep_key_order() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("batch-by-key");
    kinesis.create_stream(&stream, 4).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..2000)
        .map(|i| {
            let key = format!("key-{}", i % 37);
            (key.clone(), format!("{key}#{:05}", i / 37).into_bytes())
        })
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "batch-by-key",
        &stream,
        &guests.batch,
        "start = \"trim_horizon\"\nworkers = 3\nby_key = true\nbatch_size = 100",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("2000 items", Duration::from_secs(120), |lines| {
        guest_lines(lines, "item ").len() >= 2000
    })
    .await
    .unwrap();
    host.terminate().await.unwrap();
    let lines = host.lines();
    let items = guest_lines(&lines, "item ");
    assert_eq!(items.len(), 2000);
    let mut per_key: HashMap<&str, Vec<&str>> = HashMap::new();
    for line in &items {
        let data = field(line, "message")
            .strip_prefix("item data=")
            .and_then(|d| d.strip_suffix(" attempt=1"))
            .unwrap();
        let (key, n) = data.split_once('#').unwrap();
        per_key.entry(key).or_default().push(n);
    }
    assert_eq!(per_key.len(), 37);
    for (key, ns) in per_key {
        let mut sorted = ns.clone();
        sorted.sort();
        assert_eq!(ns, sorted, "key {key} in order across batches");
    }
    assert!(batch_sizes(&lines).iter().all(|&n| n <= 100));
}
