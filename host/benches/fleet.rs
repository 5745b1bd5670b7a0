//! Fleet benchmark: what leases cost a fleet on DynamoDB (requests per
//! shard-minute, idle and busy), what a host costs per shard when it holds
//! many, and how fast a fleet started together converges.
//!
//! Run: `cargo bench -p shardlane --bench fleet`. Environment:
//! `SHARDLANE_BENCH_PARTS` (a comma-separated subset of `requests`,
//! `many`, `thousand`; default all), `SHARDLANE_BENCH_WINDOW_SECS` (each
//! counting window, default 60), `SHARDLANE_BENCH_MANY_SHARDS` (default
//! 256), `SHARDLANE_BENCH_FLEET_SHARDS` (default 1000),
//! `SHARDLANE_BENCH_BASELINE` (another `shardlane` binary: the request
//! counts are also measured with it, in the same run — before/after in
//! one sitting; `SHARDLANE_BENCH_ONLY=baseline` measures it alone).
//! Prints figures; BENCHMARKS.md records them.
//!
//! # What it does
//! - **requests**: `kinesis-local` and `dynalite`, the test kit's fault
//!   proxy in front of dynalite passing everything and counting requests
//!   per operation. (A) 16 shards on one host, (B) 32 shards on four
//!   hosts, the default lease settings and `checkpoint_every`. Once every
//!   shard is held (read from dynalite directly, not through the proxy)
//!   and 15 s more have passed, the proxy's counts over one window with no
//!   records (idle), then over one window with about 5 records a second on
//!   every shard (busy): DynamoDB requests per shard-minute, writes
//!   (`UpdateItem`, `PutItem`, `DeleteItem`) and reads (`Query`,
//!   `GetItem`) apart.
//! - **many**: one host, the memory store, a stream of N shards with a
//!   record in each: time from start until every shard's record is
//!   handled, then CPU (% of a core) over 20 s after the idle ramp (the
//!   host started 45 s earlier; every shard then polls once a second) and
//!   RSS; and the same for a 1-shard stream, so the per-shard figures are
//!   what each shard adds.
//! - **thousand**: four hosts on one DynamoDB table (default lease
//!   settings; idle shards poll every `SHARDLANE_BENCH_FLEET_POLL_IDLE_MAX`,
//!   default 20 s, because kinesis-local cannot answer a thousand polls a
//!   second) and an M-shard stream: time from start until each holds M/4
//!   (rounded), then DynamoDB requests per shard-minute over one idle
//!   window.

// A benchmark reads as one measurement and fails loudly: the host's
// lints for unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::bail;
use aws_sdk_dynamodb::types::AttributeValue;
use shardlane_testkit::admin::http;
use shardlane_testkit::procfs::{process_cpu, process_rss_kb};
use shardlane_testkit::proxy::FaultProxy;
use shardlane_testkit::{Dynalite, HostProcess, Kinesis, guests, unique_name};

fn main() -> anyhow::Result<()> {
    let parts = std::env::var("SHARDLANE_BENCH_PARTS")
        .unwrap_or_else(|_| "requests,many,thousand".to_owned());
    let window = Duration::from_secs(env_or("SHARDLANE_BENCH_WINDOW_SECS", 60)?);
    let many: i32 = env_or("SHARDLANE_BENCH_MANY_SHARDS", 256)?;
    let thousand: i32 = env_or("SHARDLANE_BENCH_FLEET_SHARDS", 1000)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let plugin = guests::build()?.noop.clone();
        let mut bins = vec![("this build", ours_again())];
        if let Ok(baseline) = std::env::var("SHARDLANE_BENCH_BASELINE") {
            bins.push(("baseline", PathBuf::from(baseline)));
        }
        // `SHARDLANE_BENCH_ONLY=baseline`: the request counts of the
        // baseline alone (a run cut short, say).
        if std::env::var("SHARDLANE_BENCH_ONLY").is_ok_and(|o| o == "baseline") {
            bins.remove(0);
        }
        for part in parts.split(',').map(str::trim) {
            match part {
                "requests" => {
                    for (label, bin) in &bins {
                        requests(label, bin, &plugin, 16, 1, window).await?;
                        requests(label, bin, &plugin, 32, 4, window).await?;
                    }
                }
                "many" => many_shards(&ours_again(), &plugin, many).await?,
                "thousand" => fleet_of_four(&ours_again(), &plugin, thousand, window).await?,
                other => bail!("SHARDLANE_BENCH_PARTS: unknown part {other:?}"),
            }
        }
        Ok(())
    })
}

