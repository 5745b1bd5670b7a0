//! One subscription's pipeline: its stages wired one way, and their ordered
//! shutdown.
//!
//! ```text
//!              assignments            deliveries (64)
//! lease keeper ───────────▶ reader pool ───────────▶ dispatch ──▶ plugin slot
//!   ▲   │ open/close/commit      │ open/track/close      │ settle     │ publish (acked + outputs)
//!   │   ▼                        ▼                       ▼            ▼
//!   │ state stage ◀─stage─ lanes  settlement ◀─────────────────── output stage ──▶ Kinesis
//!   └──── checkpoint requests ───────┘
//! ```
//!
//! Every arrow is a typed, bounded channel owned by the stage that sends:
//! the keeper says which shards to read ([`Assignment`]), the pool's
//! readers put records into the channel and tell settlement what they read,
//! dispatch's lanes call the plugin and tell settlement what settled (or,
//! for an acked record with outputs, hand it to the output stage, which
//! settles it once its outputs are put), and settlement asks the keeper
//! for checkpoints. Records flow one way. Two things flow back, neither
//! carrying records: settlement's checkpoint requests to the keeper, and
//! the keeper's calls into the state stage (when the subscription keeps
//! state) through [`CheckpointState`], the seam `lease` defines and
//! `state` implements: the keeper opens and closes a shard's state as it
//! takes and loses the lease, and takes the state writes that go with each
//! checkpoint into the same fenced write. The lanes stage acked records'
//! writes in the same state stage.
//!
//! # Shutdown
//! [`Pipeline::shutdown`] stops the keeper and lets the rest follow, each
//! stage ending when its input ends:
//! 1. the keeper takes no more leases and closes its assignments;
//! 2. the pool stops every reader (each tells settlement how far it got)
//!    and ends, so the channel closes once empty;
//! 3. dispatch drains the channel and ends, bounded by its share of
//!    `shutdown_timeout` (all of it but a quarter, at most 2 s, kept for
//!    steps 4 and 5; past it, `hard_stop` ends it where it is and
//!    unhandled records stay unsettled); then the output stage puts what
//!    it holds and ends (bounded by the same `hard_stop`);
//! 4. settlement, its senders gone, requests each shard's final checkpoint
//!    and ends;
//! 5. the keeper writes those checkpoints, releases every lease (so another
//!    instance can take over at once), and ends when the requests end.
//!
//! The whole is bounded by `shutdown_timeout`, whatever the stores and
//! Kinesis do: a stage still stopping then is cut (the next owner reads
//! its unsettled records again; its leases lapse). [`Pipeline::stop_now`]
//! is the same without the drain, for a subscription that must not handle
//! one more record here.
//!
//! Floor 10 (wiring) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::channel::{self, DeliveryReceiver, DeliverySender};
use crate::config::{LeaseConfig, SubscriptionConfig};
use crate::dispatch::{Dispatcher, HandlerFactory};
use crate::failure::{DeadLetterSink, DeadLetters, Policy, Quarantine};
use crate::ids::{OwnerId, SubscriptionName};
use crate::kinesis::{ConsumerArn, Kinesis};
use crate::lease::{
    ASSIGNMENT_QUEUE, Assignment, CHECKPOINT_QUEUE, CheckpointState, Keeper, LeaseStore,
    ShardSource,
};
use crate::outputs::{OutputStage, PUBLISH_QUEUE, PutRecords};
use crate::reader::filter_feed::FilterFeed;
use crate::reader::pool::ReaderPool;
use crate::reader::range::Range;
use crate::reader::{BeforeRead, Decode, FanOut, ReaderContext, ShardReads, ShardSubscriber};
use crate::settlement::{SETTLEMENT_QUEUE, Settlement, SettlementMsg};
use crate::slot::PluginSlot;
use crate::state::{StateMetrics, StateStage};
use crate::telemetry::{SubscriptionStatus, Telemetry};

