//! `cargo demo`: the main job end to end on this machine.
//!
//! A test target of the host package without the test harness (so `cargo
//! test --workspace` runs it too, and it shares the suite's build). Starts
//! the Kinesis emulator, creates a 2-shard stream, builds the echo plugin,
//! runs `shardlane run` on a generated config, puts 20
//! records, shows the host's output as the plugin handles them (one short
//! line each, read from the host's JSON log: the full fields are in
//! `target/demo/host.log`), stops the host with SIGTERM once all 20 are
//! through, and sums up.

// A demo reads as one story and fails loudly: the host's lints for
// unwraps and long functions do not apply here.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use shardlane_testkit::{Kinesis, repo_root, unique_name};

const RECORDS: usize = 20;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let root = repo_root();
    step("building the echo plugin (guest-examples/rust/echo)");
    let status = Command::new(root.join("guest-examples/rust/echo/build.sh")).status()?;
    anyhow::ensure!(status.success(), "the echo plugin did not build");
    let plugin = root.join("guest-examples/rust/echo/dist/echo.wasm");

    // Cargo builds the host binary for this target (it is one of the host
    // package's test targets), with the same features as the test suite.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_shardlane"));

    step("starting the Kinesis emulator (kinesis-local)");
    let kinesis = Kinesis::start().await?;
    let stream = unique_name("demo-orders");
    kinesis.create_stream(&stream, 2).await?;
    println!(
        "   emulator at {}, stream {stream} with 2 shards",
        kinesis.endpoint()
    );

    let dir = root.join("target/demo");
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("shardlane.toml");
    std::fs::write(
        &config_path,
        format!(
            r#"[aws]
region = "us-east-1"

[admin]
listen = "127.0.0.1:0"

[lease]
store = "memory"

[[subscription]]
name = "demo"
stream = "{stream}"
plugin = "{}"
start = "trim_horizon"
poll_idle = "100ms"
max_reads_per_second = 10
checkpoint_every = "500ms"
"#,
            plugin.display()
        ),
    )?;
    step(&format!(
        "running: shardlane run --config {}",
        config_path.display()
    ));
    let mut host = Command::new(bin)
        .args(["run", "--log-format", "json", "--config"])
        .arg(&config_path)
        .env("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())
        .env("AWS_ACCESS_KEY_ID", "demo")
        .env("AWS_SECRET_ACCESS_KEY", "demo")
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the host")?;
    let (tx, rx) = mpsc::channel();
    let stdout = host.stdout.take().expect("stdout is piped");
    let mut log = std::fs::File::create(dir.join("host.log"))?;
    let printer = std::thread::spawn(move || {
        let mut summary = Summary::default();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            use std::io::Write as _;
            let _ = writeln!(log, "{line}");
            if let Some(short) = summary.read(&line) {
                println!("   {short}");
            }
            if line.contains("echo key=") {
                let _ = tx.send(());
            }
        }
        summary
    });

    step(&format!("putting {RECORDS} records"));
    let started = Instant::now();
    let records: Vec<(String, Vec<u8>)> = (0..RECORDS)
        .map(|i| {
            (
                format!("customer-{}", i % 5),
                format!("{{\"order\":{i},\"amount\":{}}}", 10 + i).into_bytes(),
            )
        })
        .collect();
    kinesis.put_records(&stream, &records).await?;

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut handled = 0;
    while handled < RECORDS {
        let left = deadline.saturating_duration_since(Instant::now());
        if rx.recv_timeout(left).is_err() {
            let _ = host.kill();
            bail!("only {handled} of {RECORDS} records were handled within 60 s");
        }
        handled += 1;
    }
    step("all records handled; stopping the host with SIGTERM");
    Command::new("kill")
        .args(["-TERM", &host.id().to_string()])
        .status()?;
    let status = host.wait()?;
    // The host is gone: its output ends, and the printer with it.
    let summary = printer.join().expect("the output thread does not panic");
    anyhow::ensure!(status.success(), "host exited with {status}");
    step(&format!(
        "done: {handled} records flowed through the echo plugin in {:.1?}",
        started.elapsed()
    ));
    println!(
        "   per shard: {}; final checkpoints written: {}; leases released: {}",
        summary
            .per_shard
            .iter()
            .map(|(shard, n)| format!("{shard} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        summary.final_checkpoints,
        summary.released
    );
    println!("   the host's full log: {}", dir.join("host.log").display());
    Ok(())
}

/// What the host said, in short: one line per record handled and per
/// lease event, and the counts for the summary.
#[derive(Default)]
struct Summary {
    per_shard: std::collections::BTreeMap<String, usize>,
    final_checkpoints: usize,
    released: usize,
}

impl Summary {
    /// A short form of one JSON log line, when it is worth showing.
    fn read(&mut self, line: &str) -> Option<String> {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            return Some(line.to_owned());
        };
        let field = |name: &str| {
            v[name]
                .as_str()
                .map(str::to_owned)
                .or_else(|| v[name].as_u64().map(|n| n.to_string()))
                .unwrap_or_default()
        };
        let message = field("message");
        let shard = field("shard_id");
        if v["target"] == "guest" {
            *self.per_shard.entry(shard.clone()).or_default() += 1;
            return Some(format!("record  {shard}  {message}"));
        }
        match message.as_str() {
            "final checkpoint written" => self.final_checkpoints += 1,
            "lease released" => self.released += 1,
            _ => {}
        }
        let level = v["level"].as_str().unwrap_or("INFO");
        let detail = if shard.is_empty() {
            String::new()
        } else {
            format!("  {shard}")
        };
        Some(format!("{level:<5}  {message}{detail}"))
    }
}

fn step(what: &str) {
    println!("==> {what}");
}
