//! The lane driven by a scripted native handler: retries in place, rejects
//! to a dead-letter sink, giving up by attempts and by age, blocking,
//! recycling, bisecting and halving batches, following swaps. Time is
//! paused, so backoffs cost nothing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Lane, LaneMetrics};
use crate::channel::{Delivery, Record, WindowClose, Work};
use crate::config::{Config, FailurePolicy, OnFailure, SubscriptionConfig};
use crate::dispatch::{CallError, Handled, Handler, HandlerFactory, Outcome, Output};
use crate::failure::{DeadLetterSink, LastFailure, Policy, Put};
use crate::ids::{
    LaneId, PartitionKey, PluginDigest, SequenceNumber, SessionId, ShardId, StreamName,
};
use crate::kinesis::KinesisError;
use crate::progress::Ticket;
use crate::settlement::SettlementMsg;
use crate::state::CallState;
use crate::telemetry::Telemetry;

mod batches;
mod outputs;
mod quarantine;
mod runs;
mod windows;

/// One scripted answer; when the script runs out, everything is acked.
enum Step {
    One(Result<Outcome, CallError>),
    Batch(Result<Vec<Outcome>, CallError>),
    /// An answer with outputs.
    OneWith(Outcome, Vec<Output>),
    BatchWith(Vec<Outcome>, Vec<Output>),
    /// A run's answer: a prefix of outcomes.
    Run(Result<Vec<Outcome>, CallError>),
}

/// One call as the handler saw it: `(offset, attempt)` per record, and the
/// instance that took it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    records: Vec<(u64, u32)>,
    instance: usize,
}

#[derive(Default)]
struct Script {
    steps: Mutex<VecDeque<Step>>,
    calls: Mutex<Vec<Call>>,
    instances: AtomicUsize,
    generation: AtomicU64,
    /// What `max_run` says (0: the default, one record per call).
    max_run: AtomicUsize,
}

impl Script {
    fn new(steps: impl IntoIterator<Item = Step>) -> Arc<Self> {
        Arc::new(Self {
            steps: Mutex::new(steps.into_iter().collect()),
            ..Self::default()
        })
    }

    fn next(&self) -> Option<Step> {
        self.steps.lock().unwrap().pop_front()
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

struct Scripted {
    script: Arc<Script>,
    instance: usize,
}

impl Handler for Scripted {
    async fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
        _state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        self.script.calls.lock().unwrap().push(Call {
            records: vec![(offset_of(record), attempt)],
            instance: self.instance,
        });
        match self.script.next() {
            None => Ok(Handled::new(Outcome::Ack)),
            Some(Step::One(answer)) => answer.map(Handled::new),
            Some(Step::OneWith(outcome, outputs)) => Ok(Handled { outcome, outputs }),
            Some(Step::Batch(_) | Step::BatchWith(..) | Step::Run(_)) => {
                panic!("a batch or run answer scripted for a record call")
            }
        }
    }

    async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
        _state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        self.script.calls.lock().unwrap().push(Call {
            records: records.iter().map(|(r, a)| (offset_of(r), *a)).collect(),
            instance: self.instance,
        });
        match self.script.next() {
            None => Ok(Handled::new(records.iter().map(|_| Outcome::Ack).collect())),
            Some(Step::Batch(answer)) => answer.map(Handled::new),
            Some(Step::BatchWith(outcome, outputs)) => Ok(Handled { outcome, outputs }),
            Some(Step::One(_) | Step::OneWith(..) | Step::Run(_)) => {
                panic!("a record or run answer scripted for a batch call")
            }
        }
    }

    fn max_run(&self) -> usize {
        self.script.max_run.load(Ordering::SeqCst).max(1)
    }

    async fn handle_run(
        &mut self,
        records: &[(Arc<Record>, u32)],
        _state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        self.script.calls.lock().unwrap().push(Call {
            records: records.iter().map(|(r, a)| (offset_of(r), *a)).collect(),
            instance: self.instance,
        });
        match self.script.next() {
            None => Ok(Handled::new(records.iter().map(|_| Outcome::Ack).collect())),
            Some(Step::Run(answer)) => answer.map(Handled::new),
            Some(_) => panic!("a record or batch answer scripted for a run call"),
        }
    }

