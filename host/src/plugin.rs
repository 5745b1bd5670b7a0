//! The plugin stage: loading handler components and calling them.
//!
//! The embedding reads as one story, as in wasmtime's own examples:
//! [`bindings`] (`bindgen!`) → the host's `log` implementation on
//! [`HostState`] → [`PluginHost`] (one [`Engine`] with the pooling allocator
//! and epoch interruption, one [`Linker`] with WASI and `log`) → [`Plugin`]
//! (a compiled [`Component`], its world told from its exports, and the
//! pre-instantiated `*Pre` so imports are resolved and exports looked up
//! once) → [`Instance`] (one [`Store`] + instance, owned by one dispatch
//! loop and reused for every call).
//!
//! # Containment
//! - A trap fails the call; the instance is then unusable (a trapped
//!   component cannot be entered again), so the caller drops it and makes a
//!   fresh one from the `*Pre` — cheap, microseconds.
//! - Calls are async and yield at every epoch tick ([`EPOCH_TICK`]), so a
//!   guest that loops cannot hold a runtime thread, and
//!   `handler_timeout` cancels it.
//! - WASI is linked because guests built with a language's standard library
//!   import it, but the context grants nothing: no preopened directories, no
//!   environment variables, no arguments, no network (every socket address is
//!   denied), stdin empty and stdout/stderr discarded.
//! - Memory per instance is capped by [`StoreLimits`] (`max_memory`) on top
//!   of the pool's own limits; a guest growing past it traps, which fails
//!   the call. Optional fuel per call bounds CPU deterministically.
//! - Config may grant environment variables by name and one read-only
//!   preopened directory; nothing else.
//! - Guest logging is rate-limited per instance (a token bucket of
//!   `log_rate` lines a second, bursts of twice that); lines over the limit
//!   are dropped and counted, and the count is logged once lines flow again
//!   (or when the instance goes). Messages over [`MAX_LOG_MESSAGE`] are
//!   cut.

pub mod bindings;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable, types::ComponentItem};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimits,
    StoreLimitsBuilder,
};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::channel::Record;
use crate::config::{SandboxConfig, defaults};
use crate::ids::{LaneId, SubscriptionName};
use bindings::batch::{BatchHandler, BatchHandlerPre};
use bindings::record::{RecordHandler, RecordHandlerPre};
pub use bindings::{KinesisRecord, Level, Outcome};

/// How often the engine's epoch advances. Every running guest yields to the
/// async runtime at each tick, and timeouts are observed at this grain.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Longest guest log message kept; longer ones are cut, so one call cannot
/// fill the host's log with megabytes.
pub const MAX_LOG_MESSAGE: usize = 8 * 1024;

/// The WIT package every plugin is written against.
pub const WIT_PACKAGE: &str = "shardlane:plugin@0.1.0";

/// Which world a component implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// Exports `handle`: one record per call.
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

/// A plugin's sha256 digest: how every version of a plugin is known.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PluginDigest(Arc<str>);

impl PluginDigest {
    /// The digest of a component's bytes.
    pub fn of(bytes: &[u8]) -> Self {
        let hash = Sha256::digest(bytes);
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        Self(format!("sha256:{hex}").into())
    }

    /// `sha256:` and the first 12 hex digits: enough to tell versions apart
    /// in a log line.
    pub fn short(&self) -> &str {
        &self.0[..19]
    }
}

