//! Hot-swap and canary: a subscription's plugin slot, which lanes
//! instantiate from and which new plugin versions replace while the service
//! runs.
//!
//! # Swap
//! A new version arrives from the plugin file changing (watched with
//! `notify`: editors' in-place writes and `mv`-style atomic replacement
//! both show up as events on the file's folder; events are debounced, and
//! only content changes count, not a process reading the file) or
//! from the admin API. It is compiled and validated off the hot path (a
//! blocking task): it must be a component of the same world as the running
//! version, with every import provided. If that fails, the running version
//! stays and the error is logged with the file and the reason. The file is
//! read only when it is a regular file of at most
//! [`MAX_PLUGIN_BYTES`](crate::files::MAX_PLUGIN_BYTES), without blocking
//! on the open (see [`files`]): a FIFO, a device or an
//! oversized file swapped in is refused the same way, the watcher keeps
//! watching, and shutdown never waits for a read.
//!
//! When valid, the slot's generation moves on. Every lane checks the
//! generation at its next record or batch boundary: calls in flight finish
//! on the old version, later records go to the new one, and the old
//! instance is dropped. Settlement never sees a swap, so no record is lost
//! or handled twice because of one.
//!
//! # Canary
//! A canary runs a candidate version beside the stable one: keys in a
//! stable slice ([`KeySlice`], from `canary.key_fraction` or the admin API)
//! go to the candidate, all others to the stable version. The choice is per
//! partition key, so a key stays on one version and, with `by_key`, keeps
//! its order. Each lane's handler ([`SlotInstance`]) holds one instance of
//! each version and picks per record; a batch is split into the stable and
//! the candidate part, each called in order, and the outcomes merged back
//! into the batch's order. `promote` makes the candidate the stable version,
//! `rollback` drops it; both, like starting a canary, move the generation on,
//! so lanes switch at their next boundary exactly as in a swap. While a
//! canary runs, `shardlane_canary_records_total` counts outcomes per
//! version, so the two can be compared before deciding.
//!
//! # Shadow
//! A shadow runs a candidate beside the live versions without effects: a
//! lane's handler offers each call, after the live version made it, to the
//! shadow's own task and instance, which makes it again and compares
//! outcomes, outputs and state writes (see [`shadow`]). A shadow that falls
//! behind drops calls (counted); it never slows a lane or holds the
//! checkpoint.
//!
//! The slot only installs what it is given ([`PluginSlot::set`]) and
//! compiles what it is asked to ([`PluginSlot::prepare`]): which versions
//! run is the fleet's decision, kept in the lease store, and
//! `crate::rollout` makes the slot follow it (so swaps, canaries,
//! promotions and rollbacks survive restarts and reach every instance).
//! The file watcher here only reports the plugin file's new bytes.
//!
//! Floor 9 (the plugin slot) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod canary;
pub(crate) mod shadow;

use crate::key_slice::KeySlice;
use canary::Canary;
pub(crate) use canary::SlotInstance;

use crate::config::SandboxConfig;
use crate::dispatch::HandlerFactory;
use crate::files;
use crate::ids::{LaneId, PluginDigest, SubscriptionName};
use crate::plugin::{Plugin, PluginError, PluginHost};
use crate::telemetry::{SubscriptionStatus, Telemetry};

/// Quiet time after the last file event before the file is read: editors
/// and copies write in several steps.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// The versions the fleet says to run, got and compiled: what
/// [`PluginSlot::set`] installs.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Installed {
    /// The stable version.
    pub stable: Arc<Plugin>,
    /// A canary: its candidate, slice and identity.
    pub canary: Option<(Arc<Plugin>, KeySlice, u64)>,
    /// A shadow candidate and its identity.
    pub shadow: Option<(Arc<Plugin>, u64)>,
}

/// What lanes instantiate from.
#[derive(Clone)]
struct Versions {
    stable: Arc<Plugin>,
    canary: Option<Canary>,
    shadow: Option<shadow::Shadow>,
}