    async fn close_window(
        &mut self,
        close: &Arc<WindowClose>,
        attempt: u32,
        _state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        self.script.calls.lock().unwrap().push(Call {
            records: vec![(close.hold.offset, attempt)],
            instance: self.instance,
        });
        match self.script.next() {
            None => Ok(Handled::new(Outcome::Ack)),
            Some(Step::One(answer)) => answer.map(Handled::new),
            Some(Step::OneWith(outcome, outputs)) => Ok(Handled { outcome, outputs }),
            Some(_) => panic!("a batch or run answer scripted for a close"),
        }
    }

    fn version(&self, _record: &Record) -> Option<PluginDigest> {
        Some(PluginDigest::of(format!("v{}", self.instance).as_bytes()))
    }
}

struct Factory(Arc<Script>);

impl HandlerFactory for Factory {
    type Handler = Scripted;
    type Error = String;

    async fn create(&self, _lane: LaneId) -> Result<Scripted, String> {
        Ok(Scripted {
            script: self.0.clone(),
            instance: self.0.instances.fetch_add(1, Ordering::SeqCst),
        })
    }

    fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::SeqCst)
    }
}

/// A dead-letter stream that refuses the first `refuse` puts.
struct Sink {
    stream: StreamName,
    refuse: AtomicUsize,
    /// `(offset, reason, attempts)` of every put that landed.
    puts: Mutex<Vec<(u64, String, u32)>>,
    tries: AtomicUsize,
}

