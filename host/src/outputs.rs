//! The output stage: puts the outputs of acked records to their streams,
//! then settles those records.
//!
//! A lane whose record acked with outputs (contract 0.2.0 `outputs`) sends
//! them here as one [`Publish`] instead of settling the record; this stage
//! settles it once every one of its outputs is durably in its stream. So
//! the checkpoint never passes an input whose outputs are not published,
//! whatever fails meanwhile; a crash before that re-reads the input, and
//! its outputs are published again (at least once, documented in the WIT).
//!
//! # Order
//! Outputs wait in one queue per output stream and partition key, in the
//! order they arrived (a key's inputs reach this stage in their lane's
//! order). Only a queue's head is ever being put, and the next output of
//! that key is put only once the head is accepted. `PutRecords` may accept
//! some records of a call and refuse others, which would reorder two
//! records of one key in one call; one record per key per call cannot be
//! reordered. Hence, per stream and key, outputs appear in input order.
//! The price: one hot key publishes one output per `PutRecords` round trip.
//!
//! # Batching
//! Per stream, one `PutRecords` call is under way at a time, carrying the
//! heads of up to [`MAX_RECORDS_PER_PUT`] queues and [`MAX_BYTES_PER_PUT`]
//! bytes; what arrives meanwhile waits for the next call, so calls fill up
//! under load and leave at once when idle. With more keys waiting than one
//! call holds, calls take keys round robin (from just after the last key
//! the previous call took), so no key waits behind others indefinitely. A call that fails as a whole
//! (throttled, 5xx, the network) and records it refused are tried again
//! after a jittered, doubling backoff; failures are counted and logged at
//! most once per [`LOG_INTERVAL`], not per record.
//!
//! # Refusals that do not pass
//! Every failure is tried again, including ones that will not pass by
//! themselves (the stream deleted, access denied): an output is never
//! dropped, so its input and every later input of its shard stay
//! unsettled, and the subscription stalls behind it with the failure
//! counted and logged. Output streams are checked at start-up; one that
//! goes away later needs an operator (recreate it, or remove the grant and
//! redeploy).
//!
//! # Bounds
//! The stage stops taking publishes while it holds [`MAX_PENDING_OUTPUTS`]
//! outputs or [`MAX_PENDING_BYTES`] bytes, so lanes wait on its bounded
//! inbox, as readers wait on a full channel: memory never grows without
//! bound (at most these plus one call's outputs, see
//! `MAX_OUTPUT_BYTES_PER_CALL` of the plugin's `outputs` import).
//!
//! # Shutdown
//! The stage ends once dispatch has ended (its inbox closed) and every
//! output is put, or at `hard_stop`; what is not put then leaves its input
//! unsettled, to be read again.
//!
//! Floor 6 (records in and out) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::ids::{PartitionKey, StreamName, SubscriptionName};
use crate::kinesis::{Kinesis, KinesisError};
use crate::logging::LogGate;
use crate::progress::Ticket;
use crate::settlement::{SettlementMsg, SettlementSender};
use crate::telemetry::{BATCH_BUCKETS, Counter, Gauge, Histogram, Telemetry};

/// A record a call published for one of its inputs (contract 0.2.0
/// `outputs`): published only if that input's attempt acks, and the input
/// settles only once it is durably in its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The input it belongs to: its index in the call (0 for a record).
    pub input: u32,
    /// The stream to put it to (one the subscription grants).
    pub stream: StreamName,
    /// Its partition key.
    pub partition_key: PartitionKey,
    /// Its payload.
    pub data: Vec<u8>,
}

/// Publishes queued to the stage before lanes wait.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) const PUBLISH_QUEUE: usize = 64;

/// Most outputs held (queued or being put) before the stage stops taking
/// publishes.
pub(crate) const MAX_PENDING_OUTPUTS: usize = 10_000;

/// Most output bytes (data and keys) held before the stage stops taking
/// publishes.
pub(crate) const MAX_PENDING_BYTES: usize = 32 << 20;

/// Kinesis's bounds on one `PutRecords` call.
pub(crate) const MAX_RECORDS_PER_PUT: usize = 500;
/// See [`MAX_RECORDS_PER_PUT`].
pub(crate) const MAX_BYTES_PER_PUT: usize = 5 << 20;

