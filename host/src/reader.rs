//! The shard readers: one task per leased shard, from its checkpoint (or
//! the configured start) into the subscription channel; the [`pool`] starts
//! and stops them as the lease keeper assigns shards.
//!
//! Loop: GetRecords with the current iterator; take the user records out
//! of KPL aggregates ([`unpack`]); tell settlement about the records (so
//! the checkpoint cannot pass them), then send them one by one into the
//! subscription channel, waiting while it is full. When the next read may
//! go is the shard's read budget's to say ([`pace`]): a read that returned
//! records is followed as soon as `max_reads_per_second` allows, an empty
//! one waits `poll_idle`, ramping up to `poll_idle_max` on a shard that
//! stays quiet, and throttling lowers the shard's rate.
//!
//! Failures: throttling backs off with jitter and keeps the iterator (and
//! is counted per shard and logged at WARN at most once an interval: see
//! [`crate::throttle`]); an
//! expired iterator is reopened after the last record this reader handed
//! out (never at the tip, which would skip records); other errors back off
//! and retry. The end of a closed shard (no next iterator) is reported to
//! settlement, which checkpoints `SHARD_END` once everything before it
//! settled.
//!
//! The reader pool owns this task and cancels it when the keeper says stop
//! (lease lost, handed over) or closes its assignments (shutdown). Every
//! wait (`send`, sleep, AWS call) is cancellable, so a reader stops handing
//! out records as soon as it is told to.
//!
//! Lease validity: the keeper also publishes until when the lease is surely
//! still ours (see the lease keeper's "Validity"), on a channel that closes when
//! the lease is lost. Past that deadline the reader
//! opens no iterator and puts nothing into the channel, not even a record a
//! pending `send` was about to deliver: it waits for a renewal or for the
//! keeper to stop it. An instance that was paused therefore cannot act on
//! a lease that changed hands meanwhile, whichever of its tasks runs first
//! when it resumes.
//!
//! Floor 6 (records in and out) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod fan_out;
pub(crate) mod filter_feed;
mod pace;
pub(crate) mod pool;
pub(crate) mod range;
mod unpack;
mod windowing;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::channel::{Delivery, DeliverySender, Record, Work};
use crate::config::SubscriptionConfig;
use crate::ids::{Position, SessionId, ShardId, StreamName};
use crate::kinesis::{
    ConsumerArn, FanOutEvent, Fetched, HashKeyRange, Kinesis, KinesisError, Page, ReadFrom,
    Subscription,
};
use crate::progress::Ticket;
use crate::settlement::{SettlementMsg, SettlementSender};
use crate::telemetry::{Gauge, SubscriptionStatus, Telemetry, spans};

