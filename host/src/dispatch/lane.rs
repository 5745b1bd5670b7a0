//! One lane: one handler instance, one record or batch at a time, retries in
//! place, giving up by the failure policy (see [`super`] and
//! [`crate::failure`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::batch::BatchCollector;
use super::{Handler, HandlerFactory, spans};
use crate::backoff::Backoff;
use crate::channel::{Delivery, DeliveryReceiver, Record};
use crate::config::{BatchConfig, SubscriptionConfig};
use crate::failure::{self, DeadLetters, Next};
use crate::ids::LaneId;
use crate::logging::{MAX_GUEST_TEXT, cap};
use crate::plugin::{CallError, Outcome, PluginDigest};
use crate::settlement::{SettlementMsg, SettlementSender, Ticket};
use crate::telemetry::{
    BATCH_BUCKETS, Counter, DURATION_BUCKETS, Histogram, SubscriptionStatus, Telemetry,
};

/// A lane's metric handles, registered once.
pub(super) struct LaneMetrics {
    acked: Counter,
    rejected: Counter,
    retried: Counter,
    dead_lettered: Counter,
    skipped: Counter,
    blocked: Counter,
    traps: Counter,
    timeouts: Counter,
    guest_errors: Counter,
    recycles: Counter,
    calls: Counter,
    duration: Histogram,
    batch_size: Histogram,
}

impl LaneMetrics {
    pub(super) fn new(t: &Telemetry, status: &SubscriptionStatus, sub: &str, lane: u32) -> Self {
        let outcome = |o: &str| {
            t.counter(
                "shardlane_records_total",
                "Records handled, by the handler's outcome (retry counts each attempt).",
                &[("subscription", sub), ("outcome", o)],
            )
        };
        let failure = |k: &str| {
            t.counter(
                "shardlane_call_failures_total",
                "Handler calls that failed without an outcome, by kind.",
                &[("subscription", sub), ("kind", k)],
            )
        };
        let lane_label = lane.to_string();
        // One counter serves /metrics and the status page's lane load.
        let calls = t.counter(
            "shardlane_lane_calls_total",
            "Handler calls per lane.",
            &[("subscription", sub), ("lane", &lane_label)],
        );
        status
            .lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lane, calls.clone());
        Self {
            acked: outcome("ack"),
            rejected: outcome("reject"),
            retried: outcome("retry"),
            dead_lettered: t.counter(
                "shardlane_dead_lettered_total",
                "Records put to the dead-letter stream.",
                &[("subscription", sub)],
            ),
            skipped: t.counter(
                "shardlane_records_skipped_total",
                "Records given up on and skipped.",
                &[("subscription", sub)],
            ),
            blocked: t.counter(
                "shardlane_records_blocked_total",
                "Attempts of records past their attempts or age that on_failure = block keeps retrying.",
                &[("subscription", sub)],
            ),
            traps: failure("trap"),
            timeouts: failure("timeout"),
            guest_errors: failure("guest_error"),
            recycles: t.counter(
                "shardlane_instance_recycles_total",
                "Instances dropped after a trap or timeout and made afresh.",
                &[("subscription", sub)],
            ),
            calls,
            duration: t.histogram(
                "shardlane_handler_duration_seconds",
                "Handler call time, per call (a batch is one call).",
                &[("subscription", sub)],
                DURATION_BUCKETS,
            ),
            batch_size: t.histogram(
                "shardlane_batch_size",
                "Records per handle-batch call.",
                &[("subscription", sub)],
                BATCH_BUCKETS,
            ),
        }
    }
}

/// First and longest wait between dead-letter puts that fail.
const DEAD_LETTER_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(10));

/// A blocked record is logged at its first blocked attempt and every this
/// many after.
const BLOCKED_LOG_EVERY: u32 = 10;

pub(super) struct Lane<F: HandlerFactory> {
    id: LaneId,
    subscription: Arc<SubscriptionConfig>,
    factory: Arc<F>,
    handler: Option<F::Handler>,
    settlement: SettlementSender,
    dead_letters: Option<DeadLetters>,
    metrics: LaneMetrics,
    /// The factory's plugin generation the instance was made from.
    generation: u64,
}

/// `hard_stop` fired: the lane stops where it is.
struct Stopped;

/// The last failure of a record given up on: why, after how many
/// attempts, and on which plugin version (for the dead-letter envelope).
struct LastFailure<'a> {
    reason: &'a str,
    attempts: u32,
    version: Option<PluginDigest>,
}

