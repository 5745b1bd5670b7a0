//! A subscription's fleet versions: which plugin version every instance
//! runs (the stable one), the canary candidate with its key fraction and
//! decision rules, the shadow candidate, and the history of every change.
//!
//! One [`FleetVersions`] value per subscription lives in the lease store
//! (memory, file or DynamoDB), beside the leases, so every instance that
//! shares the store runs what it says. This module is the value and its
//! rules as pure transitions ([`FleetVersions::apply`]): a change is read,
//! applied and written back conditionally on the [`FleetVersions::revision`]
//! it was read at, so two changes at once cannot interleave — the second
//! write is refused, read again and applied to what the first left (or
//! refused by the rules, e.g. a second canary while one runs).
//!
//! # The config's `plugin`: a declaration, never a fallback
//! - **A fleet** (the DynamoDB store, shared): an instance that starts on
//!   a subscription whose fleet has no version yet records its config's
//!   `plugin` (and `canary`) as the first ([`Action::Declared`]); from
//!   then on versions change only by an act — `shardlane deploy`,
//!   `promote`, `rollback`, the admin API, or the plugin file changing
//!   under a running host — so a restart, a pod of an older release or a
//!   stray instance with other bytes never moves the fleet. One whose
//!   config names other bytes than the fleet runs says so.
//! - **A lone host** (the memory or file store, which one host holds): it
//!   is its whole fleet, and its config is how it is told. Bytes its
//!   config never declared before are recorded as a deploy (a config
//!   change wins over a canary under way); bytes declared before change
//!   nothing, so a restart never undoes an admin API deploy, and a config
//!   change is never lost ([`FleetVersions::declared`] remembers them).
//!
//! Either way a config's `plugin` is never a fallback: an instance runs
//! the fleet's versions or nothing (see `crate::rollout`).
//!
//! # No version without its bytes, and one store
//! A change that brings a version ([`Stored`]: deploy, canary, shadow,
//! declaration) names the artifact store its bytes were stored in (and
//! read back from). The first such change records that store as the
//! fleet's ([`FleetVersions::artifacts`]); every later one must name the
//! same, so a deploy through a store the instances do not read is refused
//! ([`VersionsError::OtherStore`]) instead of recorded and never run.
//!
//! # A filter is part of the version
//! The stable version is a plugin *and* the subscription's filter
//! ([`crate::filter`]): [`FleetVersions::filter`] names it by its digest
//! ([`FilterText`]: the patterns' canonical text), and every history entry
//! records the filter in force after it. So a filter change is a deploy
//! ([`Command::DeployFilter`], alone or with a new plugin, one revision),
//! it shows in the history, and a rollback sets plugin and filter back
//! together to the version before (or to the latest other version with the
//! plugin named). The texts of the stable filter and of the latest
//! [`FILTERS_KEPT`] distinct ones before it are kept in the value (a
//! filter is at most five patterns of 4096 bytes), so a rollback needs no
//! store; a rollback to a version whose filter text was dropped is refused
//! ([`VersionsError::FilterGone`]). A config's `filter` is declared like its
//! `plugin` (with it, into an empty fleet; on a lone host, a filter it
//! never declared before becomes the fleet's). A canary's candidate and a
//! shadow run behind the stable version's filter (it is applied by the
//! readers, before any routing), and a filter deploy is refused while a
//! canary runs, like any deploy. Versions recorded before filters were
//! part of them ([`FleetVersions::filter_declared`] false) take the
//! config's filter from the next instance that starts, as an empty fleet
//! takes its plugin.
//!
//! # Every rollout has an identity
//! Each change moves [`FleetVersions::revision`] on; a canary or a shadow
//! is known by the revision that started it ([`CanaryPlan::id`],
//! [`FleetVersions::shadow_id`]). Counts carry the canary's id
//! ([`CanaryCounts::rollout`]), and an automatic decision names it: a
//! decision about an earlier canary — even one of the same bytes,
//! deployed again since — is refused by the rules and by the conditional
//! write (see `crate::rollout`, "A canary that decides").
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor.

mod filters;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::filter::FilterText;
use crate::ids::{FilterDigest, PluginDigest};

use filters::filter_words;

/// History entries kept per subscription (the oldest are dropped first):
/// a DynamoDB item holds at most 400 KB, and an entry is ~300 bytes.
pub(crate) const HISTORY_KEPT: usize = 200;

