//! Dispatch benchmark: synthetic records, no network, through the real
//! channel → dispatch (lanes, batches) → settlement stages, once with the
//! no-op Wasm guests and once with a native no-op handler in their place.
//!
//! Run: `cargo bench -p shardlane --bench dispatch` (release build). Prints
//! records/s per mode and the Wasm/native ratio. Everything runs on a
//! current-thread runtime: one core.
//!
//! A "reader" task stands in for the shard readers: records are made before
//! the clock starts (as a reader would make them from GetRecords), then it
//! tracks them with settlement in reads of 500 and sends them into the
//! channel, round-robin over 4 shards, 100 partition keys, 100-byte payloads.
//! The clock stops when settlement has seen every record settle and ended.

// A benchmark reads as one measurement and fails loudly: the host's
// lints for unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shardlane::bench::{
    BatchConfig, CallError, CallState, Delivery, DispatchMode, Dispatcher, FailurePolicy, Grants,
    Handled, Handler, HandlerFactory, KinesisError, LaneId, OnFailure, Outcome, Output,
    OutputStage, PUBLISH_QUEUE, Policy, Position, Publish, PutRecords, ReadMode, Record,
    SETTLEMENT_QUEUE, SandboxConfig, SequenceNumber, SessionId, Settlement, SettlementMsg,
    StartPosition, SubscriptionConfig, Telemetry, Ticket, WindowClose, channel,
};
use shardlane::{PartitionKey, PluginHost, ShardId, StreamName, defaults};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const SHARDS: usize = 4;
const KEYS: usize = 100;
const PAYLOAD: usize = 100;
const READ: usize = 500;

/// The native stand-in for a guest: acks everything.
struct NativeNoop;

impl Handler for NativeNoop {
    async fn handle(
        &mut self,
        _record: &Arc<Record>,
        _attempt: u32,
        _state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        Ok(Handled::new(Outcome::Ack))
    }

    async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
        _state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        Ok(Handled::new(records.iter().map(|_| Outcome::Ack).collect()))
    }

    async fn close_window(
        &mut self,
        _close: &Arc<WindowClose>,
        _attempt: u32,
        _state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        Ok(Handled::new(Outcome::Ack))
    }
}

impl HandlerFactory for NativeNoop {
    type Handler = NativeNoop;
    type Error = std::convert::Infallible;

    async fn create(&self, _lane: LaneId) -> Result<NativeNoop, Self::Error> {
        Ok(NativeNoop)
    }
}

/// The native stand-in for a guest with one output per input: publishes
/// each record's data to `bench-out`, acks.
struct NativePublish;

impl Handler for NativePublish {
    async fn handle(
        &mut self,
        record: &Arc<Record>,
        _attempt: u32,
        _state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        Ok(Handled {
            outcome: Outcome::Ack,
            outputs: vec![Output {
                input: 0,
                stream: StreamName::from("bench-out"),
                partition_key: record.partition_key.clone(),
                data: record.data.clone(),
            }],
        })
    }

    async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
        _state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        Ok(Handled {
            outcome: records.iter().map(|_| Outcome::Ack).collect(),
            outputs: records
                .iter()
                .enumerate()
                .map(|(i, (r, _))| Output {
                    input: i as u32,
                    stream: StreamName::from("bench-out"),
                    partition_key: r.partition_key.clone(),
                    data: r.data.clone(),
                })
                .collect(),
        })
    }

    async fn close_window(
        &mut self,
        _close: &Arc<WindowClose>,
        _attempt: u32,
        _state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        Ok(Handled::new(Outcome::Ack))
    }
}

impl HandlerFactory for NativePublish {
    type Handler = NativePublish;
    type Error = std::convert::Infallible;

    async fn create(&self, _lane: LaneId) -> Result<NativePublish, Self::Error> {
        Ok(NativePublish)
    }
}

/// Kinesis stood in for by memory: accepts every record after `latency`
/// (a network round trip), counting calls and records.
struct LocalSink {
    latency: Duration,
    calls: AtomicU64,
    records: AtomicU64,
    largest: AtomicU64,
}

