//! The supervisor: builds every subscription's pipeline, owns every task, and
//! runs the ordered shutdown.
//!
//! Per subscription it wires, each stage a task talking through bounded
//! channels:
//!
//! ```text
//! lease keeper ──starts/stops──▶ shard readers ──▶ channel (64) ──▶ dispatch ──▶ plugin
//!      ▲                              │ track                          │ settle
//!      └──── checkpoint requests ── settlement ◀───────────────────────┘
//! ```
//!
//! Start-up validates everything before any record is read: every plugin is
//! compiled, checked for its world and linked; each stream must exist. A
//! failure there returns one error naming the subscription and the reason.
//!
//! Shutdown order, once the injected `shutdown` future completes:
//! 1. stop taking leases, and stop every reader (the keeper cancels and
//!    joins them);
//! 2. the channel closes once the readers' senders are gone;
//! 3. dispatch drains what is in the channel, bounded by `shutdown_timeout`
//!    (past it, dispatch stops and unhandled records stay unsettled);
//! 4. settlement requests each shard's final checkpoint and ends;
//! 5. the keeper writes those checkpoints and releases every lease, so
//!    another instance can take over at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::channel;
use crate::config::{Config, LeaseBackend, OnFailure, SubscriptionConfig, defaults};
use crate::dispatch::Dispatcher;
use crate::dispatch::mode_label;
use crate::failure::DeadLetters;
use crate::ids::OwnerId;
use crate::ids::StreamName;
use crate::kinesis;
use crate::lease::LeaseStore;
use crate::lease::dynamodb::DynamoDbLeaseStore;
use crate::lease::file::FileLeaseStore;
use crate::lease::keeper::{CHECKPOINT_QUEUE, Keeper};
use crate::lease::memory::MemoryLeaseStore;
use crate::ops::{self, OpsState};
use crate::plugin::{CompileCache, Plugin, PluginHost, World};
use crate::reader::ReaderContext;
use crate::settlement::{SETTLEMENT_QUEUE, Settlement};
use crate::swap::PluginSlot;
use crate::telemetry::Telemetry;

/// A unique owner id for this process: hostname, pid and a random suffix
/// (pids repeat across restarts and containers).
pub fn default_owner_id() -> OwnerId {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".to_owned());
    let suffix: u32 = rand::random();
    OwnerId::new(format!("{host}-{}-{suffix:08x}", std::process::id()))
}

struct Running {
    name: String,
    keeper_stop: CancellationToken,
    hard_stop: CancellationToken,
    shutdown_timeout: std::time::Duration,
    keeper: JoinHandle<()>,
    dispatcher: JoinHandle<()>,
    settlement: JoinHandle<()>,
    watcher: JoinHandle<()>,
}

/// A subscription's config with its compiled, checked plugin.
pub struct LoadedSubscription {
    /// The subscription.
    pub config: Arc<SubscriptionConfig>,
    /// Its plugin.
    pub plugin: Plugin,
    /// Its canary's candidate, when the config names one.
    pub canary: Option<Plugin>,
}

