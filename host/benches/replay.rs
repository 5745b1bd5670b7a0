//! Replay benchmark: how fast `shardlane replay` handles a range through
//! the Rust example (`guest-examples/rust/echo`), at the replay's default
//! read budget (1 GetRecords per shard per second) and at Kinesis's whole
//! one (`--reads-per-second 5`).
//!
//! Run: `cargo bench -p shardlane --bench replay`. Environment:
//! `SHARDLANE_BENCH_RECORDS` (default 20,000), `SHARDLANE_BENCH_SHARDS`
//! (default 4). Prints figures; BENCHMARKS.md records them.
//!
//! # What it does
//! Starts `kinesis-local`, pre-puts N records of 100 bytes over 200
//! partition keys into the stream, then runs the release `shardlane
//! replay --from -1h` on it, with the file lease store (the replay's
//! checkpoints in its own file, written every second) and the echo example
//! (which logs every record, within the default guest log rate), once per
//! budget. Each run's wall time is from the process's start to its exit
//! (start-up and the final checkpoint included); records/s is N over it.
//! The summary's `ack` count must be N.

// A benchmark reads as one measurement and fails loudly: the host's
// lints for unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::Path;
use std::time::{Duration, Instant};

use shardlane_testkit::{HostProcess, Kinesis, Language, build_examples, unique_name};

const KEYS: usize = 200;
const PAYLOAD: usize = 100;

fn main() -> anyhow::Result<()> {
    let records: usize = env_or("SHARDLANE_BENCH_RECORDS", 20_000)?;
    let shards: i32 = env_or("SHARDLANE_BENCH_SHARDS", 4)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(records, shards))
}

async fn run(records: usize, shards: i32) -> anyhow::Result<()> {
    let bin = Path::new(env!("CARGO_BIN_EXE_shardlane"));
    let examples = build_examples(Language::Rust)?;
    let kinesis = Kinesis::start().await?;
    let stream = unique_name("replay-bench");
    kinesis.create_stream(&stream, shards).await?;
    let started = Instant::now();
    for chunk in (0..records).collect::<Vec<_>>().chunks(10_000) {
        let batch: Vec<(String, Vec<u8>)> = chunk
            .iter()
            .map(|i| {
                let mut data = format!("record {i} ").into_bytes();
                data.resize(PAYLOAD, b'.');
                (format!("key-{}", i % KEYS), data)
            })
            .collect();
        kinesis.put_records(&stream, &batch).await?;
    }
    println!(
        "pre-put {records} records on {shards} shards in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    println!("| budget (reads/shard/s) | records | wall (s) | records/s |");
    println!("|---|---:|---:|---:|");
    for budget in ["1", "5"] {
        let dir = tempfile::tempdir()?;
        let config = format!(
            r#"
[aws]
region = "us-east-1"

[lease]
store = "file"
path = "{}"

[[subscription]]
name = "bench"
stream = "{stream}"
plugin = "{}"
"#,
            dir.path().join("leases").display(),
            examples.echo.display()
        );
        let started = Instant::now();
        let mut replay = HostProcess::start_command(
            bin,
            "replay",
            &config,
            &[
                "--subscription",
                "bench",
                "--from",
                "-1h",
                "--reads-per-second",
                budget,
            ],
            &[("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())],
        )?;
        let status = replay.wait_exit(Duration::from_secs(1_800)).await?;
        let wall = started.elapsed();
        let summary: Vec<String> = replay
            .lines()
            .iter()
            .filter_map(|l| l["unparsed"].as_str().map(str::to_owned))
            .collect();
        anyhow::ensure!(status.success(), "replay failed: {}", replay.stderr());
        anyhow::ensure!(
            summary
                .iter()
                .any(|l| l.contains(&format!("outcomes: ack {records},"))),
            "not every record acked: {summary:?}"
        );
        println!(
            "| {budget} | {records} | {:.1} | {:.0} |",
            wall.as_secs_f64(),
            records as f64 / wall.as_secs_f64()
        );
    }
    Ok(())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v}: not a number")),
        Err(_) => Ok(default),
    }
}
