//! Dispatch: takes deliveries off the subscription channel and runs the
//! handler on them.
//!
//! Sequential mode (the default): one loop owns one plugin [`Instance`] and
//! handles one record at a time, in channel order, so every shard keeps its
//! order and nothing runs side by side.
//!
//! Per record: `ack` and `reject` settle it; `retry`, a trap and a timeout
//! deliver the same record again, with `attempt` + 1 and a jittered,
//! doubling backoff, before anything after it on this loop is handled (never
//! skipped). After a trap or timeout the instance is dropped and a fresh one
//! made from the pre-instantiated component.
//!
//! Shutdown: the loop ends when the channel is closed and empty (all readers
//! stopped), or at once when `hard_stop` fires (the shutdown timeout): a
//! record cut off there has not settled, so the checkpoint stays below it
//! and it is read again after a restart.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::channel::{Delivery, DeliveryReceiver};
use crate::config::SubscriptionConfig;
use crate::plugin::{CallError, Instance, Outcome, Plugin};
use crate::settlement::{SettlementMsg, SettlementSender};

/// The dispatch stage of one subscription.
pub struct Dispatcher {
    subscription: Arc<SubscriptionConfig>,
    plugin: Arc<Plugin>,
    settlement: SettlementSender,
    instance: Option<Instance>,
}

impl Dispatcher {
    /// A dispatcher calling `plugin` and settling through `settlement`.
    pub fn new(
        subscription: Arc<SubscriptionConfig>,
        plugin: Arc<Plugin>,
        settlement: SettlementSender,
    ) -> Self {
        Self {
            subscription,
            plugin,
            settlement,
            instance: None,
        }
    }

    /// Runs until the channel is closed and drained, or `hard_stop`.
    pub async fn run(mut self, mut deliveries: DeliveryReceiver, hard_stop: CancellationToken) {
        loop {
            let delivery = tokio::select! {
                biased;
                _ = hard_stop.cancelled() => break,
                d = deliveries.recv() => match d {
                    Some(d) => d,
                    None => break,
                },
            };
            if !self.deliver(delivery, &hard_stop).await {
                break;
            }
        }
        let left = deliveries.len();
        if left > 0 {
            tracing::warn!(subscription = %self.subscription.name, left, "shutdown timeout: records left unhandled will be read again");
        }
    }

    /// Handles one record until it settles. False when `hard_stop` cut it
    /// off.
    async fn deliver(&mut self, delivery: Delivery, hard_stop: &CancellationToken) -> bool {
        let Delivery { record, ticket } = delivery;
        let sub = &self.subscription;
        let mut backoff = Backoff::new(sub.retry_backoff_initial, sub.retry_backoff_max);
        let mut attempt: u32 = 1;
        loop {
            let instance = match self.instance.as_mut() {
                Some(instance) => instance,
                None => {
                    let made = tokio::select! {
                        _ = hard_stop.cancelled() => return false,
                        made = self.plugin.instantiate() => made,
                    };
                    match made {
                        Ok(instance) => self.instance.insert(instance),
                        Err(e) => {
                            tracing::error!(subscription = %sub.name, error = %e, "cannot instantiate plugin; retrying");
                            if !sleep(backoff.next_wait(), hard_stop).await {
                                return false;
                            }
                            continue;
                        }
                    }
                }
            };
            let result = tokio::select! {
                _ = hard_stop.cancelled() => return false,
                r = instance.handle(&record, attempt, sub.handler_timeout) => r,
            };
            let fields = (
                sub.name.as_str(),
                record.shard.as_str(),
                record.sequence.as_str(),
            );
            match result {
                Ok(Outcome::Ack) => break,
                Ok(Outcome::Reject(reason)) => {
                    tracing::warn!(
                        subscription = fields.0,
                        shard_id = fields.1,
                        sequence_number = fields.2,
                        attempt,
                        reason,
                        "record rejected by the handler; settled"
                    );
                    break;
                }
                Ok(Outcome::Retry(reason)) => {
                    tracing::info!(
                        subscription = fields.0,
                        shard_id = fields.1,
                        sequence_number = fields.2,
                        attempt,
                        reason,
                        "handler asked to retry"
                    );
                }
                Err(e @ (CallError::Trap(_) | CallError::Timeout(_))) => {
                    tracing::warn!(subscription = fields.0, shard_id = fields.1, sequence_number = fields.2, attempt, error = %e, "handler failed; instance recycled, record will be retried");
                    self.instance = None;
                }
                Err(e) => {
                    tracing::error!(subscription = fields.0, shard_id = fields.1, sequence_number = fields.2, attempt, error = %e, "handler call failed; record will be retried");
                    self.instance = None;
                }
            }
            attempt = attempt.saturating_add(1);
            if !sleep(backoff.next_wait(), hard_stop).await {
                return false;
            }
        }
        // Settlement outlives dispatch (it ends when we drop our sender), so
        // this only fails if it died, in which case nothing can checkpoint.
        let _ = self.settlement.send(SettlementMsg::Settle(ticket)).await;
        true
    }
}

async fn sleep(wait: std::time::Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}
