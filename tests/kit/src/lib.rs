//! The test and demo harness: real emulators on free loopback ports, the
//! Wasm guests built from source, and a shardlane host process to watch.
//!
//! - [`Kinesis`] and [`Dynalite`] (in `emulators`) start `kinesis-local`
//!   and `dynalite` (npm, pinned in `tests/emulators/package.json` + lock,
//!   installed on first use) on free ports and give SDK clients for them.
//!   They fail loudly, with the emulator's own output, when they cannot
//!   start: tests never skip.
//! - [`guests`] builds the Rust example plugins and the test fixture plugins
//!   for `wasm32-wasip2` (adding the target when missing), once per process;
//!   [`build_examples`] builds one language's examples (Rust, Python,
//!   JavaScript, C) with that language's own `build.sh`.
//! - [`HostProcess`] runs the `shardlane` binary on a config, collects its
//!   JSON log lines, lets a test wait for a condition with a deadline, and
//!   stops it with SIGTERM.
//! - [`admin`] sends a request to a host's admin server and reads its
//!   metrics.
//! - [`proxy::FaultProxy`] sits between the host and an emulator and
//!   refuses, resets, delays or answers with injected AWS errors.

pub mod admin;
mod emulators;
pub mod http_server;
pub mod kpl;
pub mod otlp;
pub mod procfs;
pub mod proxy;
pub mod recorder;

pub use emulators::{Dynalite, Kinesis, Registry, S3Emulator, emulators_dir};

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the testkit lives two levels below the repository root")
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("cannot bind a loopback port")
}

/// A name no other test run uses.
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