impl Sink {
    fn new(stream: &str, refuse: usize) -> Arc<Self> {
        Arc::new(Self {
            stream: StreamName::from(stream),
            refuse: AtomicUsize::new(refuse),
            puts: Mutex::new(Vec::new()),
            tries: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl DeadLetterSink for Sink {
    fn stream(&self) -> &StreamName {
        &self.stream
    }

    async fn put(&self, record: &Record, failure: LastFailure<'_>) -> Result<Put, KinesisError> {
        self.tries.fetch_add(1, Ordering::SeqCst);
        if self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(KinesisError::Throttled("scripted".into()));
        }
        self.puts.lock().unwrap().push((
            offset_of(record),
            failure.reason.to_owned(),
            failure.attempts,
        ));
        Ok(Put {
            shard: ShardId::from("dlq-0"),
            sequence: "1".into(),
            data_omitted: false,
        })
    }
}

fn offset_of(record: &Record) -> u64 {
    record.sequence.as_str().parse::<u64>().unwrap() - 1000
}

/// A subscription as the config would make it, with `extra` lines.
fn subscription(extra: &str) -> Arc<SubscriptionConfig> {
    let toml = format!(
        "[[subscription]]\nname = \"s\"\nstream = \"orders\"\nplugin = \"p.wasm\"\nretry_backoff = {{ initial = \"10ms\", max = \"100ms\" }}\n{extra}\n"
    );
    let config = Config::parse(&toml, std::path::Path::new("test.toml")).unwrap();
    Arc::new(config.subscriptions[0].clone())
}

fn record(offset: u64, arrival_ms: u64) -> Delivery {
    Delivery {
        record: Arc::new(Record {
            window: None,
            stream: StreamName::from("orders"),
            shard: ShardId::from("shard-0"),
            partition_key: PartitionKey::new(format!("k{offset}")),
            sequence: SequenceNumber::parse(&(1000 + offset).to_string()).unwrap(),
            sub_sequence: None,
            arrival_ms,
            data: vec![1, 2, 3],
        }),
        ticket: Ticket {
            shard: ShardId::from("shard-0"),
            session: SessionId(1),
            offset,
        },
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What a lane did with its records.
struct Run {
    /// Offsets in the order they settled.
    settled: Vec<u64>,
    /// Offsets handed to the output stage, with their outputs' data.
    published: Vec<(u64, Vec<String>)>,
    metrics: String,
    /// Settlement messages the lane sent.
    messages: usize,
}

impl Run {
    fn metric(&self, line_start: &str) -> u64 {
        self.metrics
            .lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .map_or(0, |v| v.parse().unwrap())
    }
}

/// Runs a lane over `records` until it ends (the inbox closes once they
/// are in), or until `stop_after` has passed (then `hard_stop` fires).
async fn run_lane(
    sub: Arc<SubscriptionConfig>,
    sink: Option<Arc<Sink>>,
    script: Arc<Script>,
    records: Vec<impl Into<Work>>,
    stop_after: Option<Duration>,
) -> Run {
    let policy = Policy::new(&sub.failure, |stream| {
        let sink = sink.clone().expect("a sink for on_failure = dead_letter");
        assert_eq!(&sink.stream, stream);
        sink as Arc<dyn DeadLetterSink>
    });
    run_lane_with(sub, policy, script, records, stop_after).await
}

/// A lane with a scripted handler, and the far ends of its queues.
struct Harness {
    lane: Lane<Factory>,
    /// What it sends to settlement.
    settled: mpsc::Receiver<SettlementMsg>,
    /// What it hands the output stage.
    published: mpsc::Receiver<crate::outputs::Publish>,
    /// Where its metrics are.
    telemetry: Arc<Telemetry>,
}

fn harness(sub: Arc<SubscriptionConfig>, policy: Policy, script: Arc<Script>) -> Harness {
    let telemetry = Telemetry::new();
    let status = telemetry.subscription(&sub.name, sub.mode());
    let (settle_tx, settled) = mpsc::channel(1024);
    let (publish_tx, published) = mpsc::channel(1024);
    let lane = Lane::new(
        LaneId(0),
        sub,
        Arc::new(policy),
        Arc::new(Factory(script)),
        settle_tx,
        publish_tx,
        LaneMetrics::new(&telemetry, &status, "s", 0),
    );
    Harness {
        lane,
        settled,
        published,
        telemetry,
    }
}

/// The offsets a lane has settled so far, in the order they settled, and
/// how many messages carried them.
fn settled_offsets(rx: &mut mpsc::Receiver<SettlementMsg>) -> (Vec<u64>, usize) {
    let mut settled = Vec::new();
    let mut messages = 0;
    while let Ok(msg) = rx.try_recv() {
        messages += 1;
        match msg {
            SettlementMsg::Settle(t) => settled.push(t.offset),
            SettlementMsg::SettleMany(ts) => settled.extend(ts.iter().map(|t| t.offset)),
            other => panic!("a lane sent {other:?}"),
        }
    }
    (settled, messages)
}

/// [`run_lane`] with a policy made by the caller.
async fn run_lane_with(
    sub: Arc<SubscriptionConfig>,
    policy: Policy,
    script: Arc<Script>,
    records: Vec<impl Into<Work>>,
    stop_after: Option<Duration>,
) -> Run {
    let Harness {
        lane,
        settled: mut settle_rx,
        published: mut publish_rx,
        telemetry,
    } = harness(sub, policy, script);
    let (inbox_tx, inbox) = crate::channel::bounded(64);
    for r in records {
        inbox_tx.send(r).await.unwrap();
    }
    drop(inbox_tx);
    let hard_stop = CancellationToken::new();
    let stop = hard_stop.clone();
    let stopper = stop_after.map(|after| {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            stop.cancel();
        })
    });
    lane.run(inbox, hard_stop).await;
    if let Some(stopper) = stopper {
        stopper.abort();
    }
    let (settled, messages) = settled_offsets(&mut settle_rx);
    let mut published = Vec::new();
    while let Ok(publish) = publish_rx.try_recv() {
        let data = publish
            .outputs
            .iter()
            .map(|o| String::from_utf8(o.data.clone()).unwrap())
            .collect();
        published.push((publish.ticket.offset, data));
    }
    Run {
        settled,
        published,
        metrics: telemetry.render(),
        messages,
    }
}

fn calls(records: &[(u64, u32)], instance: usize) -> Call {
    Call {
        records: records.to_vec(),
        instance,
    }
}

fn retry() -> Step {
    Step::One(Ok(Outcome::Retry("later".into())))
}

/// Catches: an ack lost or held back when the lane ends, or acks sent one
/// message each while records keep coming (see `acks`).
#[tokio::test(start_paused = true)]
async fn lone_acks_reach_settlement_in_bulk_and_all_of_them() {
    // The inbox holds 64: all of them are in before the lane starts.
    let records: Vec<Delivery> = (0..60).map(|n| record(n, 0)).collect();
    let run = run_lane(subscription(""), None, Script::new([]), records, None).await;
    let mut settled = run.settled.clone();
    settled.sort_unstable();
    assert_eq!(settled, (0..60).collect::<Vec<_>>());
    assert_eq!(
        run.messages, 2,
        "32, then the 28 left when the inbox ran dry"
    );
}

/// Catches: a retried record overtaken by the next one (per-key order), or
/// an attempt count that does not move.
#[tokio::test(start_paused = true)]
async fn a_retried_record_is_called_again_before_the_next_one() {
    let script = Script::new([retry(), retry()]);
    let run = run_lane(
        subscription(""),
        None,
        script.clone(),
        vec![record(0, 0), record(1, 0)],
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1)], 0),
            calls(&[(0, 2)], 0),
            calls(&[(0, 3)], 0),
            calls(&[(1, 1)], 0),
        ]
    );
    assert_eq!(run.settled, vec![0, 1]);
    assert_eq!(
        run.metric("shardlane_records_total{subscription=\"s\",outcome=\"retry\"}"),
        2
    );
}

