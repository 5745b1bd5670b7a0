//! The keeper's heartbeat: this instance's proof of liveness, one write
//! per `renew_every` whatever the number of leases it holds, and the load
//! it publishes with it (see "Heartbeats" in [`crate::lease`] for the
//! rules and why they fence).

use std::collections::HashMap;

use tokio::time::Instant;

use super::calls::{Io, bounded};
use super::{Keeper, RETRY_FIRST};
use crate::backoff::Backoff;
use crate::ids::ShardId;
use crate::lease::{Heartbeat, LeaseError, Load};

/// How fast the published load follows a change: the time constant of
/// its exponential smoothing, in seconds.
const LOAD_SMOOTHING: f64 = 15.0;

/// A shard's rate is settled once it has been measured this long.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(15);

/// This instance's heartbeat, as the keeper keeps it.
pub(super) struct Beat {
    /// The counter of our last heartbeat that landed.
    pub counter: Option<u64>,
    /// The hand-over requests it counted.
    pub asks: Option<u64>,
    /// A heartbeat is under way.
    pub writing: bool,
    /// The last one failed: none before then.
    pub retry_at: Option<Instant>,
    pub backoff: Backoff,
}

impl Beat {
    pub(super) fn new(renew_every: std::time::Duration) -> Self {
        Self {
            counter: None,
            asks: None,
            writing: false,
            retry_at: None,
            backoff: Backoff::new(RETRY_FIRST.min(renew_every), renew_every),
        }
    }
}

/// Records a second per held shard, smoothed: what the heartbeat
/// publishes for balancing by load.
#[derive(Default)]
pub(super) struct LoadMeter {
    /// Per shard: the records counter and when it was read, the rate (none
    /// before a second reading), and since when it is measured.
    shards: HashMap<ShardId, Meter>,
    /// When the last readings were taken.
    now: Option<Instant>,
}

struct Meter {
    count: u64,
    at: Instant,
    rate: Option<f64>,
    since: Instant,
}

impl LoadMeter {
    /// Takes in each held shard's records counter at `now`; forgets the
    /// shards not held.
    pub(super) fn observe(
        &mut self,
        counts: impl IntoIterator<Item = (ShardId, u64)>,
        now: Instant,
    ) {
        let mut next = HashMap::new();
        for (shard, count) in counts {
            let meter = match self.shards.remove(&shard) {
                Some(m) => {
                    let dt = now.duration_since(m.at).as_secs_f64();
                    if dt <= 0.0 {
                        m
                    } else {
                        let sample = count.saturating_sub(m.count) as f64 / dt;
                        // The first rate is the first sample; then smoothed.
                        let rate = match m.rate {
                            None => sample,
                            Some(rate) => {
                                let alpha = 1.0 - (-dt / LOAD_SMOOTHING).exp();
                                rate + alpha * (sample - rate)
                            }
                        };
                        Meter {
                            count,
                            at: now,
                            rate: Some(rate),
                            since: m.since,
                        }
                    }
                }
                None => Meter {
                    count,
                    at: now,
                    rate: None,
                    since: now,
                },
            };
            next.insert(shard, meter);
        }
        self.shards = next;
        self.now = Some(now);
    }

    /// The load to publish: the total, the busiest shards, and whether
    /// every rate is settled.
    pub(super) fn load(&self) -> Load {
        let mut rates: Vec<(ShardId, f64)> = self
            .shards
            .iter()
            .map(|(s, m)| (s.clone(), (m.rate.unwrap_or(0.0) * 100.0).round() / 100.0))
            .collect();
        let total = rates.iter().map(|(_, r)| r).sum();
        rates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        rates.retain(|(_, r)| *r > 0.0);
        rates.truncate(Load::HOTTEST);
        let settled = self.now.is_some_and(|now| {
            self.shards
                .values()
                .all(|m| now.duration_since(m.since) >= SETTLE)
        });
        Load {
            total,
            hottest: rates,
            settled,
        }
    }
}

impl Keeper {
    /// Writes the heartbeat (in a task), unless one is under way or
    /// backing off; refreshes the load it carries first.
    pub(super) fn beat(&mut self) {
        let now = Instant::now();
        if self.beat.writing || self.beat.retry_at.is_some_and(|at| at > now) {
            return;
        }
        let counts: Vec<(ShardId, u64)> = self
            .status
            .shards()
            .into_iter()
            .filter(|(s, _)| self.held.contains_key(s))
            .map(|(s, st)| (s, st.records.get()))
            .collect();
        self.load.observe(counts, now);
        let load = self.load.load();
        self.beat.writing = true;
        let store = self.store.clone();
        let (sub, stream) = (
            self.subscription.name.clone(),
            self.subscription.stream.clone(),
        );
        let owner = self.owner.clone();
        let limit = self.lease.lease_duration;
        self.io.spawn(async move {
            let sent_at = Instant::now();
            let result = bounded(limit, store.heartbeat(&sub, &stream, &owner, &load)).await;
            Io::Beat { sent_at, result }
        });
    }

