//! The per-store host state: WASI granting only what config grants, the
//! store's resource limits, the context of the call under way, and what
//! the guest's imports act on — one submodule per import: [`log`] (both
//! contract versions, rate-limited per instance), [`outputs`] (records
//! published during a call, held until the lane knows its outcome),
//! [`state`] (per-key state, on the call's [`CallState`]),
//! [`config`] (`wasi:config/store` over the subscription's `config`) and
//! [`http`] (`wasi:http/outgoing-handler` to allowed destinations only).

mod config;
mod http;
mod log;
mod outputs;
mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::WasiHttpCtx;

use http::HttpGate;
pub(super) use http::HttpMetrics;

use crate::channel::{Record, WindowClose};
use crate::config::{Grants, SandboxConfig};
use crate::ids::{LaneId, PluginDigest, SubscriptionName};
use crate::outputs::Output;
use crate::state::CallState;

/// The record(s) being handled: the context of guest log lines, and what
/// outputs may name as their input.
#[derive(Debug, Clone, Default)]
pub(super) enum CallContext {
    #[default]
    Idle,
    Record(Arc<Record>),
    Batch {
        first: Arc<Record>,
        len: usize,
    },
    /// A window's close: its keys are the inputs.
    Close(Arc<WindowClose>),
}

impl CallContext {
    /// How many input records the call has.
    fn inputs(&self) -> usize {
        match self {
            CallContext::Idle => 0,
            CallContext::Record(_) => 1,
            CallContext::Batch { len, .. } => *len,
            CallContext::Close(close) => close.keys.len(),
        }
    }
}

/// The dropped-lines count is logged at most this often per instance, so a
/// flooding guest costs one warning a second, not one per admitted line.
const DROPPED_REPORT_EVERY: Duration = Duration::from_secs(1);

/// A token bucket for guest log lines, with the count of lines it dropped
/// and when that count was last reported. Pure: the clock is passed in.
struct LogBudget {
    rate: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
    dropped: u64,
    reported: Option<Instant>,
}

impl LogBudget {
    fn new(rate: u32, now: Instant) -> Self {
        let rate = f64::from(rate);
        Self {
            rate,
            burst: rate * 2.0,
            tokens: rate * 2.0,
            refilled: now,
            dropped: 0,
            reported: None,
        }
    }

    /// True when a line may be written at `now`.
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.duration_since(self.refilled).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += 1;
            false
        }
    }

    /// The lines dropped since the last report, when there are any and a
    /// report is due at `now` (the first at once, then at most one per
    /// [`DROPPED_REPORT_EVERY`]); `force` (the instance goes) ignores the
    /// interval. Resets the count it returns.
    fn due_report(&mut self, now: Instant, force: bool) -> Option<u64> {
        let due = force
            || self
                .reported
                .is_none_or(|at| now.duration_since(at) >= DROPPED_REPORT_EVERY);
        if self.dropped == 0 || !due {
            return None;
        }
        self.reported = Some(now);
        Some(std::mem::take(&mut self.dropped))
    }
}

/// The store's resource limits, noting when a memory growth was refused,
/// so a call that failed for memory is told apart by type, not by its
/// message.
struct Limits {
    inner: StoreLimits,
    refused_growth: bool,
}

impl Limits {
    /// True when a growth was refused since the last look.
    fn take_refused(&mut self) -> bool {
        std::mem::take(&mut self.refused_growth)
    }
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.inner.memory_growing(current, desired, maximum);
        if !matches!(allowed, Ok(true)) {
            self.refused_growth = true;
        }
        allowed
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.refused_growth = true;
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// Per-store host state: WASI (granting only what config grants) and the
/// log context.
pub(super) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: Limits,
    subscription: SubscriptionName,
    lane: LaneId,
    digest: PluginDigest,
    call: CallContext,
    log_budget: LogBudget,
    grants: Arc<Grants>,
    /// Outputs published during the call under way, and their bytes.
    outputs: Vec<Output>,
    output_bytes: usize,
    /// The call's view of its keys' state.
    state: CallState,
    http: WasiHttpCtx,
    http_gate: HttpGate,
}