/// This build's binary.
fn ours_again() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_shardlane"))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} does not parse")),
        Err(_) => Ok(default),
    }
}

/// A host's config on the DynamoDB lease store, default lease settings;
/// `extra` is added to the subscription.
fn dynamodb_config(owner: &str, table: &str, stream: &str, plugin: &Path, extra: &str) -> String {
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
owner_id = "{owner}"

[[subscription]]
name = "bench"
stream = "{stream}"
plugin = "{plugin}"
start = "trim_horizon"
{extra}
"#,
        plugin = plugin.display()
    )
}

/// Leases held per owner, read from dynalite directly.
async fn held(dynalite: &Dynalite, table: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let mut start = None;
    loop {
        let Ok(page) = dynalite
            .client()
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
        else {
            return counts;
        };
        for item in page.items() {
            let shard = item.get("shard_id").and_then(|v| v.as_s().ok());
            if shard.is_none_or(|s| s.starts_with('!') || s == "-") {
                continue;
            }
            if let Some(AttributeValue::S(owner)) = item.get("owner") {
                *counts.entry(owner.clone()).or_default() += 1;
            }
        }
        match page.last_evaluated_key().filter(|k| !k.is_empty()) {
            Some(k) => start = Some(k.clone()),
            None => return counts,
        }
    }
}

