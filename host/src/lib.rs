//! shardlane: consume Amazon Kinesis Data Streams with handlers that run as
//! sandboxed WebAssembly components.
//!
//! # Layout
//! One [`pipeline`] per subscription; its stages are modules, in the order a
//! record takes, each a task that owns its state and talks through typed,
//! bounded channels — data and control flow one way:
//!
//! ```text
//! lease keeper ─assignments─▶ reader pool ─records─▶ channel (64) ─▶ dispatch ─▶ plugin
//!      ▲                        (readers)                              │ settle
//!      └────────── checkpoint requests ── settlement ◀────────────────┘
//! ```
//!
//! - [`lease`]: who reads which shard and where its checkpoint lives: the
//!   [`lease::LeaseStore`] contract and its backends, the pure lease
//!   planner, and the per-subscription keeper that takes, renews, hands
//!   over and releases leases, writes their fenced checkpoints, and tells
//!   the reader pool which shards to read.
//! - `reader`: the reader pool and one reader task per assigned shard,
//!   GetRecords into the channel, fenced by the lease's validity.
//! - `channel`: the one bounded channel of 64 deliveries per subscription,
//!   and the record it carries.
//! - `dispatch`: lanes (sequential, `workers`, `by_key`), the batch
//!   collector, and the one record path for retries, rejects, give-ups and
//!   bisection; the dispatch seam (`Handler`, `HandlerFactory`) speaks its
//!   own outcome and error types.
//! - `failure`: the failure policy the lanes apply, with its dead-letter
//!   sink.
//! - `settlement`: out-of-order acks in, safe coalesced checkpoint requests
//!   out (the pure watermark inside).
//! - [`plugin`]: the wasmtime embedding: engine and loading, the compile
//!   cache, host state (WASI granting nothing, `log`), instances that
//!   implement the dispatch seam.
//! - `swap`: the plugin slot lanes instantiate from, replaced while the
//!   service runs (file watch, admin API), and the canary's key slice.
//! - `pipeline`: wires one subscription's stages and runs their ordered
//!   shutdown; `supervisor` starts every pipeline and the operations
//!   server.
//! - `ops`: the operations HTTP server: `/healthz`, `/readyz`, `/metrics`,
//!   the status page, and the admin API; `telemetry` holds what it serves:
//!   metrics, each subscription's typed status, and OpenTelemetry spans.
//!
//! Around them: [`config`] (the TOML config, validated into types),
//! [`ids`] (newtypes, sequence-number ordering, the key hash), `kinesis`
//! (the client, every Kinesis call, a typed error), `kpl` (KPL
//! de-aggregation), `files` (bounded reads
//! of regular files only: plugins, the config), `backoff`, `throttle`
//! (throttle counts) and [`logging`].
//!
//! # Public surface
//! Modules are private unless named above as links; what the binary, the
//! end-to-end tests and operators' tooling need is re-exported here.
//! Everything else is crate-private, so the compiler reports dead code.

#![warn(unreachable_pub)]

mod backoff;
mod channel;
pub mod config;
mod dispatch;
mod failure;
mod files;
pub mod ids;
mod import_kcl;
mod kinesis;
mod kpl;
pub mod lease;
pub mod logging;
mod ops;
mod outputs;
mod pipeline;
pub mod plugin;
mod reader;
mod settlement;
pub mod state;
mod supervisor;
mod swap;
mod telemetry;
mod throttle;

pub use channel::CHANNEL_CAPACITY;
pub use dispatch::LANE_INBOX;
pub use dispatch::routing::lane_for;
pub use files::MAX_PLUGIN_BYTES;
pub use import_kcl::{Imported, import_kcl};
pub use supervisor::{LoadedSubscription, deregister_consumer, load_plugins, run};
pub use swap::KeySlice;

/// The operations server's limits (see the README's "Operations").
pub mod admin {
    pub use crate::ops::{HEADER_READ_TIMEOUT, LOG_INTERVAL, MAX_CONNECTIONS};
}

/// The pipeline's insides, for `benches/dispatch.rs` only: not an API.
#[doc(hidden)]
pub mod bench {
    pub use crate::channel::{Delivery, Record, channel};
    pub use crate::dispatch::{
        CallError, Dispatcher, Handled, Handler, HandlerFactory, Outcome, Output,
    };
    pub use crate::failure::Policy;
    pub use crate::kinesis::KinesisError;
    pub use crate::outputs::{OutputStage, PUBLISH_QUEUE, Publish, PutRecords};
    pub use crate::settlement::{SETTLEMENT_QUEUE, Settlement, SettlementMsg, Ticket};
    pub use crate::telemetry::Telemetry;
}
