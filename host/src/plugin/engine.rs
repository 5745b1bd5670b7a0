//! The engine and linker every plugin of a process shares, and loading:
//! compile (or take from the compile cache), tell the world from the
//! exports, link and pre-instantiate.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, Linker, types::ComponentItem};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::{v1, v2, v3};
use super::cache::CompileCache;
use super::epoch::Ticker;
use super::error::one_line;
use super::host::{HostState, HttpMetrics};
use super::instance::{Plugin, PluginPre};
use super::{Contract, EPOCH_TICK, PluginError, PluginInfo, World};
use crate::config::{SandboxConfig, defaults};
use crate::ids::{PluginDigest, SubscriptionName};
use crate::telemetry::Telemetry;

/// The engine and linker every plugin of this process shares.
#[derive(Clone)]
pub struct PluginHost {
    engine: Engine,
    /// Advances `engine`'s epoch while guest code runs.
    ticker: Ticker,
    linker: Arc<Linker<HostState>>,
    fuel: bool,
    /// The pool's `max_core_instances_per_component`, for error messages.
    max_core_instances: u32,
    cache: Option<Arc<CompileCache>>,
    /// Where plugins register their metrics (none for `check`/`validate`).
    telemetry: Option<Arc<Telemetry>>,
}

impl PluginHost {
    /// Builds the engine (pooling allocator, epoch interruption, a ticker
    /// thread that ends within a second of the engine) and the linker
    /// (WASI + log).
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
            // No plugin API uses the component model's async (WASI 0.3,
            // `run_concurrent`): without it a call runs on its fiber
            // directly, not through the concurrent task machinery, which
            // cost about a third of each `handle` call (BENCHMARKS.md).
            .concurrency_support(false)
            .epoch_interruption(true)
            .consume_fuel(fuel)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;
        let weak = engine.weak();
        // The thread holds only a weak reference: it ends within a second of
        // the engine (`epoch`).
        let ticker = Ticker::spawn(EPOCH_TICK, move || {
            weak.upgrade().map(|e| e.increment_epoch()).is_some()
        })
        .map_err(|e| anyhow::anyhow!("cannot start the epoch ticker thread: {e}"))?;

        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        v1::log::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        v2::log::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        v2::outputs::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        v2::state::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        v2::config::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        v3::log::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        v3::outputs::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        v3::state::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        Ok(Self {
            engine,
            ticker,
            linker: Arc::new(linker),
            fuel,
            max_core_instances,
            cache: None,
            telemetry: None,
        })
    }

    /// Plugins loaded from now on count their HTTP requests in `telemetry`.
    pub(crate) fn with_telemetry(mut self, telemetry: Arc<Telemetry>) -> Self {
        self.telemetry = Some(telemetry);
        self
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
        // Two steps, so a failure is told by the step that failed, not by
        // wasmtime's wording: compiling checks the code, loading the
        // compiled artifact checks it against the instance pool's limits.
        let artifact =
            self.engine
                .precompile_component(bytes)
                .map_err(|e| PluginError::Compile {
                    path: path.to_owned(),
                    reason: one_line(&e),
                })?;
        // SAFETY: the artifact was compiled by this engine a moment ago and
        // never left this process's memory.
        let component =
            unsafe { Component::deserialize(&self.engine, &artifact) }.map_err(|e| {
                PluginError::PoolLimit {
                    path: path.to_owned(),
                    reason: one_line(&e),
                    max_core_instances: self.max_core_instances,
                }
            })?;
        let compiled_in = started.elapsed();
        if let Some((cache, entry)) = &cache
            && let Err(e) = cache.store(entry, &artifact)
        {
            tracing::warn!(entry = %entry.display(), error = %e, "cannot write the compile cache entry");
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
                record |= name == "handle" || name == "handle-run";
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
        let (contract, _) = self.pre(path, &component, world)?;
        let ty = component.component_type();
        Ok(PluginInfo {
            world,
            contract,
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

    /// Links `component` and looks its export up: pre-instantiated, in
    /// the contract version its imports name.
    fn pre(
        &self,
        path: &Path,
        component: &Component,
        world: World,
    ) -> Result<(Contract, PluginPre), PluginError> {
        // Told from the component's import names, which say which package
        // each comes from, against the packages this host links: wasmtime
        // reports a failed link only as text.
        let ty = component.component_type();
        let imports: Vec<String> = ty
            .imports(&self.engine)
            .map(|(n, _)| n.to_owned())
            .collect();
        if let Some(import) = imports.iter().find(|name| !links(name)) {
            return Err(PluginError::MissingImport {
                path: path.to_owned(),
                import: import.clone(),
            });
        }
        let exports: Vec<String> = ty
            .exports(&self.engine)
            .map(|(n, _)| n.to_owned())
            .collect();
        let contract = contract_of(&imports, &exports);
        let pre = self
            .linker
            .instantiate_pre(component)
            .map_err(|e| PluginError::Link {
                path: path.to_owned(),
                reason: one_line(&e),
            })?;
        let bad_export = |export, e: wasmtime::Error| PluginError::BadExport {
            path: path.to_owned(),
            export,
            world,
            contract,
            reason: one_line(&e),
        };
        let pre = match (contract, world) {
            (Contract::V0_1, World::RecordHandler) => PluginPre::V1Record(
                v1::record::RecordHandlerPre::new(pre).map_err(|e| bad_export("handle", e))?,
            ),
            (Contract::V0_1, World::BatchHandler) => {
                let (found, pre) =
                    v1_or_v3_batch(pre).map_err(|e| bad_export("handle-batch", e))?;
                return Ok((found, pre));
            }
            (Contract::V0_2, World::RecordHandler) => PluginPre::V2Record(
                v2::record::RecordHandlerPre::new(pre).map_err(|e| bad_export("handle", e))?,
            ),
            (Contract::V0_2, World::BatchHandler) => PluginPre::V2Batch(
                v2::batch::BatchHandlerPre::new(pre).map_err(|e| bad_export("handle-batch", e))?,
            ),
            (Contract::V0_3, world) => v3_pre(pre, world, windowed(&exports))
                .map_err(|(export, e)| bad_export(export, e))?,
        };
        Ok((contract, pre))
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

    /// [`PluginHost::load`] of version `digest` from the compile cache
    /// alone, under the cache's trust rules (see "Compile cache: threat
    /// model" in [`super`]): `None` when the cache holds no entry of it
    /// this host may use (no cache, no entry, or one refused: a warning
    /// names it). `path` names it in messages.
    ///
    /// # Errors
    /// As [`PluginHost::load`], for an entry that loads but does not link.
    pub(crate) fn load_cached(
        &self,
        path: &Path,
        digest: &PluginDigest,
        subscription: SubscriptionName,
        handler_timeout: Duration,
        sandbox: SandboxConfig,
    ) -> Result<Option<Plugin>, PluginError> {
        let Some(cache) = &self.cache else {
            return Ok(None);
        };
        let entry = cache.entry(&self.engine, digest);
        let component = match cache.load(&self.engine, &entry) {
            Ok(Some(component)) => component,
            Ok(None) => return Ok(None),
            Err(e) => {
                tracing::warn!(entry = %entry.display(), error = %e, "compile cache entry not used");
                return Ok(None);
            }
        };
        tracing::info!(plugin = %path.display(), digest = digest.short(), cache = "hit", "version loaded from the compile cache by its digest");
        self.finish_load(
            path,
            component,
            digest.clone(),
            subscription,
            handler_timeout,
            sandbox,
        )
        .map(Some)
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
        let (contract, pre) = self.pre(path, &component, world)?;
        let http_metrics = self
            .telemetry
            .as_ref()
            .map(|t| HttpMetrics::new(t, subscription.as_str()))
            .unwrap_or_default();
        Ok(Plugin::new(
            path.to_owned(),
            digest,
            world,
            contract,
            pre,
            http_metrics,
            self.engine.clone(),
            self.ticker.clone(),
            subscription,
            handler_timeout,
            sandbox,
            self.fuel,
        ))
    }
}

/// The WIT packages this host links, each with its semver-compatible
/// version family (what wasmtime's linker matches: `0.2` takes 0.2.0 …
/// 0.2.x): WASI 0.2 (linked, but granting nothing: see [`super::host`]) and
/// the plugin contract.
const LINKED_PACKAGES: &[(&str, &str)] = &[
    ("wasi:io", "0.2"),
    ("wasi:clocks", "0.2"),
    ("wasi:random", "0.2"),
    ("wasi:cli", "0.2"),
    ("wasi:filesystem", "0.2"),
    ("wasi:sockets", "0.2"),
    ("shardlane:plugin", "0.1"),
    ("shardlane:plugin", "0.2"),
    ("shardlane:plugin", "0.3"),
    ("wasi:http", "0.2"),
];

/// `wasi:config`, linked in this pre-release version only (pre-releases
/// match exactly, as wasmtime's linker matches them).
const WASI_CONFIG: &str = "wasi:config/store@0.2.0-rc.1";

/// The contract version a component targets: 0.3.0 when it exports what
/// only 0.3.0 has (`handle-run`, `close-window`) or imports a
/// `shardlane:plugin` interface of 0.3; 0.2.0 when it imports one of 0.2;
/// else 0.1.0 (a 0.1.0 plugin imports `types` and `log` of 0.1.0, or
/// nothing of ours). A 0.3.0 `batch-handler` that imports nothing of ours
/// looks like a 0.1.0 one: its export's types tell them apart
/// ([`v1_or_v3_batch`]).
fn contract_of(imports: &[String], exports: &[String]) -> Contract {
    let imports_of = |version: &str| {
        imports
            .iter()
            .any(|name| name.starts_with("shardlane:plugin/") && name.contains(version))
    };
    if exports
        .iter()
        .any(|name| name == "handle-run" || name == "close-window")
        || imports_of("@0.3.")
    {
        Contract::V0_3
    } else if imports_of("@0.2.") {
        Contract::V0_2
    } else {
        Contract::V0_1
    }
}

/// A `batch-handler` that imports nothing of `shardlane:plugin`: 0.1.0
/// when its `handle-batch` takes 0.1.0's records, else 0.3.0 (0.2.0's
/// records are 0.1.0's with one field more, and every 0.2.0 batch
/// handler imports its `types`). The error is 0.1.0's.
fn v1_or_v3_batch(
    pre: wasmtime::component::InstancePre<HostState>,
) -> Result<(Contract, PluginPre), wasmtime::Error> {
    match v1::batch::BatchHandlerPre::new(pre.clone()) {
        Ok(v1) => Ok((Contract::V0_1, PluginPre::V1Batch(v1))),
        Err(e) => match v3::batch::BatchHandlerPre::new(pre) {
            Ok(v3) => Ok((Contract::V0_3, PluginPre::V3Batch(v3))),
            Err(_) => Err(e),
        },
    }
}

/// Whether a 0.3.0 component implements a windowed world.
fn windowed(exports: &[String]) -> bool {
    exports.iter().any(|name| name == "close-window")
}

/// A 0.3.0 component's pre-instance, in its world; on failure, the export
/// that did not match the contract.
fn v3_pre(
    pre: wasmtime::component::InstancePre<HostState>,
    world: World,
    windowed: bool,
) -> Result<PluginPre, (&'static str, wasmtime::Error)> {
    Ok(match (world, windowed) {
        (World::RecordHandler, false) => PluginPre::V3Record(
            v3::record::RecordHandlerPre::new(pre).map_err(|e| ("handle-run", e))?,
        ),
        (World::BatchHandler, false) => PluginPre::V3Batch(
            v3::batch::BatchHandlerPre::new(pre).map_err(|e| ("handle-batch", e))?,
        ),
        (World::RecordHandler, true) => PluginPre::V3WindowedRecord(
            v3::windowed_record::WindowedRecordHandlerPre::new(pre)
                .map_err(|e| ("handle-run or close-window", e))?,
        ),
        (World::BatchHandler, true) => PluginPre::V3WindowedBatch(
            v3::windowed_batch::WindowedBatchHandlerPre::new(pre)
                .map_err(|e| ("handle-batch or close-window", e))?,
        ),
    })
}

/// Whether an import named `name` (`namespace:package/interface@version`)
/// belongs to a package this host links, in a compatible version.
fn links(name: &str) -> bool {
    if name == WASI_CONFIG {
        return true;
    }
    let Some((package, rest)) = name.split_once('/') else {
        return false;
    };
    let Some((_, version)) = rest.split_once('@') else {
        return false;
    };
    LINKED_PACKAGES.iter().any(|(p, family)| {
        *p == package
            && version
                .strip_prefix(family)
                .is_some_and(|patch| patch.starts_with('.') && !patch.contains('-'))
    })
}

#[cfg(test)]
mod tests {
    use super::{Contract, contract_of, links};

    #[test]
    fn links_what_the_host_provides_in_compatible_versions_only() {
        assert!(links("wasi:cli/environment@0.2.0"));
        assert!(links("wasi:io/streams@0.2.6"));
        assert!(links("shardlane:plugin/log@0.1.0"));
        assert!(links("shardlane:plugin/outputs@0.2.0"));
        assert!(links("wasi:http/outgoing-handler@0.2.0"));
        assert!(links("wasi:config/store@0.2.0-rc.1"));
        assert!(
            !links("wasi:config/store@0.2.0-rc.2"),
            "pre-releases match exactly"
        );
        assert!(links("shardlane:plugin/runs@0.3.0"));
        assert!(!links("shardlane:plugin/log@0.4.0"), "another minor of 0.x");
        assert!(!links("wasi:cli/environment@0.3.0"));
        assert!(
            !links("wasi:io/streams@0.2.0-rc-2023-11-10"),
            "pre-releases"
        );
        assert!(!links("wasi:keyvalue/store@0.2.0"), "a package not linked");
        assert!(!links("test:importer/extra"), "no version");
        assert!(!links("extra"), "not an interface");
    }

    /// Catches: a 0.3.0 plugin that imports nothing of ours taken for a
    /// 0.1.0 one (its `handle-run` would not be found), or a 0.2.0 one
    /// taken for another version.
    #[test]
    fn the_contract_is_told_from_imports_and_0_3_0_exports() {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let v1 = names(&["shardlane:plugin/log@0.1.0"]);
        let v2 = names(&["shardlane:plugin/log@0.2.0", "wasi:io/poll@0.2.12"]);
        let v3 = names(&["shardlane:plugin/runs@0.3.0"]);
        assert_eq!(contract_of(&v1, &names(&["handle"])), Contract::V0_1);
        assert_eq!(contract_of(&[], &names(&["handle-batch"])), Contract::V0_1);
        assert_eq!(contract_of(&v2, &names(&["handle"])), Contract::V0_2);
        assert_eq!(contract_of(&v3, &names(&["handle-batch"])), Contract::V0_3);
        assert_eq!(contract_of(&[], &names(&["handle-run"])), Contract::V0_3);
        assert_eq!(
            contract_of(&[], &names(&["handle-batch", "close-window"])),
            Contract::V0_3
        );
    }
}
