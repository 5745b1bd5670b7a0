//! shardlane: consume Amazon Kinesis Data Streams with handlers that run as
//! sandboxed WebAssembly components.
//!
//! # Layout
//! One `pipeline` per subscription; its stages are
//! modules, in the order a record takes, each a task that owns its state
//! and talks through typed, bounded channels. Records flow one way; what
//! flows back carries no records: settlement's checkpoint requests to the
//! keeper, and the keeper's calls into the state stage through the
//! `CheckpointState` seam it defines.
//!
//! ```text
//!              assignments             deliveries (64)
//! lease keeper ───────────▶ reader pool ───────────▶ dispatch ──▶ plugin (slot, instances)
//!   ▲    │ open/close/commit    │ track/close           │ settle   │ acked + outputs
//!   │    ▼                      ▼                       ▼          ▼
//!   │  state stage ◀─stage── (lanes)    settlement ◀────────── output stage ──▶ Kinesis
//!   └───── checkpoint requests ─────────────┘
//! ```
//!
//! - `lease`: who reads which shard and where its checkpoint lives: the
//!   `LeaseStore` contract and its backends (memory, file, DynamoDB), the
//!   pure planner, and the keeper that takes, renews, hands over and
//!   releases leases, writes their fenced checkpoints (with the state
//!   stage's writes, through `CheckpointState`) and tells the reader pool
//!   which shards to read.
//! - `reader`: the reader pool and one reader per assigned shard (polling
//!   or fan-out), into the channel, fenced by the lease's validity.
//! - `channel`: the one bounded channel of 64 deliveries per subscription.
//! - `dispatch`: lanes (sequential, `workers`, `by_key`), the batch
//!   collector, the one record path for retries, rejects, give-ups and
//!   bisection, and the dispatch seam (`Handler`, `HandlerFactory`);
//!   `failure`: the failure policy with its dead-letter sink.
//! - `state`: per-key state, staged by the lanes, committed with the
//!   checkpoint by the keeper.
//! - `outputs`: the output stage, which publishes acked records' outputs
//!   and settles their inputs once they are durable.
//! - `settlement`: out-of-order acks in, safe coalesced checkpoint requests
//!   out (the pure watermark inside).
//! - `plugin`: the wasmtime embedding: engine, compile cache, host state,
//!   instances implementing the dispatch seam; `slot`: the plugin slot
//!   lanes instantiate from, replaced while running, and the canary.
//! - `pipeline` wires one subscription and runs its ordered shutdown;
//!   `ops` serves `/healthz`, `/readyz`, `/metrics`, the status page and
//!   the admin API; `supervisor` starts every pipeline and the operations
//!   server; `commands` are the one-shot commands beside `run`.
//! - Below them: ground values (`ids`, `progress`, `key_slice`, `clock`,
//!   `cause`, `files`, `backoff`, `kpl`, `fleet_versions`, `parked`), `config` (the TOML config, validated into
//!   types), and what every stage writes to or calls: `logging`,
//!   `telemetry` (metrics, typed status, spans), `throttle`, `kinesis`
//!   (the client and a typed error) and `channel`.
//!
//! # Layers
//! Each numbered line is a floor. A module imports (`crate::` paths in
//! non-test code) only modules on its own floor or below, and the modules
//! of one floor import each other without a circle, so any stage can be
//! read with only what lies under it. When a lower stage must call a
//! higher one, the lower one defines a trait and the higher implements it
//! (the keeper's `CheckpointState`; the dispatch seam the plugin
//! implements). This list is the one the suite checks (`layers` test):
//!
//! 1. ground values: `ids`, `progress`, `key_slice`, `clock`, `cause`, `files`, `backoff`, `kpl`, `fleet_versions`, `parked`, `filter`, `windows`
//! 2. config: `config`
//! 3. sinks and clients: `logging`, `telemetry`, `throttle`, `kinesis`, `channel`, `artifacts`
//! 4. leases: `lease`
//! 5. settling: `settlement`, `state`
//! 6. records in and out: `reader`, `outputs`
//! 7. dispatch: `dispatch`, `failure`
//! 8. the Wasm host: `plugin`
//! 9. the plugin slot: `slot`
//! 10. wiring: `pipeline`, `ops`, `rollout`
//! 11. the supervisor: `supervisor`
//! 12. commands: `commands`
//!
//! # Public surface
//! Every module is private; what the binary, the end-to-end tests and the
//! benches name is re-exported here, so the compiler reports dead code.
//! The dispatch bench's view of the pipeline's insides is `bench` only
//! with the `bench-internals` feature (which the crate's dev-dependency on
//! itself turns on for benches and tests): in a plain build its items are
//! `pub(crate)`, and `#![warn(unreachable_pub)]` plus dead-code warnings
//! cover them too.

