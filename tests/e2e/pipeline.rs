//! Records through the whole pipeline: Kinesis → lease → reader → channel →
//! Wasm guest → settlement → checkpoint.

use std::collections::HashSet;
use std::time::Duration;

use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{
    by_shard, config, field, guest_lines, sequences_by_shard, shardlane_bin, subscription,
    wait_positioned,
};

#[tokio::test(flavor = "multi_thread")]
async fn four_shards_all_records_handled_each_shard_in_order() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("orders");
    kinesis.create_stream(&stream, 4).await.unwrap();

    let records: Vec<(String, Vec<u8>)> = (0..1000)
        .map(|i| {
            (
                format!("key-{}", i % 50),
                format!("record-{i}").into_bytes(),
            )
        })
        .collect();
    let put = kinesis.put_records(&stream, &records).await.unwrap();
    let shards_used: HashSet<_> = put.iter().map(|(s, _)| s.clone()).collect();
    assert_eq!(shards_used.len(), 4, "50 keys spread over all 4 shards");

    let cfg = config(
        "orders-audit",
        &stream,
        &guests.echo,
        "start = \"trim_horizon\"",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("1000 records echoed", Duration::from_secs(120), |lines| {
        guest_lines(lines, "echo ").len() >= 1000
    })
    .await
    .unwrap();
    // A short grace period in which no record may be handled twice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = host.terminate().await.unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status}");

    let lines = host.lines();
    let echoed = guest_lines(&lines, "echo ");
    assert_eq!(echoed.len(), 1000, "each record handled exactly once");

    // Every guest log line carries the record's context.
    for line in &echoed {
        assert_eq!(field(line, "subscription"), "orders-audit");
        assert_eq!(field(line, "stream"), stream);
        assert_eq!(field(line, "level"), "INFO");
        assert!(field(line, "plugin").starts_with("sha256:"));
        let key = field(line, "partition_key");
        assert!(
            field(line, "message").contains(&format!("key={key} ")),
            "{line}"
        );
    }

    // Exactly the records put, and per shard in sequence order.
    let got = sequences_by_shard(&echoed);
    for (shard, want_seqs) in by_shard(&put) {
        assert_eq!(got.get(&shard), Some(&want_seqs), "shard {shard} in order");
    }

    // Checkpoints were written, and leases released at shutdown.
    let messages: Vec<&str> = lines.iter().map(|l| field(l, "message")).collect();
    assert!(
        messages.contains(&"lease released"),
        "leases released on shutdown"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_redelivers_the_record_before_anything_after_it() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("retries");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = ["first", "retry-me", "third", "fourth"]
        .iter()
        .map(|d| ("one-key".to_owned(), d.as_bytes().to_vec()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();

    let cfg = config(
        "retrier",
        &stream,
        &guests.retry,
        "start = \"trim_horizon\"\nretry_backoff = { initial = \"20ms\", max = \"100ms\" }",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("5 handler calls", Duration::from_secs(60), |lines| {
        guest_lines(lines, "handled ").len() >= 5
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    host.terminate().await.unwrap();

    let lines = host.lines();
    let calls: Vec<&str> = guest_lines(&lines, "handled ")
        .iter()
        .map(|l| field(l, "message"))
        .collect();
    assert_eq!(
        calls,
        vec![
            "handled data=first attempt=1",
            "handled data=retry-me attempt=1",
            "handled data=retry-me attempt=2",
            "handled data=third attempt=1",
            "handled data=fourth attempt=1",
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn start_latest_skips_what_was_there_before() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("latest");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let before: Vec<(String, Vec<u8>)> = (0..10)
        .map(|i| (format!("k{i}"), format!("before-{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &before).await.unwrap();

    let cfg = config("latest", &stream, &guests.retry, "start = \"latest\"");
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    wait_positioned(&mut host, 2).await;
    let after: Vec<(String, Vec<u8>)> = (0..10)
        .map(|i| (format!("k{i}"), format!("after-{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &after).await.unwrap();
    host.wait_for("10 records", Duration::from_secs(60), |lines| {
        guest_lines(lines, "handled ").len() >= 10
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    host.terminate().await.unwrap();
    let lines = host.lines();
    let handled = guest_lines(&lines, "handled ");
    assert_eq!(handled.len(), 10);
    assert!(
        handled
            .iter()
            .all(|l| field(l, "message").starts_with("handled data=after-")),
        "only records put after the start"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn start_at_timestamp_begins_at_that_time() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("at-ts");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let old: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| ("k".to_owned(), format!("old-{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &old).await.unwrap();
    // Arrival times have millisecond resolution; a clear gap on each side
    // of the start time keeps the test independent of clock granularity.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let start = humantime::format_rfc3339_millis(std::time::SystemTime::now());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let new: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| ("k".to_owned(), format!("new-{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &new).await.unwrap();

    let cfg = config(
        "at-ts",
        &stream,
        &guests.retry,
        &format!("start = {{ at_timestamp = \"{start}\" }}"),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("5 records", Duration::from_secs(60), |lines| {
        guest_lines(lines, "handled ").len() >= 5
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    host.terminate().await.unwrap();
    let lines = host.lines();
    let got: Vec<&str> = guest_lines(&lines, "handled ")
        .iter()
        .map(|l| field(l, "message"))
        .collect();
    assert_eq!(
        got,
        (0..5)
            .map(|i| format!("handled data=new-{i} attempt=1"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_subscriptions_run_side_by_side() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let a = unique_name("side-a");
    let b = unique_name("side-b");
    kinesis.create_stream(&a, 1).await.unwrap();
    kinesis.create_stream(&b, 1).await.unwrap();
    let recs = |p: &str| -> Vec<(String, Vec<u8>)> {
        (0..20)
            .map(|i| (format!("k{i}"), format!("{p}-{i}").into_bytes()))
            .collect()
    };
    kinesis.put_records(&a, &recs("a")).await.unwrap();
    kinesis.put_records(&b, &recs("b")).await.unwrap();
    let cfg = config("first", &a, &guests.echo, "start = \"trim_horizon\"")
        + &subscription("second", &b, &guests.retry, "start = \"trim_horizon\"");
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for(
        "both subscriptions' records",
        Duration::from_secs(60),
        |lines| {
            guest_lines(lines, "echo ").len() >= 20 && guest_lines(lines, "handled ").len() >= 20
        },
    )
    .await
    .unwrap();
    host.terminate().await.unwrap();
    let lines = host.lines();
    assert!(
        guest_lines(&lines, "echo ")
            .iter()
            .all(|l| field(l, "subscription") == "first")
    );
    assert!(
        guest_lines(&lines, "handled ")
            .iter()
            .all(|l| field(l, "subscription") == "second")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_named_by_its_arn_is_read() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("by-arn");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let arn = kinesis.stream_arn(&stream).await.unwrap();
    assert!(arn.starts_with("arn:aws:kinesis:"), "{arn}");
    let records: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("k{i}"), format!("r{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config("by-arn", &arn, &guests.echo, "start = \"trim_horizon\"");
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("40 records", Duration::from_secs(60), |lines| {
        guest_lines(lines, "echo ").len() >= 40
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    let echoed = guest_lines(&lines, "echo ");
    assert_eq!(echoed.len(), 40, "each record once");
    assert!(
        echoed.iter().all(|l| field(l, "stream") == arn),
        "the stream is the ARN it was named by"
    );
}