/// Config digests remembered as declared (see "The config's `plugin`").
pub(crate) const DECLARED_KEPT: usize = 256;

/// Filters' texts kept: the stable version's and the latest distinct ones
/// before it (a rollback goes back to them). Eight filters at Lambda's
/// limits (five patterns of 4096 bytes) take 160 KB of a DynamoDB item's
/// 400 KB.
pub(crate) const FILTERS_KEPT: usize = 8;

/// The fleet's versions of one subscription (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetVersions {
    /// Bumped by every change: writes are conditional on it.
    pub revision: u64,
    /// What every instance runs for keys outside a canary's slice.
    pub stable: Option<PluginDigest>,
    /// A candidate taking a slice of the keys.
    #[serde(default)]
    pub canary: Option<CanaryPlan>,
    /// A candidate given every record after the stable version, whose
    /// effects are compared and never applied.
    #[serde(default)]
    pub shadow: Option<PluginDigest>,
    /// The revision that started the shadow (its identity).
    #[serde(default)]
    pub shadow_id: u64,
    /// Digests that configs' `plugin` (or `canary`) declared, oldest
    /// first (the last [`DECLARED_KEPT`]).
    #[serde(default)]
    pub declared: Vec<PluginDigest>,
    /// The artifact store every version's bytes are in (its location, as
    /// `crate::artifacts` names it); `None` before the first version
    /// stored in one (module docs, "No version without its bytes").
    #[serde(default)]
    pub artifacts: Option<String>,
    /// Every change, oldest first (the last [`HISTORY_KEPT`]).
    #[serde(default)]
    pub history: Vec<Change>,
    /// The stable version's filter (`None`: every record goes in); its
    /// text is in [`Self::filters`] (module docs, "A filter is part of the
    /// version").
    #[serde(default)]
    pub filter: Option<FilterDigest>,
    /// The texts of the stable version's filter and of the latest ones
    /// before it (the last [`FILTERS_KEPT`] distinct ones).
    #[serde(default)]
    pub filters: Vec<FilterText>,
    /// Filters that configs declared (`None`: no filter), oldest first
    /// (the last [`DECLARED_KEPT`]).
    #[serde(default)]
    pub declared_filters: Vec<Option<FilterDigest>>,
    /// Whether a filter was ever recorded: false in a value written before
    /// filters were part of the version, whose next declaration records
    /// the config's filter (module docs, "A filter is part of the
    /// version").
    #[serde(default)]
    pub filter_declared: bool,
}

/// A version a change brings: its digest, and the artifact store its
/// bytes were stored in and read back from (`None`: none; only the first
/// declaration of a fleet without a store may bring that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The version.
    pub digest: PluginDigest,
    /// The store's location.
    pub location: Option<String>,
}

impl From<PluginDigest> for Stored {
    /// A version in no store.
    fn from(digest: PluginDigest) -> Self {
        Self {
            digest,
            location: None,
        }
    }
}

/// A running canary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryPlan {
    /// Its identity: the revision of the fleet's versions that started
    /// it.
    #[serde(default)]
    pub id: u64,
    /// The candidate version.
    pub candidate: PluginDigest,
    /// The fraction of partition keys it takes (a hash of the key, so every
    /// instance agrees).
    pub key_fraction: f64,
    /// When it started (ms since the Unix epoch).
    pub since_ms: u64,
    /// When it decides by itself.
    #[serde(default)]
    pub rules: CanaryRules,
}

/// A canary's decision rules; none set means a person decides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CanaryRules {
    /// Rolled back once the candidate's failure rate exceeds the stable
    /// version's by more than this (0.05 = five points), over at least
    /// `min_records` of the candidate's records.
    #[serde(default)]
    pub rollback_failure_rate: Option<f64>,
    /// Records the candidate must have handled before a rate counts.
    #[serde(default)]
    pub min_records: u64,
    /// Promoted once it has run this long (ms) without being rolled back.
    #[serde(default)]
    pub promote_after_ms: Option<u64>,
}

/// What one instance counted of a canary: records handled by each version
/// and how many failed (retry, reject, trap or timeout). Each instance
/// keeps its own in the lease store, where they outlive the process; a
/// decision sums every instance's of the same canary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CanaryCounts {
    /// The canary counted ([`CanaryPlan::id`]).
    #[serde(default)]
    pub rollout: u64,
    /// The candidate counted.
    pub candidate: Option<PluginDigest>,
    /// Records the stable version handled while the canary ran.
    pub stable_records: u64,
    /// Of which failed.
    pub stable_failures: u64,
    /// Records the candidate handled.
    pub candidate_records: u64,
    /// Of which failed.
    pub candidate_failures: u64,
}

