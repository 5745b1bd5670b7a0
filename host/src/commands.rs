//! The command line, and every command: the top floor (see "Layers" in
//! the crate docs), above the supervisor, so no stage names a command.
//!
//! One shape: each command is an `Args` struct (`clap`) with a `run`, in
//! the module of what it does; [`Cli`] holds them and dispatches;
//! `bootstrap` is the start-up they share (config, log, runtime, signals,
//! the one line an error becomes). The binary only parses and runs.
//!
//! - `cli`: the command tree, and `completions`, `man`, `healthcheck`.
//! - `bootstrap`: what every command shares at start.
//! - `run`: `shardlane run`, the service ([`crate::supervisor`]).
//! - `check`: `shardlane validate` (a config and its plugins),
//!   `shardlane check` (one plugin) and `shardlane config schema`, without
//!   running anything.
//! - `deploy`: `shardlane deploy`, `versions`, `promote`, `rollback`:
//!   the fleet's plugin versions of a subscription.
//! - `repair_run`: what `replay` and `redrive` share: a repair run of a
//!   subscription, its progress and summary.
//! - `replay`: `shardlane replay`, a range of a stream handled again next
//!   to the service, its progress apart from the live checkpoints.
//! - `redrive`: `shardlane redrive`, dead letters handed back to the
//!   plugin in per-key order, and a parked key released.
//! - `quarantine`: `shardlane quarantine list`, a subscription's parked
//!   keys.
//! - `state_get`: `shardlane state get`, the committed state of some keys.
//! - `import_kcl`: `shardlane import-kcl`, a KCL application's checkpoints
//!   moved into a subscription's lease store.
//! - `deregister`: `shardlane deregister-consumer`, a fan-out consumer
//!   removed from its stream.
//! - `local_test`: `shardlane test`, a plugin run over a file of records
//!   through the subscription's pipeline, with nothing from AWS.
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod bootstrap;
mod check;
mod cli;
mod deploy;
mod deregister;
mod import_kcl;
mod local_test;
mod quarantine;
mod redrive;
mod repair_run;
mod replay;
mod run;
mod state_get;

use anyhow::Context as _;

use crate::config::{Config, SubscriptionConfig};

pub use cli::Cli;

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