    /// A heartbeat answered. Landed: every lease still valid now stays
    /// valid until `sent_at` plus a lease duration; one whose validity
    /// already lapsed may have been taken meanwhile, so it is verified by a
    /// conditional renewal of its own before it counts again. Failed: it
    /// is tried again after a backoff, and the leases whose validity has
    /// passed are lost, all at once.
    pub(super) fn on_beat(&mut self, sent_at: Instant, result: Result<Heartbeat, LeaseError>) {
        self.beat.writing = false;
        let now = Instant::now();
        let duration = self.lease.lease_duration;
        match result {
            Ok(beat) => {
                self.beat.counter = Some(beat.counter);
                // Someone asked for a lease of ours since the last one:
                // look at the table now, not at the next sync.
                if self.beat.asks.is_some_and(|asks| asks != beat.asks) {
                    self.resync_at = Some(now);
                }
                self.beat.asks = Some(beat.asks);
                self.beat.retry_at = None;
                self.beat.backoff.reset();
                let mut lapsed = Vec::new();
                for (shard, holding) in &mut self.held {
                    if now < *holding.valid_until.borrow() {
                        holding.extend(sent_at, duration);
                    } else {
                        holding.renew_due = true;
                        lapsed.push(shard.clone());
                    }
                }
                for shard in lapsed {
                    tracing::info!(subscription = %self.subscription.name, shard_id = %shard, "lease lapsed before the heartbeat landed; verifying it is still ours");
                    self.next_write(&shard);
                }
            }
            Err(e) => {
                self.beat.retry_at = Some(now + self.beat.backoff.next_wait());
                self.warn_failed(
                    "heartbeat",
                    None,
                    &e,
                    "heartbeat not written; retrying after a backoff",
                );
                let overdue: Vec<ShardId> = self
                    .held
                    .iter()
                    .filter(|(_, h)| now >= *h.valid_until.borrow() && !h.writing)
                    .map(|(s, _)| s.clone())
                    .collect();
                for shard in overdue {
                    self.lose(&shard, "no heartbeat landed within a lease duration");
                }
            }
        }
    }

    /// At shutdown, once every lease is released: deletes our heartbeat,
    /// so the others stop counting this instance at once.
    pub(super) fn retire(&mut self) {
        let Some(counter) = self.beat.counter else {
            return;
        };
        let store = self.store.clone();
        let (sub, stream) = (
            self.subscription.name.clone(),
            self.subscription.stream.clone(),
        );
        let owner = self.owner.clone();
        let limit = self.lease.lease_duration;
        self.io.spawn(async move {
            let result = bounded(
                limit,
                store.retire_heartbeat(&sub, &stream, &owner, counter),
            )
            .await;
            Io::Retired { owner, result }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_meter_smooths_rates_and_lists_the_busiest_first() {
        let mut meter = LoadMeter::default();
        let t0 = Instant::now();
        meter.observe([("a".into(), 0), ("b".into(), 0), ("c".into(), 0)], t0);
        assert_eq!(meter.load().total, 0.0);
        // 100/s on a, 10/s on b, nothing on c, for 60 s in 3 s steps.
        for i in 1..=20u64 {
            assert_eq!(meter.load().settled, i > 5, "settled after 15 s");
            meter.observe(
                [("a".into(), 300 * i), ("b".into(), 30 * i), ("c".into(), 0)],
                t0 + Duration::from_secs(3 * i),
            );
        }
        let load = meter.load();
        let a = load.rate_of(&"a".into());
        assert!((80.0..=100.0).contains(&a), "{load:?}");
        assert_eq!(load.hottest[0].0, ShardId::from("a"));
        assert_eq!(load.hottest.len(), 2, "a quiet shard is not listed");
        assert!((load.total - a - load.rate_of(&"b".into())).abs() < 1e-9);
        // A shard no longer held is forgotten; one just taken unsettles.
        meter.observe(
            [("b".into(), 700), ("d".into(), 0)],
            t0 + Duration::from_secs(63),
        );
        assert_eq!(meter.load().rate_of(&"a".into()), 0.0);
        assert!(!meter.load().settled);
    }
}
