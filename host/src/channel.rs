//! The subscription channel: the one bounded queue between a subscription's
//! shard readers and its dispatch stage, and the record type it carries.
//!
//! Every reader of a subscription sends into the same channel of
//! [`CHANNEL_CAPACITY`] deliveries. When the handlers fall behind the channel
//! fills, and every reader waits in `send`: no shard is read ahead of what the
//! service can handle, and the records held in memory stay bounded (a reader
//! holds at most one GetRecords response, `read_limit` records, while it
//! waits). A delivery is one record plus the [`Ticket`] that settles it.
//!
//! The channel is multi-consumer (`async-channel`) so that unordered
//! workers take from it directly, with no extra hop; the channel closes when
//! the last reader's sender is dropped, and dispatch drains what is left.
//!
//! # Waking a full channel's senders in bulk
//! A sender that finds the channel full does not wait for one free slot
//! (`async-channel`'s `send`, which wakes it at every receive: a task
//! switch, often a thread wake-up, per record while the handlers are the
//! bottleneck — the largest cost of the e2e profile in BENCHMARKS.md). It
//! waits until the receivers have drained the channel to half
//! ([`Room`]): one wake-up per half a channel. The bound is the same — a
//! send still only succeeds into a free slot, and a full channel holds
//! every sender back (a little longer: until half of it is free).
//!
//! Why no wake-up is lost: a waiting sender first registers with the
//! `Notify` (`enable`), then raises `waiting`, then tries once more; a
//! receiver, after each receive, checks the fill and, at or below half,
//! clears `waiting` and wakes every registered sender. If the receiver's
//! check ran before the flag was raised, it saw the channel at or below
//! half, so the sender's last try finds a free slot — unless other senders
//! filled the channel meanwhile, in which case the receivers have a full
//! channel to drain and will pass half again with the flag raised. When
//! the last receiver goes it closes the channel and wakes every sender,
//! whose next try fails as closed.
//!
//! # Waking a receiver per fill
//! A batch lane with a batch open does not need each record as it comes:
//! it needs to know when enough wait to fill its batch, or when the
//! batch's window ends. Waiting in `recv` it would be woken by every send
//! (a task switch per record, as above but on the receiving side).
//! [`DeliveryReceiver::filled`] waits instead until `n` deliveries wait
//! ([`Fill`]; `n` at most half the channel, so the senders never wait on
//! it), a window's close waits (it ends the batch before it, so it is
//! taken at once, as before), or every sender is gone; the lane then takes
//! them all with `try_recv`. The lane still takes the batch's first record at once
//! (its arrival starts the window), and its window bounds the wait.
//!
//! Why no wake-up is lost: the same order as for senders. A waiting
//! receiver registers with the `Notify`, lowers `wanted` to its `n`, then
//! looks at the fill (and at the count of live senders) once more; a
//! sender, after each send, reads `wanted` and, with at least that many
//! waiting, clears it and wakes every registered receiver. A send that
//! read `wanted` before it was lowered was already counted by the
//! receiver's last look (this leans on `concurrent-queue`'s `len` reading
//! its head and tail with sequentially consistent loads, as its 2.x
//! versions do after a sequentially consistent push). A close is counted
//! after its send and uncounted when taken, then wakes receivers whatever
//! `wanted` is, with the same order against the receiver's last look.
//! The count of live senders is the channel's own
//! (kept here because `async-channel` cannot wait for its close): the
//! sender whose drop takes it to zero wakes every registered receiver
//! after the count shows it, so a receiver sees the close either in its
//! last look or by being woken.
//!
//! Floor 3 (sinks and clients) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};

use async_channel::{RecvError, SendError, TrySendError};
use tokio::sync::Notify;

use crate::ids::{PartitionKey, Position, SequenceNumber, SessionId, ShardId, StreamName};
use crate::progress::Ticket;
use crate::windows::Window;

/// Deliveries the channel holds before readers wait. 64 keeps a few
/// milliseconds of work queued for the handlers (so they never starve while
/// a reader's next GetRecords is in flight) without reading far ahead of
/// what is handled.
pub const CHANNEL_CAPACITY: usize = 64;

