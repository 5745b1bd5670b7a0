//! A loaded plugin and its instances: [`Plugin`] is compiled, linked and
//! pre-instantiated (shared by a subscription's lanes); an [`Instance`] is
//! one store and instance, owned by one lane, and implements the dispatch
//! seam ([`Handler`]) by calling the guest.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Engine, Store};

use super::bindings::{v1, v2, v3};
use super::epoch::Ticker;
use super::error::one_line;
use super::host::{CallContext, HostState, HttpMetrics};
use super::{Contract, PluginError, World};
use crate::channel::{Record, WindowClose};
use crate::config::SandboxConfig;
use crate::dispatch::{CallError, Handled, Handler, HandlerFactory, Outcome};
use crate::ids::{LaneId, PluginDigest, SubscriptionName};
use crate::state::CallState;

/// A pre-instantiated component, in its contract version and world.
pub(super) enum PluginPre {
    V1Record(v1::record::RecordHandlerPre<HostState>),
    V1Batch(v1::batch::BatchHandlerPre<HostState>),
    V2Record(v2::record::RecordHandlerPre<HostState>),
    V2Batch(v2::batch::BatchHandlerPre<HostState>),
    V3Record(v3::record::RecordHandlerPre<HostState>),
    V3Batch(v3::batch::BatchHandlerPre<HostState>),
    V3WindowedRecord(v3::windowed_record::WindowedRecordHandlerPre<HostState>),
    V3WindowedBatch(v3::windowed_batch::WindowedBatchHandlerPre<HostState>),
}

/// A compiled, linked, pre-instantiated plugin: immutable, shared by every
/// lane of its subscription.
pub struct Plugin {
    path: PathBuf,
    digest: PluginDigest,
    world: World,
    contract: Contract,
    pre: PluginPre,
    http_metrics: HttpMetrics,
    engine: Engine,
    ticker: Ticker,
    subscription: SubscriptionName,
    handler_timeout: Duration,
    sandbox: SandboxConfig,
    fuel_metering: bool,
}

impl Plugin {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        path: PathBuf,
        digest: PluginDigest,
        world: World,
        contract: Contract,
        pre: PluginPre,
        http_metrics: HttpMetrics,
        engine: Engine,
        ticker: Ticker,
        subscription: SubscriptionName,
        handler_timeout: Duration,
        sandbox: SandboxConfig,
        fuel_metering: bool,
    ) -> Self {
        Self {
            path,
            digest,
            world,
            contract,
            pre,
            http_metrics,
            engine,
            ticker,
            subscription,
            handler_timeout,
            sandbox,
            fuel_metering,
        }
    }

    /// The world it implements.
    pub fn world(&self) -> World {
        self.world
    }

    /// The contract version it targets.
    pub fn contract(&self) -> Contract {
        self.contract
    }

    /// Its digest.
    pub fn digest(&self) -> &PluginDigest {
        &self.digest
    }

    /// Whether it implements a windowed world (exports `close-window`).
    pub fn windowed(&self) -> bool {
        matches!(
            self.pre,
            PluginPre::V3WindowedRecord(_) | PluginPre::V3WindowedBatch(_)
        )
    }

    /// The world it implements, by its full name: [`Plugin::world`], and
    /// `windowed-` before it when it exports `close-window`. Two versions
    /// can replace one another only when these are equal.
    pub fn world_name(&self) -> String {
        let windowed = if self.windowed() { "windowed-" } else { "" };
        format!("{windowed}{}", self.world)
    }

    /// Why it cannot serve a subscription with (or without) `window`, as
    /// the end of a one-line error; `None` when it fits.
    pub fn window_misfit(&self, window: Option<&crate::windows::WindowSpec>) -> Option<String> {
        match (self.windowed(), window) {
            (true, None) => Some(format!(
                "{} exports close-window, but the subscription has no window: set window = {{ size = \"60s\" }}, or build it for a world without windows",
                self.path.display()
            )),
            (false, Some(_)) => Some(format!(
                "the subscription has a window, but {} implements {}, without close-window: build it for windowed-record-handler or windowed-batch-handler (contract 0.3.0)",
                self.path.display(),
                self.world_name()
            )),
            _ => None,
        }
    }

    /// Its file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The subscription it serves.
    pub fn subscription(&self) -> &SubscriptionName {
        &self.subscription
    }

    /// A fresh instance in its own store.
    ///
    /// # Errors
    /// [`PluginError::Instantiate`] when the pool is exhausted or the
    /// guest's start-up traps.
    pub async fn instantiate(&self, lane: LaneId) -> Result<Instance, PluginError> {
        let state = HostState::new(
            &self.sandbox,
            self.subscription.clone(),
            lane,
            self.digest.clone(),
            self.http_metrics.clone(),
        )
        .map_err(|reason| PluginError::Instantiate {
            path: self.path.clone(),
            reason,
        })?;
        let mut store = Store::new(&self.engine, state);
        store.limiter(HostState::limiter);
        // Yield to the runtime at every tick: a looping guest neither holds
        // a thread nor escapes `handler_timeout`.
        store.epoch_deadline_async_yield_and_update(1);
        // The guest's start-up is guest code: the epoch must tick.
        let _running = self.ticker.running();
        let instantiate_error = |e: wasmtime::Error| PluginError::Instantiate {
            path: self.path.clone(),
            reason: one_line(&e),
        };
        let exports = instantiate(&self.pre, &mut store)
            .await
            .map_err(instantiate_error)?;
        Ok(Instance {
            store,
            exports,
            ticker: self.ticker.clone(),
            timeout: self.handler_timeout,
            fuel: self
                .fuel_metering
                .then_some(self.sandbox.fuel.unwrap_or(u64::MAX)),
        })
    }
}