/// Catches: a trapped instance called again (a trapped component cannot
/// be re-entered), or a trap that does not count as an attempt.
#[tokio::test(start_paused = true)]
async fn a_trap_recycles_the_instance_and_counts_an_attempt() {
    let script = Script::new([Step::One(Err(CallError::Trap("boom".into())))]);
    let run = run_lane(
        subscription(""),
        None,
        script.clone(),
        vec![record(0, 0)],
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![calls(&[(0, 1)], 0), calls(&[(0, 2)], 1)]
    );
    assert_eq!(run.settled, vec![0]);
    assert_eq!(
        run.metric("shardlane_instance_recycles_total{subscription=\"s\"}"),
        1
    );
}

/// Catches: a reject settled before its dead letter landed (a record
/// settled without being acked or durably dead-lettered), or a failed put
/// given up on.
#[tokio::test(start_paused = true)]
async fn a_reject_is_dead_lettered_before_it_settles_and_a_failed_put_is_retried() {
    let sink = Sink::new("dlq", 2);
    let script = Script::new([Step::One(Ok(Outcome::Reject("bad".into())))]);
    let run = run_lane(
        subscription("on_failure = \"dead_letter\"\ndead_letter_stream = \"dlq\""),
        Some(sink.clone()),
        script.clone(),
        vec![record(0, 0), record(1, 0)],
        None,
    )
    .await;
    assert_eq!(
        sink.tries.load(Ordering::SeqCst),
        3,
        "two refused, one landed"
    );
    assert_eq!(
        *sink.puts.lock().unwrap(),
        vec![(0, "rejected: bad".to_owned(), 1)]
    );
    assert_eq!(
        run.settled,
        vec![0, 1],
        "the reject settles, in order, once put"
    );
    assert_eq!(script.calls().len(), 2, "a reject is never retried");
}

/// Catches: `max_attempts` off by one, or a record given up on without
/// settling (the checkpoint would stall behind it).
#[tokio::test(start_paused = true)]
async fn attempts_run_out_and_the_record_is_skipped() {
    let script = Script::new((0..10).map(|_| retry()));
    let run = run_lane(
        subscription("max_attempts = 3\non_failure = \"skip\""),
        None,
        script.clone(),
        vec![record(0, 0)],
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1)], 0),
            calls(&[(0, 2)], 0),
            calls(&[(0, 3)], 0)
        ]
    );
    assert_eq!(run.settled, vec![0]);
    assert_eq!(
        run.metric("shardlane_records_skipped_total{subscription=\"s\"}"),
        1
    );
}

