//! KPL aggregates, made by AWS's own aggregation library, through the whole
//! pipeline: every user record handled once with its own key, per-key
//! order across aggregates and plain records, corrupt aggregates delivered
//! raw, user records outside their shard delivered and counted, and a
//! kill -9 inside an aggregate resuming right after the last settled user
//! record.

use std::collections::HashMap;
use std::time::Duration;

use shardlane::Checkpoint;
use shardlane::FileLeaseStore;
use shardlane::LeaseStore as _;
use shardlane::{ShardId, StreamName, SubscriptionName};
use shardlane_testkit::admin::metric_sum;
use shardlane_testkit::kpl::{UserRecord, aggregate};
use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{
    SHARD_HASH, admin_addr, config, echoed_data, field, guest_lines, http, shardlane_bin,
    wait_checkpoint,
};

/// The data of user record `n` of `key`.
fn data(key: &str, n: usize) -> String {
    format!("{key}#{n}")
}

#[tokio::test(flavor = "multi_thread")]
async fn user_records_are_handled_once_each_with_their_own_key_and_in_key_order() {
    handled_once_with_own_keys("read = \"polling\"").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fan_out_user_records_are_handled_once_each_with_their_own_key_and_in_key_order() {
    handled_once_with_own_keys("read = \"fan_out\"").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_inside_an_aggregate_resumes_after_the_last_settled_user_record() {
    kill9_inside_an_aggregate("read = \"polling\"").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fan_out_kill9_inside_an_aggregate_resumes_after_the_last_settled_user_record() {
    kill9_inside_an_aggregate("read = \"fan_out\"").await;
}

/// Every user record once, with its own key, in key order, when reading
/// with `read` (a config line).
async fn handled_once_with_own_keys(read: &str) {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("kpl");
    kinesis.create_stream(&stream, 2).await.unwrap();

    // 20 keys, each pinned to one shard by its explicit hash key, written
    // in rounds: per shard an aggregate of 2 user records per key, then a
    // plain record per key. Per key: aggregated, aggregated, plain, ...
    let keys: Vec<String> = (0..20).map(|k| format!("key-{k}")).collect();
    let shard_of = |k: usize| k % 2;
    let mut next = vec![0usize; keys.len()];
    let mut expected: Vec<(String, String, bool)> = Vec::new(); // (key, data, aggregated)
    let mut aggregated_users = 0;
    for _round in 0..5 {
        for (shard, hash) in SHARD_HASH.iter().enumerate() {
            let mut users = Vec::new();
            for (k, key) in keys
                .iter()
                .enumerate()
                .filter(|(k, _)| shard_of(*k) == shard)
            {
                for _ in 0..2 {
                    let d = data(key, next[k]);
                    next[k] += 1;
                    users.push(UserRecord {
                        explicit_hash_key: Some((*hash).into()),
                        ..UserRecord::new(key.clone(), d.clone())
                    });
                    expected.push((key.clone(), d, true));
                }
            }
            aggregated_users += users.len();
            let agg = aggregate(&[users]).unwrap().remove(0);
            assert!(
                agg.data.starts_with(&[0xF3, 0x89, 0x9A, 0xC2]),
                "the library made an aggregate"
            );
            kinesis
                .put_record(&stream, &agg.key, Some(hash), &agg.data)
                .await
                .unwrap();
            for (k, key) in keys
                .iter()
                .enumerate()
                .filter(|(k, _)| shard_of(*k) == shard)
            {
                let d = data(key, next[k]);
                next[k] += 1;
                kinesis
                    .put_record(&stream, key, Some(hash), d.as_bytes())
                    .await
                    .unwrap();
                expected.push((key.clone(), d, false));
            }
        }
    }
    // A user record that belongs to shard 1 inside an aggregate put on
    // shard 0 (KCL drops it), and a corrupt aggregate.
    let stray = UserRecord {
        explicit_hash_key: Some(SHARD_HASH[1].into()),
        ..UserRecord::new("stray", "stray#0")
    };
    let mut made = aggregate(&[
        vec![
            UserRecord {
                explicit_hash_key: Some(SHARD_HASH[0].into()),
                ..UserRecord::new("lone", "lone#0")
            },
            stray,
        ],
        vec![UserRecord::new("broken", "broken#0")],
    ])
    .unwrap();
    kinesis
        .put_record(&stream, "lone", Some(SHARD_HASH[0]), &made[0].data)
        .await
        .unwrap();
    expected.push(("lone".into(), "lone#0".into(), true));
    expected.push(("stray".into(), "stray#0".into(), true));
    aggregated_users += 2;
    let corrupt = &mut made[1].data;
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0x55;
    let corrupt = corrupt.clone();
    kinesis
        .put_record(&stream, "corrupt-container", Some(SHARD_HASH[0]), &corrupt)
        .await
        .unwrap();

    let cfg = config(
        "kpl",
        &stream,
        &guests.echo,
        &format!("start = \"trim_horizon\"\n{read}"),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let total = expected.len() + 1;
    host.wait_for(
        "every user record echoed",
        Duration::from_secs(120),
        |lines| guest_lines(lines, "echo ").len() >= total,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, metrics) = http(&admin_addr(&host), "GET", "/metrics", None, b"");
    assert!(host.terminate().await.unwrap().success());

    let lines = host.lines();
    let echoed = guest_lines(&lines, "echo ");
    assert_eq!(
        echoed.len(),
        total,
        "each user record (and the corrupt blob) handled exactly once"
    );

    // The corrupt aggregate: delivered as it is, with its container's key.
    let raw: Vec<_> = echoed
        .iter()
        .filter(|l| field(l, "partition_key") == "corrupt-container")
        .collect();
    assert_eq!(raw.len(), 1, "the corrupt aggregate is delivered raw");
    assert!(
        field(raw[0], "message").contains(&format!("<{} bytes of binary data>", corrupt.len())),
        "{:?}",
        raw[0]
    );
    assert!(raw[0].get("sub_sequence_number").is_none());

    // Every user record once, with its own key, aggregated ones with their
    // index in the aggregate; per key in the order put.
    let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
    let mut handled: HashMap<String, (String, bool)> = HashMap::new();
    for line in echoed
        .iter()
        .filter(|l| field(l, "partition_key") != "corrupt-container")
    {
        let d = echoed_data(line);
        let key = field(line, "partition_key").to_owned();
        assert_eq!(d.split('#').next(), Some(key.as_str()), "{line:?}");
        let sub = line.get("sub_sequence_number").and_then(|v| v.as_u64());
        by_key.entry(key.clone()).or_default().push(d.clone());
        assert!(
            handled.insert(d, (key, sub.is_some())).is_none(),
            "handled twice"
        );
    }
    for (key, d, aggregated) in &expected {
        assert_eq!(
            handled.get(d),
            Some(&(key.clone(), *aggregated)),
            "{d}: handled once, key {key}, aggregated {aggregated}"
        );
    }
    for (key, order) in &by_key {
        let want: Vec<String> = expected
            .iter()
            .filter(|(k, _, _)| k == key)
            .map(|(_, d, _)| d.clone())
            .collect();
        assert_eq!(order, &want, "per-key order of {key}");
    }

    assert_eq!(
        metric_sum(&metrics, "shardlane_kpl_user_records_total", &[]),
        aggregated_users as f64
    );
    assert_eq!(
        metric_sum(&metrics, "shardlane_kpl_corrupt_total", &[]),
        1.0
    );
    assert_eq!(
        metric_sum(&metrics, "shardlane_kpl_hash_key_mismatch_total", &[]),
        1.0,
        "the stray user record is counted"
    );
}

/// Kill -9 inside an aggregate with the file store, reading with `read`.
async fn kill9_inside_an_aggregate(read: &str) {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("kpl-kill");
    kinesis.create_stream(&stream, 1).await.unwrap();

    // u0..u3 ack; `hold:1000000` is retried (the first run never gets
    // past it); then u5..u9, and a plain record after the aggregate.
    let users: Vec<UserRecord> = (0..10)
        .map(|i| {
            let d = if i == 4 {
                "hold:1000000".to_owned()
            } else {
                format!("u{i}")
            };
            UserRecord::new(format!("key-{}", i % 3), d)
        })
        .collect();
    let agg = aggregate(&[users]).unwrap().remove(0);
    let (_, seq) = kinesis
        .put_record(&stream, &agg.key, None, &agg.data)
        .await
        .unwrap();
    kinesis
        .put_record(&stream, "after", None, b"after")
        .await
        .unwrap();

    let state = tempfile::tempdir().unwrap();
    let with_file_store = |plugin: &std::path::Path| {
        config(
            "kpl-kill",
            &stream,
            plugin,
            &format!("start = \"trim_horizon\"\n{read}"),
        )
        .replace(
            "store = \"memory\"",
            &format!("store = \"file\"\npath = \"{}\"", state.path().display()),
        )
    };

    let mut first = HostProcess::start(
        shardlane_bin(),
        &with_file_store(&guests.retry),
        kinesis.endpoint(),
    )
    .unwrap();
    let within = format!("{seq}:3");
    wait_checkpoint(
        &mut first,
        "checkpoint inside the aggregate",
        &within,
        Duration::from_secs(60),
    )
    .await;
    first.kill9().unwrap();
    let first_handled: Vec<String> = guest_lines(&first.lines(), "handled data=")
        .iter()
        .map(|l| field(l, "message").to_owned())
        .collect();
    for i in 0..4 {
        assert!(
            first_handled.contains(&format!("handled data=u{i} attempt=1")),
            "u{i} handled before the kill: {first_handled:?}"
        );
    }

    // What the killed process left in the store: inside the aggregate.
    {
        let store = FileLeaseStore::open(state.path()).unwrap();
        let leases = store
            .list(
                &SubscriptionName::from("kpl-kill"),
                &StreamName::from(stream.as_str()),
            )
            .await
            .unwrap();
        assert_eq!(leases.len(), 1);
        assert_eq!(
            leases[0].checkpoint,
            Some(Checkpoint::parse(&within).unwrap())
        );
        assert_eq!(leases[0].key.shard, ShardId::from("shardId-000000000000"));
    }

    // Restarted with a plugin that acks everything: the aggregate resumes
    // at the held user record; nothing settled comes again.
    let mut second = HostProcess::start(
        shardlane_bin(),
        &with_file_store(&guests.echo),
        kinesis.endpoint(),
    )
    .unwrap();
    second
        .wait_for("the rest", Duration::from_secs(60), |lines| {
            guest_lines(lines, "echo ")
                .iter()
                .any(|l| field(l, "partition_key") == "after")
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(second.terminate().await.unwrap().success());
    let lines = second.lines();
    let echoed = guest_lines(&lines, "echo ");
    let got: Vec<(String, Option<u64>)> = echoed
        .iter()
        .map(|l| {
            (
                echoed_data(l),
                l.get("sub_sequence_number").and_then(|v| v.as_u64()),
            )
        })
        .collect();
    let mut want: Vec<(String, Option<u64>)> = (4..10)
        .map(|i| {
            let d = if i == 4 {
                "hold:1000000".to_owned()
            } else {
                format!("u{i}")
            };
            (d, Some(i))
        })
        .collect();
    want.push(("after".into(), None));
    assert_eq!(
        got, want,
        "resumed right after u3, nothing settled handled again"
    );
    assert!(
        echoed
            .iter()
            .take(6)
            .all(|l| field(l, "sequence_number") == seq),
        "the user records keep their aggregate's sequence number"
    );
}
