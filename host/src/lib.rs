//! shardlane: consume Amazon Kinesis Data Streams with handlers that run as
//! sandboxed WebAssembly components.
//!
//! # Layout
//! The modules follow the pipeline a record takes:
//!
//! - [`lease`]: who reads which shard and where its checkpoint lives (the
//!   [`lease::LeaseStore`] trait, its backends, and the per-subscription
//!   [`lease::keeper`] that takes, renews and releases leases and starts
//!   readers).
//! - [`reader`]: one task per leased shard, GetRecords into the channel.
//! - [`channel`]: the one bounded channel of 64 deliveries per subscription,
//!   and the [`channel::Record`] it carries.
//! - [`dispatch`]: takes deliveries off the channel and runs the handler,
//!   retrying in place.
//! - [`failure`]: the failure policy (attempts, age, skip, block, dead
//!   letters) the lanes apply.
//! - [`settlement`]: out-of-order acks in, safe coalesced checkpoints out
//!   (the pure [`settlement::watermark`] inside).
//! - [`plugin`]: the wasmtime embedding: engine, components, instances, the
//!   `log` host function, WASI granting nothing.
//! - [`swap`]: the plugin slot lanes instantiate from, replaced while the
//!   service runs (file watch, admin API).
//! - [`ops`]: the operations HTTP server: `/healthz`, `/readyz`,
//!   `/metrics`, the status page, and the admin API; [`telemetry`] holds
//!   what it serves.
//! - [`supervisor`]: wires the stages of every subscription, owns every
//!   task, and runs the ordered shutdown.
//!
//! Around them: [`config`] (the TOML config, validated into types),
//! [`ids`] (newtypes, sequence-number ordering), [`kinesis`] (the client and
//! calls with deadlines), [`files`] (bounded reads of regular files only:
//! plugins, the config), [`backoff`], [`throttle`] (throttle counts and a
//! once-an-interval log gate) and [`logging`].

pub mod backoff;
pub mod channel;
pub mod config;
pub mod dispatch;
pub mod failure;
pub mod files;
pub mod ids;
pub mod kinesis;
pub mod lease;
pub mod logging;
pub mod ops;
pub mod plugin;
pub mod reader;
pub mod settlement;
pub mod supervisor;
pub mod swap;
pub mod telemetry;
pub mod throttle;