/// One instance of `pre` in `store`.
async fn instantiate(pre: &PluginPre, store: &mut Store<HostState>) -> wasmtime::Result<Exports> {
    Ok(match pre {
        PluginPre::V1Record(pre) => Exports::V1Record(pre.instantiate_async(store).await?),
        PluginPre::V1Batch(pre) => Exports::V1Batch(pre.instantiate_async(store).await?),
        PluginPre::V2Record(pre) => Exports::V2Record(pre.instantiate_async(store).await?),
        PluginPre::V2Batch(pre) => Exports::V2Batch(pre.instantiate_async(store).await?),
        PluginPre::V3Record(pre) => Exports::V3Record(pre.instantiate_async(store).await?),
        PluginPre::V3Batch(pre) => Exports::V3Batch(pre.instantiate_async(store).await?),
        PluginPre::V3WindowedRecord(pre) => {
            Exports::V3WindowedRecord(pre.instantiate_async(store).await?)
        }
        PluginPre::V3WindowedBatch(pre) => {
            Exports::V3WindowedBatch(pre.instantiate_async(store).await?)
        }
    })
}

enum Exports {
    V1Record(v1::record::RecordHandler),
    V1Batch(v1::batch::BatchHandler),
    V2Record(v2::record::RecordHandler),
    V2Batch(v2::batch::BatchHandler),
    V3Record(v3::record::RecordHandler),
    V3Batch(v3::batch::BatchHandler),
    V3WindowedRecord(v3::windowed_record::WindowedRecordHandler),
    V3WindowedBatch(v3::windowed_batch::WindowedBatchHandler),
}

impl Exports {
    /// The world its instance implements, by name.
    fn world(&self) -> &'static str {
        match self {
            Exports::V1Record(_) | Exports::V2Record(_) | Exports::V3Record(_) => "record-handler",
            Exports::V1Batch(_) | Exports::V2Batch(_) | Exports::V3Batch(_) => "batch-handler",
            Exports::V3WindowedRecord(_) => "windowed-record-handler",
            Exports::V3WindowedBatch(_) => "windowed-batch-handler",
        }
    }
}

/// One live instance. Not reusable after a trap or timeout: drop it and
/// instantiate afresh.
pub struct Instance {
    store: Store<HostState>,
    exports: Exports,
    /// Ticks the epoch while a call runs.
    ticker: Ticker,
    timeout: Duration,
    /// Fuel granted per call, when the engine meters fuel.
    fuel: Option<u64>,
}

/// The 0.1.0 view of a record: borrows the host's strings and bytes, which
/// are lowered straight into the guest's memory.
fn to_v1(record: &Record, attempt: u32) -> v1::KinesisRecord<'_> {
    v1::KinesisRecord {
        stream: record.stream.as_str(),
        shard_id: record.shard.as_str(),
        partition_key: record.partition_key.as_str(),
        sequence_number: record.sequence.as_str(),
        approximate_arrival: record.arrival_ms,
        data: &record.data,
        attempt,
    }
}