impl CanaryCounts {
    /// The sum of two instances' counts.
    pub fn add(&mut self, other: &Self) {
        self.stable_records += other.stable_records;
        self.stable_failures += other.stable_failures;
        self.candidate_records += other.candidate_records;
        self.candidate_failures += other.candidate_failures;
    }

    fn rate(failures: u64, records: u64) -> f64 {
        if records == 0 {
            0.0
        } else {
            failures as f64 / records as f64
        }
    }

    /// The figures, in words, for the history and the log.
    pub fn describe(&self) -> String {
        format!(
            "candidate failed {} of {} ({:.1} %), stable {} of {} ({:.1} %)",
            self.candidate_failures,
            self.candidate_records,
            100.0 * Self::rate(self.candidate_failures, self.candidate_records),
            self.stable_failures,
            self.stable_records,
            100.0 * Self::rate(self.stable_failures, self.stable_records),
        )
    }
}

/// What a canary's rules say of its figures.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Not yet: too few records, or its window has not passed.
    Wait,
    /// Worse than its rule: drop it (the figures, in words).
    Rollback(String),
    /// Its window passed without a rollback: promote it.
    Promote(String),
}

impl CanaryPlan {
    /// What the rules say of `fleet` (every instance's counts summed) at
    /// `now_ms`:
    /// - **rollback** when the candidate has handled at least
    ///   `min_records` and its failure rate exceeds the stable version's
    ///   over the same time by more than `rollback_failure_rate`;
    /// - else **promote** once `promote_after` has passed since it began,
    ///   provided it has handled at least `min_records` (a candidate that
    ///   saw too little traffic to be judged waits);
    /// - else wait.
    pub fn decide(&self, fleet: &CanaryCounts, now_ms: u64) -> Decision {
        let enough = fleet.candidate_records >= self.rules.min_records.max(1);
        if let Some(allowed) = self.rules.rollback_failure_rate
            && enough
        {
            let candidate = CanaryCounts::rate(fleet.candidate_failures, fleet.candidate_records);
            let stable = CanaryCounts::rate(fleet.stable_failures, fleet.stable_records);
            if candidate > stable + allowed {
                return Decision::Rollback(format!(
                    "{}: more than {:.1} points worse",
                    fleet.describe(),
                    allowed * 100.0
                ));
            }
        }
        match self.rules.promote_after_ms {
            Some(after) if enough && now_ms >= self.since_ms.saturating_add(after) => {
                Decision::Promote(format!(
                    "healthy for {}: {}",
                    humantime::format_duration(std::time::Duration::from_millis(after)),
                    fleet.describe()
                ))
            }
            _ => Decision::Wait,
        }
    }
}

/// One entry of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// The revision it made.
    #[serde(default)]
    pub revision: u64,
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// Which instance or command (`cli@<hostname>`, an owner id).
    pub by: String,
    /// What.
    pub action: Action,
    /// The version it names: the new stable one, the candidate, or the
    /// version rolled back to.
    pub digest: PluginDigest,
    /// The stable version's filter after it (`None`: none).
    #[serde(default)]
    pub filter: Option<FilterDigest>,
    /// Why, or the figures of an automatic decision.
    #[serde(default)]
    pub note: String,
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A new stable version, by command.
    Deploy,
    /// A new stable version, from a config's `plugin`.
    Declared,
    /// A canary started.
    Canary,
    /// The candidate became the stable version, by command.
    Promote,
    /// The candidate became the stable version, by its rule.
    AutoPromote,
    /// The stable version set back, by command.
    Rollback,
    /// The canary dropped, by command (or by a config change).
    CanaryRollback,
    /// The canary was dropped by its rule.
    AutoRollback,
    /// A shadow candidate started.
    Shadow,
    /// The shadow candidate stopped.
    ShadowEnd,
}

