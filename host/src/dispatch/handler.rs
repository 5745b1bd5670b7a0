//! The dispatch seam: what a lane calls, in dispatch's own terms.
//!
//! A lane owns one [`Handler`] and asks its [`HandlerFactory`] for a fresh
//! one when it has none (at start, after a trap or timeout, after a swap).
//! The seam speaks only these types — an [`Outcome`] per record, or a
//! [`CallError`] for a call that gave none — so the plugin stage implements
//! it for Wasm instances ([`crate::plugin`], [`crate::slot`]), the dispatch
//! benchmark for a native no-op, and the lane's unit tests for a scripted
//! native handler, none of them needing the others.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::channel::{Record, WindowClose};
use crate::ids::{LaneId, PluginDigest};
use crate::outputs::Output;
use crate::state::CallState;

/// What a handler says about one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Handled: the record settles.
    Ack,
    /// Not now: the same record again, after a backoff (an attempt).
    Retry(String),
    /// Never: the record settles by the failure policy (skipped or
    /// dead-lettered).
    Reject(String),
}

/// What a call answered: its outcome(s), and the outputs it published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled<T> {
    /// One outcome (`handle`) or one per record (`handle-batch`).
    pub outcome: T,
    /// Every output the call published, in publish order.
    pub outputs: Vec<Output>,
}

impl<T> Handled<T> {
    /// An answer without outputs.
    pub fn new(outcome: T) -> Self {
        Self {
            outcome,
            outputs: Vec::new(),
        }
    }
}

/// Why one handler call did not return an outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The guest trapped (panic, unreachable, out of bounds...).
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The guest (or the host lowering a call's arguments into it) needed
    /// more memory than `max_memory` allows; like a trap otherwise, but a
    /// batch that fails so is halved rather than retried whole.
    #[error("guest out of memory (max_memory): {0}")]
    OutOfMemory(String),
    /// The call ran past `handler_timeout` and was interrupted.
    #[error("guest call timed out after {0:?}")]
    Timeout(Duration),
    /// A batch call returned the wrong number of outcomes.
    #[error("guest returned {got} outcomes for a batch of {want}")]
    WrongOutcomeCount {
        /// Outcomes returned.
        got: usize,
        /// Records in the batch.
        want: usize,
    },
    /// The instance implements the other world (`record-handler` for a
    /// batch call, or the reverse).
    #[error("plugin implements {implements}, not the world this call needs")]
    WrongWorld {
        /// The world it implements.
        implements: &'static str,
    },
}

impl CallError {
    /// True when the instance cannot be called again (a trapped component
    /// cannot be re-entered; a timed-out call was cut mid-way): the lane
    /// drops it and makes a fresh one.
    pub fn spoils_instance(&self) -> bool {
        !matches!(self, CallError::WrongOutcomeCount { .. })
    }
}

/// One handler instance, owned by one lane.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) trait Handler: Send + 'static {
    /// Handles one record, on its `attempt`-th delivery, with `state` the
    /// view of its key's state (the default: none), which the call's
    /// writes change.
    fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
        state: &mut CallState,
    ) -> impl Future<Output = Result<Handled<Outcome>, CallError>> + Send;

    /// Handles a batch; one outcome per record, in order. `state` as for
    /// [`Handler::handle`], inputs by their index in the batch.
    fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> impl Future<Output = Result<Handled<Vec<Outcome>>, CallError>> + Send;

    /// Most records one [`Handler::handle_run`] call takes: 1 (the
    /// default) for a handler that takes one record per call.
    fn max_run(&self) -> usize {
        1
    }

    /// Handles a run: consecutive records of one shard, in lane order,
    /// stopping after the first that is not acked. Returns the outcomes of
    /// the records it handled, a prefix of the run (at least one); the
    /// lane delivers the rest again after them. `state` as for
    /// [`Handler::handle_batch`]. The default handles the first record
    /// alone.
    fn handle_run(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> impl Future<Output = Result<Handled<Vec<Outcome>>, CallError>> + Send {
        async move {
            let Some((record, attempt)) = records.first() else {
                return Ok(Handled::new(Vec::new()));
            };
            let Handled { outcome, outputs } = self.handle(record, *attempt, state).await?;
            Ok(Handled {
                outcome: vec![outcome],
                outputs,
            })
        }
    }

    /// Closes a window (contract 0.3.0 windowed worlds): one call per
    /// [`WindowClose`], on its `attempt`-th try, with `state` the view of
    /// its keys' state (inputs by the key's index in `close.keys`). No
    /// default: a wrapper that forgot to pass it on would turn every close
    /// into a reject.
    fn close_window(
        &mut self,
        close: &Arc<WindowClose>,
        attempt: u32,
        state: &mut CallState,
    ) -> impl Future<Output = Result<Handled<Outcome>, CallError>> + Send;

    /// The plugin version that handles `record` in this instance (with a
    /// canary it depends on the key); named in dead-letter envelopes.
    /// `None` for a handler that is not a plugin.
    fn version(&self, _record: &Record) -> Option<PluginDigest> {
        None
    }
}

/// Makes handler instances: one per lane, and a fresh one after a trap.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) trait HandlerFactory: Send + Sync + 'static {
    /// The instances it makes.
    type Handler: Handler;
    /// Why it could not make one (the lane logs it and tries again).
    type Error: fmt::Display + Send;

    /// A fresh instance for `lane`.
    fn create(
        &self,
        lane: LaneId,
    ) -> impl Future<Output = Result<Self::Handler, Self::Error>> + Send;

    /// Which plugin version `create` makes now; a lane whose instance is of
    /// an older generation drops it at its next record or batch boundary
    /// (hot-swap). Constant for a factory that never changes.
    fn generation(&self) -> u64 {
        0
    }
}