/// The current plugin versions of a subscription (see the module docs).
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct PluginSlot {
    host: PluginHost,
    path: PathBuf,
    subscription: SubscriptionName,
    handler_timeout: Duration,
    sandbox: SandboxConfig,
    versions: RwLock<Versions>,
    generation: AtomicU64,
    /// Serializes changes; held while one compiles, never on the hot path.
    swapping: tokio::sync::Mutex<()>,
    /// The `shardlane_plugin_info` series published, to forget on change.
    published: Mutex<Vec<(String, &'static str)>>,
    status: Arc<SubscriptionStatus>,
    telemetry: Arc<Telemetry>,
}

impl PluginSlot {
    /// A slot holding `plugin`, loaded from `path`.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn new(
        host: PluginHost,
        plugin: Plugin,
        handler_timeout: Duration,
        sandbox: SandboxConfig,
        status: Arc<SubscriptionStatus>,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        let slot = Self {
            host,
            path: plugin.path().to_owned(),
            subscription: plugin.subscription().clone(),
            handler_timeout,
            sandbox,
            versions: RwLock::new(Versions {
                stable: Arc::new(plugin),
                canary: None,
                shadow: None,
            }),
            generation: AtomicU64::new(0),
            swapping: tokio::sync::Mutex::new(()),
            published: Mutex::new(Vec::new()),
            status,
            telemetry,
        };
        slot.publish();
        slot
    }

    fn versions(&self) -> Versions {
        self.versions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the versions and moves the generation on: lanes switch at
    /// their next boundary.
    fn install(&self, versions: Versions) {
        *self.versions.write().unwrap_or_else(|e| e.into_inner()) = versions;
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.publish();
    }

    /// The stable version.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn current(&self) -> Arc<Plugin> {
        self.versions().stable
    }

    /// Publishes the running versions to `/metrics` and the status page.
    fn publish(&self) {
        let versions = self.versions();
        let sub = self.subscription.as_str();
        let mut now = vec![(versions.stable.digest().to_string(), "stable")];
        if let Some(c) = &versions.canary {
            now.push((c.plugin.digest().to_string(), "candidate"));
        }
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        for (digest, role) in published.iter() {
            self.telemetry.forget_series(
                "shardlane_plugin_info",
                &[("subscription", sub), ("digest", digest), ("role", role)],
            );
        }
        for (digest, role) in &now {
            self.telemetry
                .gauge(
                    "shardlane_plugin_info",
                    "The plugin versions each subscription runs (value 1); role candidate while a canary runs.",
                    &[("subscription", sub), ("digest", digest), ("role", role)],
                )
                .set(1);
        }
        *published = now;
        self.status.set_versions(
            versions.stable.digest().to_string(),
            versions.canary.as_ref().map(Canary::view),
        );
    }

    /// Compiles and validates `bytes` off the hot path: a component of the
    /// stable version's world, every import provided.
    async fn compile(&self, bytes: Vec<u8>, origin: &str) -> Result<Plugin, PluginError> {
        self.compile_with(bytes, origin, self.sandbox.clone()).await
    }

    async fn compile_with(
        &self,
        bytes: Vec<u8>,
        origin: &str,
        sandbox: SandboxConfig,
    ) -> Result<Plugin, PluginError> {
        let stable = self.current();
        let host = self.host.clone();
        let (path, sub, timeout) = (
            self.path.clone(),
            self.subscription.clone(),
            self.handler_timeout,
        );
        let loaded = tokio::task::spawn_blocking(move || {
            host.load_bytes(&path, &bytes, sub, timeout, sandbox)
        })
        .await
        .map_err(|e| PluginError::Compile {
            path: self.path.clone(),
            reason: format!("compilation task failed: {e}"),
        })?;
        let new = match loaded {
            Ok(new) if new.world_name() != stable.world_name() => Err(PluginError::Link {
                path: self.path.clone(),
                reason: format!(
                    "the new version implements {}, the running one {}: a swap cannot change the world (close-window comes with the subscription's window)",
                    new.world_name(),
                    stable.world_name()
                ),
            }),
            other => other,
        };
        if let Err(e) = &new {
            tracing::error!(subscription = %self.subscription, origin, error = %e, running = stable.digest().short(), "new plugin version refused; the running version stays");
        }
        new
    }

    /// Compiles and validates `bytes` as a version of this slot (the
    /// stable version's world, every import provided), installing
    /// nothing: the fleet's versions are recorded only once this passes.
    ///
    /// # Errors
    /// A [`PluginError`] naming the reason.
    pub(crate) async fn prepare(
        &self,
        bytes: Vec<u8>,
        origin: &str,
    ) -> Result<Arc<Plugin>, PluginError> {
        self.compile(bytes, origin).await.map(Arc::new)
    }

    /// Compiles and validates `bytes` as a shadow candidate: as
    /// [`Self::prepare`], with outbound HTTP limited to GET, HEAD and
    /// OPTIONS (see "Shadow").
    ///
    /// # Errors
    /// A [`PluginError`] naming the reason.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) async fn prepare_shadow(
        &self,
        bytes: Vec<u8>,
        origin: &str,
    ) -> Result<Arc<Plugin>, PluginError> {
        let mut sandbox = self.sandbox.clone();
        if let Some(http) = &mut Arc::make_mut(&mut sandbox.grants).http {
            http.safe_methods_only = true;
        }
        self.compile_with(bytes, origin, sandbox)
            .await
            .map(Arc::new)
    }

    /// Version `digest` from the compile cache alone (see
    /// `PluginHost::load_cached`), checked as [`Self::prepare`] checks new
    /// bytes; `shadow`: compiled as a shadow candidate. `None` when the
    /// cache has no usable entry of it, or the entry fails a check
    /// (logged).
    pub(crate) async fn cached(&self, digest: &PluginDigest, shadow: bool) -> Option<Arc<Plugin>> {
        let mut sandbox = self.sandbox.clone();
        if shadow && let Some(http) = &mut Arc::make_mut(&mut sandbox.grants).http {
            http.safe_methods_only = true;
        }
        let stable = self.current();
        let host = self.host.clone();
        let (path, sub, timeout, wanted) = (
            self.path.clone(),
            self.subscription.clone(),
            self.handler_timeout,
            digest.clone(),
        );
        let loaded = tokio::task::spawn_blocking(move || {
            host.load_cached(&path, &wanted, sub, timeout, sandbox)
        })
        .await;
        match loaded {
            Ok(Ok(Some(plugin))) if plugin.world_name() == stable.world_name() => {
                Some(Arc::new(plugin))
            }
            Ok(Ok(None)) => None,
            Ok(Ok(Some(plugin))) => {
                tracing::warn!(subscription = %self.subscription, digest = %digest, world = %plugin.world_name(), running = %stable.world_name(), "the compile cache's entry implements another world; not used");
                None
            }
            Ok(Err(e)) => {
                tracing::warn!(subscription = %self.subscription, digest = %digest, error = %e, "the compile cache's entry cannot be used");
                None
            }
            Err(e) => {
                tracing::warn!(subscription = %self.subscription, digest = %digest, error = %e, "loading from the compile cache failed");
                None
            }
        }
    }

    /// The running shadow's candidate and counters, if one runs.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn shadow(&self) -> Option<(PluginDigest, [u64; 5])> {
        self.versions()
            .shadow
            .map(|s| (s.digest().clone(), s.counters.totals()))
    }

    /// What this instance counted of the running canary, if one runs.
    pub(crate) fn canary_counts(&self) -> Option<crate::fleet_versions::CanaryCounts> {
        self.versions().canary.as_ref().map(Canary::counts)
    }

    /// Installs `installed` (as the fleet's versions say), moving the
    /// generation on only when something changed: lanes switch at their
    /// next boundary, as in a hot swap. A canary (or shadow) of the same
    /// identity keeps its counters; one of another identity starts afresh
    /// even with the same bytes (a canary deployed again). `since` is when
    /// the change began here (its fetch and compile included), for the log
    /// line.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) async fn set(&self, installed: Installed, origin: &str, since: Instant) {
        let _one_at_a_time = self.swapping.lock().await;
        let Installed {
            stable,
            canary,
            shadow,
        } = installed;
        let now = self.versions();
        let same_stable = now.stable.digest() == stable.digest();
        let same_shadow = now.shadow.as_ref().map(|s| (s.digest(), s.id))
            == shadow.as_ref().map(|(p, id)| (p.digest(), *id));
        let kept = match (&now.canary, &canary) {
            (Some(c), Some((p, slice, id)))
                if c.plugin.digest() == p.digest() && c.slice == *slice && c.id == *id =>
            {
                Some(Some(c.clone()))
            }
            (None, None) => Some(None),
            _ => None,
        };
        if same_stable && kept.is_some() && same_shadow {
            return;
        }
        let shadow = if same_shadow {
            now.shadow.clone()
        } else {
            self.start_shadow(shadow, origin)
        };
        let canary = match kept {
            Some(kept) => kept,
            None => canary.map(|(plugin, slice, id)| {
                Canary::new(
                    plugin,
                    slice,
                    id,
                    &self.telemetry,
                    self.subscription.as_str(),
                )
            }),
        };
        let old_candidate = now.canary.as_ref().map(|c| c.plugin.digest().clone());
        let new_candidate = canary
            .as_ref()
            .map(|c| (c.plugin.digest().clone(), c.slice));
        let old = now.stable.digest().clone();
        self.install(Versions {
            stable,
            canary,
            shadow,
        });
        if same_stable && old_candidate.as_ref() == new_candidate.as_ref().map(|(d, _)| d) {
            return;
        }
        self.log_change(&old, old_candidate, new_candidate, origin, since);
    }

    /// The shadow task of `shadow`, started (or `None`), logged.
    fn start_shadow(
        &self,
        shadow: Option<(Arc<Plugin>, u64)>,
        origin: &str,
    ) -> Option<shadow::Shadow> {
        if let Some((p, _)) = &shadow {
            tracing::info!(subscription = %self.subscription, origin, shadow = %p.digest(), "shadow started: every record goes to the candidate after the live version; its effects are compared, never applied");
        } else {
            tracing::info!(subscription = %self.subscription, origin, "shadow ended");
        }
        shadow.map(|(p, id)| {
            shadow::Shadow::start(
                p,
                id,
                shadow::ShadowCounters::new(&self.telemetry, self.subscription.as_str()),
            )
        })
    }

    /// Logs a change of the stable version or the canary.
    fn log_change(
        &self,
        old: &PluginDigest,
        old_candidate: Option<PluginDigest>,
        new_candidate: Option<(PluginDigest, KeySlice)>,
        origin: &str,
        since: Instant,
    ) {
        let new = self.current().digest().clone();
        let same_stable = old == &new;
        let live_after_ms = since.elapsed().as_millis() as u64;
        let sub = &self.subscription;
        match (old_candidate, new_candidate) {
            (Some(candidate), None) if candidate == new => tracing::info!(
                subscription = %sub, origin, old = %old, new = %new, live_after_ms,
                "canary promoted: every key goes to the candidate"
            ),
            (Some(_), None) if same_stable => tracing::info!(
                subscription = %sub, origin, old = %old, new = %new, live_after_ms,
                "canary rolled back: every key goes to the stable version"
            ),
            (_, Some((candidate, slice))) if same_stable => tracing::info!(
                subscription = %sub, origin, stable = %new, candidate = %candidate,
                key_fraction = slice.fraction(), live_after_ms,
                "canary started: keys in the slice go to the candidate from each lane's next record or batch"
            ),
            _ => tracing::info!(
                subscription = %sub, origin, old = %old, new = %new, live_after_ms,
                "plugin swapped: lanes switch at their next record or batch"
            ),
        }
    }

    /// Watches the plugin file until `shutdown`, sending the bytes of each
    /// change to `changed` (the fleet's versions decide what runs; see
    /// `crate::rollout`).
    pub(crate) async fn watch(
        self: Arc<Self>,
        shutdown: CancellationToken,
        changed: mpsc::Sender<(Vec<u8>, Instant)>,
    ) {
        let (tx, mut rx) = mpsc::channel::<()>(16);
        let file_name = self.path.file_name().map(|n| n.to_owned());
        let watched = file_name.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Only content changes: another process merely opening or
            // reading the file (access events) must not trigger a reload,
            // which would also undo a swap made through the admin API.
            let changes_content = |kind: &EventKind| {
                matches!(kind, EventKind::Create(_))
                    || matches!(kind, EventKind::Modify(m) if !matches!(m, ModifyKind::Metadata(_)))
            };
            if let Ok(event) = event
                && changes_content(&event.kind)
                && event
                    .paths
                    .iter()
                    .any(|p| p.file_name() == watched.as_deref())
            {
                // A full queue already holds a wake-up: coalesced.
                let _ = tx.try_send(());
            }
        });
        let folder = folder_of(&self.path);
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(subscription = %self.subscription, plugin = %self.path.display(), error = %e, "cannot watch the plugin file; swaps only through the admin API");
                return;
            }
        };
        if let Err(e) = watcher.watch(&folder, RecursiveMode::NonRecursive) {
            tracing::error!(subscription = %self.subscription, folder = %folder.display(), error = %e, "cannot watch the plugin's folder; swaps only through the admin API");
            return;
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                event = rx.recv() => if event.is_none() { return },
            }
            let detected = Instant::now();
            // Debounce: wait until the events stop.
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(DEBOUNCE) => break,
                    _ = rx.recv() => continue,
                }
            }
            let read = tokio::select! {
                _ = shutdown.cancelled() => return,
                read = read_plugin_file(self.path.clone()) => read,
            };
            let bytes = match read {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(subscription = %self.subscription, plugin = %self.path.display(), error = %e, "plugin file changed but cannot be read; waiting for the next change");
                    continue;
                }
            };
            if &PluginDigest::of(&bytes) == self.current().digest() {
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                sent = changed.send((bytes, detected)) => if sent.is_err() { return },
            }
        }
    }
}

/// Reads the plugin file as [`files::read_regular`] does (a regular file, at
/// most [`files::MAX_PLUGIN_BYTES`], never blocking on the open), on a thread
/// of its own ([`files::on_thread`]): the watcher stops waiting for it at
/// shutdown, and a read stuck in the kernel ends with the process.
async fn read_plugin_file(path: PathBuf) -> std::io::Result<Vec<u8>> {
    files::on_thread("plugin-read", move || {
        files::read_regular(&path, files::MAX_PLUGIN_BYTES)
    })
    .await?
    .map_err(Into::into)
}

fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

impl HandlerFactory for PluginSlot {
    type Handler = SlotInstance;
    type Error = PluginError;

    async fn create(&self, lane: LaneId) -> Result<SlotInstance, PluginError> {
        let versions = self.versions();
        SlotInstance::new(
            &versions.stable,
            versions.canary.as_ref(),
            versions.shadow.clone(),
            lane,
        )
        .await
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests;