impl Action {
    /// The name the history table and the status page show.
    pub fn label(self) -> &'static str {
        match self {
            Self::Deploy => "deploy",
            Self::Declared => "declared",
            Self::Canary => "canary",
            Self::Promote => "promote",
            Self::AutoPromote => "auto-promote",
            Self::Rollback => "rollback",
            Self::CanaryRollback => "canary-rollback",
            Self::AutoRollback => "auto-rollback",
            Self::Shadow => "shadow",
            Self::ShadowEnd => "shadow-end",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A change asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Make a version the stable one (its filter stays).
    Deploy(Stored),
    /// Set the stable version's filter (`None`: none), with a new plugin
    /// or the running one: one change, deployed and rolled back as one.
    DeployFilter {
        /// The filter.
        filter: Option<FilterText>,
        /// A new plugin with it; `None`: the stable one.
        plugin: Option<Stored>,
    },
    /// A config's `plugin` (and `canary`): the first versions of an empty
    /// fleet, or, on a host that is its whole fleet (`lone`), bytes its
    /// config never declared before (see the module docs).
    Declare {
        /// The config's `plugin`.
        stable: Stored,
        /// The config's `filter` (`None`: none).
        filter: Option<FilterText>,
        /// The config's `canary`, when it names one.
        canary: Option<CanaryStart>,
        /// The host is the whole fleet (a memory or file lease store).
        lone: bool,
    },
    /// Start a canary.
    Canary(CanaryStart),
    /// Start (or replace) a shadow candidate.
    Shadow(Stored),
    /// Stop the shadow candidate.
    EndShadow,
    /// Make the canary's candidate stable.
    Promote,
    /// Drop the canary (refused when none runs).
    DropCanary,
    /// Drop the canary; without one, set the stable version back to `to`
    /// (by default the one before it).
    Rollback {
        /// The version to go back to.
        to: Option<PluginDigest>,
    },
    /// A canary's rules decided (see [`CanaryPlan::decide`]): applied only
    /// to the canary `rollout` itself, never to a later one.
    Decided {
        /// The canary decided about ([`CanaryPlan::id`]).
        rollout: u64,
        /// Promote it (else roll it back).
        promote: bool,
        /// The figures.
        note: String,
    },
}

/// A canary to start.
#[derive(Debug, Clone, PartialEq)]
pub struct CanaryStart {
    /// The candidate.
    pub candidate: Stored,
    /// Its share of the keys, in (0, 1).
    pub key_fraction: f64,
    /// Its rules.
    pub rules: CanaryRules,
}

/// Why a change was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VersionsError {
    /// A canary runs.
    #[error("a canary of {0} runs: promote it or roll it back first")]
    CanaryRunning(PluginDigest),
    /// Promote or an automatic decision without (that) canary.
    #[error("no canary runs")]
    NoCanary,
    /// A decision about a canary that is no longer the one running.
    #[error("the canary decided about (revision {0}) no longer runs")]
    OtherCanary(u64),
    /// A canary or rollback with no stable version to compare with or go
    /// back to.
    #[error("no version has been deployed yet")]
    NothingDeployed,
    /// Rollback to a version the history does not hold.
    #[error("{0} was never deployed here: `shardlane versions` lists the history")]
    Unknown(PluginDigest),
    /// Rollback with no earlier version.
    #[error("no earlier version to roll back to")]
    NoEarlier,
    /// A key fraction out of range.
    #[error("key fraction {0} is out of range: from 0 to 1, both excluded")]
    Fraction(f64),
    /// The version's bytes are in another store than the fleet's.
    #[error(
        "the fleet's versions are kept in {fleet}, but this version was stored in {given}: every instance fetches from {fleet}; deploy with the fleet's [artifacts] location"
    )]
    OtherStore {
        /// The fleet's store.
        fleet: String,
        /// Where this version was stored (`none` without a store).
        given: String,
    },
    /// A rollback to a version whose filter's text is no longer kept.
    #[error(
        "the filter {0} of that version is no longer kept (the last {FILTERS_KEPT} are): deploy it again with `shardlane deploy --filter`"
    )]
    FilterGone(FilterDigest),
    /// Nothing to change (the version is the one that runs already, or a
    /// fleet that has versions is declared to).
    #[error("nothing to change: {0}")]
    Unchanged(String),
}

/// A canary's key fraction: more than 0, less than 1.
///
/// # Errors
/// [`VersionsError::Fraction`] otherwise.
pub(crate) fn check_fraction(key_fraction: f64) -> Result<(), VersionsError> {
    if key_fraction > 0.0 && key_fraction < 1.0 {
        Ok(())
    } else {
        Err(VersionsError::Fraction(key_fraction))
    }
}

/// What a change did: its action, the version it names, its note.
type Done = (Action, PluginDigest, String);

