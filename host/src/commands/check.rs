//! `shardlane validate` and `shardlane check`: a config and its plugins,
//! or one plugin, checked without running anything.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use super::bootstrap;
use crate::plugin::PluginHost;
use crate::supervisor::{LoadedSubscription, load_plugins};

/// `shardlane validate`.
#[derive(clap::Args)]
pub(crate) struct ValidateArgs {
    /// The TOML config file.
    #[arg(long, short, env = "SHARDLANE_CONFIG")]
    config: PathBuf,
}

impl ValidateArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let config = bootstrap::config(&self.config)?;
        let (_, loaded) = load_plugins(&config)?;
        println!("{}: ok", self.config.display());
        for LoadedSubscription {
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
                plugin.world_name(),
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
        Ok(ExitCode::SUCCESS)
    }
}

/// `shardlane check`.
#[derive(clap::Args)]
pub(crate) struct CheckArgs {
    /// The plugin's .wasm file.
    plugin: PathBuf,
}

impl CheckArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let host = PluginHost::for_checks().context("cannot start the WebAssembly engine")?;
        let info = host.inspect(&self.plugin)?;
        println!("{}: ok", self.plugin.display());
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
        Ok(ExitCode::SUCCESS)
    }
}

/// `shardlane config`.
#[derive(clap::Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(clap::Subcommand)]
enum ConfigCommand {
    /// Print the config file's JSON Schema, for editors (taplo, Even Better
    /// TOML: `#:schema ./shardlane.schema.json` atop a `shardlane.toml`) and
    /// checks: every table and key with its type and meaning.
    Schema,
}

impl ConfigArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            ConfigCommand::Schema => {
                let text = serde_json::to_string_pretty(&crate::config::Config::schema())
                    .context("cannot render the schema")?;
                println!("{text}");
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
