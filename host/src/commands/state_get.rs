//! `shardlane state get`: the committed state of some keys of a
//! subscription, read from its lease store (read-only).

use anyhow::Context as _;

use crate::config::Config;
use crate::ids::{PartitionKey, SubscriptionName};
use crate::state::KeyState;
use crate::supervisor::open_store;

/// The committed state of `keys` in `subscription`, read from the lease
/// store `config` names (`shardlane state get`): read-only. A replay's
/// state is read as subscription `<subscription>~replay~<name>`. The file store
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
    // A replay's state: `<subscription>~replay~<name>` (see `replay`).
    let (base, replay) = match subscription.split_once(super::replay::REPLAY_INFIX) {
        Some((base, name)) => (base, Some(name)),
        None => (subscription, None),
    };
    let sub = super::subscription(config, base)?;
    anyhow::ensure!(
        sub.sandbox.grants.state.is_some(),
        "subscription {base:?} keeps no state: its config has no `state` table"
    );
    let store = match replay {
        None => open_store(config).await?,
        Some(name) => {
            super::replay::check_name(name)?;
            super::bounded::progress_store(config, None, name, false).await?
        }
    };
    let name = SubscriptionName::new(subscription);
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let key = PartitionKey::new(key.as_str());
        let state = match store.load_state(&name, &key).await? {
            None => None,
            Some(bytes) => {
                Some(KeyState::decode(&bytes).with_context(|| format!("state of key {key:?}"))?)
            }
        };
        out.push((key, state));
    }
    Ok(out)
}