impl fmt::Display for PluginDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a plugin cannot be used. Each message is one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The file could not be read.
    #[error("plugin {path}: cannot read it: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: std::io::Error,
    },
    /// Not WebAssembly at all.
    #[error(
        "plugin {path}: not a WebAssembly file (it does not start with the \\0asm magic bytes)"
    )]
    NotWasm {
        /// The file.
        path: PathBuf,
    },
    /// A core module where a component is needed.
    #[error(
        "plugin {path}: is a core WebAssembly module, not a component; build it as a component (e.g. for the wasm32-wasip2 target)"
    )]
    CoreModule {
        /// The file.
        path: PathBuf,
    },
    /// The component is larger than the instance pool allows.
    #[error(
        "plugin {path}: does not fit the instance pool: {reason} (raise engine.max_core_instances, now {max_core_instances}, for more core instances)"
    )]
    PoolLimit {
        /// The file.
        path: PathBuf,
        /// Wasmtime's account of what exceeds which limit.
        reason: String,
        /// The configured `engine.max_core_instances`.
        max_core_instances: u32,
    },
    /// The component does not compile.
    #[error("plugin {path}: cannot compile it: {reason}")]
    Compile {
        /// The file.
        path: PathBuf,
        /// The compiler's first line.
        reason: String,
    },
    /// Neither handler export.
    #[error(
        "plugin {path}: exports neither `handle` (world record-handler) nor `handle-batch` (world batch-handler) of {WIT_PACKAGE}"
    )]
    NoHandler {
        /// The file.
        path: PathBuf,
    },
    /// An import the host does not provide.
    #[error("plugin {path}: imports `{import}`, which the host does not provide")]
    MissingImport {
        /// The file.
        path: PathBuf,
        /// The import's name.
        import: String,
    },
    /// A handler export of the wrong type.
    #[error(
        "plugin {path}: export `{export}` does not match world {world} of {WIT_PACKAGE}: {reason}"
    )]
    BadExport {
        /// The file.
        path: PathBuf,
        /// The export.
        export: &'static str,
        /// The world it was checked against.
        world: World,
        /// What wasmtime said.
        reason: String,
    },
    /// Linking failed for another reason.
    #[error("plugin {path}: cannot be linked: {reason}")]
    Link {
        /// The file.
        path: PathBuf,
        /// What wasmtime said.
        reason: String,
    },
    /// A fresh instance could not be made (e.g. the pool is exhausted).
    #[error("plugin {path}: cannot instantiate it: {reason}")]
    Instantiate {
        /// The file.
        path: PathBuf,
        /// What wasmtime said.
        reason: String,
    },
}

/// Why one handler call did not return an outcome.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The guest trapped (panic, unreachable, out of bounds, memory cap...).
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The call ran past `handler_timeout` and was interrupted.
    #[error("guest call timed out after {0:?}")]
    Timeout(Duration),
    /// A batch call returned the wrong number of outcomes.
    #[error("guest returned {got} outcomes for a batch of {want}")]
    WrongOutcomeCount {
        /// Outcomes returned.
        got: usize,
        /// Records in the batch.
        want: usize,
    },
    /// The instance is for the other world.
    #[error("plugin implements {0}, not the world this call needs")]
    WrongWorld(World),
}

/// What a plugin is, as `shardlane check` reports it.
#[derive(Debug, Clone)]
pub struct PluginInfo {
    /// The world it implements.
    pub world: World,
    /// Its digest.
    pub digest: PluginDigest,
    /// Every import, by name.
    pub imports: Vec<String>,
    /// Every export, by name.
    pub exports: Vec<String>,
}

/// The record being handled, for the context of guest log lines.
#[derive(Debug, Clone, Default)]
enum CallContext {
    #[default]
    Idle,
    Record(Arc<Record>),
    Batch {
        first: Arc<Record>,
        len: usize,
    },
}

/// A token bucket for guest log lines.
struct LogBudget {
    rate: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
    dropped: u64,
}

impl LogBudget {
    fn new(rate: u32) -> Self {
        let rate = f64::from(rate);
        Self {
            rate,
            burst: rate * 2.0,
            tokens: rate * 2.0,
            refilled: Instant::now(),
            dropped: 0,
        }
    }

    /// True when a line may be written now.
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.refilled).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.dropped += 1;
            false
        }
    }
}

/// Per-store host state: WASI (granting only what config grants) and the
/// log context.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    subscription: SubscriptionName,
    lane: LaneId,
    digest: PluginDigest,
    call: CallContext,
    log_budget: LogBudget,
}