/// Compiles and checks every subscription's plugin against its config,
/// without reading anything: what `shardlane validate` runs, and the first
/// step of [`run`].
///
/// # Errors
/// One line naming the subscription, the plugin and the reason.
pub fn load_plugins(config: &Config) -> anyhow::Result<(PluginHost, Vec<LoadedSubscription>)> {
    let max_memory = config
        .subscriptions
        .iter()
        .map(|s| s.sandbox.max_memory)
        .max()
        .unwrap_or(defaults::MAX_MEMORY);
    let fuel = config
        .subscriptions
        .iter()
        .any(|s| s.sandbox.fuel.is_some());
    let cache = match &config.compile_cache {
        Some(dir) => match CompileCache::new(dir.clone()) {
            Ok(cache) => Some(cache),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "compile cache unavailable; compiling every start");
                None
            }
        },
        None => None,
    };
    let plugins = PluginHost::new(max_memory, config.max_core_instances, fuel)
        .context("cannot start the WebAssembly engine")?
        .with_cache(cache);
    let mut loaded = Vec::new();
    for (i, sub) in config.subscriptions.iter().enumerate() {
        let load = |path: &std::path::Path| {
            plugins.load(
                path,
                sub.name.clone(),
                sub.handler_timeout,
                sub.sandbox.clone(),
            )
        };
        let plugin =
            load(&sub.plugin).with_context(|| format!("subscription[{i}] ({})", sub.name))?;
        match (plugin.world(), sub.batch) {
            (World::BatchHandler, None) => anyhow::bail!(
                "subscription[{i}] ({}): plugin {} implements batch-handler (exports `handle-batch`): set `batch_size` for it",
                sub.name,
                sub.plugin.display()
            ),
            (World::RecordHandler, Some(_)) => anyhow::bail!(
                "subscription[{i}] ({}): `batch_size` needs a batch-handler plugin, but {} implements record-handler (exports `handle`, not `handle-batch`)",
                sub.name,
                sub.plugin.display()
            ),
            _ => {}
        }
        tracing::info!(
            subscription = %sub.name, plugin = %sub.plugin.display(), digest = %plugin.digest(),
            world = %plugin.world(), mode = ?sub.dispatch, batch = ?sub.batch, "plugin loaded"
        );
        let canary = match &sub.canary {
            None => None,
            Some(canary) => {
                let candidate = load(&canary.plugin)
                    .with_context(|| format!("subscription[{i}] ({}): canary", sub.name))?;
                if candidate.world() != plugin.world() {
                    anyhow::bail!(
                        "subscription[{i}] ({}): canary.plugin {} implements {}, but plugin {} implements {}: a canary must implement the same world",
                        sub.name,
                        canary.plugin.display(),
                        candidate.world(),
                        sub.plugin.display(),
                        plugin.world()
                    );
                }
                tracing::info!(
                    subscription = %sub.name, plugin = %canary.plugin.display(), digest = %candidate.digest(),
                    key_fraction = canary.slice.fraction(), "canary loaded"
                );
                Some(candidate)
            }
        };
        loaded.push(LoadedSubscription {
            config: Arc::new(sub.clone()),
            plugin,
            canary,
        });
    }
    Ok((plugins, loaded))
}

