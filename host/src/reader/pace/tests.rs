//! Unit tests of the read budget, and a simulation of a shard that
//! shardlane shares with other readers under Kinesis' five reads a second.

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
fn throttling_lowers_the_rate_and_success_wins_it_back_ever_faster() {
    let mut pace = Pace::new(SHARD_LIMIT);
    let close = |a: f64, b: f64| (a - b).abs() < 0.001;
    let mut now = Instant::now();
    step(&mut pace, &mut now, Read::Throttled, ms(10));
    assert!(close(pace.rate(), 4.0), "{}", pace.rate());
    let a = step(&mut pace, &mut now, Read::Throttled, ms(10));
    assert!(close(pace.rate(), 3.2), "{}", pace.rate());
    let b = step(&mut pace, &mut now, Read::Records, ms(10));
    assert_eq!(
        b - a,
        Duration::from_secs_f64(1.0 / 3.2),
        "spaced by the lowered rate"
    );
    for _ in 0..40 {
        step(&mut pace, &mut now, Read::Throttled, ms(10));
    }
    assert_eq!(pace.rate(), MIN_RATE, "never below the floor");
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
        assert!(
            close(pace.rate(), MIN_RATE + won(t)),
            "{t} s: {}",
            pace.rate()
        );
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

/// Another reader of the same shard, for the sharing simulation.
enum Other {
    /// Reads every `period` until `until` (Lambda, or KCL on an idle
    /// shard; at 200 ms, a reader that takes every read).
    Every {
        period: Duration,
        next: Instant,
        until: Instant,
    },
    /// Another application paced like shardlane.
    Paced(Pace),
}

impl Other {
    fn next(&self, now: Instant) -> Instant {
        match self {
            Other::Every { next, until, .. } if next < until => *next,
            Other::Every { .. } => now + Duration::from_secs(1 << 20),
            Other::Paced(p) => p.next_read().unwrap_or(now),
        }
    }
}

/// What a sharing run saw, per reader: reads sent and reads refused.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    sent: u32,
    refused: u32,
}

/// Runs shardlane's pacing of a shard that always has records for
/// `secs`, beside `others`, against a shard that refuses a read when five
/// were accepted in the second before it. Each read takes 10 ms; a refused
/// one is retried when pacing allows (the reader's error backoff, which
/// only adds to the wait, is left out). Returns what shardlane saw, then
/// what each other reader saw.
fn share(budget: Budget, mut others: Vec<Other>, secs: u64) -> (Seen, Vec<Seen>) {
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut ours = Pace::new(budget);
    let mut accepted: std::collections::VecDeque<Instant> = Default::default();
    let mut seen_ours = Seen::default();
    let mut seen_others = vec![Seen::default(); others.len()];
    let mut now = start;
    let took = ms(10);
    loop {
        // The reader whose read comes next (shardlane first on a tie).
        let mut who = None;
        let mut at = ours.next_read().unwrap_or(now).max(now);
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
        let read = if refused {
            Read::Throttled
        } else {
            Read::Records
        };
        let seen = match who {
            None => {
                ours.sent(now);
                ours.ended(read, now + took);
                &mut seen_ours
            }
            Some(i) => {
                match &mut others[i] {
                    Other::Every { period, next, .. } => *next = now + *period,
                    Other::Paced(p) => {
                        p.sent(now);
                        p.ended(read, now + took);
                    }
                }
                &mut seen_others[i]
            }
        };
        seen.sent += 1;
        seen.refused += u32::from(refused);
        now += Duration::from_micros(1);
    }
    (seen_ours, seen_others)
}

fn lambda(phase_ms: u64) -> Other {
    Other::Every {
        period: Duration::from_secs(1),
        next: Instant::now() + ms(phase_ms),
        until: Instant::now() + Duration::from_secs(1 << 20),
    }
}

fn greedy(until_secs: u64) -> Other {
    Other::Every {
        period: ms(200),
        next: Instant::now(),
        until: Instant::now() + Duration::from_secs(until_secs),
    }
}

/// Reads accepted per second.
fn accepted(seen: Seen, secs: u64) -> f64 {
    f64::from(seen.sent - seen.refused) / secs as f64
}

/// The share of reads refused.
fn refused(seen: Seen) -> f64 {
    f64::from(seen.refused) / f64::from(seen.sent.max(1))
}

const SHARD_LIMIT: Budget = Budget {
    max_reads_per_second: 5.0,
    poll_idle: Duration::from_millis(200),
    poll_idle_max: Duration::from_secs(1),
};

#[test]
fn alone_a_shard_is_read_at_its_whole_budget() {
    let (ours, _) = share(SHARD_LIMIT, vec![], 600);
    assert_eq!(ours.refused, 0);
    assert_eq!(accepted(ours, 600), 5.0);
}

#[test]
fn beside_readers_polling_once_a_second_the_room_left_is_used_and_theirs_kept() {
    for phases in [vec![370], vec![370, 810]] {
        let free = 5.0 - phases.len() as f64;
        let others: Vec<Other> = phases.iter().map(|p| lambda(*p)).collect();
        let (ours, theirs) = share(SHARD_LIMIT, others, 600);
        let got = accepted(ours, 600);
        assert!(got >= 0.85 * free && got <= free, "{got} of {free}");
        assert!(refused(ours) <= 0.03, "{ours:?}");
        for seen in theirs {
            assert!(refused(seen) <= 0.01, "theirs: {seen:?}");
        }
    }
}

#[test]
fn two_applications_paced_alike_share_the_shard() {
    let (ours, theirs) = share(SHARD_LIMIT, vec![Other::Paced(Pace::new(SHARD_LIMIT))], 600);
    let (a, b) = (accepted(ours, 600), accepted(theirs[0], 600));
    assert!(a + b >= 4.0, "{a} + {b}");
    assert!(a.min(b) >= 1.5, "{a} and {b}");
    assert!(
        refused(ours) <= 0.05 && refused(theirs[0]) <= 0.05,
        "{ours:?} {theirs:?}"
    );
}

#[test]
fn after_a_greedy_reader_leaves_the_rate_comes_back() {
    let (during, _) = share(SHARD_LIMIT, vec![greedy(60)], 60);
    assert!(accepted(during, 60) < 1.0, "{during:?}");
    // 60 s of a reader taking every read, then alone: on average
    // two reads a second in the minute after it left, the whole budget
    // two minutes later.
    let (all, _) = share(SHARD_LIMIT, vec![greedy(60)], 120);
    let after = f64::from(all.sent - all.refused - (during.sent - during.refused)) / 60.0;
    assert!(after >= 2.0, "{after} a second in the minute after it left");
    let (all, _) = share(SHARD_LIMIT, vec![greedy(60)], 240);
    let (last, _) = share(SHARD_LIMIT, vec![greedy(60)], 180);
    let after = f64::from(all.sent - last.sent) / 60.0;
    assert!(after >= 4.9, "{after} a second two minutes after it left");
}
