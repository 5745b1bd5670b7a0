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

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardlane::channel::{self, Delivery, Record};
use shardlane::config::{
    BatchConfig, DispatchMode, FailurePolicy, OnFailure, SandboxConfig, StartPosition,
    SubscriptionConfig, defaults,
};
use shardlane::dispatch::{Dispatcher, Handler, HandlerFactory};
use shardlane::ids::{LaneId, PartitionKey, SequenceNumber, ShardId, StreamName};
use shardlane::plugin::{CallError, Outcome, PluginError, PluginHost};
use shardlane::settlement::{SETTLEMENT_QUEUE, Settlement, SettlementMsg, Ticket};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const SHARDS: usize = 4;
const KEYS: usize = 100;
const PAYLOAD: usize = 100;
const READ: usize = 500;

/// The native stand-in for a guest: acks everything.
struct NativeNoop;

impl Handler for NativeNoop {
    async fn handle(&mut self, _record: &Arc<Record>, _attempt: u32) -> Result<Outcome, CallError> {
        Ok(Outcome::Ack)
    }

    async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
    ) -> Result<Vec<Outcome>, CallError> {
        Ok(records.iter().map(|_| Outcome::Ack).collect())
    }
}

impl HandlerFactory for NativeNoop {
    type Handler = NativeNoop;

    async fn create(&self, _lane: LaneId) -> Result<NativeNoop, PluginError> {
        Ok(NativeNoop)
    }
}

fn subscription(dispatch: DispatchMode, batch: Option<usize>) -> Arc<SubscriptionConfig> {
    Arc::new(SubscriptionConfig {
        name: "bench".into(),
        stream: "bench".into(),
        plugin: "bench.wasm".into(),
        start: StartPosition::TrimHorizon,
        poll_idle: Duration::from_millis(200),
        checkpoint_every: Duration::from_secs(1),
        read_limit: READ as i32,
        handler_timeout: Duration::from_secs(30),
        retry_backoff_initial: Duration::from_millis(100),
        retry_backoff_max: Duration::from_secs(1),
        shutdown_timeout: Duration::from_secs(10),
        dispatch,
        batch: batch.map(|size| BatchConfig {
            size,
            window: Duration::from_millis(50),
        }),
        failure: FailurePolicy {
            max_attempts: None,
            max_record_age: None,
            on_failure: OnFailure::Block,
            bisect_on_error: false,
        },
        sandbox: sandbox(),
    })
}

fn sandbox() -> SandboxConfig {
    SandboxConfig {
        max_memory: defaults::MAX_MEMORY,
        fuel: None,
        env: Vec::new(),
        preopen: None,
        log_rate: defaults::LOG_RATE,
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
                stream: stream.clone(),
                shard: shards[i % SHARDS].clone(),
                partition_key: keys[i % KEYS].clone(),
                sequence: SequenceNumber::parse(&format!(
                    "4968077160997593677831708162662978015617108198{:010}",
                    i
                ))
                .unwrap(),
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
    let (deliveries_tx, deliveries_rx) = channel::channel();
    let (settle_tx, settle_rx) = mpsc::channel(SETTLEMENT_QUEUE);
    let (checkpoint_tx, mut checkpoint_rx) = mpsc::channel(1024);
    let sink = tokio::spawn(async move { while checkpoint_rx.recv().await.is_some() {} });
    let settlement = tokio::spawn(
        Settlement::new(sub.name.clone(), sub.checkpoint_every, checkpoint_tx).run(settle_rx),
    );
    let dispatcher = tokio::spawn(
        Dispatcher::new(
            sub.clone(),
            factory,
            settle_tx.clone(),
            None,
            shardlane::telemetry::Telemetry::new(),
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
                session: 1,
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
                    session: 1,
                    sequences: chunk.iter().map(|r| r.sequence.clone()).collect(),
                })
                .await
                .unwrap();
            for record in chunk {
                let ticket = Ticket {
                    shard: shard.clone(),
                    session: 1,
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
    for (name, mode, batch, count) in modes {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let sub = subscription(mode, batch);
        let best = |f: &dyn Fn() -> Duration| (0..3).map(|_| f()).min().unwrap();
        let wasm = best(&|| {
            let recs = records(count);
            if batch.is_some() {
                runtime.block_on(run(sub.clone(), noop_batch.clone(), recs))
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
    recycle_cost(&runtime, &host, &guests)?;
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
        stream: base.stream.clone(),
        shard: base.shard.clone(),
        partition_key: base.partition_key.clone(),
        sequence: base.sequence.clone(),
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
            let failed = instance.handle(&trap, 1).await;
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