/// The 0.2.0 view of a record, borrowed as [`to_v1`]'s.
fn to_v2(record: &Record, attempt: u32) -> v2::KinesisRecord<'_> {
    v2::KinesisRecord {
        stream: record.stream.as_str(),
        shard_id: record.shard.as_str(),
        partition_key: record.partition_key.as_str(),
        sequence_number: record.sequence.as_str(),
        sub_sequence_number: record.sub_sequence,
        approximate_arrival: record.arrival_ms,
        data: &record.data,
        attempt,
    }
}

/// What the records of a 0.3.0 run share.
fn run_context(record: &Record) -> v3::RunContext<'_> {
    v3::RunContext {
        stream: record.stream.as_str(),
        shard_id: record.shard.as_str(),
    }
}

/// The 0.3.0 view of a record in a run, borrowed as [`to_v1`]'s.
fn to_v3_run(record: &Record, attempt: u32) -> v3::RunRecord<'_> {
    v3::RunRecord {
        partition_key: record.partition_key.as_str(),
        sequence_number: record.sequence.as_str(),
        sub_sequence_number: record.sub_sequence,
        approximate_arrival: record.arrival_ms,
        data: &record.data,
        attempt,
        window: record.window.map(to_v3_window),
    }
}

fn to_v3_window(window: crate::windows::Window) -> v3::Window {
    v3::Window {
        start: window.start,
        end: window.end,
    }
}

/// The 0.3.0 view of a record in a batch, borrowed as [`to_v1`]'s.
fn to_v3_batch(record: &Record, attempt: u32) -> v3::KinesisRecord<'_> {
    v3::KinesisRecord {
        stream: record.stream.as_str(),
        shard_id: record.shard.as_str(),
        partition_key: record.partition_key.as_str(),
        sequence_number: record.sequence.as_str(),
        sub_sequence_number: record.sub_sequence,
        approximate_arrival: record.arrival_ms,
        data: &record.data,
        attempt,
        window: record.window.map(to_v3_window),
    }
}

/// The outcome of a run of one record: its first, or a wrong count when
/// the guest answered none.
fn first_of(outcomes: Vec<v3::Outcome>) -> Result<Outcome, CallError> {
    outcomes
        .into_iter()
        .next()
        .map(Outcome::from)
        .ok_or(CallError::WrongOutcomeCount { got: 0, want: 1 })
}

/// A run's answer in dispatch's terms: at least one outcome, and only the
/// outputs of the records it answered (the rest go again).
fn answered(handled: Handled<Vec<v3::Outcome>>) -> Result<Handled<Vec<Outcome>>, CallError> {
    if handled.outcome.is_empty() {
        return Err(CallError::WrongOutcomeCount { got: 0, want: 1 });
    }
    let answered = handled.outcome.len();
    Ok(Handled {
        outcome: handled.outcome.into_iter().map(Outcome::from).collect(),
        outputs: handled
            .outputs
            .into_iter()
            .filter(|o| (o.input as usize) < answered)
            .collect(),
    })
}

/// Most records of one `handle-run` call: the lane hands over at most
/// this many waiting records of one shard.
pub(crate) const MAX_RUN: usize = 64;

/// The error of a call that failed in the guest: out of memory when a
/// memory growth was refused during it, a trap otherwise.
fn failed(trap: &wasmtime::Error, out_of_memory: bool) -> CallError {
    if out_of_memory {
        CallError::OutOfMemory(one_line(trap))
    } else {
        CallError::Trap(one_line(trap))
    }
}

impl Instance {
    /// The digest of the plugin version it is an instance of.
    pub fn digest(&self) -> &PluginDigest {
        self.store.data().digest()
    }

    fn refuel(&mut self) -> Result<(), CallError> {
        if let Some(fuel) = self.fuel {
            self.store
                .set_fuel(fuel)
                .map_err(|e| CallError::Trap(one_line(&e)))?;
        }
        Ok(())
    }

    /// Runs one guest call within the timeout, with `call` as its context;
    /// the answer, and the outputs the call published.
    async fn run<T>(
        &mut self,
        call: CallContext,
        state: &mut CallState,
        guest: impl AsyncFnOnce(&Exports, &mut Store<HostState>) -> Option<wasmtime::Result<T>>,
    ) -> Result<Handled<T>, CallError> {
        self.run_for(1, call, state, guest).await
    }

