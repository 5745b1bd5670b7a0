//! What every command shares at start (one place, as Spin's and
//! wasmtime's CLIs share theirs): the config it reads, the log it writes,
//! the runtime it runs on, the signals that stop it, and the one line an
//! error becomes.

use std::future::Future;
use std::path::Path;

use anyhow::Context as _;

use crate::config::Config;
use crate::logging::{LogFormat, LogGuard};

/// The log's format (`--log-format`).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Format {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl From<Format> for LogFormat {
    fn from(format: Format) -> Self {
        match format {
            Format::Text => LogFormat::Text,
            Format::Json => LogFormat::Json,
        }
    }
}

/// The config at `path`, checked: errors come before any logging is set
/// up, as one line on stderr.
///
/// # Errors
/// One line naming the file, the key and the reason.
pub(crate) fn config(path: &Path) -> anyhow::Result<Config> {
    Ok(Config::load(path)?)
}

/// The log, to stdout in `format`, spans exported where `config` says;
/// dropped after the runtime (it exports the spans still queued).
///
/// # Errors
/// A traces exporter that cannot be built.
pub(crate) fn logging(format: Format, config: Option<&Config>) -> anyhow::Result<LogGuard> {
    crate::logging::init(format.into(), config.and_then(|c| c.traces.as_ref()))
}

/// Runs `work` on a one-thread runtime: a one-shot command.
///
/// # Errors
/// `work`'s, or a runtime that cannot start.
pub(crate) fn one_shot<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(work)
}

/// Runs `work` on the multi-thread runtime the service (and the repair
/// commands) run on, with SIGINT and SIGTERM handled from its first
/// moment; a blocking call still stuck when it is done (a file read on a
/// hung network file system) does not hold the exit.
///
/// # Errors
/// `work`'s, or a runtime or signal handler that cannot start.
pub(crate) fn service<T, F, Fut>(work: F) -> anyhow::Result<T>
where
    F: FnOnce(Signals) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(async { work(Signals::install()?).await });
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// SIGINT and SIGTERM, registered once.
pub(crate) struct Signals {
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

    /// Completes on the next SIGINT or SIGTERM.
    pub(crate) async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }

    /// Completes on the first SIGINT or SIGTERM; a second one exits at once
    /// (leases are then left to expire).
    pub(crate) async fn shutdown(mut self) {
        self.next().await;
        tokio::spawn(async move {
            self.next().await;
            eprintln!("second signal: exiting now");
            std::process::exit(130);
        });
    }
}

/// `e` and its causes on one line, `: `-separated. A cause the line
/// already ends with is left out: the host's own errors say their cause in
/// their message (so that a log line says it all) and keep it as their
/// source too, which would otherwise print twice.
pub(crate) fn one_line(e: &anyhow::Error) -> String {
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