/// Runs every subscription of `config` until `shutdown` completes, then
/// shuts down in order (module docs).
///
/// # Errors
/// When start-up fails: a plugin that cannot be used, a stream that does not
/// exist, a subscription whose plugin world does not fit its config, an
/// admin address that cannot be bound.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let (plugins, loaded) = load_plugins(&config)?;
    let client = kinesis::client(&config.aws).await;
    for (i, sub) in loaded.iter().map(|l| &l.config).enumerate() {
        let context = || format!("subscription[{i}] ({})", sub.name);
        check_stream(&client, &sub.stream, "stream")
            .await
            .with_context(context)?;
        if let OnFailure::DeadLetter(dlq) = &sub.failure.on_failure {
            check_stream(&client, dlq, "dead_letter_stream")
                .await
                .with_context(context)?;
        }
    }

    let store: Arc<dyn LeaseStore> = match &config.lease.store {
        LeaseBackend::Memory => Arc::new(MemoryLeaseStore::new()),
        LeaseBackend::File { path } => Arc::new(FileLeaseStore::open(path)?),
        LeaseBackend::DynamoDb {
            table,
            create_table,
        } => Arc::new(
            DynamoDbLeaseStore::open(
                kinesis::dynamodb_client(&config.aws).await,
                table,
                *create_table,
            )
            .await?,
        ),
    };
    tracing::info!(store = ?config.lease.store, "lease store open");
    let owner = config
        .lease
        .owner_id
        .clone()
        .map(OwnerId::new)
        .unwrap_or_else(default_owner_id);
    tracing::info!(owner = %owner, subscriptions = loaded.len(), "shardlane running");

    let telemetry = Telemetry::new();
    let ops_stop = CancellationToken::new();
    let mut slots = BTreeMap::new();
    let mut running = Vec::new();
    for LoadedSubscription {
        config: sub,
        plugin,
        canary,
    } in loaded
    {
        let (deliveries_tx, deliveries_rx) = channel::channel();
        let (settle_tx, settle_rx) = mpsc::channel(SETTLEMENT_QUEUE);
        let (checkpoint_tx, checkpoint_rx) = mpsc::channel(CHECKPOINT_QUEUE);
        let keeper_stop = CancellationToken::new();
        let hard_stop = CancellationToken::new();
        let status = telemetry.subscription(sub.name.as_str(), mode_label(&sub));

        let settlement = Settlement::new(sub.name.clone(), sub.checkpoint_every, checkpoint_tx)
            .with_telemetry(&telemetry);
        let dead_letters = match &sub.failure.on_failure {
            OnFailure::DeadLetter(stream) => Some(DeadLetters::new(
                client.clone(),
                stream.clone(),
                sub.name.clone(),
            )),
            _ => None,
        };
        let mut slot = PluginSlot::new(
            plugins.clone(),
            plugin,
            sub.handler_timeout,
            sub.sandbox.clone(),
            status.clone(),
            telemetry.clone(),
        );
        if let (Some(candidate), Some(canary)) = (canary, &sub.canary) {
            slot = slot.with_canary(candidate, canary.slice);
        }
        let slot = Arc::new(slot);
        slots.insert(sub.name.to_string(), slot.clone());
        let fill = telemetry.gauge(
            "shardlane_channel_fill",
            "Deliveries waiting in the subscription channel (capacity 64).",
            &[("subscription", sub.name.as_str())],
        );
        let watched = deliveries_rx.clone();
        telemetry.on_render(move || fill.set(watched.len() as u64));
        let dispatcher = Dispatcher::new(
            sub.clone(),
            slot.clone(),
            settle_tx.clone(),
            dead_letters,
            telemetry.clone(),
        );
        let keeper = Keeper::new(
            sub.clone(),
            config.lease.clone(),
            owner.clone(),
            store.clone(),
            ReaderContext {
                client: client.clone(),
                subscription: sub.clone(),
                deliveries: deliveries_tx,
                settlement: settle_tx,
                telemetry: telemetry.clone(),
                status,
            },
        );
        running.push(Running {
            name: sub.name.to_string(),
            shutdown_timeout: sub.shutdown_timeout,
            settlement: tokio::spawn(settlement.run(settle_rx)),
            dispatcher: tokio::spawn(dispatcher.run(deliveries_rx, hard_stop.clone())),
            keeper: tokio::spawn(keeper.run(checkpoint_rx, keeper_stop.clone())),
            watcher: tokio::spawn(slot.watch(ops_stop.clone())),
            keeper_stop,
            hard_stop,
        });
    }
    let ops = match config.admin.listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("admin.listen: cannot listen on {addr}"))?;
            tracing::info!(addr = %listener.local_addr()?, writes = config.admin.token.is_some(), "admin listening: /healthz /readyz /metrics / (status page)");
            let state = Arc::new(OpsState {
                telemetry: telemetry.clone(),
                slots,
                token: config.admin.token.clone(),
            });
            Some(tokio::spawn(ops::serve(listener, state, ops_stop.clone())))
        }
        None => None,
    };

    shutdown.await;
    tracing::info!("shutting down: stopping readers, draining in-flight records");
    for sub in &running {
        sub.keeper_stop.cancel();
        let hard_stop = sub.hard_stop.clone();
        let timeout = sub.shutdown_timeout;
        // Detached on purpose: it only fires a token, and ends with the
        // runtime.
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            hard_stop.cancel();
        });
    }
    let mut failed = false;
    let mut running_watchers = Vec::new();
    for sub in running {
        running_watchers.push(sub.watcher);
        for (stage, task) in [
            ("dispatch", sub.dispatcher),
            ("settlement", sub.settlement),
            ("lease keeper", sub.keeper),
        ] {
            if let Err(e) = task.await {
                failed = true;
                tracing::error!(subscription = %sub.name, stage, error = %e, "task failed");
            }
        }
    }
    ops_stop.cancel();
    for sub in running_watchers {
        let _ = sub.await;
    }
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    tracing::info!("shardlane stopped");
    anyhow::ensure!(!failed, "a pipeline task failed during the run");
    Ok(())
}

/// How long start-up keeps trying to reach Kinesis before it gives up.
const REACH_KINESIS_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Fails when the stream does not exist, naming the config key; an
/// unreachable endpoint is retried with backoff for [`REACH_KINESIS_FOR`],
/// then fails with the last error.
async fn check_stream(
    client: &aws_sdk_kinesis::Client,
    stream: &StreamName,
    key: &str,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + REACH_KINESIS_FOR;
    let mut backoff = crate::backoff::Backoff::new(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(5),
    );
    loop {
        match client
            .describe_stream_summary()
            .stream_name(stream.as_str())
            .send()
            .await
        {
            Ok(_) => return Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                anyhow::bail!("{key} {:?} does not exist", stream.as_str())
            }
            Err(e) => {
                let error = aws_sdk_kinesis::error::DisplayErrorContext(&e).to_string();
                if tokio::time::Instant::now() >= deadline {
                    anyhow::bail!(
                        "cannot reach Kinesis to check {key} {:?} (tried for {REACH_KINESIS_FOR:?}): {error}",
                        stream.as_str()
                    );
                }
                let wait = backoff.next_wait();
                tracing::warn!(stream = %stream, error, ?wait, "cannot reach Kinesis yet; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
}
