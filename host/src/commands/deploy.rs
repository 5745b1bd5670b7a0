//! `shardlane deploy`, `versions`, `promote` and `rollback`: a
//! subscription's fleet versions ([`crate::fleet_versions`]) changed or read
//! through its lease store, the bytes kept in its artifact store
//! ([`crate::artifacts`]). Every instance sharing the store follows within
//! a poll (see `crate::rollout`); nothing here talks to an instance.
//!
//! A deploy validates the component against the contract first (it
//! compiles and links as the host would run it, and its world fits the
//! subscription's `batch_size`), stores the bytes, reads them back by
//! their digest and checks them, then records the change — refused when
//! the fleet's versions are kept in another store than this config's
//! (`VersionsError::OtherStore`): a failure at any step records nothing.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};

use crate::config::{Config, LeaseBackend, SubscriptionConfig, defaults};
use crate::files::{self, MAX_PLUGIN_BYTES};
use crate::filter::FilterText;
use crate::fleet_versions::{
    CanaryRules, CanaryStart, Command, FleetVersions, Stored, check_fraction,
};
use crate::ids::PluginDigest;
use crate::lease::{LeaseStore, update_versions};
use crate::plugin::World;
use crate::supervisor::{hostname, open_artifacts, open_store, plugin_host};

use super::bootstrap;
use super::subscription;

/// Who made a change, in the history.
fn by() -> String {
    format!("cli@{}", hostname())
}

/// The lease store, refusing the memory store (it lives inside the
/// running process, where the admin API changes it).
async fn store(config: &Config, sub: &SubscriptionConfig) -> anyhow::Result<Arc<dyn LeaseStore>> {
    if matches!(config.lease.store, LeaseBackend::Memory) {
        bail!(
            "subscription {:?} uses the memory lease store, which lives inside the running host: use its admin API (PUT /subscriptions/{}/plugin, or …/filter)",
            sub.name.as_str(),
            sub.name
        );
    }
    open_store(config).await
}

/// A canary asked of `shardlane deploy`.
#[derive(Debug, Clone, Default)]
pub(crate) struct CanaryOptions {
    /// The fraction of partition keys, in (0, 1).
    pub(crate) key_fraction: f64,
    /// Rolled back by itself when its failure rate exceeds the stable
    /// version's by more than this.
    pub(crate) rollback_failure_rate: Option<f64>,
    /// Records it must have handled, fleet-wide, before it is judged
    /// (default [`defaults::CANARY_MIN_RECORDS`]).
    pub(crate) min_records: Option<u64>,
    /// Promoted by itself after this long without a rollback.
    pub(crate) promote_after: Option<std::time::Duration>,
}

impl CanaryOptions {
    fn rules(&self) -> anyhow::Result<CanaryRules> {
        check_fraction(self.key_fraction).context("--canary")?;
        if let Some(rate) = self.rollback_failure_rate {
            anyhow::ensure!(
                (0.0..1.0).contains(&rate),
                "--rollback-on-failure-rate {rate}: out of range, from 0 to less than 1"
            );
        }
        Ok(CanaryRules {
            rollback_failure_rate: self.rollback_failure_rate,
            min_records: self
                .min_records
                .unwrap_or(defaults::CANARY_MIN_RECORDS)
                .max(1),
            promote_after_ms: self.promote_after.map(|d| d.as_millis() as u64),
        })
    }
}

/// What `shardlane deploy` makes of the plugin.
#[derive(Debug, Clone)]
pub(crate) enum DeployAs {
    /// The stable version.
    Stable,
    /// A canary's candidate.
    Canary(CanaryOptions),
    /// A shadow candidate: every record after the live version, its
    /// effects compared and never applied.
    Shadow,
}

