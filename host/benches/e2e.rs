//! End-to-end benchmark: what the whole host costs per record against
//! `kinesis-local`, next to the floor of any consumer built on the same
//! SDK, and what an idle subscription costs.
//!
//! Run: `cargo bench -p shardlane --bench e2e` (release build; about 8
//! minutes, most of it the emulator taking the records). Environment:
//! `SHARDLANE_BENCH_RECORDS` (default 100,000), `SHARDLANE_BENCH_OUTPUT_RECORDS`
//! (default 10,000), `SHARDLANE_BENCH_IDLE_SECS` (default 20),
//! `SHARDLANE_BENCH_MODES` (a comma-separated subset of the mode names, as
//! printed), `SHARDLANE_BENCH_EXTRA` (lines added to every subscription,
//! for experiments), `SHARDLANE_BENCH_COMPARE_RUST_LOG` (each mode is
//! also measured with the host's `RUST_LOG` set to this, in the same run:
//! a before/after of the log filter without a second pre-put),
//! `SHARDLANE_BENCH_BASELINE` (another `shardlane` binary, e.g. a copy
//! built from the commit before a change: each mode is also measured with
//! it, in the same run, labelled `baseline`: before/after in one sitting),
//! `SHARDLANE_BENCH_PERF` (a folder: each measured host run is recorded by
//! `perf record -g` into `<folder>/<mode>.data`; build with frame pointers
//! for whole stacks, see BENCHMARKS.md). Prints a table; BENCHMARKS.md
//! records it.
//!
//! # What it does
//! 1. Starts `kinesis-local` (the test harness's), builds the no-op guests,
//!    and pre-puts N records of 100 bytes over 200 partition keys into an
//!    8-shard stream once; every measurement reads that same stream from
//!    its start (pre-putting is slow on the emulator).
//! 2. **(a) the floor**: in this process, one task per shard runs
//!    GetShardIterator(TRIM_HORIZON) + GetRecords (10,000 per call) until
//!    a page comes back empty, touching each record's data and dropping
//!    it. CPU is this process's `getrusage` user + system time over the
//!    loop (nothing else runs in it meanwhile; the emulator is another
//!    process).
//! 3. **(b) the host**, per mode: `shardlane run` (memory store, default
//!    settings, `start = "trim_horizon"`, JSON logs with the binary's own
//!    filter unless `RUST_LOG` is set) with a no-op
//!    Rust guest; done when `/metrics` counts N acked records (or N
//!    outputs put, for the outputs mode). CPU is the process's utime +
//!    stime from `/proc/<pid>/stat` at that moment, less its start-up cost:
//!    the same config started on an empty 8-shard stream and read when
//!    `/readyz` first answers 200 (the compile cache is warm for both).
//!    Wall time likewise less start-up. Polling `/metrics` every 100 ms
//!    costs the host a little; it is counted. The outputs mode reads a
//!    stream of its own with fewer records (`kinesis-local` takes puts
//!    ever more slowly as a stream grows, and this mode puts one output
//!    per record): its wall time is the emulator's, and its CPU per record
//!    includes idle polling while it waits on the emulator.
//!    The state modes run the `noop-state` guest (one state read and one
//!    write per record) with `state = {}`, on the file store or on
//!    DynamoDB (`dynalite`, a fresh table per run), next to the no-op guest
//!    on the file store: the cost of exactly-once state. Their table
//!    column `keys/commit` is the state writes per checkpoint (one per key
//!    touched since the last; DynamoDB adds the manifest, the lease and a
//!    roll-forward per key of the previous commit not written again).
//! 4. **(c) idle**: the sequential config on the empty stream, CPU over
//!    `SHARDLANE_BENCH_IDLE_SECS` once ready, per shard per second, and
//!    again 40 s after ready (the readers' idle ramp has then slowed every
//!    shard to `poll_idle_max`); and
//!    beside it what one empty GetRecords costs the bare SDK (the floor of
//!    any poll).
//!
//! Speed targets live here and in BENCHMARKS.md, never in timed tests:
//! compare runs made in one sitting on one machine.

// A benchmark reads as one measurement and fails loudly: the host's
// lints for unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use aws_sdk_kinesis::types::ShardIteratorType;
use shardlane_testkit::admin::{http, metric_sum};
use shardlane_testkit::procfs::{process_cpu, process_rss_kb};
use shardlane_testkit::{Dynalite, HostProcess, Kinesis, free_port, guests};

