//! The shadow of a plugin slot: a candidate version given every record
//! after the live version handled it, on a Wasm instance of its own, whose
//! effects are compared with the live call's and never applied (see
//! "Shadow" in [`super`]).
//!
//! # How a record reaches it
//! A lane's handler ([`super::SlotInstance`]) forks the call's state view
//! before the live call ([`CallState::fork`]: the state as the call found
//! it, nothing written), calls the live version, then offers the shadow a
//! [`ShadowCall`]: the records, the fork, and what the live call answered
//! — outcomes, outputs, and each input's state writes.
//!
//! # Bounded by count and by bytes
//! The queue holds at most [`QUEUE`] calls and [`QUEUE_BYTES`] bytes
//! (the records' data and keys — which the shadow keeps alive after the
//! live path let them go — the state fork, the live outputs and writes).
//! A call is **admitted before anything is copied**: before the fork, the
//! lane takes a place in the queue and the records' bytes from the budget
//! ([`Shadow::admit`]); only then does it fork the state. After the live
//! call it takes the rest (state, outputs, writes); what does not fit
//! drops the call (counted in `shardlane_shadow_dropped_total`), and so
//! does no place or no budget at admission. A slow shadow therefore never
//! slows a lane, never holds the checkpoint — settlement never hears of
//! it — and never holds more than its bound, whatever the records weigh:
//! its bytes are given back when the shadow has made the call.
//!
//! # What it compares
//! One task per shadow takes calls in order and makes the same call
//! (`handle` or `handle-batch`, the same attempt) on its own instance,
//! with the fork as its state. Then, per kind, the answers differ when:
//! - **outcome**: the outcome kinds differ (ack, retry, reject, or a
//!   failed call: trap, timeout, guest error), input by input;
//! - **output**: the outputs differ (stream, partition key, data, in
//!   order);
//! - **state**: the inputs' state writes differ (names and values).
//!
//! Each kind counts once per call (`shardlane_shadow_diffs_total{kind}`),
//! beside `shardlane_shadow_calls_total`; the first [`LOGGED`] differences
//! are logged with the shard, the sequence number and both values (each
//! cut at [`SHOWN`] characters). Its outputs go nowhere and its state
//! writes die with the fork: nothing it does is applied. Its outbound HTTP
//! is limited to GET, HEAD and OPTIONS (methods that by their definition
//! change nothing on the server; see `HttpGrant::safe_methods_only`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::channel::Record;
use crate::dispatch::{CallError, Handled, Outcome};
use crate::ids::{LaneId, PluginDigest};
use crate::outputs::Output;
use crate::plugin::{Instance, Plugin};
use crate::state::{CallState, Delta};
use crate::telemetry::{Counter, Telemetry};

/// Calls waiting for the shadow; past it they are dropped (counted).
pub(crate) const QUEUE: usize = 256;

/// Bytes the calls waiting for the shadow may hold (see "Bounded by count
/// and by bytes"): six of Lambda's largest batches, a small share of the
/// host's memory.
pub(crate) const QUEUE_BYTES: usize = 64 << 20;

/// What a call is reckoned to hold beyond its bytes of data (the record
/// structs, the vectors).
const CALL_OVERHEAD: usize = 256;

/// Differences logged per shadow (then only counted).
const LOGGED: u64 = 10;

/// Characters of each value a difference's log line shows.
const SHOWN: usize = 200;

/// The lane id the shadow's instance runs as (in its log lines).
const SHADOW_LANE: LaneId = LaneId(u32::MAX);

/// What the live call answered, for the shadow to compare with.
pub(crate) struct Live {
    /// One outcome per input, or the call's failure.
    pub outcomes: Result<Vec<Outcome>, CallError>,
    /// Its outputs.
    pub outputs: Vec<Output>,
    /// Each input's state writes.
    pub writes: Vec<Delta>,
}

impl Live {
    /// From a record call's result and its state.
    pub(crate) fn of_record(
        result: &Result<Handled<Outcome>, CallError>,
        state: &CallState,
    ) -> Self {
        match result {
            Ok(h) => Self {
                outcomes: Ok(vec![h.outcome.clone()]),
                outputs: h.outputs.clone(),
                writes: state.deltas(),
            },
            Err(e) => Self::failed(e, state),
        }
    }

    /// From a batch call's result and its state.
    pub(crate) fn of_batch(
        result: &Result<Handled<Vec<Outcome>>, CallError>,
        state: &CallState,
    ) -> Self {
        match result {
            Ok(h) => Self {
                outcomes: Ok(h.outcome.clone()),
                outputs: h.outputs.clone(),
                writes: state.deltas(),
            },
            Err(e) => Self::failed(e, state),
        }
    }

    fn failed(e: &CallError, state: &CallState) -> Self {
        Self {
            outcomes: Err(e.clone()),
            outputs: Vec::new(),
            writes: state.deltas(),
        }
    }
}

