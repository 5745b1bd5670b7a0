//! The canary of a plugin slot: a candidate version beside the stable one,
//! chosen per partition key, and the lane handler that holds an instance of
//! each (see "Canary" in [`super`]).
//!
//! # The slice
//! A canary sends a stable slice of partition keys to a candidate plugin
//! version: a [`KeySlice`] (a ground value, defined in
//! [`crate::key_slice`], since the config names one too).

use std::sync::Arc;

use super::shadow::{Admission, Live, Shadow, ShadowCall};
use crate::channel::{Record, WindowClose};
use crate::dispatch::{CallError, Handled, Handler, Outcome};
use crate::fleet_versions::CanaryCounts;
use crate::ids::{LaneId, PluginDigest};
use crate::key_slice::KeySlice;
use crate::plugin::{Instance, Plugin, PluginError};
use crate::state::CallState;
use crate::telemetry::{CanaryView, Counter, Telemetry, VersionCounts};

/// Which version handled a record while a canary runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The stable version.
    Stable,
    /// The candidate.
    Candidate,
}

impl Role {
    fn label(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::Candidate => "candidate",
        }
    }
}

/// Outcome counters of one version during a canary.
#[derive(Clone)]
struct RoleCounters {
    ack: Counter,
    retry: Counter,
    reject: Counter,
    failed: Counter,
}

impl RoleCounters {
    fn new(telemetry: &Telemetry, sub: &str, role: Role) -> Self {
        let counter = |outcome: &str| {
            telemetry.counter(
                "shardlane_canary_records_total",
                "Records handled while a canary runs, by version (stable or candidate) and outcome (failed: trap, timeout or guest error).",
                &[("subscription", sub), ("version", role.label()), ("outcome", outcome)],
            )
        };
        Self {
            ack: counter("ack"),
            retry: counter("retry"),
            reject: counter("reject"),
            failed: counter("failed"),
        }
    }

    /// The same counters, as the status page reads them.
    fn view(&self) -> VersionCounts {
        VersionCounts {
            ack: self.ack.clone(),
            retry: self.retry.clone(),
            reject: self.reject.clone(),
            failed: vec![self.failed.clone()],
        }
    }

    fn count(&self, outcome: &Outcome) {
        match outcome {
            Outcome::Ack => self.ack.inc(),
            Outcome::Retry(_) => self.retry.inc(),
            Outcome::Reject(_) => self.reject.inc(),
        }
    }

    fn count_one(&self, result: Result<&Outcome, &CallError>) {
        match result {
            Ok(outcome) => self.count(outcome),
            Err(_) => self.failed.inc(),
        }
    }

    fn count_batch(&self, result: Result<&Vec<Outcome>, &CallError>, len: usize) {
        match result {
            Ok(outcomes) => outcomes.iter().for_each(|o| self.count(o)),
            Err(_) => self.failed.add(len as u64),
        }
    }
}

/// The counters' totals: records and failures (retry, reject, trap or
/// timeout) of each version.
fn totals(stable: &RoleCounters, candidate: &RoleCounters) -> CanaryCounts {
    let failures = |c: &RoleCounters| c.retry.get() + c.reject.get() + c.failed.get();
    let records = |c: &RoleCounters| c.ack.get() + failures(c);
    CanaryCounts {
        rollout: 0,
        candidate: None,
        stable_records: records(stable),
        stable_failures: failures(stable),
        candidate_records: records(candidate),
        candidate_failures: failures(candidate),
    }
}

/// A candidate version and the keys it handles.
#[derive(Clone)]
pub(super) struct Canary {
    pub(super) plugin: Arc<Plugin>,
    pub(super) slice: KeySlice,
    /// Its identity ([`crate::fleet_versions::CanaryPlan::id`]).
    pub(super) id: u64,
    stable_counts: RoleCounters,
    candidate_counts: RoleCounters,
    /// The counters when this canary began (they are the process's, shared
    /// with earlier canaries): [`Canary::counts`] is what came since.
    baseline: CanaryCounts,
}