impl HostState {
    fn report_dropped(&mut self) {
        if self.log_budget.dropped > 0 {
            tracing::warn!(
                subscription = self.subscription.as_str(),
                plugin = self.digest.short(),
                lane = self.lane.0,
                dropped = self.log_budget.dropped,
                "guest log lines dropped by the rate limit"
            );
            self.log_budget.dropped = 0;
        }
    }
}

impl Drop for HostState {
    fn drop(&mut self) {
        self.report_dropped();
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Emits a guest log line at a tracing level chosen at run time (`event!`
/// needs a constant level, hence one arm per level).
macro_rules! guest_event {
    ($level:expr, $($fields:tt)+) => {
        match $level {
            Level::Trace => tracing::event!(target: "guest", tracing::Level::TRACE, $($fields)+),
            Level::Debug => tracing::event!(target: "guest", tracing::Level::DEBUG, $($fields)+),
            Level::Info => tracing::event!(target: "guest", tracing::Level::INFO, $($fields)+),
            Level::Warn => tracing::event!(target: "guest", tracing::Level::WARN, $($fields)+),
            Level::Error => tracing::event!(target: "guest", tracing::Level::ERROR, $($fields)+),
        }
    };
}

impl bindings::log::Host for HostState {
    fn log(&mut self, level: Level, mut message: String) {
        if !self.log_budget.take() {
            return;
        }
        self.report_dropped();
        if message.len() > MAX_LOG_MESSAGE {
            let mut cut = MAX_LOG_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str("…[truncated]");
        }
        let subscription = self.subscription.as_str();
        let plugin = self.digest.short();
        let lane = self.lane.0;
        match &self.call {
            CallContext::Record(r) => guest_event!(
                level,
                subscription,
                plugin,
                lane,
                stream = r.stream.as_str(),
                shard_id = r.shard.as_str(),
                sequence_number = r.sequence.as_str(),
                partition_key = r.partition_key.as_str(),
                "{message}"
            ),
            CallContext::Batch { first, len } => guest_event!(
                level,
                subscription,
                plugin,
                lane,
                stream = first.stream.as_str(),
                shard_id = first.shard.as_str(),
                sequence_number = first.sequence.as_str(),
                partition_key = first.partition_key.as_str(),
                batch_len = len,
                "{message}"
            ),
            CallContext::Idle => guest_event!(level, subscription, plugin, lane, "{message}"),
        }
    }
}

/// The engine and linker every plugin of this process shares.
#[derive(Clone)]
pub struct PluginHost {
    engine: Engine,
    linker: Arc<Linker<HostState>>,
    fuel: bool,
    /// The pool's `max_core_instances_per_component`, for error messages.
    max_core_instances: u32,
    cache: Option<Arc<CompileCache>>,
}

/// Compiled components on disk, so a large guest (Python, JavaScript: 10–20
/// MB, seconds to compile) is compiled once, not at every start.
///
/// An entry is the serialized component, named by the component's sha256
/// and a hash of the engine's compilation settings and wasmtime's version,
/// so a changed plugin, engine setting or wasmtime release never reads a
/// stale entry; wasmtime also refuses an incompatible artifact itself.
/// Entries are written to a temporary file and renamed into place, so a
/// reader never sees half of one.
///
/// # Trust
/// Loading an entry skips compilation and trusts the file's machine code:
/// the cache folder must be writable only by the user the host runs as
/// (the default, under `$XDG_CACHE_HOME` or `~/.cache`, is).
#[derive(Debug)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    /// A cache in `dir` (created when missing).
    ///
    /// # Errors
    /// When the folder cannot be created.
    pub fn new(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    fn entry(&self, engine: &Engine, digest: &PluginDigest) -> PathBuf {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        let hex = digest.to_string();
        let hex = hex.trim_start_matches("sha256:");
        self.dir
            .join(format!("{hex}-{:016x}.cwasm", hasher.finish()))
    }
}

impl PluginHost {
    /// Builds the engine (pooling allocator, epoch interruption, a ticker
    /// thread that lives as long as the engine) and the linker (WASI + log).
    ///
    /// # Errors
    /// When wasmtime rejects the configuration (e.g. it cannot reserve the
    /// pool's virtual memory).
    ///
    /// `max_memory` is the largest memory any instance may grow to (the
    /// largest `max_memory` of any subscription); `max_core_instances` the
    /// most core module instances one component may contain
    /// (`engine.max_core_instances`: a Python guest has 14, Rust and
    /// JavaScript ones 3), a larger component is refused when it is loaded,
    /// naming the limit; `fuel` turns fuel metering on (when
    /// any subscription sets `fuel`).
    pub fn new(max_memory: usize, max_core_instances: u32, fuel: bool) -> anyhow::Result<Self> {
        let mut pool = PoolingAllocationConfig::default();
        // Every component instance may hold its full share of core
        // instances: 1,000 instances of the largest allowed component.
        let total_core_instances = 1_000u32.saturating_mul(max_core_instances).max(2_000);
        pool.total_component_instances(1_000)
            .total_core_instances(total_core_instances)
            .max_core_instances_per_component(max_core_instances)
            .total_memories(1_000)
            .total_tables(2_000)
            .max_tables_per_component(64)
            .max_memory_size(max_memory);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .consume_fuel(fuel)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;
        spawn_epoch_ticker(&engine);

        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        bindings::log::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            fuel,
            max_core_instances,
            cache: None,
        })
    }

    /// Keeps compiled components in `cache` (see [`CompileCache`]).
    pub fn with_cache(mut self, cache: Option<CompileCache>) -> Self {
        self.cache = cache.map(Arc::new);
        self
    }

    /// An engine for checking plugins (`shardlane check`): default limits.
    ///
    /// # Errors
    /// As [`PluginHost::new`].
    pub fn for_checks() -> anyhow::Result<Self> {
        Self::new(defaults::MAX_MEMORY, defaults::MAX_CORE_INSTANCES, false)
    }

    fn compile(&self, path: &Path) -> Result<(Component, PluginDigest), PluginError> {
        let bytes = std::fs::read(path).map_err(|reason| PluginError::Read {
            path: path.to_owned(),
            reason,
        })?;
        self.compile_bytes(path, &bytes)
    }

    fn compile_bytes(
        &self,
        path: &Path,
        bytes: &[u8],
    ) -> Result<(Component, PluginDigest), PluginError> {
        if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
            return Err(PluginError::NotWasm {
                path: path.to_owned(),
            });
        }
        // Bytes 4..8: a core module has version 1, layer 0; a component has
        // layer 1.
        if bytes[6..8] == [0, 0] {
            return Err(PluginError::CoreModule {
                path: path.to_owned(),
            });
        }
        let digest = PluginDigest::of(bytes);
        let started = Instant::now();
        let entry = self.cache.as_ref().map(|c| c.entry(&self.engine, &digest));
        if let Some(entry) = &entry
            && entry.exists()
        {
            // SAFETY: the entry was written by this host's own
            // `Component::serialize` into a folder only its user can write
            // (see `CompileCache`), and wasmtime checks that it matches this
            // engine before using it.
            match unsafe { Component::deserialize_file(&self.engine, entry) } {
                Ok(component) => {
                    tracing::info!(plugin = %path.display(), digest = digest.short(), elapsed_ms = started.elapsed().as_secs_f64() * 1e3, cache = "hit", "plugin loaded from the compile cache");
                    return Ok((component, digest));
                }
                Err(e) => {
                    tracing::warn!(entry = %entry.display(), error = %one_line(&e), "compile cache entry unusable; compiling afresh");
                }
            }
        }
        let component = Component::from_binary(&self.engine, bytes).map_err(|e| {
            let reason = one_line(&e);
            // Wasmtime checks a component against the pool's limits as it
            // compiles it; say which limit and how to raise it.
            if reason.contains("pooling allocator") {
                PluginError::PoolLimit {
                    path: path.to_owned(),
                    reason,
                    max_core_instances: self.max_core_instances,
                }
            } else {
                PluginError::Compile {
                    path: path.to_owned(),
                    reason,
                }
            }
        })?;
        let compiled_in = started.elapsed();
        if let Some(entry) = &entry {
            let tmp = entry.with_extension(format!("tmp{}", std::process::id()));
            let written = component
                .serialize()
                .map_err(|e| one_line(&e))
                .and_then(|bytes| std::fs::write(&tmp, bytes).map_err(|e| e.to_string()))
                .and_then(|()| std::fs::rename(&tmp, entry).map_err(|e| e.to_string()));
            if let Err(e) = written {
                let _ = std::fs::remove_file(&tmp);
                tracing::warn!(entry = %entry.display(), error = e, "cannot write the compile cache entry");
            }
        }
        tracing::info!(
            plugin = %path.display(), digest = digest.short(), elapsed_ms = compiled_in.as_secs_f64() * 1e3,
            cache = if entry.is_some() { "miss" } else { "off" }, "plugin compiled"
        );
        Ok((component, digest))
    }

