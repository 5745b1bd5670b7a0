//! The supervisor: starts the operations server and every subscription —
//! its rollout stage, and its [`Pipeline`] while the stage says the
//! fleet's version runs here — and shuts them down in order.
//!
//! # Start-up
//! 1. Every plugin of the config is compiled, checked for its world and
//!    linked (no store is called: these are the config's own files).
//! 2. The operations listeners are bound: `/healthz` answers from here on,
//!    `/readyz` answers 503 with the reasons, `/metrics` serves, before
//!    any store is called.
//! 3. Each stream (and dead-letter stream, and output) must exist; the
//!    lease store must open; the artifact store is opened.
//! 4. Each subscription's task starts: its rollout stage reads the fleet's
//!    versions and gets them, and the pipeline starts once the stage is
//!    ready — never with a version the fleet did not name (see "The
//!    fleet's version, or nothing" in `crate::rollout`).
//!
//! A failure in 1–3 returns one error naming the subscription and the
//! reason. A shutdown during start-up drops the call under way (nothing
//! was read, no lease taken) and returns at once.
//!
//! # Shutdown
//! Once the injected `shutdown` future completes, every subscription stops
//! side by side: its rollout stage drops any fetch under way, and its
//! pipeline shuts down in its own order (see [`crate::pipeline`]: stop
//! taking leases → readers stop → the channel closes → dispatch drains →
//! final checkpoints → leases released), bounded by `shutdown_timeout`
//! whatever the stores and Kinesis do; then the operations server stops.
//! It answers `/healthz` until the end.
//!
//! Floor 11 (the supervisor) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::artifacts::{self, ArtifactStore};
use crate::config::{Config, LeaseBackend, ReadMode, SubscriptionConfig, defaults};
use crate::ids::{OwnerId, StreamName, SubscriptionName};
use crate::kinesis::{self, ConsumerArn, Kinesis, KinesisError};
use crate::lease::LeaseStore;
use crate::lease::dynamodb::DynamoDbLeaseStore;
use crate::lease::file::FileLeaseStore;
use crate::lease::memory::MemoryLeaseStore;
use crate::ops::{self, OpsState, Routes};
use crate::pipeline::{Parts, Pipeline, Source};
use crate::plugin::{CompileCache, Plugin, PluginHost, World};
use crate::rollout::{Declaration, Readiness, Rollout};
use crate::slot::PluginSlot;
use crate::telemetry::Telemetry;

/// This machine's host name (`host` when it has none).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".to_owned())
}

/// A unique owner id for this process: hostname, pid and a random suffix
/// (pids repeat across restarts and containers).
pub(crate) fn default_owner_id() -> OwnerId {
    let host = hostname();
    let suffix: u32 = rand::random();
    OwnerId::new(format!("{host}-{}-{suffix:08x}", std::process::id()))
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
    load(config, None)
}

/// [`load_plugins`], the plugins registering their metrics in `telemetry`.
fn load(
    config: &Config,
    telemetry: Option<Arc<Telemetry>>,
) -> anyhow::Result<(PluginHost, Vec<LoadedSubscription>)> {
    let plugins = plugin_host(config, telemetry)?;
    let loaded = config
        .subscriptions
        .iter()
        .enumerate()
        .map(|(i, sub)| load_subscription(&plugins, i, sub))
        .collect::<anyhow::Result<_>>()?;
    Ok((plugins, loaded))
}

/// The engine every plugin runs in, sized for the most demanding
/// subscription, with the compile cache when one is configured and usable.
pub(crate) fn plugin_host(
    config: &Config,
    telemetry: Option<Arc<Telemetry>>,
) -> anyhow::Result<PluginHost> {
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
    Ok(match telemetry {
        Some(telemetry) => plugins.with_telemetry(telemetry),
        None => plugins,
    })
}

