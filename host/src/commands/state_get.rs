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
pub(crate) async fn state_get(
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
            super::repair_run::progress_store(config, None, name, false).await?
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

/// `shardlane state`.
#[derive(clap::Args)]
pub(crate) struct StateArgs {
    #[command(subcommand)]
    command: StateCommand,
}

#[derive(clap::Subcommand)]
enum StateCommand {
    /// Print the committed state of a subscription's keys (its `state`
    /// table): one line per named value, `<key> <name> <value>`, text as
    /// it is and other bytes as hex. The file store must not be in use by
    /// a running instance.
    Get {
        /// The TOML config file.
        #[arg(long, short, env = "SHARDLANE_CONFIG")]
        config: std::path::PathBuf,
        /// The subscription's name.
        #[arg(long, short)]
        subscription: String,
        /// A partition key (repeat for several).
        #[arg(long, short, required = true)]
        key: Vec<String>,
    },
}

impl StateArgs {
    pub(crate) fn run(self) -> anyhow::Result<std::process::ExitCode> {
        let StateCommand::Get {
            config,
            subscription,
            key,
        } = self.command;
        let config = super::bootstrap::config(&config)?;
        let found = super::bootstrap::one_shot(state_get(&config, &subscription, &key))?;
        let now = std::time::SystemTime::now();
        for (key, state) in found {
            let Some(state) = state else {
                println!("{key}\t(no state)");
                continue;
            };
            for (name, value) in state.iter() {
                let expires = value.expires_ms.map(|ms| {
                    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
                    let gone = if at <= now { " (expired)" } else { "" };
                    format!("\texpires={}{gone}", humantime::format_rfc3339_seconds(at))
                });
                println!(
                    "{key}\t{name}\t{}{}",
                    shown(&value.data),
                    expires.unwrap_or_default()
                );
            }
        }
        Ok(std::process::ExitCode::SUCCESS)
    }
}

/// A value as `state get` prints it: text as it is, other bytes as hex.
fn shown(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
        _ => format!(
            "0x{}",
            data.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}
