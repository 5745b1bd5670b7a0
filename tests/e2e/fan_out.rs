//! Enhanced fan-out against kinesis-local: the consumer registered at
//! start-up, every record handled once in per-shard order through
//! SubscribeToShard, subscriptions that end (connections cut by the fault
//! proxy) resumed without loss or duplicates, and the consumer
//! deregistered from the command line.

use std::collections::HashSet;
use std::time::Duration;

use shardlane_testkit::proxy::{FaultProxy, Faults};
use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{by_shard, config, field, guest_lines, sequences_by_shard, shardlane_bin};

fn records(prefix: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            (
                format!("key-{}", i % 40),
                format!("{prefix}-{i}").into_bytes(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_record_is_handled_once_in_shard_order_through_fan_out() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("fan-out");
    kinesis.create_stream(&stream, 4).await.unwrap();
    let mut put = kinesis
        .put_records(&stream, &records("before", 400))
        .await
        .unwrap();

    let cfg = config(
        "fan-out",
        &stream,
        &guests.echo,
        "start = \"trim_horizon\"\nread = \"fan_out\"\nconsumer_name = \"shardlane-test\"",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("400 records", Duration::from_secs(120), |lines| {
        guest_lines(lines, "echo ").len() >= 400
    })
    .await
    .unwrap();
    // Records put while subscribed are pushed too.
    put.extend(
        kinesis
            .put_records(&stream, &records("after", 200))
            .await
            .unwrap(),
    );
    host.wait_for("600 records", Duration::from_secs(60), |lines| {
        guest_lines(lines, "echo ").len() >= 600
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(host.terminate().await.unwrap().success());

    let lines = host.lines();
    assert!(
        lines
            .iter()
            .any(|l| field(l, "message") == "reading by enhanced fan-out"
                && field(l, "consumer") == "shardlane-test"),
        "the consumer was registered and used"
    );
    let subscribed = lines
        .iter()
        .filter(|l| field(l, "message") == "subscribed to the shard")
        .count();
    assert!(subscribed >= 4, "every shard subscribed: {subscribed}");
    assert!(
        !lines
            .iter()
            .any(|l| field(l, "message") == "shard iterator opened"),
        "no polling"
    );
    let echoed = guest_lines(&lines, "echo ");
    assert_eq!(echoed.len(), 600, "each record handled exactly once");
    let got = sequences_by_shard(&echoed);
    for (shard, want) in by_shard(&put) {
        assert_eq!(got.get(&shard), Some(&want), "shard {shard} in order");
    }

    // The consumer is deregistered from the command line.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(&path, &cfg).unwrap();
    let deregister = || {
        std::process::Command::new(shardlane_bin())
            .args([
                "deregister-consumer",
                "--subscription",
                "fan-out",
                "--config",
            ])
            .arg(&path)
            .env("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .output()
            .unwrap()
    };
    let out = deregister();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("deregistered stream consumer \"shardlane-test\""),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stream_arn = kinesis.stream_arn(&stream).await.unwrap();
    let mut gone = false;
    for _ in 0..50 {
        let described = kinesis
            .client()
            .describe_stream_consumer()
            .stream_arn(&stream_arn)
            .consumer_name("shardlane-test")
            .send()
            .await;
        if described.is_err() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the consumer no longer exists");
    let again = deregister();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to deregister"));
}

#[tokio::test(flavor = "multi_thread")]
async fn subscriptions_that_end_are_resumed_without_loss_or_duplicates() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let proxy = FaultProxy::start(kinesis.endpoint()).await.unwrap();
    let stream = unique_name("fan-out-cut");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let cfg = config(
        "fan-out-cut",
        &stream,
        &guests.echo,
        "start = \"trim_horizon\"\nread = \"fan_out\"",
    );
    // Every connection is cut 1.5 s after it was made (a faults setting
    // applies to the connections made after it): each subscription ends
    // without warning, while records keep coming.
    proxy.set(Faults {
        cut_after: Some(Duration::from_millis(1500)),
        ..Faults::default()
    });
    let mut host = HostProcess::start_with(
        shardlane_bin(),
        &cfg,
        &[("AWS_ENDPOINT_URL_KINESIS", &proxy.endpoint())],
    )
    .unwrap();
    host.wait_for("subscribed", Duration::from_secs(60), |lines| {
        lines
            .iter()
            .filter(|l| field(l, "message") == "subscribed to the shard")
            .count()
            >= 2
    })
    .await
    .unwrap();
    let mut put = Vec::new();
    for round in 0..6 {
        put.extend(
            kinesis
                .put_records(&stream, &records(&format!("r{round}"), 50))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    host.wait_for("300 records", Duration::from_secs(60), |lines| {
        guest_lines(lines, "echo ").len() >= 300
    })
    .await
    .unwrap();
    proxy.clear();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(host.terminate().await.unwrap().success());

    let lines = host.lines();
    let subscribed = lines
        .iter()
        .filter(|l| field(l, "message") == "subscribed to the shard")
        .count();
    assert!(
        subscribed >= 6,
        "subscriptions were cut and made again: {subscribed}"
    );
    let echoed = guest_lines(&lines, "echo ");
    assert_eq!(echoed.len(), 300, "no record lost or handled twice");
    let got = sequences_by_shard(&echoed);
    for (shard, want) in by_shard(&put) {
        assert_eq!(got.get(&shard), Some(&want), "shard {shard} in order");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_on_fan_out_shares_shards_and_hands_over_on_sigterm() {
    use std::sync::atomic::Ordering;

    use crate::leases::{check_all_handled, env, fleet_config, producer, wait_counts};

    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = shardlane_testkit::Dynalite::start().await.unwrap();
    let stream = unique_name("fan-out-fleet");
    let table = unique_name("leases");
    kinesis.create_stream(&stream, 4).await.unwrap();
    let (stop, producer) = producer(&kinesis, &stream, 20, 10);
    let env = env(&kinesis, &dynalite);
    let fan_out = "read = \"fan_out\"\nconsumer_name = \"fleet-consumer\"";
    let mut a = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-a", &table, &stream, &guests.retry, fan_out),
        &env,
    )
    .unwrap();
    let mut b = HostProcess::start_with(
        shardlane_bin(),
        &fleet_config("host-b", &table, &stream, &guests.retry, fan_out),
        &env,
    )
    .unwrap();
    wait_counts(&dynalite, &table, &[2, 2], Duration::from_secs(120)).await;
    // Each reads its shards by fan-out before host-a leaves (the fleet
    // converges in seconds; registering a consumer takes longer).
    for host in [&mut a, &mut b] {
        host.wait_for("a fan-out subscription", Duration::from_secs(60), |lines| {
            lines
                .iter()
                .any(|l| field(l, "message") == "subscribed to the shard")
        })
        .await
        .unwrap();
    }

    assert!(a.terminate().await.unwrap().success());
    let counts = wait_counts(&dynalite, &table, &[4], Duration::from_secs(60)).await;
    assert!(!counts.contains_key("host-a"));
    stop.store(true, Ordering::SeqCst);
    let put = producer.await.unwrap();
    b.wait_for("everything handled", Duration::from_secs(60), |lines| {
        let mut seen: HashSet<String> = crate::leases::handled(lines)
            .into_iter()
            .map(|(d, _, _)| d)
            .collect();
        seen.extend(
            crate::leases::handled(&a.lines())
                .into_iter()
                .map(|(d, _, _)| d),
        );
        put.iter().all(|d| seen.contains(d))
    })
    .await
    .unwrap();
    assert!(b.terminate().await.unwrap().success());
    let duplicates = check_all_handled(&put, &[&a, &b]);
    assert_eq!(duplicates, 0, "a graceful hand-over handles nothing twice");
    for host in [&a, &b] {
        assert!(
            host.lines()
                .iter()
                .any(|l| field(l, "message") == "subscribed to the shard"),
            "read by fan-out"
        );
    }
    eprintln!("fan-out fleet: {} records put and handled", put.len());
}