    /// [`Self::run`] for a call of `records` records: `handler_timeout`
    /// bounds each, so the call may take that many times it.
    async fn run_for<T>(
        &mut self,
        records: usize,
        call: CallContext,
        state: &mut CallState,
        guest: impl AsyncFnOnce(&Exports, &mut Store<HostState>) -> Option<wasmtime::Result<T>>,
    ) -> Result<Handled<T>, CallError> {
        let timeout = self
            .timeout
            .saturating_mul(u32::try_from(records.max(1)).unwrap_or(u32::MAX));
        self.refuel()?;
        let deadline = tokio::time::Instant::now() + timeout;
        self.store
            .data_mut()
            .begin_call(call, std::mem::take(state), deadline);
        let running = self.ticker.running();
        let result = tokio::time::timeout(timeout, guest(&self.exports, &mut self.store)).await;
        drop(running);
        let (out_of_memory, outputs) = self.store.data_mut().end_call(state);
        match result {
            Ok(Some(Ok(outcome))) => Ok(Handled { outcome, outputs }),
            Ok(Some(Err(trap))) => Err(failed(&trap, out_of_memory)),
            Ok(None) => Err(CallError::WrongWorld {
                implements: self.exports.world(),
            }),
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }

    /// Calls `handle` for one record.
    ///
    /// # Errors
    /// [`CallError`] on a trap or timeout; the instance must then be dropped.
    pub async fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
        state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        let handled = self
            .run(
                CallContext::Record(record.clone()),
                state,
                async |exports, store| match exports {
                    Exports::V1Record(h) => Some(
                        h.call_handle(store, to_v1(record, attempt))
                            .await
                            .map(|o| Ok(Outcome::from(o))),
                    ),
                    Exports::V2Record(h) => Some(
                        h.call_handle(store, to_v2(record, attempt))
                            .await
                            .map(|o| Ok(Outcome::from(o))),
                    ),
                    Exports::V3Record(h) => Some(
                        h.call_handle_run(
                            store,
                            run_context(record),
                            &[to_v3_run(record, attempt)],
                        )
                        .await
                        .map(first_of),
                    ),
                    Exports::V3WindowedRecord(h) => Some(
                        h.call_handle_run(
                            store,
                            run_context(record),
                            &[to_v3_run(record, attempt)],
                        )
                        .await
                        .map(first_of),
                    ),
                    Exports::V1Batch(_)
                    | Exports::V2Batch(_)
                    | Exports::V3Batch(_)
                    | Exports::V3WindowedBatch(_) => None,
                },
            )
            .await?;
        Ok(Handled {
            outcome: handled.outcome?,
            outputs: handled.outputs,
        })
    }

    /// Calls `handle-run` for a run of one shard's records (a 0.3.0
    /// `record-handler`); the outcomes of the prefix it handled, cut after
    /// the first that is not `ack` (the contract's rule, kept whatever the
    /// guest answers).
    ///
    /// # Errors
    /// [`CallError`] on a trap or timeout (the instance must then be
    /// dropped), or an empty answer.
    pub async fn handle_run(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        let Some((first, _)) = records.first() else {
            return Ok(Handled::new(Vec::new()));
        };
        let call = CallContext::Batch {
            first: first.clone(),
            len: records.len(),
        };
        let context = run_context(first);
        let mut handled = self
            .run_for(records.len(), call, state, async |exports, store| {
                let args: Vec<_> = records.iter().map(|(r, a)| to_v3_run(r, *a)).collect();
                Some(match exports {
                    Exports::V3Record(h) => h.call_handle_run(store, context, &args).await,
                    Exports::V3WindowedRecord(h) => h.call_handle_run(store, context, &args).await,
                    _ => return None,
                })
            })
            .await?;
        let Some(stop) = handled
            .outcome
            .iter()
            .position(|o| !matches!(o, v3::Outcome::Ack))
        else {
            handled.outcome.truncate(records.len());
            return answered(handled);
        };
        handled.outcome.truncate((stop + 1).min(records.len()));
        answered(handled)
    }

    /// Calls `close-window` (a windowed world) for a window's close.
    ///
    /// # Errors
    /// [`CallError`] on a trap or timeout (the instance must then be
    /// dropped), or a world without `close-window`.
    pub(crate) async fn close_window(
        &mut self,
        close: &Arc<WindowClose>,
        state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        let keys: Vec<&str> = close.keys.iter().map(|k| k.as_str()).collect();
        let closed = v3::ClosedWindow {
            stream: close.stream.as_str(),
            shard_id: close.shard.as_str(),
            window: to_v3_window(close.window),
            keys: &keys,
        };
        let call = CallContext::Close(close.clone());
        let handled = self
            .run(call, state, async |exports, store| match exports {
                Exports::V3WindowedRecord(h) => Some(h.call_close_window(store, closed).await),
                Exports::V3WindowedBatch(h) => Some(h.call_close_window(store, closed).await),
                _ => None,
            })
            .await?;
        Ok(Handled {
            outcome: handled.outcome.into(),
            outputs: handled.outputs,
        })
    }