impl LocalSink {
    fn new(latency: Duration) -> Arc<Self> {
        Arc::new(Self {
            latency,
            calls: AtomicU64::new(0),
            records: AtomicU64::new(0),
            largest: AtomicU64::new(0),
        })
    }
}

#[async_trait::async_trait]
impl PutRecords for LocalSink {
    async fn put_records(
        &self,
        _stream: &StreamName,
        records: &[(PartitionKey, Vec<u8>)],
    ) -> Result<Vec<Result<(), KinesisError>>, KinesisError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.records
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        self.largest
            .fetch_max(records.len() as u64, Ordering::Relaxed);
        Ok(records.iter().map(|_| Ok(())).collect())
    }
}

fn subscription(dispatch: DispatchMode, batch: Option<usize>) -> Arc<SubscriptionConfig> {
    Arc::new(SubscriptionConfig {
        window: None,
        name: "bench".into(),
        stream: "bench".into(),
        plugin: "bench.wasm".into(),
        canary: None,
        start: StartPosition::TrimHorizon,
        read: ReadMode::Polling,
        poll_idle: Duration::from_millis(200),
        poll_idle_max: Duration::from_secs(1),
        max_reads_per_second: 4.0,
        checkpoint_every: Duration::from_secs(1),
        read_limit: READ as i32,
        handler_timeout: Duration::from_secs(30),
        retry_backoff_initial: Duration::from_millis(100),
        retry_backoff_max: Duration::from_secs(1),
        shutdown_timeout: Duration::from_secs(10),
        dispatch,
        batch: batch.map(|size| BatchConfig {
            size,
            max_bytes: usize::MAX,
            window: Duration::from_millis(50),
        }),
        failure: FailurePolicy {
            max_attempts: None,
            max_record_age: None,
            on_failure: OnFailure::Block,
            bisect_on_error: false,
            quarantine: shardlane::ParkLimits {
                max_keys: 1,
                max_records: 1,
            },
        },
        sandbox: sandbox(),
        filter: None,
    })
}

/// One output per input: records/s with and without it (the output stage
/// putting to a local sink, with no latency and with a 2 ms round trip),
/// and how full the `PutRecords` calls are.
fn outputs_cost(
    runtime: &tokio::runtime::Runtime,
    host: &PluginHost,
    guests: &shardlane_testkit::guests::Guests,
) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(30);
    let mut granted = sandbox();
    granted.grants = Arc::new(Grants {
        outputs: [StreamName::from("bench-out")].into_iter().collect(),
        ..Grants::default()
    });
    let noop = Arc::new(host.load(&guests.noop, "bench".into(), timeout, sandbox())?);
    let publish = Arc::new(host.load(&guests.noop_publish, "bench".into(), timeout, granted)?);
    println!();
    println!("outputs: one per input, the output stage putting to a local sink ({KEYS} keys)");
    println!(
        "{:<34} {:>12} {:>12} {:>8} {:>16}",
        "mode", "none rec/s", "output rec/s", "ratio", "outputs per put"
    );
    let count = 200_000;
    for (name, mode, batch) in [
        ("sequential", DispatchMode::Sequential, None),
        ("workers = 4, by_key", DispatchMode::ByKey(4), None),
        ("batch 100 (native)", DispatchMode::Sequential, Some(100)),
    ] {
        let sub = subscription(mode, batch);
        for latency in [Duration::ZERO, Duration::from_millis(2)] {
            for wasm in [false, true] {
                if wasm && batch.is_some() {
                    continue;
                }
                let sink = LocalSink::new(latency);
                let best = |f: &dyn Fn() -> Duration| (0..3).map(|_| f()).min().unwrap();
                let without = best(&|| {
                    if wasm {
                        runtime.block_on(run(sub.clone(), noop.clone(), records(count)))
                    } else {
                        runtime.block_on(run(sub.clone(), Arc::new(NativeNoop), records(count)))
                    }
                });
                let with = best(&|| {
                    let sink = Some(sink.clone());
                    if wasm {
                        runtime.block_on(run_with(
                            sub.clone(),
                            publish.clone(),
                            records(count),
                            sink,
                        ))
                    } else {
                        runtime.block_on(run_with(
                            sub.clone(),
                            Arc::new(NativePublish),
                            records(count),
                            sink,
                        ))
                    }
                });
                let rate = |d: Duration| count as f64 / d.as_secs_f64();
                let calls = sink.calls.load(Ordering::Relaxed).max(1);
                let per_put = sink.records.load(Ordering::Relaxed) as f64 / calls as f64;
                println!(
                    "{:<34} {:>12.0} {:>12.0} {:>8.2} {:>9.1} (max {})",
                    format!(
                        "{name}, {} , {}ms",
                        if wasm { "wasm" } else { "native" },
                        latency.as_millis()
                    ),
                    rate(without),
                    rate(with),
                    rate(with) / rate(without),
                    per_put,
                    sink.largest.load(Ordering::Relaxed)
                );
            }
        }
    }
    Ok(())
}

