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
//! # Which wins: the config's `plugin` or a command
//! Both ways of working hold (README, "Shipping a new version"):
//! - **Declarative.** An instance that starts with a config whose `plugin`
//!   holds bytes this subscription has never declared (the team changed the
//!   file and rolled its pods) records them as a deploy ([`Action::Declared`])
//!   and the whole fleet follows.
//! - **Imperative.** `shardlane deploy`, `promote`, `rollback` and the admin
//!   API change the stored value; every instance follows.
//!
//! A config's bytes are declared once: an instance that starts with bytes
//! declared before (an old pod restarting in the middle of a rollout, or a
//! config never changed while commands deployed since) runs what the store
//! says, and logs that its config's plugin is not what runs. So a command's
//! deploy is never undone by a restart, and a config change is never lost:
//! the newest act wins, whichever way it came.
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::PluginDigest;

/// History entries kept per subscription (the oldest are dropped first):
/// a DynamoDB item holds at most 400 KB, and an entry is ~300 bytes.
pub(crate) const HISTORY_KEPT: usize = 200;

/// Config digests remembered as declared (see the module docs).
pub(crate) const DECLARED_KEPT: usize = 256;

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
    /// Digests that configs' `plugin` declared, oldest first.
    #[serde(default)]
    pub declared: Vec<PluginDigest>,
    /// Every change, oldest first (the last [`HISTORY_KEPT`]).
    #[serde(default)]
    pub history: Vec<Change>,
}

/// A running canary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryPlan {
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

/// What one instance counted of a canary since it began running it there:
/// records handled by each version and how many failed (retry, reject,
/// trap or timeout). Each instance publishes its own with its heartbeat;
/// a decision sums every instance's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CanaryCounts {
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

/// This instance's canary counts as the rollout stage last read them, for
/// its heartbeat to carry (a cell both share: written on the rollout's
/// poll, read at each heartbeat).
#[derive(Debug, Default)]
pub(crate) struct CanaryReport(std::sync::Mutex<Option<CanaryCounts>>);

impl CanaryReport {
    /// Replaces the counts (`None`: no canary runs here).
    pub(crate) fn set(&self, counts: Option<CanaryCounts>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = counts;
    }