impl HostState {
    /// The state of a fresh store for `lane` of `subscription`, running the
    /// plugin version `digest`: WASI with no sockets, only the environment
    /// variables and the read-only folder `sandbox` grants, memory capped at
    /// its `max_memory`.
    ///
    /// # Errors
    /// Why the granted folder cannot be opened.
    pub(super) fn new(
        sandbox: &SandboxConfig,
        subscription: SubscriptionName,
        lane: LaneId,
        digest: PluginDigest,
        http_metrics: HttpMetrics,
    ) -> Result<Self, String> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .envs(&sandbox.env);
        if let Some(preopen) = &sandbox.preopen {
            wasi.preopened_dir(&preopen.host, &preopen.guest, FsPerms::ReadOnly)
                .map_err(|e| format!("cannot preopen {}: {e}", preopen.host.display()))?;
        }
        Ok(Self {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: Limits {
                inner: StoreLimitsBuilder::new()
                    .memory_size(sandbox.max_memory)
                    .table_elements(100_000)
                    .instances(100)
                    .tables(100)
                    .memories(100)
                    .trap_on_grow_failure(true)
                    .build(),
                refused_growth: false,
            },
            log_budget: LogBudget::new(sandbox.log_rate, Instant::now()),
            subscription,
            lane,
            digest,
            call: CallContext::Idle,
            grants: sandbox.grants.clone(),
            outputs: Vec::new(),
            output_bytes: 0,
            state: CallState::default(),
            http: WasiHttpCtx::new(),
            http_gate: HttpGate::new(sandbox.grants.http.clone(), http_metrics),
        })
    }

    /// The store's resource limiter (for [`wasmtime::Store::limiter`]).
    pub(super) fn limiter(&mut self) -> &mut dyn wasmtime::ResourceLimiter {
        &mut self.limits
    }

    /// The plugin version this store runs.
    pub(super) fn digest(&self) -> &PluginDigest {
        &self.digest
    }

    /// A call begins, to end by `deadline` (its `handler_timeout`): guest
    /// log lines carry `call`'s record(s), outputs may name them, and no
    /// HTTP request outlives the deadline.
    pub(super) fn begin_call(
        &mut self,
        call: CallContext,
        state: CallState,
        deadline: tokio::time::Instant,
    ) {
        self.call = call;
        self.state = state;
        self.outputs.clear();
        self.output_bytes = 0;
        self.http_gate.set_deadline(Some(deadline));
    }

    /// The call ended: reports dropped log lines when due, and puts the
    /// call's state view back in `state`. Returns whether a memory growth
    /// was refused during it (the call failed for memory), and the outputs
    /// it published.
    pub(super) fn end_call(&mut self, state: &mut CallState) -> (bool, Vec<Output>) {
        self.call = CallContext::Idle;
        *state = std::mem::take(&mut self.state);
        self.http_gate.set_deadline(None);
        self.report_dropped(false);
        self.output_bytes = 0;
        (
            self.limits.take_refused(),
            std::mem::take(&mut self.outputs),
        )
    }

    /// Logs how many guest lines the rate limit dropped, when a report is
    /// due ([`LogBudget::due_report`]).
    fn report_dropped(&mut self, force: bool) {
        if let Some(dropped) = self.log_budget.due_report(Instant::now(), force) {
            tracing::warn!(
                subscription = self.subscription.as_str(),
                plugin = self.digest.short(),
                lane = self.lane.0,
                dropped,
                "guest log lines dropped by the rate limit"
            );
        }
    }
}

impl Drop for HostState {
    fn drop(&mut self) {
        self.report_dropped(true);
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

#[cfg(test)]
mod log_budget_tests {
    use super::*;

    /// A guest logging `lines` lines evenly over `over`, at `rate` a
    /// second: the lines written, and the dropped counts reported, as the
    /// host does (a report looked for at every admitted line, then a forced
    /// one when the instance goes).
    fn flood(rate: u32, lines: u32, over: Duration) -> (u64, Vec<u64>) {
        let t0 = Instant::now();
        let mut budget = LogBudget::new(rate, t0);
        let (mut written, mut reports) = (0, Vec::new());
        for i in 0..lines {
            let now = t0 + over.mul_f64(f64::from(i) / f64::from(lines));
            if budget.take(now) {
                written += 1;
                reports.extend(budget.due_report(now, false));
            }
        }
        reports.extend(budget.due_report(t0 + over, true));
        (written, reports)
    }

    #[test]
    fn a_flood_is_summarized_once_a_second_not_once_a_line() {
        let (written, reports) = flood(50, 10_000, Duration::from_secs(4));
        // A burst of 100, then 50 a second.
        assert!((100..=301).contains(&written), "{written}");
        // The first report at once, then at most one a second, and the last
        // when the instance goes.
        assert!(reports.len() <= 4 + 2, "{} reports", reports.len());
        assert_eq!(written + reports.iter().sum::<u64>(), 10_000);
    }

    #[test]
    fn nothing_is_reported_when_nothing_was_dropped() {
        let (written, reports) = flood(1_000, 100, Duration::from_secs(1));
        assert_eq!(written, 100);
        assert!(reports.is_empty());
    }
}