/// A record inside a batch, with its own attempt count.
struct Item {
    record: Arc<Record>,
    ticket: Ticket,
    attempt: u32,
}

impl<F: HandlerFactory> Lane<F> {
    pub(super) fn new(
        id: LaneId,
        subscription: Arc<SubscriptionConfig>,
        factory: Arc<F>,
        settlement: SettlementSender,
        dead_letters: Option<DeadLetters>,
        metrics: LaneMetrics,
    ) -> Self {
        Self {
            id,
            subscription,
            factory,
            handler: None,
            settlement,
            dead_letters,
            metrics,
            generation: 0,
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(
            self.subscription.retry_backoff_initial,
            self.subscription.retry_backoff_max,
        )
    }

    /// Runs until `inbox` is closed and drained, or `hard_stop`.
    pub(super) async fn run(self, inbox: DeliveryReceiver, hard_stop: CancellationToken) {
        match self.subscription.batch {
            None => self.run_records(inbox, hard_stop).await,
            Some(batch) => self.run_batches(inbox, hard_stop, batch).await,
        }
    }

    async fn run_records(mut self, inbox: DeliveryReceiver, hard_stop: CancellationToken) {
        loop {
            let delivery = tokio::select! {
                biased;
                _ = hard_stop.cancelled() => return,
                d = inbox.recv() => match d {
                    Ok(d) => d,
                    Err(_) => return,
                },
            };
            if !self.deliver(delivery, &hard_stop).await {
                return;
            }
        }
    }

    async fn run_batches(
        mut self,
        inbox: DeliveryReceiver,
        hard_stop: CancellationToken,
        batch: BatchConfig,
    ) {
        let mut collector = BatchCollector::new(batch.size, batch.max_bytes, batch.window);
        loop {
            let deadline = collector.deadline();
            let batch = tokio::select! {
                biased;
                _ = hard_stop.cancelled() => return,
                _ = sleep_until(deadline), if deadline.is_some() => collector.flush(),
                d = inbox.recv() => match d {
                    Ok(d) => {
                        let bytes = lowered_bytes(&d.record);
                        collector.push(d, bytes, Instant::now())
                    }
                    Err(_) => {
                        if let Some(batch) = collector.flush() {
                            self.deliver_batch(batch, &hard_stop).await;
                        }
                        return;
                    }
                },
            };
            if let Some(batch) = batch
                && !self.deliver_batch(batch, &hard_stop).await
            {
                return;
            }
        }
    }

    /// The lane's instance, made when missing. None when `hard_stop` fired
    /// first.
    async fn handler(
        &mut self,
        backoff: &mut Backoff,
        stop: &CancellationToken,
    ) -> Option<&mut F::Handler> {
        while self.handler.is_none() {
            let generation = self.factory.generation();
            let made = tokio::select! {
                _ = stop.cancelled() => return None,
                made = self.factory.create(self.id) => made,
            };
            match made {
                Ok(handler) => {
                    self.handler = Some(handler);
                    self.generation = generation;
                }
                Err(e) => {
                    tracing::error!(subscription = %self.subscription.name, lane = self.id.0, error = %e, "cannot instantiate the plugin; retrying");
                    if !sleep(backoff.next_wait(), stop).await {
                        return None;
                    }
                }
            }
        }
        self.handler.as_mut()
    }

    /// Logs a failed call and drops the instance when it can no longer be
    /// used (trap, timeout). Returns the reason for the record's history.
    fn failed_call(
        &mut self,
        error: &CallError,
        record: &Record,
        attempt: u32,
        batch_len: usize,
    ) -> String {
        let sub = self.subscription.name.as_str();
        match error {
            CallError::Trap(_) | CallError::OutOfMemory(_) => self.metrics.traps.inc(),
            CallError::Timeout(_) => self.metrics.timeouts.inc(),
            CallError::WrongOutcomeCount { .. } | CallError::WrongWorld(_) => {
                self.metrics.guest_errors.inc()
            }
        }
        match error {
            CallError::Trap(_)
            | CallError::OutOfMemory(_)
            | CallError::Timeout(_)
            | CallError::WrongWorld(_) => {
                self.metrics.recycles.inc();
                tracing::warn!(subscription = sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, batch_len, error = %error, "handler failed; instance recycled");
                self.handler = None;
            }
            CallError::WrongOutcomeCount { .. } => {
                tracing::error!(subscription = sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, batch_len, error = %error, "guest error: the whole batch failed");
            }
        }
        error.to_string()
    }

    /// Handles one record until it settles. False when `hard_stop` cut it
    /// off.
    /// At a record or batch boundary: an instance of a swapped-out plugin
    /// version is dropped, so the next call runs the new version.
    fn follow_swaps(&mut self) {
        if self.handler.is_some() && self.factory.generation() != self.generation {
            self.handler = None;
        }
    }

    async fn deliver(&mut self, delivery: Delivery, hard_stop: &CancellationToken) -> bool {
        self.follow_swaps();
        let Delivery { record, ticket } = delivery;
        let mut backoff = self.backoff();
        let mut attempt: u32 = 1;
        loop {
            let span = spans::process(&self.subscription, self.id, &record, attempt);
            let Some(handler) = self.handler(&mut backoff, hard_stop).await else {
                return false;
            };
            let started = std::time::Instant::now();
            let result = tokio::select! {
                _ = hard_stop.cancelled() => return false,
                r = handler.handle(&record, attempt).instrument(span) => r,
            };
            self.metrics.duration.observe_duration(started.elapsed());
            self.metrics.calls.inc();
            // The version is taken before a failed call may drop the
            // instance.
            let (reason, version) = match result {
                Ok(Outcome::Ack) => {
                    self.metrics.acked.inc();
                    self.settle(SettlementMsg::Settle(ticket)).await;
                    return true;
                }
                Ok(Outcome::Reject(reason)) => {
                    let reason = guest_reason(reason);
                    self.metrics.rejected.inc();
                    let next = failure::after_reject(&self.subscription.failure);
                    let version = self.version_of(&record);
                    return self
                        .give_up(
                            &record,
                            ticket,
                            next,
                            LastFailure {
                                reason: &format!("rejected: {reason}"),
                                attempts: attempt,
                                version,
                            },
                            hard_stop,
                        )
                        .await;
                }
                Ok(Outcome::Retry(reason)) => {
                    let reason = guest_reason(reason);
                    self.metrics.retried.inc();
                    tracing::info!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, reason, "handler asked to retry");
                    (format!("retry: {reason}"), self.version_of(&record))
                }
                Err(e) => {
                    let version = self.version_of(&record);
                    (self.failed_call(&e, &record, attempt, 1), version)
                }
            };
            match failure::after_failure(&self.subscription.failure, attempt, failure::age(&record))
            {
                Next::Retry => {}
                Next::Blocked => self.log_blocked(&record, attempt, &reason),
                next => {
                    return self
                        .give_up(
                            &record,
                            ticket,
                            next,
                            LastFailure {
                                reason: &reason,
                                attempts: attempt,
                                version,
                            },
                            hard_stop,
                        )
                        .await;
                }
            }
            attempt = attempt.saturating_add(1);
            if !sleep(backoff.next_wait(), hard_stop).await {
                return false;
            }
        }
    }

