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
//!   the call with [`CallError::OutOfMemory`] (also when the growth was the
//!   host lowering a batch into the guest's memory: dispatch splits such a
//!   batch). Optional fuel per call bounds CPU deterministically.
//! - Config may grant environment variables by name and one read-only
//!   preopened directory; nothing else.
//! - Guest logging is rate-limited per instance (a token bucket of
//!   `log_rate` lines a second, bursts of twice that); lines over the limit
//!   are dropped and counted, and the count is logged at most once a second
//!   per instance (at its next line or call after that, or when the instance
//!   goes). Messages over [`MAX_LOG_MESSAGE`] are cut, and so are trap
//!   messages (see [`crate::logging`], "Hostile text").
//!
//! # Compile cache: threat model
//! Compiling a large component takes seconds, so compiled components are
//! kept on disk ([`CompileCache`]). Loading one is `unsafe`
//! (`Component::deserialize`, like `deserialize_file`): wasmtime maps the entry's bytes as executable
//! machine code and checks only that its header matches this engine and
//! wasmtime release, not that the code is what compiling the plugin would
//! give. So whoever can write an entry runs native code in the host process
//! — outside the sandbox, with the host's privileges, for every record —
//! while `/metrics` shows the digest of the plugin the operator deployed.
//! Entry names are no secret (they follow from that digest).
//!
//! Hence only the host's own user (its effective uid) may write the cache,
//! and root, who can do anything anyway. What is checked:
//! - The folder is created with mode 0700. At start-up an existing folder is
//!   refused when it is not a folder, not owned by the host's euid, or
//!   writable by group or others; the host then runs without a cache and
//!   says so in one line naming the folder and why. We refuse rather than
//!   fix the mode: entries may already have been planted; and we run without
//!   the cache rather than fail start-up: it saves compile time, nothing
//!   more.
//! - Every entry is opened without following a symlink (`O_NOFOLLOW`) and
//!   checked on the opened descriptor (not by path, which a rename could
//!   race): a regular file, owned by the host's euid, writable by no one
//!   else, with one hard link (a link is how an entry of another plugin
//!   could be passed off under this one's name), of bounded size. An entry
//!   that fails is ignored — compiled afresh and replaced — with a warning
//!   naming it. Checking entries as well as the folder covers a folder
//!   whose parent another user can write (they could swap the folder after
//!   start-up, but not make files owned by the host's user).
//! - Entries are written to a new file with an unpredictable name created
//!   with `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600, then renamed into
//!   place, so nothing planted in advance (a file, a symlink) is written
//!   through.
//!
//! Plugin files themselves are read only when regular and at most
//! [`MAX_PLUGIN_BYTES`](crate::files::MAX_PLUGIN_BYTES) long (see
//! [`files`](crate::files)): whoever can write the plugin file chooses the
//! code the host runs, but inside the sandbox.

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

/// Longest guest log message kept; longer ones are cut
/// ([`crate::logging::cap`]), so one call cannot fill the host's log with
/// megabytes. Reasons and trap messages are cut to the same length.
pub const MAX_LOG_MESSAGE: usize = crate::logging::MAX_GUEST_TEXT;

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
    /// The guest (or the host lowering a call's arguments into it) needed
    /// more memory than `max_memory` allows; like a trap otherwise.
    #[error("guest out of memory (max_memory): {0}")]
    OutOfMemory(String),
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

/// The dropped-lines count is logged at most this often per instance, so a
/// flooding guest costs one warning a second, not one per admitted line.
const DROPPED_REPORT_EVERY: Duration = Duration::from_secs(1);

/// A token bucket for guest log lines, with the count of lines it dropped
/// and when that count was last reported. Pure: the clock is passed in.
struct LogBudget {
    rate: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
    dropped: u64,
    reported: Option<Instant>,
}

impl LogBudget {
    fn new(rate: u32, now: Instant) -> Self {
        let rate = f64::from(rate);
        Self {
            rate,
            burst: rate * 2.0,
            tokens: rate * 2.0,
            refilled: now,
            dropped: 0,
            reported: None,
        }
    }