/// Loads subscription `i`'s plugin (and its canary's candidate) and
/// checks that its world fits the config.
///
/// # Errors
/// One line naming the subscription, the plugin and the reason.
fn load_subscription(
    plugins: &PluginHost,
    i: usize,
    sub: &SubscriptionConfig,
) -> anyhow::Result<LoadedSubscription> {
    let load = |path: &std::path::Path| {
        plugins.load(
            path,
            sub.name.clone(),
            sub.handler_timeout,
            sub.sandbox.clone(),
        )
    };
    let plugin = load(&sub.plugin).with_context(|| format!("subscription[{i}] ({})", sub.name))?;
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
    if let Some(misfit) = plugin.window_misfit(sub.window.as_ref()) {
        anyhow::bail!("subscription[{i}] ({}): {misfit}", sub.name);
    }
    tracing::info!(
        subscription = %sub.name, plugin = %sub.plugin.display(), digest = %plugin.digest(),
        world = %plugin.world(), contract = %plugin.contract(), mode = ?sub.dispatch, batch = ?sub.batch, "plugin loaded"
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
    Ok(LoadedSubscription {
        config: Arc::new(sub.clone()),
        plugin,
        canary,
    })
}

/// Runs every subscription of `config` until `shutdown` completes, then
/// shuts down in order (module docs).
///
/// # Errors
/// When start-up fails: a plugin that cannot be used, a stream that does not
/// exist, a subscription whose plugin world does not fit its config, a lease
/// store that cannot be opened, an admin address that cannot be bound.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let telemetry = Telemetry::new();
    let (plugins, loaded) = load(&config, Some(telemetry.clone()))?;
    // The operations listeners first: health, readiness and metrics answer
    // before any store is called (readiness: not yet).
    let ops_stop = CancellationToken::new();
    let (rollouts, made) = tokio::sync::watch::channel(None);
    let state = Arc::new(OpsState {
        telemetry: telemetry.clone(),
        rollouts: made,
        token: config.admin.token.clone(),
    });
    let servers = listen(&config, &state, &ops_stop).await?;
    let emf = config.emf.clone().map(|emf| {
        tracing::info!(to = ?emf.to, every = ?emf.every, namespace = %emf.namespace, "writing metrics as CloudWatch EMF");
        tokio::spawn(crate::telemetry::emf::run(
            telemetry.clone(),
            emf,
            ops_stop.clone(),
        ))
    });
    tokio::pin!(shutdown);
    // A shutdown during start-up drops whatever start-up call is under way:
    // nothing was read, no lease taken.
    let started = tokio::select! {
        () = &mut shutdown => None,
        started = start(&config, plugins, loaded, &telemetry) => Some(started),
    };
    let result = match started {
        None => {
            tracing::info!("shutting down during start-up: nothing was read");
            Ok(())
        }
        Some(Err(e)) => Err(e),
        Some(Ok(running)) => {
            rollouts.send_replace(Some(Arc::new(running.rollouts.clone())));
            shutdown.await;
            tracing::info!("shutting down: stopping readers, draining in-flight records");
            running.stop().await
        }
    };
    ops_stop.cancel();
    for server in servers {
        let _ = server.await;
    }
    if let Some(emf) = emf {
        // Its last documents carry what the drain counted.
        let _ = emf.await;
    }
    if result.is_ok() {
        tracing::info!("shardlane stopped");
    }
    result
}

/// The subscriptions, running: each one's task ([`Runner`]) and rollout
/// stage.
struct Running {
    stop: CancellationToken,
    runners: Vec<JoinHandle<bool>>,
    rollouts: BTreeMap<SubscriptionName, Arc<Rollout>>,
    /// The longest `shutdown_timeout` of them.
    shutdown_timeout: std::time::Duration,
}

