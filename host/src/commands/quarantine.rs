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
pub async fn quarantine_list(
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
