//! The rollout stage: makes this instance run what its subscription's
//! fleet versions ([`crate::fleet_versions`], kept in the lease store) say — or
//! nothing — and turns every local way of changing a version (the plugin
//! file changing, the admin API) into a change of those versions, so the
//! whole fleet follows whichever instance it reached.
//!
//! # The fleet's version, or nothing
//! Every [`POLL`] (2 s), and at once after a change made here, the stage
//! reads the subscription's versions (one strongly consistent read: one
//! GetItem on DynamoDB, 30 a minute per instance and subscription) and,
//! when they differ from what the plugin slot runs, gets each version
//! they name and installs them together in the slot. A version is got,
//! in this order, from: the versions compiled here (the last [`KEPT`],
//! so a rollback is immediate); the compile cache, by its digest, under
//! the cache's trust rules; the artifact store ([`crate::artifacts`]:
//! every call bounded, the bytes checked against the digest), then
//! compiled off the hot path. A fetch that fails is tried again after a
//! jittered backoff of its own (1 s, doubling to 8 s), never sooner,
//! whatever polls come between.
//!
//! The stage publishes its [`Readiness`]: `Ready` once the slot runs the
//! fleet's stable version, `Waiting` (with the reason) while it cannot.
//! The supervisor runs the subscription's pipeline only while it is
//! ready: a waiting subscription **takes no lease** (so its shards stay
//! with instances that can run them), handles nothing, and `/readyz`
//! answers 503 naming it and the reason. So:
//! - **At start** it waits until the fleet's stable version is had. The
//!   config's `plugin` is only the first declaration of an empty fleet
//!   (see "The config's `plugin`" in [`crate::fleet_versions`]): it is never
//!   run because it is at hand.
//! - **While running**, a new stable version that cannot be had leaves
//!   the running version in place for at most [`SWITCH_WITHIN`] (a
//!   deploy's fetch and compile take time anyway, and a passing store
//!   error should not stop a fleet); past it the subscription stops here
//!   — in-flight records are left unsettled for the next owner, leases
//!   released — and waits for the version like a starting instance.
//! - A **canary's candidate or a shadow** whose bytes cannot be had never
//!   holds the stable version back: the instance runs without it (the
//!   candidate's share of the keys runs on the stable version),
//!   `shardlane_version_missing{role}` says so, and one line a minute
//!   names the version and the reason.
//!
//! Lanes switch at their next record or batch boundary, exactly as in a
//! hot swap, so no record is lost or handled twice because of a change.
//! `shardlane_version_failures_total` counts versions that could not be
//! had (fetched, checked or compiled).
//!
//! # No version without its bytes
//! A change made here that brings a version (a deploy or canary through
//! the admin API, a changed plugin file, the first declaration) validates
//! the bytes (they compile and link as this subscription's world), stores
//! them in the artifact store and reads them back by their digest
//! ([`ArtifactStore::publish`]) before it records anything; without an
//! artifact store (a DynamoDB fleet without `[artifacts] location`) only
//! the first declaration can be made, and every deploy is refused with
//! one line.
//!
//! # A canary that decides
//! See [`canary`]: counts kept in the lease store per canary and
//! instance (they outlive restarts), judged every [`DECIDE_EVERY`], and
//! decisions conditional on the canary's identity.
//!
//! Every call to a store here is bounded (the artifact store's deadlines,
//! the lease store's), and [`Rollout::run`] drops whatever is under way
//! at shutdown.
//!
//! Floor 10 (wiring) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod canary;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::artifacts::{ArtifactError, ArtifactStore};
use crate::backoff::Backoff;
use crate::filter::{Filter, FilterError, FilterText, filter_name};
use crate::fleet_versions::{
    CanaryRules, CanaryStart, Command, FleetVersions, Stored, VersionsError,
};
use crate::ids::{FilterDigest, OwnerId, PluginDigest, SubscriptionName};
use crate::key_slice::KeySlice;
use crate::lease::{LeaseError, LeaseStore, VersionsUpdateError, update_versions};
use crate::logging::LogGate;
use crate::plugin::{Plugin, PluginError};
use crate::reader::filter_feed::{ActiveFilter, FilterFeed};
use crate::slot::{Installed, PluginSlot};
use crate::telemetry::{Counter, Gauge, ShadowView, SubscriptionStatus, Telemetry};

