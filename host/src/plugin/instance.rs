//! A loaded plugin and its instances: [`Plugin`] is compiled, linked and
//! pre-instantiated (shared by a subscription's lanes); an [`Instance`] is
//! one store and instance, owned by one lane, and implements the dispatch
//! seam ([`Handler`]) by calling the guest.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Engine, Store};

use super::bindings::batch::{BatchHandler, BatchHandlerPre};
use super::bindings::record::{RecordHandler, RecordHandlerPre};
use super::bindings::{self, KinesisRecord};
use super::engine::one_line;
use super::host::{CallContext, HostState};
use super::{PluginError, World};
use crate::channel::Record;
use crate::config::SandboxConfig;
use crate::dispatch::{CallError, Handler, HandlerFactory, Outcome};
use crate::ids::{LaneId, PluginDigest, SubscriptionName};

pub(super) enum PluginPre {
    Record(RecordHandlerPre<HostState>),
    Batch(BatchHandlerPre<HostState>),
}

/// A compiled, linked, pre-instantiated plugin: immutable, shared by every
/// lane of its subscription.
pub struct Plugin {
    path: PathBuf,
    digest: PluginDigest,
    world: World,
    pre: PluginPre,
    engine: Engine,
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
        pre: PluginPre,
        engine: Engine,
        subscription: SubscriptionName,
        handler_timeout: Duration,
        sandbox: SandboxConfig,
        fuel_metering: bool,
    ) -> Self {
        Self {
            path,
            digest,
            world,
            pre,
            engine,
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

    /// Its digest.
    pub fn digest(&self) -> &PluginDigest {
        &self.digest
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
        let instantiate_error = |e: wasmtime::Error| PluginError::Instantiate {
            path: self.path.clone(),
            reason: one_line(&e),
        };
        let handler = match &self.pre {
            PluginPre::Record(pre) => Exports::Record(
                pre.instantiate_async(&mut store)
                    .await
                    .map_err(instantiate_error)?,
            ),
            PluginPre::Batch(pre) => Exports::Batch(
                pre.instantiate_async(&mut store)
                    .await
                    .map_err(instantiate_error)?,
            ),
        };
        Ok(Instance {
            store,
            exports: handler,
            timeout: self.handler_timeout,
            fuel: self
                .fuel_metering
                .then_some(self.sandbox.fuel.unwrap_or(u64::MAX)),
        })
    }
}

enum Exports {
    Record(RecordHandler),
    Batch(BatchHandler),
}

/// One live instance. Not reusable after a trap or timeout: drop it and
/// instantiate afresh.
pub struct Instance {
    store: Store<HostState>,
    exports: Exports,
    timeout: Duration,
    /// Fuel granted per call, when the engine meters fuel.
    fuel: Option<u64>,
}

/// The WIT view of a record: borrows the host's strings and bytes, which
/// are lowered straight into the guest's memory.
fn to_wit(record: &Record, attempt: u32) -> KinesisRecord<'_> {
    KinesisRecord {
        stream: record.stream.as_str(),
        shard_id: record.shard.as_str(),
        partition_key: record.partition_key.as_str(),
        sequence_number: record.sequence.as_str(),
        approximate_arrival: record.arrival_ms,
        data: &record.data,
        attempt,
    }
}

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

    /// Calls `handle` for one record.
    ///
    /// # Errors
    /// [`CallError`] on a trap or timeout; the instance must then be dropped.
    pub async fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
    ) -> Result<Outcome, CallError> {
        let timeout = self.timeout;
        self.refuel()?;
        let Exports::Record(handler) = &self.exports else {
            return Err(CallError::WrongWorld {
                implements: "batch-handler",
            });
        };
        self.store
            .data_mut()
            .begin_call(CallContext::Record(record.clone()));
        let arg = to_wit(record, attempt);
        let result = tokio::time::timeout(timeout, handler.call_handle(&mut self.store, arg)).await;
        let out_of_memory = self.store.data_mut().end_call();
        match result {
            Ok(Ok(outcome)) => Ok(outcome.into()),
            Ok(Err(trap)) => Err(failed(&trap, out_of_memory)),
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }

    /// Calls `handle-batch` for a batch; one outcome per record, in order.
    ///
    /// # Errors
    /// [`CallError`] on a trap, a timeout or a wrong-length answer; after a
    /// trap or timeout the instance must be dropped.
    pub async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
    ) -> Result<Vec<Outcome>, CallError> {
        let timeout = self.timeout;
        self.refuel()?;
        let Exports::Batch(handler) = &self.exports else {
            return Err(CallError::WrongWorld {
                implements: "record-handler",
            });
        };
        let Some((first, _)) = records.first() else {
            return Ok(Vec::new());
        };
        self.store.data_mut().begin_call(CallContext::Batch {
            first: first.clone(),
            len: records.len(),
        });
        let args: Vec<KinesisRecord> = records.iter().map(|(r, a)| to_wit(r, *a)).collect();
        let result =
            tokio::time::timeout(timeout, handler.call_handle_batch(&mut self.store, &args)).await;
        let out_of_memory = self.store.data_mut().end_call();
        match result {
            // Same layout on both sides: collected in place, no new vector.
            Ok(Ok(outcomes)) if outcomes.len() == records.len() => {
                Ok(outcomes.into_iter().map(Outcome::from).collect())
            }
            Ok(Ok(outcomes)) => Err(CallError::WrongOutcomeCount {
                got: outcomes.len(),
                want: records.len(),
            }),
            Ok(Err(trap)) => Err(failed(&trap, out_of_memory)),
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }
}

impl From<bindings::Outcome> for Outcome {
    fn from(outcome: bindings::Outcome) -> Self {
        match outcome {
            bindings::Outcome::Ack => Outcome::Ack,
            bindings::Outcome::Retry(reason) => Outcome::Retry(reason),
            bindings::Outcome::Reject(reason) => Outcome::Reject(reason),
        }
    }
}

impl Handler for Instance {
    fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
    ) -> impl Future<Output = Result<Outcome, CallError>> + Send {
        Instance::handle(self, record, attempt)
    }

    fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
    ) -> impl Future<Output = Result<Vec<Outcome>, CallError>> + Send {
        Instance::handle_batch(self, records)
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