impl FleetVersions {
    /// The value after `command` by `by` at `now_ms`, with the revision
    /// moved on and the change recorded.
    ///
    /// # Errors
    /// When the rules refuse the change (see [`VersionsError`]).
    pub fn apply(&self, command: Command, by: &str, now_ms: u64) -> Result<Self, VersionsError> {
        let mut next = self.clone();
        next.revision = self.revision + 1;
        let (action, digest, note) = match command {
            Command::Deploy(stored) => next.deploy(Some(stored), None)?,
            Command::DeployFilter { filter, plugin } => next.deploy(plugin, Some(filter))?,
            Command::Declare {
                stable,
                filter,
                canary,
                lone,
            } => {
                return if lone {
                    next.declare_lone(stable, filter, canary, by, now_ms)
                } else {
                    next.declare(stable, filter, canary, by, now_ms)
                };
            }
            Command::Canary(start) => next.start_canary(start, now_ms)?,
            Command::Shadow(stored) => {
                next.stored_in(&stored)?;
                next.shadow = Some(stored.digest.clone());
                next.shadow_id = next.revision;
                (Action::Shadow, stored.digest, String::new())
            }
            Command::EndShadow => {
                let digest = next.shadow.take().ok_or_else(|| {
                    VersionsError::Unchanged("no shadow candidate runs".to_owned())
                })?;
                (Action::ShadowEnd, digest, String::new())
            }
            Command::Promote => {
                let canary = next.canary.take().ok_or(VersionsError::NoCanary)?;
                next.stable = Some(canary.candidate.clone());
                (Action::Promote, canary.candidate, String::new())
            }
            Command::DropCanary => {
                let canary = next.canary.take().ok_or(VersionsError::NoCanary)?;
                (Action::CanaryRollback, canary.candidate, String::new())
            }
            Command::Decided {
                rollout,
                promote,
                note,
            } => next.decided(rollout, promote, note)?,
            Command::Rollback { to } => next.rollback(to)?,
        };
        next.record(now_ms, by, action, digest, &note);
        Ok(next)
    }

    /// A new stable version by command: a new `plugin` (`None`: the
    /// stable one), a new `filter` (`None`: the stable one's), or both.
    fn deploy(
        &mut self,
        plugin: Option<Stored>,
        filter: Option<Option<FilterText>>,
    ) -> Result<Done, VersionsError> {
        self.no_canary()?;
        let digest = match &plugin {
            Some(stored) => stored.digest.clone(),
            None => self.stable.clone().ok_or(VersionsError::NothingDeployed)?,
        };
        let filter_digest = match &filter {
            Some(text) => text.as_ref().map(|t| t.digest.clone()),
            None => self.filter.clone(),
        };
        if self.stable.as_ref() == Some(&digest) && self.filter == filter_digest {
            return Err(VersionsError::Unchanged(format!(
                "{digest} with {} runs already",
                filter_words(filter_digest.as_ref())
            )));
        }
        if let Some(stored) = &plugin {
            self.stored_in(stored)?;
        }
        self.stable = Some(digest.clone());
        let note = match filter {
            Some(text) => {
                self.set_filter(text);
                format!("with {}", filter_words(self.filter.as_ref()))
            }
            None => String::new(),
        };
        Ok((Action::Deploy, digest, note))
    }

    /// The first versions of an empty fleet (module docs).
    fn declare(
        mut self,
        stable: Stored,
        filter: Option<FilterText>,
        canary: Option<CanaryStart>,
        by: &str,
        now_ms: u64,
    ) -> Result<Self, VersionsError> {
        if let Some(running) = self.stable.clone() {
            if self.filter_declared {
                return Err(VersionsError::Unchanged(format!(
                    "the fleet runs {running} already"
                )));
            }
            // Versions recorded before filters were part of them: the
            // config's filter is the first.
            self.remember_declared_filter(filter.as_ref().map(|t| t.digest.clone()));
            self.set_filter(filter);
            let note = format!(
                "the config's filter: {}",
                filter_words(self.filter.as_ref())
            );
            self.record(now_ms, by, Action::Declared, running, &note);
            return Ok(self);
        }
        self.stored_in(&stable)?;
        self.remember_declared(stable.digest.clone());
        self.remember_declared_filter(filter.as_ref().map(|t| t.digest.clone()));
        self.stable = Some(stable.digest.clone());
        self.set_filter(filter);
        let note = format!(
            "the config's plugin, {}",
            filter_words(self.filter.as_ref())
        );
        self.record(now_ms, by, Action::Declared, stable.digest, &note);
        // The canary is part of the same change (one revision: the write
        // is conditional on the one before).
        if let Some(start) = canary {
            self.remember_declared(start.candidate.digest.clone());
            let (action, digest, note) = self.start_canary(start, now_ms)?;
            self.record(now_ms, by, action, digest, &note);
        }
        Ok(self)
    }

