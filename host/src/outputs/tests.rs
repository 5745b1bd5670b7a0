//! The output stage on a scripted `PutRecords`: order per key under
//! partial failures, one record per key per call, settling an input only
//! after all its outputs, retries, and the bound on what it holds.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{MAX_PENDING_OUTPUTS, OutputStage, PUBLISH_QUEUE, Publish, PutRecords};
use crate::ids::{PartitionKey, SessionId, ShardId, StreamName};
use crate::kinesis::KinesisError;
use crate::outputs::Output;
use crate::progress::Ticket;
use crate::settlement::SettlementMsg;
use crate::telemetry::Telemetry;

/// What a scripted call does: accept all, refuse the records of some keys,
/// fail whole, or never answer.
#[derive(Clone)]
enum Answer {
    Accept,
    Refuse(Vec<&'static str>),
    Fail,
    Hang,
    Panic,
}

#[derive(Default)]
struct Sink {
    script: Mutex<VecDeque<Answer>>,
    /// Every call: (key, data) of its records.
    calls: Mutex<Vec<Vec<(String, String)>>>,
    /// What landed, in order.
    landed: Mutex<Vec<(String, String)>>,
}

#[async_trait]
impl PutRecords for Sink {
    async fn put_records(
        &self,
        _stream: &StreamName,
        records: &[(PartitionKey, Vec<u8>)],
    ) -> Result<Vec<Result<(), KinesisError>>, KinesisError> {
        let records: Vec<(String, String)> = records
            .iter()
            .map(|(k, d)| (k.to_string(), String::from_utf8(d.clone()).unwrap()))
            .collect();
        self.calls.lock().unwrap().push(records.clone());
        let answer = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Answer::Accept);
        match answer {
            Answer::Hang => std::future::pending().await,
            Answer::Panic => panic!("scripted panic in the sink"),
            Answer::Fail => Err(KinesisError::Failed("scripted".into())),
            Answer::Accept | Answer::Refuse(_) => {
                let refused = match &answer {
                    Answer::Refuse(keys) => keys.clone(),
                    _ => Vec::new(),
                };
                let mut landed = self.landed.lock().unwrap();
                Ok(records
                    .into_iter()
                    .map(|(k, d)| {
                        if refused.contains(&k.as_str()) {
                            Err(KinesisError::Throttled("scripted".into()))
                        } else {
                            landed.push((k, d));
                            Ok(())
                        }
                    })
                    .collect())
            }
        }
    }
}

fn publish(offset: u64, outputs: &[(&str, &str)]) -> Publish {
    Publish {
        ticket: Ticket {
            shard: ShardId::from("s"),
            session: SessionId(1),
            offset,
        },
        outputs: outputs
            .iter()
            .map(|(key, data)| Output {
                input: 0,
                stream: StreamName::from("out"),
                partition_key: PartitionKey::from(*key),
                data: data.as_bytes().to_vec(),
            })
            .collect(),
    }
}

fn pair(key: &str, data: &str) -> (String, String) {
    (key.to_owned(), data.to_owned())
}

/// Runs a stage over `publishes` until it ends; the offsets settled, in
/// order.
async fn run(sink: Arc<Sink>, publishes: Vec<Publish>) -> Vec<u64> {
    let (settle_tx, mut settle_rx) = mpsc::channel(1024);
    let (tx, rx) = mpsc::channel(PUBLISH_QUEUE);
    let stage = OutputStage::new(
        "sub".into(),
        [StreamName::from("out")],
        sink,
        settle_tx,
        &Telemetry::new(),
    );
    let task = tokio::spawn(stage.run(rx, CancellationToken::new()));
    for p in publishes {
        tx.send(p).await.unwrap();
    }
    drop(tx);
    tokio::time::timeout(Duration::from_secs(600), task)
        .await
        .expect("the stage ends once everything is put")
        .unwrap();
    let mut settled = Vec::new();
    while let Ok(msg) = settle_rx.try_recv() {
        match msg {
            SettlementMsg::Settle(t) => settled.push(t.offset),
            SettlementMsg::SettleMany(ts) => settled.extend(ts.iter().map(|t| t.offset)),
            other => panic!("the stage sent {other:?}"),
        }
    }
    settled
}

/// Catches: two records of one key in one call (a partial failure could
/// reorder them), or an input settled before its last output landed.
#[tokio::test(start_paused = true)]
async fn one_record_per_key_per_call_in_order_and_the_input_settles_last() {
    let sink = Arc::new(Sink::default());
    // Held: the first call waits until everything is queued.
    let settled = run(
        sink.clone(),
        vec![
            publish(0, &[("k1", "a1"), ("k1", "a2"), ("k2", "b1")]),
            publish(1, &[("k1", "c1")]),
        ],
    )
    .await;
    let calls = sink.calls.lock().unwrap().clone();
    for call in &calls {
        let mut keys: Vec<&String> = call.iter().map(|(k, _)| k).collect();
        keys.dedup();
        assert_eq!(
            keys.len(),
            call.len(),
            "one record per key per call: {calls:?}"
        );
    }
    let k1: Vec<String> = sink
        .landed
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k == "k1")
        .map(|(_, d)| d.clone())
        .collect();
    assert_eq!(k1, ["a1", "a2", "c1"]);
    assert_eq!(settled, vec![0, 1]);
}