const SHARDS: i32 = 8;
const KEYS: usize = 200;
const PAYLOAD: usize = 100;
const INPUT: &str = "bench-in";
const SMALL_INPUT: &str = "bench-in-small";
const EMPTY: &str = "bench-empty";
const OUTPUT: &str = "bench-out";

/// A filter that lets 20 of the 200 keys in: 90 % of the records are
/// settled by the reader without a call (issue 39's figure).
const FILTER_90: &str = "filter = ['{\"partitionKey\": [\"key-0\",\"key-1\",\"key-2\",\"key-3\",\"key-4\",\"key-5\",\"key-6\",\"key-7\",\"key-8\",\"key-9\",\"key-10\",\"key-11\",\"key-12\",\"key-13\",\"key-14\",\"key-15\",\"key-16\",\"key-17\",\"key-18\",\"key-19\"]}']";

/// One way of running the host over the stream.
struct Mode {
    name: &'static str,
    /// Extra lines of the subscription block.
    extra: &'static str,
    plugin: PathBuf,
    /// Done when every output is put (reading [`SMALL_INPUT`]), not when
    /// every record is acked.
    outputs: bool,
    /// Where leases (and state) live.
    store: Store,
}

/// A mode's lease store: each run gets a fresh one (a store that kept the
/// last run's checkpoints would have nothing left to read).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    Memory,
    File,
    DynamoDb,
}

/// CPU and wall time of one measured run.
struct Measured {
    cpu: Duration,
    wall: Duration,
    /// Outputs per PutRecords call (outputs mode).
    per_put: Option<f64>,
    /// The host's resident memory at the end (kB).
    rss_kb: Option<u64>,
    /// State writes (keys) per checkpoint (state modes).
    keys_per_commit: Option<f64>,
}

fn main() -> anyhow::Result<()> {
    let records: usize = env_or("SHARDLANE_BENCH_RECORDS", 100_000)?;
    let output_records: usize = env_or("SHARDLANE_BENCH_OUTPUT_RECORDS", 10_000)?;
    let idle_secs: u64 = env_or("SHARDLANE_BENCH_IDLE_SECS", 20)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(records, output_records, idle_secs))
}

