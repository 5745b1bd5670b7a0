//! Lanes, workers, backpressure and out-of-order settlement, against the
//! emulator.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use shardlane::PartitionKey;
use shardlane::{CHANNEL_CAPACITY, LANE_INBOX, lane_for};
use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{config, field, guest_lines, seq_key, shardlane_bin, wait_checkpoint};

#[tokio::test(flavor = "multi_thread")]
async fn by_key_lanes_keep_every_keys_order() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("by-key");
    kinesis.create_stream(&stream, 8).await.unwrap();
    // 10,000 records over 200 keys; the data carries the key's own counter.
    let mut counters: HashMap<String, u32> = HashMap::new();
    let records: Vec<(String, Vec<u8>)> = (0..10_000)
        .map(|i| {
            let key = format!("key-{}", (i * 7919) % 200);
            let n = counters.entry(key.clone()).or_default();
            *n += 1;
            let data = format!("{key}#{n}");
            (key, data.into_bytes())
        })
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();

    let cfg = config(
        "by-key",
        &stream,
        &guests.retry,
        "start = \"trim_horizon\"\nworkers = 4\nby_key = true",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("10,000 records", Duration::from_secs(240), |lines| {
        guest_lines(lines, "handled ").len() >= 10_000
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(host.terminate().await.unwrap().success());

    let lines = host.lines();
    let handled = guest_lines(&lines, "handled ");
    assert_eq!(handled.len(), 10_000, "every record exactly once");
    let mut seen: HashMap<String, Vec<u32>> = HashMap::new();
    let mut lanes_used = BTreeSet::new();
    for line in &handled {
        let key = field(line, "partition_key").to_owned();
        let lane = line["lane"].as_u64().expect("lane field") as usize;
        assert_eq!(
            lane,
            lane_for(&PartitionKey::new(key.as_str()), 4),
            "{key} on its hashed lane"
        );
        lanes_used.insert(lane);
        let data = field(line, "message")
            .strip_prefix("handled data=")
            .and_then(|d| d.strip_suffix(" attempt=1"))
            .expect("handled data=<key>#<n> attempt=1");
        let (data_key, n) = data.split_once('#').unwrap();
        assert_eq!(data_key, key);
        seen.entry(key).or_default().push(n.parse().unwrap());
    }
    assert_eq!(lanes_used, BTreeSet::from([0, 1, 2, 3]), "all lanes used");
    assert_eq!(seen.len(), 200);
    for (key, ns) in seen {
        let want: Vec<u32> = (1..=counters[&key]).collect();
        assert_eq!(ns, want, "key {key} handled in put order");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_run_n_handlers_at_once() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("workers");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("k{i}"), format!("sleep=40;{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "workers",
        &stream,
        &guests.slow,
        "start = \"trim_horizon\"\nworkers = 4",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("40 exits", Duration::from_secs(60), |lines| {
        guest_lines(lines, "exit ").len() >= 40
    })
    .await
    .unwrap();
    host.terminate().await.unwrap();

    // Replay enter/exit in log order: the number of calls open at once.
    let lines = host.lines();
    let mut open = 0i32;
    let mut most = 0;
    let mut lanes = BTreeSet::new();
    for line in lines.iter().filter(|l| field(l, "target") == "guest") {
        let message = field(line, "message");
        if message.starts_with("enter ") {
            open += 1;
            lanes.insert(line["lane"].as_u64().unwrap());
        } else if message.starts_with("exit ") {
            open -= 1;
        }
        most = most.max(open);
    }
    assert_eq!(guest_lines(&lines, "enter ").len(), 40, "all handled once");
    assert_eq!(most, 4, "concurrency reaches workers = 4 and never more");
    assert_eq!(lanes, BTreeSet::from([0, 1, 2, 3]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_handler_holds_every_reader_back() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("backpressure");
    let shards = 2;
    kinesis.create_stream(&stream, shards).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..1500)
        .map(|i| (format!("k{}", i % 40), format!("sleep=2;{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let read_limit = 100;
    let workers = 2;
    let cfg = config(
        "backpressure",
        &stream,
        &guests.slow,
        &format!(
            "start = \"trim_horizon\"\nworkers = {workers}\nby_key = true\nread_limit = {read_limit}"
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("1500 exits", Duration::from_secs(120), |lines| {
        guest_lines(lines, "exit ").len() >= 1500
    })
    .await
    .unwrap();
    host.terminate().await.unwrap();
    let lines = host.lines();
    let finished = lines
        .iter()
        .find(|l| field(l, "message") == "settlement finished")
        .expect("settlement reports its figures");
    let most = finished["max_unsettled"].as_u64().unwrap() as usize;
    // Read but not settled: what each blocked reader holds (one read), the
    // channel, what the router holds, and per lane its inbox plus the call
    // in progress.
    let bound = shards as usize * read_limit + CHANNEL_CAPACITY + 1 + workers * (LANE_INBOX + 1);
    eprintln!("read but not settled: at most {most} (bound {bound})");
    assert!(most <= bound, "read ahead {most} exceeds the bound {bound}");
    assert!(most > CHANNEL_CAPACITY, "the channel filled up ({most})");
    assert_eq!(
        finished["unsettled"].as_u64(),
        Some(0),
        "all settled by the end"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_stays_below_a_held_record_while_other_lanes_move_on() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("held");
    kinesis.create_stream(&stream, 1).await.unwrap();
    // One shard; keys on 2 lanes. 5 records of the free key, then the held
    // key's record (retried until its 15th attempt), then 30 more of the
    // free key, which its lane acks meanwhile.
    let held_key = (0..)
        .map(|i| format!("held-{i}"))
        .find(|k| lane_for(&PartitionKey::new(k.as_str()), 2) == 0)
        .unwrap();
    let other_key = (0..)
        .map(|i| format!("free-{i}"))
        .find(|k| lane_for(&PartitionKey::new(k.as_str()), 2) == 1)
        .unwrap();
    let mut records: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| (other_key.clone(), format!("pre-{i}").into_bytes()))
        .collect();
    records.push((held_key.clone(), b"hold:15".to_vec()));
    records.extend((0..30).map(|i| (other_key.clone(), format!("free-{i}").into_bytes())));
    let put = kinesis.put_records(&stream, &records).await.unwrap();
    let before_held = put[4].1.clone();
    let held_seq = put[5].1.clone();
    let last_seq = put.last().unwrap().1.clone();

    let cfg = config(
        "held",
        &stream,
        &guests.retry,
        "start = \"trim_horizon\"\nworkers = 2\nby_key = true\nretry_backoff = { initial = \"100ms\", max = \"100ms\" }",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for(
        "the held record released",
        Duration::from_secs(60),
        |lines| guest_lines(lines, "handled data=hold:15 attempt=15").len() == 1,
    )
    .await
    .unwrap();
    wait_checkpoint(
        &mut host,
        "checkpoint at the last record",
        &last_seq,
        Duration::from_secs(30),
    )
    .await;
    host.terminate().await.unwrap();

    let lines = host.lines();
    let handled = guest_lines(&lines, "handled ");
    let release_at = lines
        .iter()
        .position(|l| field(l, "message") == "handled data=hold:15 attempt=15")
        .unwrap();
    let others_done_at = lines
        .iter()
        .position(|l| field(l, "message") == "handled data=free-29 attempt=1")
        .unwrap();
    assert!(
        others_done_at < release_at,
        "the other lane moved on while the key was held"
    );
    assert_eq!(handled.len(), 35 + 15);
    // Every checkpoint written before the release is below the held record.
    let checkpoints_before: Vec<&str> = lines[..release_at]
        .iter()
        .filter(|l| field(l, "message") == "checkpoint written")
        .map(|l| field(l, "checkpoint"))
        .collect();
    for cp in &checkpoints_before {
        assert!(
            seq_key(cp) < seq_key(&held_seq),
            "checkpoint {cp} passed the held record {held_seq}"
        );
    }
    assert_eq!(
        checkpoints_before.last(),
        Some(&before_held.as_str()),
        "the checkpoint moved up to the record just before the held one"
    );
}
