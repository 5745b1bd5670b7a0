//! The plugin stage: loading handler components and calling them.
//!
//! The embedding reads as one story, as in wasmtime's own examples, one
//! module a chapter: [`bindings`] (`bindgen!` of the WIT worlds) → `host`
//! (the per-store `HostState`: WASI granting only what config grants, the
//! store's limits, the `log` host function) → `engine` ([`PluginHost`]: one
//! `wasmtime::Engine` with the pooling allocator and epoch interruption, one
//! `Linker` with WASI and `log`; compiling, telling a component's world from
//! its exports, linking) → `instance` ([`Plugin`]: a compiled component
//! with its pre-instantiated `*Pre`, so imports are resolved and exports
//! looked up once; [`Instance`]: one `Store` + instance, owned by one lane,
//! reused for every call, and implementing the dispatch seam). Beside them:
//! `cache` ([`CompileCache`], compiled components on disk), `epoch` (the
//! thread that advances the epoch while guest code runs, and sleeps while
//! none does) and `error` ([`PluginError`], one line naming the file and
//! the reason).
//!
//! Failures are told by type, never by wasmtime's wording: a component that
//! does not compile fails `Engine::precompile_component`, one that does not
//! fit the instance pool fails loading the compiled artifact; an import the
//! host does not provide is found from the component's import names against
//! the WIT packages the host links; a call that failed for memory is told by
//! the store's limiter, a timeout by its timer.
//!
//! # Containment
//! - A trap fails the call; the instance is then unusable (a trapped
//!   component cannot be entered again), so the caller drops it and makes a
//!   fresh one from the `*Pre` — cheap, microseconds.
//! - Calls are async and yield at every epoch tick ([`EPOCH_TICK`]), so a
//!   guest that loops cannot hold a runtime thread, and
//!   `handler_timeout` cancels it. The epoch ticks whenever guest code
//!   runs (every call and instantiation holds a guard; `epoch` argues why
//!   none is missed); half a second after the last call it slows to a
//!   tick a second.
//! - WASI is linked because guests built with a language's standard library
//!   import it, but the context grants nothing: no preopened directories, no
//!   environment variables, no arguments, no network (every socket address is
//!   denied), stdin empty and stdout/stderr discarded.
//! - Memory per instance is capped by `StoreLimits` (`max_memory`) on top
//!   of the pool's own limits; a guest growing past it traps, which fails
//!   the call with [`CallError::OutOfMemory`](crate::dispatch::CallError::OutOfMemory) (also when the growth was the
//!   host lowering a batch into the guest's memory: dispatch splits such a
//!   batch). Optional fuel per call bounds CPU deterministically.
//! - Config may grant environment variables by name and one read-only
//!   preopened directory; and, to 0.2.0 plugins, output streams, a config
//!   table and HTTP destinations (see [`host`]); nothing else.
//! - Guest logging is rate-limited per instance (a token bucket of
//!   `log_rate` lines a second, bursts of twice that); lines over the limit
//!   are dropped and counted, and the count is logged at most once a second
//!   per instance (at its next line or call after that, or when the instance
//!   goes). Messages over [`MAX_LOG_MESSAGE`] are cut, and so are trap
//!   messages (see [`crate::logging`], "Hostile text").
//!
//! # The compile cache
//! Compiled components are kept on disk and trusted only when the host's
//! own user wrote them; the threat model and the checks that hold it are
//! argued beside the code, in [`cache`].
//!
//! Plugin files themselves are read only when regular and at most
//! [`MAX_PLUGIN_BYTES`](crate::files::MAX_PLUGIN_BYTES) long (see
//! [`files`](crate::files)): whoever can write the plugin file chooses the
//! code the host runs, but inside the sandbox.
//!
//! Floor 8 (the Wasm host) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod bindings;
mod cache;
mod engine;
mod epoch;
mod error;
mod host;
mod instance;

use std::fmt;
use std::time::Duration;

use crate::ids::PluginDigest;

#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) use cache::CompileCache;
pub use engine::PluginHost;
pub(crate) use error::PluginError;
pub(crate) use instance::Instance;
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) use instance::Plugin;

/// How often the engine's epoch advances. Every running guest yields to the
/// async runtime at each tick, and timeouts are observed at this grain.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Longest guest log message kept; longer ones are cut
/// ([`crate::logging::cap`]), so one call cannot fill the host's log with
/// megabytes. Reasons and trap messages are cut to the same length.
pub(crate) const MAX_LOG_MESSAGE: usize = crate::logging::MAX_GUEST_TEXT;

/// Which version of the plugin contract a component targets, told from the
/// `shardlane:plugin` interfaces it imports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contract {
    /// `shardlane:plugin@0.1.0` (frozen, `wit/v0.1.0`):
    /// `log` only.
    V0_1,
    /// `shardlane:plugin@0.2.0` (frozen, `wit/v0.2.0`): `log`,
    /// `outputs`, `state`, `wasi:config/store`,
    /// `wasi:http/outgoing-handler`.
    V0_2,
    /// `shardlane:plugin@0.3.0` (`wit/`): as 0.2.0, with runs of records
    /// (`handle-run`), the window a record is in, and the windowed worlds'
    /// `close-window`.
    V0_3,
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Contract::V0_1 => "shardlane:plugin@0.1.0",
            Contract::V0_2 => "shardlane:plugin@0.2.0",
            Contract::V0_3 => "shardlane:plugin@0.3.0",
        })
    }
}

/// Which world a component implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// Exports `handle` (0.1.0, 0.2.0: one record per call) or
    /// `handle-run` (0.3.0: a run of one shard's records per call).
    RecordHandler,
    /// Exports `handle-batch`: a batch per call.
    BatchHandler,
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            World::RecordHandler => "record-handler",
            World::BatchHandler => "batch-handler",
        })
    }
}

/// What a plugin is, as `shardlane check` reports it.
#[derive(Debug, Clone)]
pub struct PluginInfo {
    /// The world it implements.
    pub world: World,
    /// The contract version it targets.
    pub contract: Contract,
    /// Its digest.
    pub digest: PluginDigest,
    /// Every import, by name.
    pub imports: Vec<String>,
    /// Every export, by name.
    pub exports: Vec<String>,
}