#![warn(unreachable_pub)]
// The docs are the developers' (`cargo doc --document-private-items`,
// checked with `-D warnings` in the suite): the public items' docs link
// the private modules they rest on, which resolve there.
#![allow(rustdoc::private_intra_doc_links)]

mod artifacts;
mod backoff;
mod cause;
mod channel;
mod clock;
mod commands;
mod config;
mod dispatch;
mod failure;
mod files;
mod filter;
mod fleet_versions;
mod ids;
mod key_slice;
mod kinesis;
mod kpl;
mod lease;
mod logging;
mod ops;
mod outputs;
mod parked;
mod pipeline;
mod plugin;
mod progress;
mod reader;
mod rollout;
mod settlement;
mod slot;
mod state;
mod supervisor;
mod telemetry;
mod throttle;
mod windows;

#[cfg(test)]
mod book;
#[cfg(test)]
mod layers;
#[cfg(test)]
mod tests;

pub use channel::CHANNEL_CAPACITY;
pub use commands::Cli;
pub use config::{Config, defaults};
pub use dispatch::LANE_INBOX;
pub use dispatch::routing::lane_for;
pub use files::MAX_PLUGIN_BYTES;
pub use filter::{Filter, FilterError, FilterText, RecordView};
pub use fleet_versions::{Action, CanaryPlan, Change, FleetVersions};
pub use ids::{FilterDigest, PartitionKey, PluginDigest, ShardId, StreamName, SubscriptionName};
pub use key_slice::KeySlice;
pub use lease::file::FileLeaseStore;
pub use lease::{DocKind, LeaseStore};
pub use logging::{LogFormat, LogGuard, init as init_logging};
pub use parked::{ParkLimits, ParkedKey, Source};
pub use plugin::PluginHost;
pub use progress::Checkpoint;
pub use supervisor::{LoadedSubscription, load_plugins, run};

/// The operations server's limits (see the book's "The admin API and hot swaps").
pub mod admin {
    pub use crate::ops::{HEADER_READ_TIMEOUT, LOG_INTERVAL, MAX_CONNECTIONS};
}

/// The pipeline's insides, for `benches/dispatch.rs` only (the
/// `bench-internals` feature): not an API. Items named here are
/// `pub(crate)` in a build without the feature
/// (`#[cfg_attr(feature = "bench-internals", visibility::make(pub))]`), so
/// the compiler still reports what only the bench would use.
#[cfg(feature = "bench-internals")]
pub mod bench {
    pub use crate::channel::{Delivery, Record, WindowClose, Work, channel};
    pub use crate::config::{
        BatchConfig, DispatchMode, FailurePolicy, Grants, OnFailure, ReadMode, SandboxConfig,
        StartPosition, SubscriptionConfig,
    };
    pub use crate::dispatch::{
        CallError, Dispatcher, Handled, Handler, HandlerFactory, Outcome, Output,
    };
    pub use crate::failure::Policy;
    pub use crate::ids::{LaneId, Position, SequenceNumber, SessionId};
    pub use crate::kinesis::KinesisError;
    pub use crate::outputs::{OutputStage, PUBLISH_QUEUE, Publish, PutRecords};
    pub use crate::plugin::{CompileCache, Plugin};
    pub use crate::progress::Ticket;
    pub use crate::settlement::{SETTLEMENT_QUEUE, Settlement, SettlementMsg};
    pub use crate::slot::{Installed, PluginSlot};
    pub use crate::state::CallState;
    pub use crate::telemetry::Telemetry;
    pub use crate::windows::{Window, WindowBy, WindowSpec};
}