/// Catches: `max_record_age` ignored, so an old record keeps a shard busy.
#[tokio::test(start_paused = true)]
async fn a_record_past_its_age_is_given_up_at_its_first_failure() {
    let sink = Sink::new("dlq", 0);
    let script = Script::new((0..10).map(|_| retry()));
    let hour_ago = now_ms() - 3_600_000;
    let run = run_lane(
        subscription(
            "max_record_age = \"1m\"\non_failure = \"dead_letter\"\ndead_letter_stream = \"dlq\"",
        ),
        Some(sink.clone()),
        script.clone(),
        vec![record(0, hour_ago), record(1, now_ms())],
        None,
    )
    .await;
    assert_eq!(
        *sink.puts.lock().unwrap(),
        vec![(0, "retry: later".to_owned(), 1)]
    );
    // The young record is retried as long as the script says retry.
    assert_eq!(script.calls()[0], calls(&[(0, 1)], 0));
    assert_eq!(script.calls()[1], calls(&[(1, 1)], 0));
    assert_eq!(run.settled, vec![0, 1]);
}

/// Catches: `block` giving up (skipping data) instead of holding the lane,
/// or a blocked record settling.
#[tokio::test(start_paused = true)]
async fn block_keeps_retrying_past_max_attempts_and_never_settles() {
    let script = Script::new((0..1000).map(|_| retry()));
    let run = run_lane(
        subscription("max_attempts = 2"),
        None,
        script.clone(),
        vec![record(0, 0), record(1, 0)],
        Some(Duration::from_secs(5)),
    )
    .await;
    let made = script.calls();
    assert!(made.len() > 5, "{} calls", made.len());
    assert!(
        made.iter().all(|c| c.records[0].0 == 0),
        "the next record waits behind the blocked one"
    );
    assert!(run.settled.is_empty(), "{:?}", run.settled);
    assert!(run.metric("shardlane_records_blocked_total{subscription=\"s\"}") >= 4);
}

/// Catches: a swap that never reaches a running lane, or one that cuts a
/// record's retries over to the new version mid-way.
#[tokio::test(start_paused = true)]
async fn a_swap_takes_effect_at_the_next_record() {
    let script = Script::new([retry()]);
    // The factory moves to a new generation while record 0 is retried.
    let swapper = {
        let script = script.clone();
        tokio::spawn(async move {
            while script.calls().is_empty() {
                tokio::task::yield_now().await;
            }
            script.generation.store(1, Ordering::SeqCst);
        })
    };
    run_lane(
        subscription(""),
        None,
        script.clone(),
        vec![record(0, 0), record(1, 0)],
        None,
    )
    .await;
    swapper.await.unwrap();
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1)], 0),
            calls(&[(0, 2)], 0),
            calls(&[(1, 1)], 1),
        ]
    );
}

/// Catches: a lane that settles what `hard_stop` cut off.
#[tokio::test(start_paused = true)]
async fn hard_stop_leaves_the_record_under_way_unsettled() {
    let script = Script::new((0..1000).map(|_| retry()));
    let run = run_lane(
        subscription(""),
        None,
        script,
        vec![record(0, 0)],
        Some(Duration::from_millis(300)),
    )
    .await;
    assert!(run.settled.is_empty());
}

#[test]
fn the_failure_policy_config_is_what_the_lane_applies() {
    // The subscription helper really configures what the tests above rely
    // on (a silent default would make them pass for the wrong reason).
    let sub = subscription("max_attempts = 3\non_failure = \"skip\"");
    assert_eq!(
        sub.failure,
        FailurePolicy {
            max_attempts: Some(3),
            max_record_age: None,
            on_failure: OnFailure::Skip,
            bisect_on_error: false,
            quarantine: crate::parked::ParkLimits {
                max_keys: crate::config::defaults::QUARANTINE_MAX_KEYS,
                max_records: crate::config::defaults::QUARANTINE_MAX_RECORDS,
            },
        }
    );
}