    /// A lone host's config (module docs): the bytes of `stable` (and
    /// `canary`) and the `filter` it never declared before become the
    /// fleet's, a config change of the plugin winning over a canary under
    /// way; what was declared before changes nothing, so a restart never
    /// undoes a command.
    fn declare_lone(
        mut self,
        stable: Stored,
        filter: Option<FilterText>,
        canary: Option<CanaryStart>,
        by: &str,
        now_ms: u64,
    ) -> Result<Self, VersionsError> {
        let new_stable = !self.declared.contains(&stable.digest);
        let filter_digest = filter.as_ref().map(|t| t.digest.clone());
        let new_filter = !self.declared_filters.contains(&filter_digest);
        let canary = canary.filter(|c| !self.declared.contains(&c.candidate.digest));
        if !new_stable && !new_filter && canary.is_none() {
            return Err(VersionsError::Unchanged(format!(
                "{} and {} were declared before",
                stable.digest,
                filter_words(filter_digest.as_ref())
            )));
        }
        if new_stable {
            self.stored_in(&stable)?;
            self.remember_declared(stable.digest.clone());
            if let Some(running) = self.canary.take() {
                let note = "the config's plugin changed";
                self.record(now_ms, by, Action::CanaryRollback, running.candidate, note);
            }
            self.stable = Some(stable.digest.clone());
        }
        if new_filter {
            self.remember_declared_filter(filter_digest);
            self.set_filter(filter);
        }
        if new_stable || new_filter {
            let what = match (new_stable, new_filter) {
                (true, false) => "the config's plugin",
                (false, _) => "the config's filter",
                (true, true) => "the config's plugin and filter",
            };
            let note = format!("{what}: {}", filter_words(self.filter.as_ref()));
            let digest = self.stable.clone().unwrap_or(stable.digest);
            self.record(now_ms, by, Action::Declared, digest, &note);
        }
        if let Some(start) = canary
            && self.canary.is_none()
        {
            self.remember_declared(start.candidate.digest.clone());
            let (action, digest, note) = self.start_canary(start, now_ms)?;
            self.record(now_ms, by, action, digest, &note);
        }
        Ok(self)
    }

    /// Notes that a config declared `digest` (the last [`DECLARED_KEPT`]).
    fn remember_declared(&mut self, digest: PluginDigest) {
        self.declared.retain(|d| d != &digest);
        self.declared.push(digest);
        if self.declared.len() > DECLARED_KEPT {
            self.declared.remove(0);
        }
    }

    /// A canary starts (its id is the revision being made).
    fn start_canary(&mut self, start: CanaryStart, now_ms: u64) -> Result<Done, VersionsError> {
        let CanaryStart {
            candidate,
            key_fraction,
            rules,
        } = start;
        check_fraction(key_fraction)?;
        self.no_canary()?;
        if self.stable.is_none() {
            return Err(VersionsError::NothingDeployed);
        }
        self.stored_in(&candidate)?;
        self.canary = Some(CanaryPlan {
            id: self.revision,
            candidate: candidate.digest.clone(),
            key_fraction,
            since_ms: now_ms,
            rules,
        });
        Ok((
            Action::Canary,
            candidate.digest,
            format!("{:.1} % of keys", key_fraction * 100.0),
        ))
    }

    /// A canary's rules decided about canary `rollout`.
    fn decided(
        &mut self,
        rollout: u64,
        promote: bool,
        note: String,
    ) -> Result<Done, VersionsError> {
        let canary = self.canary.take().ok_or(VersionsError::NoCanary)?;
        if canary.id != rollout {
            return Err(VersionsError::OtherCanary(rollout));
        }
        if promote {
            self.stable = Some(canary.candidate.clone());
            Ok((Action::AutoPromote, canary.candidate, note))
        } else {
            Ok((Action::AutoRollback, canary.candidate, note))
        }
    }

