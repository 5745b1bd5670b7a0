//! The one-shot commands beside `run`, each a function the binary calls:
//! the top floor (see "Layers" in the crate docs), above the supervisor,
//! so no stage names a command.
//!
//! - `state_get`: `shardlane state get`, the committed state of some keys.
//! - `import_kcl`: `shardlane import-kcl`, a KCL application's checkpoints
//!   moved into a subscription's lease store.
//! - `bounded`: what `replay` and `redrive` share: a bounded run of a
//!   subscription, its progress and summary.
//! - `deregister`: `shardlane deregister-consumer`, a fan-out consumer
//!   removed from its stream.
//! - `versions`: `shardlane deploy`, `versions`, `promote`, `rollback`:
//!   the fleet's plugin versions of a subscription.
//! - `quarantine`: `shardlane quarantine list`, a subscription's parked
//!   keys.
//! - `redrive`: `shardlane redrive`, dead letters handed back to the
//!   plugin in per-key order, and a parked key released.
//! - `replay`: `shardlane replay`, a range of a stream handled again next
//!   to the service, its progress apart from the live checkpoints.
//!
//! `shardlane validate` is [`crate::load_plugins`], and `run` is
//! [`crate::run`]: both belong to the supervisor.
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod bounded;
mod deregister;
mod import_kcl;
mod quarantine;
mod redrive;
mod replay;
mod state_get;
mod versions;

use anyhow::Context as _;

use crate::config::{Config, SubscriptionConfig};

pub use deregister::deregister_consumer;
pub use import_kcl::{Imported, import_kcl};
pub use quarantine::quarantine_list;
pub use redrive::{RedriveOptions, RedriveReport, redrive};
pub use replay::{DEFAULT_READS_PER_SECOND, ReplayOptions, ReplayReport, replay};
pub use state_get::state_get;
pub use versions::{CanaryOptions, DeployAs, deploy, end_shadow, promote, rollback, versions};

/// The subscription `name` of `config`.
///
/// # Errors
/// When the config has none of that name.
fn subscription<'a>(config: &'a Config, name: &str) -> anyhow::Result<&'a SubscriptionConfig> {
    config
        .subscriptions
        .iter()
        .find(|s| s.name.as_str() == name)
        .with_context(|| format!("no subscription named {name:?} in the config"))
}
