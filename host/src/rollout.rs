//! The rollout stage: makes this instance run what its subscription's
//! fleet versions ([`crate::versions`], kept in the lease store) say, and
//! turns every local way of changing a version — the config at start, the
//! plugin file changing, the admin API — into a change of those versions,
//! so the whole fleet follows whichever instance it reached.
//!
//! # Converging
//! Every [`POLL`] (2 s), and at once after a change made here, the stage
//! reads the subscription's versions (one strongly consistent read: one
//! GetItem on DynamoDB, 30 a minute per instance and subscription) and,
//! when they differ from what the plugin slot runs, gets each version it
//! names — compiled already (the last [`KEPT`] versions stay compiled, so a
//! rollback is immediate), or fetched from the artifact store
//! ([`crate::artifacts`], which checks the digest) and compiled off the
//! hot path — and installs them together in the slot. Lanes switch at
//! their next record or batch boundary, exactly as in a hot swap, so no
//! record is lost or handled twice because of a change. An instance
//! follows a change within a poll plus the fetch and compile: about 2–3 s
//! for a component compiled before (the compile cache), more for one
//! compiled for the first time.
//!
//! A version that cannot be had — missing from the store, other bytes
//! under its digest, too large, not a valid plugin — is never run: the
//! slot keeps what it runs, `shardlane_version_failures_total` counts the
//! failure, one line a minute at most says which version and why, and the
//! next poll tries again. Records keep flowing through the running
//! version meanwhile.
//!
//! # A canary that decides
//! A canary with rules (`rollback_failure_rate`, `min_records`,
//! `promote_after`; see [`crate::versions::CanaryPlan::decide`]) is judged
//! on the whole fleet's figures: each instance counts, since the canary
//! began there, the records each version handled and how many failed
//! (retry, reject, trap, timeout), and publishes them with its heartbeat
//! (the rollout stage sets them at each poll; the keeper sends them every
//! `renew_every`). Every [`DECIDE_EVERY`] each instance reads the
//! heartbeats (one Query), sums the counts for the running candidate, and
//! applies what the rules say (to the canary the last poll read) as a
//! change of the fleet's versions
//! (`auto-rollback` or `auto-promote`, with the figures in the history, a
//! log line and `shardlane_canary_decisions_total`). Any instance may
//! decide; the change names its candidate and is written conditionally,
//! so only the first lands and the others find nothing left to decide.
//! The lanes switch at their next record or batch, as in a swap: nothing
//! is lost or handled twice. A decision lags the fleet's counts by at
//! most a heartbeat plus [`DECIDE_EVERY`].
//!
//! # At start
//! Before the pipeline reads anything: the config's `plugin` (and its
//! `canary`) are declared — stored in the artifact store and recorded, if
//! the fleet has never seen those bytes (see "Which wins" in
//! [`crate::versions`]) — then the stage converges once, so an instance
//! that starts or restarts runs what the store says from its first record.
//!
//! Floor 10 (wiring) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::time::Instant;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::artifacts::{ArtifactError, ArtifactStore};
use crate::ids::{PluginDigest, StreamName, SubscriptionName};
use crate::key_slice::KeySlice;
use crate::lease::{LeaseError, LeaseStore, VersionsUpdateError, update_versions};
use crate::logging::LogGate;
use crate::plugin::{Plugin, PluginError};
use crate::swap::PluginSlot;
use crate::telemetry::{Counter, ShadowView, SubscriptionStatus, Telemetry};
use crate::versions::{
    CanaryCounts, CanaryReport, CanaryRules, Command, Decision, FleetVersions, VersionsError,
};

/// How often an instance reads its subscriptions' fleet versions.
pub(crate) const POLL: Duration = Duration::from_secs(2);

/// How often a canary with rules is judged (see "A canary that decides").
pub(crate) const DECIDE_EVERY: Duration = Duration::from_secs(6);

/// Compiled versions kept at hand (the running ones and the latest
/// before them), so rolling back needs no fetch.
const KEPT: usize = 8;

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
    /// A version neither compiled here nor in an artifact store.
    #[error(
        "{0} is not on this instance and no [artifacts] location is configured to fetch it from"
    )]
    Unavailable(PluginDigest),
    /// A stored key fraction that is not one.
    #[error("the fleet's canary has key fraction {0}, which is not one")]
    Fraction(f64),
}

impl From<VersionsUpdateError> for RolloutError {
    fn from(e: VersionsUpdateError) -> Self {
        match e {
            VersionsUpdateError::Refused(e) => Self::Refused(e),
            VersionsUpdateError::Store(e) => Self::Store(e),
        }
    }
}