/// How often an instance reads its subscriptions' fleet versions.
pub(crate) const POLL: Duration = Duration::from_secs(2);

/// How often a canary with rules is judged (see [`canary`]).
pub(crate) const DECIDE_EVERY: Duration = Duration::from_secs(6);

/// How long a running instance keeps its running version while it cannot
/// get the fleet's new stable one (module docs).
pub(crate) const SWITCH_WITHIN: Duration = Duration::from_secs(30);

/// Compiled versions kept at hand (the running ones and the latest
/// before them), so rolling back needs no fetch.
const KEPT: usize = 8;

/// The first wait before a failed fetch of a version is tried again.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// The longest wait between two fetches of a version that keep failing.
const RETRY_MAX: Duration = Duration::from_secs(8);

/// How often a version that cannot be had is logged.
const PROBLEM_LOG_EVERY: Duration = Duration::from_secs(60);

/// Why a change or a convergence did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RolloutError {
    /// The bytes are not a valid plugin for this subscription.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The rules refused the change.
    #[error(transparent)]
    Refused(#[from] VersionsError),
    /// The lease store failed.
    #[error(transparent)]
    Store(#[from] LeaseError),
    /// The artifact store failed, or holds other bytes.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// A fetch of the version failed lately; the next try waits.
    #[error("{digest}: {last} (tried again in {retry_in:?})")]
    Retrying {
        /// The version.
        digest: PluginDigest,
        /// Why the last try failed.
        last: String,
        /// When the next try comes.
        retry_in: Duration,
    },
    /// A version neither compiled here nor in an artifact store.
    #[error(
        "{0} is not on this instance and no [artifacts] location is configured to fetch it from"
    )]
    Unavailable(PluginDigest),
    /// A change that brings bytes, without an artifact store.
    #[error(
        "the config has no [artifacts] location: the fleet's instances could not fetch the new version (set location = \"s3://bucket/prefix\", \"oci://registry/repository\" or a shared folder)"
    )]
    NoStore,
    /// The config's plugin file is not the bytes compiled at start.
    #[error("the config's plugin {0}")]
    ConfigFile(String),
    /// A stored key fraction that is not one.
    #[error("the fleet's canary has key fraction {0}, which is not one")]
    Fraction(f64),
    /// The fleet's filter does not compile here.
    #[error("the fleet's filter {0}: {1}")]
    Filter(FilterDigest, FilterError),
}

impl From<VersionsUpdateError> for RolloutError {
    fn from(e: VersionsUpdateError) -> Self {
        match e {
            VersionsUpdateError::Refused(e) => Self::Refused(e),
            VersionsUpdateError::Store(e) => Self::Store(e),
        }
    }
}

/// Whether the subscription can run here (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Not (yet): why.
    Waiting(String),
    /// The slot runs the fleet's stable version.
    Ready,
}

impl Readiness {
    /// Whether it is [`Readiness::Ready`].
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready)
    }
}

/// The config's `plugin` and `canary`, compiled at start: what it
/// declares (see "The config's `plugin`" in [`crate::fleet_versions`]).
pub(crate) struct Declaration {
    /// The config's `plugin`.
    pub stable: Arc<Plugin>,
    /// The config's `filter`.
    pub filter: Option<Arc<Filter>>,
    /// The config's `canary`: its candidate, slice and rules.
    pub canary: Option<(Arc<Plugin>, KeySlice, CanaryRules)>,
    /// The host is its whole fleet (a memory or file lease store).
    pub lone: bool,
}

/// A version whose fetch failed: when it may be tried again.
struct Retry {
    at: Instant,
    backoff: Backoff,
    last: String,
}

/// The roles a version has beside the stable one.
#[derive(Debug, Clone, Copy)]
enum Role {
    Candidate,
    Shadow,
}

impl Role {
    fn label(self) -> &'static str {
        match self {
            Role::Candidate => "candidate",
            Role::Shadow => "shadow",
        }
    }
}

/// The stage's metrics.
struct Metrics {
    failures: Counter,
    /// 1 while the fleet's candidate (`[0]`) or shadow (`[1]`) cannot run
    /// here.
    missing: [Gauge; 2],
    /// Canaries rolled back (`[0]`) or promoted (`[1]`) here.
    decisions: [Counter; 2],
}

