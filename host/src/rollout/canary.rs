//! A canary that decides: a canary with rules (`rollback_failure_rate`,
//! `min_records`, `promote_after`; see
//! [`crate::fleet_versions::CanaryPlan::decide`]) judged on the whole fleet's
//! figures.
//!
//! # Counts that outlive an instance
//! Each instance counts, per canary, the records each version handled and
//! how many failed (retry, reject, trap, timeout), and keeps the counts
//! in the lease store: one item per canary and instance
//! (`<canary id>#<owner id>`, the "tallies" collection), written every
//! [`DECIDE_EVERY`]. An instance that restarts under the same owner id
//! adds to its item (it reads it back when the canary first runs here);
//! under a new one it starts an item of its own beside the old, which
//! stays. Either way a restart neither resets nor skews the fleet's
//! figures; a `kill -9` loses at most the counts of its last interval
//! (records it handled but whose checkpoint it never wrote, which the
//! next owner handles again and counts).
//!
//! # Deciding
//! Every [`DECIDE_EVERY`] each instance writes its item, reads every item
//! of the running canary (one Query), sums them, and applies what the
//! rules say as a change of the fleet's versions naming the canary's
//! identity ([`Command::Decided`] with [`CanaryPlan::id`]): the rules
//! refuse a decision about another canary — an earlier one, or the same
//! bytes deployed again since — and the change is written conditionally
//! on the revision it was read at, so only the first decision lands and
//! the others find nothing left to decide. A decision lags the fleet's
//! counts by at most two intervals. The lanes switch at their next record
//! or batch, as in a swap: nothing is lost or handled twice. Items of
//! canaries that ended are deleted by their instance.
//!
//! [`DECIDE_EVERY`]: super::DECIDE_EVERY
//! [`CanaryPlan::id`]: crate::fleet_versions::CanaryPlan::id

use std::sync::Mutex;

use super::{Rollout, RolloutError};
use crate::fleet_versions::{CanaryCounts, CanaryPlan, Command, Decision, VersionsError};
use crate::lease::{ItemKind, ItemWrite, LeaseError};

/// This instance's item of the running canary.
#[derive(Default)]
pub(super) struct Tally {
    state: Mutex<Option<Kept>>,
}

/// What this instance keeps of its item.
#[derive(Clone)]
struct Kept {
    /// The canary.
    rollout: u64,
    /// The item's key.
    key: String,
    /// What the item held before this process counted (an earlier process
    /// under the same owner id).
    base: CanaryCounts,
    /// The item's revision as last written or read.
    revision: u64,
}

/// The stored form of an item.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    revision: u64,
    counts: CanaryCounts,
}

