//! `shardlane deploy`, `versions`, `promote` and `rollback`: a
//! subscription's fleet versions ([`crate::versions`]) changed or read
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

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};

use crate::config::{Config, LeaseBackend, SubscriptionConfig, defaults};
use crate::files::{self, MAX_PLUGIN_BYTES};
use crate::ids::PluginDigest;
use crate::lease::{LeaseStore, update_versions};
use crate::plugin::World;
use crate::supervisor::{hostname, open_artifacts, open_store, plugin_host};
use crate::versions::{CanaryRules, CanaryStart, Command, FleetVersions, Stored, check_fraction};

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
            "subscription {:?} uses the memory lease store, which lives inside the running host: use its admin API (PUT /subscriptions/{}/plugin)",
            sub.name.as_str(),
            sub.name
        );
    }
    open_store(config).await
}

/// A canary asked of `shardlane deploy`.
#[derive(Debug, Clone, Default)]
pub struct CanaryOptions {
    /// The fraction of partition keys, in (0, 1).
    pub key_fraction: f64,
    /// Rolled back by itself when its failure rate exceeds the stable
    /// version's by more than this.
    pub rollback_failure_rate: Option<f64>,
    /// Records it must have handled, fleet-wide, before it is judged
    /// (default [`defaults::CANARY_MIN_RECORDS`]).
    pub min_records: Option<u64>,
    /// Promoted by itself after this long without a rollback.
    pub promote_after: Option<std::time::Duration>,
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
pub enum DeployAs {
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
/// keys). Returns the new versions.
///
/// # Errors
/// One line naming what is wrong: the subscription, the file, the
/// component (not one, or the wrong world), the artifact store (none
/// configured for a shared store, a missing bucket or registry), the
/// rules (a canary already running), the lease store. Nothing is recorded
/// then.
pub async fn deploy(
    config: &Config,
    subscription_name: &str,
    plugin: &Path,
    as_: &DeployAs,
) -> anyhow::Result<FleetVersions> {
    let sub = subscription(config, subscription_name)?;
    let canary = match as_ {
        DeployAs::Canary(c) => Some((c.key_fraction, c.rules()?)),
        _ => None,
    };
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
    let store = store(config, sub).await?;
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
    let stored = Stored {
        digest,
        location: Some(artifacts.location()),
    };
    let command = match (as_, canary) {
        (DeployAs::Shadow, _) => Command::Shadow(stored),
        (_, Some((key_fraction, rules))) => Command::Canary(CanaryStart {
            candidate: stored,
            key_fraction,
            rules,
        }),
        _ => Command::Deploy(stored),
    };
    Ok(update_versions(&*store, &sub.name, command, &by()).await?)
}

/// `shardlane versions`: the fleet's versions of `subscription` and their
/// history; `None` before the first instance started.
///
/// # Errors
/// No such subscription; the lease store cannot be read.
pub async fn versions(
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
pub async fn promote(config: &Config, subscription_name: &str) -> anyhow::Result<FleetVersions> {
    change(config, subscription_name, Command::Promote).await
}

/// `shardlane rollback --shadow`: stops the shadow candidate.
///
/// # Errors
/// No shadow runs; no such subscription; the lease store fails.
pub async fn end_shadow(config: &Config, subscription_name: &str) -> anyhow::Result<FleetVersions> {
    change(config, subscription_name, Command::EndShadow).await
}

/// `shardlane rollback`: drops a running canary; without one, sets the
/// stable version back to `to` (by default the one before it).
///
/// # Errors
/// Nothing to roll back to, a version never deployed, a canary running
/// while `to` is named; no such subscription; the lease store fails.
pub async fn rollback(
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
