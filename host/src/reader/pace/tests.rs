//! Unit tests of the read budget, and a simulation of a shard that
//! shardlane shares with other readers under Kinesis' five reads a second.

use super::*;

fn four_a_second() -> Budget {
    Budget {
        max_reads_per_second: 4.0,
        poll_idle: Duration::from_millis(250),
        poll_idle_max: Duration::from_secs(1),
    }
}

/// A shard's pacing at `max` reads a second (250 ms idle, 1 s cap).
fn at_most(max: f64) -> Pace {
    Pace::new(Budget {
        max_reads_per_second: max,
        ..four_a_second()
    })
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
    let mut pace = Pace::new(four_a_second());
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
    let mut pace = at_most(10.0);
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
fn throttling_lowers_the_rate_and_success_wins_it_back_ever_faster() {
    let mut pace = Pace::new(SHARD_LIMIT);
    let close = |a: f64, b: f64| (a - b).abs() < 0.001;
    let mut now = Instant::now();
    step(&mut pace, &mut now, Read::Throttled, ms(10));
    assert!(close(pace.rate(), 3.75), "{}", pace.rate());
    // The next refusal, 267 ms later, cuts what was won back meanwhile
    // (a little) by a quarter again.
    let a = step(&mut pace, &mut now, Read::Throttled, ms(10));
    let lowered = pace.rate();
    assert!((lowered - 2.8125).abs() < 0.01, "{lowered}");
    let b = step(&mut pace, &mut now, Read::Records, ms(10));
    assert_eq!(
        b - a,
        Duration::from_secs_f64(1.0 / lowered),
        "spaced by the lowered rate"
    );
    for _ in 0..40 {
        step(&mut pace, &mut now, Read::Throttled, ms(10));
    }
    // Refused again and again, the rate settles near 0.3 a second, above
    // the floor (one read per 5 s): what each refusal cuts is partly won
    // back before the next.
    let base = pace.rate();
    assert!((MIN_RATE..0.35).contains(&base), "{base}");
    // t seconds after the last refusal the rate has won back
    // 0.5 % of the budget × (t + t² / 20): the longer no read is refused,
    // the faster it comes back.
    let refused = now;
    let won = |t: f64| 0.025 * (t + t * t / 20.0);
    let mut gains = Vec::new();
    for secs in [10, 20, 30, 40] {
        while now - refused < Duration::from_secs(secs) {
            step(&mut pace, &mut now, Read::Records, ms(10));
        }
        let t = (now - refused).as_secs_f64();
        assert!(close(pace.rate(), base + won(t)), "{t} s: {}", pace.rate());
        gains.push(pace.rate());
    }
    assert!(gains[3] - gains[2] > gains[1] - gains[0], "{gains:?}");
    while now - refused < Duration::from_secs(120) {
        step(&mut pace, &mut now, Read::Records, ms(10));
    }
    assert_eq!(pace.rate(), 5.0, "back to the budget, never above");
}

#[test]
fn a_budget_below_the_floor_is_kept() {
    let mut pace = at_most(0.1);
    let mut now = Instant::now();
    step(&mut pace, &mut now, Read::Throttled, ms(10));
    assert_eq!(pace.rate(), 0.1);
    let a = step(&mut pace, &mut now, Read::Records, ms(10));
    let b = step(&mut pace, &mut now, Read::Records, ms(10));
    assert_eq!(b - a, ms(10_000));
}

/// The shard reader's pacing as `reader.rs` applies it: [`Pace`], and
/// after a refused read the reader's error backoff (200 ms doubling per
/// refusal in a row, up to 10 s, reset by a success; here each wait is
/// the mean of its jitter, three quarters of the step).
struct Reader {
    pace: Pace,
    not_before: Option<Instant>,
    refusals: u32,
}

impl Reader {
    fn new(budget: Budget) -> Self {
        Self {
            pace: Pace::new(budget),
            not_before: None,
            refusals: 0,
        }
    }

    fn next(&self, now: Instant) -> Instant {
        let paced = self.pace.next_read().unwrap_or(now);
        self.not_before.map_or(paced, |t| paced.max(t))
    }

    fn read(&mut self, now: Instant, ended: Instant, refused: bool) {
        self.pace.sent(now);
        if refused {
            self.pace.ended(Read::Throttled, ended);
            let step = (ms(200) * 2u32.pow(self.refusals.min(6))).min(Duration::from_secs(10));
            self.refusals += 1;
            self.not_before = Some(ended + step * 3 / 4);
        } else {
            self.pace.ended(Read::Records, ended);
            self.refusals = 0;
            self.not_before = None;
        }
    }
}

/// Another reader of the same shard, for the sharing simulation.
enum Other {
    /// Reads every `period` until `until` (Lambda, or any consumer
    /// polling once a second; at 200 ms, one that takes every read).
    Every {
        period: Duration,
        next: Instant,
        until: Instant,
    },
    /// Another application paced like shardlane.
    Shardlane(Reader),
}

impl Other {
    fn next(&self, now: Instant) -> Instant {
        match self {
            Other::Every { next, until, .. } if next < until => *next,
            Other::Every { .. } => now + Duration::from_secs(1 << 20),
            Other::Shardlane(r) => r.next(now),
        }
    }
}

/// What a sharing run saw, per reader: reads sent, reads refused, and
/// when (from the start) each accepted read was sent.
#[derive(Debug, Default, Clone)]
struct Seen {
    sent: u32,
    refused: u32,
    accepted_at: Vec<Duration>,
}

impl Seen {
    /// Reads accepted per second over the run.
    fn rate(&self, secs: u64) -> f64 {
        self.accepted_at.len() as f64 / secs as f64
    }

    /// Reads accepted per second from `from` to `to` seconds in.
    fn rate_between(&self, from: u64, to: u64) -> f64 {
        let (from, to) = (Duration::from_secs(from), Duration::from_secs(to));
        let n = self
            .accepted_at
            .iter()
            .filter(|t| **t >= from && **t < to)
            .count();
        n as f64 / (to - from).as_secs_f64()
    }

    /// The share of reads refused.
    fn refused_share(&self) -> f64 {
        f64::from(self.refused) / f64::from(self.sent.max(1))
    }
}

/// Runs shardlane's reader of a shard that always has records for `secs`,
/// beside the other readers `others(start)` makes, against a shard that
/// refuses a read when five were accepted in the second before it (how
/// Kinesis counts exactly is not published; a sliding second is the
/// strictest reading). Each read takes 10 ms. GetRecords is sent once
/// (`kinesis.rs`), so every refusal reaches the pacing. Returns what
/// shardlane saw, then what each other reader saw.
fn share(
    budget: Budget,
    others: impl FnOnce(Instant) -> Vec<Other>,
    secs: u64,
) -> (Seen, Vec<Seen>) {
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut others = others(start);
    let mut ours = Reader::new(budget);
    let mut accepted: std::collections::VecDeque<Instant> = Default::default();
    let mut seen_ours = Seen::default();
    let mut seen_others = vec![Seen::default(); others.len()];
    let mut now = start;
    let took = ms(10);
    loop {
        // The reader whose read comes next (shardlane first on a tie).
        let mut who = None;
        let mut at = ours.next(now).max(now);
        for (i, other) in others.iter().enumerate() {
            let t = other.next(now).max(now);
            if t < at {
                at = t;
                who = Some(i);
            }
        }
        if at >= end {
            break;
        }
        now = at;
        while accepted
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            accepted.pop_front();
        }
        let refused = accepted.len() >= 5;
        if !refused {
            accepted.push_back(now);
        }
        let seen = match who {
            None => {
                ours.read(now, now + took, refused);
                &mut seen_ours
            }
            Some(i) => {
                match &mut others[i] {
                    Other::Every { period, next, .. } => *next = now + *period,
                    Other::Shardlane(r) => r.read(now, now + took, refused),
                }
                &mut seen_others[i]
            }
        };
        seen.sent += 1;
        if refused {
            seen.refused += 1;
        } else {
            seen.accepted_at.push(now - start);
        }
        now += Duration::from_micros(1);
    }
    (seen_ours, seen_others)
}