fn sandbox() -> SandboxConfig {
    SandboxConfig {
        max_memory: defaults::MAX_MEMORY,
        fuel: None,
        env: Vec::new(),
        preopen: None,
        log_rate: defaults::LOG_RATE,
        grants: Default::default(),
    }
}

fn records(count: usize) -> Vec<Arc<Record>> {
    let stream = StreamName::from("bench");
    let shards: Vec<ShardId> = (0..SHARDS)
        .map(|s| ShardId::new(format!("shardId-{s:012}")))
        .collect();
    let keys: Vec<PartitionKey> = (0..KEYS)
        .map(|k| PartitionKey::new(format!("customer-{k}")))
        .collect();
    (0..count)
        .map(|i| {
            Arc::new(Record {
                window: None,
                stream: stream.clone(),
                shard: shards[i % SHARDS].clone(),
                partition_key: keys[i % KEYS].clone(),
                sequence: SequenceNumber::parse(&format!(
                    "4968077160997593677831708162662978015617108198{:010}",
                    i
                ))
                .unwrap(),
                sub_sequence: None,
                arrival_ms: 1_764_633_600_000,
                data: vec![b'x'; PAYLOAD],
            })
        })
        .collect()
}

/// Pushes `records` through the pipeline; returns the elapsed time.
async fn run<F: HandlerFactory>(
    sub: Arc<SubscriptionConfig>,
    factory: Arc<F>,
    records: Vec<Arc<Record>>,
) -> Duration {
    run_with(sub, factory, records, None).await
}