impl Canary {
    /// `plugin` handling the keys in `slice`, its outcomes counted beside
    /// the stable version's.
    pub(super) fn new(
        plugin: Arc<Plugin>,
        slice: KeySlice,
        id: u64,
        telemetry: &Telemetry,
        sub: &str,
    ) -> Self {
        let stable_counts = RoleCounters::new(telemetry, sub, Role::Stable);
        let candidate_counts = RoleCounters::new(telemetry, sub, Role::Candidate);
        let baseline = totals(&stable_counts, &candidate_counts);
        Self {
            plugin,
            slice,
            id,
            stable_counts,
            candidate_counts,
            baseline,
        }
    }

    /// What this instance counted of it since it began here.
    pub(super) fn counts(&self) -> CanaryCounts {
        let now = totals(&self.stable_counts, &self.candidate_counts);
        CanaryCounts {
            rollout: self.id,
            candidate: Some(self.plugin.digest().clone()),
            stable_records: now.stable_records - self.baseline.stable_records,
            stable_failures: now.stable_failures - self.baseline.stable_failures,
            candidate_records: now.candidate_records - self.baseline.candidate_records,
            candidate_failures: now.candidate_failures - self.baseline.candidate_failures,
        }
    }

    /// What the status page shows of it.
    pub(super) fn view(&self) -> CanaryView {
        CanaryView {
            describe: format!("{} on {} of the keys", self.plugin.digest(), self.slice),
            digest: self.plugin.digest().to_string(),
            stable: self.stable_counts.view(),
            candidate: self.candidate_counts.view(),
        }
    }
}

/// A lane's handler: an instance of the stable version and, while a
/// canary runs, one of the candidate, picked per record by partition key
/// (see "Canary" in the module docs).
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct SlotInstance {
    stable: Instance,
    canary: Option<CanaryInstance>,
    shadow: Option<Shadow>,
}

struct CanaryInstance {
    instance: Instance,
    slice: KeySlice,
    stable_counts: RoleCounters,
    candidate_counts: RoleCounters,
}

impl SlotInstance {
    /// An instance of `stable` for `lane` and, while a canary runs, one of
    /// its candidate.
    pub(super) async fn new(
        stable: &Plugin,
        canary: Option<&Canary>,
        shadow: Option<Shadow>,
        lane: LaneId,
    ) -> Result<Self, PluginError> {
        let stable = stable.instantiate(lane).await?;
        let canary = match canary {
            None => None,
            Some(c) => Some(CanaryInstance {
                instance: c.plugin.instantiate(lane).await?,
                slice: c.slice,
                stable_counts: c.stable_counts.clone(),
                candidate_counts: c.candidate_counts.clone(),
            }),
        };
        Ok(Self {
            stable,
            canary,
            shadow,
        })
    }

    /// Which version handles `record`.
    pub(crate) fn role_for(&self, record: &Record) -> Role {
        match &self.canary {
            Some(c) if c.slice.contains(&record.partition_key) => Role::Candidate,
            _ => Role::Stable,
        }
    }
}

impl Handler for SlotInstance {
    async fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
        state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        let records = [(record.clone(), attempt)];
        let Some((shadow, admission)) = self.shadow_admits(&records) else {
            return self.handle_live(record, attempt, state).await;
        };
        let fork = state.fork();
        let result = self.handle_live(record, attempt, state).await;
        let live = Live::of_record(&result, state);
        shadow.offer(
            admission,
            ShadowCall::new(records.to_vec(), false, fork, live),
        );
        result
    }

    async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        let Some((shadow, admission)) = self.shadow_admits(records) else {
            return self.handle_batch_live(records, state).await;
        };
        let fork = state.fork();
        let result = self.handle_batch_live(records, state).await;
        let live = Live::of_batch(&result, state);
        shadow.offer(
            admission,
            ShadowCall::new(records.to_vec(), true, fork, live),
        );
        result
    }

    /// Runs only while one version serves every key and no shadow
    /// watches: a canary splits by key and a shadow compares call by call,
    /// one record each.
    fn max_run(&self) -> usize {
        if self.canary.is_none() && self.shadow.is_none() {
            self.stable.max_run()
        } else {
            1
        }
    }

    async fn handle_run(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        if self.max_run() > 1 {
            return self.stable.handle_run(records, state).await;
        }
        let Some((record, attempt)) = records.first() else {
            return Ok(Handled::new(Vec::new()));
        };
        let Handled { outcome, outputs } = self.handle(record, *attempt, state).await?;
        Ok(Handled {
            outcome: vec![outcome],
            outputs,
        })
    }

    /// The stable version closes a window, or the candidate when the
    /// close is for one key in its slice (`by = "key"`). A shadow does not
    /// see closes: it compares record calls.
    async fn close_window(
        &mut self,
        close: &Arc<WindowClose>,
        _attempt: u32,
        state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        match &mut self.canary {
            Some(canary) if close.keys.len() == 1 && canary.slice.contains(&close.keys[0]) => {
                canary.instance.close_window(close, state).await
            }
            _ => self.stable.close_window(close, state).await,
        }
    }

    fn version(&self, record: &Record) -> Option<PluginDigest> {
        Some(match (&self.canary, self.role_for(record)) {
            (Some(canary), Role::Candidate) => canary.instance.digest().clone(),
            _ => self.stable.digest().clone(),
        })
    }
}

