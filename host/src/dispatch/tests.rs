//! The dispatcher with a native handler that records every call: which
//! lane took which record, how many calls ran at once, what settled, and
//! how it ends (drained, or cut at `hard_stop`). Time is paused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::channel::{Delivery, Record, channel};
use crate::failure::Policy;
use crate::ids::PartitionKey;
use crate::settlement::SettlementMsg;
use crate::state::CallState;
use crate::tests::delivery;

/// What the handlers saw.
#[derive(Default)]
struct Recorder {
    /// `(lane, key, sequence)` per call, in call order.
    calls: Mutex<Vec<(u32, String, u64)>>,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
    /// How long each call takes.
    hold: Duration,
    /// Calls of this key never return.
    stuck_key: Option<&'static str>,
}

struct Native {
    lane: LaneId,
    seen: Arc<Recorder>,
}

impl Handler for Native {
    async fn handle(
        &mut self,
        record: &Arc<Record>,
        _attempt: u32,
        _state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        let seen = &self.seen;
        let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
        seen.most_at_once.fetch_max(now, Ordering::SeqCst);
        let key = record.partition_key.as_str().to_owned();
        let seq = record.sequence.as_str().parse().unwrap();
        seen.calls
            .lock()
            .unwrap()
            .push((self.lane.0, key.clone(), seq));
        if seen.stuck_key == Some(key.as_str()) {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(seen.hold).await;
        seen.running.fetch_sub(1, Ordering::SeqCst);
        Ok(Handled::new(Outcome::Ack))
    }

    async fn handle_batch(
        &mut self,
        _records: &[(Arc<Record>, u32)],
        _state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        unreachable!("no batch_size in these subscriptions")
    }

    async fn close_window(
        &mut self,
        _close: &Arc<crate::channel::WindowClose>,
        _attempt: u32,
        _state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        unreachable!("no window in these subscriptions")
    }
}

struct Natives(Arc<Recorder>);

impl HandlerFactory for Natives {
    type Handler = Native;
    type Error = String;

    async fn create(&self, lane: LaneId) -> Result<Native, String> {
        Ok(Native {
            lane,
            seen: self.0.clone(),
        })
    }
}

/// Runs a dispatcher of a subscription with `extra` config lines over
/// `deliveries` (the channel closes after them), with `hard_stop` fired
/// after `stop_after` if given. Returns the offsets settled, in order.
async fn dispatch(
    extra: &str,
    seen: Arc<Recorder>,
    deliveries: Vec<Delivery>,
    stop_after: Option<Duration>,
) -> Vec<u64> {
    let sub = crate::tests::subscription(extra);
    let policy = Policy::new(&sub.failure, |_| unreachable!("no dead letters"));
    let (settle_tx, mut settle_rx) = mpsc::channel(4096);
    let (publish_tx, _publish_rx) = mpsc::channel(16);
    let dispatcher = Dispatcher::new(
        sub,
        Arc::new(Natives(seen)),
        policy,
        settle_tx,
        publish_tx,
        Telemetry::new(),
    );
    let (tx, rx) = channel();
    let feeder = tokio::spawn(async move {
        for d in deliveries {
            if tx.send(d).await.is_err() {
                return;
            }
        }
    });
    let hard_stop = CancellationToken::new();
    if let Some(after) = stop_after {
        let stop = hard_stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            stop.cancel();
        });
    }
    // Time is paused: a dispatcher that never ends fails here at once.
    tokio::time::timeout(Duration::from_secs(3600), dispatcher.run(rx, hard_stop))
        .await
        .expect("the dispatcher ended");
    feeder.abort();
    let mut settled = Vec::new();
    while let Ok(msg) = settle_rx.try_recv() {
        match msg {
            SettlementMsg::Settle(t) => settled.push(t.offset),
            SettlementMsg::SettleMany(ts) => settled.extend(ts.iter().map(|t| t.offset)),
            other => panic!("dispatch sent {other:?}"),
        }
    }
    settled
}

/// Catches a router that sends one key to two lanes or reorders a key's
/// records, and a dispatcher that loses or repeats a settlement.
#[tokio::test(start_paused = true)]
async fn by_key_keeps_each_key_on_its_lane_in_order_and_settles_every_record_once() {
    // Seven keys over four lanes: no key's records line up with a lane by
    // their offsets alone.
    let keys: Vec<String> = (0..7).map(|i| format!("user-{i}")).collect();
    let deliveries = (0..350u64)
        .map(|seq| delivery(&keys[seq as usize % keys.len()], seq))
        .collect();
    let seen = Arc::new(Recorder {
        hold: Duration::from_millis(1),
        ..Recorder::default()
    });
    let mut settled = dispatch("workers = 4\nby_key = true", seen.clone(), deliveries, None).await;
    settled.sort_unstable();
    assert_eq!(settled, (0..350).collect::<Vec<_>>());
    let calls = seen.calls.lock().unwrap().clone();
    for key in &keys {
        let mine: Vec<_> = calls.iter().filter(|(_, k, _)| k == key).collect();
        let lane = crate::dispatch::routing::lane_for(&PartitionKey::new(key.as_str()), 4) as u32;
        assert!(
            mine.iter().all(|(l, _, _)| *l == lane),
            "{key} stays on lane {lane}"
        );
        assert!(
            mine.windows(2).all(|w| w[0].2 < w[1].2),
            "{key}'s records in order"
        );
        assert_eq!(mine.len(), 50);
    }
    assert!(
        seen.most_at_once.load(Ordering::SeqCst) > 1,
        "lanes ran side by side"
    );
}

/// Catches `workers = n` running fewer (or more) than n calls at once,
/// and sequential mode running two.
#[tokio::test(start_paused = true)]
async fn workers_run_n_calls_at_once_and_sequential_one() {
    for (extra, n) in [("workers = 3", 3), ("", 1)] {
        let seen = Arc::new(Recorder {
            hold: Duration::from_millis(50),
            ..Recorder::default()
        });
        let deliveries = (0..30)
            .map(|seq| delivery(&format!("k{seq}"), seq))
            .collect();
        let settled = dispatch(extra, seen.clone(), deliveries, None).await;
        assert_eq!(settled.len(), 30);
        assert_eq!(seen.most_at_once.load(Ordering::SeqCst), n, "{extra:?}");
    }
}

/// Catches a dispatcher that does not stop at `hard_stop` while a call
/// hangs (shutdown would then wait forever), or that settles the record
/// whose call never returned.
#[tokio::test(start_paused = true)]
async fn hard_stop_ends_a_dispatcher_whose_call_hangs_without_settling_it() {
    let seen = Arc::new(Recorder {
        stuck_key: Some("stuck"),
        ..Recorder::default()
    });
    let deliveries = vec![delivery("ok", 0), delivery("stuck", 1), delivery("ok", 2)];
    let settled = dispatch(
        "workers = 2\nby_key = true",
        seen,
        deliveries,
        Some(Duration::from_secs(30)),
    )
    .await;
    assert!(!settled.contains(&1), "the hung record stays unsettled");
}