/// [`run`], with the output stage putting to `outputs` when given (for
/// handlers that publish).
async fn run_with<F: HandlerFactory>(
    sub: Arc<SubscriptionConfig>,
    factory: Arc<F>,
    records: Vec<Arc<Record>>,
    outputs: Option<Arc<LocalSink>>,
) -> Duration {
    let (deliveries_tx, deliveries_rx) = channel();
    let (publish_tx, publish_rx) = mpsc::channel::<Publish>(PUBLISH_QUEUE);
    let (settle_tx, settle_rx) = mpsc::channel(SETTLEMENT_QUEUE);
    let outputs_used = outputs.is_some();
    let stage = match outputs {
        Some(sink) => tokio::spawn(
            OutputStage::new(
                sub.name.clone(),
                [StreamName::from("bench-out")],
                sink,
                settle_tx.clone(),
                &Telemetry::new(),
            )
            .run(publish_rx, CancellationToken::new()),
        ),
        // Nothing publishes: the receiver only has to stay open.
        None => tokio::spawn(async move {
            let _open = publish_rx;
            std::future::pending::<()>().await
        }),
    };
    let (checkpoint_tx, mut checkpoint_rx) = mpsc::channel(1024);
    let sink = tokio::spawn(async move { while checkpoint_rx.recv().await.is_some() {} });
    let settlement = tokio::spawn(
        Settlement::new(sub.name.clone(), sub.checkpoint_every, checkpoint_tx).run(settle_rx),
    );
    let dispatcher = tokio::spawn(
        Dispatcher::new(
            sub.clone(),
            factory,
            Policy::new(&sub.failure, |_| {
                unreachable!("on_failure = block: no dead letters")
            }),
            settle_tx.clone(),
            publish_tx,
            Telemetry::new(),
        )
        .run(deliveries_rx, CancellationToken::new()),
    );
    // Per shard: its records in order.
    let mut per_shard: Vec<Vec<Arc<Record>>> = vec![Vec::new(); SHARDS];
    for (i, r) in records.into_iter().enumerate() {
        per_shard[i % SHARDS].push(r);
    }
    let started = Instant::now();
    for (s, _) in per_shard.iter().enumerate() {
        settle_tx
            .send(SettlementMsg::Open {
                shard: per_shard[s][0].shard.clone(),
                session: SessionId(1),
            })
            .await
            .unwrap();
    }
    let mut offsets = [0u64; SHARDS];
    let reads = per_shard[0].len().div_ceil(READ);
    for read in 0..reads {
        for (s, shard_records) in per_shard.iter().enumerate() {
            let chunk = &shard_records[(read * READ).min(shard_records.len())
                ..((read + 1) * READ).min(shard_records.len())];
            if chunk.is_empty() {
                continue;
            }
            let shard = chunk[0].shard.clone();
            settle_tx
                .send(SettlementMsg::Track {
                    shard: shard.clone(),
                    session: SessionId(1),
                    positions: chunk
                        .iter()
                        .map(|r| Position::whole(r.sequence.clone()))
                        .collect(),
                })
                .await
                .unwrap();
            for record in chunk {
                let ticket = Ticket {
                    shard: shard.clone(),
                    session: SessionId(1),
                    offset: offsets[s],
                };
                offsets[s] += 1;
                deliveries_tx
                    .send(Delivery {
                        record: record.clone(),
                        ticket,
                    })
                    .await
                    .unwrap();
            }
        }
    }
    drop(deliveries_tx);
    drop(settle_tx);
    dispatcher.await.unwrap();
    if outputs_used {
        stage.await.unwrap();
    } else {
        stage.abort();
    }
    settlement.await.unwrap();
    let elapsed = started.elapsed();
    sink.await.unwrap();
    elapsed
}