    fn world_of(&self, path: &Path, component: &Component) -> Result<World, PluginError> {
        let ty = component.component_type();
        let mut record = false;
        let mut batch = false;
        for (name, item) in ty.exports(&self.engine) {
            if matches!(item.ty, ComponentItem::ComponentFunc(_)) {
                record |= name == "handle";
                batch |= name == "handle-batch";
            }
        }
        match (record, batch) {
            (true, _) => Ok(World::RecordHandler),
            (false, true) => Ok(World::BatchHandler),
            (false, false) => Err(PluginError::NoHandler {
                path: path.to_owned(),
            }),
        }
    }

    /// Compiles and checks a plugin without running it: what `shardlane
    /// check` prints.
    ///
    /// # Errors
    /// Any [`PluginError`] that [`PluginHost::load`] would return.
    pub fn inspect(&self, path: &Path) -> Result<PluginInfo, PluginError> {
        let (component, digest) = self.compile(path)?;
        let world = self.world_of(path, &component)?;
        // Linking proves every import is provided and the export matches.
        self.pre(path, &component, world)?;
        let ty = component.component_type();
        Ok(PluginInfo {
            world,
            digest,
            imports: ty
                .imports(&self.engine)
                .map(|(n, _)| n.to_owned())
                .collect(),
            exports: ty
                .exports(&self.engine)
                .map(|(n, _)| n.to_owned())
                .collect(),
        })
    }

