//! Shadow memory benchmark: a lane's handler with a shadow that sleeps
//! 1 s a call, fed records of 1 MiB as fast as the live version (the noop
//! guest) acks them — a flood of large records the shadow cannot keep up
//! with. Prints this process's resident memory before and at its peak,
//! the calls the shadow made and dropped, against the queue's bound (64
//! MiB) and what a queue bounded by count alone (256 calls) would hold.
//!
//! Run: `cargo bench -p shardlane --bench shadow` (release build). No
//! network: the plugin slot and its handler are driven directly.

// A benchmark reads as one measurement and fails loudly: the host's
// lints for unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardlane::bench::{
    CallState, Handler, HandlerFactory, Installed, LaneId, PluginSlot, Record, SandboxConfig,
    SequenceNumber, Telemetry,
};
use shardlane::{PartitionKey, PluginHost, ShardId, StreamName, defaults};

/// Records fed to the live version.
const RECORDS: usize = 600;

/// Each record's data.
const RECORD_BYTES: usize = 1 << 20;

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

fn rss_mib() -> f64 {
    shardlane_testkit::procfs::process_rss_kb(std::process::id()).unwrap_or(0) as f64 / 1024.0
}

fn record(i: usize) -> Arc<Record> {
    let mut data = b"sleep=1000;".to_vec();
    data.resize(RECORD_BYTES, b'x');
    Arc::new(Record {
        window: None,
        stream: StreamName::from("bench"),
        shard: ShardId::from("shardId-000000000000"),
        partition_key: PartitionKey::new(format!("k{}", i % 16)),
        sequence: SequenceNumber::parse(&(1000 + i).to_string()).expect("digits"),
        sub_sequence: None,
        arrival_ms: 0,
        data,
    })
}

fn main() -> anyhow::Result<()> {
    let guests = shardlane_testkit::guests::build()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let host = PluginHost::for_checks()?;
        let timeout = Duration::from_secs(30);
        let noop = host.load(&guests.noop, "bench".into(), timeout, sandbox())?;
        let telemetry = Telemetry::new();
        let status = telemetry.subscription(&"bench".into(), "sequential".into());
        let slot = Arc::new(PluginSlot::new(
            host,
            noop,
            timeout,
            sandbox(),
            status,
            telemetry.clone(),
        ));
        let slow = slot
            .prepare_shadow(std::fs::read(&guests.slow)?, "bench")
            .await?;
        let installed = Installed {
            stable: slot.current(),
            canary: None,
            shadow: Some((slow, 1)),
        };
        slot.set(installed, "bench", Instant::now()).await;
        let mut handler = slot.create(LaneId(0)).await?;
        // A warm-up call, so the instances' memory is in the baseline.
        let mut state = CallState::default();
        handler.handle(&record(0), 1, &mut state).await?;
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let before = rss_mib();
        let mut peak = before;
        let started = Instant::now();
        for i in 1..=RECORDS {
            let mut state = CallState::default();
            handler.handle(&record(i), 1, &mut state).await?;
            peak = peak.max(rss_mib());
        }
        let fed = started.elapsed();
        let (_, [calls, dropped, ..]) = slot.shadow().expect("a shadow runs");
        println!(
            "shadow benchmark: {RECORDS} records of {} MiB fed in {fed:.2?} to a live noop version, its shadow sleeping 1 s a call",
            RECORD_BYTES >> 20
        );
        println!(
            "resident memory: {before:.1} MiB before, {peak:.1} MiB at peak (+{:.1} MiB); queue bound 64 MiB (a count bound alone: 256 calls = {} MiB)",
            peak - before,
            (256 * RECORD_BYTES) >> 20
        );
        println!("shadow: {calls} calls made, {dropped} dropped while feeding");
        anyhow::Ok(())
    })
}