/// A call's place in the shadow's queue and its bytes, taken before
/// anything is copied for it ([`Shadow::admit`]).
pub(crate) struct Admission {
    place: mpsc::OwnedPermit<ShadowCall>,
    bytes: OwnedSemaphorePermit,
}

/// One call for the shadow to make again.
pub(crate) struct ShadowCall {
    /// The records and their attempts; one for a `handle` call.
    pub records: Vec<(Arc<Record>, u32)>,
    /// A batch call (`handle-batch`), else `handle`.
    pub batch: bool,
    /// The state as the live call found it.
    pub state: CallState,
    /// What the live call answered.
    pub live: Live,
    /// Its bytes of the queue's budget, given back when it is dropped.
    bytes: Option<OwnedSemaphorePermit>,
}

impl ShadowCall {
    /// A call for the shadow (its bytes are attached when it is offered).
    pub(crate) fn new(
        records: Vec<(Arc<Record>, u32)>,
        batch: bool,
        state: CallState,
        live: Live,
    ) -> Self {
        Self {
            records,
            batch,
            state,
            live,
            bytes: None,
        }
    }
}

/// What `records` weigh in the shadow's queue.
fn records_bytes(records: &[(Arc<Record>, u32)]) -> usize {
    records
        .iter()
        .map(|(r, _)| CALL_OVERHEAD + r.data.len() + r.partition_key.as_str().len())
        .sum()
}

/// What the rest of a call weighs: the fork and the live answer.
fn answer_bytes(call: &ShadowCall) -> usize {
    let outputs: usize = call
        .live
        .outputs
        .iter()
        .map(|o| CALL_OVERHEAD + o.data.len() + o.partition_key.as_str().len())
        .sum();
    let writes: usize = call
        .live
        .writes
        .iter()
        .flat_map(|d| d.iter())
        .map(|(name, v)| name.len() + v.as_ref().map_or(0, |v| v.data.len()))
        .sum();
    call.state.bytes() + outputs + writes
}

/// The counters of one subscription's shadow.
#[derive(Clone)]
pub(crate) struct ShadowCounters {
    calls: Counter,
    dropped: Counter,
    outcome: Counter,
    output: Counter,
    state: Counter,
}

impl ShadowCounters {
    pub(crate) fn new(telemetry: &Telemetry, sub: &str) -> Self {
        let diffs = |kind: &str| {
            telemetry.counter(
                "shardlane_shadow_diffs_total",
                "Calls whose shadow candidate answered otherwise than the live version, by kind (outcome, output, state).",
                &[("subscription", sub), ("kind", kind)],
            )
        };
        Self {
            calls: telemetry.counter(
                "shardlane_shadow_calls_total",
                "Calls the shadow candidate made again and compared.",
                &[("subscription", sub)],
            ),
            dropped: telemetry.counter(
                "shardlane_shadow_dropped_total",
                "Calls dropped from the shadow because it had fallen behind (the live path never waits for it).",
                &[("subscription", sub)],
            ),
            outcome: diffs("outcome"),
            output: diffs("output"),
            state: diffs("state"),
        }
    }

    /// (calls, dropped, outcome, output, state) so far.
    pub(crate) fn totals(&self) -> [u64; 5] {
        [
            self.calls.get(),
            self.dropped.get(),
            self.outcome.get(),
            self.output.get(),
            self.state.get(),
        ]
    }
}

/// A running shadow: where lanes offer calls (see the module docs).
#[derive(Clone)]
pub(crate) struct Shadow {
    pub(super) plugin: Arc<Plugin>,
    /// Its identity (the revision that started it).
    pub(super) id: u64,
    tx: mpsc::Sender<ShadowCall>,
    budget: Arc<Semaphore>,
    pub(super) counters: ShadowCounters,
}

impl Shadow {
    /// Starts the shadow task for `plugin`; it ends when every sender is
    /// dropped (the shadow replaced or ended, and the lanes' instances of
    /// that generation gone).
    pub(crate) fn start(plugin: Arc<Plugin>, id: u64, counters: ShadowCounters) -> Self {
        Self::with_budget(plugin, id, counters, QUEUE_BYTES)
    }