    fn log_blocked(&self, record: &Record, attempt: u32, reason: &str) {
        self.metrics.blocked.inc();
        let since = attempt.saturating_sub(self.subscription.failure.max_attempts.unwrap_or(0));
        if since.is_multiple_of(BLOCKED_LOG_EVERY) || since <= 1 {
            tracing::error!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, reason, "record blocked: out of attempts, on_failure = block keeps retrying it (the lane waits)");
        }
    }

    /// Settles a record given up on: dead-letters it first (retrying the put
    /// until it succeeds), or skips it. False when `hard_stop` cut it off
    /// (the record then stays unsettled).
    async fn give_up(
        &mut self,
        record: &Record,
        ticket: Ticket,
        next: Next,
        failure: LastFailure<'_>,
        stop: &CancellationToken,
    ) -> bool {
        let LastFailure {
            reason,
            attempts,
            version,
        } = failure;
        let sub = self.subscription.name.clone();
        match (next, &self.dead_letters) {
            (Next::DeadLetter, Some(dead_letters)) => {
                let mut backoff = Backoff::new(DEAD_LETTER_BACKOFF.0, DEAD_LETTER_BACKOFF.1);
                loop {
                    let put = tokio::select! {
                        _ = stop.cancelled() => return false,
                        put = dead_letters.put(record, reason, attempts, version.as_ref()) => put,
                    };
                    match put {
                        Ok(put) => {
                            self.metrics.dead_lettered.inc();
                            tracing::warn!(subscription = %sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, partition_key = %record.partition_key, attempts, reason, dead_letter_stream = %dead_letters.stream(), dead_letter_sequence = put.sequence, data_omitted = put.data_omitted, data_bytes = record.data.len(), "record dead-lettered");
                            break;
                        }
                        Err(e) => {
                            tracing::error!(subscription = %sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, error = e, "dead-letter put failed; retrying (the record stays unsettled)");
                            if !sleep(backoff.next_wait(), stop).await {
                                return false;
                            }
                        }
                    }
                }
            }
            _ => {
                self.metrics.skipped.inc();
                tracing::error!(subscription = %sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, partition_key = %record.partition_key, attempts, reason, "record skipped");
            }
        }
        self.settle(SettlementMsg::Settle(ticket)).await;
        true
    }

    /// Handles a batch until every record in it settles. Records the handler
    /// retried are called again, alone, before the lane takes new ones; a
    /// failed call (trap, timeout, wrong-length answer) retries the batch,
    /// or with `bisect_on_error` splits it in halves that are handled in
    /// turn. False when `hard_stop` cut it off.
    async fn deliver_batch(&mut self, batch: Vec<Delivery>, hard_stop: &CancellationToken) -> bool {
        self.follow_swaps();
        let items: Vec<Item> = batch
            .into_iter()
            .map(|Delivery { record, ticket }| Item {
                record,
                ticket,
                attempt: 1,
            })
            .collect();
        let mut groups: VecDeque<Vec<Item>> = VecDeque::from([items]);
        let mut backoff = self.backoff();
        let mut args: Vec<(Arc<Record>, u32)> = Vec::new();
        while let Some(mut group) = groups.pop_front() {
            while !group.is_empty() {
                args.clear();
                args.extend(group.iter().map(|i| (i.record.clone(), i.attempt)));
                let span = spans::process_batch(&self.subscription, self.id, &args);
                let Some(handler) = self.handler(&mut backoff, hard_stop).await else {
                    return false;
                };
                let started = std::time::Instant::now();
                let result = tokio::select! {
                    _ = hard_stop.cancelled() => return false,
                    r = handler.handle_batch(&args).instrument(span) => r,
                };
                self.metrics.duration.observe_duration(started.elapsed());
                self.metrics.batch_size.observe(args.len() as f64);
                self.metrics.calls.inc();
                match result {
                    Ok(outcomes) => {
                        let mut settled = Vec::with_capacity(outcomes.len());
                        let mut again = Vec::new();
                        for (item, outcome) in group.drain(..).zip(outcomes) {
                            match outcome {
                                Outcome::Ack => {
                                    self.metrics.acked.inc();
                                    settled.push(item.ticket);
                                }
                                Outcome::Reject(reason) => {
                                    let reason = guest_reason(reason);
                                    self.metrics.rejected.inc();
                                    let next = failure::after_reject(&self.subscription.failure);
                                    let version = self.version_of(&item.record);
                                    if !self
                                        .give_up(
                                            &item.record,
                                            item.ticket,
                                            next,
                                            LastFailure {
                                                reason: &format!("rejected: {reason}"),
                                                attempts: item.attempt,
                                                version,
                                            },
                                            hard_stop,
                                        )
                                        .await
                                    {
                                        return false;
                                    }
                                }
                                Outcome::Retry(reason) => {
                                    let reason = guest_reason(reason);
                                    self.metrics.retried.inc();
                                    tracing::info!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %item.record.shard, sequence_number = %item.record.sequence, attempt = item.attempt, reason, "handler asked to retry");
                                    let version = self.version_of(&item.record);
                                    match self
                                        .after_item_failure(
                                            item,
                                            &format!("retry: {reason}"),
                                            version,
                                            hard_stop,
                                        )
                                        .await
                                    {
                                        Ok(Some(item)) => again.push(item),
                                        Ok(None) => {}
                                        Err(Stopped) => return false,
                                    }
                                }
                            }
                        }
                        if !settled.is_empty() {
                            self.settle(SettlementMsg::SettleMany(settled)).await;
                        }
                        group = again;
                    }
                    Err(e) => {
                        // Before a failed call may drop the instance.
                        let versions: Vec<Option<PluginDigest>> =
                            group.iter().map(|i| self.version_of(&i.record)).collect();
                        let reason =
                            self.failed_call(&e, &group[0].record, group[0].attempt, group.len());
                        if matches!(e, CallError::OutOfMemory(_)) && group.len() > 1 {
                            // Too big for the guest's memory (often the host
                            // lowering it): the same batch would fail every
                            // time, so it is halved until it fits. Not an
                            // attempt: the records may never have reached
                            // the guest, and halving ends (a record alone
                            // falls to the failure policy).
                            let second = group.split_off(group.len() / 2);
                            let first = std::mem::take(&mut group);
                            tracing::warn!(subscription = %self.subscription.name, lane = self.id.0, halves = ?(first.len(), second.len()), "batch too big for the guest's memory; splitting it");
                            groups.push_front(second);
                            groups.push_front(first);
                            continue;
                        }
                        if self.subscription.failure.bisect_on_error && group.len() > 1 {
                            // Halves are handled in turn, first half first,
                            // each as a batch of its own; their records'
                            // attempts count on. A single record left alone
                            // falls to the failure policy.
                            let mut second = group.split_off(group.len() / 2);
                            let mut first = std::mem::take(&mut group);
                            for item in first.iter_mut().chain(second.iter_mut()) {
                                item.attempt = item.attempt.saturating_add(1);
                            }
                            tracing::info!(subscription = %self.subscription.name, lane = self.id.0, halves = ?(first.len(), second.len()), "bisecting the failed batch");
                            groups.push_front(second);
                            groups.push_front(first);
                            if !sleep(backoff.next_wait(), hard_stop).await {
                                return false;
                            }
                            continue;
                        }
                        let mut again = Vec::with_capacity(group.len());
                        for (item, version) in group.drain(..).zip(versions) {
                            match self
                                .after_item_failure(item, &reason, version, hard_stop)
                                .await
                            {
                                Ok(Some(item)) => again.push(item),
                                Ok(None) => {}
                                Err(Stopped) => return false,
                            }
                        }
                        group = again;
                    }
                }
                if !group.is_empty() && !sleep(backoff.next_wait(), hard_stop).await {
                    return false;
                }
            }
        }
        true
    }
}