/// One record as read from Kinesis (or one user record of a KPL
/// aggregate, with its own partition key). Immutable and shared: a redelivery hands
/// out the same `Arc`, never a copy of the data.
#[derive(Debug)]
pub struct Record {
    /// The stream it was read from.
    pub stream: StreamName,
    /// The shard it was read from.
    pub shard: ShardId,
    /// The producer's partition key.
    pub partition_key: PartitionKey,
    /// Its sequence number within the shard (a KPL aggregate's, for a
    /// user record taken out of one).
    pub sequence: SequenceNumber,
    /// For a user record of a KPL aggregate: its index in the aggregate.
    pub sub_sequence: Option<u32>,
    /// When Kinesis accepted it, in ms since the Unix epoch.
    pub arrival_ms: u64,
    /// The payload.
    pub data: Vec<u8>,
    /// The window it falls in, for a subscription with `window` (set by
    /// its reader; `None` without one, or when it came too late).
    pub window: Option<Window>,
}

/// A record on its way to a handler, with the ticket that settles it.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Delivery {
    /// The record.
    pub record: Arc<Record>,
    /// Where it settles.
    pub ticket: Ticket,
}

/// What travels in the channel: a record, or the close of a window that
/// its reader decided (see the reader's `windowing` module) between two
/// records, in shard order.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) enum Work {
    /// A record to handle.
    Record(Delivery),
    /// A window to close.
    Close(Arc<WindowClose>),
}

impl From<Delivery> for Work {
    fn from(delivery: Delivery) -> Self {
        Work::Record(delivery)
    }
}

impl Work {
    /// The partition key by_key lanes route it by: a record's, or the
    /// first key of a close (with `by = "key"` its only one).
    pub(crate) fn routing_key(&self) -> Option<&PartitionKey> {
        match self {
            Work::Record(d) => Some(&d.record.partition_key),
            Work::Close(c) => c.keys.first(),
        }
    }
}

/// A window's close on its way to a lane: one per window of a shard, or
/// one per key of it (`by = "key"`).
#[derive(Debug)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct WindowClose {
    /// The stream.
    pub stream: StreamName,
    /// The shard the window closed on.
    pub shard: ShardId,
    /// The reader session that closed it (state is staged in it).
    pub session: SessionId,
    /// The window.
    pub window: Window,
    /// The keys it is for, in the order their first record came.
    pub keys: Vec<PartitionKey>,
    /// Where its state writes are staged: the last record handed out before
    /// it, so that they commit with the checkpoint that passes the window.
    pub stage_at: Position,
    /// Its window's hold (see the reader's `windowing` module): the
    /// reader retained it once for this close, which settles it once when
    /// done.
    pub hold: Ticket,
}

/// What a full channel's senders wait on (module docs).
#[derive(Debug, Default)]
struct Room {
    /// Wakes the waiting senders.
    notify: Notify,
    /// Some sender waits.
    waiting: AtomicBool,
}

/// What receivers waiting for a fill wait on (module docs).
#[derive(Debug)]
struct Fill {
    /// Wakes the waiting receivers.
    notify: Notify,
    /// The smallest fill a receiver waits for; 0 when none waits.
    wanted: AtomicUsize,
    /// Live senders: at zero the channel is closed.
    senders: AtomicUsize,
    /// Window closes in the channel (counted after the send and before
    /// the receive, so briefly below zero): a close ends a fill's wait.
    closes: AtomicIsize,
}

/// The sending half, one clone per reader.
#[derive(Debug)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct DeliverySender {
    tx: async_channel::Sender<Work>,
    room: Arc<Room>,
    fill: Arc<Fill>,
}

impl Clone for DeliverySender {
    fn clone(&self) -> Self {
        self.fill.senders.fetch_add(1, Ordering::SeqCst);
        Self {
            tx: self.tx.clone(),
            room: self.room.clone(),
            fill: self.fill.clone(),
        }
    }
}

impl Drop for DeliverySender {
    fn drop(&mut self) {
        // The last sender: receivers waiting for a fill see the close.
        if self.fill.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.fill.notify.notify_waiters();
        }
    }
}

impl DeliverySender {
    /// Puts `work` in a free slot, or gives it back: full or closed.
    pub(crate) fn try_send(&self, work: Work) -> Result<(), TrySendError<Work>> {
        let close = matches!(work, Work::Close(_));
        self.tx.try_send(work)?;
        if close {
            self.sent_close();
        } else {
            self.made_fill();
        }
        Ok(())
    }

