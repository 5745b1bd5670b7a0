//! `shardlane quarantine list`: a subscription's parked keys
//! ([`crate::parked`]), read from its lease store (read-only).

use std::collections::BTreeMap;

use anyhow::Context as _;

use super::subscription;
use crate::config::{Config, OnFailure};
use crate::failure::decode_parked;
use crate::lease::ItemKind;
use crate::parked::ParkedKey;
use crate::supervisor::open_store;

/// The parked keys of `subscription` (`shardlane quarantine list`), by
/// partition key.
///
/// # Errors
/// No such subscription; the store cannot be opened or read (a file store
/// in use by a running instance).
pub(crate) async fn quarantine_list(
    config: &Config,
    subscription_name: &str,
) -> anyhow::Result<BTreeMap<String, ParkedKey>> {
    let sub = subscription(config, subscription_name)?;
    if !matches!(sub.failure.on_failure, OnFailure::Quarantine(_)) {
        tracing::debug!(subscription = %sub.name, "on_failure is not quarantine: keys parked earlier are listed");
    }
    let store = open_store(config).await?;
    let context = || format!("cannot read the parked keys of {}", sub.name);
    store
        .read_items(&sub.name, ItemKind::Parked)
        .await
        .with_context(context)?
        .iter()
        .map(|item| Ok((item.key.clone(), decode_parked(item).with_context(context)?)))
        .collect()
}

/// `shardlane quarantine`.
#[derive(clap::Args)]
pub(crate) struct QuarantineArgs {
    #[command(subcommand)]
    command: QuarantineCommand,
}

#[derive(clap::Subcommand)]
enum QuarantineCommand {
    /// List a subscription's parked keys (`on_failure = "quarantine"`):
    /// when and why each was parked, how many records it holds, the first
    /// and the latest. Release one with `shardlane redrive --key`.
    List {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: std::path::PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
    },
}

impl QuarantineArgs {
    pub(crate) fn run(self) -> anyhow::Result<std::process::ExitCode> {
        let QuarantineCommand::List {
            config,
            subscription,
        } = self.command;
        let config = super::bootstrap::config(&config)?;
        let parked = super::bootstrap::one_shot(quarantine_list(&config, &subscription))?;
        if parked.is_empty() {
            println!("no key of {subscription:?} is parked");
            return Ok(std::process::ExitCode::SUCCESS);
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
        Ok(std::process::ExitCode::SUCCESS)
    }
}
