//! `shardlane state get`: the committed state of some keys of a
//! subscription, read from its lease store (read-only).

use anyhow::Context as _;

use crate::config::Config;
use crate::ids::PartitionKey;
use crate::state::KeyState;
use crate::supervisor::open_store;

/// The committed state of `keys` in `subscription`, read from the lease
/// store `config` names (`shardlane state get`): read-only. The file store
/// is locked by a running instance: stop it first, or use the memory of
/// the running instance's metrics.
///
/// # Errors
/// No such subscription, or one without a `state` table; the store cannot
/// be opened or read; a stored state does not decode.
pub async fn state_get(
    config: &Config,
    subscription: &str,
    keys: &[String],
) -> anyhow::Result<Vec<(PartitionKey, Option<KeyState>)>> {
    let sub = config
        .subscriptions
        .iter()
        .find(|s| s.name.as_str() == subscription)
        .with_context(|| format!("no subscription named {subscription:?} in the config"))?;
    anyhow::ensure!(
        sub.sandbox.grants.state.is_some(),
        "subscription {subscription:?} keeps no state: its config has no `state` table"
    );
    let store = open_store(config).await?;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let key = PartitionKey::new(key.as_str());
        let state = match store.load_state(&sub.name, &key).await? {
            None => None,
            Some(bytes) => {
                Some(KeyState::decode(&bytes).with_context(|| format!("state of key {key:?}"))?)
            }
        };
        out.push((key, state));
    }
    Ok(out)
}
