//! The one-shot commands beside `run`, each a function the binary calls:
//! the top floor (see "Layers" in the crate docs), above the supervisor,
//! so no stage names a command.
//!
//! - `state_get`: `shardlane state get`, the committed state of some keys.
//! - `import_kcl`: `shardlane import-kcl`, a KCL application's checkpoints
//!   moved into a subscription's lease store.
//! - `deregister`: `shardlane deregister-consumer`, a fan-out consumer
//!   removed from its stream.
//! - `versions`: `shardlane deploy`, `versions`, `promote`, `rollback`:
//!   the fleet's plugin versions of a subscription.
//!
//! `shardlane validate` is [`crate::load_plugins`], and `run` is
//! [`crate::run`]: both belong to the supervisor.
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod deregister;
mod import_kcl;
mod state_get;
mod versions;

pub use deregister::deregister_consumer;
pub use import_kcl::{Imported, import_kcl};
pub use state_get::state_get;
pub use versions::{CanaryOptions, DeployAs, deploy, end_shadow, promote, rollback, versions};
