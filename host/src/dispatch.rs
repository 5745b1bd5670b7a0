//! Dispatch: takes deliveries off the subscription channel and spreads them
//! over lanes, each lane owning one handler instance.
//!
//! # Modes
//! - **Sequential** (default): one lane takes from the channel directly and
//!   handles one record (or batch) at a time, in arrival order: every shard
//!   keeps its order and nothing runs side by side.
//! - **`workers = n`**: n lanes take from the channel directly (it is
//!   multi-consumer), each whenever it is free: up to n calls at once, in no
//!   particular order. A slow call holds only its own lane.
//! - **`workers = n, by_key = true`**: a router (this task) takes from the
//!   channel and sends each record to the lane its partition key hashes to
//!   ([`routing`]), into that lane's bounded inbox of [`LANE_INBOX`]
//!   deliveries. A key's records never spread over two lanes, so the order
//!   Kinesis keeps for a key is kept. Lanes fewer than keys serve several keys
//!   each.
//!
//! # Head-of-line behaviour (by_key)
//! The router hands records out in channel order. When the lane a record
//! needs has a full inbox (its handler is slow, or retrying a record), the
//! router waits for that lane; meanwhile the other lanes finish their inboxes
//! and then idle, the channel fills, and every reader waits. One slow key
//! therefore slows the whole subscription down to its pace once its lane's
//! inbox is full — the price of never reordering a key and of bounded
//! memory. The inbox size decides how much a lane may lag before that
//! happens.
//!
//! # Batches
//! With `batch_size`, each lane collects up to `batch_size` deliveries, or
//! what arrived within `batch_window` of the batch's first one
//! ([`batch::BatchCollector`]), and calls `handle-batch`. A batch may mix
//! shards; each record settles by its own outcome. In by_key mode each lane
//! batches only its own keys, so per-key order holds across batches.
//! While a batch is open its lane is woken by what would fill it, or by its
//! window's end, not by each record ("Waking per fill" in [`lane`]).
//!
//! # Retries and failures
//! `ack` and `reject` settle a record. `retry`, a trap and a timeout deliver
//! the same record again on the same lane, with `attempt` + 1 after a
//! jittered, doubling backoff, before anything after it on that lane (a
//! batch's retried records are called again, alone, before the lane takes
//! new ones). After a trap or timeout the lane drops its instance and makes a
//! fresh one. A batch answered with the wrong number of outcomes fails as a
//! whole (a guest error) and is retried.
//!
//! # Shutdown
//! Lanes end when the channel is closed and drained (all readers stopped),
//! or at once when `hard_stop` fires (the shutdown timeout): a record cut off
//! there has not settled, so the checkpoint stays below it.
//!
//! # Spans
//! Every handler call runs in a `process` span (target
//! [`spans::TARGET`](crate::telemetry::spans::TARGET)) with OpenTelemetry's
//! messaging fields ([`crate::telemetry::spans`]), so what a guest logs
//! during a call carries the call's context.
//!
//! The handler is abstract ([`handler`]: [`HandlerFactory`], [`Handler`],
//! in dispatch's own [`Outcome`] and [`CallError`]): a Wasm plugin in the
//! service, a native no-op in the dispatch benchmark, a scripted handler
//! in the lane's unit tests.
//!
//! Floor 7 (dispatch) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod batch;
mod handler;
mod lane;
pub(crate) mod routing;

#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) use crate::outputs::Output;
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) use handler::{CallError, Handled, Handler, HandlerFactory, Outcome};

use std::sync::Arc;

use async_channel::TrySendError;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::channel::{DeliveryReceiver, DeliverySender};
use crate::config::{DispatchMode, SubscriptionConfig};
use crate::failure::Policy;
use crate::ids::LaneId;
use crate::outputs::PublishSender;
use crate::settlement::SettlementSender;
use crate::state::StateStage;
use crate::telemetry::{SubscriptionStatus, Telemetry};
use lane::{Lane, LaneMetrics};

/// Deliveries a by_key lane's inbox holds before the router waits for it
/// (see "Head-of-line behaviour"). Enough to keep a lane busy while the
/// router serves the others; small, since it adds to what is read ahead.
pub const LANE_INBOX: usize = 32;