/// What a subscription's pipeline is built from.
pub(crate) struct Parts<F = PluginSlot> {
    /// The subscription.
    pub subscription: Arc<SubscriptionConfig>,
    /// Its plugin versions (hot-swapped, canary), which the rollout stage
    /// keeps on the fleet's versions (a replay's runs the one version it
    /// was given); `shardlane test` wraps it to print every call.
    pub slot: Arc<F>,
    /// Where records come from and effects go.
    pub source: Source,
    /// The lease store every subscription of this process shares.
    pub store: Arc<dyn LeaseStore>,
    /// How leases are held.
    pub lease: LeaseConfig,
    /// This instance.
    pub owner: OwnerId,
    /// Metrics and status.
    pub telemetry: Arc<Telemetry>,
    /// A replay's range (see `crate::reader::range`); `None` for the
    /// service.
    pub range: Option<Arc<Range>>,
    /// What readers do to records before handing them out (a redrive
    /// decodes dead-letter envelopes); `None` for the service.
    pub decode: Option<Arc<dyn Decode>>,
    /// The filter readers apply, as the rollout stage swaps it (a
    /// replay's, a redrive's and `shardlane test`'s never changes).
    pub filter: FilterFeed,
}

/// Where a pipeline's records come from and its effects go.
pub(crate) enum Source {
    /// A Kinesis stream: the service, a replay, a redrive.
    Kinesis {
        /// Kinesis.
        kinesis: Kinesis,
        /// The stream consumer to read through, when reading by enhanced
        /// fan-out.
        fan_out: Option<ConsumerArn>,
        /// Where outputs and dead letters go instead of Kinesis (a dry
        /// run captures them); `None`: to Kinesis.
        effects: Option<Effects>,
    },
    /// Records from elsewhere (`shardlane test`'s file): its shards, its
    /// reads, and where its effects go. Nothing of it reaches AWS.
    Given {
        /// The shards (the keeper's listing).
        shards: Arc<dyn ShardSource>,
        /// Their records (the readers' reads).
        reads: Arc<dyn ShardReads>,
        /// Outputs and dead letters.
        effects: Effects,
    },
}

/// Where a pipeline's effects go when not to Kinesis.
#[derive(Clone)]
pub(crate) struct Effects {
    /// Outputs of acked records.
    pub outputs: Arc<dyn PutRecords>,
    /// Dead letters, for a subscription with `on_failure = "dead_letter"`.
    pub dead_letters: Arc<dyn DeadLetterSink>,
}

/// A running subscription (module docs).
pub(crate) struct Pipeline {
    name: SubscriptionName,
    shutdown_timeout: Duration,
    /// Stops the keeper: the start of the ordered shutdown.
    stop: CancellationToken,
    /// Cuts dispatch short once its share of `shutdown_timeout` has
    /// passed.
    hard_stop: CancellationToken,
    keeper: JoinHandle<()>,
    readers: JoinHandle<()>,
    dispatch: JoinHandle<()>,
    outputs: JoinHandle<()>,
    settlement: JoinHandle<()>,
}

/// The share of `shutdown_timeout` dispatch drains for: the rest is kept
/// for the final checkpoints and releases, a quarter of it, at most 2 s.
fn drain_share(shutdown_timeout: Duration) -> Duration {
    shutdown_timeout - (shutdown_timeout / 4).min(Duration::from_secs(2))
}

/// Reports how full the subscription channel is at every scrape.
fn report_fill(telemetry: &Telemetry, sub: &SubscriptionConfig, deliveries: &DeliveryReceiver) {
    let fill = telemetry.gauge(
        "shardlane_channel_fill",
        "Deliveries waiting in the subscription channel (capacity 64).",
        &[("subscription", sub.name.as_str())],
    );
    let watched = deliveries.clone();
    telemetry.on_render(move || fill.set(watched.len() as u64));
}

/// The subscription's failure policy, its dead letters put to Kinesis
/// (or where `source` says), with its quarantine (`quarantine` makes it
/// from its sink).
fn failure_policy(
    sub: &SubscriptionConfig,
    source: &Source,
    quarantine: impl FnOnce(Arc<dyn DeadLetterSink>) -> Arc<Quarantine>,
) -> Policy {
    Policy::with_quarantine(
        &sub.failure,
        |stream| match source {
            Source::Kinesis {
                kinesis,
                effects: None,
                ..
            } => Arc::new(DeadLetters::new(
                kinesis.clone(),
                stream.clone(),
                sub.name.clone(),
            )),
            Source::Kinesis {
                effects: Some(effects),
                ..
            }
            | Source::Given { effects, .. } => effects.dead_letters.clone(),
        },
        quarantine,
    )
}

