//! One lane: one handler instance, one record or batch at a time, retries in
//! place, giving up by the failure policy (see [`super`] and
//! [`crate::failure`]).
//!
//! # One path
//! A record is a batch of one as far as failure handling goes: whatever the
//! mode, a lane hands a *group* of records (one, or a batch) to
//! [`Lane::deliver`], which calls the handler — `handle` for a lone record
//! in record mode, `handle-batch` otherwise — and applies each record's
//! outcome:
//! - `ack` settles it;
//! - `reject` settles it by the policy's reject rule (skip, or dead-letter
//!   first);
//! - `retry` counts an attempt: the policy says try again (the record is
//!   called again, alone, before anything new), keep trying though out of
//!   attempts (`block`), or give up (skip, or dead-letter first);
//! - a failed call (trap, timeout, wrong-length answer) is a failed attempt
//!   of every record in the group, after the instance is recycled when the
//!   failure spoils it. A group of several that failed for memory is halved
//!   without counting an attempt; with `bisect_on_error` it is halved too,
//!   the halves handled in turn with their attempts counted.
//!
//! Between attempts the lane waits a jittered, doubling backoff; `hard_stop`
//! cuts any wait or call short, leaving what was cut off unsettled.
//!
//! A lone record's ack goes to settlement in bulk with others ([`acks`]).
//!
//! # Runs
//! In record mode, a handler that takes runs (a 0.3.0 `record-handler`:
//! [`Handler::max_run`] > 1) is handed, with the record the lane took,
//! what already waits behind it in the lane's inbox of the same shard, up
//! to its `max_run` and [`MAX_RUN_BYTES`] — never waiting for more, so a
//! run adds no latency. The handler answers a prefix: it stops after the
//! first record that is not acked. The lane applies those outcomes as
//! above, and the records after the prefix were never handled: they go
//! again, after a retried record and before anything new, without an
//! attempt counted — so a `retry` still re-delivers that record before
//! anything after it on the lane, attempts count per record, and
//! settlement sees what it sees one record per call. A run that fails
//! whole (a trap, a timeout, an empty answer) cannot say which record
//! failed: its records go again one per call, none counting an attempt,
//! and each then fails or succeeds on its own.
//!
//! # Waking per fill
//! A batch lane takes the first record of a batch as it comes (its
//! arrival starts the batch's window). While the batch is open it does
//! not wake for each record: it waits until enough wait in its inbox to
//! close the batch by count ([`BatchCollector::wanted`], at most half the
//! inbox), a window's close waits, or the window ends, whichever comes
//! first, and then takes all that waits without waiting again. What a
//! batch holds is unchanged — up to `batch_size` records, or what arrived
//! within the window of its first — and so is when it closes: a batch full
//! by count is seen when its last record is, a close at once, a window's
//! end when it ends (the records that wait when the lane looks are taken
//! first). When a batch's bytes would close it before its count (at the
//! size of its records so far), the lane looks at each record, as it did
//! before. One case is seen later: a record far larger than the batch's
//! records so far, which closes it by bytes, waits for the next fill or
//! the window's end (and its own batch's window starts then). Waking per
//! record cost a task switch a record.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::batch::BatchCollector;
use super::{CallError, Handled, Handler, HandlerFactory, Outcome, Output};
use crate::backoff::Backoff;
use crate::channel::{Delivery, DeliveryReceiver, Record, Work};
use crate::config::{BatchConfig, SubscriptionConfig};
use crate::failure::Policy;
use crate::ids::{LaneId, PluginDigest};
use crate::logging::{MAX_GUEST_TEXT, cap};
use crate::outputs::{Publish, PublishSender};
use crate::progress::Ticket;
use crate::settlement::{SettlementMsg, SettlementSender};
use crate::state::{CallState, StateStage};
use crate::telemetry::spans;

mod acks;
mod give_up;
mod metrics;
mod publish;
mod state;
#[cfg(test)]
mod tests;
mod windows;

