//! The `shardlane` binary: `run` the service from a config file, `validate`
//! a config, `check` a plugin, probe a running host's `healthcheck` (for
//! container images without curl), print shell `completions` or the `man`
//! page. Errors print as one line and exit non-zero.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use shardlane::Config;
use shardlane::LogFormat;
use shardlane::PluginHost;

#[derive(Parser)]
#[command(
    name = "shardlane",
    version,
    about = "Kinesis stream handlers as sandboxed WebAssembly components"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum StateCommand {
    /// Print the committed state of a subscription's keys (its `state`
    /// table): one line per named value, `<key> <name> <value>`, text as
    /// it is and other bytes as hex. The file store must not be in use by
    /// a running instance.
    Get {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
        /// A partition key (repeat for several).
        #[arg(long, short, required = true)]
        key: Vec<String>,
    },
}

#[derive(Subcommand)]
enum QuarantineCommand {
    /// List a subscription's parked keys (`on_failure = "quarantine"`):
    /// when and why each was parked, how many records it holds, the first
    /// and the latest. Release one with `shardlane redrive --key`.
    List {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run the service until SIGINT or SIGTERM.
    Run {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// Log output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        log_format: Format,
    },
    /// Check a config file and every plugin it names, without starting.
    Validate {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
    },
    /// Deregister the enhanced fan-out stream consumer of a subscription
    /// (`read = "fan_out"`); stop every instance reading through it first.
    DeregisterConsumer {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
    },
    /// Import a KCL application's checkpoints (its DynamoDB lease table)
    /// into a subscription's lease store, to switch without reading the
    /// stream again; stop the KCL application and every instance first.
    ImportKcl {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription to import into (its stream is the KCL one).
        #[arg(long, short)]
        subscription: String,
        /// The KCL application's lease table (its application name).
        #[arg(long, short)]
        table: String,
    },
    /// Deploy a plugin version to every instance of a subscription: checks
    /// it against the contract, stores it in `[artifacts] location`, and
    /// records it in the lease store, which every instance follows within
    /// seconds.
    Deploy {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
        /// Start it as a canary on this fraction of the partition keys
        /// (0 to 1, both excluded) instead of making it the stable version.
        #[arg(long, conflicts_with = "shadow")]
        canary: Option<f64>,
        /// Start it as a shadow candidate instead: every record goes to it
        /// after the live version; its outcomes, outputs and state writes
        /// are compared and never applied.
        #[arg(long)]
        shadow: bool,
        /// With `--canary`: roll it back by itself once its failure rate
        /// (retry, reject, trap, timeout) exceeds the stable version's by
        /// more than this (0.05 = five points), fleet-wide.
        #[arg(long, requires = "canary")]
        rollback_on_failure_rate: Option<f64>,
        /// With `--canary`: records it must have handled, fleet-wide,
        /// before its rules judge it (default 100).
        #[arg(long, requires = "canary")]
        min_records: Option<u64>,
        /// With `--canary`: promote it by itself after this long without a
        /// rollback (e.g. 10m).
        #[arg(long, requires = "canary", value_parser = humantime::parse_duration)]
        promote_after: Option<std::time::Duration>,
        /// The plugin's .wasm file.
        plugin: PathBuf,
    },
    /// Print a subscription's fleet versions and the history of changes.
    Versions {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
    },
    /// Make a subscription's canary candidate its stable version, fleet-wide.
    Promote {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
    },
    /// Drop a subscription's canary, or (without one) set its stable
    /// version back to the one before, or to `--to`, fleet-wide.
    Rollback {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
        /// The version to go back to (`sha256:…`, from `shardlane versions`).
        #[arg(long, conflicts_with = "shadow")]
        to: Option<String>,
        /// Stop the shadow candidate instead.
        #[arg(long)]
        shadow: bool,
    },
    /// Handle a range of a subscription's stream again, through a plugin
    /// version, next to the running service: its progress, leases and
    /// state are its own (never the service's), it reads within a budget
    /// of its own, and it stops at the range's end. Run again with the
    /// same --name to resume.
    Replay {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
        /// The range's start: a time (2026-12-06T10:00:00Z, or -2h for two
        /// hours ago), or sequence numbers per shard
        /// (shardId-000000000001=4959…,…; only the shards named are
        /// replayed). Needed to start a replay, not to resume one.
        #[arg(long, allow_hyphen_values = true)]
        from: Option<String>,
        /// The range's end, included: a time (default: now), or sequence
        /// numbers per shard.
        #[arg(long, allow_hyphen_values = true)]
        to: Option<String>,
        /// The plugin version to run (default: the version the fleet runs).
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// Put and write nothing: count outputs, dead letters and state,
        /// print a summary with samples.
        #[arg(long)]
        dry_run: bool,
        /// The replay's name, to resume it (default: one made from the
        /// range and version, printed at the start).
        #[arg(long)]
        name: Option<String>,
        /// GetRecords per shard per second, at most 5 (default 1: the
        /// service keeps four of the five Kinesis allows).
        #[arg(long)]
        reads_per_second: Option<f64>,
        /// Log output format (the log goes to stdout, progress to stderr).
        #[arg(long, value_enum, default_value_t = Format::Text)]
        log_format: Format,
    },
    /// Hand a subscription's dead letters back to a plugin version (the
    /// records they carry, in their original per-key order), or, with
    /// --key, bring a parked key's records back and release the key. What
    /// was redriven is remembered: run again, nothing is handled twice.
    Redrive {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
        /// Only dead letters put since this time (RFC 3339, or -2h).
        #[arg(long, allow_hyphen_values = true)]
        since: Option<String>,
        /// The plugin version to run (default: the version the fleet runs).
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// Put, write and release nothing: count and print a summary.
        #[arg(long)]
        dry_run: bool,
        /// A parked key (`shardlane quarantine list`): bring its records
        /// back in order, then release it.
        #[arg(long)]
        key: Option<String>,
        /// GetRecords per dead-letter shard per second (default 5).
        #[arg(long)]
        reads_per_second: Option<f64>,
        /// Log output format (the log goes to stdout, progress to stderr).
        #[arg(long, value_enum, default_value_t = Format::Text)]
        log_format: Format,
    },
    /// Inspect a subscription's quarantine (read-only).
    Quarantine {
        #[command(subcommand)]
        command: QuarantineCommand,
    },
    /// Inspect per-key state (read-only).
    State {
        #[command(subcommand)]
        command: StateCommand,
    },
    /// Validate a plugin component: print its world and imports.
    Check {
        /// The plugin's .wasm file.
        plugin: PathBuf,
    },
    /// Print a shell completion script (e.g. `shardlane completions bash >
    /// /etc/bash_completion.d/shardlane`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff; `shardlane man > shardlane.1`).
    Man,
    /// Ask a running host's health endpoint; exit 0 on 200 (a container
    /// HEALTHCHECK without curl in the image).
    Healthcheck {
        /// The metrics (or admin) listener's address.
        #[arg(long, default_value = "127.0.0.1:9090")]
        addr: String,
        /// `/healthz` (alive) or `/readyz` (reading).
        #[arg(long, default_value = "/healthz")]
        path: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { config, log_format } => run(config, log_format),
        Command::Check { plugin } => check(plugin),
        Command::ImportKcl {
            config,
            subscription,
            table,
        } => import_kcl(config, &subscription, &table),
        Command::DeregisterConsumer {
            config,
            subscription,
        } => deregister_consumer(config, &subscription),
        Command::Validate { config } => validate(config),
        Command::Deploy {
            config,
            subscription,
            canary,
            shadow,
            rollback_on_failure_rate,
            min_records,
            promote_after,
            plugin,
        } => fleet(config, |c| async move {
            let as_ = match (canary, shadow) {
                (Some(key_fraction), _) => shardlane::DeployAs::Canary(shardlane::CanaryOptions {
                    key_fraction,
                    rollback_failure_rate: rollback_on_failure_rate,
                    min_records,
                    promote_after,
                }),
                (None, true) => shardlane::DeployAs::Shadow,
                (None, false) => shardlane::DeployAs::Stable,
            };
            let v = shardlane::deploy(&c, &subscription, &plugin, &as_).await?;
            Ok((v, "deployed"))
        }),
        Command::Versions {
            config,
            subscription,
        } => show_versions(config, &subscription),
        Command::Promote {
            config,
            subscription,
        } => fleet(config, |c| async move {
            Ok((shardlane::promote(&c, &subscription).await?, "promoted"))
        }),
        Command::Rollback {
            config,
            subscription,
            to,
            shadow,
        } => fleet(config, |c| async move {
            if shadow {
                return Ok((
                    shardlane::end_shadow(&c, &subscription).await?,
                    "shadow stopped",
                ));
            }
            let v = shardlane::rollback(&c, &subscription, to.as_deref()).await?;
            Ok((v, "rolled back"))
        }),
        Command::Replay {
            config,
            subscription,
            from,
            to,
            plugin,
            dry_run,
            name,
            reads_per_second,
            log_format,
        } => {
            let options = shardlane::ReplayOptions {
                subscription,
                from,
                to,
                plugin,
                dry_run,
                name,
                reads_per_second,
            };
            return replay(config, options, log_format);
        }
        Command::Redrive {
            config,
            subscription,
            since,
            plugin,
            dry_run,
            key,
            reads_per_second,
            log_format,
        } => {
            let options = shardlane::RedriveOptions {
                subscription,
                since,
                plugin,
                dry_run,
                key,
                reads_per_second,
            };
            return redrive(config, options, log_format);
        }
        Command::Quarantine {
            command:
                QuarantineCommand::List {
                    config,
                    subscription,
                },
        } => quarantine_list(config, &subscription),
        Command::State {
            command:
                StateCommand::Get {
                    config,
                    subscription,
                    key,
                },
        } => state_get(config, &subscription, &key),
        Command::Completions { shell } => {
            let mut cli = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cli, "shardlane", &mut std::io::stdout());
            Ok(())
        }
        Command::Man => clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
            .render(&mut std::io::stdout())
            .context("cannot write the manual page"),
        Command::Healthcheck { addr, path } => healthcheck(&addr, &path),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes on one line, `: `-separated. A cause the line
/// already ends with is left out: the host's own errors say their cause in
/// their message (so that a log line says it all) and keep it as their
/// source too, which would otherwise print twice.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string().replace('\n', " ");
        if !line.is_empty() && line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// One `GET` over a plain socket, 3 s at most: the status line is all
/// that matters, so no HTTP client is needed.
fn healthcheck(addr: &str, path: &str) -> anyhow::Result<()> {
    use std::io::{Read as _, Write as _};
    use std::net::ToSocketAddrs as _;
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
    Ok(())
}

fn check(path: PathBuf) -> anyhow::Result<()> {
    let host = PluginHost::for_checks().context("cannot start the WebAssembly engine")?;
    let info = host.inspect(&path)?;
    println!("{}: ok", path.display());
    println!("world: {} ({})", info.world, info.contract);
    println!("digest: {}", info.digest);
    println!("exports:");
    for export in &info.exports {
        println!("  {export}");
    }
    println!("imports:");
    for import in &info.imports {
        println!("  {import}");
    }
    Ok(())
}

fn validate(config_path: PathBuf) -> anyhow::Result<()> {
    let config = Config::load(&config_path)?;
    let (_, loaded) = shardlane::load_plugins(&config)?;
    println!("{}: ok", config_path.display());
    for shardlane::LoadedSubscription {
        config: sub,
        plugin,
        canary,
    } in loaded
    {
        println!(
            "subscription {}: stream {}, plugin {} ({}, {}, {}), {}",
            sub.name,
            sub.stream,
            sub.plugin.display(),
            plugin.world(),
            plugin.contract(),
            plugin.digest(),
            sub.mode()
        );
        if let (Some(candidate), Some(canary)) = (canary, &sub.canary) {
            println!(
                "  canary {} ({}) on {} of the keys",
                canary.plugin.display(),
                candidate.digest(),
                canary.slice
            );
        }
    }
    Ok(())
}

fn deregister_consumer(config_path: PathBuf, subscription: &str) -> anyhow::Result<()> {
    let config = Config::load(&config_path)?;
    let runtime = one_shot_runtime()?;
    let (stream, consumer, existed) =
        runtime.block_on(shardlane::deregister_consumer(&config, subscription))?;
    if existed {
        println!("deregistered stream consumer {consumer:?} of stream {stream:?}");
    } else {
        println!("stream {stream:?} has no consumer {consumer:?}: nothing to deregister");
    }
    Ok(())
}

/// The runtime of a one-shot command: one thread.
fn one_shot_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Runs a change of the fleet's versions and prints what runs now.
fn fleet<F, Fut>(config_path: PathBuf, change: F) -> anyhow::Result<()>
where
    F: FnOnce(Config) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(shardlane::FleetVersions, &'static str)>>,
{
    let config = Config::load(&config_path)?;
    let runtime = one_shot_runtime()?;
    let (versions, what) = runtime.block_on(change(config))?;
    println!(
        "{what} (revision {}): every instance sharing the lease store follows within seconds",
        versions.revision
    );
    print_running(&versions);
    Ok(())
}

fn print_running(versions: &shardlane::FleetVersions) {
    match &versions.stable {
        Some(stable) => println!("stable:  {stable}"),
        None => println!("stable:  (none recorded)"),
    }
    if let Some(canary) = &versions.canary {
        println!(
            "canary:  {} on {:.1} % of the keys",
            canary.candidate,
            canary.key_fraction * 100.0
        );
        let rules = &canary.rules;
        if let Some(rate) = rules.rollback_failure_rate {
            println!(
                "         rolled back if it fails more than {:.1} points above the stable version (judged after {} records)",
                rate * 100.0,
                rules.min_records
            );
        }
        if let Some(after) = rules.promote_after_ms {
            println!(
                "         promoted after {}",
                humantime::format_duration(std::time::Duration::from_millis(after))
            );
        }
    }
    if let Some(shadow) = &versions.shadow {
        println!("shadow:  {shadow}");
    }
}

fn show_versions(config_path: PathBuf, subscription: &str) -> anyhow::Result<()> {
    let config = Config::load(&config_path)?;
    let runtime = one_shot_runtime()?;
    let Some(versions) = runtime.block_on(shardlane::versions(&config, subscription))? else {
        println!(
            "subscription {subscription:?} has no fleet versions yet: they are recorded when its first instance starts"
        );
        return Ok(());
    };
    print_running(&versions);
    println!();
    println!(
        "{:<20}  {:<15}  {:<19}  {:<32}  NOTE",
        "WHEN (UTC)", "ACTION", "VERSION", "BY"
    );
    for change in &versions.history {
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_millis(change.at_ms);
        println!(
            "{:<20}  {:<15}  {:<19}  {:<32}  {}",
            humantime::format_rfc3339_seconds(when).to_string(),
            change.action.label(),
            change.digest.short(),
            change.by,
            change.note
        );
    }
    Ok(())
}

fn quarantine_list(config_path: PathBuf, subscription: &str) -> anyhow::Result<()> {
    let config = Config::load(&config_path)?;
    let runtime = one_shot_runtime()?;
    let parked = runtime.block_on(shardlane::quarantine_list(&config, subscription))?;
    if parked.is_empty() {
        println!("no key of {subscription:?} is parked");
        return Ok(());
    }
    println!(
        "{:<24}  {:<20}  {:>8}  {:<32}  {:<24}  REASON",
        "KEY", "SINCE (UTC)", "RECORDS", "FIRST (shard/sequence)", "BY"
    );
    for (key, p) in &parked {
        let since = std::time::UNIX_EPOCH + std::time::Duration::from_millis(p.since_ms);
        println!(
            "{:<24}  {:<20}  {:>8}  {:<32}  {:<24}  {}",
            key.escape_debug().to_string(),
            humantime::format_rfc3339_seconds(since).to_string(),
            p.records,
            p.first.to_string(),
            p.by,
            p.reason.escape_debug()
        );
    }
    println!("{} keys parked", parked.len());
    Ok(())
}

fn state_get(config_path: PathBuf, subscription: &str, keys: &[String]) -> anyhow::Result<()> {
    let config = Config::load(&config_path)?;
    let runtime = one_shot_runtime()?;
    let found = runtime.block_on(shardlane::state_get(&config, subscription, keys))?;
    let now = std::time::SystemTime::now();
    for (key, state) in found {
        let Some(state) = state else {
            println!("{key}\t(no state)");
            continue;
        };
        for (name, value) in state.iter() {
            let shown = match std::str::from_utf8(&value.data) {
                Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
                _ => format!(
                    "0x{}",
                    value
                        .data
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                ),
            };
            let expires = value.expires_ms.map(|ms| {
                let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
                let gone = if at <= now { " (expired)" } else { "" };
                format!("\texpires={}{gone}", humantime::format_rfc3339_seconds(at))
            });
            println!("{key}\t{name}\t{shown}{}", expires.unwrap_or_default());
        }
    }
    Ok(())
}

fn import_kcl(config_path: PathBuf, subscription: &str, table: &str) -> anyhow::Result<()> {
    let config = Config::load(&config_path)?;
    let runtime = one_shot_runtime()?;
    let imported = runtime.block_on(shardlane::import_kcl(&config, subscription, table))?;
    for lease in &imported {
        match lease {
            shardlane::Imported::Written(shard, checkpoint) => {
                println!("{shard}: checkpoint {checkpoint}");
            }
            shardlane::Imported::NoCheckpoint(shard, sentinel) => {
                println!("{shard}: no checkpoint in KCL yet ({sentinel:?}): starts at `start`");
            }
            shardlane::Imported::OtherStream(key) => {
                println!("{key}: another stream's lease, left alone");
            }
        }
    }
    println!(
        "imported {} checkpoints from KCL table {table:?} into subscription {subscription:?}",
        imported
            .iter()
            .filter(|l| matches!(l, shardlane::Imported::Written(..)))
            .count()
    );
    Ok(())
}

fn run(config_path: PathBuf, format: Format) -> anyhow::Result<()> {
    // Config errors come before any logging is set up: one line on stderr.
    let config = Config::load(&config_path)?;
    // Dropped after the runtime: it exports the spans still queued.
    let _log = shardlane::init_logging(
        match format {
            Format::Text => LogFormat::Text,
            Format::Json => LogFormat::Json,
        },
        config.traces.as_ref(),
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(async {
        // Handlers first: a signal during start-up stops start-up cleanly,
        // not with the default abrupt exit.
        let signals = Signals::install()?;
        shardlane::run(config, signals.shutdown()).await
    });
    // The run has stopped within its bounds; a blocking call still stuck
    // (a file read on a hung network file system) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// `shardlane replay`: logs as `run` does (stdout), progress on stderr,
/// the summary on stdout; exits 130 when interrupted (resumable).
fn replay(config_path: PathBuf, options: shardlane::ReplayOptions, format: Format) -> ExitCode {
    bounded(config_path, format, |config, interrupt| async move {
        let report = shardlane::replay(&config, &options, interrupt).await?;
        Ok((
            format!("replay {}:", report.name),
            report.lines,
            report.finished,
        ))
    })
}

/// `shardlane redrive`, as `replay`.
fn redrive(config_path: PathBuf, options: shardlane::RedriveOptions, format: Format) -> ExitCode {
    bounded(config_path, format, |config, interrupt| async move {
        let report = shardlane::redrive(&config, &options, interrupt).await?;
        Ok(("redrive:".to_owned(), report.lines, report.finished))
    })
}

/// Runs a bounded command (replay, redrive): logs as `run` does (stdout),
/// progress on stderr, then its title and summary lines on stdout; exits
/// 130 when SIGINT or SIGTERM interrupted it.
fn bounded<F, Fut>(config_path: PathBuf, format: Format, run: F) -> ExitCode
where
    F: FnOnce(Config, std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(String, Vec<String>, bool)>>,
{
    let done = (|| {
        let config = Config::load(&config_path)?;
        let _log = shardlane::init_logging(
            match format {
                Format::Text => LogFormat::Text,
                Format::Json => LogFormat::Json,
            },
            None,
        )?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        runtime.block_on(async {
            let mut signals = Signals::install()?;
            run(config, Box::pin(async move { signals.next().await })).await
        })
    })();
    match done {
        Ok((title, lines, finished)) => {
            println!("{title}");
            for line in &lines {
                println!("  {line}");
            }
            if finished {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(130)
            }
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// SIGINT and SIGTERM, registered once.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())
                .context("cannot install the SIGINT handler")?,
            terminate: signal(SignalKind::terminate())
                .context("cannot install the SIGTERM handler")?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }

    /// Completes on the first SIGINT or SIGTERM; a second one exits at once
    /// (leases are then left to expire).
    async fn shutdown(mut self) {
        self.next().await;
        tokio::spawn(async move {
            self.next().await;
            eprintln!("second signal: exiting now");
            std::process::exit(130);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("lease store failed: {0}")]
    struct Store(#[source] Cause);

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Cause;

    /// Catches the start-up error line repeating a cause its message
    /// already says, or losing a context layer.
    #[test]
    fn each_cause_appears_once() {
        let e = anyhow::Error::new(Store(Cause)).context("subscription s");
        assert_eq!(
            one_line(&e),
            "subscription s: lease store failed: connection refused"
        );
        let plain = anyhow::anyhow!("line one\nline two").context("config");
        assert_eq!(one_line(&plain), "config: line one line two");
    }
}