/// First wait after a throttled or failed call.
const ERROR_BACKOFF_INITIAL: Duration = Duration::from_millis(200);
/// Longest wait between attempts of a failing call.
const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// What a reader asks of Kinesis to read a shard by polling (and the
/// fan-out reader, to tell a shard's end): the reader's seam, so that a
/// unit test drives a reader with a scripted fake. [`Kinesis`] implements
/// it with GetShardIterator and GetRecords.
#[async_trait]
pub(crate) trait ShardReads: Send + Sync {
    /// An iterator into `shard` of `stream` at `from`.
    async fn open_iterator(
        &self,
        stream: &StreamName,
        shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<String, KinesisError>;

    /// Up to `limit` records at `iterator`, and where to read next.
    async fn get_records(&self, iterator: &str, limit: i32) -> Result<Page, KinesisError>;
}

#[async_trait]
impl ShardReads for Kinesis {
    async fn open_iterator(
        &self,
        stream: &StreamName,
        shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<String, KinesisError> {
        Kinesis::open_iterator(self, stream, shard, from).await
    }

    async fn get_records(&self, iterator: &str, limit: i32) -> Result<Page, KinesisError> {
        Kinesis::get_records(self, iterator, limit).await
    }
}

/// What a reader waits for before it opens a shard: the quarantine reads
/// the parked keys (see `crate::failure`'s quarantine), so a shard taken
/// over never hands out a record of a key parked elsewhere. A seam, as
/// dispatch's handler is: defined here, implemented above.
#[async_trait]
pub(crate) trait BeforeRead: Send + Sync {
    /// Returns once the shard may be read (it retries what fails itself).
    async fn before_read(&self, shard: &ShardId);
}

/// What a reader does to the records of a page before it tracks and hands
/// them out: a redrive turns dead-letter envelopes back into the records
/// they carry, and drops those it does not redrive (they are never
/// tracked, so they hold no checkpoint back). Each record keeps its
/// position in the shard read. A seam: defined here, implemented above.
#[async_trait]
pub(crate) trait Decode: Send + Sync {
    /// The records to hand out, in order; `None` when `cancel` cut it
    /// short (the reader then hands out nothing of the page: a record it
    /// dropped unread would otherwise be passed by the checkpoint).
    async fn decode(
        &self,
        records: Vec<(Record, Position)>,
        cancel: &CancellationToken,
    ) -> Option<Vec<(Record, Position)>>;
}

/// What a fan-out reader asks of Kinesis: a subscription to a shard from
/// a position. Its seam, as [`ShardReads`] is the polling reader's;
/// [`FanOut`] implements it with SubscribeToShard.
#[async_trait]
pub(crate) trait ShardSubscriber: Send + Sync {
    /// A subscription to `shard` from `from`, once it has answered.
    async fn subscribe(
        &self,
        shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<Box<dyn ShardEvents>, KinesisError>;
}

/// The events of one shard subscription.
#[async_trait]
pub(crate) trait ShardEvents: Send {
    /// The next event; `None` when the subscription ended.
    async fn next(&mut self) -> Result<Option<FanOutEvent>, KinesisError>;
}

/// Where a fan-out reader subscribes: Kinesis and the stream consumer.
#[derive(Clone)]
pub(crate) struct FanOut {
    /// Kinesis (SubscribeToShard).
    pub kinesis: Kinesis,
    /// The stream consumer.
    pub consumer: ConsumerArn,
}

#[async_trait]
impl ShardSubscriber for FanOut {
    async fn subscribe(
        &self,
        shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<Box<dyn ShardEvents>, KinesisError> {
        let subscription = self.kinesis.subscribe(&self.consumer, shard, from).await?;
        Ok(Box::new(subscription))
    }
}

#[async_trait]
impl ShardEvents for Subscription {
    async fn next(&mut self) -> Result<Option<FanOutEvent>, KinesisError> {
        Subscription::next(self).await
    }
}

/// What every reader of a subscription shares.
#[derive(Clone)]
pub(crate) struct ReaderContext {
    /// Iterators and GetRecords.
    pub reads: Arc<dyn ShardReads>,
    /// Where to subscribe (enhanced fan-out); `None`: poll.
    pub fan_out: Option<Arc<dyn ShardSubscriber>>,
    /// The subscription.
    pub subscription: Arc<SubscriptionConfig>,
    /// The subscription channel.
    pub deliveries: DeliverySender,
    /// The settlement task.
    pub settlement: SettlementSender,
    /// Metrics.
    pub telemetry: Arc<Telemetry>,
    /// The subscription's status (shard states).
    pub status: Arc<SubscriptionStatus>,
    /// A replay's range: only what lies in it is read, then each shard
    /// ends (see [`range`]). `None` for the service.
    pub range: Option<Arc<range::Range>>,
    /// Waited for before a shard is opened ([`BeforeRead`]).
    pub before_read: Option<Arc<dyn BeforeRead>>,
    /// Applied to each page's records before they are handed out
    /// ([`Decode`]); `None` for the service.
    pub decode: Option<Arc<dyn Decode>>,
    /// The filter in force (see [`filter_feed`]).
    pub filter: filter_feed::FilterFeed,
}

/// How a reader ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReaderExit {
    /// Told to stop (lease lost or shutdown).
    Cancelled,
    /// Read a closed shard to its end.
    ShardEnd,
    /// Read an open shard to its tip, where an open-ended range stops (a
    /// redrive): its place is kept by an ordinary checkpoint.
    AtTip,
}

/// A reader's state between reads: the iterator, the backoff, and its
/// metric handles (registered once).
struct Reading {
    iterator: Option<String>,
    backoff: Backoff,
    behind: Gauge,
    throttles: crate::telemetry::Counter,
    throttle_log: crate::logging::LogGate,
    /// Failed reads other than throttling, at WARN at most once per
    /// [`crate::throttle::LOG_INTERVAL`] (GetRecords is sent once, so each
    /// transient failure reaches the reader).
    failure_log: crate::logging::LogGate,
    kpl: KplCounters,
    pace: pace::Pace,
    reads_with_records: crate::telemetry::Counter,
    reads_empty: crate::telemetry::Counter,
    /// Records handed out (each KPL user record counts).
    records: crate::telemetry::Counter,
}

/// What de-aggregation found on a shard, counted (see [`crate::kpl`]).
struct KplCounters {
    user_records: crate::telemetry::Counter,
    corrupt: crate::telemetry::Counter,
    hash_key_mismatch: crate::telemetry::Counter,
    log: crate::logging::LogGate,
}

impl KplCounters {
    fn new(ctx: &ReaderContext, shard: &ShardId) -> Self {
        let labels = [
            ("subscription", ctx.subscription.name.as_str()),
            ("shard_id", shard.as_str()),
        ];
        let t = &ctx.telemetry;
        Self {
            user_records: t.counter(
                "shardlane_kpl_user_records_total",
                "User records taken out of KPL aggregates, each delivered as a record of its own.",
                &labels,
            ),
            corrupt: t.counter(
                "shardlane_kpl_corrupt_total",
                "Records with the KPL magic bytes that are not valid aggregates (bad MD5, undecodable), delivered as they are.",
                &labels,
            ),
            hash_key_mismatch: t.counter(
                "shardlane_kpl_hash_key_mismatch_total",
                "KPL user records whose hash key lies outside the shard they were read from (KCL drops them; shardlane delivers them).",
                &labels,
            ),
            log: crate::logging::LogGate::every(crate::throttle::LOG_INTERVAL),
        }
    }

