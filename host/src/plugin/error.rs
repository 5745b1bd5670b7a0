//! Why a plugin cannot be used: one error per reason, each one line naming
//! the file.

use std::path::PathBuf;

use super::{Contract, MAX_LOG_MESSAGE, World};

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
        "plugin {path}: exports neither `handle` (world record-handler) nor `handle-batch` (world batch-handler) of shardlane:plugin"
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
        "plugin {path}: export `{export}` does not match world {world} of {contract}: {reason}"
    )]
    BadExport {
        /// The file.
        path: PathBuf,
        /// The export.
        export: &'static str,
        /// The world it was checked against.
        world: World,
        /// The contract version it was checked against.
        contract: Contract,
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

/// A wasmtime error as one line, cut to [`MAX_LOG_MESSAGE`]: a trap's
/// message carries the guest's backtrace, whose function names and depth
/// the guest chooses (82 KB lines were seen).
pub(super) fn one_line(e: &wasmtime::Error) -> String {
    let mut line = format!("{e:#}").replace('\n', " ");
    crate::logging::cap(&mut line, MAX_LOG_MESSAGE);
    line
}
