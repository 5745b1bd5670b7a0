//! The pool over a fake Kinesis whose shards are open and idle: which
//! readers it starts and stops, and how it ends. Time is paused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::ids::StreamName;
use crate::kinesis::{KinesisError, Page};
use crate::reader::ShardReads;
use crate::settlement::SettlementMsg;

/// Every shard is open and has nothing to read.
#[derive(Default)]
struct IdleShards {
    opened: Mutex<Vec<ShardId>>,
}

#[async_trait]
impl ShardReads for IdleShards {
    async fn open_iterator(
        &self,
        _stream: &StreamName,
        shard: &ShardId,
        _from: &ReadFrom,
    ) -> Result<String, KinesisError> {
        self.opened.lock().unwrap().push(shard.clone());
        Ok(shard.to_string())
    }

    async fn get_records(&self, iterator: &str, _limit: i32) -> Result<Page, KinesisError> {
        Ok(Page {
            records: Vec::new(),
            next_iterator: Some(iterator.to_owned()),
            millis_behind: Some(0),
        })
    }
}

struct Harness {
    assignments: Option<mpsc::Sender<Assignment>>,
    settlement: mpsc::Receiver<SettlementMsg>,
    deliveries: crate::channel::DeliveryReceiver,
    /// The validity senders, kept alive (a dropped one means the lease is
    /// gone).
    leases: Vec<watch::Sender<Instant>>,
    pool: task::JoinHandle<()>,
}

fn start() -> Harness {
    let (ctx, deliveries, settlement) =
        crate::tests::reader_context(Arc::new(IdleShards::default()), None);
    let pool = ReaderPool::new(ctx);
    let (assignments, rx) = mpsc::channel(16);
    Harness {
        assignments: Some(assignments),
        settlement,
        deliveries,
        leases: Vec::new(),
        pool: tokio::spawn(pool.run(rx)),
    }
}

impl Harness {
    async fn read(&mut self, shard: &str, session: u64) {
        let (valid, valid_until) = watch::channel(Instant::now() + Duration::from_secs(3600));
        self.leases.push(valid);
        self.assign(Assignment::Read {
            shard: ShardId::from(shard),
            session: SessionId(session),
            from: ReadFrom::Start(crate::config::StartPosition::TrimHorizon),
            hash_keys: None,
            valid_until,
        })
        .await;
    }

    async fn stop(&mut self, shard: &str, session: u64) {
        self.assign(Assignment::Stop {
            shard: ShardId::from(shard),
            session: SessionId(session),
            why: StopReason::Lost,
        })
        .await;
    }

    async fn assign(&mut self, assignment: Assignment) {
        let sent = self.assignments.as_ref().unwrap().send(assignment).await;
        sent.unwrap();
        // Let the pool and its readers act on it (time is paused).
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    /// The opens and closes settlement was told of, as `open|close shard session`.
    fn told(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(msg) = self.settlement.try_recv() {
            match msg {
                SettlementMsg::Open { shard, session } => {
                    out.push(format!("open {shard} {}", session.0))
                }
                SettlementMsg::Close { shard, session, .. } => {
                    out.push(format!("close {shard} {}", session.0));
                }
                other => panic!("an idle reader sent {other:?}"),
            }
        }
        out
    }
}

/// Catches a pool that stops a shard's reader on a stop meant for an
/// older session of the same shard (a late stop of a lease lost and taken
/// again would silence the new reader).
#[tokio::test(start_paused = true)]
async fn a_stop_ends_only_the_reader_of_its_session() {
    let mut h = start();
    h.read("shard-0", 1).await;
    h.stop("shard-0", 1).await;
    h.read("shard-0", 2).await;
    h.stop("shard-0", 1).await;
    h.stop("shard-1", 2).await;
    assert_eq!(
        h.told(),
        ["open shard-0 1", "close shard-0 1", "open shard-0 2"],
        "session 2 reads on"
    );
    h.stop("shard-0", 2).await;
    assert_eq!(h.told(), ["close shard-0 2"]);
}

/// Catches a pool that ends before its readers said how far they got, or
/// that keeps the channel open after it ends (dispatch would then wait
/// forever and the pipeline never wind down).
#[tokio::test(start_paused = true)]
async fn closing_the_assignments_stops_every_reader_then_the_pool_and_the_channel() {
    let mut h = start();
    h.read("shard-0", 1).await;
    h.read("shard-1", 1).await;
    h.assignments = None;
    tokio::time::timeout(Duration::from_secs(60), &mut h.pool)
        .await
        .expect("the pool ended")
        .unwrap();
    let mut told = h.told();
    told.sort();
    assert_eq!(
        told,
        [
            "close shard-0 1",
            "close shard-1 1",
            "open shard-0 1",
            "open shard-1 1"
        ]
    );
    assert!(h.deliveries.recv().await.is_err(), "the channel is closed");
}