use acks::HeldAcks;
pub(super) use metrics::LaneMetrics;
use publish::{Deferred, OutputsByInput};

/// First and longest wait between dead-letter puts that fail.
const DEAD_LETTER_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_secs(10));

/// A blocked record is logged at its first blocked attempt and every this
/// many after.
const BLOCKED_LOG_EVERY: u32 = 10;

/// Most bytes (data and partition keys) of a run: what one call lowers
/// into the guest stays bounded, as a batch's does (see "Runs").
const MAX_RUN_BYTES: usize = 1 << 20;

pub(super) struct Lane<F: HandlerFactory> {
    id: LaneId,
    subscription: Arc<SubscriptionConfig>,
    policy: Arc<Policy>,
    factory: Arc<F>,
    handler: Option<F::Handler>,
    settlement: SettlementSender,
    /// Where acked records with outputs go instead of settling.
    publisher: PublishSender,
    metrics: LaneMetrics,
    /// The factory's plugin generation the instance was made from.
    generation: u64,
    /// A group's records, kept between deliveries so a record alone costs
    /// no allocation.
    spare: Vec<Item>,
    /// A batch call's arguments, likewise.
    args: Vec<(Arc<Record>, u32)>,
    /// Publishes held back until the group under way settles (see
    /// [`publish`]).
    deferred: Deferred,
    /// The subscription's per-key state, when it has some.
    state: Option<Arc<StateStage>>,
    /// Lone acks not sent to settlement yet ([`acks`]).
    held_acks: HeldAcks,
}

/// `hard_stop` fired: the lane stops where it is.
struct Stopped;

/// A record in a lane, with its own attempt count.
struct Item {
    record: Arc<Record>,
    ticket: Ticket,
    attempt: u32,
    /// Its place in the group it came in (lane order).
    position: u32,
}

/// What one call answered: an outcome per record of the group, in order,
/// and the outputs it published.
struct Answer {
    outcomes: Outcomes,
    outputs: Vec<Output>,
    /// The call's state view, with each input's writes.
    state: CallState,
}

/// One outcome, or one per record of a batch.
enum Outcomes {
    One(Option<Outcome>),
    Many(std::vec::IntoIter<Outcome>),
}

impl Iterator for Outcomes {
    type Item = Outcome;

    fn next(&mut self) -> Option<Outcome> {
        match self {
            Outcomes::One(one) => one.take(),
            Outcomes::Many(many) => many.next(),
        }
    }
}

impl<F: HandlerFactory> Lane<F> {
    pub(super) fn new(
        id: LaneId,
        subscription: Arc<SubscriptionConfig>,
        policy: Arc<Policy>,
        factory: Arc<F>,
        settlement: SettlementSender,
        publisher: PublishSender,
        metrics: LaneMetrics,
    ) -> Self {
        Self {
            id,
            subscription,
            policy,
            factory,
            handler: None,
            settlement,
            publisher,
            metrics,
            generation: 0,
            spare: Vec::new(),
            args: Vec::new(),
            deferred: Deferred::default(),
            state: None,
            held_acks: HeldAcks::default(),
        }
    }

    /// Gives the lane's calls the subscription's per-key state.
    pub(super) fn with_state(mut self, state: Option<Arc<StateStage>>) -> Self {
        self.state = state;
        self
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
        // Made once: a `cancelled()` per record registers and unregisters
        // a waiter each time.
        let stopped = hard_stop.cancelled();
        tokio::pin!(stopped);
        // Taken while filling a run, but of another shard: the next one.
        let mut next: Option<Work> = None;
        loop {
            if self
                .held_acks
                .due(inbox.len() == 0 && next.is_none(), Instant::now())
            {
                self.send_acks().await;
            }
            let work = match next.take() {
                Some(d) => d,
                None => tokio::select! {
                    biased;
                    _ = &mut stopped => break,
                    d = inbox.recv() => match d {
                        Ok(d) => d,
                        Err(_) => break,
                    },
                },
            };
            let delivery = match work {
                Work::Record(delivery) => delivery,
                Work::Close(close) => {
                    self.send_acks().await;
                    if !self.close_window(&close, &hard_stop).await {
                        break;
                    }
                    continue;
                }
            };
            let mut group = std::mem::take(&mut self.spare);
            group.push(Item::from(delivery));
            next = self.fill_run(&mut group, &inbox);
            if !self.deliver(group, &hard_stop).await {
                break;
            }
        }
        // Acked is acked, even when cut off.
        self.send_acks().await;
    }