    fn pre(
        &self,
        path: &Path,
        component: &Component,
        world: World,
    ) -> Result<PluginPre, PluginError> {
        let pre = self.linker.instantiate_pre(component).map_err(|e| {
            let reason = one_line(&e);
            match reason.split('`').nth(1) {
                Some(import) if reason.contains("import") => PluginError::MissingImport {
                    path: path.to_owned(),
                    import: import.to_owned(),
                },
                _ => PluginError::Link {
                    path: path.to_owned(),
                    reason,
                },
            }
        })?;
        let bad_export = |export, e: wasmtime::Error| PluginError::BadExport {
            path: path.to_owned(),
            export,
            world,
            reason: one_line(&e),
        };
        Ok(match world {
            World::RecordHandler => {
                PluginPre::Record(RecordHandlerPre::new(pre).map_err(|e| bad_export("handle", e))?)
            }
            World::BatchHandler => PluginPre::Batch(
                BatchHandlerPre::new(pre).map_err(|e| bad_export("handle-batch", e))?,
            ),
        })
    }

    /// Compiles a plugin, tells its world and pre-instantiates it, for the
    /// subscription whose log lines it will write; each call of its
    /// instances is cut off after `handler_timeout`.
    ///
    /// # Errors
    /// A [`PluginError`] naming the file and the reason.
    pub fn load(
        &self,
        path: &Path,
        subscription: SubscriptionName,
        handler_timeout: Duration,
        sandbox: SandboxConfig,
    ) -> Result<Plugin, PluginError> {
        let (component, digest) = self.compile(path)?;
        self.finish_load(
            path,
            component,
            digest,
            subscription,
            handler_timeout,
            sandbox,
        )
    }