fn main() -> anyhow::Result<()> {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let guests = shardlane_testkit::guests::build()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let host = PluginHost::for_checks()?;
    let timeout = Duration::from_secs(30);
    let noop = Arc::new(host.load(&guests.noop, "bench".into(), timeout, sandbox())?);
    let noop_batch = Arc::new(host.load(&guests.noop_batch, "bench".into(), timeout, sandbox())?);
    let noop_run = Arc::new(host.load(&guests.noop_run, "bench".into(), timeout, sandbox())?);

    let modes: Vec<(&str, DispatchMode, Option<usize>, usize)> = vec![
        ("sequential", DispatchMode::Sequential, None, 400_000),
        ("workers = 4", DispatchMode::Workers(4), None, 400_000),
        ("workers = 4, by_key", DispatchMode::ByKey(4), None, 400_000),
        ("batch 100", DispatchMode::Sequential, Some(100), 2_000_000),
        ("batch 500", DispatchMode::Sequential, Some(500), 2_000_000),
        (
            "batch 100, workers = 4, by_key",
            DispatchMode::ByKey(4),
            Some(100),
            2_000_000,
        ),
        (
            "batch 500, workers = 4, by_key",
            DispatchMode::ByKey(4),
            Some(500),
            2_000_000,
        ),
    ];
    println!(
        "dispatch benchmark: current-thread runtime (one core), {SHARDS} shards, {KEYS} keys, {PAYLOAD}-byte records"
    );
    println!(
        "{:<34} {:>14} {:>14} {:>12}",
        "mode", "wasm rec/s", "native rec/s", "wasm/native"
    );
    let runs: Vec<(&str, DispatchMode, Option<usize>, usize)> = vec![
        (
            "0.3.0 runs, sequential",
            DispatchMode::Sequential,
            None,
            400_000,
        ),
        (
            "0.3.0 runs, workers = 4, by_key",
            DispatchMode::ByKey(4),
            None,
            400_000,
        ),
    ];
    for (name, mode, batch, count) in modes.into_iter().chain(runs) {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let sub = subscription(mode, batch);
        let best = |f: &dyn Fn() -> Duration| (0..3).map(|_| f()).min().unwrap();
        let wasm = best(&|| {
            let recs = records(count);
            if batch.is_some() {
                runtime.block_on(run(sub.clone(), noop_batch.clone(), recs))
            } else if name.starts_with("0.3.0") {
                runtime.block_on(run(sub.clone(), noop_run.clone(), recs))
            } else {
                runtime.block_on(run(sub.clone(), noop.clone(), recs))
            }
        });
        let native =
            best(&|| runtime.block_on(run(sub.clone(), Arc::new(NativeNoop), records(count))));
        let rate = |d: Duration| count as f64 / d.as_secs_f64();
        println!(
            "{:<34} {:>14.0} {:>14.0} {:>12.2}",
            name,
            rate(wasm),
            rate(native),
            rate(wasm) / rate(native)
        );
    }
    if filter.as_deref().is_none_or(|f| "outputs".contains(f)) {
        outputs_cost(&runtime, &host, &guests)?;
    }
    if filter.as_deref().is_none_or(|f| "recycle".contains(f)) {
        recycle_cost(&runtime, &host, &guests)?;
    }
    if filter.as_deref().is_none_or(|f| "spans".contains(f)) {
        span_cost(&runtime, &noop)?;
    }
    if filter.as_deref().is_none_or(|f| "languages".contains(f)) {
        languages(&runtime)?;
    }
    if filter.as_deref().is_none_or(|f| "filter".contains(f)) {
        filter_cost()?;
    }
    Ok(())
}