/// One subscription's rollout stage (see the module docs).
pub(crate) struct Rollout {
    subscription: SubscriptionName,
    /// Who this instance is, in the history.
    by: String,
    store: Arc<dyn LeaseStore>,
    artifacts: Option<Arc<dyn ArtifactStore>>,
    slot: Arc<PluginSlot>,
    /// Compiled versions, oldest first.
    known: Mutex<VecDeque<Arc<Plugin>>>,
    /// The shadow candidate, compiled for a shadow.
    shadow_known: Mutex<Option<Arc<Plugin>>>,
    /// The fleet's versions as the last poll read them.
    latest: Mutex<Option<FleetVersions>>,
    /// Converge now (a change was made here).
    wake: Notify,
    problem_log: Mutex<LogGate>,
    failures: Counter,
    status: Arc<SubscriptionStatus>,
    /// The stream the subscription reads (whose heartbeats carry the
    /// fleet's canary counts).
    stream: StreamName,
    /// This instance's canary counts, for the heartbeat.
    report: Arc<CanaryReport>,
    decisions: [Counter; 2],
}

impl Rollout {
    /// The stage of `slot`'s subscription, owner `by`.
    pub(crate) fn new(
        slot: Arc<PluginSlot>,
        stream: StreamName,
        store: Arc<dyn LeaseStore>,
        artifacts: Option<Arc<dyn ArtifactStore>>,
        by: String,
        telemetry: &Telemetry,
    ) -> Self {
        let (stable, canary) = slot.running();
        let subscription = stable.subscription().clone();
        let subscription_name = subscription.clone();
        let failures = telemetry.counter(
            "shardlane_version_failures_total",
            "Times a version the fleet's versions name could not be fetched, checked or compiled here (the running version stays).",
            &[("subscription", subscription.as_str())],
        );
        Self {
            subscription,
            by,
            store,
            artifacts,
            slot,
            known: Mutex::new(canary.into_iter().map(|(p, _)| p).chain([stable]).collect()),
            shadow_known: Mutex::new(None),
            latest: Mutex::new(None),
            wake: Notify::new(),
            problem_log: Mutex::new(LogGate::every(PROBLEM_LOG_EVERY)),
            failures,
            status: telemetry.subscription(&subscription_name, String::new()),
            stream,
            report: Arc::new(CanaryReport::default()),
            decisions: ["rollback", "promote"].map(|d| {
                telemetry.counter(
                    "shardlane_canary_decisions_total",
                    "Canaries rolled back or promoted by their rules (decision), as this instance applied them.",
                    &[("subscription", subscription_name.as_str()), ("decision", d)],
                )
            }),
        }
    }

    /// This instance's canary counts, for the keeper's heartbeat.
    pub(crate) fn canary_report(&self) -> Arc<CanaryReport> {
        self.report.clone()
    }