    /// Adds to a lone record what waits behind it of the same shard, up to
    /// what the handler takes in one call ([`Handler::max_run`]) and
    /// [`MAX_RUN_BYTES`] (see "Runs"); returns a delivery it took that
    /// belongs to another shard, or a window's close (which ends a run).
    fn fill_run(&self, group: &mut Vec<Item>, inbox: &DeliveryReceiver) -> Option<Work> {
        let max = self.handler.as_ref().map_or(1, Handler::max_run);
        let mut bytes = lowered_bytes(&group[0].record);
        while group.len() < max && bytes < MAX_RUN_BYTES {
            let delivery = match inbox.try_recv()? {
                Work::Record(d) if d.record.shard == group[0].record.shard => d,
                other => return Some(other),
            };
            bytes += lowered_bytes(&delivery.record);
            group.push(Item::from(delivery));
        }
        None
    }

    /// Holds a lone record's ack ([`acks`]), sending them all once full.
    async fn hold_ack(&mut self, ticket: Ticket) {
        if let Some(msg) = self.held_acks.hold(ticket, Instant::now()) {
            self.settle(msg).await;
        }
    }

    /// Sends the held acks to settlement.
    async fn send_acks(&mut self) {
        if let Some(msg) = self.held_acks.take() {
            self.settle(msg).await;
        }
    }

    async fn run_batches(
        mut self,
        inbox: DeliveryReceiver,
        hard_stop: CancellationToken,
        batch: BatchConfig,
    ) {
        let mut collector = BatchCollector::new(batch.size, batch.max_bytes, batch.window);
        let stopped = hard_stop.cancelled();
        tokio::pin!(stopped);
        loop {
            // A batch of one acks alone: its ack is held like a record's.
            self.send_acks().await;
            let go_on = match collector.deadline() {
                // No batch open: its first record starts the window.
                None => tokio::select! {
                    biased;
                    _ = &mut stopped => break,
                    work = inbox.recv() => match work {
                        Ok(work) => self.collect(&mut collector, &inbox, Some(work), &hard_stop).await,
                        Err(_) => {
                            if let Some(batch) = collector.flush() {
                                self.deliver(items(batch), &hard_stop).await;
                            }
                            break;
                        }
                    },
                },
                // A batch open: wake for what fills it, or at its window's end.
                Some(deadline) => tokio::select! {
                    biased;
                    _ = &mut stopped => break,
                    () = sleep_until(deadline) => {
                        self.collect(&mut collector, &inbox, None, &hard_stop).await
                            && match collector.take_due(Instant::now()) {
                                Some(batch) => self.deliver(items(batch), &hard_stop).await,
                                None => true,
                            }
                    }
                    () = inbox.filled(collector.wanted()) => {
                        if inbox.is_drained() {
                            if let Some(batch) = collector.flush() {
                                self.deliver(items(batch), &hard_stop).await;
                            }
                            break;
                        }
                        self.collect(&mut collector, &inbox, None, &hard_stop).await
                    }
                },
            };
            if !go_on {
                break;
            }
        }
        // Acked is acked, even when cut off.
        self.send_acks().await;
    }