    /// Calls `handle-batch` for a batch; one outcome per record, in order.
    ///
    /// # Errors
    /// [`CallError`] on a trap, a timeout or a wrong-length answer; after a
    /// trap or timeout the instance must be dropped.
    pub async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        let Some((first, _)) = records.first() else {
            return Ok(Handled::new(Vec::new()));
        };
        let call = CallContext::Batch {
            first: first.clone(),
            len: records.len(),
        };
        // One call shape for every batch world: the records in the
        // version's view (the same layout on both sides: collected in
        // place), the outcomes back in dispatch's.
        macro_rules! call_batch {
            ($h:expr, $view:expr, $store:expr) => {{
                let args: Vec<_> = records.iter().map(|(r, a)| $view(r, *a)).collect();
                Some(
                    $h.call_handle_batch($store, &args)
                        .await
                        .map(|o| o.into_iter().map(Outcome::from).collect::<Vec<_>>()),
                )
            }};
        }
        let handled = self
            .run(call, state, async |exports, store| match exports {
                Exports::V1Batch(h) => call_batch!(h, to_v1, store),
                Exports::V2Batch(h) => call_batch!(h, to_v2, store),
                Exports::V3Batch(h) => call_batch!(h, to_v3_batch, store),
                Exports::V3WindowedBatch(h) => call_batch!(h, to_v3_batch, store),
                Exports::V1Record(_)
                | Exports::V2Record(_)
                | Exports::V3Record(_)
                | Exports::V3WindowedRecord(_) => None,
            })
            .await?;
        if handled.outcome.len() != records.len() {
            return Err(CallError::WrongOutcomeCount {
                got: handled.outcome.len(),
                want: records.len(),
            });
        }
        Ok(handled)
    }
}

impl From<v1::Outcome> for Outcome {
    fn from(outcome: v1::Outcome) -> Self {
        match outcome {
            v1::Outcome::Ack => Outcome::Ack,
            v1::Outcome::Retry(reason) => Outcome::Retry(reason),
            v1::Outcome::Reject(reason) => Outcome::Reject(reason),
        }
    }
}

impl From<v2::Outcome> for Outcome {
    fn from(outcome: v2::Outcome) -> Self {
        match outcome {
            v2::Outcome::Ack => Outcome::Ack,
            v2::Outcome::Retry(reason) => Outcome::Retry(reason),
            v2::Outcome::Reject(reason) => Outcome::Reject(reason),
        }
    }
}

impl From<v3::Outcome> for Outcome {
    fn from(outcome: v3::Outcome) -> Self {
        match outcome {
            v3::Outcome::Ack => Outcome::Ack,
            v3::Outcome::Retry(reason) => Outcome::Retry(reason),
            v3::Outcome::Reject(reason) => Outcome::Reject(reason),
        }
    }
}

impl Handler for Instance {
    fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
        state: &mut CallState,
    ) -> impl Future<Output = Result<Handled<Outcome>, CallError>> + Send {
        Instance::handle(self, record, attempt, state)
    }

    fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> impl Future<Output = Result<Handled<Vec<Outcome>>, CallError>> + Send {
        Instance::handle_batch(self, records, state)
    }

    fn max_run(&self) -> usize {
        match self.exports {
            Exports::V3Record(_) | Exports::V3WindowedRecord(_) => MAX_RUN,
            _ => 1,
        }
    }

    fn handle_run(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> impl Future<Output = Result<Handled<Vec<Outcome>>, CallError>> + Send {
        Instance::handle_run(self, records, state)
    }

    fn close_window(
        &mut self,
        close: &Arc<WindowClose>,
        _attempt: u32,
        state: &mut CallState,
    ) -> impl Future<Output = Result<Handled<Outcome>, CallError>> + Send {
        Instance::close_window(self, close, state)
    }

    fn version(&self, _record: &Record) -> Option<PluginDigest> {
        Some(self.digest().clone())
    }
}

impl HandlerFactory for Plugin {
    type Handler = Instance;
    type Error = PluginError;

    fn create(&self, lane: LaneId) -> impl Future<Output = Result<Instance, PluginError>> + Send {
        self.instantiate(lane)
    }
}

#[cfg(test)]
mod tests;