    /// Judges a canary with rules on the fleet's counts (see "A canary
    /// that decides"); applies the decision.
    async fn decide(&self) -> Result<(), RolloutError> {
        // The versions the last poll read (at most a poll old): the
        // decision is written conditionally on its candidate anyway.
        let plan = self
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|v| v.canary.clone());
        let Some(plan) = plan else {
            return Ok(());
        };
        let rules = &plan.rules;
        if rules.rollback_failure_rate.is_none() && rules.promote_after_ms.is_none() {
            return Ok(());
        }
        let survey = self.store.survey(&self.subscription, &self.stream).await?;
        let mut fleet = CanaryCounts::default();
        for beat in &survey.heartbeats {
            if let Some(counts) = &beat.load.canary
                && counts.candidate.as_ref() == Some(&plan.candidate)
            {
                fleet.add(counts);
            }
        }
        let (command, which, note) = match plan.decide(&fleet, crate::clock::now_ms()) {
            Decision::Wait => return Ok(()),
            Decision::Rollback(note) => (
                Command::AutoRollback {
                    candidate: plan.candidate.clone(),
                    note: note.clone(),
                },
                0,
                note,
            ),
            Decision::Promote(note) => (
                Command::AutoPromote {
                    candidate: plan.candidate.clone(),
                    note: note.clone(),
                },
                1,
                note,
            ),
        };
        match self.change(command, "canary rules").await {
            Ok(_) => {
                self.decisions[which].inc();
                let decision = ["rolled back", "promoted"][which];
                tracing::warn!(subscription = %self.subscription, candidate = %plan.candidate, decision, figures = %note, "canary {decision} by its rules");
                Ok(())
            }
            // Another instance decided first.
            Err(RolloutError::Refused(VersionsError::NoCanary)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The stable version's digest as it runs here.
    pub(crate) fn running(&self) -> String {
        self.slot.current().digest().to_string()
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

    /// The compiled version `digest`: kept here, or fetched and compiled.
    async fn plugin(&self, digest: &PluginDigest) -> Result<Arc<Plugin>, RolloutError> {
        if let Some(plugin) = self.compiled(digest) {
            return Ok(plugin);
        }
        let (bytes, origin) = self.fetch(digest).await?;
        let plugin = self.slot.prepare(bytes, &origin).await?;
        self.keep(plugin.clone());
        Ok(plugin)
    }

    /// The bytes of `digest` from the artifact store (checked there), and
    /// where they came from.
    async fn fetch(&self, digest: &PluginDigest) -> Result<(Vec<u8>, String), RolloutError> {
        let artifacts = self
            .artifacts
            .as_ref()
            .ok_or_else(|| RolloutError::Unavailable(digest.clone()))?;
        let bytes = artifacts.fetch(digest).await?;
        Ok((
            bytes,
            format!("{} ({})", artifacts.location(), digest.short()),
        ))
    }

    /// The shadow candidate `digest`, compiled for a shadow (outbound HTTP
    /// limited to safe methods): kept here, or fetched and compiled.
    async fn shadow_plugin(&self, digest: &PluginDigest) -> Result<Arc<Plugin>, RolloutError> {
        let kept = self
            .shadow_known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .filter(|p| p.digest() == digest);
        if let Some(plugin) = kept {
            return Ok(plugin);
        }
        let (bytes, origin) = self.fetch(digest).await?;
        let plugin = self.slot.prepare_shadow(bytes, &origin).await?;
        *self.shadow_known.lock().unwrap_or_else(|e| e.into_inner()) = Some(plugin.clone());
        Ok(plugin)
    }

    /// A shadow candidate from `bytes`, for the whole fleet.
    ///
    /// # Errors
    /// Invalid bytes, a failed store.
    pub(crate) async fn deploy_shadow(
        &self,
        bytes: Vec<u8>,
        origin: &str,
    ) -> Result<FleetVersions, RolloutError> {
        let plugin = self.slot.prepare_shadow(bytes.clone(), origin).await?;
        let digest = plugin.digest().clone();
        *self.shadow_known.lock().unwrap_or_else(|e| e.into_inner()) = Some(plugin);
        if let Some(artifacts) = &self.artifacts {
            artifacts.store(bytes).await?;
        }
        self.change(Command::Shadow(digest), origin).await
    }

    /// Validates `bytes` (so nothing invalid is ever recorded), keeps them
    /// compiled, and stores them in the artifact store for the fleet.
    async fn publish(&self, bytes: Vec<u8>, origin: &str) -> Result<PluginDigest, RolloutError> {
        let plugin = self.slot.prepare(bytes.clone(), origin).await?;
        let digest = plugin.digest().clone();
        self.keep(plugin);
        if let Some(artifacts) = &self.artifacts {
            artifacts.store(bytes).await?;
        }
        Ok(digest)
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
        let by = format!("{origin} on {}", self.by);
        let versions = update_versions(&*self.store, &self.subscription, command, &by).await?;
        self.converge_now().await;
        Ok(versions)
    }

    /// A new stable version (or, with `canary`, a candidate on that slice
    /// of the keys) from `bytes`, for the whole fleet.
    ///
    /// # Errors
    /// Invalid bytes, a refused change, a failed store.
    pub(crate) async fn deploy(
        &self,
        bytes: Vec<u8>,
        canary: Option<(KeySlice, CanaryRules)>,
        origin: &str,
    ) -> Result<FleetVersions, RolloutError> {
        let digest = self.publish(bytes, origin).await?;
        let command = match canary {
            None => Command::Deploy(digest),
            Some((slice, rules)) => Command::Canary {
                candidate: digest,
                key_fraction: slice.fraction(),
                rules,
            },
        };
        self.change(command, origin).await
    }

    /// Converges, logging what fails; the poll loop and local changes call
    /// it.
    async fn converge_now(&self) {
        self.report.set(self.slot.canary_counts());
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
                self.failures.inc();
                self.status.set_version_problem(Some(format!(
                    "the fleet's versions cannot run here; running {}: {e}",
                    self.slot.current().digest().short()
                )));
                let gate = self
                    .problem_log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .note(std::time::Instant::now());
                if let Some(suppressed) = gate {
                    let running = self.slot.current().digest().clone();
                    tracing::error!(subscription = %self.subscription, error = %e, running = %running, suppressed, "cannot run the fleet's versions; the running version stays (logged at most once a minute)");
                }
            }
        }
    }

    /// Makes the slot run what the fleet's versions say (nothing when the
    /// store has none yet).
    ///
    /// # Errors
    /// The store unreadable, or a version that cannot be had: nothing
    /// changes then.
    pub(crate) async fn converge(&self) -> Result<(), RolloutError> {
        let since = Instant::now();
        let Some(versions) = self.store.read_versions(&self.subscription).await? else {
            return Ok(());
        };
        self.status.set_history(&versions.history);
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(versions.clone());
        let Some(stable) = &versions.stable else {
            return Ok(());
        };
        let stable = self.plugin(stable).await?;
        let canary = match &versions.canary {
            Some(c) => Some((
                self.plugin(&c.candidate).await?,
                KeySlice::new(c.key_fraction).ok_or(RolloutError::Fraction(c.key_fraction))?,
            )),
            None => None,
        };
        let shadow = match &versions.shadow {
            Some(digest) => Some(self.shadow_plugin(digest).await?),
            None => None,
        };
        self.slot
            .set(stable, canary, shadow, "fleet versions", since)
            .await;
        Ok(())
    }

    /// Start-up (see "At start" in the module docs): declares the config's
    /// plugin (and `canary` on `slice`), then converges once.
    pub(crate) async fn start(&self, config_canary: Option<(KeySlice, CanaryRules)>) {
        let (stable, canary) = self.slot.running();
        let declared = self
            .declare(Command::Declare(stable.digest().clone()), &stable)
            .await;
        if let (Some((candidate, _)), Some((slice, rules))) = (canary, config_canary) {
            let command = Command::DeclareCanary {
                candidate: candidate.digest().clone(),
                key_fraction: slice.fraction(),
                rules,
            };
            self.declare(command, &candidate).await;
        }
        self.converge_now().await;
        let running = self.slot.current();
        if !declared && running.digest() != stable.digest() {
            tracing::warn!(subscription = %self.subscription, config = %stable.digest(), running = %running.digest(), "the config's plugin was declared before and the fleet has moved on: running the fleet's version (`shardlane versions` shows the history; deploy or roll back to change it)");
        }
    }

    /// Records a config's version; false when it was declared before (or
    /// could not be recorded: logged).
    async fn declare(&self, command: Command, plugin: &Plugin) -> bool {
        if let Some(artifacts) = &self.artifacts {
            // The file as it was compiled (it may have changed since: then
            // the file watcher deploys the new bytes).
            let path = plugin.path().to_owned();
            let read = tokio::task::spawn_blocking(move || {
                crate::files::read_regular(&path, crate::files::MAX_PLUGIN_BYTES)
            })
            .await;
            match read {
                Ok(Ok(bytes)) if PluginDigest::of(&bytes) == *plugin.digest() => {
                    if let Err(e) = artifacts.store(bytes).await {
                        tracing::error!(subscription = %self.subscription, error = %e, "cannot store the config's plugin in the artifact store; other instances cannot fetch it");
                    }
                }
                _ => {}
            }
        }
        match update_versions(
            &*self.store,
            &self.subscription,
            command,
            &format!("config on {}", self.by),
        )
        .await
        {
            Ok(_) => true,
            Err(VersionsUpdateError::Refused(VersionsError::Unchanged(_))) => false,
            Err(e) => {
                tracing::error!(subscription = %self.subscription, error = %e, "cannot record the config's plugin in the fleet's versions");
                false
            }
        }
    }

    /// Converges every [`POLL`] and after each local change, and declares
    /// each change of the plugin file, until `shutdown`.
    pub(crate) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let (changed_tx, mut changed) = mpsc::channel(4);
        let watcher = tokio::spawn(self.slot.clone().watch(shutdown.clone(), changed_tx));
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut judge = tokio::time::interval(DECIDE_EVERY);
        judge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => self.converge_now().await,
                _ = judge.tick() => {
                    if let Err(e) = self.decide().await {
                        tracing::warn!(subscription = %self.subscription, error = %e, "cannot judge the canary; trying again");
                    }
                }
                () = self.wake.notified() => self.converge_now().await,
                file = changed.recv() => match file {
                    Some((bytes, detected)) => self.file_changed(bytes, detected).await,
                    None => break,
                },
            }
        }
        let _ = watcher.await;
    }

    async fn file_changed(&self, bytes: Vec<u8>, detected: Instant) {
        let digest = match self.publish(bytes, "file").await {
            Ok(digest) => digest,
            Err(e) => {
                tracing::error!(subscription = %self.subscription, error = %e, "plugin file changed but is refused; the running version stays");
                return;
            }
        };
        match self.change(Command::Deploy(digest), "file").await {
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