    fn count(&mut self, found: &unpack::Found, subscription: &str, shard: &ShardId) {
        self.user_records.add(found.user_records);
        self.corrupt.add(found.corrupt);
        self.hash_key_mismatch.add(found.hash_key_mismatch);
        if (found.corrupt > 0 || found.hash_key_mismatch > 0)
            && let Some(suppressed) = self.log.note(std::time::Instant::now())
        {
            tracing::warn!(subscription, shard_id = %shard, corrupt = found.corrupt, hash_key_mismatch = found.hash_key_mismatch, suppressed, "KPL records delivered as they are (corrupt aggregates) or outside their shard's hash keys; see shardlane_kpl_* (logged at most once every 10 s)");
        }
    }
}

impl Reading {
    fn new(ctx: &ReaderContext, shard: &ShardId) -> Self {
        let sub = ctx.subscription.name.as_str();
        Self {
            iterator: None,
            backoff: Backoff::new(ERROR_BACKOFF_INITIAL, ERROR_BACKOFF_MAX),
            behind: ctx.telemetry.gauge(
                "shardlane_millis_behind_latest",
                "How far behind the shard's tip the last GetRecords was, in milliseconds.",
                &[("subscription", sub), ("shard_id", shard.as_str())],
            ),
            throttles: crate::throttle::counter(&ctx.telemetry, sub, "kinesis", shard.as_str()),
            throttle_log: crate::logging::LogGate::every(crate::throttle::LOG_INTERVAL),
            failure_log: crate::logging::LogGate::every(crate::throttle::LOG_INTERVAL),
            kpl: KplCounters::new(ctx, shard),
            pace: pace::Pace::new(pace::Budget {
                max_reads_per_second: ctx.subscription.max_reads_per_second,
                poll_idle: ctx.subscription.poll_idle,
                poll_idle_max: ctx.subscription.poll_idle_max,
            }),
            reads_with_records: reads(ctx, shard, "records"),
            reads_empty: reads(ctx, shard, "empty"),
            records: {
                let records = ctx.telemetry.counter(
                    "shardlane_records_read_total",
                    "Records read from the shard and handed to dispatch (each KPL user record counts).",
                    &[("subscription", sub), ("shard_id", shard.as_str())],
                );
                ctx.status.count_records(shard, records.clone());
                records
            },
        }
    }
}

/// Whether the filter in force lets `record` in.
fn admits(active: &filter_feed::ActiveFilter, record: &Record) -> bool {
    active.filter.as_ref().is_none_or(|filter| {
        filter.admits(&crate::filter::RecordView {
            partition_key: record.partition_key.as_str(),
            sequence_number: record.sequence.as_str(),
            approximate_arrival_ms: record.arrival_ms,
            data: &record.data,
        })
    })
}

/// The counter of a shard's GetRecords calls (or fan-out events) that
/// brought records, or none (`result`).
fn reads(ctx: &ReaderContext, shard: &ShardId, result: &str) -> crate::telemetry::Counter {
    let (name, help) = if ctx.fan_out.is_some() {
        (
            "shardlane_fan_out_events_total",
            "SubscribeToShard events received, per shard, by whether they brought records (`records`) or none (`empty`).",
        )
    } else {
        (
            "shardlane_get_records_total",
            "GetRecords calls that succeeded, per shard, by whether they returned records (`records`) or none (`empty`).",
        )
    };
    ctx.telemetry.counter(
        name,
        help,
        &[
            ("subscription", ctx.subscription.name.as_str()),
            ("shard_id", shard.as_str()),
            ("result", result),
        ],
    )
}

/// One shard reader (see the module docs).
pub(crate) struct ShardReader {
    ctx: ReaderContext,
    shard: ShardId,
    session: SessionId,
    next_offset: u64,
    /// Where to (re)open the shard: after the last record handed to the
    /// channel, once there is one (an expired iterator reopens there).
    position: ReadFrom,
    /// Opened inside a KPL aggregate: its user records up to here were
    /// handed out before (or settled) and are skipped.
    skip_through: Option<Position>,
    /// The shard's hash keys, when known (KPL user records are checked).
    hash_keys: Option<HashKeyRange>,
    cancel: CancellationToken,
    /// Until when the lease is surely ours (module docs).
    valid_until: watch::Receiver<Instant>,
    /// The shard's windows, for a subscription with `window`.
    windowing: Option<windowing::Windowing>,
}

impl ShardReader {
    /// A reader for `shard` in reader session `session`, opening it
    /// `from` (after its checkpoint, or at the subscription's start
    /// position, or at the beginning of a child of a split or merge),
    /// acting on the lease only while `valid_until` lies ahead.
    pub(crate) fn new(
        ctx: ReaderContext,
        shard: ShardId,
        session: SessionId,
        from: ReadFrom,
        hash_keys: Option<HashKeyRange>,
        cancel: CancellationToken,
        valid_until: watch::Receiver<Instant>,
    ) -> Self {
        let windowing = ctx
            .subscription
            .window
            .map(|spec| windowing::Windowing::new(&ctx, spec));
        Self {
            windowing,
            ctx,
            shard,
            session,
            next_offset: 0,
            position: from,
            skip_through: None,
            hash_keys,
            cancel,
            valid_until,
        }
    }