impl Rollout {
    /// Writes this instance's counts and judges the running canary, if it
    /// has rules (module docs); logs what fails.
    pub(super) async fn judge(&self) {
        let plan = self
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|v| v.canary.clone());
        if let Err(e) = self.count(plan.as_ref()).await {
            tracing::warn!(subscription = %self.subscription, error = %e, "cannot keep the canary's counts in the lease store; trying again");
        }
        let Some(plan) = plan else {
            return;
        };
        if let Err(e) = self.decide(&plan).await {
            tracing::warn!(subscription = %self.subscription, error = %e, "cannot judge the canary; trying again");
        }
    }

    /// Writes this instance's item of the running canary (dropping its
    /// item of one that ended).
    async fn count(&self, plan: Option<&CanaryPlan>) -> Result<(), LeaseError> {
        let kept = self
            .tally
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let running = plan.map(|p| p.id);
        if let Some(old) = &kept
            && Some(old.rollout) != running
        {
            self.store
                .delete_item(&self.subscription, ItemKind::Tally, &old.key, old.revision)
                .await?;
            *self.tally.state.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        let Some(plan) = plan else {
            return Ok(());
        };
        let Some(counts) = self.slot.canary_counts().filter(|c| c.rollout == plan.id) else {
            // The candidate does not run here (yet): nothing counted.
            return Ok(());
        };
        let mut kept = match kept.filter(|k| k.rollout == plan.id) {
            Some(kept) => kept,
            None => self.own_item(plan.id).await?,
        };
        let mut total = counts;
        total.add(&kept.base);
        let stored = Stored {
            revision: kept.revision + 1,
            counts: total,
        };
        let doc = serde_json::to_string(&stored)
            .map_err(|e| LeaseError::Store(crate::cause::Cause::new(e)))?;
        match self
            .store
            .write_item(
                &self.subscription,
                ItemKind::Tally,
                &kept.key,
                stored.revision,
                doc,
                None,
            )
            .await?
        {
            ItemWrite::Written => kept.revision = stored.revision,
            // Another process under this owner id wrote it: read it next time.
            ItemWrite::Changed | ItemWrite::Fenced => {
                *self.tally.state.lock().unwrap_or_else(|e| e.into_inner()) = None;
                return Ok(());
            }
        }
        *self.tally.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(kept);
        Ok(())
    }

    /// This instance's item of canary `rollout` as stored (an earlier
    /// process under the same owner id counted into it), or a new one.
    async fn own_item(&self, rollout: u64) -> Result<Kept, LeaseError> {
        let key = format!("{rollout}#{}", self.owner);
        let item = self
            .store
            .read_item(&self.subscription, ItemKind::Tally, &key)
            .await?;
        let (base, revision) = match item {
            Some(item) => {
                let stored: Stored = serde_json::from_str(&item.doc)
                    .map_err(|e| LeaseError::Store(crate::cause::Cause::new(e)))?;
                (stored.counts, stored.revision)
            }
            None => (CanaryCounts::default(), 0),
        };
        Ok(Kept {
            rollout,
            key,
            base,
            revision,
        })
    }

    /// The fleet's counts of canary `plan`: every instance's item summed.
    pub(super) async fn fleet_counts(&self, plan: &CanaryPlan) -> Result<CanaryCounts, LeaseError> {
        let prefix = format!("{}#", plan.id);
        let items = self
            .store
            .read_items(&self.subscription, ItemKind::Tally)
            .await?;
        let mut fleet = CanaryCounts {
            rollout: plan.id,
            candidate: Some(plan.candidate.clone()),
            ..CanaryCounts::default()
        };
        for item in items.iter().filter(|i| i.key.starts_with(&prefix)) {
            if let Ok(stored) = serde_json::from_str::<Stored>(&item.doc)
                && stored.counts.rollout == plan.id
            {
                fleet.add(&stored.counts);
            }
        }
        Ok(fleet)
    }

    /// Judges canary `plan` on the fleet's counts and applies the decision
    /// (module docs, "Deciding").
    async fn decide(&self, plan: &CanaryPlan) -> Result<(), RolloutError> {
        let rules = &plan.rules;
        if rules.rollback_failure_rate.is_none() && rules.promote_after_ms.is_none() {
            return Ok(());
        }
        let fleet = self.fleet_counts(plan).await?;
        let (promote, note) = match plan.decide(&fleet, crate::clock::now_ms()) {
            Decision::Wait => return Ok(()),
            Decision::Rollback(note) => (false, note),
            Decision::Promote(note) => (true, note),
        };
        let command = Command::Decided {
            rollout: plan.id,
            promote,
            note: note.clone(),
        };
        match self.change(command, "canary rules").await {
            Ok(_) => {
                self.metrics.decisions[usize::from(promote)].inc();
                let decision = if promote { "promoted" } else { "rolled back" };
                tracing::warn!(subscription = %self.subscription, candidate = %plan.candidate, canary = plan.id, decision, figures = %note, "canary {decision} by its rules");
                Ok(())
            }
            // Another instance decided first, or the canary changed.
            Err(RolloutError::Refused(VersionsError::NoCanary | VersionsError::OtherCanary(_))) => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}