/// The state stage, when the subscription keeps state.
fn state_stage(
    sub: &SubscriptionConfig,
    store: &Arc<dyn LeaseStore>,
    telemetry: &Telemetry,
) -> Option<Arc<StateStage>> {
    sub.sandbox.grants.state.as_ref().map(|config| {
        Arc::new(StateStage::new(
            sub.name.clone(),
            config.clone(),
            store.clone(),
            StateMetrics::new(telemetry, sub.name.as_str()),
        ))
    })
}

impl<F> Parts<F> {
    /// The failure policy, its quarantine reporting to `status`.
    fn policy(&self, status: &Arc<SubscriptionStatus>) -> Policy {
        let sub = &self.subscription;
        failure_policy(sub, &self.source, |sink| {
            Arc::new(Quarantine::new(
                sub.name.clone(),
                self.store.clone(),
                sink,
                sub.failure.quarantine,
                self.owner.clone(),
                &self.telemetry,
                status.clone(),
            ))
        })
    }

    /// Where acked records' outputs go: Kinesis, or a dry run's capture.
    fn outputs_sink(&self) -> Arc<dyn PutRecords> {
        match &self.source {
            Source::Kinesis {
                kinesis,
                effects: None,
                ..
            } => Arc::new(kinesis.clone()),
            Source::Kinesis {
                effects: Some(effects),
                ..
            }
            | Source::Given { effects, .. } => effects.outputs.clone(),
        }
    }

    /// What the reader pool's readers share.
    fn reader_context(
        &self,
        deliveries: DeliverySender,
        settlement: mpsc::Sender<SettlementMsg>,
        status: Arc<SubscriptionStatus>,
        before_read: Option<Arc<dyn BeforeRead>>,
    ) -> ReaderContext {
        let (reads, fan_out): (Arc<dyn ShardReads>, _) = match &self.source {
            Source::Kinesis {
                kinesis, fan_out, ..
            } => (
                Arc::new(kinesis.clone()),
                fan_out.clone().map(|consumer| {
                    Arc::new(FanOut {
                        kinesis: kinesis.clone(),
                        consumer,
                    }) as Arc<dyn ShardSubscriber>
                }),
            ),
            Source::Given { reads, .. } => (reads.clone(), None),
        };
        ReaderContext {
            reads,
            fan_out,
            subscription: self.subscription.clone(),
            deliveries,
            settlement,
            telemetry: self.telemetry.clone(),
            status,
            range: self.range.clone(),
            before_read,
            decode: self.decode.clone(),
            filter: self.filter.clone(),
        }
    }

    /// The lease keeper, committing `state`'s writes with its checkpoints.
    fn keeper(&self, status: Arc<SubscriptionStatus>, state: Option<Arc<StateStage>>) -> Keeper {
        let shards: Arc<dyn ShardSource> = match &self.source {
            Source::Kinesis { kinesis, .. } => Arc::new(kinesis.clone()),
            Source::Given { shards, .. } => shards.clone(),
        };
        Keeper::new(
            self.subscription.clone(),
            self.lease.clone(),
            self.owner.clone(),
            self.store.clone(),
            shards,
            status,
            self.telemetry.clone(),
        )
        .with_state(state.map(|s| s as Arc<dyn CheckpointState>))
    }
}