/// A reader polling once a second, `phase` after the start.
fn once_a_second(start: Instant, phase: Duration) -> Other {
    Other::Every {
        period: Duration::from_secs(1),
        next: start + phase,
        until: start + Duration::from_secs(1 << 20),
    }
}

/// A reader that takes every read it can for `secs` from the start.
fn greedy(start: Instant, secs: u64) -> Other {
    Other::Every {
        period: ms(200),
        next: start,
        until: start + Duration::from_secs(secs),
    }
}

const SHARD_LIMIT: Budget = Budget {
    max_reads_per_second: 5.0,
    poll_idle: Duration::from_millis(200),
    poll_idle_max: Duration::from_secs(1),
};

#[test]
fn alone_a_shard_is_read_at_its_whole_four_a_second() {
    let (ours, _) = share(SHARD_LIMIT, |_| vec![], 600);
    assert_eq!(ours.refused, 0);
    assert_eq!(ours.rate(600), 5.0);
}

#[test]
fn beside_readers_polling_once_a_second_the_room_left_is_used_and_theirs_kept() {
    // (phases of the other readers, most of ours refused, most of theirs)
    for (phases, most_refused, theirs_refused) in [(vec![370], 0.02, 0), (vec![370, 810], 0.03, 1)]
    {
        let free = 5.0 - phases.len() as f64;
        let others = |start| {
            phases
                .iter()
                .map(|p| once_a_second(start, ms(*p)))
                .collect()
        };
        let (ours, theirs) = share(SHARD_LIMIT, others, 600);
        let got = ours.rate(600);
        eprintln!(
            "{} others: {got:.2} a second, {:.3} refused",
            phases.len(),
            ours.refused_share()
        );
        assert!(got >= 0.8 * free && got <= free, "{got} of {free}");
        assert!(ours.refused_share() <= most_refused, "{:?}", ours.refused);
        for seen in theirs {
            eprintln!("  theirs: {} of {} refused", seen.refused, seen.sent);
            assert!(seen.refused <= theirs_refused, "theirs: {}", seen.refused);
        }
    }
}