pub(crate) fn run_checked(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let output = cmd
        .output()
        .with_context(|| format!("{what}: cannot run {cmd:?}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The Python of `tests/tools/.venv`, with the tools the suite runs
/// (`tests/tools/requirements.txt`), installed on first use by
/// `tests/tools/ensure.sh`, once per process.
///
/// # Errors
/// When python3 or pip cannot install them, with the script's output.
pub fn tools_python() -> anyhow::Result<PathBuf> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let out = Command::new("bash")
                .arg(repo_root().join("tests/tools/ensure.sh"))
                .output()
                .map_err(|e| format!("cannot run tests/tools/ensure.sh: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "tests/tools/ensure.sh failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The compiled guest plugins.
pub mod guests {
    use super::*;

    /// A copy of the component at `path` with a custom section naming
    /// `tag` appended, in `dir`: the same behaviour under another digest
    /// (a "new version" for deploy tests). A component may hold custom
    /// sections anywhere among its sections.
    ///
    /// # Errors
    /// When the file cannot be read or the copy written.
    pub fn variant(path: &Path, tag: &str, dir: &Path) -> anyhow::Result<PathBuf> {
        let mut bytes = std::fs::read(path)?;
        let name = b"shardlane-test";
        let payload_len = 1 + name.len() + tag.len();
        anyhow::ensure!(payload_len < 128 && name.len() < 128, "tag too long");
        bytes.push(0); // custom section id
        bytes.push(payload_len as u8);
        bytes.push(name.len() as u8);
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(tag.as_bytes());
        let out = dir.join(format!("variant-{tag}.wasm"));
        std::fs::write(&out, bytes)?;
        Ok(out)
    }

    /// Paths of every guest the tests use.
    #[derive(Debug, Clone)]
    pub struct Guests {
        /// `guest-examples/rust/echo`.
        pub echo: PathBuf,
        /// `tests/guests/retry`: retries records whose data starts with
        /// `retry` once.
        pub retry: PathBuf,
        /// `tests/guests/other-world`: a component of another world.
        pub other_world: PathBuf,
        /// `tests/guests/slow`: logs enter/exit around a `sleep=<ms>;`.
        pub slow: PathBuf,
        /// `tests/guests/batch`: a batch-handler with per-record outcomes.
        pub batch: PathBuf,
        /// `tests/guests/noop`: acks, nothing else (benchmarks).
        pub noop: PathBuf,
        /// `tests/guests/noop-batch`: acks whole batches (benchmarks).
        pub noop_batch: PathBuf,
        /// `tests/guests/chaos`: misbehaves as each record asks.
        pub chaos: PathBuf,
        /// `tests/guests/bad-batch`: poison records and short answers.
        pub bad_batch: PathBuf,
        /// `tests/guests/importer`: imports what no host provides.
        pub importer: PathBuf,
        /// `tests/guests/hostile`: huge reasons, forged log lines, huge trap
        /// messages, as each record asks.
        pub hostile: PathBuf,
        /// `tests/guests/hostile-batch`: acks batches; run with a small
        /// `max_memory` so a big batch cannot be lowered.
        pub hostile_batch: PathBuf,
        /// `tests/guests/publisher` (contract 0.2.0): publishes outputs,
        /// reads config, fetches over HTTP, as each record asks.
        pub publisher: PathBuf,
        /// `tests/guests/noop-publish` (contract 0.2.0): one output per
        /// record to `bench-out`, then ack (benchmarks).
        pub noop_publish: PathBuf,
        /// `tests/guests/stateful` (contract 0.2.0): adds to its key's total
        /// in per-key state, then acks, retries, traps or rejects.
        pub stateful: PathBuf,
        /// `tests/guests/stateful-batch` (contract 0.2.0): the same, in the
        /// batch world.
        pub stateful_batch: PathBuf,
        /// `tests/guests/noop-state` (contract 0.2.0): one state read and
        /// one write per record, then ack (benchmarks).
        pub noop_state: PathBuf,
        /// `tests/guests/runner` (contract 0.3.0): handles runs, stopping
        /// at the first record not acked; retries, rejects or traps as each
        /// record asks.
        pub runner: PathBuf,
        /// `tests/guests/noop-run` (contract 0.3.0): acks every record of
        /// every run (benchmarks).
        pub noop_run: PathBuf,
        /// `tests/guests/windowed` (contract 0.3.0, windowed): sums per
        /// key per window, adding each window's sum to the key's total at
        /// its close.
        pub windowed: PathBuf,
        /// `tests/guests/windowed-batch` (contract 0.3.0, windowed batch
        /// world): the same, a batch per call.
        pub windowed_batch: PathBuf,
    }

    /// Builds every guest once per process (release, wasm32-wasip2) into
    /// `target/guests`, adding the Rust target when it is missing.
    ///
    /// # Errors
    /// When the target cannot be added or a guest does not build.
    pub fn build() -> anyhow::Result<Guests> {
        static BUILT: OnceLock<Result<Guests, String>> = OnceLock::new();
        BUILT
            .get_or_init(|| build_all().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    }

    fn build_all() -> anyhow::Result<Guests> {
        let root = repo_root();
        let installed = Command::new("rustup")
            .args(["target", "list", "--installed"])
            .output()
            .context("cannot run rustup")?;
        if !String::from_utf8_lossy(&installed.stdout)
            .lines()
            .any(|l| l.trim() == "wasm32-wasip2")
        {
            run_checked(
                Command::new("rustup").args(["target", "add", "wasm32-wasip2"]),
                "adding the wasm32-wasip2 target",
            )?;
        }
        let target_dir = root.join("target/guests");
        for workspace in ["guest-examples/rust", "tests/guests"] {
            run_checked(
                Command::new("cargo")
                    .args([
                        "build",
                        "--release",
                        "--target",
                        "wasm32-wasip2",
                        "--workspace",
                    ])
                    .arg("--manifest-path")
                    .arg(root.join(workspace).join("Cargo.toml"))
                    .arg("--target-dir")
                    .arg(&target_dir)
                    // Not the outer cargo's settings (e.g. its target dir).
                    .env_remove("CARGO_TARGET_DIR")
                    .env_remove("RUSTFLAGS"),
                &format!("building the guests in {workspace}"),
            )?;
        }
        let out = target_dir.join("wasm32-wasip2/release");
        Ok(Guests {
            echo: out.join("echo.wasm"),
            retry: out.join("retry.wasm"),
            other_world: out.join("other_world.wasm"),
            slow: out.join("slow.wasm"),
            batch: out.join("batch.wasm"),
            noop: out.join("noop.wasm"),
            noop_batch: out.join("noop_batch.wasm"),
            chaos: out.join("chaos.wasm"),
            bad_batch: out.join("bad_batch.wasm"),
            importer: out.join("importer.wasm"),
            hostile: out.join("hostile.wasm"),
            hostile_batch: out.join("hostile_batch.wasm"),
            publisher: out.join("publisher.wasm"),
            noop_publish: out.join("noop_publish.wasm"),
            stateful: out.join("stateful.wasm"),
            stateful_batch: out.join("stateful_batch.wasm"),
            noop_state: out.join("noop_state.wasm"),
            runner: out.join("runner.wasm"),
            noop_run: out.join("noop_run.wasm"),
            windowed: out.join("windowed.wasm"),
            windowed_batch: out.join("windowed_batch.wasm"),
        })
    }
}

/// The languages the guest examples are written in
/// (`guest-examples/<dir>/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// `cargo` + `wit-bindgen`.
    Rust,
    /// `componentize-py`.
    Python,
    /// `componentize-js`.
    JavaScript,
    /// `wit-bindgen c` + clang + `wasm-component-ld`.
    C,
}

impl Language {
    /// Every language, in the order the README lists them.
    pub const ALL: [Language; 4] = [Self::Rust, Self::Python, Self::JavaScript, Self::C];

    /// Its folder under `guest-examples/`.
    pub fn dir(self) -> &'static str {
        match self {
            Self::Rust => "rust",
            Self::Python => "python",
            Self::JavaScript => "js",
            Self::C => "c",
        }
    }
}

/// One language's examples, built.
#[derive(Debug, Clone)]
pub struct Examples {
    /// `enrich/dist/enrich.wasm` (contract 0.2.0): an HTTP lookup per
    /// record, published as an output.
    pub enrich: PathBuf,
    /// `echo/dist/echo.wasm`: a record-handler that logs and acks.
    pub echo: PathBuf,
    /// `batch-sum/dist/batch-sum.wasm`: a batch-handler summing amounts.
    pub batch_sum: PathBuf,
    /// `poison/dist/poison.wasm`: retries, rejects or acks by the data.
    pub poison: PathBuf,
    /// `running-total/dist/running-total.wasm` (contract 0.2.0, per-key
    /// state): adds each record's amount to its key's total.
    pub running_total: PathBuf,
    /// `windowed-totals/dist/windowed-totals.wasm` (contract 0.3.0,
    /// windowed): sums each key's amounts per window, published at the
    /// window's close.
    pub windowed_totals: PathBuf,
}

/// Builds `lang`'s examples with `guest-examples/<lang>/build.sh`, once per
/// process. A missing toolchain fails the build (and with it the test): the
/// conformance suite never skips a language.
///
/// # Errors
/// When the build script fails, with its output.
pub fn build_examples(lang: Language) -> anyhow::Result<Examples> {
    static BUILT: [OnceLock<Result<Examples, String>>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let index = Language::ALL.iter().position(|l| *l == lang).unwrap_or(0);
    BUILT[index]
        .get_or_init(|| {
            let root = repo_root();
            let dir = root.join("guest-examples").join(lang.dir());
            let mut cmd = Command::new("bash");
            cmd.arg(dir.join("build.sh"))
                .env_remove("CARGO_TARGET_DIR")
                .env_remove("RUSTFLAGS");
            if lang == Language::Rust {
                // Shares the fixture guests' target folder.
                cmd.env("CARGO_TARGET_DIR", root.join("target/guests"));
            }
            run_checked(
                &mut cmd,
                &format!("building the {} guest examples", lang.dir()),
            )
            .map_err(|e| format!("{e:#}"))?;
            let built = |example: &str| {
                dir.join(example)
                    .join("dist")
                    .join(format!("{example}.wasm"))
            };
            Ok(Examples {
                enrich: built("enrich"),
                echo: built("echo"),
                batch_sum: built("batch-sum"),
                poison: built("poison"),
                running_total: built("running-total"),
                windowed_totals: built("windowed-totals"),
            })
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// One log line of a host process, parsed from its JSON output.
pub type LogLine = serde_json::Value;

/// A running `shardlane run` process with JSON logs, stopped on drop.
pub struct HostProcess {
    child: Child,
    lines: Arc<Mutex<Vec<LogLine>>>,
    stderr: Arc<Mutex<String>>,
    /// The threads collecting stdout and stderr: joined once the process is
    /// gone, so every line it wrote is in `lines` before a test reads them.
    collectors: Vec<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl HostProcess {
    /// Writes `config` to a temporary file and runs `bin run --config` on it
    /// against the emulator at `kinesis_endpoint`, logging JSON.
    ///
    /// # Errors
    /// When the process cannot start.
    pub fn start(bin: &Path, config: &str, kinesis_endpoint: &str) -> anyhow::Result<Self> {
        Self::start_with(
            bin,
            config,
            &[("AWS_ENDPOINT_URL_KINESIS", kinesis_endpoint)],
        )
    }

    /// Like [`HostProcess::start`], with any environment (emulator
    /// endpoints; it overrides the defaults, `RUST_LOG` included).
    ///
    /// # Errors
    /// When the process cannot start.
    pub fn start_with(bin: &Path, config: &str, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::spawn(bin, config, env, true)
    }

    /// Like [`HostProcess::start_with`], but with the binary's own log
    /// filter (no `RUST_LOG`): what a user's deployment runs, for
    /// benchmarks.
    ///
    /// # Errors
    /// When the process cannot start.
    pub fn start_as_deployed(
        bin: &Path,
        config: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::spawn(bin, config, env, false)
    }

    /// Runs `bin <subcommand> --log-format json --config <config> <args…>`
    /// (a one-shot command that logs as `run` does, such as `replay`) with
    /// `env`, collecting its lines like a host's.
    ///
    /// # Errors
    /// When the process cannot start.
    pub fn start_command(
        bin: &Path,
        subcommand: &str,
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::spawn_args(bin, subcommand, config, args, env, true)
    }

    fn spawn(
        bin: &Path,
        config: &str,
        env: &[(&str, &str)],
        test_log_filter: bool,
    ) -> anyhow::Result<Self> {
        Self::spawn_args(bin, "run", config, &[], env, test_log_filter)
    }

    fn spawn_args(
        bin: &Path,
        subcommand: &str,
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
        test_log_filter: bool,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let config_path = dir.path().join("shardlane.toml");
        std::fs::write(&config_path, config)?;
        let mut command = Command::new(bin);
        command
            .args([subcommand, "--log-format", "json", "--config"])
            .arg(&config_path)
            .args(args)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1");
        if test_log_filter {
            // Checkpoint writes are debug events; tests assert on them.
            command.env("RUST_LOG", "info,shardlane::lease=debug");
        } else {
            command.env_remove("RUST_LOG");
        }
        let mut child = command
            // After the defaults: a caller's `env` wins.
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let sink = lines.clone();
        let out_collector = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let parsed = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({ "unparsed": line }));
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(parsed);
            }
        });
        let stderr_text = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let sink = stderr_text.clone();
        let err_collector = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap_or_else(|e| e.into_inner());
                text.push_str(&line);
                text.push('\n');
            }
        });
        Ok(Self {
            child,
            lines,
            stderr: stderr_text,
            collectors: vec![out_collector, err_collector],
            _dir: dir,
        })
    }

    /// Every log line so far.
    pub fn lines(&self) -> Vec<LogLine> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Log lines whose `message` starts with `prefix`.
    pub fn messages(&self, prefix: &str) -> Vec<LogLine> {
        self.lines()
            .into_iter()
            .filter(|l| l["message"].as_str().is_some_and(|m| m.starts_with(prefix)))
            .collect()
    }

    /// Waits until `done` holds for the log lines, polling; fails with the
    /// last lines when `within` passes or the process exits.
    ///
    /// # Errors
    /// On timeout or an early exit.
    pub async fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        done: impl Fn(&[LogLine]) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if done(&self.lines.lock().unwrap_or_else(|e| e.into_inner())) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "host exited ({status}) while waiting for {what}\n{}",
                    self.tail()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {within:?} waiting for {what}\n{}",
                    self.tail()
                );
            }
            // Polling the collected log lines.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fails, with the end of its log, when the process has exited.
    ///
    /// # Errors
    /// When it has exited, or cannot be asked.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("host exited ({status})\n{}", self.tail());
        }
        Ok(())
    }

    fn tail(&self) -> String {
        let lines = self.lines();
        let start = lines.len().saturating_sub(40);
        let mut out: Vec<String> = lines[start..].iter().map(|l| l.to_string()).collect();
        out.push(format!(
            "stderr: {}",
            self.stderr.lock().unwrap_or_else(|e| e.into_inner())
        ));
        out.join("\n")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`KILL`, `STOP`, `CONT`, ...).
    ///
    /// # Errors
    /// When `kill` cannot run.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} failed");
        Ok(())
    }

    /// `kill -9`, and waits for the process to be gone.
    ///
    /// # Errors
    /// When it cannot be killed.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        self.collect_rest();
        Ok(())
    }

    /// After the exit: waits until the collectors have read the pipes to
    /// their end.
    fn collect_rest(&mut self) {
        for collector in self.collectors.drain(..) {
            let _ = collector.join();
        }
    }

    /// Waits for the process to exit by itself.
    ///
    /// # Errors
    /// When it does not within `within` (it is left running).
    pub async fn wait_exit(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.collect_rest();
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("did not exit within {within:?}\n{}", self.tail());
            }
            // Polling for the exit.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends SIGTERM and waits for the exit.
    ///
    /// # Errors
    /// When the process does not exit within 30 s.
    pub async fn terminate(&mut self) -> anyhow::Result<ExitStatus> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.collect_rest();
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("host did not exit within 30 s of SIGTERM\n{}", self.tail());
            }
            // Polling for the exit.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
