//! The read budget of one shard: when a reader may send its next
//! GetRecords. Pure (the caller passes the clock); the shard reader owns
//! one per shard and sleeps until [`Pace::next_read`] before every read.
//!
//! Kinesis allows five GetRecords per second per shard, **shared by every
//! consumer of the stream**; a consumer that polls an idle shard five
//! times a second leaves nothing to the others, and each empty read costs
//! CPU (signing, HTTP, JSON). The rules:
//! - **Budget**: two reads of a shard are never closer than
//!   `1 / max_reads_per_second` (default 5, the shard's limit and KCL's
//!   200 ms minimum: how much of it other readers get is what the
//!   throttling rule below finds out).
//! - **Records**: a read that returned records is followed as soon as the
//!   budget allows, so a backlog drains at the budget's pace.
//! - **Empty reads** wait `poll_idle` (default 200 ms: a record that
//!   arrives on a quiet shard is about 100 ms from its handler); once a
//!   shard has been empty for [`IDLE_RAMP_AFTER`] (30 s), each further
//!   empty read doubles the wait, up to `poll_idle_max` (default 1.5 s, KCL's
//!   time between reads; Lambda polls about once a second), leaving the
//!   rest of the shard's five reads a second to others.
//!   The first read with records restores `poll_idle`. A stream that gets
//!   a record every few seconds per shard keeps the short wait (and its
//!   latency); one that is silent for minutes costs a read every 1.5 s. (At
//!   10 s, a 4-shard stream with a record every half second delayed about one
//!   record in 150 by the ramp in the latency benchmark: 30 s keeps the
//!   ramp to shards that really are idle.)
//! - **Throttling** (`ProvisionedThroughputExceeded`: other consumers use
//!   the shard's reads too) multiplies the shard's rate by [`KEPT_ON_REFUSAL`]
//!   (0.75), down to [`MIN_RATE`]. Without refusals the rate grows back,
//!   slowly at first ([`RECOVERY`]: 0.5 % of the budget a second) and
//!   faster the longer no read is refused (the pace grows by as much
//!   again every [`RECOVERY_SPEEDUP`], 10 s), never above the budget.
//!   This is additive-increase/multiplicative-decrease, as TCP shares a
//!   link. GetRecords is sent once (`kinesis.rs`: no SDK retries), so
//!   every refusal reaches this rule and no read is spent unseen.
//!
//! What that gives, from the simulation in the tests (a shard that refuses
//! a read when five were accepted in the second before it; the reader's
//! error backoff included): beside a consumer that polls once a second,
//! shardlane settles at about 3.4 of the four reads a second left, with
//! 1.5 % of its reads refused and none of the other's; beside two such, about
//! 2.5 of three (2.4 % refused; one of their 1,200 reads); two shardlane
//! applications share the shard at about 2 reads a second each (4.2 of the
//! five used, under 4 % refused); after a reader that took every read for a
//! minute leaves, about 3 reads a second in the minute after and the whole
//! budget in the minute after that.

use std::time::Duration;

use tokio::time::Instant;

/// How long a shard must have been empty before its idle wait grows.
pub(crate) const IDLE_RAMP_AFTER: Duration = Duration::from_secs(30);
/// The lowest rate throttling can push a shard's reads down to, per second.
pub(crate) const MIN_RATE: f64 = 0.2;
/// The share of the shard's rate a refused read leaves it.
pub(crate) const KEPT_ON_REFUSAL: f64 = 0.75;
/// The share of the configured budget won back per second right after a
/// refused read; the pace of recovery grows by this much again every
/// [`RECOVERY_SPEEDUP`] without one (module docs).
pub(crate) const RECOVERY: f64 = 0.005;
/// See [`RECOVERY`].
pub(crate) const RECOVERY_SPEEDUP: Duration = Duration::from_secs(10);

