//! The read budget of one shard: when a reader may send its next
//! GetRecords. Pure (the caller passes the clock); the shard reader owns
//! one per shard and sleeps until [`Pace::next_read`] before every read.
//!
//! Kinesis allows five GetRecords per second per shard, **shared by every
//! consumer of the stream**; a consumer that polls an idle shard five
//! times a second leaves nothing to the others, and each empty read costs
//! CPU (signing, HTTP, JSON). The rules:
//! - **Budget**: two reads of a shard are never closer than
//!   `1 / max_reads_per_second` (default 4: one read a second stays free
//!   for a KCL or Lambda consumer at its default rate).
//! - **Records**: a read that returned records is followed as soon as the
//!   budget allows, so a backlog drains at the budget's pace.
//! - **Empty reads** wait `poll_idle`; once a shard has been empty for
//!   [`IDLE_RAMP_AFTER`] (30 s), each further empty read doubles the wait,
//!   up to `poll_idle_max` (default 1 s, the rate KCL and Lambda poll at).
//!   The first read with records restores `poll_idle`. A stream that gets
//!   a record every few seconds per shard keeps the short wait (and its
//!   latency); one that is silent for minutes costs a read a second. (At
//!   10 s, a 4-shard stream with a record every half second lost about one
//!   record in 150 to the ramp in the latency benchmark: 30 s keeps the
//!   ramp to shards that really are idle.)
//! - **Throttling** (`ProvisionedThroughputExceeded`: other consumers use
//!   the budget too) halves the shard's rate, down to [`MIN_RATE`]; each
//!   second without throttling wins back [`RECOVERY`] of the configured
//!   budget (from half to full in 10 s). So a shared shard settles near the
//!   point where reads start being refused instead of being refused at a
//!   fixed rate with ever longer waits. (The reader's jittered error
//!   backoff still applies on top.)

use std::time::Duration;

use tokio::time::Instant;

/// How long a shard must have been empty before its idle wait grows.
pub(crate) const IDLE_RAMP_AFTER: Duration = Duration::from_secs(30);
/// The lowest rate throttling can push a shard's reads down to, per second.
pub(crate) const MIN_RATE: f64 = 0.2;
/// The share of the configured budget won back per second without
/// throttling.
pub(crate) const RECOVERY: f64 = 0.05;

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
    /// When the rate last changed (throttled, or recovered).
    adjusted: Option<Instant>,
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
                self.rate = (self.rate / 2.0).max(MIN_RATE.min(self.budget.max_reads_per_second));
                self.adjusted = Some(now);
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

    fn recover(&mut self, now: Instant) {
        let max = self.budget.max_reads_per_second;
        if let Some(since) = self.adjusted.replace(now) {
            let secs = now.duration_since(since).as_secs_f64();
            self.rate = (self.rate + max * RECOVERY * secs).min(max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> Budget {
        Budget {
            max_reads_per_second: 4.0,
            poll_idle: Duration::from_millis(250),
            poll_idle_max: Duration::from_secs(1),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Reads `read` at the earliest allowed time from `now` on; returns
    /// when it was sent.
    fn step(pace: &mut Pace, now: &mut Instant, read: Read, took: Duration) -> Instant {
        if let Some(next) = pace.next_read() {
            *now = (*now).max(next);
        }
        let sent = *now;
        pace.sent(sent);
        *now += took;
        pace.ended(read, *now);
        sent
    }

    #[test]
    fn reads_with_records_follow_each_other_within_the_budget() {
        let mut pace = Pace::new(budget());
        let mut now = Instant::now();
        let sent: Vec<Instant> = (0..5)
            .map(|_| step(&mut pace, &mut now, Read::Records, ms(30)))
            .collect();
        for pair in sent.windows(2) {
            assert_eq!(pair[1] - pair[0], ms(250), "4 reads a second, no more");
        }
        // A slow read (longer than the spacing) is followed at once.
        let before = step(&mut pace, &mut now, Read::Records, ms(400));
        let after = step(&mut pace, &mut now, Read::Records, ms(10));
        assert_eq!(after - before, ms(400));
    }

    #[test]
    fn empty_reads_wait_poll_idle_then_ramp_up_to_the_cap_after_a_quiet_spell() {
        let mut pace = Pace::new(Budget {
            max_reads_per_second: 10.0,
            ..budget()
        });
        let mut now = Instant::now();
        let start = now;
        let mut gaps = Vec::new();
        let mut last = step(&mut pace, &mut now, Read::Empty, ms(10));
        while now - start < IDLE_RAMP_AFTER * 2 {
            let sent = step(&mut pace, &mut now, Read::Empty, ms(10));
            gaps.push((sent - start, sent - last));
            last = sent;
        }
        for (at, gap) in &gaps {
            if *at < IDLE_RAMP_AFTER {
                assert_eq!(
                    *gap,
                    ms(260),
                    "poll_idle (+ the read) while the shard was busy lately"
                );
            }
        }
        let (_, last_gap) = gaps.last().unwrap();
        assert_eq!(*last_gap, ms(1010), "capped at poll_idle_max");
        // Doubling on the way: 500, then 1000.
        assert!(gaps.iter().any(|(_, g)| *g == ms(510)));

        // One read with records restores the short wait.
        step(&mut pace, &mut now, Read::Records, ms(10));
        let a = step(&mut pace, &mut now, Read::Empty, ms(10));
        let b = step(&mut pace, &mut now, Read::Empty, ms(10));
        assert_eq!(b - a, ms(260));
    }

    #[test]
    fn throttling_lowers_the_rate_and_success_wins_it_back() {
        let mut pace = Pace::new(budget());
        let mut now = Instant::now();
        step(&mut pace, &mut now, Read::Throttled, ms(10));
        assert_eq!(pace.rate(), 2.0);
        let a = step(&mut pace, &mut now, Read::Throttled, ms(10));
        assert_eq!(pace.rate(), 1.0);
        let b = step(&mut pace, &mut now, Read::Records, ms(10));
        assert_eq!(b - a, ms(1000), "spaced by the lowered rate");
        // A second at 1/s wins back 5 % of 4 a second: 0.2.
        assert!((pace.rate() - 1.2).abs() < 0.01, "{}", pace.rate());
        for _ in 0..10 {
            step(&mut pace, &mut now, Read::Throttled, ms(10));
        }
        assert_eq!(pace.rate(), MIN_RATE, "never below the floor");
        let start = now;
        while now - start < Duration::from_secs(15) {
            step(&mut pace, &mut now, Read::Records, ms(10));
        }
        assert!(
            pace.rate() < 4.0,
            "recovery takes its time: {}",
            pace.rate()
        );
        while now - start < Duration::from_secs(30) {
            step(&mut pace, &mut now, Read::Records, ms(10));
        }
        assert_eq!(pace.rate(), 4.0, "back to the budget, never above");
    }

    #[test]
    fn a_budget_below_the_floor_is_kept() {
        let mut pace = Pace::new(Budget {
            max_reads_per_second: 0.1,
            ..budget()
        });
        let mut now = Instant::now();
        step(&mut pace, &mut now, Read::Throttled, ms(10));
        assert_eq!(pace.rate(), 0.1);
        let a = step(&mut pace, &mut now, Read::Records, ms(10));
        let b = step(&mut pace, &mut now, Read::Records, ms(10));
        assert_eq!(b - a, ms(10_000));
    }
}