/// `shardlane deploy`: `plugin` becomes the fleet's stable version of
/// `subscription` (or, with `canary`, a candidate on that fraction of the
/// keys); with `filter`, the stable version's filter changes with it (or
/// alone, without `plugin`). Returns the new versions.
///
/// # Errors
/// One line naming what is wrong: the subscription, the file, the
/// component (not one, or the wrong world), the filter, the artifact
/// store (none configured for a shared store, a missing bucket or
/// registry), the rules (a canary already running), the lease store.
/// Nothing is recorded then.
pub(crate) async fn deploy(
    config: &Config,
    subscription_name: &str,
    plugin: Option<&Path>,
    filter: Option<FilterDeploy>,
    as_: &DeployAs,
) -> anyhow::Result<FleetVersions> {
    let sub = subscription(config, subscription_name)?;
    let canary = match as_ {
        DeployAs::Canary(c) => Some((c.key_fraction, c.rules()?)),
        _ => None,
    };
    let filter = filter.map(FilterDeploy::text).transpose()?;
    let store = store(config, sub).await?;
    let stored = match plugin {
        Some(plugin) => Some(store_plugin(config, sub, plugin).await?),
        None => None,
    };
    let command = match (as_, canary, stored, filter) {
        (_, _, plugin, Some(filter)) => Command::DeployFilter { filter, plugin },
        (_, _, None, None) => bail!("nothing to deploy: give a plugin, --filter or --no-filter"),
        (DeployAs::Shadow, _, Some(stored), None) => Command::Shadow(stored),
        (_, Some((key_fraction, rules)), Some(stored), None) => Command::Canary(CanaryStart {
            candidate: stored,
            key_fraction,
            rules,
        }),
        (_, _, Some(stored), None) => Command::Deploy(stored),
    };
    Ok(update_versions(&*store, &sub.name, command, &by()).await?)
}

/// A filter `shardlane deploy` was given.
#[derive(Debug, Clone)]
pub(crate) enum FilterDeploy {
    /// The patterns in this file (module docs of `crate::filter`).
    File(PathBuf),
    /// No filter.
    None,
}

impl FilterDeploy {
    /// The filter's text, checked; `None` for no filter.
    ///
    /// # Errors
    /// The file unreadable, not one of the two shapes, or a pattern that
    /// breaks a rule (one line naming it).
    fn text(self) -> anyhow::Result<Option<FilterText>> {
        let Self::File(path) = self else {
            return Ok(None);
        };
        let name = path.display();
        let bytes = files::read_regular(&path, 1 << 20)
            .with_context(|| format!("cannot read filter {name}"))?;
        match crate::filter::criteria_filter(&bytes) {
            Ok(Some(text)) => Ok(Some(text)),
            Ok(None) => {
                bail!("filter {name}: no patterns (to deploy no filter, give --no-filter)")
            }
            Err(e) => bail!("filter {name}: {e}"),
        }
    }
}

/// Checks `plugin` as a version of `sub`, stores it in the artifact store
/// and reads it back (no version without its bytes).
async fn store_plugin(
    config: &Config,
    sub: &SubscriptionConfig,
    plugin: &Path,
) -> anyhow::Result<Stored> {
    let bytes = files::read_regular(plugin, MAX_PLUGIN_BYTES)
        .with_context(|| format!("cannot read plugin {}", plugin.display()))?;
    let host = plugin_host(config, None)?;
    let loaded = host
        .load_bytes(
            plugin,
            &bytes,
            sub.name.clone(),
            sub.handler_timeout,
            sub.sandbox.clone(),
        )
        .with_context(|| {
            format!(
                "plugin {} is not a version of {}",
                plugin.display(),
                sub.name
            )
        })?;
    match (loaded.world(), sub.batch) {
        (World::BatchHandler, None) => bail!(
            "plugin {} implements batch-handler, but subscription {} has no batch_size: its instances run record handlers",
            plugin.display(),
            sub.name
        ),
        (World::RecordHandler, Some(_)) => bail!(
            "plugin {} implements record-handler, but subscription {} has batch_size set: its instances run batch handlers",
            plugin.display(),
            sub.name
        ),
        _ => {}
    }
    if let Some(misfit) = loaded.window_misfit(sub.window.as_ref()) {
        bail!(
            "plugin {} is not a version of {}: {misfit}",
            plugin.display(),
            sub.name
        );
    }
    let Some(artifacts) = open_artifacts(config).await else {
        bail!(
            "the config has no [artifacts] location: the fleet's instances could not fetch the new version (set location = \"s3://bucket/prefix\", \"oci://registry/repository\" or a shared folder)"
        );
    };
    // Stored, then read back by its digest and checked: only then is it
    // recorded (no version without its bytes).
    let digest = artifacts.publish(bytes).await.with_context(|| {
        format!(
            "cannot store plugin {} in {}",
            plugin.display(),
            artifacts.location()
        )
    })?;
    Ok(Stored {
        digest,
        location: Some(artifacts.location()),
    })
}

