//! A lane's metric handles, registered once when the lane is made, so a
//! call costs a few relaxed atomic adds.

use crate::telemetry::{
    BATCH_BUCKETS, Counter, DURATION_BUCKETS, Histogram, SubscriptionStatus, Telemetry,
    VersionCounts,
};

/// A lane's metric handles, registered once.
pub(crate) struct LaneMetrics {
    pub(super) acked: Counter,
    pub(super) rejected: Counter,
    pub(super) retried: Counter,
    pub(super) dead_lettered: Counter,
    pub(super) skipped: Counter,
    pub(super) blocked: Counter,
    pub(super) traps: Counter,
    pub(super) timeouts: Counter,
    pub(super) guest_errors: Counter,
    pub(super) recycles: Counter,
    pub(super) calls: Counter,
    pub(super) duration: Histogram,
    pub(super) batch_size: Histogram,
    /// Window closes, by how they ended.
    pub(super) closes: CloseCounters,
}

impl LaneMetrics {
    pub(crate) fn new(t: &Telemetry, status: &SubscriptionStatus, sub: &str, lane: u32) -> Self {
        let outcome = |o: &str| {
            t.counter(
                "shardlane_records_total",
                "Records handled, by the handler's outcome (retry counts each attempt).",
                &[("subscription", sub), ("outcome", o)],
            )
        };
        let failure = |k: &str| {
            t.counter(
                "shardlane_call_failures_total",
                "Handler calls that failed without an outcome, by kind.",
                &[("subscription", sub), ("kind", k)],
            )
        };
        let lane_label = lane.to_string();
        // One counter serves /metrics and the status page's lane load.
        let calls = t.counter(
            "shardlane_lane_calls_total",
            "Handler calls per lane.",
            &[("subscription", sub), ("lane", &lane_label)],
        );
        status.add_lane(lane, calls.clone());
        let (acked, rejected, retried) = (outcome("ack"), outcome("reject"), outcome("retry"));
        let (traps, timeouts, guest_errors) =
            (failure("trap"), failure("timeout"), failure("guest_error"));
        // Every lane's are the same series: the page's outcomes of the
        // stable version while no canary runs.
        status.set_outcomes(VersionCounts {
            ack: acked.clone(),
            retry: retried.clone(),
            reject: rejected.clone(),
            failed: vec![traps.clone(), timeouts.clone(), guest_errors.clone()],
        });
        Self {
            acked,
            rejected,
            retried,
            dead_lettered: t.counter(
                "shardlane_dead_lettered_total",
                "Records put to the dead-letter stream.",
                &[("subscription", sub)],
            ),
            skipped: t.counter(
                "shardlane_records_skipped_total",
                "Records given up on and skipped.",
                &[("subscription", sub)],
            ),
            blocked: t.counter(
                "shardlane_records_blocked_total",
                "Attempts of records past their attempts or age that on_failure = block keeps retrying.",
                &[("subscription", sub)],
            ),
            traps,
            timeouts,
            guest_errors,
            recycles: t.counter(
                "shardlane_instance_recycles_total",
                "Instances dropped after a trap or timeout and made afresh.",
                &[("subscription", sub)],
            ),
            calls,
            duration: t.histogram(
                "shardlane_handler_duration_seconds",
                "Handler call time, per call (a batch is one call).",
                &[("subscription", sub)],
                DURATION_BUCKETS,
            ),
            batch_size: t.histogram(
                "shardlane_batch_size",
                "Records per handle-batch call.",
                &[("subscription", sub)],
                BATCH_BUCKETS,
            ),
            closes: closes(t, sub),
        }
    }
}

/// Window closes by how they ended (`shardlane_window_closes_total`).
pub(crate) struct CloseCounters {
    pub(super) acked: Counter,
    pub(super) rejected: Counter,
    pub(super) given_up: Counter,
}

fn closes(t: &Telemetry, sub: &str) -> CloseCounters {
    let outcome = |o: &str| {
        t.counter(
            "shardlane_window_closes_total",
            "Window closes (close-window calls that ended), by how: acked, rejected, given up after max_attempts.",
            &[("subscription", sub), ("outcome", o)],
        )
    };
    CloseCounters {
        acked: outcome("ack"),
        rejected: outcome("reject"),
        given_up: outcome("given_up"),
    }
}
