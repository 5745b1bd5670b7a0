//! `shardlane run`: the service, until SIGINT or SIGTERM (see
//! [`crate::supervisor`]).

use std::path::PathBuf;
use std::process::ExitCode;

use super::bootstrap::{self, Format};

/// `shardlane run`.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The TOML config file.
    #[arg(long, short, env = "SHARDLANE_CONFIG")]
    config: PathBuf,
    /// Log output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    log_format: Format,
}

impl RunArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let config = bootstrap::config(&self.config)?;
        // Dropped after the runtime: it exports the spans still queued.
        let _log = bootstrap::logging(self.log_format, Some(&config))?;
        bootstrap::service(|signals| crate::supervisor::run(config, signals.shutdown()))?;
        Ok(ExitCode::SUCCESS)
    }
}
