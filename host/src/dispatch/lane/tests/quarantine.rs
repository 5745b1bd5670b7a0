//! The quarantine from a lane: a poison record parks its key, the key's
//! later records are parked behind it without a call, the other keys flow;
//! a full quarantine blocks; a new instance (a restart) reads the parked
//! keys back.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::failure::Quarantine;
use crate::lease::memory::MemoryLeaseStore;
use crate::lease::{ItemKind, LeaseKey, LeaseStore};
use crate::parked::ParkedKey;

/// A record at `offset` with partition key `key`.
fn keyed(offset: u64, key: &str) -> Delivery {
    let mut d = record(offset, 0);
    Arc::get_mut(&mut d.record).unwrap().partition_key = PartitionKey::new(key);
    d
}

fn quarantine(
    sub: &SubscriptionConfig,
    store: &Arc<MemoryLeaseStore>,
    sink: Arc<Sink>,
) -> (Policy, Arc<Quarantine>) {
    let telemetry = Telemetry::new();
    let status = telemetry.subscription(&sub.name, sub.mode());
    let mut made = None;
    let policy = Policy::with_quarantine(
        &sub.failure,
        |_| sink as Arc<dyn DeadLetterSink>,
        |sink| {
            let q = Arc::new(Quarantine::new(
                sub.name.clone(),
                store.clone() as Arc<dyn LeaseStore>,
                sink,
                sub.failure.quarantine,
                "me".into(),
                &telemetry,
                status,
            ));
            made = Some(q.clone());
            q
        },
    );
    (policy, made.expect("a quarantine policy"))
}

/// The parked keys' items, by key.
async fn parked(store: &MemoryLeaseStore) -> std::collections::BTreeMap<String, ParkedKey> {
    store
        .read_items(&"s".into(), ItemKind::Parked)
        .await
        .unwrap()
        .iter()
        .map(|item| {
            (
                item.key.clone(),
                crate::failure::decode_parked(item).unwrap(),
            )
        })
        .collect()
}

/// A memory store where instance `me` holds the test records' shard
/// (only the lease holder parks).
async fn store() -> Arc<MemoryLeaseStore> {
    let store = Arc::new(MemoryLeaseStore::new());
    let lease = LeaseKey {
        subscription: "s".into(),
        stream: "orders".into(),
        shard: "shard-0".into(),
    };
    store.acquire(&lease, &"me".into(), None).await.unwrap();
    store
}

const QUARANTINE: &str = "on_failure = \"quarantine\"\ndead_letter_stream = \"dlq\"\nmax_attempts = 2\nquarantine = { max_keys = 1, max_records = 4 }";

#[tokio::test(start_paused = true)]
async fn a_poison_record_parks_its_key_and_the_other_keys_flow() {
    let sub = subscription(QUARANTINE);
    let store = store().await;
    let sink = Sink::new("dlq", 1);
    let (policy, q) = quarantine(&sub, &store, sink.clone());
    // The poison record fails twice (max_attempts = 2); the rest ack.
    let script = Script::new([retry(), retry()]);
    let records = vec![
        keyed(0, "poison"),
        keyed(1, "a"),
        keyed(2, "poison"),
        keyed(3, "b"),
        keyed(4, "poison"),
        keyed(5, "c"),
    ];
    let run = run_lane_with(sub, policy, script.clone(), records, None).await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1)], 0),
            calls(&[(0, 2)], 0),
            calls(&[(1, 1)], 0),
            calls(&[(3, 1)], 0),
            calls(&[(5, 1)], 0),
        ],
        "the poison key's later records are never called"
    );
    let puts = sink.puts.lock().unwrap().clone();
    let offsets: Vec<u64> = puts.iter().map(|(o, _, _)| *o).collect();
    assert_eq!(offsets, vec![0, 2, 4], "in order, a refused put retried");
    assert!(puts.iter().all(|(_, reason, _)| reason == "quarantined"));
    let mut settled = run.settled.clone();
    settled.sort_unstable();
    assert_eq!(settled, vec![0, 1, 2, 3, 4, 5], "parked records settle");
    let doc = parked(&store).await;
    let key = &doc["poison"];
    assert_eq!(key.records, 3);
    assert!(key.reason.contains("retry: later"), "{}", key.reason);
    assert_eq!(key.first.sequence, "1000");
    assert_eq!(key.last.sequence, "1004");
    assert!(q.is_parked(&PartitionKey::new("poison")));
    assert_eq!(
        run.metric("shardlane_records_parked_total{subscription=\"s\"}"),
        0,
        "counted in the quarantine's registry"
    );

    // A new instance (a restart) reads the key back before its first record.
    let sub = subscription(QUARANTINE);
    let (policy, again) = quarantine(&sub, &store, Sink::new("dlq", 0));
    assert!(!again.is_parked(&PartitionKey::new("poison")));
    again.refresh().await.unwrap();
    assert!(again.is_parked(&PartitionKey::new("poison")));
    let script = Script::new([]);
    run_lane_with(
        sub,
        policy,
        script.clone(),
        vec![keyed(6, "poison"), keyed(7, "d")],
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![calls(&[(7, 1)], 0)],
        "still parked after a restart"
    );
    assert_eq!(parked(&store).await["poison"].records, 4);

    // At max_records a later record of the key waits (it is neither handled
    // nor dropped) until the key is released.
    let sub = subscription(QUARANTINE);
    let (policy, full) = quarantine(&sub, &store, Sink::new("dlq", 0));
    full.refresh().await.unwrap();
    let script = Script::new([]);
    let run = run_lane_with(
        sub,
        policy,
        script.clone(),
        vec![keyed(8, "poison"), keyed(9, "e")],
        Some(Duration::from_secs(60)),
    )
    .await;
    assert_eq!(run.settled, Vec::<u64>::new());
    assert_eq!(script.calls(), Vec::new(), "e waits behind it on the lane");
}

#[tokio::test(start_paused = true)]
async fn a_full_quarantine_blocks_instead_of_losing_order() {
    let sub = subscription(QUARANTINE);
    let store = store().await;
    let sink = Sink::new("dlq", 0);
    let (policy, _q) = quarantine(&sub, &store, sink.clone());
    // Key x parks (max_keys = 1); key y then has no room: it blocks.
    let script = Script::new(std::iter::repeat_with(retry).take(1_000));
    let run = run_lane_with(
        sub,
        policy,
        script.clone(),
        vec![keyed(0, "x"), keyed(1, "y"), keyed(2, "z")],
        Some(Duration::from_secs(60)),
    )
    .await;
    let doc = parked(&store).await;
    assert_eq!(doc.keys().collect::<Vec<_>>(), vec!["x"]);
    assert_eq!(run.settled, vec![0], "y is neither parked nor skipped");
    assert!(
        script.calls().iter().all(|c| c.records[0].0 != 2),
        "z waits behind y"
    );
    assert!(script.calls().len() > 3, "y is tried again while blocked");
    assert!(run.metric("shardlane_records_blocked_total{subscription=\"s\"}") > 0);
}