/// Waits until the hosts hold `shards` leases between them, each within
/// one of the even share; returns how long it took.
async fn wait_balanced(
    dynalite: &Dynalite,
    table: &str,
    shards: usize,
    hosts: usize,
    within: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let counts = held(dynalite, table).await;
        let total: usize = counts.values().sum();
        let (lo, hi) = (shards / hosts, shards.div_ceil(hosts));
        if total == shards
            && counts.len() == hosts
            && counts.values().all(|n| (lo..=hi).contains(n))
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            bail!("not balanced within {within:?}: {counts:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `hosts` hosts named `bench-<i>` on the DynamoDB store (reached through
/// `proxy`), reading `stream`; `extra` is added to each subscription.
fn start_fleet(
    bin: &Path,
    plugin: &Path,
    hosts: usize,
    kinesis: &Kinesis,
    proxy: &FaultProxy,
    (table, stream): (&str, &str),
    extra: &str,
) -> anyhow::Result<Vec<HostProcess>> {
    (0..hosts)
        .map(|i| {
            HostProcess::start_with(
                bin,
                &dynamodb_config(&format!("bench-{i}"), table, stream, plugin, extra),
                &[
                    ("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint()),
                    ("AWS_ENDPOINT_URL_DYNAMODB", &proxy.endpoint()),
                ],
            )
        })
        .collect()
}

/// The requests `proxy` forwards over `window`: (writes, reads, each
/// operation's count).
async fn count_over(proxy: &FaultProxy, window: Duration) -> (u64, u64, String) {
    let before = proxy.forwarded_by_operation();
    tokio::time::sleep(window).await;
    delta(&before, &proxy.forwarded_by_operation())
}

/// Requests the proxy forwarded between two snapshots: (writes, reads).
fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> (u64, u64, String) {
    let mut writes = 0;
    let mut reads = 0;
    let mut detail = Vec::new();
    for (op, n) in after {
        let n = n - before.get(op).copied().unwrap_or(0);
        if n == 0 {
            continue;
        }
        detail.push(format!("{op} {n}"));
        match op.as_str() {
            "UpdateItem" | "PutItem" | "DeleteItem" => writes += n,
            _ => reads += n,
        }
    }
    (writes, reads, detail.join(", "))
}

async fn requests(
    label: &str,
    bin: &Path,
    plugin: &Path,
    shards: i32,
    hosts: usize,
    window: Duration,
) -> anyhow::Result<()> {
    let kinesis = Kinesis::start().await?;
    let dynalite = Dynalite::start().await?;
    let proxy = FaultProxy::start(dynalite.endpoint()).await?;
    let stream = unique_name("bench-fleet");
    let table = unique_name("leases");
    kinesis.create_stream(&stream, shards).await?;
    let keys = keys_for_every_shard(&kinesis, &stream).await?;
    let fleet = start_fleet(bin, plugin, hosts, &kinesis, &proxy, (&table, &stream), "")?;
    // An earlier version may never balance a fleet started together: say
    // so, and count what it costs as it stands.
    let bound = Duration::from_secs(240);
    let converged = match wait_balanced(&dynalite, &table, shards as usize, hosts, bound).await {
        Ok(took) => format!("balanced after {took:.1?}"),
        Err(e) => format!("{e}"),
    };
    // Settled: the probe records checkpointed, the start-up's syncs done.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let per_minute = |n: u64| n as f64 / shards as f64 * 60.0 / window.as_secs_f64();

    let (writes, reads, detail) = count_over(&proxy, window).await;
    println!(
        "requests [{label}] {shards} shards on {hosts} host(s), idle: {:.2} writes + {:.2} reads per shard-minute ({detail}; {converged})",
        per_minute(writes),
        per_minute(reads)
    );

    // Busy: about 5 records a second on every shard.
    let client = kinesis.client();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let stop = stop.clone();
        let stream = stream.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let entries = keys
                    .iter()
                    .map(|k| {
                        aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                            .partition_key(k)
                            .data(aws_sdk_kinesis::primitives::Blob::new(b"busy".to_vec()))
                            .build()
                            .expect("key and data are set")
                    })
                    .collect();
                let _ = client
                    .put_records()
                    .stream_name(&stream)
                    .set_records(Some(entries))
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (writes, reads, detail) = count_over(&proxy, window).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    producer.await?;
    println!(
        "requests [{label}] {shards} shards on {hosts} host(s), busy: {:.2} writes + {:.2} reads per shard-minute ({detail})",
        per_minute(writes),
        per_minute(reads)
    );
    for mut host in fleet {
        host.terminate().await?;
    }
    Ok(())
}

/// A partition key landing on each shard of `stream` (probing: Kinesis
/// hashes keys with MD5); the probe records stay in the stream.
async fn keys_for_every_shard(kinesis: &Kinesis, stream: &str) -> anyhow::Result<Vec<String>> {
    let mut keys: HashMap<String, String> = HashMap::new();
    let shards = kinesis
        .client()
        .list_shards()
        .stream_name(stream)
        .send()
        .await?
        .shards()
        .len();
    let mut next = 0;
    while keys.len() < shards {
        let probes: Vec<(String, Vec<u8>)> = (next..next + 500)
            .map(|i| (format!("probe-{i}"), b"probe".to_vec()))
            .collect();
        next += 500;
        for ((key, _), (shard, _)) in probes
            .iter()
            .zip(kinesis.put_records(stream, &probes).await?)
        {
            keys.entry(shard).or_insert_with(|| key.clone());
        }
        if keys.len() < shards && next > 200 * shards.max(5) {
            bail!("no key for {} of {shards} shards", shards - keys.len());
        }
    }
    Ok(keys.into_values().collect())
}

/// Resident memory of process `pid` in MiB.
fn process_rss_mib(pid: u32) -> Option<f64> {
    process_rss_kb(pid).map(|kb| kb as f64 / 1024.0)
}

/// Records acked so far, from `/metrics`.
fn acked(admin: &str) -> f64 {
    if std::net::TcpStream::connect(admin).is_err() {
        return 0.0;
    }
    let (_, body) = http(admin, "GET", "/metrics", None, b"");
    shardlane_testkit::admin::metric_sum(&body, "shardlane_records_total", &["outcome=\"ack\""])
}

/// One host on the memory store reading `shards` shards with a record
/// each: (seconds until all handled, idle % of a core after the ramp,
/// RSS MiB).
async fn one_host(bin: &Path, plugin: &Path, shards: i32) -> anyhow::Result<(f64, f64, f64)> {
    let kinesis = Kinesis::start().await?;
    let stream = unique_name("bench-many");
    kinesis.create_stream(&stream, shards).await?;
    let keys = keys_for_every_shard(&kinesis, &stream).await?;
    // The probes put more than one record on most shards: count them.
    let put = kinesis.read_all(&stream).await?.len();
    let config = format!(
        "[aws]\nregion = \"us-east-1\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[lease]\nstore = \"memory\"\n\n[[subscription]]\nname = \"bench\"\nstream = \"{stream}\"\nplugin = \"{}\"\nstart = \"trim_horizon\"\n",
        plugin.display()
    );
    let started = Instant::now();
    let mut host = HostProcess::start_with(
        bin,
        &config,
        &[("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())],
    )?;
    let admin = loop {
        let addr = host.lines().iter().find_map(|l| {
            l["message"]
                .as_str()?
                .starts_with("admin listening")
                .then(|| l["addr"].as_str().map(str::to_owned))?
        });
        if let Some(addr) = addr {
            break addr;
        }
        host.check_running()?;
        if started.elapsed() > Duration::from_secs(60) {
            bail!("no admin address within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    while acked(&admin) < put as f64 {
        host.check_running()?;
        if started.elapsed() > Duration::from_secs(300) {
            bail!("{} of {put} records handled within 300 s", acked(&admin));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_read = started.elapsed().as_secs_f64();
    // The idle ramp: 30 s of fast polls after the last record, then
    // doubling waits up to `poll_idle_max`.
    tokio::time::sleep_until(
        (started + Duration::from_secs(45).max(started.elapsed() + Duration::from_secs(40))).into(),
    )
    .await;
    let over = Duration::from_secs(20);
    let before = process_cpu(host.pid())?;
    tokio::time::sleep(over).await;
    let cpu = (process_cpu(host.pid())? - before).as_secs_f64() / over.as_secs_f64() * 100.0;
    let rss = process_rss_mib(host.pid()).unwrap_or(0.0);
    host.terminate().await?;
    drop(keys);
    Ok((all_read, cpu, rss))
}

async fn many_shards(bin: &Path, plugin: &Path, shards: i32) -> anyhow::Result<()> {
    let (_, cpu1, rss1) = one_host(bin, plugin, 1).await?;
    let (all_read, cpu, rss) = one_host(bin, plugin, shards).await?;
    println!(
        "many: {shards} shards on one host: every shard's records handled {all_read:.1} s after start; idle after the ramp {cpu:.2} % of a core ({:.4} % per shard beyond a 1-shard host's {cpu1:.2} %); RSS {rss:.1} MiB ({:.1} KiB per shard beyond a 1-shard host's {rss1:.1} MiB)",
        (cpu - cpu1) / f64::from(shards - 1),
        (rss - rss1) * 1024.0 / f64::from(shards - 1),
    );
    Ok(())
}

async fn fleet_of_four(
    bin: &Path,
    plugin: &Path,
    shards: i32,
    window: Duration,
) -> anyhow::Result<()> {
    let kinesis = Kinesis::start().await?;
    let dynalite = Dynalite::start().await?;
    let proxy = FaultProxy::start(dynalite.endpoint()).await?;
    let stream = unique_name("bench-thousand");
    let table = unique_name("leases");
    let created = Instant::now();
    kinesis.create_stream(&stream, shards).await?;
    eprintln!(
        "thousand: a {shards}-shard stream created in {:.1?}",
        created.elapsed()
    );
    // kinesis-local answers about 120 requests a second on a core (~8 ms
    // each, measured with boto3 against a 1,000-shard stream), so a
    // thousand shards polled once a second (the default `poll_idle_max`)
    // saturate it and its ListShards answers time out; Kinesis itself
    // gives each shard its own 5 reads a second. The fleet's idle shards
    // therefore poll every `SHARDLANE_BENCH_FLEET_POLL_IDLE_MAX` (default
    // 20 s: ~50 polls a second in all), which changes nothing in the
    // lease mechanics measured here.
    let poll =
        std::env::var("SHARDLANE_BENCH_FLEET_POLL_IDLE_MAX").unwrap_or_else(|_| "20s".to_owned());
    let extra = format!("poll_idle_max = \"{poll}\"");
    let fleet = start_fleet(bin, plugin, 4, &kinesis, &proxy, (&table, &stream), &extra)?;
    let converged = wait_balanced(
        &dynalite,
        &table,
        shards as usize,
        4,
        Duration::from_secs(600),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (writes, reads, detail) = count_over(&proxy, window).await;
    let per_minute = |n: u64| n as f64 / f64::from(shards) * 60.0 / window.as_secs_f64();
    let rss: Vec<String> = fleet
        .iter()
        .map(|h| format!("{:.0}", process_rss_mib(h.pid()).unwrap_or(0.0)))
        .collect();
    println!(
        "thousand: four hosts on {shards} shards balanced {:.1} s after start; idle: {:.3} writes + {:.3} reads per shard-minute ({detail}); RSS MiB per host {}",
        converged.as_secs_f64(),
        per_minute(writes),
        per_minute(reads),
        rss.join(" / ")
    );
    for mut host in fleet {
        host.terminate().await?;
    }
    Ok(())
}