impl Metrics {
    fn new(telemetry: &Telemetry, sub: &str) -> Self {
        Self {
            failures: telemetry.counter(
                "shardlane_version_failures_total",
                "Times a version the fleet's versions name could not be fetched, checked or compiled here.",
                &[("subscription", sub)],
            ),
            missing: [Role::Candidate, Role::Shadow].map(|role| {
                telemetry.gauge(
                    "shardlane_version_missing",
                    "1 while the fleet's canary candidate or shadow (role) cannot run here: the candidate's keys run on the stable version, the shadow is not run.",
                    &[("subscription", sub), ("role", role.label())],
                )
            }),
            decisions: ["rollback", "promote"].map(|d| {
                telemetry.counter(
                    "shardlane_canary_decisions_total",
                    "Canaries rolled back or promoted by their rules (decision), as this instance applied them.",
                    &[("subscription", sub), ("decision", d)],
                )
            }),
        }
    }
}

/// One subscription's rollout stage (see the module docs).
pub(crate) struct Rollout {
    subscription: SubscriptionName,
    owner: OwnerId,
    store: Arc<dyn LeaseStore>,
    artifacts: Option<Arc<ArtifactStore>>,
    slot: Arc<PluginSlot>,
    declaration: Declaration,
    /// Compiled versions, oldest first.
    known: Mutex<VecDeque<Arc<Plugin>>>,
    /// The shadow candidate, compiled for a shadow.
    shadow_known: Mutex<Option<Arc<Plugin>>>,
    /// Versions whose fetch failed lately.
    retries: Mutex<HashMap<PluginDigest, Retry>>,
    /// The fleet's versions as the last poll read them.
    latest: Mutex<Option<FleetVersions>>,
    /// The config's declaration is made (or was not needed).
    declared: std::sync::atomic::AtomicBool,
    /// Since when the fleet's stable version has not run here while the
    /// subscription runs (module docs, `SWITCH_WITHIN`).
    switching: Mutex<Option<(PluginDigest, Instant)>>,
    readiness: watch::Sender<Readiness>,
    problem_log: Mutex<LogGate>,
    missing_log: Mutex<LogGate>,
    metrics: Metrics,
    status: Arc<SubscriptionStatus>,
    tally: canary::Tally,
    /// The filter the readers apply: the fleet's stable version's.
    filter: watch::Sender<Arc<ActiveFilter>>,
    telemetry: Arc<Telemetry>,
}

impl Rollout {
    /// The stage of `slot`'s subscription on this instance (`owner`),
    /// with the config's `declaration`.
    pub(crate) fn new(
        slot: Arc<PluginSlot>,
        store: Arc<dyn LeaseStore>,
        artifacts: Option<Arc<ArtifactStore>>,
        owner: OwnerId,
        declaration: Declaration,
        telemetry: &Arc<Telemetry>,
    ) -> Self {
        let subscription = declaration.stable.subscription().clone();
        let known = declaration
            .canary
            .iter()
            .map(|(p, _, _)| p.clone())
            .chain([declaration.stable.clone()])
            .collect();
        let waiting = "starting: reading the fleet's versions".to_owned();
        // Replaced by the fleet's before the subscription runs (`converge`).
        let filter = watch::Sender::new(Arc::new(ActiveFilter::new(
            telemetry,
            &subscription,
            declaration.stable.digest(),
            declaration.filter.clone(),
        )));
        let status = telemetry.subscription(&subscription, String::new());
        status.set_waiting(Some(waiting.clone()));
        Self {
            metrics: Metrics::new(telemetry, subscription.as_str()),
            status,
            subscription,
            owner,
            store,
            artifacts,
            slot,
            declaration,
            known: Mutex::new(known),
            shadow_known: Mutex::new(None),
            retries: Mutex::new(HashMap::new()),
            latest: Mutex::new(None),
            declared: std::sync::atomic::AtomicBool::new(false),
            switching: Mutex::new(None),
            readiness: watch::Sender::new(Readiness::Waiting(waiting)),
            problem_log: Mutex::new(LogGate::every(PROBLEM_LOG_EVERY)),
            missing_log: Mutex::new(LogGate::every(PROBLEM_LOG_EVERY)),
            tally: canary::Tally::default(),
            filter,
            telemetry: telemetry.clone(),
        }
    }