    /// Puts `first`, then what waits in `inbox`, into the open batch until
    /// a batch closes (it is delivered) or the inbox is empty. A window's
    /// close taken on the way follows every record before it: the batch
    /// collected so far is delivered first, then the close. False when
    /// `hard_stop` cut a call short.
    async fn collect(
        &mut self,
        collector: &mut BatchCollector<Delivery>,
        inbox: &DeliveryReceiver,
        mut first: Option<Work>,
        hard_stop: &CancellationToken,
    ) -> bool {
        let now = Instant::now();
        while let Some(work) = first.take().or_else(|| inbox.try_recv()) {
            match work {
                Work::Record(d) => {
                    let bytes = lowered_bytes(&d.record);
                    if let Some(batch) = collector.push(d, bytes, now) {
                        return self.deliver(items(batch), hard_stop).await;
                    }
                }
                Work::Close(close) => {
                    if let Some(batch) = collector.flush()
                        && !self.deliver(items(batch), hard_stop).await
                    {
                        return false;
                    }
                    self.send_acks().await;
                    return self.close_window(&close, hard_stop).await;
                }
            }
        }
        true
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

    /// At a record or batch boundary: an instance of a swapped-out plugin
    /// version is dropped, so the next call runs the new version.
    fn follow_swaps(&mut self) {
        if self.handler.is_some() && self.factory.generation() != self.generation {
            self.handler = None;
        }
    }

    /// One call for `group`: `handle` for a lone record in record mode,
    /// `handle-batch` otherwise. None when `hard_stop` cut it off.
    async fn call(
        &mut self,
        group: &[Item],
        backoff: &mut Backoff,
        hard_stop: &CancellationToken,
    ) -> Option<Result<Answer, CallError>> {
        let batches = self.subscription.batch.is_some();
        let many = batches || group.len() > 1;
        let mut args = std::mem::take(&mut self.args);
        let span = if many {
            args.clear();
            args.extend(group.iter().map(|i| (i.record.clone(), i.attempt)));
            spans::process_batch(&self.subscription, self.id, &args)
        } else {
            spans::process(
                &self.subscription,
                self.id,
                &group[0].record,
                group[0].attempt,
            )
        };
        let mut state = match &self.state {
            Some(stage) => {
                state::prepare(
                    stage,
                    state::keys_of(group),
                    backoff,
                    hard_stop,
                    &self.subscription.name,
                    self.id,
                )
                .await?
            }
            None => CallState::default(),
        };
        let handler = self.handler(backoff, hard_stop).await?;
        let started = std::time::Instant::now();
        let result = if batches {
            tokio::select! {
                _ = hard_stop.cancelled() => None,
                r = handler.handle_batch(&args, &mut state).instrument(span) => Some(r.and_then(|Handled { mut outcome, outputs }| {
                    // One outcome per record, or the call failed: a record
                    // without one would be neither settled nor retried.
                    if outcome.len() == group.len() {
                        state::forbid_dependent_acks(&mut outcome, &state);
                        Ok(Answer { outcomes: Outcomes::Many(outcome.into_iter()), outputs, state })
                    } else {
                        Err(CallError::WrongOutcomeCount { got: outcome.len(), want: group.len() })
                    }
                })),
            }
        } else if many {
            tokio::select! {
                _ = hard_stop.cancelled() => None,
                r = handler.handle_run(&args, &mut state).instrument(span) => Some(r.and_then(|Handled { mut outcome, outputs }| {
                    // A prefix of the run, at least one (see "Runs").
                    outcome.truncate(group.len());
                    if outcome.is_empty() {
                        Err(CallError::WrongOutcomeCount { got: 0, want: 1 })
                    } else {
                        Ok(Answer { outcomes: Outcomes::Many(outcome.into_iter()), outputs, state })
                    }
                })),
            }
        } else {
            let Item {
                record, attempt, ..
            } = &group[0];
            tokio::select! {
                _ = hard_stop.cancelled() => None,
                r = handler.handle(record, *attempt, &mut state).instrument(span) => Some(r.map(|Handled { outcome, outputs }| Answer {
                    outcomes: Outcomes::One(Some(outcome)),
                    outputs,
                    state,
                })),
            }
        };
        args.clear();
        self.args = args;
        let result = result?;
        self.metrics.duration.observe_duration(started.elapsed());
        if batches {
            self.metrics.batch_size.observe(group.len() as f64);
        }
        self.metrics.calls.inc();
        Some(result)
    }

    /// Handles a group until every record in it settles (see "One path").
    /// False when `hard_stop` cut it off.
    async fn deliver(&mut self, group: Vec<Item>, hard_stop: &CancellationToken) -> bool {
        self.follow_swaps();
        let mut group = group;
        // Records of parked keys go straight to the dead-letter stream
        // (see `crate::failure`'s quarantine).
        if let Some(q) = self.policy.quarantine().cloned()
            && q.any_parked()
        {
            if !Box::pin(self.forward_parked(&mut group, &q, hard_stop)).await {
                return false;
            }
            if group.is_empty() {
                self.spare = group;
                return true;
            }
        }
        let mut backoff = self.backoff();
        let mut groups: VecDeque<Vec<Item>> = VecDeque::new();
        for (position, item) in (0..).zip(group.iter_mut()) {
            item.position = position;
        }
        self.deferred.clear();
        loop {
            while !group.is_empty() {
                let Some(result) = self.call(&group, &mut backoff, hard_stop).await else {
                    return false;
                };
                let step = match result {
                    Ok(answer) => self.apply(&mut group, answer, hard_stop).await,
                    // Boxed, as are the give-ups below: failure paths are
                    // rare, and inline they would make every record's
                    // future (built and moved per record) several times
                    // larger.
                    Err(e) => Box::pin(self.failed(&mut group, &mut groups, &e, hard_stop)).await,
                };
                match step {
                    Err(Stopped) => return false,
                    // Halved: the first half goes next, without waiting.
                    Ok(Split::Halved) => group = groups.pop_front().unwrap_or_default(),
                    // The rest of a run: next, without waiting.
                    Ok(Split::Rest) => {}
                    Ok(Split::No) => {
                        if !group.is_empty() {
                            self.send_acks().await;
                            if !sleep(backoff.next_wait(), hard_stop).await {
                                return false;
                            }
                        }
                    }
                    Ok(Split::Bisected) => {
                        group = groups.pop_front().unwrap_or_default();
                        self.send_acks().await;
                        if !sleep(backoff.next_wait(), hard_stop).await {
                            return false;
                        }
                    }
                }
            }
            match groups.pop_front() {
                Some(next) => group = next,
                None => break,
            }
        }
        for (ticket, outputs) in self.deferred.release() {
            self.publish(ticket, outputs).await;
        }
        // Keep the (empty) buffer for the next record.
        self.spare = group;
        true
    }

    /// Applies one outcome per record of `group`; what is to be tried again
    /// stays in `group`, its attempt counted.
    async fn apply(
        &mut self,
        group: &mut Vec<Item>,
        answer: Answer,
        hard_stop: &CancellationToken,
    ) -> Result<Split, Stopped> {
        let lone = group.len() == 1;
        let mut acked = Vec::new();
        let mut again = Vec::new();
        let Answer {
            outcomes,
            outputs,
            mut state,
        } = answer;
        let mut outputs = OutputsByInput::new(outputs);
        let mut outcomes = outcomes;
        // The records a run did not answer (see "Runs").
        let mut rest = Vec::new();
        let mut items = group.drain(..).enumerate();
        while let Some((index, item)) = items.next() {
            let Some(outcome) = outcomes.next() else {
                rest.push(item);
                rest.extend(items.by_ref().map(|(_, item)| item));
                break;
            };
            // Only an acking attempt publishes: its outputs go on with it,
            // every other outcome's are dropped here.
            let published = outputs.take(index);
            // Likewise its state writes, staged before the record settles
            // (see `crate::state`, "Commit protocol").
            if outcome == Outcome::Ack
                && let Some(stage) = &self.state
                && let Some((key, base, delta)) = state.take(index)
            {
                stage.stage(&item.record, &item.ticket, key, base, delta);
            }
            match outcome {
                Outcome::Ack if !published.is_empty() => {
                    self.metrics.acked.inc();
                    if self.deferred.holding() {
                        self.deferred.hold(item.position, item.ticket, published);
                    } else {
                        self.publish(item.ticket, published).await;
                    }
                }
                Outcome::Ack => {
                    self.metrics.acked.inc();
                    if lone {
                        self.hold_ack(item.ticket).await;
                    } else {
                        acked.push(item.ticket);
                    }
                }
                Outcome::Reject(reason) => Box::pin(self.rejected(item, reason, hard_stop)).await?,
                Outcome::Retry(reason) => {
                    let reason = guest_reason(reason);
                    self.metrics.retried.inc();
                    tracing::info!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %item.record.shard, sequence_number = %item.record.sequence, attempt = item.attempt, reason, "handler asked to retry");
                    let version = self.version_of(&item.record);
                    let reason = format!("retry: {reason}");
                    if let Some(item) =
                        Box::pin(self.after_failure(item, &reason, version, hard_stop)).await?
                    {
                        // A later record of its key may ack now; its
                        // outputs must not overtake this one's.
                        self.deferred.start();
                        again.push(item);
                    }
                }
            }
        }
        drop(items);
        if !acked.is_empty() {
            self.settle(SettlementMsg::SettleMany(acked)).await;
        }
        Ok(regroup(group, again, rest))
    }