/// How a GetRecords ended, as far as pacing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// It returned records.
    Records,
    /// It returned none.
    Empty,
    /// Refused for throughput.
    Throttled,
    /// Failed otherwise (the error backoff decides the wait).
    Failed,
}

/// The settings pacing works from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Budget {
    /// Reads per second at most.
    pub max_reads_per_second: f64,
    /// Wait after an empty read.
    pub poll_idle: Duration,
    /// The longest wait after empty reads.
    pub poll_idle_max: Duration,
}

/// One shard's pacing state (module docs).
#[derive(Debug)]
pub(crate) struct Pace {
    budget: Budget,
    /// Reads per second allowed now (throttling lowers it).
    rate: f64,
    /// When the last read was sent.
    last_sent: Option<Instant>,
    /// Since when the shard has been returning empty reads.
    empty_since: Option<Instant>,
    /// The wait after the next empty read.
    idle_wait: Duration,
    /// The earliest time of the next read.
    next: Option<Instant>,
    /// When recovery was last credited (every read that ended, once a
    /// read has been refused).
    adjusted: Option<Instant>,
    /// When the latest refused read ended.
    refused: Option<Instant>,
}

impl Pace {
    /// A shard's pacing, at its full budget.
    pub(crate) fn new(budget: Budget) -> Self {
        Self {
            budget,
            rate: budget.max_reads_per_second,
            last_sent: None,
            empty_since: None,
            idle_wait: budget.poll_idle,
            next: None,
            adjusted: None,
            refused: None,
        }
    }

    /// The earliest time the next read may be sent; `None`: at once.
    pub(crate) fn next_read(&self) -> Option<Instant> {
        self.next
    }

    /// The reads per second allowed now.
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    /// A read is being sent at `now`.
    pub(crate) fn sent(&mut self, now: Instant) {
        self.last_sent = Some(now);
    }

    /// The read sent last ended as `read`, at `now`: sets the earliest
    /// time of the next one (see [`Pace::next_read`]).
    pub(crate) fn ended(&mut self, read: Read, now: Instant) {
        match read {
            Read::Records => {
                self.recover(now);
                self.empty_since = None;
                self.idle_wait = self.budget.poll_idle;
            }
            Read::Empty => {
                self.recover(now);
                let since = *self.empty_since.get_or_insert(now);
                if now.duration_since(since) >= IDLE_RAMP_AFTER {
                    self.idle_wait = (self.idle_wait * 2).min(self.budget.poll_idle_max);
                }
            }
            Read::Throttled => {
                self.recover(now);
                self.rate = (self.rate * KEPT_ON_REFUSAL)
                    .max(MIN_RATE.min(self.budget.max_reads_per_second));
                self.adjusted = Some(now);
                self.refused = Some(now);
            }
            Read::Failed => {}
        }
        let spacing = Duration::from_secs_f64(1.0 / self.rate);
        let mut next = self.last_sent.map_or(now, |sent| sent + spacing);
        if read == Read::Empty {
            next = next.max(now + self.idle_wait);
        }
        self.next = Some(next);
    }

    /// Wins back rate for the time since it last changed, faster the
    /// longer no read has been refused (module docs).
    fn recover(&mut self, now: Instant) {
        let max = self.budget.max_reads_per_second;
        let (Some(since), Some(refused)) = (self.adjusted.replace(now), self.refused) else {
            return;
        };
        // The pace at t seconds after the refusal is
        // RECOVERY * max * (1 + t / RECOVERY_SPEEDUP); integrate it from
        // `since` to `now`.
        let t0 = since.duration_since(refused).as_secs_f64();
        let t1 = now.duration_since(refused).as_secs_f64();
        let speedup = RECOVERY_SPEEDUP.as_secs_f64();
        let won = RECOVERY * max * ((t1 - t0) + (t1 * t1 - t0 * t0) / (2.0 * speedup));
        self.rate = (self.rate + won).min(max);
    }
}

#[cfg(test)]
mod tests;