    /// The filter the subscription's readers apply, as the fleet's
    /// versions change it.
    pub(crate) fn filter_feed(&self) -> FilterFeed {
        self.filter.subscribe()
    }

    /// Whether the subscription can run here, as it changes.
    pub(crate) fn readiness(&self) -> watch::Receiver<Readiness> {
        self.readiness.subscribe()
    }

    /// The stable version's digest as it runs here.
    pub(crate) fn running(&self) -> String {
        self.slot.current().digest().to_string()
    }

    fn set_readiness(&self, readiness: Readiness) {
        self.status.set_waiting(match &readiness {
            Readiness::Waiting(why) => Some(why.clone()),
            Readiness::Ready => None,
        });
        self.readiness.send_if_modified(|now| {
            let changed = *now != readiness;
            *now = readiness;
            changed
        });
    }

    fn keep(&self, plugin: Arc<Plugin>) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|p| p.digest() != plugin.digest());
        known.push_back(plugin);
        while known.len() > KEPT {
            known.pop_front();
        }
    }

    fn compiled(&self, digest: &PluginDigest) -> Option<Arc<Plugin>> {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.iter().find(|p| p.digest() == digest).cloned()
    }

    /// The compiled version `digest` (module docs, the order it is got
    /// in); `shadow` compiles it as a shadow candidate.
    async fn plugin(
        &self,
        digest: &PluginDigest,
        shadow: bool,
    ) -> Result<Arc<Plugin>, RolloutError> {
        let kept = if shadow {
            self.shadow_known
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .filter(|p| p.digest() == digest)
        } else {
            self.compiled(digest)
        };
        if let Some(plugin) = kept {
            return Ok(plugin);
        }
        let plugin = match self.slot.cached(digest, shadow).await {
            Some(plugin) => plugin,
            None => {
                let (bytes, origin) = self.fetch(digest).await?;
                if shadow {
                    self.slot.prepare_shadow(bytes, &origin).await?
                } else {
                    self.slot.prepare(bytes, &origin).await?
                }
            }
        };
        if shadow {
            *self.shadow_known.lock().unwrap_or_else(|e| e.into_inner()) = Some(plugin.clone());
        } else {
            self.keep(plugin.clone());
        }
        Ok(plugin)
    }

    /// The bytes of `digest` from the artifact store (checked there), and
    /// where they came from; a fetch that failed lately waits for its
    /// backoff (module docs).
    async fn fetch(&self, digest: &PluginDigest) -> Result<(Vec<u8>, String), RolloutError> {
        let artifacts = self
            .artifacts
            .as_ref()
            .ok_or_else(|| RolloutError::Unavailable(digest.clone()))?;
        if let Some(retry) = self
            .retries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(digest)
            && retry.at > Instant::now()
        {
            return Err(RolloutError::Retrying {
                digest: digest.clone(),
                last: retry.last.clone(),
                retry_in: retry.at - Instant::now(),
            });
        }
        match artifacts.fetch(digest).await {
            Ok(bytes) => {
                self.retries
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(digest);
                Ok((
                    bytes,
                    format!("{} ({})", artifacts.location(), digest.short()),
                ))
            }
            Err(e) => {
                let mut retries = self.retries.lock().unwrap_or_else(|e| e.into_inner());
                let retry = retries.entry(digest.clone()).or_insert_with(|| Retry {
                    at: Instant::now(),
                    backoff: Backoff::new(RETRY_FIRST, RETRY_MAX),
                    last: String::new(),
                });
                retry.at = Instant::now() + retry.backoff.next_wait();
                retry.last = self.with_fleet_store(&e.to_string());
                Err(e.into())
            }
        }
    }

    /// `why`, with the fleet's store named when this instance reads
    /// another (its `[artifacts]` differs from the fleet's).
    fn with_fleet_store(&self, why: &str) -> String {
        let fleet = self
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|v| v.artifacts.clone());
        match (fleet, &self.artifacts) {
            (Some(fleet), Some(ours)) if fleet != ours.location() => format!(
                "{why} (the fleet's versions are kept in {fleet}; this instance's [artifacts] is {})",
                ours.location()
            ),
            _ => why.to_owned(),
        }
    }

    /// Validates `bytes` as a version of this subscription (as a shadow
    /// candidate with `shadow`), keeps them compiled, stores them in the
    /// artifact store and reads them back (module docs, "No version
    /// without its bytes").
    async fn publish(
        &self,
        bytes: Vec<u8>,
        origin: &str,
        shadow: bool,
    ) -> Result<Stored, RolloutError> {
        let artifacts = self.artifacts.as_ref().ok_or(RolloutError::NoStore)?;
        let plugin = if shadow {
            self.slot.prepare_shadow(bytes.clone(), origin).await?
        } else {
            self.slot.prepare(bytes.clone(), origin).await?
        };
        let digest = artifacts.publish(bytes).await?;
        if shadow {
            *self.shadow_known.lock().unwrap_or_else(|e| e.into_inner()) = Some(plugin);
        } else {
            self.keep(plugin);
        }
        Ok(Stored {
            digest,
            location: Some(artifacts.location()),
        })
    }

    /// Applies `command` to the fleet's versions and converges at once.
    ///
    /// # Errors
    /// The rules' refusal or the store's failure; nothing changed then.
    pub(crate) async fn change(
        &self,
        command: Command,
        origin: &str,
    ) -> Result<FleetVersions, RolloutError> {
        let by = format!("{origin} on {}", self.owner);
        let versions = update_versions(&*self.store, &self.subscription, command, &by).await?;
        self.converge_now().await;
        Ok(versions)
    }

    /// A new stable version (or, with `canary`, a candidate on that slice
    /// of the keys) from `bytes`, for the whole fleet.
    ///
    /// # Errors
    /// Invalid bytes, no artifact store, a refused change, a failed store.
    pub(crate) async fn deploy(
        &self,
        bytes: Vec<u8>,
        canary: Option<(KeySlice, CanaryRules)>,
        origin: &str,
    ) -> Result<FleetVersions, RolloutError> {
        let stored = self.publish(bytes, origin, false).await?;
        let command = match canary {
            None => Command::Deploy(stored),
            Some((slice, rules)) => Command::Canary(CanaryStart {
                candidate: stored,
                key_fraction: slice.fraction(),
                rules,
            }),
        };
        self.change(command, origin).await
    }

    /// The stable version's filter set to `filter` (`None`: none), for the
    /// whole fleet; the plugin stays.
    ///
    /// # Errors
    /// A refused change (a canary runs, nothing deployed), a failed store.
    pub(crate) async fn deploy_filter(
        &self,
        filter: Option<FilterText>,
        origin: &str,
    ) -> Result<FleetVersions, RolloutError> {
        let command = Command::DeployFilter {
            filter,
            plugin: None,
        };
        self.change(command, origin).await
    }

    /// The digest of the filter in force here (`none` without one).
    pub(crate) fn filter_in_force(&self) -> String {
        filter_name(self.filter.borrow().filter.as_ref().map(|f| f.digest()))
    }

    /// A shadow candidate from `bytes`, for the whole fleet.
    ///
    /// # Errors
    /// As [`Self::deploy`].
    pub(crate) async fn deploy_shadow(
        &self,
        bytes: Vec<u8>,
        origin: &str,
    ) -> Result<FleetVersions, RolloutError> {
        let stored = self.publish(bytes, origin, true).await?;
        self.change(Command::Shadow(stored), origin).await
    }

    /// The config's plugin as stored for the fleet: its file read again
    /// (it must still be the bytes compiled at start), published when
    /// there is an artifact store.
    async fn publish_config(&self, plugin: &Plugin) -> Result<Stored, RolloutError> {
        let path = plugin.path().to_owned();
        let bytes = crate::files::on_thread("plugin-read", move || {
            crate::files::read_regular(&path, crate::files::MAX_PLUGIN_BYTES)
        })
        .await
        .map_err(|e| RolloutError::ConfigFile(format!("{}: {e}", plugin.path().display())))?
        .map_err(|e| RolloutError::ConfigFile(format!("{}: {e}", plugin.path().display())))?;
        if PluginDigest::of(&bytes) != *plugin.digest() {
            return Err(RolloutError::ConfigFile(format!(
                "{} changed since it was compiled at start",
                plugin.path().display()
            )));
        }
        match &self.artifacts {
            Some(artifacts) => Ok(Stored {
                digest: artifacts.publish(bytes).await?,
                location: Some(artifacts.location()),
            }),
            None => Ok(plugin.digest().clone().into()),
        }
    }

    /// Declares the config's plugin, filter (and canary) as the first
    /// versions of the empty fleet — or only its filter into versions
    /// recorded before filters were part of them (`read`: the fleet's
    /// versions as read); returns the fleet's versions after (another
    /// instance's declaration, when it came first).
    async fn declare(&self, read: &FleetVersions) -> Result<FleetVersions, RolloutError> {
        // A non-lone fleet with versions declares only its filter (versions
        // from before filters were part of them): no bytes to store.
        let filter_only = !self.declaration.lone && read.stable.is_some();
        let stable = if filter_only {
            self.declaration.stable.digest().clone().into()
        } else {
            self.publish_config(&self.declaration.stable).await?
        };
        let canary = match &self.declaration.canary {
            Some(_) if filter_only => None,
            Some((plugin, slice, rules)) => Some(CanaryStart {
                candidate: self.publish_config(plugin).await?,
                key_fraction: slice.fraction(),
                rules: rules.clone(),
            }),
            None => None,
        };
        let by = format!("config on {}", self.owner);
        let command = Command::Declare {
            stable,
            filter: self.declaration.filter.as_ref().map(|f| f.text().clone()),
            canary,
            lone: self.declaration.lone,
        };
        match update_versions(&*self.store, &self.subscription, command, &by).await {
            Ok(versions) => Ok(versions),
            Err(VersionsUpdateError::Refused(VersionsError::Unchanged(_))) => Ok(self
                .store
                .read_versions(&self.subscription)
                .await?
                .unwrap_or_default()),
            Err(e) => Err(e.into()),
        }
    }

    /// Converges, logging what fails; the poll loop calls it.
    async fn converge_now(&self) {
        self.status.set_shadow(self.slot.shadow().map(
            |(digest, [calls, dropped, outcome, output, state])| ShadowView {
                digest: digest.to_string(),
                calls,
                dropped,
                outcome,
                output,
                state,
            },
        ));
        match self.converge().await {
            Ok(()) => self.status.set_version_problem(None),
            Err(e) => {
                let problem = self.with_fleet_store(&e.to_string());
                self.status.set_version_problem(Some(problem.clone()));
                let gate = self
                    .problem_log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .note(Instant::now());
                if let Some(suppressed) = gate {
                    let running = self.slot.current().digest().clone();
                    let ready = self.readiness.borrow().is_ready();
                    tracing::error!(subscription = %self.subscription, error = %problem, running = %running, runs_here = ready, suppressed, "cannot run the fleet's versions here (logged at most once a minute)");
                }
            }
        }
    }

    /// Makes the slot run what the fleet's versions say, declaring the
    /// config's plugin into an empty fleet; sets the readiness.
    ///
    /// # Errors
    /// The store unreadable, or the stable version that cannot be had: the
    /// slot is left as it was.
    pub(crate) async fn converge(&self) -> Result<(), RolloutError> {
        let since = Instant::now();
        let versions = match self.read().await {
            Ok(versions) => versions,
            Err(e) => {
                self.not_running(None, &e);
                return Err(e);
            }
        };
        self.status.set_history(&versions.history);
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(versions.clone());
        let Some(stable) = versions.stable.clone() else {
            let e = RolloutError::Refused(VersionsError::NothingDeployed);
            self.not_running(None, &e);
            return Err(e);
        };
        let stable = match self.plugin(&stable, false).await {
            Ok(plugin) => plugin,
            Err(e) => {
                self.metrics.failures.inc();
                self.not_running(Some(&stable), &e);
                return Err(e);
            }
        };
        let filter = match self.fleet_filter(&versions) {
            Ok(filter) => filter,
            Err(e) => {
                self.metrics.failures.inc();
                self.not_running(Some(stable.digest()), &e);
                return Err(e);
            }
        };
        let version = stable.digest().clone();
        let installed = Installed {
            stable,
            canary: self.candidate(&versions).await,
            shadow: self.shadow(&versions).await,
        };
        self.slot.set(installed, "fleet versions", since).await;
        self.install_filter(&version, filter);
        *self.switching.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.set_readiness(Readiness::Ready);
        Ok(())
    }

    /// The fleet's stable filter, compiled (the one in force, when it is
    /// that one).
    fn fleet_filter(&self, versions: &FleetVersions) -> Result<Option<Arc<Filter>>, RolloutError> {
        let Some(text) = versions.stable_filter()? else {
            return Ok(None);
        };
        if let Some(filter) = &self.filter.borrow().filter
            && filter.digest() == &text.digest
        {
            return Ok(Some(filter.clone()));
        }
        let filter = text
            .compile()
            .map_err(|e| RolloutError::Filter(text.digest.clone(), e))?;
        Ok(Some(Arc::new(filter)))
    }

    /// Puts `filter`, of the version whose plugin is `version`, in force
    /// (the readers take it at their next page).
    fn install_filter(&self, version: &PluginDigest, filter: Option<Arc<Filter>>) {
        self.filter.send_if_modified(|active| {
            if active.is(version, filter.as_deref()) {
                return false;
            }
            if active.filter.as_ref().map(|f| f.digest()) != filter.as_ref().map(|f| f.digest()) {
                let name = filter_name(filter.as_ref().map(|f| f.digest()));
                tracing::info!(subscription = %self.subscription, filter = %name, "the fleet's filter is in force here");
            }
            *active = Arc::new(ActiveFilter::new(
                &self.telemetry,
                &self.subscription,
                version,
                filter.clone(),
            ));
            true
        });
    }

    /// The fleet's versions, the config's declaration made first (once:
    /// see "The config's `plugin`" in [`crate::fleet_versions`]).
    async fn read(&self) -> Result<FleetVersions, RolloutError> {
        use std::sync::atomic::Ordering;
        let versions = self
            .store
            .read_versions(&self.subscription)
            .await?
            .unwrap_or_default();
        let declares =
            self.declaration.lone || versions.stable.is_none() || !versions.filter_declared;
        if self.declared.load(Ordering::Relaxed) || !declares {
            if !self.declared.swap(true, Ordering::Relaxed) {
                self.config_differs(&versions);
            }
            return Ok(versions);
        }
        let versions = self.declare(&versions).await?;
        self.declared.store(true, Ordering::Relaxed);
        self.config_differs(&versions);
        Ok(versions)
    }

    /// Says once, at start, when the config's plugin is not what the
    /// fleet runs.
    fn config_differs(&self, versions: &FleetVersions) {
        let config = self.declaration.stable.digest();
        if let Some(stable) = &versions.stable
            && stable != config
        {
            tracing::warn!(subscription = %self.subscription, config = %config, fleet = %stable, "the config's plugin is not the fleet's version: running the fleet's (`shardlane versions` shows the history; deploy or roll back to change it)");
        }
        let config = self.declaration.filter.as_ref().map(|f| f.digest());
        if versions.stable.is_some() && config != versions.filter.as_ref() {
            tracing::warn!(subscription = %self.subscription, config = %filter_name(config), fleet = %filter_name(versions.filter.as_ref()), "the config's filter is not the fleet's: applying the fleet's (`shardlane versions` shows the history; `shardlane deploy --filter` or roll back to change it)");
        }
    }

    /// The fleet's stable version `wanted` (or, `None`, none at all) cannot
    /// run here because of `e`: the subscription waits, at once when it
    /// does not run, past [`SWITCH_WITHIN`] when it runs an earlier
    /// version (module docs).
    fn not_running(&self, wanted: Option<&PluginDigest>, e: &RolloutError) {
        let why = self.with_fleet_store(&e.to_string());
        if !self.readiness.borrow().is_ready() {
            self.set_readiness(Readiness::Waiting(why));
            return;
        }
        let Some(wanted) = wanted else {
            // The versions could not be read: the running version stays.
            return;
        };
        let mut switching = self.switching.lock().unwrap_or_else(|e| e.into_inner());
        let since = match &*switching {
            Some((digest, since)) if digest == wanted => *since,
            _ => {
                *switching = Some((wanted.clone(), Instant::now()));
                Instant::now()
            }
        };
        if since.elapsed() >= SWITCH_WITHIN {
            drop(switching);
            tracing::error!(subscription = %self.subscription, wanted = %wanted, running = %self.slot.current().digest(), error = %why, "the fleet's version cannot run here for {SWITCH_WITHIN:?}: the subscription stops here until it can (its shards go to instances that can run it)");
            self.set_readiness(Readiness::Waiting(format!(
                "the fleet's version {wanted} cannot run here: {why}"
            )));
        }
    }

    /// The fleet's canary, when its candidate can be had here; the
    /// candidate's share runs on the stable version otherwise (module
    /// docs).
    async fn candidate(&self, versions: &FleetVersions) -> Option<(Arc<Plugin>, KeySlice, u64)> {
        let Some(plan) = &versions.canary else {
            self.metrics.missing[0].set(0);
            return None;
        };
        let slice = KeySlice::new(plan.key_fraction);
        let got = match slice {
            Some(slice) => self
                .plugin(&plan.candidate, false)
                .await
                .map(|p| (p, slice, plan.id)),
            None => Err(RolloutError::Fraction(plan.key_fraction)),
        };
        self.optional(Role::Candidate, &plan.candidate, got)
    }

    /// The fleet's shadow, when it can be had here.
    async fn shadow(&self, versions: &FleetVersions) -> Option<(Arc<Plugin>, u64)> {
        let Some(digest) = &versions.shadow else {
            self.metrics.missing[1].set(0);
            return None;
        };
        let got = self
            .plugin(digest, true)
            .await
            .map(|p| (p, versions.shadow_id));
        self.optional(Role::Shadow, digest, got)
    }

    /// A candidate's or shadow's version as got: counted and logged once
    /// an interval when it cannot be had.
    fn optional<T>(
        &self,
        role: Role,
        digest: &PluginDigest,
        got: Result<T, RolloutError>,
    ) -> Option<T> {
        let missing = &self.metrics.missing[role as usize];
        match got {
            Ok(got) => {
                missing.set(0);
                Some(got)
            }
            Err(e) => {
                missing.set(1);
                if !matches!(e, RolloutError::Retrying { .. }) {
                    self.metrics.failures.inc();
                }
                let gate = self
                    .missing_log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .note(Instant::now());
                if let Some(suppressed) = gate {
                    let role = role.label();
                    tracing::warn!(subscription = %self.subscription, role, version = %digest, error = %self.with_fleet_store(&e.to_string()), suppressed, "the fleet's {role} cannot run here: running without it (a candidate's keys run on the stable version); logged at most once a minute");
                }
                None
            }
        }
    }

    /// Converges every [`POLL`] (a local change converges at once), judges a
    /// canary every [`DECIDE_EVERY`], and deploys each change of the
    /// plugin file, until `shutdown` (which drops any call under way).
    pub(crate) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let (changed_tx, mut changed) = mpsc::channel(4);
        let watcher = tokio::spawn(self.slot.clone().watch(shutdown.clone(), changed_tx));
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut judge = tokio::time::interval(DECIDE_EVERY);
        judge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let work = async {
                tokio::select! {
                    _ = tick.tick() => self.converge_now().await,
                    _ = judge.tick() => self.judge().await,
                    file = changed.recv() => match file {
                        Some((bytes, detected)) => self.file_changed(bytes, detected).await,
                        None => return false,
                    },
                }
                true
            };
            let go_on = tokio::select! {
                () = shutdown.cancelled() => false,
                go_on = work => go_on,
            };
            if !go_on {
                break;
            }
        }
        let _ = watcher.await;
    }

    async fn file_changed(&self, bytes: Vec<u8>, detected: Instant) {
        let stored = match self.publish(bytes, "file", false).await {
            Ok(stored) => stored,
            Err(e) => {
                tracing::error!(subscription = %self.subscription, error = %e, "plugin file changed but is refused; the running version stays");
                return;
            }
        };
        match self.change(Command::Deploy(stored), "file").await {
            Ok(_) => {
                tracing::info!(subscription = %self.subscription, since_file_change_ms = detected.elapsed().as_millis() as u64, "plugin file change is live");
            }
            Err(e) => {
                tracing::error!(subscription = %self.subscription, error = %e, "plugin file changed but the change was not recorded; the running version stays");
            }
        }
    }
}

#[cfg(test)]
mod tests;