    /// A record the handler rejected: given up by the policy's reject rule.
    async fn rejected(
        &mut self,
        item: Item,
        reason: String,
        hard_stop: &CancellationToken,
    ) -> Result<(), Stopped> {
        let reason = format!("rejected: {}", guest_reason(reason));
        self.metrics.rejected.inc();
        let version = self.version_of(&item.record);
        let policy = self.policy.clone();
        if self
            .give_up(item, policy.after_reject(), &reason, version, hard_stop)
            .await
        {
            Ok(())
        } else {
            Err(Stopped)
        }
    }

    /// A call for `group` failed: recycles the instance when the failure
    /// spoils it, then splits the group (memory, bisect) into `groups`, or
    /// counts a failed attempt for each record.
    async fn failed(
        &mut self,
        group: &mut Vec<Item>,
        groups: &mut VecDeque<Vec<Item>>,
        error: &CallError,
        hard_stop: &CancellationToken,
    ) -> Result<Split, Stopped> {
        // Before a failed call may drop the instance.
        let versions: Vec<Option<PluginDigest>> =
            group.iter().map(|i| self.version_of(&i.record)).collect();
        let reason = self.failed_call(error, &group[0].record, group[0].attempt, group.len());
        if self.subscription.batch.is_none() && group.len() > 1 {
            // A run failed whole: which record failed is not known, so each
            // goes again alone, none counting an attempt (see "Runs").
            for item in group.drain(..).rev() {
                groups.push_front(vec![item]);
            }
            return Ok(Split::Halved);
        }
        if matches!(error, CallError::OutOfMemory(_)) && group.len() > 1 {
            // Too big for the guest's memory (often the host lowering it):
            // the same batch would fail every time, so it is halved until it
            // fits. Not an attempt: the records may never have reached the
            // guest, and halving ends (a record alone falls to the failure
            // policy).
            let second = group.split_off(group.len() / 2);
            let first = std::mem::take(group);
            tracing::warn!(subscription = %self.subscription.name, lane = self.id.0, halves = ?(first.len(), second.len()), "batch too big for the guest's memory; splitting it");
            groups.push_front(second);
            groups.push_front(first);
            return Ok(Split::Halved);
        }
        if self.policy.bisect_on_error && group.len() > 1 {
            // Halves are handled in turn, first half first, each as a batch
            // of its own; their records' attempts count on. A single record
            // left alone falls to the failure policy.
            let mut second = group.split_off(group.len() / 2);
            let mut first = std::mem::take(group);
            for item in first.iter_mut().chain(second.iter_mut()) {
                item.attempt = item.attempt.saturating_add(1);
            }
            tracing::info!(subscription = %self.subscription.name, lane = self.id.0, halves = ?(first.len(), second.len()), "bisecting the failed batch");
            groups.push_front(second);
            groups.push_front(first);
            return Ok(Split::Bisected);
        }
        let mut again = Vec::new();
        for (item, version) in group.drain(..).zip(versions) {
            if let Some(item) = self
                .after_failure(item, &reason, version, hard_stop)
                .await?
            {
                again.push(item);
            }
        }
        if !again.is_empty() {
            *group = again;
        }
        Ok(Split::No)
    }

