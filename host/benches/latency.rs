//! Put → handle latency on an idle stream, at the host's default read
//! settings: what the polling defaults (`poll_idle`, `max_reads_per_second`,
//! the idle ramp) cost a record that arrives on a quiet shard.
//!
//! Run: `cargo bench -p shardlane --bench latency` (release build; about
//! two minutes). Environment: `SHARDLANE_BENCH_LATENCY_RECORDS` (default
//! 150), `SHARDLANE_BENCH_EXTRA` (lines added to the subscription, e.g.
//! `max_reads_per_second = 4` to compare settings in one sitting),
//! `SHARDLANE_BENCH_GAP_MS` (the longest pause between two puts, default
//! 900; pauses are uniform from 100 ms to it), `SHARDLANE_BENCH_BIN`
//! (another `shardlane` binary to measure, e.g. an older commit's build,
//! for a before/after in one sitting; default: this build's).
//!
//! What it does: starts `kinesis-local`, creates a 4-shard stream, starts
//! `shardlane run` (memory store, `start = "latest"`, the echo guest, the
//! binary's own log filter) and waits until every shard's iterator is
//! open. Then it puts single records with random keys, one at a time with
//! random pauses, noting the wall clock just before each put; the latency
//! of a record is the `timestamp` of the guest's log line for it (the
//! host's wall clock, same machine) less that put time. Prints p50, p90,
//! p99 and max. BENCHMARKS.md records the figures; compare only runs made
//! in one sitting on one machine.

// A benchmark reads as one measurement and fails loudly: the host's
// lints for unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use rand::Rng as _;
use shardlane_testkit::{HostProcess, Kinesis, guests};

const SHARDS: i32 = 4;
const STREAM: &str = "latency";

fn main() -> anyhow::Result<()> {
    let records: usize = env_or("SHARDLANE_BENCH_LATENCY_RECORDS", 150)?;
    let max_gap: u64 = env_or("SHARDLANE_BENCH_GAP_MS", 900)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(records, max_gap.max(100)))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} does not parse")),
        Err(_) => Ok(default),
    }
}

async fn run(records: usize, max_gap: u64) -> anyhow::Result<()> {
    let bin = match std::env::var_os("SHARDLANE_BENCH_BIN") {
        Some(other) if !Path::new(&other).is_file() => {
            bail!("SHARDLANE_BENCH_BIN: {} is not a file", other.display())
        }
        Some(other) => PathBuf::from(other),
        None => PathBuf::from(env!("CARGO_BIN_EXE_shardlane")),
    };
    println!("measuring {}", bin.display());
    println!("building the guests …");
    let guests = guests::build()?;
    println!("starting kinesis-local …");
    let kinesis = Kinesis::start().await?;
    kinesis.create_stream(STREAM, SHARDS).await?;
    let extra = std::env::var("SHARDLANE_BENCH_EXTRA").unwrap_or_default();
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
name = "latency"
stream = "{STREAM}"
plugin = "{plugin}"
start = "latest"
{extra}
"#,
        cache = cache.path().display(),
        plugin = guests.echo.display(),
    );
    let mut host = HostProcess::start_as_deployed(
        &bin,
        &config,
        &[("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())],
    )?;
    host.wait_for(
        "every shard positioned",
        Duration::from_secs(180),
        |lines| {
            lines
                .iter()
                .filter(|l| {
                    l["message"] == "shard iterator opened"
                        || l["message"] == "subscribed to the shard"
                })
                .count()
                >= SHARDS as usize
        },
    )
    .await?;
    println!(
        "putting {records} records one at a time, pauses of 100–{max_gap} ms, settings: {}",
        if extra.trim().is_empty() {
            "defaults"
        } else {
            extra.trim()
        }
    );
    let mut put_at = Vec::with_capacity(records);
    for i in 0..records {
        let pause = rand::rng().random_range(100..=max_gap);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let key = format!("key-{}", rand::rng().random_range(0..1000));
        put_at.push(SystemTime::now());
        kinesis
            .put_records(STREAM, &[(key, format!("r{i}").into_bytes())])
            .await?;
    }
    host.wait_for("every record handled", Duration::from_secs(60), |lines| {
        lines.iter().filter(|l| l["target"] == "guest").count() >= records
    })
    .await?;
    let lines = host.lines();
    host.terminate().await?;

    let mut latencies = Vec::with_capacity(records);
    for line in lines.iter().filter(|l| l["target"] == "guest") {
        let message = line["message"].as_str().unwrap_or_default();
        let Some(i) = message
            .split_once("data=\"r")
            .and_then(|(_, rest)| rest.trim_end_matches('"').parse::<usize>().ok())
        else {
            continue;
        };
        let at = humantime::parse_rfc3339_weak(line["timestamp"].as_str().context("timestamp")?)
            .context("timestamp")?;
        let latency = at.duration_since(put_at[i]).unwrap_or(Duration::ZERO);
        latencies.push(latency);
    }
    if latencies.len() != records {
        bail!("{} of {records} records found in the log", latencies.len());
    }
    latencies.sort();
    let pct = |p: f64| {
        latencies[((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1]
    };
    println!();
    println!("| records | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|");
    println!(
        "| {records} | {} ms | {} ms | {} ms | {} ms |",
        pct(0.50).as_millis(),
        pct(0.90).as_millis(),
        pct(0.99).as_millis(),
        latencies.last().map_or(0, Duration::as_millis)
    );
    Ok(())
}