    /// True when a line may be written at `now`.
    fn take(&mut self, now: Instant) -> bool {
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

    /// The lines dropped since the last report, when there are any and a
    /// report is due at `now` (the first at once, then at most one per
    /// [`DROPPED_REPORT_EVERY`]); `force` (the instance goes) ignores the
    /// interval. Resets the count it returns.
    fn due_report(&mut self, now: Instant, force: bool) -> Option<u64> {
        let due = force
            || self
                .reported
                .is_none_or(|at| now.duration_since(at) >= DROPPED_REPORT_EVERY);
        if self.dropped == 0 || !due {
            return None;
        }
        self.reported = Some(now);
        Some(std::mem::take(&mut self.dropped))
    }
}

#[cfg(test)]
mod log_budget_tests {
    use super::*;

    /// A guest logging `lines` lines evenly over `over`, at `rate` a
    /// second: the lines written, and the dropped counts reported, as the
    /// host does (a report looked for at every admitted line, then a forced
    /// one when the instance goes).
    fn flood(rate: u32, lines: u32, over: Duration) -> (u64, Vec<u64>) {
        let t0 = Instant::now();
        let mut budget = LogBudget::new(rate, t0);
        let (mut written, mut reports) = (0, Vec::new());
        for i in 0..lines {
            let now = t0 + over.mul_f64(f64::from(i) / f64::from(lines));
            if budget.take(now) {
                written += 1;
                reports.extend(budget.due_report(now, false));
            }
        }
        reports.extend(budget.due_report(t0 + over, true));
        (written, reports)
    }

    #[test]
    fn a_flood_is_summarized_once_a_second_not_once_a_line() {
        let (written, reports) = flood(50, 10_000, Duration::from_secs(4));
        // A burst of 100, then 50 a second.
        assert!((100..=301).contains(&written), "{written}");
        // The first report at once, then at most one a second, and the last
        // when the instance goes.
        assert!(reports.len() <= 4 + 2, "{} reports", reports.len());
        assert_eq!(written + reports.iter().sum::<u64>(), 10_000);
    }

    #[test]
    fn nothing_is_reported_when_nothing_was_dropped() {
        let (written, reports) = flood(1_000, 100, Duration::from_secs(1));
        assert_eq!(written, 100);
        assert!(reports.is_empty());
    }
}

/// The store's resource limits, noting when a memory growth was refused,
/// so a call that failed for memory is told apart by type, not by its
/// message.
struct Limits {
    inner: StoreLimits,
    refused_growth: bool,
}

impl Limits {
    /// True when a growth was refused since the last look.
    fn take_refused(&mut self) -> bool {
        std::mem::take(&mut self.refused_growth)
    }
}

impl wasmtime::ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.inner.memory_growing(current, desired, maximum);
        if !matches!(allowed, Ok(true)) {
            self.refused_growth = true;
        }
        allowed
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.refused_growth = true;
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// Per-store host state: WASI (granting only what config grants) and the
/// log context.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: Limits,
    subscription: SubscriptionName,
    lane: LaneId,
    digest: PluginDigest,
    call: CallContext,
    log_budget: LogBudget,
}

impl HostState {
    /// Logs how many guest lines the rate limit dropped, when a report is
    /// due ([`LogBudget::due_report`]).
    fn report_dropped(&mut self, force: bool) {
        if let Some(dropped) = self.log_budget.due_report(Instant::now(), force) {
            tracing::warn!(
                subscription = self.subscription.as_str(),
                plugin = self.digest.short(),
                lane = self.lane.0,
                dropped,
                "guest log lines dropped by the rate limit"
            );
        }
    }
}

