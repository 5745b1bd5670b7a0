//! The command line: one `Args` struct per command, each with a `run`
//! (Spin's and wasmtime's shape), parsed by `clap`; [`Cli::run`] dispatches
//! and turns an error into one line and a non-zero exit. The binary is
//! this and nothing else.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand};

use super::bootstrap::one_line;
use super::check::{CheckArgs, ConfigArgs, ValidateArgs};
use super::deploy::{DeployArgs, PromoteArgs, RollbackArgs, VersionsArgs};
use super::deregister::DeregisterArgs;
use super::import_kcl::ImportKclArgs;
use super::local_test::TestArgs;
use super::quarantine::QuarantineArgs;
use super::redrive::RedriveArgs;
use super::replay::ReplayArgs;
use super::run::RunArgs;
use super::state_get::StateArgs;

/// `shardlane`: run the service from a config file, change and inspect a
/// fleet's versions, repair, and inspect what the stores hold.
#[derive(Parser)]
#[command(
    name = "shardlane",
    version,
    about = "Kinesis stream handlers as sandboxed WebAssembly components"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service until SIGINT or SIGTERM.
    Run(RunArgs),
    /// Check a config file and every plugin it names, without starting.
    Validate(ValidateArgs),
    /// The config file's schema (`shardlane config schema`).
    Config(ConfigArgs),
    /// Deregister the enhanced fan-out stream consumer of a subscription
    /// (`read = "fan_out"`); stop every instance reading through it first.
    DeregisterConsumer(DeregisterArgs),
    /// Import a KCL application's checkpoints (its DynamoDB lease table)
    /// into a subscription's lease store, to switch without reading the
    /// stream again; stop the KCL application and every instance first.
    ImportKcl(ImportKclArgs),
    /// Deploy a plugin version (or a filter, or both) to every instance of
    /// a subscription: checks it against the contract, stores it in
    /// `[artifacts] location`, and records it in the lease store, which
    /// every instance follows within seconds.
    Deploy(DeployArgs),
    /// Print a subscription's fleet versions and the history of changes.
    Versions(VersionsArgs),
    /// Make a subscription's canary candidate its stable version, fleet-wide.
    Promote(PromoteArgs),
    /// Drop a subscription's canary, or (without one) set its stable
    /// version back to the one before, or to `--to`, fleet-wide.
    Rollback(RollbackArgs),
    /// Handle a range of a subscription's stream again, through a plugin
    /// version, next to the running service: its progress, leases and
    /// state are its own (never the service's), it reads within a budget
    /// of its own, and it stops at the range's end. Run again with the
    /// same --name to resume.
    Replay(ReplayArgs),
    /// Hand a subscription's dead letters back to a plugin version (the
    /// records they carry, in their original per-key order), or, with
    /// --key, bring a parked key's records back and release the key. What
    /// was redriven is remembered: run again, nothing is handled twice.
    Redrive(RedriveArgs),
    /// List a subscription's parked keys (`on_failure = "quarantine"`; read-only).
    Quarantine(QuarantineArgs),
    /// Inspect per-key state (read-only).
    State(StateArgs),
    /// Validate a plugin component: print its world and imports.
    Check(CheckArgs),
    /// Run a subscription's plugin over records from a file or stdin (JSON
    /// lines), on this machine: no AWS, no emulator, no network. Prints
    /// each record's outcome, the outputs and state it wrote, and the
    /// state after the run.
    Test(TestArgs),
    /// Print a shell completion script (e.g. `shardlane completions bash >
    /// /etc/bash_completion.d/shardlane`).
    Completions(CompletionsArgs),
    /// Print the manual page (roff; `shardlane man > shardlane.1`).
    Man,
    /// Ask a running host's health endpoint; exit 0 on 200 (a container
    /// HEALTHCHECK without curl in the image).
    Healthcheck(HealthcheckArgs),
}

impl Cli {
    /// Runs the command; an error is printed as one line on stderr.
    pub fn run(self) -> ExitCode {
        match self.command.run() {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {}", one_line(&e));
                ExitCode::FAILURE
            }
        }
    }
}

impl Command {
    fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Self::Run(args) => args.run(),
            Self::Validate(args) => args.run(),
            Self::Config(args) => args.run(),
            Self::DeregisterConsumer(args) => args.run(),
            Self::ImportKcl(args) => args.run(),
            Self::Deploy(args) => args.run(),
            Self::Versions(args) => args.run(),
            Self::Promote(args) => args.run(),
            Self::Rollback(args) => args.run(),
            Self::Replay(args) => args.run(),
            Self::Redrive(args) => args.run(),
            Self::Quarantine(args) => args.run(),
            Self::State(args) => args.run(),
            Self::Check(args) => args.run(),
            Self::Test(args) => args.run(),
            Self::Completions(args) => args.run(),
            Self::Man => man(),
            Self::Healthcheck(args) => args.run(),
        }
    }
}

/// `shardlane completions`.
#[derive(clap::Args)]
struct CompletionsArgs {
    /// The shell.
    shell: clap_complete::Shell,
}

impl CompletionsArgs {
    fn run(self) -> anyhow::Result<ExitCode> {
        let mut cli = Cli::command();
        clap_complete::generate(self.shell, &mut cli, "shardlane", &mut std::io::stdout());
        Ok(ExitCode::SUCCESS)
    }
}

/// `shardlane man`.
fn man() -> anyhow::Result<ExitCode> {
    clap_mangen::Man::new(Cli::command())
        .render(&mut std::io::stdout())
        .context("cannot write the manual page")?;
    Ok(ExitCode::SUCCESS)
}

/// `shardlane healthcheck`.
#[derive(clap::Args)]
struct HealthcheckArgs {
    /// The metrics (or admin) listener's address.
    #[arg(long, default_value = "127.0.0.1:9090")]
    addr: String,
    /// `/healthz` (alive) or `/readyz` (reading).
    #[arg(long, default_value = "/healthz")]
    path: String,
}

impl HealthcheckArgs {
    /// One `GET` over a plain socket, 3 s at most: the status line is all
    /// that matters, so no HTTP client is needed.
    fn run(self) -> anyhow::Result<ExitCode> {
        use std::io::{Read as _, Write as _};
        use std::net::ToSocketAddrs as _;
        let Self { addr, path } = self;
        let timeout = std::time::Duration::from_secs(3);
        let target = addr
            .to_socket_addrs()
            .with_context(|| format!("--addr {addr}: not an address"))?
            .next()
            .with_context(|| format!("--addr {addr}: resolves to nothing"))?;
        let mut stream = std::net::TcpStream::connect_timeout(&target, timeout)
            .with_context(|| format!("{addr}: cannot connect"))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .with_context(|| format!("{addr}: cannot send"))?;
        let mut head = [0u8; 12];
        stream
            .read_exact(&mut head)
            .with_context(|| format!("{addr}{path}: no answer"))?;
        let status = String::from_utf8_lossy(&head[9..12]).into_owned();
        if status != "200" {
            anyhow::bail!("{addr}{path}: answered {status}");
        }
        println!("{addr}{path}: 200");
        Ok(ExitCode::SUCCESS)
    }
}