    /// Runs until cancelled or the shard ends. A cancelled reader tells
    /// settlement how far it got, so the shard's final checkpoint follows
    /// once what it handed out has settled.
    pub(crate) async fn run(mut self) -> ReaderExit {
        let exit = self.read().await;
        self.ctx
            .status
            .reader_stopped(&self.shard, exit == ReaderExit::ShardEnd);
        self.ctx.telemetry.forget_series(
            "shardlane_millis_behind_latest",
            &[
                ("subscription", self.ctx.subscription.name.as_str()),
                ("shard_id", self.shard.as_str()),
            ],
        );
        if exit != ReaderExit::ShardEnd {
            let close = SettlementMsg::Close {
                shard: self.shard.clone(),
                session: self.session,
                delivered: self.next_offset,
            };
            // Not cancellable: settlement always drains its queue, and the
            // keeper waits for this reader.
            let _ = self.ctx.settlement.send(close).await;
        }
        exit
    }

    async fn read(&mut self) -> ReaderExit {
        if let Some(hook) = self.ctx.before_read.clone() {
            tokio::select! {
                _ = self.cancel.cancelled() => return ReaderExit::Cancelled,
                () = hook.before_read(&self.shard) => {}
            }
        }
        let open = SettlementMsg::Open {
            shard: self.shard.clone(),
            session: self.session,
        };
        if !self.send_settlement(open).await {
            return ReaderExit::Cancelled;
        }
        if let Some(range) = &self.ctx.range {
            match range.first_read(&self.shard, self.position.clone()) {
                Some(from) => self.position = from,
                None => return self.end().await,
            }
        }
        let mut reading = Reading::new(&self.ctx, &self.shard);
        if let Some(fan_out) = self.ctx.fan_out.clone() {
            return self.subscribe_loop(&*fan_out, &mut reading).await;
        }
        loop {
            if let Some(next) = reading.pace.next_read()
                && next > Instant::now()
            {
                tokio::select! {
                    _ = self.cancel.cancelled() => return ReaderExit::Cancelled,
                    _ = tokio::time::sleep_until(next) => {}
                }
            }
            if self.lease_valid().await.is_none() {
                return ReaderExit::Cancelled;
            }
            let step = match reading.iterator.take() {
                Some(current) => self.read_once(&mut reading, current).await,
                None => self.reopen(&mut reading).await,
            };
            if let Err(exit) = step {
                return exit;
            }
        }
    }