    pub(super) fn with_budget(
        plugin: Arc<Plugin>,
        id: u64,
        counters: ShadowCounters,
        bytes: usize,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(plugin.clone(), rx, counters.clone()));
        Self {
            plugin,
            id,
            tx,
            budget: Arc::new(Semaphore::new(bytes)),
            counters,
        }
    }

    /// A place in the queue and the bytes of `records`, before anything is
    /// copied for the call; `None` (the call dropped, counted) when the
    /// shadow is behind by count or by bytes.
    pub(crate) fn admit(&self, records: &[(Arc<Record>, u32)]) -> Option<Admission> {
        let admitted = self.tx.clone().try_reserve_owned().ok().and_then(|place| {
            let bytes = u32::try_from(records_bytes(records)).ok()?;
            let bytes = self.budget.clone().try_acquire_many_owned(bytes).ok()?;
            Some(Admission { place, bytes })
        });
        if admitted.is_none() {
            self.counters.dropped.inc();
        }
        admitted
    }

    /// Queues an admitted call, once the rest of its bytes fit; drops it
    /// (counted) when they do not.
    pub(crate) fn offer(&self, admission: Admission, mut call: ShadowCall) {
        let Admission { place, mut bytes } = admission;
        let rest = u32::try_from(answer_bytes(&call))
            .ok()
            .and_then(|rest| self.budget.clone().try_acquire_many_owned(rest).ok());
        let Some(rest) = rest else {
            self.counters.dropped.inc();
            return;
        };
        bytes.merge(rest);
        call.bytes = Some(bytes);
        place.send(call);
    }

    /// The candidate.
    pub(crate) fn digest(&self) -> &PluginDigest {
        self.plugin.digest()
    }
}

async fn run(plugin: Arc<Plugin>, mut rx: mpsc::Receiver<ShadowCall>, counters: ShadowCounters) {
    let logged = AtomicU64::new(0);
    let mut instance: Option<Instance> = None;
    while let Some(mut call) = rx.recv().await {
        let current = match instance.take() {
            Some(i) => i,
            None => match plugin.instantiate(SHADOW_LANE).await {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(subscription = %plugin.subscription(), shadow = %plugin.digest(), error = %e, "cannot make the shadow's instance; the call is dropped from the shadow");
                    counters.dropped.inc();
                    continue;
                }
            },
        };
        let mut current = current;
        let (outcomes, outputs) = if call.batch {
            match current.handle_batch(&call.records, &mut call.state).await {
                Ok(h) => (Ok(h.outcome), h.outputs),
                Err(e) => (Err(e), Vec::new()),
            }
        } else {
            let (record, attempt) = &call.records[0];
            match current.handle(record, *attempt, &mut call.state).await {
                Ok(h) => (Ok(vec![h.outcome]), h.outputs),
                Err(e) => (Err(e), Vec::new()),
            }
        };
        if !outcomes.as_ref().is_err_and(CallError::spoils_instance) {
            instance = Some(current);
        }
        counters.calls.inc();
        let shadow = Live {
            outcomes,
            outputs,
            writes: call.state.deltas(),
        };
        compare(&plugin, &call, &shadow, &counters, &logged);
    }
}

/// An outcome's kind, as compared.
fn kind(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Ack => "ack",
        Outcome::Retry(_) => "retry",
        Outcome::Reject(_) => "reject",
    }
}

fn kinds(outcomes: &Result<Vec<Outcome>, CallError>) -> Result<Vec<&'static str>, &'static str> {
    outcomes
        .as_ref()
        .map(|o| o.iter().map(kind).collect())
        .map_err(|_| "failed")
}

/// Outputs in words: `[stream key "data"]`, the data as text (lossy).
fn describe_outputs(outputs: &[Output]) -> String {
    let each: Vec<String> = outputs
        .iter()
        .map(|o| {
            format!(
                "{} {} {:?}",
                o.stream,
                o.partition_key,
                String::from_utf8_lossy(&o.data)
            )
        })
        .collect();
    format!("[{}]", each.join(", "))
}

/// Compares the shadow's answers with the live call's; counts and logs.
fn compare(
    plugin: &Plugin,
    call: &ShadowCall,
    shadow: &Live,
    counters: &ShadowCounters,
    logged: &AtomicU64,
) {
    let live = &call.live;
    let diffs: [(&str, &Counter, bool, String, String); 3] = [
        (
            "outcome",
            &counters.outcome,
            kinds(&live.outcomes) != kinds(&shadow.outcomes),
            format!("{:?}", live.outcomes),
            format!("{:?}", shadow.outcomes),
        ),
        (
            "output",
            &counters.output,
            live.outputs != shadow.outputs,
            describe_outputs(&live.outputs),
            describe_outputs(&shadow.outputs),
        ),
        (
            "state",
            &counters.state,
            live.writes != shadow.writes,
            format!("{:?}", live.writes),
            format!("{:?}", shadow.writes),
        ),
    ];
    let first = &call.records[0].0;
    for (kind, counter, differs, live, shadow) in diffs {
        if !differs {
            continue;
        }
        counter.inc();
        if logged.fetch_add(1, Ordering::Relaxed) < LOGGED {
            let cut = |s: String| s.chars().take(SHOWN).collect::<String>();
            tracing::info!(
                subscription = %plugin.subscription(), shadow = %plugin.digest().short(),
                shard_id = %first.shard, sequence_number = %first.sequence,
                records = call.records.len(), kind,
                live = %cut(live), candidate = %cut(shadow),
                "shadow differs from the live version (the first {LOGGED} differences are logged; all are counted)"
            );
        }
    }
}