/// Put failures are logged at most this often, with the count since.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// An acked record's outputs, and the ticket that settles it once they are
/// all put.
#[derive(Debug)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Publish {
    /// Where the input settles.
    pub(crate) ticket: Ticket,
    /// Its outputs, in publish order (none empty: a record without outputs
    /// settles at once).
    pub(crate) outputs: Vec<Output>,
}

/// Sends to the output stage.
pub(crate) type PublishSender = mpsc::Sender<Publish>;

/// Where outputs are put: Kinesis, or a fake in tests and benchmarks.
#[async_trait]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) trait PutRecords: Send + Sync + 'static {
    /// Puts `records` to `stream` in one call: the outcome of each, in
    /// order, or the call's failure.
    async fn put_records(
        &self,
        stream: &StreamName,
        records: &[(PartitionKey, Vec<u8>)],
    ) -> Result<Vec<Result<(), KinesisError>>, KinesisError>;
}

#[async_trait]
impl PutRecords for Kinesis {
    async fn put_records(
        &self,
        stream: &StreamName,
        records: &[(PartitionKey, Vec<u8>)],
    ) -> Result<Vec<Result<(), KinesisError>>, KinesisError> {
        Kinesis::put_records(self, stream, records).await
    }
}

/// One output waiting in its key's queue.
struct Queued {
    /// The publish it belongs to.
    publish: u64,
    data: Vec<u8>,
}

/// A publish whose outputs are not all put yet.
struct Pending {
    ticket: Ticket,
    left: usize,
}

/// One stream's state: its keys' queues, and the call under way.
#[derive(Default)]
struct StreamState {
    queues: BTreeMap<PartitionKey, VecDeque<Queued>>,
    putting: bool,
    /// Where the next call starts taking heads: just after the last key
    /// the previous call took, so that with more keys than one call holds
    /// every key gets its turn (round robin), not only the first in order.
    cursor: Option<PartitionKey>,
    /// No call before this (after a failure).
    retry_at: Option<Instant>,
    backoff: Option<Backoff>,
}

/// What a finished call reports.
struct Put {
    stream: StreamName,
    keys: Vec<PartitionKey>,
    result: Result<Vec<Result<(), KinesisError>>, KinesisError>,
}

struct Metrics {
    pending: Gauge,
    calls: Counter,
    call_size: Histogram,
    throttled: Counter,
    failed: Counter,
    put: BTreeMap<StreamName, Counter>,
}

/// The output stage of one subscription (module docs).
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct OutputStage {
    subscription: SubscriptionName,
    sink: Arc<dyn PutRecords>,
    settlement: SettlementSender,
    streams: HashMap<StreamName, StreamState>,
    pending: HashMap<u64, Pending>,
    next_publish: u64,
    held_outputs: usize,
    held_bytes: usize,
    puts: JoinSet<Put>,
    /// The stream each call under way puts to, to recover from a call
    /// whose task failed (panicked) without reporting.
    calls: HashMap<tokio::task::Id, StreamName>,
    metrics: Metrics,
    log: LogGate,
    /// Failures since the last log line.
    unlogged: u64,
}