impl<F: HandlerFactory> Lane<F> {
    /// After a failed attempt of one batch item: the item to try again (its
    /// attempt bumped), or `None` when it was given up on and settled.
    async fn after_item_failure(
        &mut self,
        mut item: Item,
        reason: &str,
        version: Option<PluginDigest>,
        stop: &CancellationToken,
    ) -> Result<Option<Item>, Stopped> {
        match failure::after_failure(
            &self.subscription.failure,
            item.attempt,
            failure::age(&item.record),
        ) {
            Next::Retry => {}
            Next::Blocked => self.log_blocked(&item.record, item.attempt, reason),
            next => {
                let Item {
                    record,
                    ticket,
                    attempt,
                } = item;
                return if self
                    .give_up(
                        &record,
                        ticket,
                        next,
                        LastFailure {
                            reason,
                            attempts: attempt,
                            version,
                        },
                        stop,
                    )
                    .await
                {
                    Ok(None)
                } else {
                    Err(Stopped)
                };
            }
        }
        item.attempt = item.attempt.saturating_add(1);
        Ok(Some(item))
    }

    /// The plugin version the lane's instance runs for `record`.
    fn version_of(&self, record: &Record) -> Option<PluginDigest> {
        self.handler.as_ref().and_then(|h| h.version(record))
    }

    async fn settle(&mut self, msg: SettlementMsg) {
        // Settlement outlives dispatch (it ends when the last sender is
        // dropped), so this only fails if it died; nothing can checkpoint
        // then, and the records are read again after a restart.
        let _ = self.settlement.send(msg).await;
    }
}

/// What lowering `record` puts in the guest's memory, near enough: its
/// data and its strings (what `max_batch_bytes` counts).
fn lowered_bytes(record: &Record) -> usize {
    record.data.len()
        + record.partition_key.as_str().len()
        + record.sequence.as_str().len()
        + record.shard.as_str().len()
        + record.stream.as_str().len()
}

/// A guest's `retry`/`reject` reason, cut where it enters the lane: it is
/// logged and may be dead-lettered (see [`crate::logging`], "Hostile
/// text").
fn guest_reason(mut reason: String) -> String {
    cap(&mut reason, MAX_GUEST_TEXT);
    reason
}

async fn sleep(wait: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