    /// Opens an iterator at the reader's position into `reading`, or backs
    /// off after a failure.
    async fn reopen(&mut self, reading: &mut Reading) -> Result<(), ReaderExit> {
        match self.open_iterator().await {
            None => Err(ReaderExit::Cancelled),
            Some(Ok(it)) => {
                // The call may have spanned a pause.
                if self.lease_valid().await.is_none() {
                    return Err(ReaderExit::Cancelled);
                }
                reading.backoff.reset();
                self.opened_at_position();
                tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, position = ?self.position, "shard iterator opened");
                self.ctx.status.reader_positioned(&self.shard);
                reading.iterator = Some(it);
                Ok(())
            }
            Some(Err(e)) => {
                tracing::warn!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, error = %e, "cannot open shard iterator; retrying");
                self.sleep(reading.backoff.next_wait()).await
            }
        }
    }

    /// One GetRecords at `current`: hands out what it returned and keeps
    /// the next iterator, or handles the failure.
    async fn read_once(
        &mut self,
        reading: &mut Reading,
        current: String,
    ) -> Result<(), ReaderExit> {
        let span = spans::receive(&self.ctx.subscription, self.shard.as_str());
        reading.pace.sent(Instant::now());
        let read = self
            .ctx
            .reads
            .get_records(&current, self.ctx.subscription.read_limit)
            .instrument(span.clone());
        let page = tokio::select! {
            _ = self.cancel.cancelled() => return Err(ReaderExit::Cancelled),
            r = read => r,
        };
        let mut page = match page {
            Ok(page) => page,
            Err(e) => return self.read_failed(reading, current, e).await,
        };
        // A range ends at its end, or at the tip (see [`range`]).
        let (past_end, at_tip) = match &self.ctx.range {
            None => (false, false),
            Some(range) => {
                let past = range.cut(&self.shard, &mut page.records);
                range.note(&self.shard, &page.records);
                (
                    past,
                    range::Range::at_tip(page.records.len(), page.millis_behind),
                )
            }
        };
        span.record("messaging.batch.message_count", page.records.len());
        reading.backoff.reset();
        let read = if page.records.is_empty() {
            reading.reads_empty.inc();
            pace::Read::Empty
        } else {
            reading.reads_with_records.inc();
            pace::Read::Records
        };
        reading.pace.ended(read, Instant::now());
        if let Some(behind) = page.millis_behind {
            reading.behind.set(behind);
            self.ctx.status.lag(&self.shard, behind);
        }
        let count = page.records.len();
        if count > 0 && !self.hand_out(page.records, reading).await {
            return Err(ReaderExit::Cancelled);
        }
        if page.millis_behind == Some(0) && !self.quiet_at_tip().await {
            return Err(ReaderExit::Cancelled);
        }
        match page.next_iterator {
            Some(next) if !past_end && !at_tip => {
                reading.iterator = Some(next);
                Ok(())
            }
            // An open-ended range keeps an open shard's place at its tip:
            // stopping, the reader tells settlement how far it got, and the
            // final checkpoint is there (see [`range`]).
            Some(_)
                if !past_end
                    && self
                        .ctx
                        .range
                        .as_ref()
                        .is_some_and(|r| r.keeps_place_at_tip()) =>
            {
                if let Some(range) = &self.ctx.range {
                    range.ended(&self.shard);
                }
                tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, "shard read to its tip");
                Err(ReaderExit::AtTip)
            }
            _ => Err(self.end().await),
        }
    }