impl Running {
    /// Stops every subscription in its order, side by side, within the
    /// longest `shutdown_timeout` (each pipeline bounds its own stop by
    /// its own; a task still running past that, and a moment more, is cut).
    ///
    /// # Errors
    /// When one of their tasks failed or had to be cut.
    async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        let bound = self.shutdown_timeout + STOP_MARGIN;
        let mut runners = self.runners;
        let joined = tokio::time::timeout(bound, async {
            let mut ok = true;
            for runner in &mut runners {
                ok &= runner.await.unwrap_or(false);
            }
            ok
        })
        .await;
        let ok = joined.unwrap_or_else(|_| {
            tracing::error!(
                ?bound,
                "a subscription was still stopping past its shutdown_timeout: cut"
            );
            runners.iter().for_each(JoinHandle::abort);
            false
        });
        anyhow::ensure!(ok, "a pipeline task failed or was cut during the run");
        Ok(())
    }
}

/// What the supervisor waits beyond the longest `shutdown_timeout` before
/// it cuts a subscription still stopping (each bounds its own stop).
const STOP_MARGIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Start-up after the listeners: the streams checked, the lease and
/// artifact stores opened, and every subscription's task started.
///
/// # Errors
/// A stream that does not exist, a consumer that cannot be registered, a
/// lease store that cannot be opened.
async fn start(
    config: &Config,
    plugins: PluginHost,
    loaded: Vec<LoadedSubscription>,
    telemetry: &Arc<Telemetry>,
) -> anyhow::Result<Running> {
    let kinesis = Kinesis::connect(&config.aws).await;
    let mut consumers = preflight(&kinesis, &loaded).await?;
    let store = open_store(config).await?;
    let owner = config
        .lease
        .owner_id
        .clone()
        .map(OwnerId::new)
        .unwrap_or_else(default_owner_id);
    let artifacts = open_artifacts(config).await.map(Arc::new);
    tracing::info!(owner = %owner, subscriptions = loaded.len(), "shardlane running");
    let stop = CancellationToken::new();
    let mut running = Running {
        stop: stop.clone(),
        runners: Vec::new(),
        rollouts: BTreeMap::new(),
        shutdown_timeout: std::time::Duration::ZERO,
    };
    for loaded in loaded {
        let runner = Runner::new(
            loaded,
            Shared {
                config,
                plugins: &plugins,
                kinesis: &kinesis,
                store: &store,
                artifacts: &artifacts,
                owner: &owner,
                telemetry,
            },
            &mut consumers,
        );
        running.shutdown_timeout = running.shutdown_timeout.max(runner.sub.shutdown_timeout);
        running
            .rollouts
            .insert(runner.sub.name.clone(), runner.rollout.clone());
        running
            .runners
            .push(tokio::spawn(runner.run(stop.child_token())));
    }
    Ok(running)
}

/// Before anything is read: every stream a subscription names (its own,
/// its dead-letter stream, its outputs) exists, and each fan-out
/// subscription's stream consumer is registered. Returns the consumers.
///
/// # Errors
/// The first that fails, naming the subscription and the config key.
async fn preflight(
    kinesis: &Kinesis,
    loaded: &[LoadedSubscription],
) -> anyhow::Result<BTreeMap<SubscriptionName, ConsumerArn>> {
    let mut consumers = BTreeMap::new();
    for (i, sub) in loaded.iter().map(|l| &l.config).enumerate() {
        let context = || format!("subscription[{i}] ({})", sub.name);
        check_stream(kinesis, &sub.stream, "stream")
            .await
            .with_context(context)?;
        if let ReadMode::FanOut { consumer } = &sub.read {
            let arn = kinesis
                .ensure_consumer(&sub.stream, consumer)
                .await
                .map_err(|e| anyhow::anyhow!("consumer_name {consumer:?}: cannot register or use the stream consumer: {e}"))
                .with_context(context)?;
            tracing::info!(subscription = %sub.name, consumer = %consumer, arn = %arn.0, "reading by enhanced fan-out");
            consumers.insert(sub.name.clone(), arn);
        }
        if let Some(dlq) = sub.failure.on_failure.dead_letter_stream() {
            check_stream(kinesis, dlq, "dead_letter_stream")
                .await
                .with_context(context)?;
        }
        for output in &sub.sandbox.grants.outputs {
            check_stream(kinesis, output, "outputs")
                .await
                .with_context(context)?;
        }
    }
    Ok(consumers)
}