/// `shardlane versions`: the fleet's versions of `subscription` and their
/// history; `None` before the first instance started.
///
/// # Errors
/// No such subscription; the lease store cannot be read.
pub(crate) async fn versions(
    config: &Config,
    subscription_name: &str,
) -> anyhow::Result<Option<FleetVersions>> {
    let sub = subscription(config, subscription_name)?;
    let store = store(config, sub).await?;
    Ok(store.read_versions(&sub.name).await?)
}

/// `shardlane promote`: the canary's candidate becomes the stable version.
///
/// # Errors
/// No canary runs; no such subscription; the lease store fails.
pub(crate) async fn promote(
    config: &Config,
    subscription_name: &str,
) -> anyhow::Result<FleetVersions> {
    change(config, subscription_name, Command::Promote).await
}

/// `shardlane rollback --shadow`: stops the shadow candidate.
///
/// # Errors
/// No shadow runs; no such subscription; the lease store fails.
pub(crate) async fn end_shadow(
    config: &Config,
    subscription_name: &str,
) -> anyhow::Result<FleetVersions> {
    change(config, subscription_name, Command::EndShadow).await
}

/// `shardlane rollback`: drops a running canary; without one, sets the
/// stable version back to `to` (by default the one before it).
///
/// # Errors
/// Nothing to roll back to, a version never deployed, a canary running
/// while `to` is named; no such subscription; the lease store fails.
pub(crate) async fn rollback(
    config: &Config,
    subscription_name: &str,
    to: Option<&str>,
) -> anyhow::Result<FleetVersions> {
    let to = to.map(PluginDigest::parse).transpose().context("--to")?;
    change(config, subscription_name, Command::Rollback { to }).await
}

async fn change(
    config: &Config,
    subscription_name: &str,
    command: Command,
) -> anyhow::Result<FleetVersions> {
    let sub = subscription(config, subscription_name)?;
    let store = store(config, sub).await?;
    Ok(update_versions(&*store, &sub.name, command, &by()).await?)
}

/// The config file and the subscription every versions command names.
#[derive(clap::Args)]
pub(crate) struct Target {
    /// The TOML config file.
    #[arg(long, short, env = "SHARDLANE_CONFIG")]
    config: PathBuf,
    /// The subscription's name.
    #[arg(long, short)]
    subscription: String,
}

impl Target {
    /// Runs `change` on the config and prints what runs now.
    fn change<F, Fut>(self, what: &str, change: F) -> anyhow::Result<ExitCode>
    where
        F: FnOnce(Config, String) -> Fut,
        Fut: Future<Output = anyhow::Result<FleetVersions>>,
    {
        let config = bootstrap::config(&self.config)?;
        let versions = bootstrap::one_shot(change(config, self.subscription))?;
        println!(
            "{what} (revision {}): every instance sharing the lease store follows within seconds",
            versions.revision
        );
        print_running(&versions);
        Ok(ExitCode::SUCCESS)
    }
}

/// `shardlane deploy`.
#[derive(clap::Args)]
pub(crate) struct DeployArgs {
    #[command(flatten)]
    target: Target,
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
    /// Deploy this filter with the plugin, or alone without one: a JSON
    /// file holding Lambda's FilterCriteria (`{"Filters": [{"Pattern":
    /// "…"}]}`) or a list of patterns. Part of the stable version: shown
    /// in `shardlane versions`, rolled back with it.
    #[arg(long, conflicts_with_all = ["canary", "shadow", "no_filter"])]
    filter: Option<PathBuf>,
    /// Deploy the stable version without a filter.
    #[arg(long, conflicts_with_all = ["canary", "shadow"])]
    no_filter: bool,
    /// The plugin's .wasm file (optional with --filter or --no-filter:
    /// the stable plugin stays).
    #[arg(required_unless_present_any = ["filter", "no_filter"])]
    plugin: Option<PathBuf>,
}