    /// [`PluginHost::load`] from bytes in hand (a new version arriving
    /// through the admin API or a changed file); `path` names it.
    ///
    /// # Errors
    /// As [`PluginHost::load`].
    pub fn load_bytes(
        &self,
        path: &Path,
        bytes: &[u8],
        subscription: SubscriptionName,
        handler_timeout: Duration,
        sandbox: SandboxConfig,
    ) -> Result<Plugin, PluginError> {
        let (component, digest) = self.compile_bytes(path, bytes)?;
        self.finish_load(
            path,
            component,
            digest,
            subscription,
            handler_timeout,
            sandbox,
        )
    }

    fn finish_load(
        &self,
        path: &Path,
        component: Component,
        digest: PluginDigest,
        subscription: SubscriptionName,
        handler_timeout: Duration,
        sandbox: SandboxConfig,
    ) -> Result<Plugin, PluginError> {
        let world = self.world_of(path, &component)?;
        let pre = self.pre(path, &component, world)?;
        Ok(Plugin {
            path: path.to_owned(),
            digest,
            world,
            pre,
            engine: self.engine.clone(),
            subscription,
            handler_timeout,
            sandbox,
            fuel_metering: self.fuel,
        })
    }
}

/// One line of an error chain, for messages that must stay on one line.
fn one_line(e: &wasmtime::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

/// Advances the engine's epoch every [`EPOCH_TICK`] for as long as the
/// engine lives (the thread holds only a weak reference).
fn spawn_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        // Spawning a thread only fails when the OS is out of threads at
        // start-up; nothing sensible can run then.
        .expect("cannot spawn the epoch ticker thread");
}

enum PluginPre {
    Record(RecordHandlerPre<HostState>),
    Batch(BatchHandlerPre<HostState>),
}

/// A compiled, linked, pre-instantiated plugin: immutable, shared by every
/// lane of its subscription.
pub struct Plugin {
    path: PathBuf,
    digest: PluginDigest,
    world: World,
    pre: PluginPre,
    engine: Engine,
    subscription: SubscriptionName,
    handler_timeout: Duration,
    sandbox: SandboxConfig,
    fuel_metering: bool,
}

impl Plugin {
    /// The world it implements.
    pub fn world(&self) -> World {
        self.world
    }

    /// Its digest.
    pub fn digest(&self) -> &PluginDigest {
        &self.digest
    }

    /// Its file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The subscription it serves.
    pub fn subscription(&self) -> &SubscriptionName {
        &self.subscription
    }

    /// A fresh instance in its own store.
    ///
    /// # Errors
    /// [`PluginError::Instantiate`] when the pool is exhausted or the
    /// guest's start-up traps.
    pub async fn instantiate(&self, lane: LaneId) -> Result<Instance, PluginError> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .envs(&self.sandbox.env);
        if let Some(preopen) = &self.sandbox.preopen {
            wasi.preopened_dir(&preopen.host, &preopen.guest, FsPerms::ReadOnly)
                .map_err(|e| PluginError::Instantiate {
                    path: self.path.clone(),
                    reason: format!("cannot preopen {}: {e}", preopen.host.display()),
                })?;
        }
        let state = HostState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new()
                .memory_size(self.sandbox.max_memory)
                .table_elements(100_000)
                .instances(100)
                .tables(100)
                .memories(100)
                .trap_on_grow_failure(true)
                .build(),
            log_budget: LogBudget::new(self.sandbox.log_rate),
            subscription: self.subscription.clone(),
            lane,
            digest: self.digest.clone(),
            call: CallContext::Idle,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        // Yield to the runtime at every tick: a looping guest neither holds
        // a thread nor escapes `handler_timeout`.
        store.epoch_deadline_async_yield_and_update(1);
        let instantiate_error = |e: wasmtime::Error| PluginError::Instantiate {
            path: self.path.clone(),
            reason: one_line(&e),
        };
        let handler = match &self.pre {
            PluginPre::Record(pre) => Handler::Record(
                pre.instantiate_async(&mut store)
                    .await
                    .map_err(instantiate_error)?,
            ),
            PluginPre::Batch(pre) => Handler::Batch(
                pre.instantiate_async(&mut store)
                    .await
                    .map_err(instantiate_error)?,
            ),
        };
        Ok(Instance {
            store,
            handler,
            timeout: self.handler_timeout,
            fuel: self
                .fuel_metering
                .then_some(self.sandbox.fuel.unwrap_or(u64::MAX)),
        })
    }
}