/// Catches: a refused record skipped (lost), or the key's next record put
/// before it (reordered), or the input settled without it.
#[tokio::test(start_paused = true)]
async fn a_refused_record_is_put_again_before_its_keys_next_and_its_input_waits() {
    let sink = Arc::new(Sink::default());
    sink.script
        .lock()
        .unwrap()
        .extend([Answer::Refuse(vec!["k1"]), Answer::Fail]);
    let settled = run(
        sink.clone(),
        vec![
            publish(0, &[("k1", "x1"), ("k2", "y1")]),
            publish(1, &[("k1", "x2")]),
        ],
    )
    .await;
    let landed = sink.landed.lock().unwrap().clone();
    let k1: Vec<&(String, String)> = landed.iter().filter(|(k, _)| k == "k1").collect();
    assert_eq!(k1, [&pair("k1", "x1"), &pair("k1", "x2")]);
    assert!(landed.contains(&pair("k2", "y1")));
    assert_eq!(
        landed.len(),
        3,
        "each output landed exactly once: {landed:?}"
    );
    assert_eq!(settled, vec![0, 1]);
}

/// Catches: a stage that keeps taking publishes while its puts hang
/// (memory without bound) instead of holding the lanes back.
#[tokio::test(start_paused = true)]
async fn it_stops_taking_publishes_at_its_bound_so_lanes_wait() {
    let sink = Arc::new(Sink::default());
    sink.script.lock().unwrap().push_back(Answer::Hang);
    let (settle_tx, _settle_rx) = mpsc::channel(1024);
    let (tx, rx) = mpsc::channel(PUBLISH_QUEUE);
    let stage = OutputStage::new(
        "sub".into(),
        [StreamName::from("out")],
        sink,
        settle_tx,
        &Telemetry::new(),
    );
    let _task = tokio::spawn(stage.run(rx, CancellationToken::new()));
    let per_publish = 1_000;
    let keys: Vec<String> = (0..per_publish).map(|i| format!("k{i}")).collect();
    let mut accepted = 0;
    for offset in 0..1_000u64 {
        let outputs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "d")).collect();
        // Let the stage take what it will before trying the next.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        if tx.try_send(publish(offset, &outputs)).is_err() {
            break;
        }
        accepted += 1;
    }
    assert_eq!(
        accepted,
        MAX_PENDING_OUTPUTS / per_publish + PUBLISH_QUEUE,
        "held up to the bound, then the inbox fills"
    );
}

/// Catches: a call whose task panicked leaving its stream "putting"
/// forever (its inputs never settle, the subscription stalls).
#[tokio::test(start_paused = true)]
async fn a_call_that_panicked_is_made_again() {
    let sink = Arc::new(Sink::default());
    sink.script.lock().unwrap().push_back(Answer::Panic);
    let settled = run(
        sink.clone(),
        vec![publish(0, &[("k1", "a")]), publish(1, &[("k1", "b")])],
    )
    .await;
    let landed = sink.landed.lock().unwrap().clone();
    assert_eq!(landed, [pair("k1", "a"), pair("k1", "b")]);
    assert_eq!(settled, vec![0, 1]);
}

/// Catches: calls always taking keys from the start of the key order, so
/// with more keys waiting than one call holds, the last keys wait behind
/// the first keys' every output.
#[tokio::test(start_paused = true)]
async fn with_more_keys_than_a_call_holds_every_key_gets_its_turn() {
    let sink = Arc::new(Sink::default());
    // The first call fails, so everything is queued before the next.
    sink.script.lock().unwrap().push_back(Answer::Fail);
    let keys: Vec<String> = (0..600).map(|i| format!("k{i:03}")).collect();
    let publishes = keys
        .iter()
        .enumerate()
        .map(|(i, k)| publish(i as u64, &[(k.as_str(), "first"), (k.as_str(), "second")]))
        .collect();
    let settled = run(sink.clone(), publishes).await;
    assert_eq!(settled.len(), 600);
    let landed = sink.landed.lock().unwrap().clone();
    let last_first = landed.iter().rposition(|(_, d)| d == "first").unwrap();
    let first_second = landed.iter().position(|(_, d)| d == "second").unwrap();
    assert!(
        last_first < first_second,
        "every key's first output lands before any key's second ({last_first} vs {first_second})"
    );
}
