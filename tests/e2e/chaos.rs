//! Chaos: a fleet of three host processes sharing a DynamoDB lease table,
//! under a continuous keyed producer, through random `kill -9` + restart
//! cycles and then SIGTERM cycles. Asserted: no record is lost; per key,
//! first deliveries come in put order; a record is handled twice only
//! shortly after a `kill -9` (what was in flight when the process died);
//! SIGTERM hand-overs handle nothing twice.
//!
//! Bounded: `SHARDLANE_CHAOS_CYCLES` kill cycles (5 by default, which CI
//! runs), each 1.5–3.5 s apart, then 2 SIGTERM cycles. A longer run, as an
//! operator would make before a release:
//!
//! ```sh
//! SHARDLANE_CHAOS_CYCLES=20 cargo test -p shardlane --test e2e -- chaos:: --nocapture
//! ```
//!
//! The seed of the random choices is printed; `SHARDLANE_CHAOS_SEED`
//! replays a run.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use shardlane_testkit::{Dynalite, HostProcess, Kinesis, guests, unique_name};

use crate::common::{field, guest_lines, shardlane_bin};
use crate::leases::{check_all_handled, env, fleet_config, handled, handled_data, producer};

/// How long after a `kill -9` a redelivery is expected: the dead host's
/// leases expire after `lease_duration` (3 s here), are taken at the next
/// sync (1 s), and the records after its last checkpoint are read again.
const REDELIVERY_WINDOW: Duration = Duration::from_secs(15);

/// A small deterministic generator (xorshift64*): the run is replayable
/// from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The host's log timestamps are RFC 3339 with microseconds, UTC: the
/// same format compares as text.
fn stamp(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

fn start(owner: &str, table: &str, stream: &str, env: &[(&str, &str)]) -> HostProcess {
    let guests = guests::build().unwrap();
    HostProcess::start_with(
        shardlane_bin(),
        &fleet_config(owner, table, stream, &guests.retry, ""),
        env,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_loses_nothing_through_random_kill_9_and_sigterm_cycles() {
    let cycles = env_number("SHARDLANE_CHAOS_CYCLES", 5);
    let seed = env_number(
        "SHARDLANE_CHAOS_SEED",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1,
    );
    eprintln!("chaos: {cycles} kill -9 cycles, seed {seed} (SHARDLANE_CHAOS_SEED replays it)");
    let mut rng = Rng(seed);
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite: Dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("chaos");
    let table = unique_name("chaos-leases");
    kinesis.create_stream(&stream, 6).await.unwrap();
    let env = env(&kinesis, &dynalite);
    let (stop, producing) = producer(&kinesis, &stream, 30, 5);

    let mut generation = [0u32; 3];
    let mut live: Vec<HostProcess> = (0..3)
        .map(|i| start(&format!("host-{i}-g0"), &table, &stream, &env))
        .collect();
    let mut gone: Vec<HostProcess> = Vec::new();
    let mut kills: Vec<String> = Vec::new();

    for cycle in 0..cycles {
        // Let the fleet work (and rebalance) between faults.
        tokio::time::sleep(Duration::from_millis(1500 + rng.below(2000))).await;
        let i = rng.below(3) as usize;
        generation[i] += 1;
        let fresh = start(
            &format!("host-{i}-g{}", generation[i]),
            &table,
            &stream,
            &env,
        );
        let mut victim = std::mem::replace(&mut live[i], fresh);
        kills.push(stamp(SystemTime::now()));
        victim.kill9().unwrap();
        eprintln!(
            "chaos: cycle {cycle}: kill -9 host-{i}, restarted as g{}",
            generation[i]
        );
        gone.push(victim);
    }

    // Past every kill's redelivery window, then graceful hand-overs only:
    // any duplicate from here on is a SIGTERM's fault.
    tokio::time::sleep(REDELIVERY_WINDOW).await;
    for cycle in 0..2 {
        let i = rng.below(3) as usize;
        generation[i] += 1;
        let mut leaving = std::mem::replace(
            &mut live[i],
            start(
                &format!("host-{i}-g{}", generation[i]),
                &table,
                &stream,
                &env,
            ),
        );
        assert!(leaving.terminate().await.unwrap().success());
        eprintln!("chaos: SIGTERM cycle {cycle}: host-{i} handed over");
        gone.push(leaving);
        // Time for the hand-over and the new host's balancing.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }

    stop.store(true, Ordering::SeqCst);
    let put = producing.await.unwrap();
    let want: std::collections::HashSet<&String> = put.iter().collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut seen = std::collections::HashSet::new();
        for host in live.iter().chain(gone.iter()) {
            for (data, _, _) in handled(&host.lines()) {
                seen.insert(data);
            }
        }
        if want.iter().all(|d| seen.contains(*d)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} records never handled",
            want.iter().filter(|d| !seen.contains(**d)).count(),
            want.len()
        );
        // Polling the hosts' logs while the fleet catches up.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for host in &mut live {
        assert!(host.terminate().await.unwrap().success());
    }
    let hosts: Vec<&HostProcess> = live.iter().chain(gone.iter()).collect();
    let duplicates = check_all_handled(&put, &hosts);

    // Every delivery of every record, in time order.
    let mut deliveries: HashMap<String, Vec<String>> = HashMap::new();
    for host in &hosts {
        let lines = host.lines();
        for line in guest_lines(&lines, "handled data=") {
            deliveries
                .entry(handled_data(line).to_owned())
                .or_default()
                .push(field(line, "timestamp").to_owned());
        }
    }
    for stamps in deliveries.values_mut() {
        stamps.sort();
    }

    // Per key, first deliveries in put order (data is `key-K#N`).
    let mut by_key: BTreeMap<&str, Vec<(&String, u32)>> = BTreeMap::new();
    for (data, stamps) in &deliveries {
        let (key, n) = data.split_once('#').expect("data is key#n");
        by_key
            .entry(key)
            .or_default()
            .push((&stamps[0], n.parse().expect("n is a number")));
    }
    for (key, firsts) in &mut by_key {
        firsts.sort();
        let order: Vec<u32> = firsts.iter().map(|(_, n)| *n).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "key {key}: first deliveries out of put order: {order:?}"
        );
    }

    // Redeliveries only within a window after some kill -9.
    let mut stray = Vec::new();
    for (data, stamps) in &deliveries {
        for again in &stamps[1..] {
            let near_a_kill = kills.iter().any(|kill| {
                let end = humantime::parse_rfc3339(kill).unwrap() + REDELIVERY_WINDOW;
                again.as_str() >= kill.as_str() && again.as_str() <= stamp(end).as_str()
            });
            if !near_a_kill {
                stray.push((data.clone(), again.clone()));
            }
        }
    }
    assert!(
        stray.is_empty(),
        "handled again away from any kill -9 (kills at {kills:?}): {:?}",
        &stray[..stray.len().min(10)]
    );
    eprintln!(
        "chaos: {} records put, 0 lost, {duplicates} handled twice (all within {REDELIVERY_WINDOW:?} of one of {} kills), 0 from 2 SIGTERM hand-overs",
        put.len(),
        kills.len()
    );
}
