//! `shardlane quarantine list`: a subscription's parked keys
//! ([`crate::parked`]), read from its lease store (read-only).

use anyhow::Context as _;

use super::subscription;
use crate::config::{Config, OnFailure};
use crate::lease::{DocKind, read_typed};
use crate::parked::ParkedKeys;
use crate::supervisor::open_store;

/// The parked keys of `subscription` (`shardlane quarantine list`).
///
/// # Errors
/// No such subscription; the store cannot be opened or read (a file store
/// in use by a running instance).
pub async fn quarantine_list(
    config: &Config,
    subscription_name: &str,
) -> anyhow::Result<ParkedKeys> {
    let sub = subscription(config, subscription_name)?;
    if !matches!(sub.failure.on_failure, OnFailure::Quarantine(_)) {
        tracing::debug!(subscription = %sub.name, "on_failure is not quarantine: keys parked earlier are listed");
    }
    let store = open_store(config).await?;
    let parked = read_typed(&*store, &sub.name, DocKind::Parked)
        .await
        .with_context(|| format!("cannot read the parked keys of {}", sub.name))?;
    Ok(parked.unwrap_or_default())
}
