//! The polling reader against a scripted [`ShardReads`] fake: what it
//! hands out, in which order it tells settlement, and what it does on
//! throttling, an expired iterator, the shard's end, a bad page and the
//! loss of its lease. Time is paused, so backoffs and pacing cost nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::channel::DeliveryReceiver;
use crate::config::StartPosition;
use crate::ids::{PartitionKey, SequenceNumber};

/// A call the reader made.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Open(ReadFrom),
    Get(String),
}

/// Answers scripted in order, one queue per call. A call past the script
/// fails the test (the reader task panics), unless the script
/// [`waits`](Script::waits): then a read past it waits until the test adds
/// an answer ([`Script::more`]).
#[derive(Default)]
struct Script {
    opens: Mutex<VecDeque<Result<String, KinesisError>>>,
    pages: Mutex<VecDeque<Result<Page, KinesisError>>>,
    calls: Mutex<Vec<Call>>,
    waits: bool,
    added: tokio::sync::Notify,
}

impl Script {
    fn open(self, answer: Result<&str, KinesisError>) -> Self {
        self.opens
            .lock()
            .unwrap()
            .push_back(answer.map(str::to_owned));
        self
    }

    fn page(self, answer: Result<Page, KinesisError>) -> Self {
        self.pages.lock().unwrap().push_back(answer);
        self
    }

    /// A read past the script waits instead of failing.
    fn waits(mut self) -> Self {
        self.waits = true;
        self
    }

    /// Adds a page answer while the reader runs.
    fn more(&self, answer: Result<Page, KinesisError>) {
        self.pages.lock().unwrap().push_back(answer);
        self.added.notify_one();
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl ShardReads for Script {
    async fn open_iterator(
        &self,
        _stream: &StreamName,
        _shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<String, KinesisError> {
        self.calls.lock().unwrap().push(Call::Open(from.clone()));
        let next = self.opens.lock().unwrap().pop_front();
        next.unwrap_or_else(|| panic!("an iterator opened past the script, {from:?}"))
    }

    async fn get_records(&self, iterator: &str, _limit: i32) -> Result<Page, KinesisError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Get(iterator.to_owned()));
        loop {
            let next = self.pages.lock().unwrap().pop_front();
            match next {
                Some(answer) => return answer,
                None if self.waits => self.added.notified().await,
                None => panic!("a read past the script, at {iterator:?}"),
            }
        }
    }
}

/// A page of the records with sequence numbers `seqs`, then `next`.
fn page(seqs: &[u64], next: Option<&str>) -> Result<Page, KinesisError> {
    Ok(Page {
        records: seqs
            .iter()
            .map(|s| Fetched {
                partition_key: PartitionKey::new(format!("k{s}")),
                sequence: SequenceNumber::parse(&s.to_string()).unwrap(),
                arrival_ms: 0,
                data: vec![1],
            })
            .collect(),
        next_iterator: next.map(str::to_owned),
        millis_behind: Some(0),
    })
}

fn after(seq: u64) -> ReadFrom {
    ReadFrom::After(Position::whole(
        SequenceNumber::parse(&seq.to_string()).unwrap(),
    ))
}

/// A reader of one shard over `script`, and what it talks to.
struct Harness {
    script: Arc<Script>,
    deliveries: DeliveryReceiver,
    settlement: mpsc::Receiver<SettlementMsg>,
    /// The keeper's validity publisher; `None` once it let go.
    valid_until: Option<watch::Sender<Instant>>,
    cancel: CancellationToken,
    reader: JoinHandle<ReaderExit>,
}

fn start(script: Script, from: ReadFrom, valid_for: Option<Duration>) -> Harness {
    start_with(script, None, from, valid_for)
}

/// [`start`], reading through `fan_out` when given.
fn start_with(
    script: Script,
    fan_out: Option<Arc<dyn ShardSubscriber>>,
    from: ReadFrom,
    valid_for: Option<Duration>,
) -> Harness {
    let script = Arc::new(script);
    let (ctx, deliveries, settlement) = crate::tests::reader_context(script.clone(), fan_out);
    // A lease far from its deadline unless the test says otherwise.
    let until = Instant::now() + valid_for.unwrap_or(Duration::from_secs(3600));
    let (valid_until, valid_rx) = watch::channel(until);
    let cancel = CancellationToken::new();
    let reader = ShardReader::new(
        ctx,
        ShardId::from("shard-0"),
        SessionId(7),
        from,
        None,
        cancel.clone(),
        valid_rx,
    );
    Harness {
        script,
        deliveries,
        settlement,
        valid_until: Some(valid_until),
        cancel,
        reader: tokio::spawn(reader.run()),
    }
}

impl Harness {
    /// How the reader ended; as [`Harness::next`], a reader that does not
    /// end fails at once.
    async fn exit(&mut self) -> ReaderExit {
        tokio::time::timeout(Duration::from_secs(3600), &mut self.reader)
            .await
            .expect("the reader ended")
            .expect("the reader did not panic")
    }