async fn run(records: usize, output_records: usize, idle_secs: u64) -> anyhow::Result<()> {
    let bin = Path::new(env!("CARGO_BIN_EXE_shardlane"));
    println!("building the no-op guests …");
    let guests = guests::build()?;
    println!("starting kinesis-local …");
    let kinesis = Kinesis::start().await?;
    for stream in [INPUT, SMALL_INPUT, EMPTY, OUTPUT] {
        kinesis.create_stream(stream, SHARDS).await?;
    }
    pre_put(&kinesis, INPUT, records).await?;
    pre_put(&kinesis, SMALL_INPUT, output_records).await?;
    let cache = tempfile::tempdir()?;

    let modes = [
        Mode {
            name: "sequential",
            extra: "",
            plugin: guests.noop.clone(),
            outputs: false,
            store: Store::Memory,
        },
        Mode {
            name: "fan-out",
            extra: "read = \"fan_out\"\nconsumer_name = \"bench\"",
            plugin: guests.noop.clone(),
            outputs: false,
            store: Store::Memory,
        },
        Mode {
            name: "workers=4 by_key",
            extra: "workers = 4\nby_key = true",
            plugin: guests.noop.clone(),
            outputs: false,
            store: Store::Memory,
        },
        Mode {
            name: "0.3.0 runs",
            extra: "",
            plugin: guests.noop_run.clone(),
            outputs: false,
            store: Store::Memory,
        },
        Mode {
            name: "0.3.0 runs by_key",
            extra: "workers = 4\nby_key = true",
            plugin: guests.noop_run.clone(),
            outputs: false,
            store: Store::Memory,
        },
        Mode {
            name: "filter 90%",
            extra: FILTER_90,
            plugin: guests.noop.clone(),
            outputs: false,
            store: Store::Memory,
        },
        Mode {
            name: "batch 100",
            extra: "batch_size = 100",
            plugin: guests.noop_batch.clone(),
            outputs: false,
            store: Store::Memory,
        },
        Mode {
            name: "batch 500",
            extra: "batch_size = 500",
            plugin: guests.noop_batch.clone(),
            outputs: false,
            store: Store::Memory,
        },
        Mode {
            name: "outputs",
            extra: "outputs = [\"bench-out\"]",
            plugin: guests.noop_publish.clone(),
            outputs: true,
            store: Store::Memory,
        },
        Mode {
            name: "file store",
            extra: "",
            plugin: guests.noop.clone(),
            outputs: false,
            store: Store::File,
        },
        Mode {
            name: "state file",
            extra: "state = {}",
            plugin: guests.noop_state.clone(),
            outputs: false,
            store: Store::File,
        },
        Mode {
            name: "state dynamodb",
            extra: "state = {}",
            plugin: guests.noop_state.clone(),
            outputs: false,
            store: Store::DynamoDb,
        },
    ];
    let chosen = std::env::var("SHARDLANE_BENCH_MODES").ok();
    let modes: Vec<Mode> = modes
        .into_iter()
        .filter(|m| {
            chosen
                .as_deref()
                .is_none_or(|c| c.split(',').any(|name| name.trim() == m.name))
        })
        .collect();
    if modes.is_empty() {
        bail!("SHARDLANE_BENCH_MODES: no such mode in {chosen:?}");
    }
    let dynalite = if modes.iter().any(|m| m.store == Store::DynamoDb) {
        println!("starting dynalite …");
        Some(Dynalite::start().await?)
    } else {
        None
    };
    let stores = tempfile::tempdir()?;
    let host = HostRun {
        bin,
        endpoint: kinesis.endpoint().to_owned(),
        dynamodb_endpoint: dynalite.as_ref().map(|d| d.endpoint().to_owned()),
        stores: stores.path().to_owned(),
        runs: Arc::new(AtomicU64::new(0)),
        cache: cache.path().to_owned(),
        extra: std::env::var("SHARDLANE_BENCH_EXTRA").unwrap_or_default(),
        rust_log: std::env::var("RUST_LOG").ok(),
        label: None,
    };
    // Each mode runs once per entry, labelled (the plain run last).
    let baseline_bin = std::env::var_os("SHARDLANE_BENCH_BASELINE").map(PathBuf::from);
    let mut runs: Vec<HostRun> = Vec::new();
    if let Some(bin) = &baseline_bin {
        anyhow::ensure!(
            bin.is_file(),
            "SHARDLANE_BENCH_BASELINE: {} is not a file",
            bin.display()
        );
        runs.push(HostRun {
            bin,
            label: Some("baseline".into()),
            ..host.clone()
        });
    }
    if let Ok(filter) = std::env::var("SHARDLANE_BENCH_COMPARE_RUST_LOG") {
        runs.push(HostRun {
            label: Some(format!("RUST_LOG={filter}")),
            rust_log: Some(filter),
            ..host.clone()
        });
    }
    runs.push(host.clone());
    // Compiles each plugin into the cache, so start-ups compare alike.
    for mode in &modes {
        for run in &runs {
            run.startup(mode).await?;
        }
    }

    println!("(a) bare SDK loop …");
    let floor = sdk_floor(&kinesis, records).await?;
    let empty_poll = sdk_empty_poll(&kinesis, false).await?;
    // What a per-call config override (retries off for one request, as
    // the host once sent every GetRecords) adds to that floor.
    let empty_poll_overridden = sdk_empty_poll(&kinesis, true).await?;
    println!(
        "    {:.3} CPU-s, {:.2} µs/record, {:.2} s wall",
        floor.cpu.as_secs_f64(),
        per_record_us(floor.cpu, records),
        floor.wall.as_secs_f64()
    );

    let mut rows = Vec::new();
    for mode in &modes {
        let n = if mode.outputs {
            output_records
        } else {
            records
        };
        for run in &runs {
            let name = run.named(mode.name);
            println!("(b) host, {name} …");
            let measured = run.measure(mode, n).await?;
            println!(
                "    {:.3} CPU-s, {:.2} µs/record, {:.2} s wall",
                measured.cpu.as_secs_f64(),
                per_record_us(measured.cpu, n),
                measured.wall.as_secs_f64()
            );
            rows.push((name, n, measured));
        }
    }

    let mut idles = Vec::new();
    for run in &runs {
        println!(
            "(c) {} …",
            run.named(&format!("idle, {SHARDS} shards, {idle_secs} s"))
        );
        let (idle, quiet) = run.idle(&modes[0], Duration::from_secs(idle_secs)).await?;
        idles.push((run.named("idle"), idle, quiet));
    }
    if !host.extra.is_empty() {
        println!(
            "every subscription also had: {}",
            host.extra.replace('\n', "; ")
        );
    }

    println!();
    println!(
        "{records} records ({output_records} for outputs) of {PAYLOAD} bytes, {KEYS} keys, {SHARDS} shards, kinesis-local"
    );
    println!(
        "| run | CPU-s | µs/record | ratio to (a) | wall s | records/s (wall) | RSS MiB | outputs/PutRecords | keys/commit |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| (a) bare SDK loop | {:.3} | {:.2} | 1.00 | {:.2} | {:.0} | – | – | – |",
        floor.cpu.as_secs_f64(),
        per_record_us(floor.cpu, records),
        floor.wall.as_secs_f64(),
        records as f64 / floor.wall.as_secs_f64()
    );
    for (name, n, m) in &rows {
        println!(
            "| (b) host, {name} | {:.3} | {:.2} | {:.2} | {:.2} | {:.0} | {} | {} | {} |",
            m.cpu.as_secs_f64(),
            per_record_us(m.cpu, *n),
            per_record_us(m.cpu, *n) / per_record_us(floor.cpu, records),
            m.wall.as_secs_f64(),
            *n as f64 / m.wall.as_secs_f64(),
            m.rss_kb
                .map_or("–".to_owned(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
            m.per_put.map_or("–".to_owned(), |n| format!("{n:.1}")),
            m.keys_per_commit
                .map_or("–".to_owned(), |n| format!("{n:.1}")),
        );
    }
    outputs_less_idle(&rows, idles.first().map(|(_, idle, _)| *idle));
    for (name, idle, quiet) in idles {
        println!(
            "(c) {name}: {:.4} CPU-s per second for {SHARDS} shards = {:.3} % of a core; {:.5} CPU-s per shard per second",
            idle,
            idle * 100.0,
            idle / f64::from(SHARDS)
        );
        println!(
            "    after 40 s without records (every shard slowed to poll_idle_max): {:.4} CPU-s per second = {:.3} % of a core",
            quiet,
            quiet * 100.0,
        );
    }
    let defaults = &shardlane::defaults::POLL_IDLE;
    println!(
        "    one empty GetRecords costs the bare SDK {:.0} µs of CPU: {SHARDS} shards polled every {:?} (the default poll_idle) would cost it {:.3} % of a core, every {:?} (poll_idle_max) {:.3} %",
        empty_poll.as_secs_f64() * 1e6,
        defaults,
        empty_poll.as_secs_f64() * f64::from(SHARDS) / defaults.as_secs_f64() * 100.0,
        shardlane::defaults::POLL_IDLE_MAX,
        empty_poll.as_secs_f64() * f64::from(SHARDS)
            / shardlane::defaults::POLL_IDLE_MAX.as_secs_f64()
            * 100.0
    );
    println!(
        "    the same GetRecords with a per-call config override (retries off for the call): {:.0} µs of CPU",
        empty_poll_overridden.as_secs_f64() * 1e6,
    );
    Ok(())
}

/// The outputs rows' CPU less what the idle subscription costs over their
/// wall time: the emulator takes puts slowly, and meanwhile the host polls
/// its idle shards (issue 38: "find why it is 10× a plain ack").
fn outputs_less_idle(rows: &[(String, usize, Measured)], idle: Option<f64>) {
    let Some(idle) = idle else {
        return;
    };
    for (name, n, m) in rows.iter().filter(|(name, ..)| name.contains("outputs")) {
        let polling = idle * m.wall.as_secs_f64();
        let busy = (m.cpu.as_secs_f64() - polling).max(0.0);
        println!(
            "    {name}: {:.2} µs/record less the idle polling over its {:.2} s wall ({polling:.3} CPU-s at the (c) rate)",
            busy / *n as f64 * 1e6,
            m.wall.as_secs_f64(),
        );
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}: not a number: {v:?}")),
        Err(_) => Ok(default),
    }
}

fn per_record_us(cpu: Duration, records: usize) -> f64 {
    cpu.as_secs_f64() * 1e6 / records as f64
}

/// Puts `records` records into `stream`, with progress.
async fn pre_put(kinesis: &Kinesis, stream: &str, records: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let chunk = 10_000;
    let mut done = 0;
    while done < records {
        let n = chunk.min(records - done);
        let batch: Vec<(String, Vec<u8>)> = (done..done + n)
            .map(|i| {
                let mut data = format!("record {i} ").into_bytes();
                data.resize(PAYLOAD, b'.');
                (format!("key-{}", i % KEYS), data)
            })
            .collect();
        kinesis.put_records(stream, &batch).await?;
        done += n;
        println!(
            "pre-putting {stream}: {done}/{records} records ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// (a): every record of the input stream read with the bare SDK, one task
/// per shard.
async fn sdk_floor(kinesis: &Kinesis, records: usize) -> anyhow::Result<Measured> {
    let client = kinesis.client();
    let shards = client.list_shards().stream_name(INPUT).send().await?;
    let ids: Vec<String> = shards
        .shards()
        .iter()
        .map(|s| s.shard_id().to_owned())
        .collect();
    let read = Arc::new(AtomicU64::new(0));
    let touched = Arc::new(AtomicU64::new(0));
    let cpu_before = own_cpu();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let client = client.clone();
        let read = read.clone();
        let touched = touched.clone();
        tasks.spawn(async move {
            let mut iterator = client
                .get_shard_iterator()
                .stream_name(INPUT)
                .shard_id(&id)
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await?
                .shard_iterator()
                .map(str::to_owned);
            while let Some(current) = iterator {
                let page = client
                    .get_records()
                    .shard_iterator(current)
                    .limit(10_000)
                    .send()
                    .await?;
                if page.records().is_empty() {
                    break;
                }
                let mut sum = 0u64;
                for record in page.records() {
                    // Decoded by the SDK; touched so nothing is elided.
                    sum += record.data().as_ref().len() as u64
                        + record.partition_key().map_or(0, str::len) as u64
                        + record.sequence_number().len() as u64;
                }
                touched.fetch_add(sum, Ordering::Relaxed);
                read.fetch_add(page.records().len() as u64, Ordering::Relaxed);
                iterator = page.next_shard_iterator().map(str::to_owned);
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let wall = started.elapsed();
    let cpu = own_cpu() - cpu_before;
    let read = read.load(Ordering::Relaxed);
    if read != records as u64 {
        bail!("the SDK loop read {read} records, not {records}");
    }
    Ok(Measured {
        cpu,
        wall,
        per_put: None,
        rss_kb: None,
        keys_per_commit: None,
    })
}

/// The CPU one empty GetRecords costs the bare SDK: 200 calls
/// (`SHARDLANE_BENCH_EMPTY_POLLS`) on a shard of the empty stream, after 20
/// to warm up; with `overridden`, each call also overrides the client's
/// retry config (`customize().config_override(..)`).
async fn sdk_empty_poll(kinesis: &Kinesis, overridden: bool) -> anyhow::Result<Duration> {
    let client = kinesis.client();
    let shards = client.list_shards().stream_name(EMPTY).send().await?;
    let shard = shards
        .shards()
        .first()
        .context("the empty stream has shards")?;
    let mut iterator = client
        .get_shard_iterator()
        .stream_name(EMPTY)
        .shard_id(shard.shard_id())
        .shard_iterator_type(ShardIteratorType::Latest)
        .send()
        .await?
        .shard_iterator()
        .map(str::to_owned)
        .context("an iterator")?;
    // More for a profile of the SDK's per-call cost.
    let calls: u32 = env_or("SHARDLANE_BENCH_EMPTY_POLLS", 200)?;
    let mut before = own_cpu();
    for call in 0..calls + 20 {
        if call == 20 {
            before = own_cpu();
        }
        let call = client.get_records().shard_iterator(&iterator);
        let page = if overridden {
            call.customize()
                .config_override(
                    aws_sdk_kinesis::config::Builder::default()
                        .retry_config(aws_config::retry::RetryConfig::disabled()),
                )
                .send()
                .await?
        } else {
            call.send().await?
        };
        if !page.records().is_empty() {
            bail!("the empty stream has records");
        }
        iterator = page
            .next_shard_iterator()
            .map(str::to_owned)
            .context("an open shard has a next iterator")?;
    }
    Ok((own_cpu() - before) / calls)
}

/// This process's user + system CPU time so far.
fn own_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct it is given; a zeroed
    // `rusage` is a valid value of it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The host binary and what every run of it shares.
#[derive(Clone)]
struct HostRun<'a> {
    bin: &'a Path,
    endpoint: String,
    /// dynalite's, when a mode uses the DynamoDB store.
    dynamodb_endpoint: Option<String>,
    /// Where file stores go, one folder per run.
    stores: PathBuf,
    /// Runs started: names each run's file store or table.
    runs: Arc<AtomicU64>,
    cache: PathBuf,
    /// `SHARDLANE_BENCH_EXTRA`.
    extra: String,
    /// The host's `RUST_LOG`; `None`: its own default filter.
    rust_log: Option<String>,
    /// Tells its rows and profiles apart from the other runs'; `None`:
    /// the plain run.
    label: Option<String>,
}

impl HostRun<'_> {
    /// `what`, with this run's label after it.
    fn named(&self, what: &str) -> String {
        match &self.label {
            Some(label) => format!("{what}, {label}"),
            None => what.to_owned(),
        }
    }

    fn config(&self, mode: &Mode, stream: &str, admin: &str) -> String {
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let lease = match mode.store {
            Store::Memory => "store = \"memory\"".to_owned(),
            Store::File => format!(
                "store = \"file\"\npath = \"{}\"",
                self.stores.join(format!("run-{run}")).display()
            ),
            Store::DynamoDb => {
                format!("store = \"dynamodb\"\ntable = \"bench-{run}\"\ncreate_table = true")
            }
        };
        format!(
            r#"
[aws]
region = "us-east-1"

[engine]
cache_dir = "{cache}"

[admin]
listen = "{admin}"

[lease]
{lease}

[[subscription]]
name = "bench"
stream = "{stream}"
plugin = "{plugin}"
start = "trim_horizon"
{extra}
{more}
"#,
            cache = self.cache.display(),
            plugin = mode.plugin.display(),
            extra = mode.extra,
            more = self.extra,
        )
    }

    fn start(&self, mode: &Mode, stream: &str) -> anyhow::Result<(HostProcess, String)> {
        let admin = format!("127.0.0.1:{}", free_port());
        let mut env = vec![("AWS_ENDPOINT_URL_KINESIS", self.endpoint.as_str())];
        if let Some(dynamodb) = &self.dynamodb_endpoint {
            env.push(("AWS_ENDPOINT_URL_DYNAMODB", dynamodb.as_str()));
        }
        if let Some(filter) = &self.rust_log {
            env.push(("RUST_LOG", filter.as_str()));
        }
        let host =
            HostProcess::start_as_deployed(self.bin, &self.config(mode, stream, &admin), &env)?;
        Ok((host, admin))
    }

    /// Starts `mode` on the empty stream; its CPU and wall time until
    /// `/readyz` answers 200, then stops it.
    async fn startup(&self, mode: &Mode) -> anyhow::Result<(Duration, Duration)> {
        let started = Instant::now();
        let (mut host, admin) = self.start(mode, EMPTY)?;
        wait_ready(&mut host, &admin).await?;
        let cpu = process_cpu(host.pid())?;
        let wall = started.elapsed();
        host.terminate().await?;
        Ok((cpu, wall))
    }

    /// One measured run of `mode` over the input stream.
    async fn measure(&self, mode: &Mode, records: usize) -> anyhow::Result<Measured> {
        let (startup_cpu, startup_wall) = self.startup(mode).await?;
        let started = Instant::now();
        let stream = if mode.outputs { SMALL_INPUT } else { INPUT };
        let (mut host, admin) = self.start(mode, stream)?;
        // For `perf report --pid` over a system-wide recording.
        println!("    host pid {}", host.pid());
        let perf = match std::env::var_os("SHARDLANE_BENCH_PERF") {
            None => None,
            Some(dir) => {
                let name =
                    format!("{}.data", self.named(mode.name)).replace([' ', ',', '=', '/'], "-");
                Some(Perf::record(host.pid(), &Path::new(&dir).join(name))?)
            }
        };
        let deadline = started + Duration::from_secs(600);
        let page = loop {
            host.check_running()?;
            if let Ok(page) = metrics(&admin) {
                let done = if mode.outputs {
                    metric_sum(&page, "shardlane_outputs_total", &[])
                } else {
                    // Acked or filtered out: every record settled.
                    metric_sum(&page, "shardlane_records_total", &["outcome=\"ack\""])
                        + metric_sum(&page, "shardlane_records_filtered_total", &[])
                };
                if done >= records as f64 {
                    break page;
                }
            }
            if Instant::now() > deadline {
                bail!("{}: not done within 600 s", mode.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let cpu = process_cpu(host.pid())?;
        let wall = started.elapsed();
        let rss_kb = process_rss_kb(host.pid());
        if let Some(perf) = perf {
            perf.stop()?;
        }
        host.terminate().await?;
        let per_put = mode.outputs.then(|| {
            metric_sum(&page, "shardlane_output_put_size_sum", &[])
                / metric_sum(&page, "shardlane_output_put_size_count", &[]).max(1.0)
        });
        let commits = metric_sum(&page, "shardlane_state_writes_per_commit_count", &[]);
        let keys_per_commit = (commits > 0.0)
            .then(|| metric_sum(&page, "shardlane_state_writes_per_commit_sum", &[]) / commits);
        Ok(Measured {
            cpu: cpu.saturating_sub(startup_cpu),
            wall: wall.saturating_sub(startup_wall),
            per_put,
            rss_kb,
            keys_per_commit,
        })
    }

    /// CPU-s per second of `mode` on the empty stream: once ready, and
    /// again once the readers' idle ramp has slowed every shard down (the
    /// ramp starts after 30 s without records).
    async fn idle(&self, mode: &Mode, over: Duration) -> anyhow::Result<(f64, f64)> {
        let (mut host, admin) = self.start(mode, EMPTY)?;
        wait_ready(&mut host, &admin).await?;
        let ready = Instant::now();
        // Past start-up's tail (first renewals, first syncs).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = process_cpu(host.pid())?;
        tokio::time::sleep(over).await;
        let fresh = (process_cpu(host.pid())? - before).as_secs_f64() / over.as_secs_f64();
        // The ramp: 30 s, then doubling waits up to `poll_idle_max`.
        let ramped = ready + Duration::from_secs(40);
        tokio::time::sleep_until(ramped.into()).await;
        let before = process_cpu(host.pid())?;
        tokio::time::sleep(over).await;
        let quiet = (process_cpu(host.pid())? - before).as_secs_f64() / over.as_secs_f64();
        host.terminate().await?;
        Ok((fresh, quiet))
    }
}

fn metrics(admin: &str) -> anyhow::Result<String> {
    // The admin server may not listen yet: connect first, then ask.
    std::net::TcpStream::connect(admin)?;
    let (status, body) = http(admin, "GET", "/metrics", None, b"");
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    Ok(body)
}

async fn wait_ready(host: &mut HostProcess, admin: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if std::net::TcpStream::connect(admin).is_ok()
            && http(admin, "GET", "/readyz", None, b"").0 == 200
        {
            return Ok(());
        }
        host.check_running()?;
        if Instant::now() > deadline {
            bail!("the host was not ready within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `perf record -g` attached to one host run (`SHARDLANE_BENCH_PERF`).
struct Perf {
    child: std::process::Child,
    out: PathBuf,
}

impl Perf {
    fn record(pid: u32, out: &Path) -> anyhow::Result<Self> {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let child = std::process::Command::new("perf")
            .args([
                "record",
                "-g",
                "-F",
                "4999",
                "-q",
                "-p",
                &pid.to_string(),
                "-o",
            ])
            .arg(out)
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("SHARDLANE_BENCH_PERF: cannot run perf (Debian's linux-perf)")?;
        // perf attaches within a moment; records read before that are
        // not in the profile.
        std::thread::sleep(Duration::from_millis(300));
        Ok(Self {
            child,
            out: out.to_owned(),
        })
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SIGINT: perf writes its file and exits.
        // SAFETY: kill has no memory preconditions; the pid is our child's,
        // not yet reaped (waited for below).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait()?;
        // perf writes its file, then ends by the signal it caught.
        use std::os::unix::process::ExitStatusExt as _;
        anyhow::ensure!(
            status.success() || status.signal() == Some(libc::SIGINT),
            "perf record failed: {status}"
        );
        println!("    profile: {}", self.out.display());
        Ok(())
    }
}