impl Pipeline {
    /// Wires and starts the stages of one subscription (module docs).
    pub(crate) fn start<F: HandlerFactory>(parts: Parts<F>) -> Self {
        let (sub, telemetry) = (parts.subscription.clone(), parts.telemetry.clone());
        let status = telemetry.subscription(&sub.name, sub.mode());
        let (deliveries_tx, deliveries_rx) = channel::channel();
        let (settle_tx, settle_rx) = mpsc::channel(SETTLEMENT_QUEUE);
        let (checkpoint_tx, checkpoint_rx) = mpsc::channel(CHECKPOINT_QUEUE);
        let (assign_tx, assign_rx) = mpsc::channel::<Assignment>(ASSIGNMENT_QUEUE);
        let (publish_tx, publish_rx) = mpsc::channel(PUBLISH_QUEUE);
        report_fill(&telemetry, &sub, &deliveries_rx);
        let (stop, hard_stop) = (CancellationToken::new(), CancellationToken::new());
        let settlement = Settlement::new(sub.name.clone(), sub.checkpoint_every, checkpoint_tx)
            .with_telemetry(&telemetry);
        let state = state_stage(&sub, &parts.store, &telemetry);
        let policy = parts.policy(&status);
        let before_read = policy
            .quarantine()
            .cloned()
            .map(|q| q as Arc<dyn BeforeRead>);
        let dispatcher = Dispatcher::new(
            sub.clone(),
            parts.slot.clone(),
            policy,
            settle_tx.clone(),
            publish_tx,
            telemetry.clone(),
        )
        .with_state(state.clone());
        let outputs = OutputStage::new(
            sub.name.clone(),
            sub.sandbox.grants.outputs.iter().cloned(),
            parts.outputs_sink(),
            settle_tx.clone(),
            &telemetry,
        );
        let readers = parts.reader_context(deliveries_tx, settle_tx, status.clone(), before_read);
        let keeper = parts.keeper(status, state);
        Self {
            name: sub.name.clone(),
            shutdown_timeout: sub.shutdown_timeout,
            settlement: tokio::spawn(settlement.run(settle_rx)),
            dispatch: tokio::spawn(dispatcher.run(deliveries_rx, hard_stop.clone())),
            outputs: tokio::spawn(outputs.run(publish_rx, hard_stop.clone())),
            readers: tokio::spawn(ReaderPool::new(readers).run(assign_rx)),
            keeper: tokio::spawn(keeper.run(assign_tx, checkpoint_rx, stop.clone())),
            stop,
            hard_stop,
        }
    }

    /// Shuts the pipeline down in order (module docs) and waits for every
    /// stage, all within `shutdown_timeout`: dispatch drains for its share
    /// ([`drain_share`]), and whatever is still under way when the whole
    /// has passed (a store or Kinesis that does not answer) is dropped —
    /// unsettled records are read again by the next owner, leases not
    /// released lapse. False when a stage's task failed or was cut (it is
    /// logged).
    pub(crate) async fn shutdown(self) -> bool {
        let drain = drain_share(self.shutdown_timeout);
        self.stop_within(drain).await
    }

    /// Stops the pipeline at once: dispatch is cut where it is (records
    /// in flight stay unsettled, for the next owner to read again), then
    /// the rest stops in order — final checkpoints of what settled, leases
    /// released — within `shutdown_timeout`. For a subscription that must
    /// not handle one more record here (its version cannot run here).
    pub(crate) async fn stop_now(self) -> bool {
        self.stop_within(Duration::ZERO).await
    }

    async fn stop_within(self, drain: Duration) -> bool {
        self.stop.cancel();
        let hard_stop = self.hard_stop.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(drain).await;
            hard_stop.cancel();
        });
        let name = self.name.clone();
        let mut stages = [
            ("readers", self.readers),
            ("dispatch", self.dispatch),
            ("outputs", self.outputs),
            ("settlement", self.settlement),
            ("lease keeper", self.keeper),
        ];
        let joined = tokio::time::timeout(self.shutdown_timeout, async {
            let mut ok = true;
            for (stage, task) in &mut stages {
                if let Err(e) = task.await {
                    ok = false;
                    tracing::error!(subscription = %name, stage = *stage, error = %e, "task failed");
                }
            }
            ok
        })
        .await;
        timer.abort();
        match joined {
            Ok(ok) => ok,
            Err(_) => {
                for (stage, task) in &stages {
                    if !task.is_finished() {
                        tracing::error!(subscription = %name, stage = *stage, timeout = ?self.shutdown_timeout, "still stopping when shutdown_timeout ran out: cut (unsettled records are read again by the next owner; leases not released lapse)");
                        task.abort();
                    }
                }
                false
            }
        }
    }
}