/// What every subscription of the process shares, as start-up made it.
struct Shared<'a> {
    config: &'a Config,
    plugins: &'a PluginHost,
    kinesis: &'a Kinesis,
    store: &'a Arc<dyn LeaseStore>,
    artifacts: &'a Option<Arc<ArtifactStore>>,
    owner: &'a OwnerId,
    telemetry: &'a Arc<Telemetry>,
}

/// Opens the artifact store of `config` (see `crate::artifacts`, "Kinds"):
/// `[artifacts] location`, or the lease store's own; `None` for a
/// DynamoDB fleet without `location`.
pub(crate) async fn open_artifacts(config: &Config) -> Option<ArtifactStore> {
    let store = artifacts::open(&config.artifacts, &config.lease.store, |timeouts| {
        kinesis::s3_client(&config.aws, timeouts)
    })
    .await?;
    tracing::info!(artifacts = %store.location(), "plugin versions are kept in the artifact store");
    Some(store)
}

/// One subscription's task: its rollout stage, and its pipeline while the
/// stage says the fleet's version runs here (see "The fleet's version, or
/// nothing" in `crate::rollout`).
struct Runner {
    sub: Arc<SubscriptionConfig>,
    slot: Arc<PluginSlot>,
    rollout: Arc<Rollout>,
    kinesis: Kinesis,
    fan_out: Option<ConsumerArn>,
    store: Arc<dyn LeaseStore>,
    lease: crate::config::LeaseConfig,
    owner: OwnerId,
    telemetry: Arc<Telemetry>,
}

impl Runner {
    fn new(
        loaded: LoadedSubscription,
        shared: Shared<'_>,
        consumers: &mut BTreeMap<SubscriptionName, ConsumerArn>,
    ) -> Self {
        let LoadedSubscription {
            config: sub,
            plugin,
            canary,
        } = loaded;
        let status = shared.telemetry.subscription(&sub.name, sub.mode());
        let slot = Arc::new(PluginSlot::new(
            shared.plugins.clone(),
            plugin,
            sub.handler_timeout,
            sub.sandbox.clone(),
            status,
            shared.telemetry.clone(),
        ));
        let declaration = Declaration {
            stable: slot.current(),
            filter: sub.filter.clone(),
            canary: canary
                .zip(sub.canary.as_ref())
                .map(|(candidate, c)| (Arc::new(candidate), c.slice, c.rules.clone())),
            lone: !matches!(shared.config.lease.store, LeaseBackend::DynamoDb { .. }),
        };
        let rollout = Arc::new(Rollout::new(
            slot.clone(),
            shared.store.clone(),
            shared.artifacts.clone(),
            shared.owner.clone(),
            declaration,
            shared.telemetry,
        ));
        Self {
            fan_out: consumers.remove(&sub.name),
            sub,
            slot,
            rollout,
            kinesis: shared.kinesis.clone(),
            store: shared.store.clone(),
            lease: shared.config.lease.clone(),
            owner: shared.owner.clone(),
            telemetry: shared.telemetry.clone(),
        }
    }

    fn parts(&self) -> Parts {
        Parts {
            subscription: self.sub.clone(),
            slot: self.slot.clone(),
            source: Source::Kinesis {
                kinesis: self.kinesis.clone(),
                fan_out: self.fan_out.clone(),
                effects: None,
            },
            store: self.store.clone(),
            lease: self.lease.clone(),
            owner: self.owner.clone(),
            telemetry: self.telemetry.clone(),
            range: None,
            decode: None,
            filter: self.rollout.filter_feed(),
        }
    }