    /// The counts last set.
    pub(crate) fn get(&self) -> Option<CanaryCounts> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// Which instance or command (`cli@<hostname>`, an owner id).
    pub by: String,
    /// What.
    pub action: Action,
    /// The version it names: the new stable one, the candidate, or the
    /// version rolled back to.
    pub digest: PluginDigest,
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
    /// Make `digest` the stable version.
    Deploy(PluginDigest),
    /// A config's `plugin` holds `digest` (see the module docs).
    Declare(PluginDigest),
    /// A config's `canary` names `candidate` on `key_fraction` of the keys:
    /// declared once, as `plugin` is.
    DeclareCanary {
        /// The candidate.
        candidate: PluginDigest,
        /// Its share of the keys.
        key_fraction: f64,
        /// Its rules.
        rules: CanaryRules,
    },
    /// Start a canary.
    Canary {
        /// The candidate.
        candidate: PluginDigest,
        /// Its share of the keys, in (0, 1).
        key_fraction: f64,
        /// Its rules.
        rules: CanaryRules,
    },
    /// Start (or replace) a shadow candidate.
    Shadow(PluginDigest),
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
    /// The canary's rule decided: promote `candidate` (only if it is still
    /// the candidate).
    AutoPromote {
        /// The candidate the decision is about.
        candidate: PluginDigest,
        /// The figures.
        note: String,
    },
    /// The canary's rule decided: drop `candidate` (only if it is still the
    /// candidate).
    AutoRollback {
        /// The candidate the decision is about.
        candidate: PluginDigest,
        /// The figures.
        note: String,
    },
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
    /// Nothing to change (the version is the one that runs already, or a
    /// config's bytes were declared before).
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

impl FleetVersions {
    /// The value after `command` by `by` at `now_ms`, with the revision
    /// moved on and the change recorded.
    ///
    /// # Errors
    /// When the rules refuse the change (see [`VersionsError`]).
    pub fn apply(&self, command: Command, by: &str, now_ms: u64) -> Result<Self, VersionsError> {
        let mut next = self.clone();
        let (action, digest, note) = match command {
            Command::Deploy(digest) => {
                self.no_canary()?;
                if self.stable.as_ref() == Some(&digest) {
                    return Err(VersionsError::Unchanged(format!("{digest} runs already")));
                }
                next.stable = Some(digest.clone());
                (Action::Deploy, digest, String::new())
            }
            Command::Declare(digest) => {
                if self.declared.contains(&digest) {
                    return Err(VersionsError::Unchanged(format!(
                        "{digest} was declared before"
                    )));
                }
                next.remember_declared(digest.clone());
                if let Some(canary) = &self.canary {
                    // A config change wins over a canary under way: the
                    // team rolled new pods; the canary is dropped.
                    next.canary = None;
                    next.record(
                        now_ms,
                        by,
                        Action::CanaryRollback,
                        canary.candidate.clone(),
                        "the config's plugin changed",
                    );
                }
                next.stable = Some(digest.clone());
                (Action::Declared, digest, "the config's plugin".to_owned())
            }
            Command::DeclareCanary {
                candidate,
                key_fraction,
                rules,
            } => {
                if self.declared.contains(&candidate) {
                    return Err(VersionsError::Unchanged(format!(
                        "{candidate} was declared before"
                    )));
                }
                let mut next = self.apply(
                    Command::Canary {
                        candidate: candidate.clone(),
                        key_fraction,
                        rules,
                    },
                    by,
                    now_ms,
                )?;
                next.remember_declared(candidate);
                return Ok(next);
            }
            Command::Canary {
                candidate,
                key_fraction,
                rules,
            } => {
                check_fraction(key_fraction)?;
                self.no_canary()?;
                if self.stable.is_none() {
                    return Err(VersionsError::NothingDeployed);
                }
                next.canary = Some(CanaryPlan {
                    candidate: candidate.clone(),
                    key_fraction,
                    since_ms: now_ms,
                    rules,
                });
                (
                    Action::Canary,
                    candidate,
                    format!("{:.1} % of keys", key_fraction * 100.0),
                )
            }
            Command::Shadow(digest) => {
                next.shadow = Some(digest.clone());
                (Action::Shadow, digest, String::new())
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
            Command::AutoPromote { candidate, note } => {
                next.candidate_is(&candidate)?;
                next.canary = None;
                next.stable = Some(candidate.clone());
                (Action::AutoPromote, candidate, note)
            }
            Command::AutoRollback { candidate, note } => {
                next.candidate_is(&candidate)?;
                next.canary = None;
                (Action::AutoRollback, candidate, note)
            }
            Command::Rollback { to } => match (&self.canary, to) {
                (Some(canary), None) => {
                    next.canary = None;
                    (
                        Action::CanaryRollback,
                        canary.candidate.clone(),
                        String::new(),
                    )
                }
                (Some(canary), Some(_)) => {
                    return Err(VersionsError::CanaryRunning(canary.candidate.clone()));
                }
                (None, to) => {
                    let stable = self.stable.clone().ok_or(VersionsError::NothingDeployed)?;
                    let to = match to {
                        Some(to) if to == stable => {
                            return Err(VersionsError::Unchanged(format!("{to} runs already")));
                        }
                        Some(to) if self.was_stable(&to) => to,
                        Some(to) => return Err(VersionsError::Unknown(to)),
                        None => self.earlier(&stable).ok_or(VersionsError::NoEarlier)?,
                    };
                    next.stable = Some(to.clone());
                    (Action::Rollback, to, format!("from {}", stable.short()))
                }
            },
        };
        next.record(now_ms, by, action, digest, &note);
        next.revision = self.revision + 1;
        Ok(next)
    }

    /// Notes that a config declared `digest` (the last [`DECLARED_KEPT`]).
    fn remember_declared(&mut self, digest: PluginDigest) {
        self.declared.push(digest);
        if self.declared.len() > DECLARED_KEPT {
            self.declared.remove(0);
        }
    }

    fn no_canary(&self) -> Result<(), VersionsError> {
        match &self.canary {
            Some(canary) => Err(VersionsError::CanaryRunning(canary.candidate.clone())),
            None => Ok(()),
        }
    }

    fn candidate_is(&self, candidate: &PluginDigest) -> Result<(), VersionsError> {
        match &self.canary {
            Some(canary) if &canary.candidate == candidate => Ok(()),
            _ => Err(VersionsError::NoCanary),
        }
    }

    fn record(&mut self, at_ms: u64, by: &str, action: Action, digest: PluginDigest, note: &str) {
        self.history.push(Change {
            at_ms,
            by: by.to_owned(),
            action,
            digest,
            note: note.to_owned(),
        });
        if self.history.len() > HISTORY_KEPT {
            let extra = self.history.len() - HISTORY_KEPT;
            self.history.drain(..extra);
        }
    }

    /// Whether the history shows `digest` as a stable version once.
    fn was_stable(&self, digest: &PluginDigest) -> bool {
        self.history
            .iter()
            .any(|c| &c.digest == digest && c.made_stable())
    }

    /// The stable version before `current`: the newest entry that made
    /// another version stable, before the one that made `current` stable.
    fn earlier(&self, current: &PluginDigest) -> Option<PluginDigest> {
        let mut stables = self.history.iter().rev().filter(|c| c.made_stable());
        // Skip the entries of the current version at the top.
        stables
            .by_ref()
            .find(|c| &c.digest != current)
            .map(|c| c.digest.clone())
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