    /// Logs a failed call and drops the instance when the failure spoils
    /// it. Returns the reason for the records' history.
    fn failed_call(
        &mut self,
        error: &CallError,
        record: &Record,
        attempt: u32,
        batch_len: usize,
    ) -> String {
        let spoiled = self.count_failure(error);
        let sub = self.subscription.name.as_str();
        if spoiled {
            tracing::warn!(subscription = sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, batch_len, error = %error, "handler failed; instance recycled");
        } else {
            tracing::error!(subscription = sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, batch_len, error = %error, "guest error: the whole batch failed");
        }
        error.to_string()
    }

    /// Counts a failed call (a record's, a batch's or a close's) by kind,
    /// and drops the instance when the failure spoils it; true then.
    fn count_failure(&mut self, error: &CallError) -> bool {
        match error {
            CallError::Trap(_) | CallError::OutOfMemory(_) => self.metrics.traps.inc(),
            CallError::Timeout(_) => self.metrics.timeouts.inc(),
            CallError::WrongOutcomeCount { .. } | CallError::WrongWorld { .. } => {
                self.metrics.guest_errors.inc()
            }
        }
        let spoiled = error.spoils_instance();
        if spoiled {
            self.metrics.recycles.inc();
            self.handler = None;
        }
        spoiled
    }