impl DeployArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let as_ = match (self.canary, self.shadow) {
            (Some(key_fraction), _) => DeployAs::Canary(CanaryOptions {
                key_fraction,
                rollback_failure_rate: self.rollback_on_failure_rate,
                min_records: self.min_records,
                promote_after: self.promote_after,
            }),
            (None, true) => DeployAs::Shadow,
            (None, false) => DeployAs::Stable,
        };
        let filter = match (self.filter, self.no_filter) {
            (Some(path), _) => Some(FilterDeploy::File(path)),
            (None, true) => Some(FilterDeploy::None),
            (None, false) => None,
        };
        let plugin = self.plugin;
        self.target.change("deployed", |config, sub| async move {
            deploy(&config, &sub, plugin.as_deref(), filter, &as_).await
        })
    }
}

/// `shardlane promote`.
#[derive(clap::Args)]
pub(crate) struct PromoteArgs {
    #[command(flatten)]
    target: Target,
}

impl PromoteArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        self.target.change("promoted", |config, sub| async move {
            promote(&config, &sub).await
        })
    }
}

/// `shardlane rollback`.
#[derive(clap::Args)]
pub(crate) struct RollbackArgs {
    #[command(flatten)]
    target: Target,
    /// The version to go back to (`sha256:…`, from `shardlane versions`).
    #[arg(long, conflicts_with = "shadow")]
    to: Option<String>,
    /// Stop the shadow candidate instead.
    #[arg(long)]
    shadow: bool,
}

impl RollbackArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let Self { target, to, shadow } = self;
        if shadow {
            return target.change("shadow stopped", |config, sub| async move {
                end_shadow(&config, &sub).await
            });
        }
        target.change("rolled back", |config, sub| async move {
            rollback(&config, &sub, to.as_deref()).await
        })
    }
}

/// `shardlane versions`.
#[derive(clap::Args)]
pub(crate) struct VersionsArgs {
    #[command(flatten)]
    target: Target,
}

impl VersionsArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let Target {
            config,
            subscription,
        } = self.target;
        let config = bootstrap::config(&config)?;
        let Some(versions) = bootstrap::one_shot(versions(&config, &subscription))? else {
            println!(
                "subscription {subscription:?} has no fleet versions yet: they are recorded when its first instance starts"
            );
            return Ok(ExitCode::SUCCESS);
        };
        print_running(&versions);
        println!();
        println!(
            "{:<20}  {:<15}  {:<19}  {:<19}  {:<32}  NOTE",
            "WHEN (UTC)", "ACTION", "VERSION", "FILTER", "BY"
        );
        for change in &versions.history {
            let when = std::time::UNIX_EPOCH + std::time::Duration::from_millis(change.at_ms);
            println!(
                "{:<20}  {:<15}  {:<19}  {:<19}  {:<32}  {}",
                humantime::format_rfc3339_seconds(when).to_string(),
                change.action.label(),
                change.digest.short(),
                change.filter.as_ref().map_or("-", |f| f.short()),
                change.by,
                change.note
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// What runs: the stable version, a canary with its rules, a shadow.
fn print_running(versions: &FleetVersions) {
    match &versions.stable {
        Some(stable) => println!("stable:  {stable}"),
        None => println!("stable:  (none recorded)"),
    }
    match versions.stable_filter() {
        Ok(Some(filter)) => {
            println!("filter:  {}", filter.digest);
            for pattern in &filter.patterns {
                println!("         {pattern}");
            }
        }
        Ok(None) => println!("filter:  none (every record is delivered)"),
        Err(e) => println!("filter:  {e}"),
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
