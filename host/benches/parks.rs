//! Parks benchmark: a quarantine on DynamoDB (dynalite) taking many keys.
//! One shard holds N records, each of its own 256-byte partition key and
//! each a poison record (the retry guest's `hold:100`, with
//! `max_attempts = 1`): every one parks its key. Prints parks a second
//! (from the first parked record's log line to the last) and checks that
//! every key is parked, as the lease store keeps them.
//!
//! Run: `cargo bench -p shardlane --bench parks` (release build).
//! `SHARDLANE_BENCH_KEYS` sets N (default 10,000); `SHARDLANE_BENCH_WORKERS`
//! the `by_key` lanes (default 8).

// A benchmark reads as one measurement and fails loudly: the host's
// lints for unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use shardlane_testkit::admin::{http, metric_sum};
use shardlane_testkit::{Dynalite, HostProcess, Kinesis, guests, unique_name};

fn env_or(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} does not parse")),
        Err(_) => Ok(default),
    }
}

fn config(
    table: &str,
    stream: &str,
    dlq: &str,
    plugin: &std::path::Path,
    keys: usize,
    workers: usize,
) -> String {
    format!(
        r#"
[aws]
region = "us-east-1"

[admin]
listen = "127.0.0.1:0"

[lease]
store = "dynamodb"
table = "{table}"
create_table = true

[[subscription]]
name = "parks"
stream = "{stream}"
plugin = "{plugin}"
start = "trim_horizon"
max_reads_per_second = 20
workers = {workers}
by_key = true
max_attempts = 1
on_failure = "quarantine"
dead_letter_stream = "{dlq}"
quarantine = {{ max_keys = {keys}, max_records = 10 }}
"#,
        plugin = plugin.display()
    )
}

fn main() -> anyhow::Result<()> {
    let keys = env_or("SHARDLANE_BENCH_KEYS", 10_000)?;
    let workers = env_or("SHARDLANE_BENCH_WORKERS", 8)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let plugin = guests::build()?.retry.clone();
        let kinesis = Kinesis::start().await?;
        let dynalite = Dynalite::start().await?;
        let (stream, dlq) = (unique_name("parks"), unique_name("parks-dlq"));
        kinesis.create_stream(&stream, 1).await?;
        kinesis.create_stream(&dlq, 1).await?;
        let key = |i: usize| format!("{i:0>256}");
        let records: Vec<(String, Vec<u8>)> = (0..keys).map(|i| (key(i), b"hold:100".to_vec())).collect();
        for chunk in records.chunks(500) {
            kinesis.put_records(&stream, chunk).await?;
        }
        let cfg = config(&unique_name("leases"), &stream, &dlq, &plugin, keys, workers);
        let env = [
            ("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint()),
            ("AWS_ENDPOINT_URL_DYNAMODB", dynalite.endpoint()),
        ];
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_shardlane"));
        let mut host = HostProcess::start_with(&bin, &cfg, &env)?;
        host.wait_for("admin listening", Duration::from_secs(60), |lines| {
            lines.iter().any(|l| l["message"].as_str().unwrap_or_default().starts_with("admin listening"))
        })
        .await?;
        let addr = host
            .lines()
            .iter()
            .find(|l| l["message"].as_str().unwrap_or_default().starts_with("admin listening"))
            .and_then(|l| l["addr"].as_str().map(str::to_owned))
            .expect("the admin address");
        let started = Instant::now();
        let mut first = None;
        loop {
            let (_, metrics) = http(&addr, "GET", "/metrics", None, b"");
            let parked = metric_sum(&metrics, "shardlane_records_parked_total", &[]);
            if parked > 0.0 && first.is_none() {
                first = Some((Instant::now(), parked));
            }
            if parked >= keys as f64 {
                break;
            }
            anyhow::ensure!(started.elapsed() < Duration::from_secs(1_800), "{parked} of {keys} parked in 30 min");
            // Polling the host's count.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (since, at) = first.expect("a first park");
        let took = since.elapsed();
        let (_, metrics) = http(&addr, "GET", "/metrics", None, b"");
        let gauge = metric_sum(&metrics, "shardlane_parked_keys", &[]);
        println!(
            "parks benchmark: {keys} keys of 256 bytes on one shard, by_key workers = {workers}, dynalite"
        );
        println!(
            "parked {keys} keys in {took:.2?} after the first: {:.0} parks/s; shardlane_parked_keys = {gauge}",
            (keys as f64 - at) / took.as_secs_f64()
        );
        assert!(host.terminate().await?.success());
        anyhow::ensure!(gauge as usize == keys, "{gauge} keys parked, not {keys}");
        anyhow::Ok(())
    })
}