    /// The shard (or a replay's part of it) is read to its end: settlement
    /// checkpoints `SHARD_END` once what was handed out settled.
    async fn end(&mut self) -> ReaderExit {
        tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, "shard read to its end");
        if let Some(range) = &self.ctx.range {
            range.ended(&self.shard);
        }
        // A parent's windows close before its end is reported: its
        // children start only after they committed (see [`windowing`]).
        if !self.finish_windows().await {
            return ReaderExit::Cancelled;
        }
        let end = SettlementMsg::End {
            shard: self.shard.clone(),
            session: self.session,
        };
        if self.send_settlement(end).await {
            ReaderExit::ShardEnd
        } else {
            ReaderExit::Cancelled
        }
    }

    /// After a failed GetRecords at `current`: reopen (expired), stop
    /// (malformed), or back off keeping the iterator (throttled, failed).
    async fn read_failed(
        &mut self,
        reading: &mut Reading,
        current: String,
        error: KinesisError,
    ) -> Result<(), ReaderExit> {
        let read = match error {
            KinesisError::Throttled(_) => pace::Read::Throttled,
            _ => pace::Read::Failed,
        };
        reading.pace.ended(read, Instant::now());
        match error {
            KinesisError::ExpiredIterator => {
                tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, "shard iterator expired; reopening after the last record read");
                Ok(())
            }
            KinesisError::Malformed(e) => {
                // Kinesis never sends one; skipping it would lose data
                // silently, so stop this session loudly instead.
                tracing::error!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, error = %e, "bad sequence number from Kinesis; reader stops");
                Err(ReaderExit::Cancelled)
            }
            e => {
                // Keep the iterator: it stays valid for five minutes.
                reading.iterator = Some(current);
                let wait = reading.backoff.next_wait();
                if let KinesisError::Throttled(_) = e {
                    reading.throttles.inc();
                    if let Some(suppressed) = reading.throttle_log.note(std::time::Instant::now()) {
                        tracing::warn!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, suppressed, ?wait, reads_per_second = reading.pace.rate(), "read throttled; backing off and reading this shard less often (logged at most once every 10 s; suppressed: since the last line)");
                    }
                } else if let Some(suppressed) = reading.failure_log.note(std::time::Instant::now())
                {
                    tracing::warn!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, error = %e, suppressed, ?wait, "GetRecords failed; retrying (logged at most once every 10 s; suppressed: since the last line)");
                }
                self.sleep(wait).await
            }
        }
    }

    /// The shard was (re)opened at the reader's position: inside a KPL
    /// aggregate that is *at* its sequence number, so the user records up
    /// to the position are skipped until the page reaches past them.
    fn opened_at_position(&mut self) {
        self.skip_through = match &self.position {
            ReadFrom::After(p) if p.sub().is_some() => Some(p.clone()),
            _ => None,
        };
    }

    /// Opens a shard iterator at the reader's position; `None` when
    /// cancelled meanwhile.
    async fn open_iterator(&self) -> Option<Result<String, KinesisError>> {
        let open = self.ctx.reads.open_iterator(
            &self.ctx.subscription.stream,
            &self.shard,
            &self.position,
        );
        tokio::select! {
            _ = self.cancel.cancelled() => None,
            r = open => Some(r),
        }
    }

    /// Unpacks KPL aggregates (and decodes, for a redrive) and counts
    /// them. `None` when cancelled on the way.
    async fn unpacked(
        &mut self,
        page: Vec<Fetched>,
        reading: &mut Reading,
    ) -> Option<Vec<(Record, Position)>> {
        let source = unpack::Source {
            stream: &self.ctx.subscription.stream,
            shard: &self.shard,
            hash_keys: self.hash_keys,
        };
        let mut found = unpack::Found::default();
        // The page reaches the record the reader reopened inside (it comes
        // first after an AT_SEQUENCE_NUMBER open): once unpacked, whatever
        // it skipped is behind, even if nothing of the page is left.
        let reached = self
            .skip_through
            .as_ref()
            .is_some_and(|s| page.iter().any(|f| &f.sequence >= s.sequence()));
        let mut records = source.unpack(page, self.skip_through.as_ref(), &mut found);
        if let Some(decode) = &self.ctx.decode {
            records = decode.decode(records, &self.cancel).await?;
        }
        if reached {
            self.skip_through = None;
        }
        reading
            .kpl
            .count(&found, self.ctx.subscription.name.as_str(), &self.shard);
        Some(records)
    }

    /// Unpacks a page, tracks its records with settlement, then sends them
    /// into the channel. False when cancelled on the way.
    async fn hand_out(&mut self, page: Vec<Fetched>, reading: &mut Reading) -> bool {
        let Some(records) = self.unpacked(page, reading).await else {
            return false;
        };
        if records.is_empty() {
            return true;
        }
        reading.records.add(records.len() as u64);
        // With windows, each record is tracked on its own: a hold may go
        // between two (see [`windowing`]).
        let windowed = self.windowing.is_some();
        if !windowed
            && !self
                .track(records.iter().map(|(_, p)| p.clone()).collect())
                .await
        {
            return false;
        }
        let mut filtered = Vec::new();
        // One filter per page (a swap takes effect at the next).
        let active = self.ctx.filter.borrow().clone();
        for (mut record, position) in records {
            let admitted = admits(&active, &record);
            let placed = !admitted || self.window_record(&mut record).await;
            if !placed || (windowed && !self.track(vec![position.clone()]).await) {
                self.settle_filtered(filtered, &active).await;
                return false;
            }
            let ticket = Ticket {
                shard: self.shard.clone(),
                session: self.session,
                offset: self.next_offset,
            };
            if !admitted {
                // Settled without a call: tracked above, settled below
                // (before anything this session reports later, `Close`
                // included, so a drain counts it as settled).
                filtered.push(ticket);
                self.next_offset += 1;
                self.position = ReadFrom::After(position);
                continue;
            }
            let delivery = Delivery {
                record: Arc::new(record),
                ticket,
            };
            if !self.deliver(delivery.into()).await {
                // Not sent: `next_offset` (what `Close` reports as handed
                // out) stays below it, so the drain does not wait for it.
                self.settle_filtered(filtered, &active).await;
                return false;
            }
            self.next_offset += 1;
            self.handed_out(&position);
            self.position = ReadFrom::After(position);
        }
        self.settle_filtered(filtered, &active).await
    }

    /// Tracks records with settlement, in shard order. False when
    /// cancelled.
    async fn track(&self, positions: Vec<Position>) -> bool {
        let track = SettlementMsg::Track {
            shard: self.shard.clone(),
            session: self.session,
            positions,
        };
        self.send_settlement(track).await
    }

    /// Settles the records the filter kept out, and counts them. False when
    /// settlement is gone.
    async fn settle_filtered(
        &mut self,
        filtered: Vec<Ticket>,
        active: &filter_feed::ActiveFilter,
    ) -> bool {
        if filtered.is_empty() {
            return true;
        }
        active.filtered.add(filtered.len() as u64);
        // Not cancellable, as `Close` (which counts these as handed out):
        // settlement always drains its queue, and a drain must not wait
        // for records nobody will settle.
        self.ctx
            .settlement
            .send(SettlementMsg::SettleMany(filtered))
            .await
            .is_ok()
    }

    /// Puts one delivery into the channel while the lease is valid: a send
    /// waiting on a full channel is withdrawn at the validity deadline and
    /// resumes only after a renewal. False when cancelled, the lease is gone
    /// or the channel closed.
    async fn deliver(&mut self, mut delivery: Work) -> bool {
        loop {
            let Some(until) = self.lease_valid().await else {
                return false;
            };
            delivery = match self.ctx.deliveries.try_send(delivery) {
                Ok(()) => return true,
                Err(async_channel::TrySendError::Closed(_)) => return false,
                Err(async_channel::TrySendError::Full(delivery)) => delivery,
            };
            // A pending send that is dropped has delivered nothing. Biased:
            // when the deadline and the send are ready at once (a resumed
            // pause), the deadline wins.
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return false,
                _ = tokio::time::sleep_until(until) => {}
                r = self.ctx.deliveries.send(delivery.clone()) => return r.is_ok(),
            }
        }
    }

    /// Waits until the lease is surely ours and returns until when; `None`
    /// when cancelled or the keeper let go of the lease.
    async fn lease_valid(&mut self) -> Option<Instant> {
        let mut waited = false;
        loop {
            if self.cancel.is_cancelled() {
                return None;
            }
            let until = *self.valid_until.borrow_and_update();
            if Instant::now() < until {
                if waited {
                    tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, "lease renewed; reader goes on");
                }
                return Some(until);
            }
            if !waited {
                tracing::warn!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, "lease not renewed within its duration; reader waits for the keeper");
                waited = true;
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                changed = self.valid_until.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    async fn send_settlement(&self, msg: SettlementMsg) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            r = self.ctx.settlement.send(msg) => r.is_ok(),
        }
    }

    /// Sleeps; the reader ends when cancelled meanwhile.
    async fn sleep(&self, wait: Duration) -> Result<(), ReaderExit> {
        tokio::select! {
            _ = self.cancel.cancelled() => Err(ReaderExit::Cancelled),
            _ = tokio::time::sleep(wait) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
