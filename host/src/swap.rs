//! Hot-swap: a subscription's plugin slot, which lanes instantiate from and
//! which a new plugin version replaces while the service runs.
//!
//! A new version arrives from the plugin file changing (watched with
//! `notify`: editors' in-place writes and `mv`-style atomic replacement
//! both show up as events on the file's folder; events are debounced, and
//! only content changes count, not a process reading the file) or
//! from the admin API. It is compiled and validated off the hot path (a
//! blocking task): it must be a component of the same world as the running
//! version, with every import provided. If that fails, the running version
//! stays and the error is logged with the file and the reason.
//!
//! When valid, the slot's generation moves on. Every lane checks the
//! generation at its next record or batch boundary: calls in flight finish
//! on the old version, later records go to the new one, and the old
//! instance is dropped. Settlement never sees a swap, so no record is lost
//! or handled twice because of one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::SandboxConfig;
use crate::dispatch::HandlerFactory;
use crate::ids::{LaneId, SubscriptionName};
use crate::plugin::{Instance, Plugin, PluginDigest, PluginError, PluginHost};
use crate::telemetry::{SubscriptionStatus, Telemetry};

/// Quiet time after the last file event before the file is read: editors
/// and copies write in several steps.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// What a swap did.
#[derive(Debug, Clone)]
pub struct SwapReport {
    /// The version before.
    pub old: PluginDigest,
    /// The version now.
    pub new: PluginDigest,
    /// Compile and validation time, until lanes could switch.
    pub live_after: Duration,
    /// False when the new bytes were the running version already.
    pub changed: bool,
}

/// The current plugin of a subscription (see the module docs).
pub struct PluginSlot {
    host: PluginHost,
    path: PathBuf,
    subscription: SubscriptionName,
    handler_timeout: Duration,
    sandbox: SandboxConfig,
    current: RwLock<Arc<Plugin>>,
    generation: AtomicU64,
    /// Serializes swaps; held while one compiles, never on the hot path.
    swapping: tokio::sync::Mutex<()>,
    status: Arc<SubscriptionStatus>,
    telemetry: Arc<Telemetry>,
}

impl PluginSlot {
    /// A slot holding `plugin`, loaded from `path`.
    pub fn new(
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
            current: RwLock::new(Arc::new(plugin)),
            generation: AtomicU64::new(0),
            swapping: tokio::sync::Mutex::new(()),
            status,
            telemetry,
        };
        slot.publish(None);
        slot
    }

    /// The running version.
    pub fn current(&self) -> Arc<Plugin> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn publish(&self, old: Option<&PluginDigest>) {
        let plugin = self.current();
        let sub = self.subscription.as_str();
        if let Some(old) = old {
            self.telemetry.forget_series(
                "shardlane_plugin_info",
                &[("subscription", sub), ("digest", &old.to_string())],
            );
        }
        self.telemetry
            .gauge(
                "shardlane_plugin_info",
                "The plugin version each subscription runs (value 1).",
                &[
                    ("subscription", sub),
                    ("digest", &plugin.digest().to_string()),
                ],
            )
            .set(1);
        *self.status.digest.lock().unwrap_or_else(|e| e.into_inner()) = plugin.digest().to_string();
    }

    /// Compiles, validates and installs a new version from `bytes`;
    /// `origin` says where it came from, for the logs.
    ///
    /// # Errors
    /// A [`PluginError`] naming the file and reason; the running version
    /// stays.
    pub async fn swap(&self, bytes: Vec<u8>, origin: &str) -> Result<SwapReport, PluginError> {
        let _one_at_a_time = self.swapping.lock().await;
        let started = Instant::now();
        let old = self.current();
        let digest = PluginDigest::of(&bytes);
        if &digest == old.digest() {
            return Ok(SwapReport {
                old: digest.clone(),
                new: digest,
                live_after: started.elapsed(),
                changed: false,
            });
        }
        let host = self.host.clone();
        let (path, sub, timeout, sandbox) = (
            self.path.clone(),
            self.subscription.clone(),
            self.handler_timeout,
            self.sandbox.clone(),
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
            Ok(new) if new.world() != old.world() => Err(PluginError::Link {
                path: self.path.clone(),
                reason: format!(
                    "the new version implements {}, the running one {}: a swap cannot change the world",
                    new.world(),
                    old.world()
                ),
            }),
            other => other,
        };
        let new = match new {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(subscription = %self.subscription, origin, error = %e, running = old.digest().short(), "new plugin version refused; the running version stays");
                return Err(e);
            }
        };
        let new_digest = new.digest().clone();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.publish(Some(old.digest()));
        let live_after = started.elapsed();
        tracing::info!(
            subscription = %self.subscription, origin, old = %old.digest(), new = %new_digest,
            live_after_ms = live_after.as_millis() as u64,
            "plugin swapped: lanes switch at their next record or batch"
        );
        Ok(SwapReport {
            old: old.digest().clone(),
            new: new_digest,
            live_after,
            changed: true,
        })
    }

    /// Watches the plugin file until `shutdown`, swapping in each new valid
    /// version.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
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
            let bytes = match tokio::fs::read(&self.path).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(subscription = %self.subscription, plugin = %self.path.display(), error = %e, "plugin file changed but cannot be read; waiting for the next change");
                    continue;
                }
            };
            if let Ok(report) = self.swap(bytes, "file").await
                && report.changed
            {
                tracing::info!(subscription = %self.subscription, since_file_change_ms = detected.elapsed().as_millis() as u64, "plugin file change is live");
            }
        }
    }
}

fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

impl HandlerFactory for PluginSlot {
    type Handler = Instance;

    async fn create(&self, lane: LaneId) -> Result<Instance, PluginError> {
        let plugin = self.current();
        plugin.instantiate(lane).await
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}