    /// The plugin version the lane's instance runs for `record`.
    fn version_of(&self, record: &Record) -> Option<PluginDigest> {
        self.handler.as_ref().and_then(|h| h.version(record))
    }

    /// Hands an acked record's outputs to the output stage, which settles
    /// the record once they are put (waiting while the stage is full).
    async fn publish(&mut self, ticket: Ticket, outputs: Vec<Output>) {
        // The stage outlives dispatch (it ends when its inbox closes), so
        // this only fails if it died; the record then stays unsettled and
        // is read again after a restart.
        let _ = self.publisher.send(Publish { ticket, outputs }).await;
    }

    async fn settle(&mut self, msg: SettlementMsg) {
        // Settlement outlives dispatch (it ends when the last sender is
        // dropped), so this only fails if it died; nothing can checkpoint
        // then, and the records are read again after a restart.
        let _ = self.settlement.send(msg).await;
    }
}

/// After an answered call: the records to retry, then those a run did not
/// answer, take the (empty) group's place — its buffer is reused when
/// there are none; unanswered records after no retry go on at once.
fn regroup(group: &mut Vec<Item>, mut again: Vec<Item>, mut rest: Vec<Item>) -> Split {
    let retried = !again.is_empty();
    again.append(&mut rest);
    if !again.is_empty() {
        *group = again;
    }
    if retried || group.is_empty() {
        Split::No
    } else {
        Split::Rest
    }
}

/// How a failed or answered call left its group.
enum Split {
    /// Not split: what remains in the group is tried again after a backoff.
    No,
    /// Halved for memory (or a failed run split into its records): the
    /// parts go next, at once, no attempt counted.
    Halved,
    /// What a run did not answer goes next, at once (see "Runs").
    Rest,
    /// Bisected: the halves go next, after a backoff, attempts counted.
    Bisected,
}

impl From<Delivery> for Item {
    fn from(Delivery { record, ticket }: Delivery) -> Self {
        Item {
            record,
            ticket,
            attempt: 1,
            position: 0,
        }
    }
}

/// What lowering `record` puts in the guest's memory, near enough: its
/// data and its strings (what `max_batch_bytes` counts).
/// A batch's deliveries as the lane's items, each at its first attempt.
fn items(batch: Vec<Delivery>) -> Vec<Item> {
    batch.into_iter().map(Item::from).collect()
}

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