    /// A window's close is in: receivers waiting for a fill take it now
    /// (it ends the batch before it), however few records wait.
    fn sent_close(&self) {
        self.fill.closes.fetch_add(1, Ordering::SeqCst);
        if self.fill.wanted.swap(0, Ordering::SeqCst) != 0 {
            self.fill.notify.notify_waiters();
        }
    }

    /// Wakes receivers waiting for a fill the channel has reached.
    fn made_fill(&self) {
        let wanted = self.fill.wanted.load(Ordering::SeqCst);
        if wanted != 0 && self.tx.len() >= wanted && self.fill.wanted.swap(0, Ordering::SeqCst) != 0
        {
            self.fill.notify.notify_waiters();
        }
    }

    /// Puts `delivery` in the channel, waiting while it is full until it
    /// has drained to half (module docs). Cancel-safe: dropped while
    /// waiting, it has sent nothing.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) async fn send(&self, work: impl Into<Work>) -> Result<(), SendError<Work>> {
        let mut delivery = work.into();
        loop {
            // Most sends find room: no waiter registered for them.
            delivery = match self.offer(delivery) {
                ControlFlow::Break(sent) => return sent,
                ControlFlow::Continue(full) => full,
            };
            let notified = self.room.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.room.waiting.store(true, Ordering::SeqCst);
            delivery = match self.offer(delivery) {
                ControlFlow::Break(sent) => return sent,
                ControlFlow::Continue(full) => full,
            };
            notified.await;
        }
    }

    /// One try: done (sent, or the channel closed), or the delivery back
    /// because the channel is full.
    fn offer(&self, delivery: Work) -> ControlFlow<Result<(), SendError<Work>>, Work> {
        match self.try_send(delivery) {
            Ok(()) => ControlFlow::Break(Ok(())),
            Err(TrySendError::Closed(d)) => ControlFlow::Break(Err(SendError(d))),
            Err(TrySendError::Full(d)) => ControlFlow::Continue(d),
        }
    }
}

/// The receiving half, owned by the dispatch stage. Multi-consumer: in
/// `workers` mode every lane takes from it directly.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct DeliveryReceiver {
    rx: async_channel::Receiver<Work>,
    room: Arc<Room>,
    fill: Arc<Fill>,
    /// At or below this many, waiting senders are woken.
    low_water: usize,
}

impl DeliveryReceiver {
    /// The next delivery; an error once the channel is closed and empty.
    pub(crate) async fn recv(&self) -> Result<Work, RecvError> {
        let delivery = self.rx.recv().await?;
        self.took(&delivery);
        Ok(delivery)
    }

    /// The next delivery if one is waiting (a lane filling a run).
    pub(crate) fn try_recv(&self) -> Option<Work> {
        let delivery = self.rx.try_recv().ok()?;
        self.took(&delivery);
        Some(delivery)
    }

    /// Book-keeping after a receive: room for senders, closes in flight.
    fn took(&self, work: &Work) {
        if matches!(work, Work::Close(_)) {
            self.fill.closes.fetch_sub(1, Ordering::SeqCst);
        }
        self.made_room();
    }

    /// Waits until `n` deliveries wait, or every sender is gone (module
    /// docs); `n` counts at most half the channel, so that senders never
    /// wait on it. Takes nothing; cancel-safe.
    pub(crate) async fn filled(&self, n: usize) {
        let n = n.clamp(1, self.low_water.max(1));
        loop {
            if self.reached(n) {
                return;
            }
            let notified = self.fill.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let _ = self
                .fill
                .wanted
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                    Some(if w == 0 { n } else { w.min(n) })
                });
            if self.reached(n) {
                return;
            }
            notified.await;
        }
    }

    /// Every sender is gone and nothing waits: `recv` would fail.
    pub(crate) fn is_drained(&self) -> bool {
        self.rx.is_empty() && self.fill.senders.load(Ordering::SeqCst) == 0
    }

    /// `n` deliveries wait, a window's close waits, or no sender is left.
    fn reached(&self, n: usize) -> bool {
        self.rx.len() >= n
            || self.fill.closes.load(Ordering::SeqCst) > 0
            || self.fill.senders.load(Ordering::SeqCst) == 0
    }

    /// Wakes waiting senders once the channel has drained to half.
    fn made_room(&self) {
        if self.rx.len() <= self.low_water
            && self.room.waiting.load(Ordering::SeqCst)
            && self.room.waiting.swap(false, Ordering::SeqCst)
        {
            self.room.notify.notify_waiters();
        }
    }

    /// Deliveries waiting.
    pub(crate) fn len(&self) -> usize {
        self.rx.len()
    }
}