impl OutputStage {
    /// A stage putting to `sink` and settling through `settlement`, for
    /// `subscription`, whose granted streams are `streams`.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn new(
        subscription: SubscriptionName,
        streams: impl IntoIterator<Item = StreamName>,
        sink: Arc<dyn PutRecords>,
        settlement: SettlementSender,
        telemetry: &Telemetry,
    ) -> Self {
        let sub = subscription.as_str();
        let failures = |kind| {
            telemetry.counter(
                "shardlane_output_put_failures_total",
                "Outputs (or whole PutRecords calls) refused and tried again, by kind.",
                &[("subscription", sub), ("kind", kind)],
            )
        };
        let put = streams
            .into_iter()
            .map(|stream| {
                let counter = telemetry.counter(
                    "shardlane_outputs_total",
                    "Plugin outputs put to their stream (durably accepted by Kinesis).",
                    &[("subscription", sub), ("stream", stream.as_str())],
                );
                (stream, counter)
            })
            .collect();
        let metrics = Metrics {
            pending: telemetry.gauge(
                "shardlane_outputs_pending",
                "Plugin outputs waiting to be put (their inputs unsettled).",
                &[("subscription", sub)],
            ),
            calls: telemetry.counter(
                "shardlane_output_puts_total",
                "PutRecords calls made for plugin outputs.",
                &[("subscription", sub)],
            ),
            call_size: telemetry.histogram(
                "shardlane_output_put_size",
                "Outputs per PutRecords call.",
                &[("subscription", sub)],
                BATCH_BUCKETS,
            ),
            throttled: failures("throttled"),
            failed: failures("failed"),
            put,
        };
        Self {
            subscription,
            sink,
            settlement,
            streams: HashMap::new(),
            pending: HashMap::new(),
            next_publish: 0,
            held_outputs: 0,
            held_bytes: 0,
            puts: JoinSet::new(),
            calls: HashMap::new(),
            metrics,
            log: LogGate::every(LOG_INTERVAL),
            unlogged: 0,
        }
    }

    /// Runs until `inbox` is closed and everything is put, or `hard_stop`.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) async fn run(
        mut self,
        mut inbox: mpsc::Receiver<Publish>,
        hard_stop: CancellationToken,
    ) {
        let mut open = true;
        loop {
            self.start_puts();
            if !open && self.pending.is_empty() && self.puts.is_empty() {
                break;
            }
            let room =
                self.held_outputs < MAX_PENDING_OUTPUTS && self.held_bytes < MAX_PENDING_BYTES;
            let wake = self.next_retry();
            tokio::select! {
                biased;
                _ = hard_stop.cancelled() => break,
                Some(done) = self.puts.join_next_with_id() => match done {
                    Ok((id, put)) => {
                        self.calls.remove(&id);
                        self.finished(put).await;
                    }
                    Err(e) => self.call_failed(e),
                },
                msg = inbox.recv(), if open && room => match msg {
                    Some(publish) => self.enqueue(publish),
                    None => open = false,
                },
                _ = sleep_until(wake), if wake.is_some() => {}
            }
        }
        if !self.pending.is_empty() {
            tracing::warn!(subscription = %self.subscription, inputs = self.pending.len(), outputs = self.held_outputs, "stopping with outputs not put; their inputs stay unsettled and are read again");
        }
    }

    fn enqueue(&mut self, publish: Publish) {
        let id = self.next_publish;
        self.next_publish += 1;
        self.pending.insert(
            id,
            Pending {
                ticket: publish.ticket,
                left: publish.outputs.len(),
            },
        );
        for output in publish.outputs {
            self.held_outputs += 1;
            self.held_bytes += output.data.len() + output.partition_key.as_str().len();
            self.streams
                .entry(output.stream)
                .or_default()
                .queues
                .entry(output.partition_key)
                .or_default()
                .push_back(Queued {
                    publish: id,
                    data: output.data,
                });
        }
        self.metrics.pending.set(self.held_outputs as u64);
    }

    /// The earliest retry time of a stream that has something to put.
    fn next_retry(&self) -> Option<Instant> {
        self.streams
            .values()
            .filter(|s| !s.putting && !s.queues.is_empty())
            .filter_map(|s| s.retry_at)
            .min()
    }

    /// Starts a call for every stream that has heads to put, none under
    /// way, and no backoff pending.
    fn start_puts(&mut self) {
        let now = Instant::now();
        for (stream, state) in &mut self.streams {
            if state.putting || state.queues.is_empty() || state.retry_at.is_some_and(|at| now < at)
            {
                continue;
            }
            let mut keys = Vec::new();
            let mut records = Vec::new();
            let mut bytes = 0;
            // Round robin: the keys after the cursor, then from the start.
            let cursor = state.cursor.as_ref();
            let after = state.queues.range::<PartitionKey, _>((
                cursor.map_or(Bound::Unbounded, Bound::Excluded),
                Bound::Unbounded,
            ));
            let before = state
                .queues
                .range::<PartitionKey, _>((
                    Bound::Unbounded,
                    cursor.map_or(Bound::Unbounded, Bound::Included),
                ))
                .take(if cursor.is_some() { usize::MAX } else { 0 });
            for (key, queue) in after.chain(before) {
                let Some(head) = queue.front() else { continue };
                let size = head.data.len() + key.as_str().len();
                if !records.is_empty() && bytes + size > MAX_BYTES_PER_PUT {
                    break;
                }
                bytes += size;
                keys.push(key.clone());
                records.push((key.clone(), head.data.clone()));
                if records.len() == MAX_RECORDS_PER_PUT {
                    break;
                }
            }
            state.cursor = keys.last().cloned();
            state.putting = true;
            self.metrics.calls.inc();
            self.metrics.call_size.observe(records.len() as f64);
            let sink = self.sink.clone();
            let stream = stream.clone();
            let task = stream.clone();
            let handle = self.puts.spawn(async move {
                let result = sink.put_records(&task, &records).await;
                Put {
                    stream: task,
                    keys,
                    result,
                }
            });
            self.calls.insert(handle.id(), stream);
        }
    }

    /// A call's task failed without reporting (a panic in the sink): none
    /// of its outputs count as put; the stream tries again after a backoff.
    fn call_failed(&mut self, error: tokio::task::JoinError) {
        let Some(stream) = self.calls.remove(&error.id()) else {
            return;
        };
        tracing::error!(subscription = %self.subscription, stream = %stream, error = %error, "output put task failed; its outputs are put again");
        self.metrics.failed.inc();
        if let Some(state) = self.streams.get_mut(&stream) {
            state.putting = false;
            let backoff = state.backoff.get_or_insert_with(|| {
                Backoff::new(Duration::from_millis(100), Duration::from_secs(10))
            });
            state.retry_at = Some(Instant::now() + backoff.next_wait());
        }
    }

    /// A call finished: accepted heads leave their queues (settling inputs
    /// whose last output it was); the rest wait for a retry.
    async fn finished(&mut self, put: Put) {
        let Put {
            stream,
            keys,
            result,
        } = put;
        let mut settled = Vec::new();
        let mut refused = None;
        let Some(state) = self.streams.get_mut(&stream) else {
            return;
        };
        state.putting = false;
        match result {
            Ok(results) => {
                for (key, result) in keys.iter().zip(results) {
                    if let Err(e) = result {
                        refused = Some(e);
                        continue;
                    }
                    let queue = state
                        .queues
                        .get_mut(key)
                        .expect("a key being put has a queue");
                    let head = queue.pop_front().expect("a key being put has a head");
                    if queue.is_empty() {
                        state.queues.remove(key);
                    }
                    self.held_outputs -= 1;
                    self.held_bytes -= head.data.len() + key.as_str().len();
                    if let Some(counter) = self.metrics.put.get(&stream) {
                        counter.inc();
                    }
                    let pending = self
                        .pending
                        .get_mut(&head.publish)
                        .expect("a queued output has its publish");
                    pending.left -= 1;
                    if pending.left == 0
                        && let Some(done) = self.pending.remove(&head.publish)
                    {
                        settled.push(done.ticket);
                    }
                }
            }
            Err(e) => refused = Some(e),
        }
        match refused {
            None => {
                state.backoff = None;
                state.retry_at = None;
            }
            Some(e) => {
                let backoff = state.backoff.get_or_insert_with(|| {
                    Backoff::new(Duration::from_millis(100), Duration::from_secs(10))
                });
                let wait = backoff.next_wait();
                state.retry_at = Some(Instant::now() + wait);
                let counter = match e {
                    KinesisError::Throttled(_) => &self.metrics.throttled,
                    _ => &self.metrics.failed,
                };
                counter.inc();
                self.unlogged += 1;
                if let Some(suppressed) = self.log.note(std::time::Instant::now()) {
                    tracing::warn!(subscription = %self.subscription, stream = %stream, error = %e, failures = self.unlogged, suppressed, ?wait, "outputs not put yet; their inputs stay unsettled (logged at most once every 10 s)");
                    self.unlogged = 0;
                }
            }
        }
        self.metrics.pending.set(self.held_outputs as u64);
        match settled.len() {
            0 => {}
            1 => self.settle(SettlementMsg::Settle(settled.remove(0))).await,
            _ => self.settle(SettlementMsg::SettleMany(settled)).await,
        }
    }

    async fn settle(&self, msg: SettlementMsg) {
        // Settlement outlives this stage (it ends when the last sender is
        // dropped), so this only fails if it died; the inputs are then read
        // again after a restart.
        let _ = self.settlement.send(msg).await;
    }
}

#[cfg(test)]
mod tests;

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