    /// A rollback: of the canary, or of the stable version — its plugin
    /// and its filter — to the latest other one with the plugin `to` (by
    /// default the one before it).
    fn rollback(&mut self, to: Option<PluginDigest>) -> Result<Done, VersionsError> {
        if let Some(canary) = &self.canary {
            if to.is_some() {
                return Err(VersionsError::CanaryRunning(canary.candidate.clone()));
            }
            let candidate = canary.candidate.clone();
            self.canary = None;
            return Ok((Action::CanaryRollback, candidate, String::new()));
        }
        let stable = self.stable.clone().ok_or(VersionsError::NothingDeployed)?;
        let current = (stable.clone(), self.filter.clone());
        let target = match &to {
            Some(to) if !self.was_stable(to) => return Err(VersionsError::Unknown(to.clone())),
            Some(to) => self.earlier(&current, Some(to)).ok_or_else(|| {
                VersionsError::Unchanged(format!(
                    "{to} with {} runs already",
                    filter_words(current.1.as_ref())
                ))
            })?,
            None => self
                .earlier(&current, None)
                .ok_or(VersionsError::NoEarlier)?,
        };
        let (digest, filter) = target;
        if let Some(gone) = &filter
            && !self.filters.iter().any(|t| &t.digest == gone)
        {
            return Err(VersionsError::FilterGone(gone.clone()));
        }
        let note = if filter == current.1 {
            format!("from {}", stable.short())
        } else {
            format!(
                "from {} with {}, to {}",
                stable.short(),
                filter_words(current.1.as_ref()),
                filter_words(filter.as_ref())
            )
        };
        self.stable = Some(digest.clone());
        self.filter = filter;
        Ok((Action::Rollback, digest, note))
    }

    /// Checks that `stored` is in the fleet's store, recording it as the
    /// fleet's when none is yet (module docs).
    fn stored_in(&mut self, stored: &Stored) -> Result<(), VersionsError> {
        match (&self.artifacts, &stored.location) {
            (Some(fleet), Some(given)) if fleet == given => Ok(()),
            (None, given) => {
                self.artifacts = given.clone();
                Ok(())
            }
            (Some(fleet), given) => Err(VersionsError::OtherStore {
                fleet: fleet.clone(),
                given: given.clone().unwrap_or_else(|| "none".to_owned()),
            }),
        }
    }

    fn no_canary(&self) -> Result<(), VersionsError> {
        match &self.canary {
            Some(canary) => Err(VersionsError::CanaryRunning(canary.candidate.clone())),
            None => Ok(()),
        }
    }

    fn record(&mut self, at_ms: u64, by: &str, action: Action, digest: PluginDigest, note: &str) {
        self.history.push(Change {
            revision: self.revision,
            at_ms,
            by: by.to_owned(),
            action,
            digest,
            filter: self.filter.clone(),
            note: note.to_owned(),
        });
        if self.history.len() > HISTORY_KEPT {
            let extra = self.history.len() - HISTORY_KEPT;
            self.history.drain(..extra);
        }
        self.keep_filters();
    }

    /// Whether the history shows `digest` as a stable version once.
    fn was_stable(&self, digest: &PluginDigest) -> bool {
        self.history
            .iter()
            .any(|c| &c.digest == digest && c.made_stable())
    }

    /// The stable version before `current` (a plugin and its filter):
    /// the newest entry that made another one stable — with the plugin
    /// `plugin`, when named.
    fn earlier(
        &self,
        current: &(PluginDigest, Option<FilterDigest>),
        plugin: Option<&PluginDigest>,
    ) -> Option<(PluginDigest, Option<FilterDigest>)> {
        self.history
            .iter()
            .rev()
            .filter(|c| c.made_stable())
            .filter(|c| plugin.is_none_or(|p| &c.digest == p))
            .map(|c| (c.digest.clone(), c.filter.clone()))
            .find(|version| version != current)
    }

    /// Every version this value names (the ones instances must be able to
    /// fetch): stable, candidate, shadow.
    pub fn running(&self) -> Vec<&PluginDigest> {
        self.stable
            .iter()
            .chain(self.canary.as_ref().map(|c| &c.candidate))
            .chain(self.shadow.as_ref())
            .collect()
    }
}

impl Change {
    /// Whether this entry made its digest the stable version.
    fn made_stable(&self) -> bool {
        matches!(
            self.action,
            Action::Deploy
                | Action::Declared
                | Action::Promote
                | Action::AutoPromote
                | Action::Rollback
        )
    }
}

#[cfg(test)]
mod tests;