#[test]
fn two_applications_paced_alike_share_the_shard() {
    let (ours, theirs) = share(
        SHARD_LIMIT,
        |_| vec![Other::Shardlane(Reader::new(SHARD_LIMIT))],
        600,
    );
    let (a, b) = (ours.rate(600), theirs[0].rate(600));
    eprintln!(
        "{a:.2} + {b:.2}, refused {:.3} and {:.3}",
        ours.refused_share(),
        theirs[0].refused_share()
    );
    assert!(a + b >= 4.0, "{a} + {b}");
    assert!(a.min(b) >= 1.5, "{a} and {b}");
    assert!(
        ours.refused_share() <= 0.05 && theirs[0].refused_share() <= 0.05,
        "{} {}",
        ours.refused,
        theirs[0].refused
    );
}

#[test]
fn after_a_greedy_reader_leaves_the_rate_comes_back() {
    let (ours, _) = share(SHARD_LIMIT, |start| vec![greedy(start, 60)], 240);
    let (during, first, second) = (
        ours.rate_between(0, 60),
        ours.rate_between(60, 120),
        ours.rate_between(120, 180),
    );
    eprintln!("{during:.2} while it read, {first:.2} then {second:.2}");
    assert!(
        during < 1.0,
        "{during} a second beside a reader taking every read"
    );
    // Over two reads a second on average in the minute after it left;
    // the whole budget in the minute after that.
    assert!(first >= 2.0, "{first} a second in the minute after it left");
    assert!(second >= 4.9, "{second} a second in the minute after that");
}