impl Drop for HostState {
    fn drop(&mut self) {
        self.report_dropped(true);
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
        if !self.log_budget.take(Instant::now()) {
            return;
        }
        self.report_dropped(false);
        crate::logging::cap(&mut message, MAX_LOG_MESSAGE);
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

/// The largest compile cache entry read. Compiled code is a few times the
/// size of the component ([`MAX_PLUGIN_BYTES`](crate::files::MAX_PLUGIN_BYTES)
/// at most); a larger entry is not one this host wrote, and is compiled
/// afresh.
const MAX_CACHE_ENTRY_BYTES: u64 = 4 * crate::files::MAX_PLUGIN_BYTES;

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
/// Loading an entry skips compilation and trusts the file's machine code,
/// so only the host's own user may write the cache: see "Compile cache" in
/// the [module docs](self) for what is checked, and when.
#[derive(Debug)]
pub struct CompileCache {
    dir: PathBuf,
    /// The effective uid the host runs as: the only owner trusted.
    euid: u32,
}

/// Why a compile cache folder is refused. Each message is one line naming
/// the folder and the reason.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The folder cannot be created or inspected.
    #[error("compile cache {dir}: cannot create the folder: {reason}")]
    Create {
        /// The folder.
        dir: PathBuf,
        /// Why.
        reason: std::io::Error,
    },
    /// The path exists but is not a folder.
    #[error("compile cache {dir}: not a folder")]
    NotAFolder {
        /// The path.
        dir: PathBuf,
    },
    /// Another user owns it, and could plant code the host would run.
    #[error(
        "compile cache {dir}: owned by uid {owner}, not by the uid the host runs as ({euid}); refused, as its owner could make the host run any code"
    )]
    NotOwned {
        /// The folder.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
        /// The host's effective uid.
        euid: u32,
    },
    /// Group or others may write it, and could plant code the host would
    /// run.
    #[error(
        "compile cache {dir}: writable by group or others (mode {mode:03o}); refused, as any of them could make the host run any code (chmod go-w it)"
    )]
    Writable {
        /// The folder.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Why one cache entry was not loaded (it is compiled afresh and replaced).
#[derive(Debug, thiserror::Error)]
enum EntryError {
    #[error("cannot open it: {0}")]
    Open(crate::files::ReadError),
    #[error("owned by uid {owner}, not by the uid the host runs as ({euid})")]
    NotOwned { owner: u32, euid: u32 },
    #[error("writable by group or others (mode {mode:03o})")]
    Writable { mode: u32 },
    #[error("has {nlink} hard links; the host writes entries with one")]
    Linked { nlink: u64 },
    #[error("cannot read it: {0}")]
    Read(crate::files::ReadError),
    #[error("not a usable compiled component: {0}")]
    Deserialize(String),
}

impl CompileCache {
    /// A cache in `dir`, created with mode 0700 when missing (and any
    /// missing parents with it).
    ///
    /// # Errors
    /// [`CacheError`] naming the folder: it cannot be created, is not a
    /// folder, is owned by another uid than the host's effective uid, or is
    /// writable by group or others.
    pub fn new(dir: PathBuf) -> Result<Self, CacheError> {
        use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
        let create_error = |reason| CacheError::Create {
            dir: dir.clone(),
            reason,
        };
        if let Err(reason) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
        {
            return Err(match std::fs::metadata(&dir) {
                Ok(meta) if !meta.is_dir() => CacheError::NotAFolder { dir },
                _ => create_error(reason),
            });
        }
        // Follows a symlink: the folder it names is what must be ours.
        let meta = std::fs::metadata(&dir).map_err(create_error)?;
        let euid = crate::files::euid();
        if !meta.is_dir() {
            return Err(CacheError::NotAFolder { dir });
        }
        if meta.uid() != euid {
            return Err(CacheError::NotOwned {
                dir,
                owner: meta.uid(),
                euid,
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(CacheError::Writable {
                dir,
                mode: meta.mode() & 0o7777,
            });
        }
        Ok(Self { dir, euid })
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

    /// The component in `entry`: `None` when there is none, an error when
    /// there is one this host must not trust or cannot use.
    fn load(&self, engine: &Engine, entry: &Path) -> Result<Option<Component>, EntryError> {
        use crate::files::{self, ReadError};
        use std::os::unix::fs::MetadataExt as _;
        // No symlink followed; every check below is on the opened file.
        let (file, meta) = match files::open_no_follow(entry) {
            Ok(opened) => opened,
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(EntryError::Open(e)),
        };
        if meta.uid() != self.euid {
            return Err(EntryError::NotOwned {
                owner: meta.uid(),
                euid: self.euid,
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(EntryError::Writable {
                mode: meta.mode() & 0o7777,
            });
        }
        if meta.nlink() != 1 {
            return Err(EntryError::Linked {
                nlink: meta.nlink(),
            });
        }
        let bytes =
            files::read_to_limit(file, &meta, MAX_CACHE_ENTRY_BYTES).map_err(EntryError::Read)?;
        // SAFETY: `deserialize` runs the bytes as machine code unchecked.
        // They come from a regular file, reached without a symlink, owned by
        // this host's user, writable by no one else and linked nowhere else,
        // in a folder that passed the same owner and mode checks: only this
        // user (or root) can have written it, and this host writes entries
        // only from its own `Component::serialize`. Wasmtime checks the
        // header against this engine's settings and version.
        unsafe { Component::deserialize(engine, &bytes) }
            .map(Some)
            .map_err(|e| EntryError::Deserialize(one_line(&e)))
    }

    /// Writes `bytes` as `entry`: to a new file with an unpredictable name
    /// (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, so nothing planted under
    /// that name is written through), then renamed over `entry`, which
    /// replaces whatever was there (a refused entry, a symlink) rather than
    /// writing into it.
    fn store(&self, entry: &Path, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let name = entry.file_name().unwrap_or_default().to_string_lossy();
        let tmp = self
            .dir
            .join(format!(".{name}.{:032x}.tmp", rand::random::<u128>()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut file| {
                file.write_all(bytes)?;
                file.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, entry));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
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
        // A regular file of bounded size only: a path to a device or FIFO
        // must fail at once, not fill memory or block.
        let bytes =
            crate::files::read_regular(path, crate::files::MAX_PLUGIN_BYTES).map_err(|e| {
                PluginError::Read {
                    path: path.to_owned(),
                    reason: e.into(),
                }
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
        let cache = self
            .cache
            .as_ref()
            .map(|c| (c, c.entry(&self.engine, &digest)));
        if let Some((cache, entry)) = &cache {
            match cache.load(&self.engine, entry) {
                Ok(Some(component)) => {
                    tracing::info!(plugin = %path.display(), digest = digest.short(), elapsed_ms = started.elapsed().as_secs_f64() * 1e3, cache = "hit", "plugin loaded from the compile cache");
                    return Ok((component, digest));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(entry = %entry.display(), error = %e, "compile cache entry not used; compiling afresh");
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
        if let Some((cache, entry)) = &cache {
            let written = component
                .serialize()
                .map_err(|e| one_line(&e))
                .and_then(|bytes| cache.store(entry, &bytes).map_err(|e| e.to_string()));
            if let Err(e) = written {
                tracing::warn!(entry = %entry.display(), error = e, "cannot write the compile cache entry");
            }
        }
        tracing::info!(
            plugin = %path.display(), digest = digest.short(), elapsed_ms = compiled_in.as_secs_f64() * 1e3,
            cache = if cache.is_some() { "miss" } else { "off" }, "plugin compiled"
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
/// A wasmtime error as one line, cut to [`MAX_LOG_MESSAGE`]: a trap's
/// message carries the guest's backtrace, whose function names and depth
/// the guest chooses (82 KB lines were seen).
fn one_line(e: &wasmtime::Error) -> String {
    let mut line = format!("{e:#}").replace('\n', " ");
    crate::logging::cap(&mut line, MAX_LOG_MESSAGE);
    line
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
            limits: Limits {
                inner: StoreLimitsBuilder::new()
                    .memory_size(self.sandbox.max_memory)
                    .table_elements(100_000)
                    .instances(100)
                    .tables(100)
                    .memories(100)
                    .trap_on_grow_failure(true)
                    .build(),
                refused_growth: false,
            },
            log_budget: LogBudget::new(self.sandbox.log_rate, Instant::now()),
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

/// The error of a call that failed in the guest: out of memory when a
/// memory growth was refused during it, a trap otherwise.
fn failed(trap: &wasmtime::Error, out_of_memory: bool) -> CallError {
    if out_of_memory {
        CallError::OutOfMemory(one_line(trap))
    } else {
        CallError::Trap(one_line(trap))
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
        state.report_dropped(false);
        let out_of_memory = state.limits.take_refused();
        match result {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(trap)) => Err(failed(&trap, out_of_memory)),
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
        state.report_dropped(false);
        let out_of_memory = state.limits.take_refused();
        match result {
            Ok(Ok(outcomes)) if outcomes.len() == records.len() => Ok(outcomes),
            Ok(Ok(outcomes)) => Err(CallError::WrongOutcomeCount {
                got: outcomes.len(),
                want: records.len(),
            }),
            Ok(Err(trap)) => Err(failed(&trap, out_of_memory)),
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }
}

#[cfg(test)]
mod cache_tests {
    //! The compile cache's trust checks. Tests run as root, so "another
    //! user" is uid 65534 (nobody), set with `chown`.
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    const NOBODY: u32 = 65534;

    fn chown_to_nobody(path: &Path) {
        std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY))
            .expect("chown to uid 65534 (these tests run as root)");
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A real compiled component, as an entry holds.
    fn serialized(engine: &Engine) -> Vec<u8> {
        Component::new(engine, "(component)")
            .unwrap()
            .serialize()
            .unwrap()
    }

    #[test]
    fn creates_the_folder_0700() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("a/b");
        CompileCache::new(cache.clone()).unwrap();
        let mode = std::fs::metadata(&cache).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "{mode:o}");
        // An existing folder only its owner can write is fine.
        chmod(&cache, 0o755);
        CompileCache::new(cache).unwrap();
    }

    #[test]
    fn refuses_a_folder_of_another_uid() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        chmod(&cache, 0o700);
        chown_to_nobody(&cache);
        let e = CompileCache::new(cache.clone()).unwrap_err();
        assert!(
            matches!(e, CacheError::NotOwned { owner: NOBODY, .. }),
            "{e}"
        );
        let line = e.to_string();
        assert_eq!(line.lines().count(), 1);
        assert!(line.contains(&cache.display().to_string()), "{line}");
        assert!(line.contains("owned by uid 65534"), "{line}");
    }

    #[test]
    fn refuses_a_folder_others_can_write() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        for mode in [0o777, 0o770, 0o702] {
            chmod(&cache, mode);
            let e = CompileCache::new(cache.clone()).unwrap_err();
            assert!(
                matches!(e, CacheError::Writable { mode: m, .. } if m == mode),
                "{e}"
            );
            assert!(e.to_string().contains(&cache.display().to_string()));
        }
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            CompileCache::new(file),
            Err(CacheError::NotAFolder { .. })
        ));
    }

    #[test]
    fn loads_only_entries_of_its_own_uid_unlinked_and_unwritable_by_others() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path().join("cache")).unwrap();
        let digest = PluginDigest::of(b"victim");
        let entry = cache.entry(&engine, &digest);
        assert!(matches!(cache.load(&engine, &entry), Ok(None)));

        // Another uid plants a real compiled component under the victim's
        // entry name: not loaded.
        std::fs::write(&entry, serialized(&engine)).unwrap();
        chmod(&entry, 0o644);
        chown_to_nobody(&entry);
        let e = cache.load(&engine, &entry).unwrap_err();
        assert!(
            matches!(e, EntryError::NotOwned { owner: NOBODY, .. }),
            "{e}"
        );

        // Ours, but writable by others: not loaded.
        let me = crate::files::euid();
        std::os::unix::fs::lchown(&entry, Some(me), Some(me)).unwrap();
        chmod(&entry, 0o666);
        let e = cache.load(&engine, &entry).unwrap_err();
        assert!(matches!(e, EntryError::Writable { mode: 0o666 }), "{e}");

        // Ours and private: loaded (the control).
        chmod(&entry, 0o600);
        assert!(matches!(cache.load(&engine, &entry), Ok(Some(_))));

        // The same file linked under another name: not loaded under either.
        let other = cache.entry(&engine, &PluginDigest::of(b"other"));
        std::fs::hard_link(&entry, &other).unwrap();
        let e = cache.load(&engine, &other).unwrap_err();
        assert!(matches!(e, EntryError::Linked { nlink: 2 }), "{e}");
        std::fs::remove_file(&other).unwrap();

        // A symlink to a trusted-looking entry: not followed.
        std::os::unix::fs::symlink(&entry, &other).unwrap();
        let e = cache.load(&engine, &other).unwrap_err();
        assert!(
            matches!(e, EntryError::Open(crate::files::ReadError::Symlink)),
            "{e}"
        );

        // Garbage of our own: refused by wasmtime, recompiled.
        std::fs::write(&entry, b"not compiled code").unwrap();
        assert!(matches!(
            cache.load(&engine, &entry),
            Err(EntryError::Deserialize(_))
        ));
    }

    #[test]
    fn stores_without_writing_through_what_was_planted() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path().join("cache")).unwrap();
        let entry = cache.entry(&engine, &PluginDigest::of(b"victim"));
        // A symlink planted under the entry's name, to a file of ours.
        let target = dir.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        std::os::unix::fs::symlink(&target, &entry).unwrap();
        cache.store(&entry, &serialized(&engine)).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        let meta = std::fs::symlink_metadata(&entry).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(matches!(cache.load(&engine, &entry), Ok(Some(_))));
        // Only the entry: the temporary file was renamed, not left behind.
        assert_eq!(std::fs::read_dir(&cache.dir).unwrap().count(), 1);
    }
}
