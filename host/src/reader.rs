//! The shard reader: one task per leased shard, from its checkpoint (or the
//! configured start) into the subscription channel.
//!
//! Loop: GetRecords with the current iterator; tell settlement about the
//! records (so the checkpoint cannot pass them), then send them one by one
//! into the subscription channel, waiting while it is full. A read that
//! returned records is followed at once by the next; an empty one waits
//! `poll_idle`.
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
//! The lease keeper owns this task and cancels it when the lease is lost or
//! the service stops. Every wait (`send`, sleep, AWS call) is cancellable,
//! so a reader stops handing out records as soon as it is told to.
//!
//! Lease validity: the keeper also publishes until when the lease is surely
//! still ours (see [`crate::lease::keeper`]). Past that deadline the reader
//! opens no iterator and puts nothing into the channel, not even a record a
//! pending `send` was about to deliver: it waits for a renewal or for the
//! keeper to stop it. An instance that was paused therefore cannot act on
//! a lease that changed hands meanwhile, whichever of its tasks runs first
//! when it resumes.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ShardIteratorType;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::channel::{Delivery, DeliverySender, Record};
use crate::config::{StartPosition, SubscriptionConfig};
use crate::dispatch::spans;
use crate::ids::{PartitionKey, SequenceNumber, ShardId};
use crate::settlement::{Checkpoint, SessionId, SettlementMsg, SettlementSender, Ticket};
use crate::telemetry::{Gauge, SubscriptionStatus, Telemetry};

/// First wait after a throttled or failed call.
const ERROR_BACKOFF_INITIAL: Duration = Duration::from_millis(200);
/// Longest wait between attempts of a failing call.
const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// What every reader of a subscription shares.
#[derive(Clone)]
pub struct ReaderContext {
    /// Kinesis.
    pub client: Client,
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
}

/// How a reader ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderExit {
    /// Told to stop (lease lost or shutdown).
    Cancelled,
    /// Read a closed shard to its end.
    ShardEnd,
}

/// Where to open a shard.
#[derive(Debug, Clone)]
enum Position {
    After(SequenceNumber),
    Start(StartPosition),
}

/// One shard reader (see the module docs).
pub struct ShardReader {
    ctx: ReaderContext,
    shard: ShardId,
    session: SessionId,
    next_offset: u64,
    /// The last record handed to the channel: an expired iterator reopens
    /// after it.
    position: Position,
    cancel: CancellationToken,
    /// Until when the lease is surely ours (module docs).
    valid_until: watch::Receiver<Instant>,
}

impl ShardReader {
    /// A reader for `shard` in reader session `session`, starting after
    /// `checkpoint`, or else at `start` (the subscription's start position,
    /// or the shard's beginning for a child of a split or merge), acting on
    /// the lease only while `valid_until` lies ahead.
    pub fn new(
        ctx: ReaderContext,
        shard: ShardId,
        session: SessionId,
        checkpoint: Option<Checkpoint>,
        start: StartPosition,
        cancel: CancellationToken,
        valid_until: watch::Receiver<Instant>,
    ) -> Self {
        let position = match checkpoint {
            Some(Checkpoint::Sequence(seq)) => Position::After(seq),
            // The keeper never starts a reader on an ended shard; if it did,
            // the shard's first GetRecords reports its end again.
            Some(Checkpoint::ShardEnd) | None => Position::Start(start),
        };
        Self {
            ctx,
            shard,
            session,
            next_offset: 0,
            position,
            cancel,
            valid_until,
        }
    }