/// What an event filter costs a record: 200-byte JSON records against
/// Lambda-style patterns, the filter alone (no pipeline), best of three.
fn filter_cost() -> anyhow::Result<()> {
    use shardlane::{Filter, RecordView};
    let data: Vec<Vec<u8>> = (0..10_000)
        .map(|i| {
            let mut d = format!(
                r#"{{"kind": "{}", "amount": {}, "region": "eu-west-{}", "customer": "c-{:06}", "tags": ["a", "b"]"#,
                if i % 10 == 0 { "order" } else { "view" },
                i % 500,
                i % 3,
                i
            );
            while d.len() < 199 {
                d.push(' ');
            }
            d.push('}');
            d.into_bytes()
        })
        .collect();
    let cases: [(&str, &[&str]); 3] = [
        (
            "partition key prefix (no data rule)",
            &[r#"{"partitionKey": [{"prefix": "vip-"}]}"#],
        ),
        (
            "data: exact and numeric",
            &[r#"{"data": {"kind": ["order"], "amount": [{"numeric": [">", 100]}]}}"#],
        ),
        (
            "5 patterns: data and key",
            &[
                r#"{"data": {"kind": ["order"], "amount": [{"numeric": [">", 100]}]}}"#,
                r#"{"data": {"region": [{"prefix": "us-"}]}}"#,
                r#"{"data": {"customer": [{"wildcard": "c-0001*"}]}}"#,
                r#"{"data": {"tags": [{"anything-but": ["a", "b"]}]}}"#,
                r#"{"partitionKey": [{"prefix": "vip-"}]}"#,
            ],
        ),
    ];
    println!();
    println!("event filter alone: 200-byte JSON records, 10 % orders (one core)");
    for (label, patterns) in cases {
        let filter = Filter::parse(patterns)?;
        let once = || {
            let start = Instant::now();
            let mut admitted = 0usize;
            for _ in 0..20 {
                for (i, d) in data.iter().enumerate() {
                    let key = format!("k-{}", i % 200);
                    let view = RecordView {
                        partition_key: &key,
                        sequence_number: "49590338271490256608559692538361571095921575989136588898",
                        approximate_arrival_ms: 1_545_084_650_987,
                        data: d,
                    };
                    admitted += usize::from(filter.admits(&view));
                }
            }
            (start.elapsed(), admitted)
        };
        let (elapsed, admitted) = (0..3).map(|_| once()).min_by_key(|(d, _)| *d).unwrap();
        let n = 20 * data.len();
        println!(
            "  {label:<38} {:>12.0} rec/s {:>8.0} ns/rec  ({} % admitted)",
            n as f64 / elapsed.as_secs_f64(),
            elapsed.as_nanos() as f64 / n as f64,
            admitted * 100 / n
        );
    }
    Ok(())
}

/// What the handler-call spans cost: the sequential mode with no log
/// subscriber, with the service's JSON subscriber (spans on, its default),
/// and with the span target filtered out.
fn span_cost(
    runtime: &tokio::runtime::Runtime,
    noop: &Arc<shardlane::bench::Plugin>,
) -> anyhow::Result<()> {
    const COUNT: usize = 200_000;
    let sub = subscription(DispatchMode::Sequential, None);
    let timed = |filter: Option<&str>| {
        let go = || runtime.block_on(run(sub.clone(), noop.clone(), records(COUNT)));
        let elapsed = match filter {
            None => (0..3).map(|_| go()).min().unwrap(),
            Some(filter) => {
                let subscriber = tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .with_writer(std::io::sink)
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .finish();
                tracing::subscriber::with_default(subscriber, || {
                    (0..3).map(|_| go()).min().unwrap()
                })
            }
        };
        COUNT as f64 / elapsed.as_secs_f64()
    };
    println!();
    println!("handler-call spans, sequential mode (noop guest):");
    for (label, filter) in [
        ("no log subscriber", None),
        ("JSON logs, spans on (default)", Some("info")),
        (
            "JSON logs, shardlane::otel=off",
            Some("info,shardlane::otel=off"),
        ),
    ] {
        println!("  {label:<34} {:>10.0} rec/s", timed(filter));
    }
    Ok(())
}

/// Per guest language: the conformance examples' start-up (compile with a
/// cold cache, load with a warm one), instantiation from the
/// pre-instantiated component, and per-record cost through `handle` (echo)
/// and `handle-batch` of 500 (batch-sum).
fn languages(runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    use shardlane::bench::CompileCache;
    use shardlane_testkit::{Language, build_examples};
    const INSTANCES: u32 = 200;
    const CALLS: u32 = 20_000;
    const BATCHES: u32 = 100;
    let timeout = Duration::from_secs(30);
    println!();
    println!("guest languages (echo: handle; batch-sum: handle-batch of 500 records):");
    println!(
        "{:<11} {:>9} {:>12} {:>12} {:>13} {:>11} {:>15} {:>14}",
        "language",
        "size",
        "cold start",
        "warm start",
        "instantiate",
        "handle",
        "batch of 500",
        "per record"
    );
    let base = records(1).remove(0);
    let echo_record = base.clone();
    let batch: Vec<(Arc<Record>, u32)> = (0..500)
        .map(|i| {
            let r = Arc::new(Record {
                window: None,
                stream: base.stream.clone(),
                shard: base.shard.clone(),
                partition_key: base.partition_key.clone(),
                sequence: base.sequence.clone(),
                sub_sequence: None,
                arrival_ms: base.arrival_ms,
                data: format!("{{\"amount\": {i}}}").into_bytes(),
            });
            (r, 1)
        })
        .collect();
    for lang in Language::ALL {
        let examples = build_examples(lang)?;
        let size = std::fs::metadata(&examples.echo)?.len();
        let cache = tempfile::tempdir()?;
        let start = || -> anyhow::Result<(Duration, PluginHost)> {
            // What `shardlane run` does before it talks to AWS: the engine
            // (pool reservation, linker), then every plugin.
            let started = Instant::now();
            let host = PluginHost::new(defaults::MAX_MEMORY, defaults::MAX_CORE_INSTANCES, false)?
                .with_cache(Some(CompileCache::new(cache.path().to_owned())?));
            for path in [&examples.echo, &examples.batch_sum, &examples.poison] {
                host.load(path, "bench".into(), timeout, sandbox())?;
            }
            Ok((started.elapsed(), host))
        };
        let (cold, _) = start()?;
        let (warm, host) = start()?;
        let echo = host.load(&examples.echo, "bench".into(), timeout, sandbox())?;
        let sum = host.load(&examples.batch_sum, "bench".into(), timeout, sandbox())?;
        let (instantiate, handle, per_batch) = runtime.block_on(async {
            let started = Instant::now();
            for lane in 0..INSTANCES {
                drop(echo.instantiate(LaneId(lane)).await?);
            }
            let instantiate = started.elapsed() / INSTANCES;
            let mut instance = echo.instantiate(LaneId(0)).await?;
            let started = Instant::now();
            for _ in 0..CALLS {
                instance
                    .handle(&echo_record, 1, &mut CallState::default())
                    .await?;
            }
            let handle = started.elapsed() / CALLS;
            let mut instance = sum.instantiate(LaneId(0)).await?;
            let started = Instant::now();
            for _ in 0..BATCHES {
                instance
                    .handle_batch(&batch, &mut CallState::default())
                    .await?;
            }
            anyhow::Ok((instantiate, handle, started.elapsed() / BATCHES))
        })?;
        println!(
            "{:<11} {:>9} {:>12} {:>12} {:>13} {:>11} {:>15} {:>14}",
            lang.dir(),
            if size < 1_000_000 {
                format!("{:.0} KB", size as f64 / 1e3)
            } else {
                format!("{:.1} MB", size as f64 / 1e6)
            },
            format!("{:.2?}", cold),
            format!("{:.2?}", warm),
            format!("{:.1?}", instantiate),
            format!("{:.2?}", handle),
            format!("{:.1?}", per_batch),
            format!("{:.2?}", per_batch / 500)
        );
    }
    println!(
        "(start: the engine, then compiling (cold cache) or loading (warm) all three examples; the echo guest logs every record, with no log subscriber installed)"
    );
    Ok(())
}

/// What a trap costs the lane: the failed call, dropping the instance and
/// making a fresh one from the pre-instantiated component.
fn recycle_cost(
    runtime: &tokio::runtime::Runtime,
    host: &PluginHost,
    guests: &shardlane_testkit::guests::Guests,
) -> anyhow::Result<()> {
    const ROUNDS: u32 = 2_000;
    let timeout = Duration::from_secs(30);
    let noop = host.load(&guests.noop, "bench".into(), timeout, sandbox())?;
    let chaos = host.load(&guests.chaos, "bench".into(), timeout, sandbox())?;
    let base = records(1).remove(0);
    let trap = Arc::new(Record {
        window: None,
        stream: base.stream.clone(),
        shard: base.shard.clone(),
        partition_key: base.partition_key.clone(),
        sequence: base.sequence.clone(),
        sub_sequence: None,
        arrival_ms: base.arrival_ms,
        data: b"trap".to_vec(),
    });
    runtime.block_on(async {
        let started = Instant::now();
        for lane in 0..ROUNDS {
            drop(noop.instantiate(LaneId(lane)).await?);
        }
        let instantiate = started.elapsed() / ROUNDS;
        let mut instance = chaos.instantiate(LaneId(0)).await?;
        let started = Instant::now();
        for lane in 0..ROUNDS {
            let failed = instance.handle(&trap, 1, &mut CallState::default()).await;
            anyhow::ensure!(failed.is_err(), "the chaos guest traps on `trap`");
            instance = chaos.instantiate(LaneId(lane)).await?;
        }
        let recycle = started.elapsed() / ROUNDS;
        println!();
        println!("instance from the pre-instantiated component (noop guest): {instantiate:?}");
        println!("trap + drop + fresh instance (chaos guest, a panic): {recycle:?}");
        Ok(())
    })
}
