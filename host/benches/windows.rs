//! Window close latency: how long after a window's end its close reaches
//! the plugin, on a busy shard (closed by the first record of a later
//! window) and on a quiet one (closed at the tip once end plus `grace` has
//! passed), at the host's default read settings.
//!
//! Run: `cargo bench -p shardlane --bench windows` (release build; about a
//! minute). Environment: `SHARDLANE_BENCH_WINDOW` (the `window` value,
//! default `{ size = "2s", by = "key" }`: the default grace, 1 s),
//! `SHARDLANE_BENCH_BUSY_SECS` (how long records flow, default 20).
//!
//! What it does: starts `kinesis-local`, a 4-shard stream, and `shardlane
//! run` (memory store, `start = "latest"`, the `windowed` test guest with
//! `state = {}`, `workers = 4, by_key = true`). It puts 10 records over 40
//! keys every 50 ms while busy, then stops. The latency of a close is the
//! `timestamp` of the guest's `closed …` line (the host's wall clock, same
//! machine) less the window's end. Closes of windows that ended while
//! records flowed are *busy*; those of the last window of each key,
//! closed after the flow stopped, are *quiet*. Prints p50, p90 and max of
//! each. BENCHMARKS.md records the figures; compare only runs made in one
//! sitting on one machine.

// A benchmark reads as one measurement and fails loudly: the host's
// lints for unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use shardlane_testkit::{HostProcess, Kinesis, guests};

const SHARDS: i32 = 4;
const STREAM: &str = "windows";

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

fn ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn run() -> anyhow::Result<()> {
    let window = std::env::var("SHARDLANE_BENCH_WINDOW")
        .unwrap_or_else(|_| r#"{ size = "2s", by = "key" }"#.to_owned());
    let busy_secs: u64 = std::env::var("SHARDLANE_BENCH_BUSY_SECS")
        .ok()
        .map(|v| v.parse().context("SHARDLANE_BENCH_BUSY_SECS"))
        .transpose()?
        .unwrap_or(20);
    println!("building the guests …");
    let guests = guests::build()?;
    println!("starting kinesis-local …");
    let kinesis = Kinesis::start().await?;
    kinesis.create_stream(STREAM, SHARDS).await?;
    let cache = tempfile::tempdir()?;
    let config = format!(
        r#"
[aws]
region = "us-east-1"

[engine]
cache_dir = "{cache}"

[admin]
listen = "127.0.0.1:0"

[lease]
store = "memory"

[[subscription]]
name = "windows"
stream = "{STREAM}"
plugin = "{plugin}"
start = "latest"
state = {{}}
workers = 4
by_key = true
window = {window}
"#,
        cache = cache.path().display(),
        plugin = guests.windowed.display(),
    );
    let mut host = HostProcess::start_as_deployed(
        &PathBuf::from(env!("CARGO_BIN_EXE_shardlane")),
        &config,
        &[("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())],
    )?;
    host.wait_for(
        "every shard positioned",
        Duration::from_secs(180),
        |lines| {
            lines
                .iter()
                .filter(|l| l["message"] == "shard iterator opened")
                .count()
                >= SHARDS as usize
        },
    )
    .await?;
    println!("window = {window}; records flow for {busy_secs} s, then stop");
    let started = SystemTime::now();
    let mut n = 0usize;
    while started.elapsed()? < Duration::from_secs(busy_secs) {
        let batch: Vec<(String, Vec<u8>)> = (0..10)
            .map(|_| {
                n += 1;
                (format!("key-{}", n % 40), b"{\"amount\": 1}".to_vec())
            })
            .collect();
        kinesis.put_records(STREAM, &batch).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped = ms(SystemTime::now());
    host.wait_for(
        "the last windows closed",
        Duration::from_secs(60),
        |lines| {
            lines.iter().any(|l| {
                l["target"] == "guest"
                    && l["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("closed "))
                    && l["timestamp"]
                        .as_str()
                        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
                        .is_some_and(|t| ms(t) > stopped + 1_000)
            })
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lines = host.lines();
    host.terminate().await?;

    let (mut busy, mut quiet) = (Vec::new(), Vec::new());
    for line in lines.iter().filter(|l| l["target"] == "guest") {
        let message = line["message"].as_str().unwrap_or_default();
        let Some(window) = message
            .strip_prefix("closed ")
            .and_then(|m| m.split(' ').find_map(|w| w.strip_prefix("window=")))
        else {
            continue;
        };
        let end: u64 = window.split("..").nth(1).context("window end")?.parse()?;
        let at = humantime::parse_rfc3339_weak(line["timestamp"].as_str().context("timestamp")?)?;
        let latency = ms(at).saturating_sub(end);
        if end <= stopped {
            busy.push(latency);
        } else {
            quiet.push(latency);
        }
    }
    println!();
    println!("| closes | count | p50 | p90 | max |");
    println!("|---|---|---|---|---|");
    for (name, mut latencies) in [("busy shard", busy), ("quiet shard", quiet)] {
        latencies.sort_unstable();
        if latencies.is_empty() {
            println!("| {name} | 0 | | | |");
            continue;
        }
        let pct = |p: f64| {
            latencies[((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1]
        };
        println!(
            "| {name} | {} | {} ms | {} ms | {} ms |",
            latencies.len(),
            pct(0.5),
            pct(0.9),
            latencies.last().unwrap()
        );
    }
    Ok(())
}