    /// Runs the rollout stage until `stop`, and the pipeline whenever the
    /// stage is ready: started when it becomes ready, stopped at once
    /// (leases released) when it no longer is, stopped in order at `stop`.
    /// False when a pipeline task failed.
    async fn run(self, stop: CancellationToken) -> bool {
        let rollout = tokio::spawn(self.rollout.clone().run(stop.clone()));
        let mut readiness = self.rollout.readiness();
        let mut ok = true;
        loop {
            let ready = tokio::select! {
                () = stop.cancelled() => false,
                ready = readiness.wait_for(Readiness::is_ready) => ready.is_ok(),
            };
            if !ready {
                break;
            }
            let pipeline = Pipeline::start(self.parts());
            let stopping = tokio::select! {
                () = stop.cancelled() => true,
                _ = readiness.wait_for(|r| !r.is_ready()) => false,
            };
            if stopping {
                ok &= pipeline.shutdown().await;
                break;
            }
            let why = match &*readiness.borrow() {
                Readiness::Waiting(why) => why.clone(),
                Readiness::Ready => String::new(),
            };
            tracing::error!(subscription = %self.sub.name, why, "the subscription stops here: in-flight records are left for the next owner, leases released, until the fleet's version can run here");
            ok &= pipeline.stop_now().await;
        }
        let _ = rollout.await;
        ok
    }
}

/// Binds the operations listeners the config asks for (one serving
/// everything, or metrics and admin apart) and serves them until
/// `ops_stop`.
///
/// # Errors
/// An address that cannot be bound, naming its config key.
async fn listen(
    config: &Config,
    state: &Arc<OpsState>,
    ops_stop: &CancellationToken,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let listeners = match config.admin.metrics_listen {
        None => vec![("admin", "admin.listen", config.admin.listen, Routes::All)],
        Some(metrics) => vec![
            ("metrics", "metrics.listen", Some(metrics), Routes::Read),
            ("admin", "admin.listen", config.admin.listen, Routes::Write),
        ],
    };
    let mut servers = Vec::new();
    for (name, key, addr, routes) in listeners {
        let Some(addr) = addr else { continue };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("{key}: cannot listen on {addr}"))?;
        let writes = routes != Routes::Read && config.admin.token.is_some();
        tracing::info!(addr = %listener.local_addr()?, writes, "{name} listening: {}", routes.describe());
        servers.push(tokio::spawn(ops::serve(
            listener,
            state.clone(),
            routes,
            ops_stop.clone(),
        )));
    }
    Ok(servers)
}

/// Opens the configured lease store.
///
/// # Errors
/// When it cannot be opened (a file store held by another process, a
/// DynamoDB table that does not exist).
pub(crate) async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn LeaseStore>> {
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
    Ok(store)
}

/// How long start-up keeps trying to reach Kinesis before it gives up.
const REACH_KINESIS_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Fails when the stream does not exist, naming the config key; an
/// unreachable endpoint is retried with backoff for [`REACH_KINESIS_FOR`],
/// then fails with the last error.
pub(crate) async fn check_stream(
    kinesis: &Kinesis,
    stream: &StreamName,
    key: &str,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + REACH_KINESIS_FOR;
    let mut backoff = crate::backoff::Backoff::new(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(5),
    );
    loop {
        match kinesis.describe_stream(stream).await {
            Ok(_) => return Ok(()),
            Err(KinesisError::NotFound(_)) => {
                anyhow::bail!("{key} {:?} does not exist", stream.as_str())
            }
            Err(e) => {
                if tokio::time::Instant::now() >= deadline {
                    anyhow::bail!(
                        "cannot reach Kinesis to check {key} {:?} (tried for {REACH_KINESIS_FOR:?}): {e}",
                        stream.as_str()
                    );
                }
                let wait = backoff.next_wait();
                tracing::warn!(stream = %stream, error = %e, ?wait, "cannot reach Kinesis yet; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
}