impl Drop for DeliveryReceiver {
    fn drop(&mut self) {
        // The last receiver: nothing will make room again.
        if self.rx.receiver_count() == 1 {
            self.rx.close();
            self.room.notify.notify_waiters();
        }
    }
}

/// A bounded channel of `capacity` deliveries whose full senders wait for
/// half of it (module docs).
pub(crate) fn bounded(capacity: usize) -> (DeliverySender, DeliveryReceiver) {
    let (tx, rx) = async_channel::bounded(capacity);
    let room = Arc::new(Room::default());
    let fill = Arc::new(Fill {
        notify: Notify::new(),
        wanted: AtomicUsize::new(0),
        senders: AtomicUsize::new(1),
        closes: AtomicIsize::new(0),
    });
    (
        DeliverySender {
            tx,
            room: room.clone(),
            fill: fill.clone(),
        },
        DeliveryReceiver {
            rx,
            room,
            fill,
            low_water: capacity / 2,
        },
    )
}

/// Creates a subscription's channel.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) fn channel() -> (DeliverySender, DeliveryReceiver) {
    bounded(CHANNEL_CAPACITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(n: u64) -> Delivery {
        crate::tests::delivery("k", n)
    }

    /// Catches: a full sender woken before half the channel is free (one
    /// wake per record), or never woken (a lost wake-up).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_sender_resumes_once_half_the_channel_is_free() {
        let (tx, rx) = bounded(8);
        for n in 0..8 {
            tx.try_send(delivery(n).into()).unwrap();
        }
        let sending = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(delivery(8)).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        for _ in 0..3 {
            rx.recv().await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!sending.is_finished(), "woken with only 3 of 8 free");
        rx.recv().await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), sending)
            .await
            .expect("woken at half")
            .unwrap()
            .unwrap();
        assert_eq!(rx.len(), 5);
    }

    /// Catches: a sender left waiting forever when dispatch goes away.
    #[tokio::test]
    async fn a_waiting_sender_fails_when_the_last_receiver_goes() {
        let (tx, rx) = bounded(2);
        let other = rx.clone();
        tx.try_send(delivery(0).into()).unwrap();
        tx.try_send(delivery(1).into()).unwrap();
        let sending = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(delivery(2)).await }
        });
        tokio::task::yield_now().await;
        drop(rx);
        drop(other);
        let sent = tokio::time::timeout(std::time::Duration::from_secs(5), sending)
            .await
            .expect("woken when closed")
            .unwrap();
        assert!(sent.is_err());
    }

    /// Catches: a receiver waiting for a fill woken before it (a wake per
    /// record again), or never.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_receiver_waiting_for_a_fill_wakes_when_it_is_reached() {
        let (tx, rx) = bounded(16);
        let waiting = tokio::spawn({
            let rx = rx.clone();
            async move { rx.filled(3).await }
        });
        tx.send(delivery(0)).await.unwrap();
        tx.send(delivery(1)).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "woken with 2 of 3");
        tx.send(delivery(2)).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken at 3")
            .unwrap();
        assert_eq!(rx.len(), 3, "filled takes nothing");
    }

    /// Catches: a window's close left waiting for a fill of records (the
    /// batch before it, and the close, would wait for the window's end).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_receiver_waiting_for_a_fill_wakes_for_a_close() {
        let (tx, rx) = bounded(16);
        tx.send(delivery(0)).await.unwrap();
        let waiting = tokio::spawn({
            let rx = rx.clone();
            async move { rx.filled(8).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one record of 8");
        tx.send(Work::Close(Arc::new(WindowClose {
            stream: StreamName::from("s"),
            shard: ShardId::from("shard-0"),
            session: SessionId(1),
            window: Window { start: 0, end: 1 },
            keys: Vec::new(),
            stage_at: Position::whole(SequenceNumber::parse("1").unwrap()),
            hold: Ticket {
                shard: ShardId::from("shard-0"),
                session: SessionId(1),
                offset: 0,
            },
        })))
        .await
        .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken by the close")
            .unwrap();
        assert!(matches!(rx.try_recv(), Some(Work::Record(_))));
        assert!(matches!(rx.try_recv(), Some(Work::Close(_))));
        // Taken, the close no longer ends a wait.
        tx.send(delivery(1)).await.unwrap();
        let again = tokio::time::timeout(std::time::Duration::from_millis(50), rx.filled(8)).await;
        assert!(again.is_err(), "a close already taken still ended a wait");
    }

    /// Catches: a fill wanted beyond half the channel, which would hold
    /// its senders waiting for room that only the waiting receiver makes.
    #[tokio::test]
    async fn a_fill_counts_at_most_half_the_channel() {
        let (tx, rx) = bounded(8);
        for n in 0..4 {
            tx.send(delivery(n)).await.unwrap();
        }
        tokio::time::timeout(std::time::Duration::from_secs(5), rx.filled(100))
            .await
            .expect("half of 8 is a fill");
    }

    /// Catches: a receiver waiting for a fill that never comes left
    /// waiting after the last sender went (the lane would wait out its
    /// batch window at every shutdown, or forever).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_receiver_waiting_for_a_fill_wakes_when_the_last_sender_goes() {
        let (tx, rx) = bounded(16);
        let other = tx.clone();
        tx.send(delivery(0)).await.unwrap();
        let waiting = tokio::spawn({
            let rx = rx.clone();
            async move { rx.filled(5).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(tx);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one sender is still there");
        assert!(!rx.is_drained());
        drop(other);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("woken by the close")
            .unwrap();
        assert!(!rx.is_drained(), "a delivery still waits");
        rx.recv().await.unwrap();
        assert!(rx.is_drained());
    }

    /// Senders racing receivers that wait for fills: every wait ends (no
    /// lost wake-up) and every delivery arrives once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn receivers_waiting_for_fills_lose_no_wake_up() {
        let (tx, rx) = bounded(8);
        let mut senders = Vec::new();
        for s in 0..3u64 {
            let tx = tx.clone();
            senders.push(tokio::spawn(async move {
                for n in 0..2000 {
                    tx.send(delivery(s * 10_000 + n)).await.unwrap();
                    if n % 97 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        drop(tx);
        let mut receivers = Vec::new();
        for r in 0..2usize {
            let rx = rx.clone();
            receivers.push(tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    rx.filled(1 + (got.len() + r) % 4).await;
                    while let Some(Work::Record(d)) = rx.try_recv() {
                        got.push(d.ticket.offset);
                    }
                    if rx.is_drained() {
                        return got;
                    }
                }
            }));
        }
        drop(rx);
        for s in senders {
            s.await.unwrap();
        }
        let mut all = Vec::new();
        for r in receivers {
            let got = tokio::time::timeout(std::time::Duration::from_secs(20), r)
                .await
                .expect("no receiver left waiting")
                .unwrap();
            all.extend(got);
        }
        all.sort_unstable();
        let want: Vec<u64> = (0..3u64)
            .flat_map(|s| (0..2000).map(move |n| s * 10_000 + n))
            .collect();
        assert_eq!(all, want);
    }

    /// Many senders and receivers: every delivery arrives exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_senders_and_receivers_lose_nothing() {
        let (tx, rx) = bounded(4);
        let mut senders = Vec::new();
        for s in 0..4u64 {
            let tx = tx.clone();
            senders.push(tokio::spawn(async move {
                for n in 0..500 {
                    tx.send(delivery(s * 1000 + n)).await.unwrap();
                }
            }));
        }
        drop(tx);
        let mut receivers = Vec::new();
        for _ in 0..3 {
            let rx = rx.clone();
            receivers.push(tokio::spawn(async move {
                let mut got = Vec::new();
                while let Ok(Work::Record(d)) = rx.recv().await {
                    got.push(d.ticket.offset);
                }
                got
            }));
        }
        drop(rx);
        for s in senders {
            s.await.unwrap();
        }
        let mut all = Vec::new();
        for r in receivers {
            all.extend(r.await.unwrap());
        }
        all.sort_unstable();
        let want: Vec<u64> = (0..4u64)
            .flat_map(|s| (0..500).map(move |n| s * 1000 + n))
            .collect();
        assert_eq!(all, want);
    }
}