/// The dispatch stage of one subscription.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Dispatcher<F> {
    subscription: Arc<SubscriptionConfig>,
    factory: Arc<F>,
    policy: Arc<Policy>,
    settlement: SettlementSender,
    publisher: PublishSender,
    telemetry: Arc<Telemetry>,
    status: Arc<SubscriptionStatus>,
    state: Option<Arc<StateStage>>,
}

impl<F: HandlerFactory> Dispatcher<F> {
    /// A dispatcher calling handlers from `factory`, giving up on records
    /// by `policy`, settling through `settlement`, and handing acked
    /// records with outputs to `publisher` (the output stage), which
    /// settles them once their outputs are put.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn new(
        subscription: Arc<SubscriptionConfig>,
        factory: Arc<F>,
        policy: Policy,
        settlement: SettlementSender,
        publisher: PublishSender,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let status = telemetry.subscription(&subscription.name, subscription.mode());
        Self {
            subscription,
            factory,
            policy: Arc::new(policy),
            settlement,
            publisher,
            telemetry,
            status,
            state: None,
        }
    }

    /// Gives every lane the subscription's per-key state.
    pub(crate) fn with_state(mut self, state: Option<Arc<StateStage>>) -> Self {
        self.state = state;
        self
    }

    fn lane(&self, id: usize) -> Lane<F> {
        Lane::new(
            LaneId(id as u32),
            self.subscription.clone(),
            self.policy.clone(),
            self.factory.clone(),
            self.settlement.clone(),
            self.publisher.clone(),
            LaneMetrics::new(
                &self.telemetry,
                &self.status,
                self.subscription.name.as_str(),
                id as u32,
            ),
        )
        .with_state(self.state.clone())
    }

    /// Runs until the channel is closed and drained, or `hard_stop`.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) async fn run(self, deliveries: DeliveryReceiver, hard_stop: CancellationToken) {
        let mut lanes = JoinSet::new();
        match self.subscription.dispatch {
            DispatchMode::Sequential | DispatchMode::Workers(_) => {
                for id in 0..self.subscription.dispatch.lanes() {
                    lanes.spawn(self.lane(id).run(deliveries.clone(), hard_stop.clone()));
                }
                drop(deliveries);
            }
            DispatchMode::ByKey(n) => {
                let mut inboxes = Vec::with_capacity(n);
                for id in 0..n {
                    let (tx, rx) = crate::channel::bounded(LANE_INBOX);
                    inboxes.push(tx);
                    lanes.spawn(self.lane(id).run(rx, hard_stop.clone()));
                }
                route_by_key(&deliveries, &inboxes, &hard_stop).await;
                // Dropping the inboxes' senders lets each lane drain and end.
            }
        }
        while let Some(joined) = lanes.join_next().await {
            if let Err(e) = joined {
                tracing::error!(subscription = %self.subscription.name, error = %e, "lane task failed");
            }
        }
    }
}

/// Moves deliveries from the channel into their key's lane inbox until the
/// channel is closed and drained, or `hard_stop`. What already waits is
/// moved without a `select!` per delivery (each would register a waiter
/// for `hard_stop` and drop it again); it waits only on an empty channel
/// or a full inbox.
async fn route_by_key(
    deliveries: &DeliveryReceiver,
    inboxes: &[DeliverySender],
    hard_stop: &CancellationToken,
) {
    let stopped = hard_stop.cancelled();
    tokio::pin!(stopped);
    loop {
        if hard_stop.is_cancelled() {
            return;
        }
        let work = match deliveries.try_recv() {
            Some(work) => work,
            None => tokio::select! {
                biased;
                _ = &mut stopped => return,
                d = deliveries.recv() => match d {
                    Ok(d) => d,
                    Err(_) => return,
                },
            },
        };
        let inbox = &inboxes[work
            .routing_key()
            .map_or(0, |key| routing::lane_for(key, inboxes.len()))];
        let work = match inbox.try_send(work) {
            Ok(()) => continue,
            Err(TrySendError::Full(work)) => work,
            // A lane only closes its inbox by ending, which it does only
            // on hard_stop: nothing more can be handled.
            Err(TrySendError::Closed(_)) => return,
        };
        tokio::select! {
            biased;
            _ = &mut stopped => return,
            sent = inbox.send(work) => if sent.is_err() {
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests;