    /// Runs until cancelled or the shard ends. A cancelled reader tells
    /// settlement how far it got, so the shard's final checkpoint follows
    /// once what it handed out has settled.
    pub async fn run(mut self) -> ReaderExit {
        self.ctx
            .status
            .shard(self.shard.as_str(), |s| s.state = "opening".into());
        let exit = self.read().await;
        let state = match exit {
            ReaderExit::Cancelled => "stopped",
            ReaderExit::ShardEnd => "ended",
        };
        self.ctx.status.shard(self.shard.as_str(), |s| {
            s.state = state.into();
            s.behind_ms = None;
        });
        self.ctx.telemetry.forget_series(
            "shardlane_millis_behind_latest",
            &[
                ("subscription", self.ctx.subscription.name.as_str()),
                ("shard_id", self.shard.as_str()),
            ],
        );
        if exit == ReaderExit::Cancelled {
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
        let open = SettlementMsg::Open {
            shard: self.shard.clone(),
            session: self.session,
        };
        if !self.send_settlement(open).await {
            return ReaderExit::Cancelled;
        }
        let mut backoff = Backoff::new(ERROR_BACKOFF_INITIAL, ERROR_BACKOFF_MAX);
        let mut iterator: Option<String> = None;
        let behind_gauge: Gauge = self.ctx.telemetry.gauge(
            "shardlane_millis_behind_latest",
            "How far behind the shard's tip the last GetRecords was, in milliseconds.",
            &[
                ("subscription", self.ctx.subscription.name.as_str()),
                ("shard_id", self.shard.as_str()),
            ],
        );
        let throttles = crate::throttle::counter(
            &self.ctx.telemetry,
            self.ctx.subscription.name.as_str(),
            "kinesis",
            self.shard.as_str(),
        );
        let mut throttle_log = crate::logging::LogGate::every(crate::throttle::LOG_INTERVAL);
        loop {
            if self.lease_valid().await.is_none() {
                return ReaderExit::Cancelled;
            }
            let current = match iterator.take() {
                Some(it) => it,
                None => match self.open_iterator().await {
                    Ok(it) => {
                        // The call may have spanned a pause.
                        if self.lease_valid().await.is_none() {
                            return ReaderExit::Cancelled;
                        }
                        backoff.reset();
                        tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, position = ?self.position, "shard iterator opened");
                        self.ctx
                            .status
                            .shard(self.shard.as_str(), |s| s.state = "reading".into());
                        it
                    }
                    Err(e) => {
                        tracing::warn!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, error = %e, "cannot open shard iterator; retrying");
                        if !self.sleep(backoff.next_wait()).await {
                            return ReaderExit::Cancelled;
                        }
                        continue;
                    }
                },
            };
            let span = spans::receive(&self.ctx.subscription, self.shard.as_str());
            let response = tokio::select! {
                _ = self.cancel.cancelled() => return ReaderExit::Cancelled,
                r = self.ctx.client.get_records().shard_iterator(&current).limit(self.ctx.subscription.read_limit).send().instrument(span.clone()) => r,
            };
            if let Ok(output) = &response {
                span.record("messaging.batch.message_count", output.records().len());
            }
            match response {
                Ok(output) => {
                    backoff.reset();
                    if let Some(behind) = output.millis_behind_latest() {
                        let behind = u64::try_from(behind).unwrap_or(0);
                        behind_gauge.set(behind);
                        self.ctx
                            .status
                            .shard(self.shard.as_str(), |s| s.behind_ms = Some(behind));
                    }
                    let records = output.records();
                    let count = records.len();
                    if count > 0 && !self.hand_out(records).await {
                        return ReaderExit::Cancelled;
                    }
                    match output.next_shard_iterator() {
                        Some(next) => iterator = Some(next.to_owned()),
                        None => {
                            tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, "shard read to its end");
                            let end = SettlementMsg::End {
                                shard: self.shard.clone(),
                                session: self.session,
                            };
                            return if self.send_settlement(end).await {
                                ReaderExit::ShardEnd
                            } else {
                                ReaderExit::Cancelled
                            };
                        }
                    }
                    if count == 0 && !self.sleep(self.ctx.subscription.poll_idle).await {
                        return ReaderExit::Cancelled;
                    }
                }
                Err(e) => {
                    let service = e.as_service_error();
                    if service.is_some_and(|s| s.is_expired_iterator_exception()) {
                        tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, "shard iterator expired; reopening after the last record read");
                        continue;
                    }
                    // Keep the iterator: it stays valid for five minutes.
                    iterator = Some(current);
                    let wait = backoff.next_wait();
                    if service.is_some_and(|s| {
                        s.is_provisioned_throughput_exceeded_exception()
                            || s.is_kms_throttling_exception()
                    }) {
                        throttles.inc();
                        if let Some(suppressed) = throttle_log.note(std::time::Instant::now()) {
                            tracing::warn!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, suppressed, ?wait, "read throttled; backing off (logged at most once every 10 s; suppressed: since the last line)");
                        }
                    } else {
                        tracing::warn!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, error = %aws_sdk_kinesis::error::DisplayErrorContext(&e), ?wait, "GetRecords failed; retrying");
                    }
                    if !self.sleep(wait).await {
                        return ReaderExit::Cancelled;
                    }
                }
            }
        }
    }

    async fn open_iterator(&self) -> anyhow::Result<String> {
        let request = self
            .ctx
            .client
            .get_shard_iterator()
            .stream_name(self.ctx.subscription.stream.as_str())
            .shard_id(self.shard.as_str());
        let request = match &self.position {
            Position::After(seq) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq.as_str()),
            Position::Start(StartPosition::Latest) => {
                request.shard_iterator_type(ShardIteratorType::Latest)
            }
            Position::Start(StartPosition::TrimHorizon) => {
                request.shard_iterator_type(ShardIteratorType::TrimHorizon)
            }
            Position::Start(StartPosition::AtTimestamp(at)) => request
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(aws_smithy_types::DateTime::from(*at)),
        };
        let output = tokio::select! {
            _ = self.cancel.cancelled() => anyhow::bail!("cancelled"),
            r = request.send() => r.map_err(|e| anyhow::anyhow!("{}", aws_sdk_kinesis::error::DisplayErrorContext(&e)))?,
        };
        output
            .shard_iterator()
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("GetShardIterator returned no iterator"))
    }

    /// Tracks the records with settlement, then sends them into the
    /// channel. False when cancelled on the way.
    async fn hand_out(&mut self, records: &[aws_sdk_kinesis::types::Record]) -> bool {
        let mut parsed = Vec::with_capacity(records.len());
        for r in records {
            let sequence = match SequenceNumber::parse(r.sequence_number()) {
                Ok(seq) => seq,
                Err(e) => {
                    // Kinesis never sends one; skipping it would lose data
                    // silently, so stop this session loudly instead.
                    tracing::error!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, error = %e, "bad sequence number from Kinesis; reader stops");
                    self.cancel.cancel();
                    return false;
                }
            };
            parsed.push(Arc::new(Record {
                stream: self.ctx.subscription.stream.clone(),
                shard: self.shard.clone(),
                partition_key: PartitionKey::new(r.partition_key().unwrap_or_default()),
                sequence,
                arrival_ms: r
                    .approximate_arrival_timestamp()
                    .and_then(|t| t.to_millis().ok())
                    .and_then(|ms| u64::try_from(ms).ok())
                    .unwrap_or(0),
                data: r.data().as_ref().to_vec(),
            }));
        }
        let track = SettlementMsg::Track {
            shard: self.shard.clone(),
            session: self.session,
            sequences: parsed.iter().map(|r| r.sequence.clone()).collect(),
        };
        if !self.send_settlement(track).await {
            return false;
        }
        for record in parsed {
            let ticket = Ticket {
                shard: self.shard.clone(),
                session: self.session,
                offset: self.next_offset,
            };
            self.next_offset += 1;
            let sequence = record.sequence.clone();
            if !self.deliver(Delivery { record, ticket }).await {
                return false;
            }
            self.position = Position::After(sequence);
        }
        true
    }

    /// Puts one delivery into the channel while the lease is valid: a send
    /// waiting on a full channel is withdrawn at the validity deadline and
    /// resumes only after a renewal. False when cancelled, the lease is gone
    /// or the channel closed.
    async fn deliver(&mut self, mut delivery: Delivery) -> bool {
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

    /// Sleeps; false when cancelled meanwhile.
    async fn sleep(&self, wait: Duration) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }
}
