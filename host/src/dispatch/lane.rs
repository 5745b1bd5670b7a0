//! One lane: one handler instance, one record or batch at a time, retries in
//! place (see [`super`] for the rules).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::batch::BatchCollector;
use super::{Handler, HandlerFactory};
use crate::backoff::Backoff;
use crate::channel::{Delivery, DeliveryReceiver, Record};
use crate::config::SubscriptionConfig;
use crate::ids::LaneId;
use crate::plugin::{CallError, Outcome};
use crate::settlement::{SettlementMsg, SettlementSender, Ticket};

pub(super) struct Lane<F: HandlerFactory> {
    id: LaneId,
    subscription: Arc<SubscriptionConfig>,
    factory: Arc<F>,
    handler: Option<F::Handler>,
    settlement: SettlementSender,
}

/// What became of one call, for the retry loop.
enum Verdict {
    /// Keep the instance.
    Keep,
    /// Drop the instance (trap, timeout): a fresh one is made for the retry.
    Recycle,
}

impl<F: HandlerFactory> Lane<F> {
    pub(super) fn new(
        id: LaneId,
        subscription: Arc<SubscriptionConfig>,
        factory: Arc<F>,
        settlement: SettlementSender,
    ) -> Self {
        Self {
            id,
            subscription,
            factory,
            handler: None,
            settlement,
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
            Some(batch) => {
                self.run_batches(inbox, hard_stop, batch.size, batch.window)
                    .await
            }
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
        size: usize,
        window: Duration,
    ) {
        let mut collector = BatchCollector::new(size, window);
        loop {
            let deadline = collector.deadline();
            let batch = tokio::select! {
                biased;
                _ = hard_stop.cancelled() => return,
                _ = sleep_until(deadline), if deadline.is_some() => collector.flush(),
                d = inbox.recv() => match d {
                    Ok(d) => collector.push(d, Instant::now()),
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
            let made = tokio::select! {
                _ = stop.cancelled() => return None,
                made = self.factory.create(self.id) => made,
            };
            match made {
                Ok(handler) => self.handler = Some(handler),
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

    fn failed(&mut self, error: &CallError, record: &Record, attempt: u32) -> Verdict {
        let sub = self.subscription.name.as_str();
        match error {
            CallError::Trap(_) | CallError::Timeout(_) => {
                tracing::warn!(subscription = sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, error = %error, "handler failed; instance recycled, will retry");
                Verdict::Recycle
            }
            CallError::WrongOutcomeCount { .. } => {
                tracing::error!(subscription = sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, error = %error, "guest error: the whole batch will be retried");
                Verdict::Keep
            }
            CallError::WrongWorld(_) => {
                tracing::error!(subscription = sub, lane = self.id.0, error = %error, "plugin world does not fit the subscription; will retry");
                Verdict::Recycle
            }
        }
    }

    /// Handles one record until it settles. False when `hard_stop` cut it
    /// off.
    async fn deliver(&mut self, delivery: Delivery, hard_stop: &CancellationToken) -> bool {
        let Delivery { record, ticket } = delivery;
        let mut backoff = self.backoff();
        let mut attempt: u32 = 1;
        loop {
            let Some(handler) = self.handler(&mut backoff, hard_stop).await else {
                return false;
            };
            let result = tokio::select! {
                _ = hard_stop.cancelled() => return false,
                r = handler.handle(&record, attempt) => r,
            };
            match result {
                Ok(Outcome::Ack) => break,
                Ok(Outcome::Reject(reason)) => {
                    tracing::warn!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, reason, "record rejected by the handler; settled");
                    break;
                }
                Ok(Outcome::Retry(reason)) => {
                    tracing::info!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, reason, "handler asked to retry");
                }
                Err(e) => {
                    if let Verdict::Recycle = self.failed(&e, &record, attempt) {
                        self.handler = None;
                    }
                }
            }
            attempt = attempt.saturating_add(1);
            if !sleep(backoff.next_wait(), hard_stop).await {
                return false;
            }
        }
        self.settle(SettlementMsg::Settle(ticket)).await;
        true
    }

    /// Handles a batch until every record in it settles: records the handler
    /// retried are called again, alone, before the lane takes new ones.
    /// False when `hard_stop` cut it off.
    async fn deliver_batch(&mut self, batch: Vec<Delivery>, hard_stop: &CancellationToken) -> bool {
        let mut tickets: Vec<Ticket> = Vec::with_capacity(batch.len());
        let mut pending: Vec<(Arc<Record>, u32)> = Vec::with_capacity(batch.len());
        for Delivery { record, ticket } in batch {
            pending.push((record, 1));
            tickets.push(ticket);
        }
        let mut backoff = self.backoff();
        while !pending.is_empty() {
            let Some(handler) = self.handler(&mut backoff, hard_stop).await else {
                return false;
            };
            let result = tokio::select! {
                _ = hard_stop.cancelled() => return false,
                r = handler.handle_batch(&pending) => r,
            };
            match result {
                Ok(outcomes) => {
                    let mut settled = Vec::with_capacity(outcomes.len());
                    let mut retry_records = Vec::new();
                    let mut retry_tickets = Vec::new();
                    for (((record, attempt), ticket), outcome) in
                        pending.drain(..).zip(tickets.drain(..)).zip(outcomes)
                    {
                        match outcome {
                            Outcome::Ack => settled.push(ticket),
                            Outcome::Reject(reason) => {
                                tracing::warn!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, reason, "record rejected by the handler; settled");
                                settled.push(ticket);
                            }
                            Outcome::Retry(reason) => {
                                tracing::info!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, reason, "handler asked to retry");
                                retry_records.push((record, attempt.saturating_add(1)));
                                retry_tickets.push(ticket);
                            }
                        }
                    }
                    if !settled.is_empty() {
                        self.settle(SettlementMsg::SettleMany(settled)).await;
                    }
                    pending = retry_records;
                    tickets = retry_tickets;
                }
                Err(e) => {
                    if let Verdict::Recycle = self.failed(&e, &pending[0].0, pending[0].1) {
                        self.handler = None;
                    }
                    for (_, attempt) in &mut pending {
                        *attempt = attempt.saturating_add(1);
                    }
                }
            }
            if !pending.is_empty() && !sleep(backoff.next_wait(), hard_stop).await {
                return false;
            }
        }
        true
    }

    async fn settle(&mut self, msg: SettlementMsg) {
        // Settlement outlives dispatch (it ends when the last sender is
        // dropped), so this only fails if it died; nothing can checkpoint
        // then, and the records are read again after a restart.
        let _ = self.settlement.send(msg).await;
    }
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