enum Handler {
    Record(RecordHandler),
    Batch(BatchHandler),
}

/// One live instance. Not reusable after a trap or timeout: drop it and
/// instantiate afresh.
pub struct Instance {
    store: Store<HostState>,
    handler: Handler,
    timeout: Duration,
    /// Fuel granted per call, when the engine meters fuel.
    fuel: Option<u64>,
}

/// The WIT view of a record: borrows the host's strings and bytes, which
/// are lowered straight into the guest's memory.
fn to_wit(record: &Record, attempt: u32) -> KinesisRecord<'_> {
    KinesisRecord {
        stream: record.stream.as_str(),
        shard_id: record.shard.as_str(),
        partition_key: record.partition_key.as_str(),
        sequence_number: record.sequence.as_str(),
        approximate_arrival: record.arrival_ms,
        data: &record.data,
        attempt,
    }
}

impl Instance {
    /// The digest of the plugin version it is an instance of.
    pub fn digest(&self) -> &PluginDigest {
        &self.store.data().digest
    }

    fn refuel(&mut self) -> Result<(), CallError> {
        if let Some(fuel) = self.fuel {
            self.store
                .set_fuel(fuel)
                .map_err(|e| CallError::Trap(one_line(&e)))?;
        }
        Ok(())
    }

    /// Calls `handle` for one record.
    ///
    /// # Errors
    /// [`CallError`] on a trap or timeout; the instance must then be dropped.
    pub async fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
    ) -> Result<Outcome, CallError> {
        let timeout = self.timeout;
        self.refuel()?;
        let Handler::Record(handler) = &self.handler else {
            return Err(CallError::WrongWorld(World::BatchHandler));
        };
        self.store.data_mut().call = CallContext::Record(record.clone());
        let arg = to_wit(record, attempt);
        let result = tokio::time::timeout(timeout, handler.call_handle(&mut self.store, arg)).await;
        let state = self.store.data_mut();
        state.call = CallContext::Idle;
        state.report_dropped();
        match result {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(trap)) => Err(CallError::Trap(one_line(&trap))),
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }

    /// Calls `handle-batch` for a batch; one outcome per record, in order.
    ///
    /// # Errors
    /// [`CallError`] on a trap, a timeout or a wrong-length answer; after a
    /// trap or timeout the instance must be dropped.
    pub async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
    ) -> Result<Vec<Outcome>, CallError> {
        let timeout = self.timeout;
        self.refuel()?;
        let Handler::Batch(handler) = &self.handler else {
            return Err(CallError::WrongWorld(World::RecordHandler));
        };
        let Some((first, _)) = records.first() else {
            return Ok(Vec::new());
        };
        self.store.data_mut().call = CallContext::Batch {
            first: first.clone(),
            len: records.len(),
        };
        let args: Vec<KinesisRecord> = records.iter().map(|(r, a)| to_wit(r, *a)).collect();
        let result =
            tokio::time::timeout(timeout, handler.call_handle_batch(&mut self.store, &args)).await;
        let state = self.store.data_mut();
        state.call = CallContext::Idle;
        state.report_dropped();
        match result {
            Ok(Ok(outcomes)) if outcomes.len() == records.len() => Ok(outcomes),
            Ok(Ok(outcomes)) => Err(CallError::WrongOutcomeCount {
                got: outcomes.len(),
                want: records.len(),
            }),
            Ok(Err(trap)) => Err(CallError::Trap(one_line(&trap))),
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }
}