impl SlotInstance {
    /// The shadow and the call's admission to it, when a shadow runs and
    /// takes the call (see [`super::shadow`], "Bounded by count and by
    /// bytes").
    fn shadow_admits(&self, records: &[(Arc<Record>, u32)]) -> Option<(Shadow, Admission)> {
        let shadow = self.shadow.as_ref()?;
        let admission = shadow.admit(records)?;
        Some((shadow.clone(), admission))
    }

    /// The live call: the stable version, or the candidate for a key in a
    /// canary's slice.
    async fn handle_live(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
        state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        let role = self.role_for(record);
        let Some(canary) = &mut self.canary else {
            return self.stable.handle(record, attempt, state).await;
        };
        let (instance, counts) = match role {
            Role::Candidate => (&mut canary.instance, &canary.candidate_counts),
            Role::Stable => (&mut self.stable, &canary.stable_counts),
        };
        let result = instance.handle(record, attempt, state).await;
        counts.count_one(result.as_ref().map(|h| &h.outcome));
        result
    }

    /// The live batch call, split between the stable version and a
    /// canary's candidate by key.
    async fn handle_batch_live(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        let Some(canary) = &mut self.canary else {
            return self.stable.handle_batch(records, state).await;
        };
        let (to_candidate, to_stable): (Vec<usize>, Vec<usize>) =
            (0..records.len()).partition(|&i| canary.slice.contains(&records[i].0.partition_key));
        let part = |indices: &[usize]| -> Vec<(Arc<Record>, u32)> {
            indices.iter().map(|&i| records[i].clone()).collect()
        };
        let mut merged = Vec::with_capacity(records.len());
        let mut outputs = Vec::new();
        // Each part's outputs name inputs by their index in the part: put
        // back to the index in the whole batch.
        let mut merge = |indices: &[usize], handled: Handled<Vec<Outcome>>| {
            merged.extend(indices.iter().copied().zip(handled.outcome));
            outputs.extend(handled.outputs.into_iter().map(|mut o| {
                o.input = indices[o.input as usize] as u32;
                o
            }));
        };
        if !to_stable.is_empty() {
            let result = if to_candidate.is_empty() {
                self.stable.handle_batch(records, state).await
            } else {
                // A key is in one part only: each part gets its keys' state.
                let mut own = state.part(&to_stable);
                let result = self.stable.handle_batch(&part(&to_stable), &mut own).await;
                state.absorb(own, &to_stable);
                result
            };
            canary
                .stable_counts
                .count_batch(result.as_ref().map(|h| &h.outcome), to_stable.len());
            merge(&to_stable, result?);
        }
        if !to_candidate.is_empty() {
            let result = if to_stable.is_empty() {
                canary.instance.handle_batch(records, state).await
            } else {
                let mut own = state.part(&to_candidate);
                let result = canary
                    .instance
                    .handle_batch(&part(&to_candidate), &mut own)
                    .await;
                state.absorb(own, &to_candidate);
                result
            };
            canary
                .candidate_counts
                .count_batch(result.as_ref().map(|h| &h.outcome), to_candidate.len());
            merge(&to_candidate, result?);
        }
        merged.sort_unstable_by_key(|(i, _)| *i);
        Ok(Handled {
            outcome: merged.into_iter().map(|(_, outcome)| outcome).collect(),
            outputs,
        })
    }
}