    /// The keeper says the lease is surely held until `until`.
    fn valid(&self, until: Instant) {
        self.valid_until.as_ref().unwrap().send(until).unwrap();
    }

    /// The keeper lets go of the lease.
    fn let_go(&mut self) {
        self.valid_until = None;
    }

    /// The settlement messages sent so far, as short names.
    fn told(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(msg) = self.settlement.try_recv() {
            out.push(match msg {
                SettlementMsg::Open { session, .. } => format!("open {}", session.0),
                SettlementMsg::Track { positions, .. } => format!(
                    "track {}",
                    positions
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                SettlementMsg::Close { delivered, .. } => format!("close {delivered}"),
                SettlementMsg::End { .. } => "end".to_owned(),
                other => format!("{other:?}"),
            });
        }
        out
    }

    /// The next delivery's sequence number and offset. Time is paused, so
    /// a reader that hands out nothing fails this at once, not after an
    /// hour.
    async fn next(&self) -> (String, u64) {
        let d = tokio::time::timeout(Duration::from_secs(3600), self.deliveries.recv())
            .await
            .expect("a delivery")
            .unwrap();
        let crate::channel::Work::Record(d) = d else {
            panic!("a window's close, with no window configured");
        };
        assert_eq!(d.ticket.session, SessionId(7));
        (d.record.sequence.to_string(), d.ticket.offset)
    }
}

/// Catches a reader that hands a record out before settlement tracks it
/// (its ack could then pass the checkpoint over unsettled records), that
/// numbers offsets wrongly, or that misses the shard's end.
#[tokio::test(start_paused = true)]
async fn records_are_tracked_before_they_are_handed_out_in_order_and_the_end_is_reported() {
    let script = Script::default()
        .open(Ok("it-0"))
        .page(page(&[1, 2], Some("it-1")))
        .page(page(&[3], None));
    let mut h = start(script, ReadFrom::Start(StartPosition::TrimHorizon), None);
    assert_eq!(h.next().await, ("1".to_owned(), 0));
    assert_eq!(h.told(), ["open 7", "track 1,2"]);
    assert_eq!(h.next().await, ("2".to_owned(), 1));
    assert_eq!(h.next().await, ("3".to_owned(), 2));
    assert_eq!(h.exit().await, ReaderExit::ShardEnd);
    assert_eq!(h.told(), ["track 3", "end"]);
    assert_eq!(
        h.script.calls(),
        [
            Call::Open(ReadFrom::Start(StartPosition::TrimHorizon)),
            Call::Get("it-0".into()),
            Call::Get("it-1".into()),
        ]
    );
}

/// Catches a reader that drops its iterator on throttling or a failed
/// read and reopens it (at the tip it would skip records).
#[tokio::test(start_paused = true)]
async fn a_throttled_or_failed_read_keeps_its_iterator() {
    let script = Script::default()
        .open(Ok("it-0"))
        .page(Err(KinesisError::Throttled("slow down".into())))
        .page(Err(KinesisError::Failed("reset".into())))
        .page(page(&[], None));
    let mut h = start(script, after(10), None);
    assert_eq!(h.exit().await, ReaderExit::ShardEnd);
    assert_eq!(
        h.script.calls(),
        [
            Call::Open(after(10)),
            Call::Get("it-0".into()),
            Call::Get("it-0".into()),
            Call::Get("it-0".into()),
        ]
    );
}

/// Catches a reader that reopens an expired iterator anywhere but right
/// after the last record it handed out (at its first position it would
/// hand records out twice; at the tip it would skip some).
#[tokio::test(start_paused = true)]
async fn an_expired_iterator_is_reopened_after_the_last_record_handed_out() {
    let script = Script::default()
        .open(Ok("a"))
        .page(page(&[5, 6], Some("b")))
        .page(Err(KinesisError::ExpiredIterator))
        .open(Ok("c"))
        .page(page(&[7], None));
    let mut h = start(script, after(4), None);
    for expected in ["5", "6", "7"] {
        assert_eq!(h.next().await.0, expected);
    }
    assert_eq!(h.exit().await, ReaderExit::ShardEnd);
    assert_eq!(
        h.script.calls(),
        [
            Call::Open(after(4)),
            Call::Get("a".into()),
            Call::Get("b".into()),
            Call::Open(after(6)),
            Call::Get("c".into()),
        ]
    );
}

/// Catches a reader that acts on a lease past its validity: it must open
/// nothing until the keeper renews the lease.
#[tokio::test(start_paused = true)]
async fn a_reader_past_its_lease_validity_reads_nothing_until_a_renewal() {
    let script = Script::default().open(Ok("it-0")).page(page(&[1], None));
    let mut h = start(script, after(0), Some(Duration::ZERO));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(h.script.calls(), [], "nothing read past the validity");
    assert_eq!(h.deliveries.len(), 0);
    h.valid(Instant::now() + Duration::from_secs(60));
    assert_eq!(h.next().await, ("1".to_owned(), 0));
    assert_eq!(h.exit().await, ReaderExit::ShardEnd);
}

/// Catches a reader that puts a record read while the lease was valid
/// into the channel after the validity ran out (a paused instance would
/// then hand out records of a lease that changed hands), or that reports
/// such a record as handed out when the keeper lets go of the lease.
#[tokio::test(start_paused = true)]
async fn records_read_are_not_handed_out_past_the_validity_and_the_close_counts_only_those_handed_out()
 {
    let script = Script::default()
        .open(Ok("it-0"))
        .page(page(&[1], Some("it-1")))
        .waits();
    let mut h = start(script, after(0), None);
    assert_eq!(h.next().await, ("1".to_owned(), 0));
    // Once the reader waits on its next read, the lease runs out; then the
    // read answers.
    while !h.script.calls().contains(&Call::Get("it-1".into())) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.valid(Instant::now());
    h.script.more(page(&[2], Some("it-2")));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(h.deliveries.len(), 0, "record 2 held back");
    // The keeper let go of the lease: the reader stops and says it handed
    // out one record.
    h.let_go();
    assert_eq!(h.exit().await, ReaderExit::Cancelled);
    assert_eq!(h.told(), ["open 7", "track 1", "track 2", "close 1"]);
    assert_eq!(h.deliveries.len(), 0);
}

/// Catches a reader that skips a page it cannot read (records lost
/// without a trace) instead of stopping, or that is not stopped by its
/// cancellation while a read hangs.
#[tokio::test(start_paused = true)]
async fn a_malformed_page_stops_the_reader_and_a_hung_read_yields_to_cancellation() {
    let script = Script::default()
        .open(Ok("it-0"))
        .page(Err(KinesisError::Malformed("sequence number \"x\"".into())));
    let mut h = start(script, after(0), None);
    assert_eq!(h.exit().await, ReaderExit::Cancelled);
    assert_eq!(h.script.calls().len(), 2, "no read after the bad page");

    // A read that never answers: cancellation ends the reader there.
    let script = Script::default().open(Ok("it-0")).waits();
    let mut h = start(script, after(0), None);
    tokio::time::sleep(Duration::from_secs(5)).await;
    h.cancel.cancel();
    assert_eq!(h.exit().await, ReaderExit::Cancelled);
    assert_eq!(h.told(), ["open 7", "close 0"]);
}

/// Scripted shard subscriptions: each `subscribe` takes the next answer,
/// a refusal or a list of events (past them, the subscription ends).
#[derive(Default)]
struct Feed {
    answers: Mutex<VecDeque<Result<Vec<FanOutEvent>, KinesisError>>>,
    subscribed: Mutex<Vec<ReadFrom>>,
}

impl Feed {
    fn then(self, answer: Result<Vec<FanOutEvent>, KinesisError>) -> Self {
        self.answers.lock().unwrap().push_back(answer);
        self
    }
}

struct Events(VecDeque<FanOutEvent>);

#[async_trait]
impl ShardEvents for Events {
    async fn next(&mut self) -> Result<Option<FanOutEvent>, KinesisError> {
        Ok(self.0.pop_front())
    }
}

#[async_trait]
impl ShardSubscriber for Feed {
    async fn subscribe(
        &self,
        _shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<Box<dyn ShardEvents>, KinesisError> {
        self.subscribed.lock().unwrap().push(from.clone());
        let answer = self.answers.lock().unwrap().pop_front();
        let events =
            answer.unwrap_or_else(|| panic!("a subscription past the script, {from:?}"))?;
        Ok(Box::new(Events(events.into())))
    }
}

/// An event with the records `seqs`, continuing after `continuation`
/// (`None`: the shard's last event).
fn event(seqs: &[u64], continuation: Option<u64>) -> FanOutEvent {
    FanOutEvent {
        records: page(seqs, None).unwrap().records,
        continuation: continuation.map(|c| SequenceNumber::parse(&c.to_string()).unwrap()),
        millis_behind: 0,
        shard_ended: continuation.is_none(),
    }
}

/// Catches a fan-out reader that subscribes again anywhere but after the
/// last continuation (at its first position records would be handed out
/// twice), that retries a refused subscription elsewhere, or that misses
/// the shard's end.
#[tokio::test(start_paused = true)]
async fn fan_out_resumes_after_the_last_continuation_and_reports_the_end() {
    let feed = Arc::new(
        Feed::default()
            .then(Err(KinesisError::Throttled("in use".into())))
            .then(Ok(vec![event(&[1, 2], Some(2)), event(&[3], Some(3))]))
            .then(Ok(vec![event(&[4], None)])),
    );
    let mut h = start_with(
        Script::default(),
        Some(feed.clone()),
        ReadFrom::Start(StartPosition::TrimHorizon),
        None,
    );
    for (i, expected) in ["1", "2", "3", "4"].into_iter().enumerate() {
        assert_eq!(h.next().await, (expected.to_owned(), i as u64));
    }
    assert_eq!(h.exit().await, ReaderExit::ShardEnd);
    assert_eq!(
        h.told(),
        ["open 7", "track 1,2", "track 3", "track 4", "end"]
    );
    assert_eq!(
        *feed.subscribed.lock().unwrap(),
        [
            ReadFrom::Start(StartPosition::TrimHorizon),
            ReadFrom::Start(StartPosition::TrimHorizon),
            after(3),
        ]
    );
    assert!(h.script.calls().is_empty(), "nothing polled");
}

/// Catches a fan-out reader that skips an event it cannot read instead
/// of stopping.
#[tokio::test(start_paused = true)]
async fn fan_out_stops_at_a_malformed_event() {
    struct Bad;
    #[async_trait]
    impl ShardEvents for Bad {
        async fn next(&mut self) -> Result<Option<FanOutEvent>, KinesisError> {
            Err(KinesisError::Malformed("continuation \"x\"".into()))
        }
    }
    struct OneBad;
    #[async_trait]
    impl ShardSubscriber for OneBad {
        async fn subscribe(
            &self,
            _shard: &ShardId,
            _from: &ReadFrom,
        ) -> Result<Box<dyn ShardEvents>, KinesisError> {
            Ok(Box::new(Bad))
        }
    }
    let mut h = start_with(Script::default(), Some(Arc::new(OneBad)), after(0), None);
    assert_eq!(h.exit().await, ReaderExit::Cancelled);
    assert_eq!(h.told(), ["open 7", "close 0"]);
}

/// A reader of `records` (one page, at the tip, then the shard's end)
/// for a subscription with `extra` lines, run to its end; what it told
/// settlement (short names) and what it put into the channel.
async fn run_windowed(records: Vec<Fetched>, extra: &str) -> (Vec<String>, Vec<String>) {
    let script = Arc::new(Script::default().open(Ok("it-0")).page(Ok(Page {
        records,
        next_iterator: None,
        millis_behind: Some(0),
    })));
    let (mut ctx, deliveries, mut settlement) = crate::tests::reader_context(script, None);
    ctx.subscription = crate::tests::subscription(extra);
    let (_valid, valid_rx) = watch::channel(Instant::now() + Duration::from_secs(3600));
    let reader = ShardReader::new(
        ctx,
        ShardId::from("shard-0"),
        SessionId(7),
        ReadFrom::Start(StartPosition::TrimHorizon),
        None,
        CancellationToken::new(),
        valid_rx,
    );
    assert_eq!(reader.run().await, ReaderExit::ShardEnd);
    let mut told = Vec::new();
    while let Ok(msg) = settlement.try_recv() {
        told.push(match msg {
            SettlementMsg::Open { .. } => "open".to_owned(),
            SettlementMsg::Hold { .. } => "hold".to_owned(),
            SettlementMsg::Track { positions, .. } => format!("track {}", positions[0]),
            SettlementMsg::Retain(t) => format!("retain {}", t.offset),
            SettlementMsg::EndHold(t) => format!("end hold {}", t.offset),
            SettlementMsg::End { .. } => "end".to_owned(),
            other => format!("{other:?}"),
        });
    }
    let mut handed = Vec::new();
    while let Some(work) = deliveries.try_recv() {
        handed.push(match work {
            Work::Record(d) => format!(
                "record {} at {} in {:?}",
                d.record.sequence,
                d.ticket.offset,
                d.record.window.map(|w| w.start)
            ),
            Work::Close(c) => format!(
                "close {} of {} at {} staged at {}",
                c.keys[0], c.window.start, c.hold.offset, c.stage_at
            ),
        });
    }
    (told, handed)
}

/// Catches a windowed reader that lets the checkpoint pass an open
/// window (no hold before its first record), hands a close out after a
/// later record, stages a close outside its window, or ends a shard
/// before its window closed.
#[tokio::test(start_paused = true)]
async fn windows_hold_the_checkpoint_and_close_between_records() {
    let fetched = |key: &str, seq: u64, arrival_ms: u64| Fetched {
        partition_key: PartitionKey::new(key),
        sequence: SequenceNumber::parse(&seq.to_string()).unwrap(),
        arrival_ms,
        data: vec![1],
    };
    let records = vec![
        fetched("a", 1, 100),
        fetched("b", 2, 500),
        // A later window: the first one closes before it.
        fetched("a", 3, 1_300),
    ];
    let (told, handed) = run_windowed(
        records,
        "window = { size = \"1s\", by = \"key\", grace = \"100ms\" }\nworkers = 2\nby_key = true",
    )
    .await;
    assert_eq!(
        told,
        [
            "open",
            "hold",
            "track 1",
            "track 2", // window [0, 1000)
            "retain 0",
            "retain 0",
            "end hold 0", // its closes (a, b)
            "hold",
            "track 3", // window [1000, 2000)
            "retain 3",
            "end hold 3", // closed at the quiet tip
            "end",
        ]
    );
    assert_eq!(
        handed,
        [
            "record 1 at 1 in Some(0)",
            "record 2 at 2 in Some(0)",
            "close a of 0 at 0 staged at 2",
            "close b of 0 at 0 staged at 2",
            "record 3 at 4 in Some(1000)",
            "close a of 1000 at 3 staged at 3",
        ]
    );
}
