//! The planner's rules, one test each, on tables and heartbeats built here
//! and a clock passed in.

use super::*;
use crate::lease::LeaseKey;

fn shard(id: &str) -> ShardInfo {
    ShardInfo {
        id: id.into(),
        parent: None,
        adjacent_parent: None,
        closed: false,
        hash_keys: None,
    }
}

fn child(id: &str, parent: &str, adjacent: Option<&str>) -> ShardInfo {
    ShardInfo {
        parent: Some(parent.into()),
        adjacent_parent: adjacent.map(ShardId::from),
        ..shard(id)
    }
}

fn lease(shard: &str, owner: Option<&str>, counter: u64) -> (ShardId, Lease) {
    (
        shard.into(),
        Lease {
            key: LeaseKey {
                subscription: "app".into(),
                stream: "s".into(),
                shard: shard.into(),
            },
            owner: owner.map(OwnerId::from),
            counter,
            checkpoint: None,
            handoff: None,
        },
    )
}

fn ended(mut l: (ShardId, Lease)) -> (ShardId, Lease) {
    l.1.checkpoint = Some(Checkpoint::ShardEnd);
    l
}

fn shards(n: usize) -> Vec<ShardInfo> {
    (0..n).map(|i| shard(&format!("s{i}"))).collect()
}

/// The shards a plan takes, sorted (it takes them in an order of its
/// own).
fn taken(plan: &Plan) -> Vec<&str> {
    let mut taken: Vec<&str> = plan.take.iter().map(|(s, _)| s.as_str()).collect();
    taken.sort();
    taken
}

const LEASE: Duration = Duration::from_secs(10);

/// A plan with no heartbeats in the table (leases judged by their own
/// counters, as before heartbeats), no load and no cap.
#[allow(clippy::too_many_arguments)]
fn plan_of(
    p: &mut Planner,
    me: &OwnerId,
    held: &HashSet<ShardId>,
    releasing: &HashSet<ShardId>,
    shards: &[ShardInfo],
    leases: &HashMap<ShardId, Lease>,
    lease_duration: Duration,
    now: Instant,
) -> Plan {
    p.plan(&Inputs {
        me,
        held,
        releasing,
        shards,
        leases,
        heartbeats: &[],
        load: &Load::default(),
        lease_duration,
        max_leases: None,
        observed_at: now,
        read_at: now,
    })
}

#[test]
fn a_lone_instance_takes_everything() {
    let mut p = Planner::new();
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &shards(4),
        &HashMap::new(),
        LEASE,
        Instant::now(),
    );
    assert_eq!(taken(&plan), vec!["s0", "s1", "s2", "s3"]);
    assert_eq!(plan.fair_share, 4);
    assert!(plan.ask.is_empty());
}

#[test]
fn a_newcomer_asks_the_busiest_owner_for_one_lease() {
    let mut p = Planner::new();
    let leases: HashMap<_, _> = (0..8)
        .map(|i| lease(&format!("s{i}"), Some(if i < 6 { "a" } else { "b" }), 1))
        .collect();
    let plan = plan_of(
        &mut p,
        &"c".into(),
        &HashSet::new(),
        &HashSet::new(),
        &shards(8),
        &leases,
        LEASE,
        Instant::now(),
    );
    assert_eq!(plan.live, 3);
    assert_eq!(plan.fair_share, 3);
    assert!(plan.take.is_empty());
    // Below the share by 3: asks for 3 at once, each from the owner
    // then holding the most above the share (a: 6 → 3).
    let from: Vec<_> = plan.ask.iter().map(|l| l.owner.clone().unwrap()).collect();
    assert_eq!(from, vec![OwnerId::from("a"); 3], "{plan:?}");
}

#[test]
fn nobody_at_or_below_the_share_is_asked() {
    let mut p = Planner::new();
    // a: 3, b: 3, c: 2 of 8 → share 3: c may not ask anyone.
    let owners = ["a", "a", "a", "b", "b", "b", "c", "c"];
    let leases: HashMap<_, _> = owners
        .iter()
        .enumerate()
        .map(|(i, o)| lease(&format!("s{i}"), Some(o), 1))
        .collect();
    let held: HashSet<ShardId> = ["s6", "s7"].iter().map(|s| ShardId::from(*s)).collect();
    let plan = plan_of(
        &mut p,
        &"c".into(),
        &held,
        &HashSet::new(),
        &shards(8),
        &leases,
        LEASE,
        Instant::now(),
    );
    assert_eq!(
        plan,
        Plan {
            take: vec![],
            ask: vec![],
            free: vec![],
            fair_share: 3,
            live: 3,
            legacy: true,
            retire: vec![],
        }
    );
}

#[test]
fn expired_leases_are_taken_after_a_lease_duration_of_no_movement() {
    let mut p = Planner::new();
    let t0 = Instant::now();
    let leases: HashMap<_, _> = [lease("s0", Some("dead"), 7), lease("s1", Some("dead"), 9)].into();
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &shards(2),
        &leases,
        LEASE,
        t0,
    );
    assert!(plan.take.is_empty(), "alive until observed still");
    // Half-way, one lease moved: only the other expires.
    let moved: HashMap<_, _> = [lease("s0", Some("dead"), 8), lease("s1", Some("dead"), 9)].into();
    plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &shards(2),
        &moved,
        LEASE,
        t0 + LEASE / 2,
    );
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &shards(2),
        &moved,
        LEASE,
        t0 + LEASE,
    );
    assert_eq!(taken(&plan), vec!["s1"]);
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &shards(2),
        &moved,
        LEASE,
        t0 + LEASE * 2,
    );
    assert_eq!(taken(&plan), vec!["s0", "s1"]);
    let s0 = plan.take.iter().find(|(s, _)| s.as_str() == "s0").unwrap();
    assert_eq!(s0.1.as_ref().unwrap().counter, 8, "taken as observed");
}

#[test]
fn children_wait_for_every_parent_present() {
    let mut p = Planner::new();
    let list = vec![
        shard("p1"),
        shard("p2"),
        child("c1", "p1", None),
        child("m", "p1", Some("p2")),
        child("orphan", "trimmed", None),
    ];
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &list,
        &HashMap::new(),
        LEASE,
        Instant::now(),
    );
    assert_eq!(taken(&plan), vec!["orphan", "p1", "p2"]);

    let leases: HashMap<_, _> = [ended(lease("p1", None, 3))].into();
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &list,
        &leases,
        LEASE,
        Instant::now(),
    );
    assert_eq!(
        taken(&plan),
        vec!["c1", "orphan", "p2"],
        "merge child still waits for p2"
    );

    let leases: HashMap<_, _> = [ended(lease("p1", None, 3)), ended(lease("p2", None, 3))].into();
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &list,
        &leases,
        LEASE,
        Instant::now(),
    );
    assert_eq!(taken(&plan), vec!["c1", "m", "orphan"]);
}

#[test]
fn takes_only_up_to_the_fair_share() {
    let mut p = Planner::new();
    let leases: HashMap<_, _> = [lease("s0", Some("b"), 1), lease("s1", Some("b"), 1)].into();
    // 6 shards, 2 live → share 3; 4 free, take 3.
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &shards(6),
        &leases,
        LEASE,
        Instant::now(),
    );
    assert_eq!(plan.fair_share, 3);
    let took = taken(&plan);
    assert_eq!(took.len(), 3);
    assert!(
        took.iter().all(|s| ["s2", "s3", "s4", "s5"].contains(s)),
        "{took:?}"
    );
    assert!(plan.ask.is_empty());
}

#[test]
fn own_held_leases_count_toward_the_share() {
    let mut p = Planner::new();
    let leases: HashMap<_, _> = [lease("s0", Some("a"), 4), lease("s1", Some("a"), 4)].into();
    let held: HashSet<ShardId> = ["s0", "s1"].iter().map(|s| ShardId::from(*s)).collect();
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &held,
        &HashSet::new(),
        &shards(3),
        &leases,
        LEASE,
        Instant::now(),
    );
    assert_eq!(taken(&plan), vec!["s2"]);
}

#[test]
fn a_lease_still_naming_this_instance_but_not_held_is_taken_back() {
    // The lone instance lost s1 and s2 (renewals failed for a lease
    // duration); nobody took them, so the table still names it.
    let mut p = Planner::new();
    let leases: HashMap<_, _> = [
        lease("s0", Some("a"), 4),
        lease("s1", Some("a"), 9),
        lease("s2", Some("a"), 2),
    ]
    .into();
    let held: HashSet<ShardId> = ["s0"].iter().map(|s| ShardId::from(*s)).collect();
    let t0 = Instant::now();
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &held,
        &HashSet::new(),
        &shards(3),
        &leases,
        LEASE,
        t0,
    );
    assert!(plan.take.is_empty(), "alive until observed still");
    let unread: Vec<&str> = plan.free.iter().map(ShardId::as_str).collect();
    assert_eq!(unread, vec!["s1", "s2"], "read by nobody meanwhile");
    assert_eq!(plan.live, 1, "a lost lease of ours is no other owner");
    assert_eq!(plan.fair_share, 3);
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &held,
        &HashSet::new(),
        &shards(3),
        &leases,
        LEASE,
        t0 + LEASE,
    );
    assert_eq!(taken(&plan), vec!["s1", "s2"]);
    let s1 = plan.take.iter().find(|(s, _)| s.as_str() == "s1").unwrap();
    assert_eq!(
        s1.1.as_ref().map(|l| l.counter),
        Some(9),
        "taken back as observed, so a racing taker is fenced"
    );
}

#[test]
fn a_lease_of_our_id_that_keeps_moving_is_not_taken() {
    // Another process with the same owner id renews it: its counter
    // moves, so it is never taken from under it.
    let mut p = Planner::new();
    let t0 = Instant::now();
    for i in 0..5u32 {
        let leases: HashMap<_, _> = [lease("s0", Some("a"), 10 + u64::from(i))].into();
        let plan = plan_of(
            &mut p,
            &"a".into(),
            &HashSet::new(),
            &HashSet::new(),
            &shards(1),
            &leases,
            LEASE,
            t0 + LEASE * i,
        );
        assert!(plan.take.is_empty(), "round {i}: {plan:?}");
    }
}

#[test]
fn free_lists_every_unheld_shard_even_past_the_share() {
    let mut p = Planner::new();
    let leases: HashMap<_, _> = [lease("s0", Some("b"), 1), lease("s1", Some("b"), 1)].into();
    let plan = plan_of(
        &mut p,
        &"a".into(),
        &HashSet::new(),
        &HashSet::new(),
        &shards(6),
        &leases,
        LEASE,
        Instant::now(),
    );
    assert_eq!(taken(&plan).len(), 3);
    let free: Vec<&str> = plan.free.iter().map(ShardId::as_str).collect();
    assert_eq!(free, vec!["s2", "s3", "s4", "s5"]);
}

#[test]
fn a_lease_being_given_up_here_is_neither_taken_nor_counted() {
    let mut p = Planner::new();
    let t0 = Instant::now();
    let leases: HashMap<_, _> = [lease("s0", Some("a"), 3), lease("s1", Some("a"), 5)].into();
    let releasing: HashSet<ShardId> = ["s1"].iter().map(|s| ShardId::from(*s)).collect();
    let held: HashSet<ShardId> = ["s0"].iter().map(|s| ShardId::from(*s)).collect();
    for later in [t0, t0 + LEASE, t0 + LEASE * 3] {
        let plan = plan_of(
            &mut p,
            &"a".into(),
            &held,
            &releasing,
            &shards(2),
            &leases,
            LEASE,
            later,
        );
        assert!(plan.take.is_empty(), "{plan:?}");
        assert!(plan.free.is_empty(), "held here, so read: {plan:?}");
    }
}

fn beat(owner: &str, counter: u64, total: f64, hottest: &[(&str, f64)]) -> Heartbeat {
    Heartbeat {
        owner: owner.into(),
        counter,
        load: Load {
            total,
            hottest: hottest
                .iter()
                .map(|(s, r)| (ShardId::from(*s), *r))
                .collect(),
            settled: true,
        },
        asks: 0,
    }
}

/// A plan with heartbeats, a load of our own and a cap.
#[allow(clippy::too_many_arguments)]
fn plan_with(
    p: &mut Planner,
    me: &str,
    held: &[&str],
    shards: &[ShardInfo],
    leases: &HashMap<ShardId, Lease>,
    heartbeats: &[Heartbeat],
    load: &Load,
    max_leases: Option<usize>,
    now: Instant,
) -> Plan {
    let held: HashSet<ShardId> = held.iter().map(|s| ShardId::from(*s)).collect();
    p.plan(&Inputs {
        me: &me.into(),
        held: &held,
        releasing: &HashSet::new(),
        shards,
        leases,
        heartbeats,
        load,
        lease_duration: LEASE,
        max_leases,
        observed_at: now,
        read_at: now,
    })
}

fn owned(owners: &[&str]) -> HashMap<ShardId, Lease> {
    owners
        .iter()
        .enumerate()
        .map(|(i, o)| lease(&format!("s{i}"), Some(o), 1))
        .collect()
}

#[test]
fn a_heartbeating_owner_keeps_leases_whose_counters_stand_still() {
    let mut p = Planner::new();
    let t0 = Instant::now();
    let leases = owned(&["b", "b"]);
    let none = Load::default();
    // b's heartbeat moves for 3 lease durations; its leases never do.
    for i in 0..=3u32 {
        let beats = [beat("b", 10 + u64::from(i), 0.0, &[])];
        let plan = plan_with(
            &mut p,
            "a",
            &[],
            &shards(2),
            &leases,
            &beats,
            &none,
            None,
            t0 + LEASE * i,
        );
        assert!(plan.take.is_empty(), "round {i}: {plan:?}");
        assert!(!plan.legacy, "b heartbeats");
    }
    // b's heartbeat stops: a lease duration later, both leases at once.
    let beats = [beat("b", 13, 0.0, &[])];
    let plan = plan_with(
        &mut p,
        "a",
        &[],
        &shards(2),
        &leases,
        &beats,
        &none,
        None,
        t0 + LEASE * 3 + LEASE / 2,
    );
    assert!(plan.take.is_empty(), "still for half a lease duration");
    let plan = plan_with(
        &mut p,
        "a",
        &[],
        &shards(2),
        &leases,
        &beats,
        &none,
        None,
        t0 + LEASE * 4,
    );
    assert_eq!(taken(&plan), vec!["s0", "s1"]);
    assert_eq!(plan.live, 1);
}

#[test]
fn stillness_runs_from_the_first_answer_to_the_latest_question() {
    // A slow table read: the value was seen at the first answer, and
    // was current at least when the latest read was asked. Measured
    // from answer to answer, a read answered late would count time
    // the value may no longer have stood still.
    let mut p = Planner::new();
    let t0 = Instant::now();
    let leases = owned(&["b"]);
    let beats = [beat("b", 5, 0.0, &[])];
    let held = HashSet::new();
    let me = OwnerId::from("a");
    let load = Load::default();
    let inputs = |observed_at, read_at| Inputs {
        me: &me,
        held: &held,
        releasing: &held,
        shards: &[],
        leases: &leases,
        heartbeats: &beats,
        load: &load,
        lease_duration: LEASE,
        max_leases: None,
        observed_at,
        read_at,
    };
    let list = shards(1);
    let mut plan_at = |observed_at, read_at| {
        p.plan(&Inputs {
            shards: &list,
            ..inputs(observed_at, read_at)
        })
    };
    plan_at(t0, t0);
    // Asked 9 s after the first answer, answered 3 s later: not yet.
    let plan = plan_at(t0 + Duration::from_secs(12), t0 + Duration::from_secs(9));
    assert!(plan.take.is_empty(), "{plan:?}");
    let plan = plan_at(t0 + Duration::from_secs(11), t0 + LEASE);
    assert_eq!(taken(&plan), vec!["s0"]);
}

#[test]
fn an_instance_without_leases_counts_from_its_first_heartbeat() {
    let mut p = Planner::new();
    let leases = owned(&["a"; 8]);
    let beats = [
        beat("a", 1, 0.0, &[]),
        beat("b", 1, 0.0, &[]),
        beat("c", 1, 0.0, &[]),
    ];
    let plan = plan_with(
        &mut p,
        "c",
        &[],
        &shards(8),
        &leases,
        &beats,
        &Load::default(),
        None,
        Instant::now(),
    );
    assert_eq!(plan.live, 3, "b holds nothing, and counts");
    assert_eq!(plan.fair_share, 3);
    assert_eq!(
        plan.ask.len(),
        3,
        "asks for all it misses at once: {plan:?}"
    );
}

#[test]
fn several_asks_go_to_whoever_is_then_furthest_above_the_share() {
    let mut p = Planner::new();
    // 32 shards: a 20, b 12; c and d heartbeat with none → share 8.
    let owners: Vec<&str> = (0..32).map(|i| if i < 20 { "a" } else { "b" }).collect();
    let leases = owned(&owners);
    let beats = [
        beat("a", 1, 0.0, &[]),
        beat("b", 1, 0.0, &[]),
        beat("c", 1, 0.0, &[]),
        beat("d", 1, 0.0, &[]),
    ];
    let plan = plan_with(
        &mut p,
        "c",
        &[],
        &shards(32),
        &leases,
        &beats,
        &Load::default(),
        None,
        Instant::now(),
    );
    assert_eq!(plan.fair_share, 8);
    assert_eq!(plan.ask.len(), 8);
    let from_a = plan
        .ask
        .iter()
        .filter(|l| l.owner == Some("a".into()))
        .count();
    assert_eq!(from_a, 8, "a is above b until it gave 8");
    let distinct: HashSet<_> = plan.ask.iter().map(|l| &l.key.shard).collect();
    assert_eq!(distinct.len(), 8);
    // d asks too, in an order of its own: mostly other leases.
    let plan_d = plan_with(
        &mut Planner::new(),
        "d",
        &[],
        &shards(32),
        &leases,
        &beats,
        &Load::default(),
        None,
        Instant::now(),
    );
    let same = plan_d
        .ask
        .iter()
        .filter(|l| plan.ask.iter().any(|m| m.key == l.key))
        .count();
    assert!(same < 8, "c and d reach for different leases");
}

#[test]
fn a_lease_released_for_an_asker_is_left_to_it_for_a_while() {
    let mut p = Planner::new();
    let t0 = Instant::now();
    let mut leases = owned(&["a", "a"]);
    let reserved = leases.get_mut(&ShardId::from("s1")).unwrap();
    reserved.owner = None;
    reserved.handoff = Some("b".into());
    let beats = [
        beat("a", 1, 0.0, &[]),
        beat("b", 1, 0.0, &[]),
        beat("c", 1, 0.0, &[]),
    ];
    let plan = plan_with(
        &mut p,
        "c",
        &[],
        &shards(2),
        &leases,
        &beats,
        &Load::default(),
        None,
        t0,
    );
    assert!(plan.take.is_empty(), "left to b: {plan:?}");
    let plan_b = plan_with(
        &mut Planner::new(),
        "b",
        &[],
        &shards(2),
        &leases,
        &beats,
        &Load::default(),
        None,
        t0,
    );
    assert_eq!(taken(&plan_b), vec!["s1"]);
    // b never takes it: after a lease duration, anyone may.
    let beats = [
        beat("a", 2, 0.0, &[]),
        beat("b", 2, 0.0, &[]),
        beat("c", 2, 0.0, &[]),
    ];
    let plan = plan_with(
        &mut p,
        "c",
        &[],
        &shards(2),
        &leases,
        &beats,
        &Load::default(),
        None,
        t0 + LEASE,
    );
    assert_eq!(taken(&plan), vec!["s1"]);
}

#[test]
fn load_moves_nothing_before_both_loads_are_settled() {
    let now = Instant::now();
    let leases = owned(&["b", "b", "a", "a"]);
    let beats = [
        beat("a", 1, 0.0, &[]),
        beat("b", 1, 100.0, &[("s0", 60.0), ("s1", 40.0)]),
    ];
    let unsettled = plan_with(
        &mut Planner::new(),
        "a",
        &["s2", "s3"],
        &shards(4),
        &leases,
        &beats,
        &Load::default(),
        None,
        now,
    );
    assert!(unsettled.ask.is_empty(), "{unsettled:?}");
}

#[test]
fn load_moves_a_hot_shard_when_it_clearly_helps_and_never_back() {
    let mut p = Planner::new();
    let now = Instant::now();
    // 4 shards, 2 each; b reads 100/s, 60 of them on s0.
    let leases = owned(&["b", "b", "a", "a"]);
    let beats = [
        beat("a", 1, 0.0, &[]),
        beat("b", 1, 100.0, &[("s0", 60.0), ("s1", 40.0)]),
    ];
    let quiet = Load {
        settled: true,
        ..Load::default()
    };
    let plan = plan_with(
        &mut p,
        "a",
        &["s2", "s3"],
        &shards(4),
        &leases,
        &beats,
        &quiet,
        None,
        now,
    );
    let asked: Vec<&str> = plan.ask.iter().map(|l| l.key.shard.as_str()).collect();
    assert_eq!(
        asked,
        vec!["s0"],
        "100 >= 1.25 * 50; max(100 - 60, 0 + 60) = 60 <= 80"
    );
    // Moved: a reads 60 (s0), b 40. b does not ask it back, nor a
    // asks for s1: max(40 - 40, 60 + 40) = 100 > 0.8 * 40.
    let leases = owned(&["a", "b", "a", "a"]);
    let a_load = Load {
        total: 60.0,
        hottest: vec![("s0".into(), 60.0)],
        settled: true,
    };
    let beats = [
        beat("a", 2, 60.0, &[("s0", 60.0)]),
        beat("b", 2, 40.0, &[("s1", 40.0)]),
    ];
    let b_load = Load {
        total: 40.0,
        hottest: vec![("s1".into(), 40.0)],
        settled: true,
    };
    let plan = plan_with(
        &mut Planner::new(),
        "b",
        &["s1"],
        &shards(4),
        &leases,
        &beats,
        &b_load,
        None,
        now,
    );
    assert!(
        plan.ask.iter().all(|l| l.key.shard.as_str() != "s0"),
        "s0 never moves straight back: {plan:?}"
    );
    // The count rule evens 3 / 1 with a's quietest lease, not s0.
    assert_eq!(plan.ask.len(), 1);
    let plan = plan_with(
        &mut Planner::new(),
        "a",
        &["s0", "s2", "s3"],
        &shards(4),
        &leases,
        &beats,
        &a_load,
        None,
        now,
    );
    assert!(plan.ask.is_empty(), "{plan:?}");
}

#[test]
fn load_moves_nothing_between_about_even_or_quiet_instances() {
    let now = Instant::now();
    let quiet = Load {
        settled: true,
        ..Load::default()
    };
    // About even (15 against 10, the mean 12.5): nothing moves, though
    // 8 against 13 would be a little better.
    let beats = [beat("a", 1, 10.0, &[]), beat("b", 1, 15.0, &[("s0", 7.0)])];
    let even = Load {
        total: 10.0,
        hottest: vec![],
        settled: true,
    };
    let plan = plan_with(
        &mut Planner::new(),
        "a",
        &["s2", "s3"],
        &shards(4),
        &owned(&["b", "b", "a", "a"]),
        &beats,
        &even,
        None,
        now,
    );
    assert!(plan.ask.is_empty(), "{plan:?}");
    // Below MIN_LOAD nothing moves.
    let beats = [beat("a", 1, 0.0, &[]), beat("b", 1, 0.5, &[("s0", 0.5)])];
    let leases = owned(&["b", "b", "a", "a"]);
    let plan = plan_with(
        &mut Planner::new(),
        "a",
        &["s2", "s3"],
        &shards(4),
        &leases,
        &beats,
        &quiet,
        None,
        now,
    );
    assert!(plan.ask.is_empty());
}

#[test]
fn the_cap_bounds_takes_and_asks() {
    let mut p = Planner::new();
    let plan = plan_with(
        &mut p,
        "a",
        &[],
        &shards(10),
        &HashMap::new(),
        &[],
        &Load::default(),
        Some(4),
        Instant::now(),
    );
    assert_eq!(plan.fair_share, 4);
    assert_eq!(plan.take.len(), 4);
    assert_eq!(
        plan.free.len(),
        10,
        "the rest is read by nobody, and says so"
    );
}

#[test]
fn an_owner_without_heartbeat_is_an_earlier_version_and_needs_renewals() {
    let mut p = Planner::new();
    let leases = owned(&["old", "old"]);
    let plan = plan_with(
        &mut p,
        "a",
        &[],
        &shards(4),
        &leases,
        &[beat("a", 1, 0.0, &[])],
        &Load::default(),
        None,
        Instant::now(),
    );
    assert!(plan.legacy);
    assert_eq!(plan.live, 2);
}

#[test]
fn heartbeats_long_stale_and_owning_nothing_are_retired() {
    let mut p = Planner::new();
    let t0 = Instant::now();
    let leases = owned(&["a"]);
    let beats = [
        beat("a", 1, 0.0, &[]),
        beat("gone", 7, 0.0, &[]),
        beat("stale-owner", 3, 0.0, &[]),
    ];
    let mut leases = leases;
    leases.extend([lease("s1", Some("stale-owner"), 1)]);
    plan_with(
        &mut p,
        "a",
        &["s0"],
        &shards(2),
        &leases,
        &beats,
        &Load::default(),
        None,
        t0,
    );
    let plan = plan_with(
        &mut p,
        "a",
        &["s0"],
        &shards(2),
        &leases,
        &beats,
        &Load::default(),
        None,
        t0 + LEASE * RETIRE_AFTER,
    );
    let retired: Vec<&str> = plan.retire.iter().map(|h| h.owner.as_str()).collect();
    assert_eq!(
        retired,
        vec!["gone"],
        "not ours, not one still named by a lease"
    );
}

#[test]
fn three_hot_on_one_of_three_spread_by_load() {
    // 32 shards: a 11 (s0 hot), b 10 (none hot), c 11 (s21, s24, s27
    // hot, 40/s each). b is below the share by count, with nobody
    // above it to ask: the load rule still applies.
    let owners: Vec<&str> = (0..32)
        .map(|i| match i {
            0..=10 => "a",
            11..=20 => "b",
            _ => "c",
        })
        .collect();
    let leases = owned(&owners);
    let beats = [
        beat("a", 1, 40.0, &[("s0", 40.0)]),
        beat("b", 1, 0.0, &[]),
        beat(
            "c",
            1,
            120.0,
            &[("s21", 40.0), ("s24", 40.0), ("s27", 40.0)],
        ),
    ];
    let b_held: Vec<String> = leases
        .values()
        .filter(|l| l.owner == Some("b".into()))
        .map(|l| l.key.shard.to_string())
        .collect();
    let b_held: Vec<&str> = b_held.iter().map(String::as_str).collect();
    let quiet = Load {
        settled: true,
        ..Load::default()
    };
    let plan = plan_with(
        &mut Planner::new(),
        "b",
        &b_held,
        &shards(32),
        &leases,
        &beats,
        &quiet,
        None,
        Instant::now(),
    );
    let asked: Vec<&str> = plan.ask.iter().map(|l| l.key.shard.as_str()).collect();
    assert_eq!(asked.len(), 1, "{plan:?}");
    assert!(["s21", "s24", "s27"].contains(&asked[0]), "{asked:?}");
}

#[test]
fn a_lease_asked_for_by_load_is_taken_even_past_the_share() {
    // 4 shards, 2 live: share 2. b holds 2 and asked for s0 by load;
    // a released it for b.
    let mut leases = owned(&["a", "a", "b", "b"]);
    let s0 = leases.get_mut(&ShardId::from("s0")).unwrap();
    s0.owner = None;
    s0.handoff = Some("b".into());
    let beats = [beat("a", 1, 0.0, &[]), beat("b", 1, 0.0, &[])];
    let plan = plan_with(
        &mut Planner::new(),
        "b",
        &["s2", "s3"],
        &shards(4),
        &leases,
        &beats,
        &Load::default(),
        None,
        Instant::now(),
    );
    assert_eq!(taken(&plan), vec!["s0"]);
    // Not past a cap, though.
    let plan = plan_with(
        &mut Planner::new(),
        "b",
        &["s2", "s3"],
        &shards(4),
        &leases,
        &beats,
        &Load::default(),
        Some(2),
        Instant::now(),
    );
    assert!(plan.take.is_empty());
}

#[test]
fn leases_asked_for_and_not_yet_released_are_not_asked_for_again() {
    // 8 shards: a 6, b 2; c (no leases) asked a for s0 and s1 at its
    // last sync, and a is still draining them.
    let mut leases = owned(&["a", "a", "a", "a", "a", "a", "b", "b"]);
    for s in ["s0", "s1"] {
        leases.get_mut(&ShardId::from(s)).unwrap().handoff = Some("c".into());
    }
    let beats = [
        beat("a", 1, 0.0, &[]),
        beat("b", 1, 0.0, &[]),
        beat("c", 1, 0.0, &[]),
    ];
    let plan = plan_with(
        &mut Planner::new(),
        "c",
        &[],
        &shards(8),
        &leases,
        &beats,
        &Load::default(),
        None,
        Instant::now(),
    );
    // Share 3: 2 coming, 1 more wanted; a keeps 4 once s0 and s1 leave,
    // still above the share: one more from a, not s0 or s1 again.
    let asked: Vec<&str> = plan.ask.iter().map(|l| l.key.shard.as_str()).collect();
    assert_eq!(asked.len(), 1, "{plan:?}");
    assert!(!["s0", "s1"].contains(&asked[0]), "{asked:?}");
}

#[test]
fn at_the_cap_nothing_is_asked_for() {
    // 8 shards, 2 live, cap 2: the share is 2, b holds 2 (a holds 6,
    // past the cap: set on b only). b may take no more, so it asks for
    // none, by count or by load, though a is far busier.
    let leases = owned(&["a", "a", "a", "a", "a", "a", "b", "b"]);
    let beats = [beat("a", 1, 100.0, &[("s0", 50.0)]), beat("b", 1, 0.0, &[])];
    let settled = Load {
        settled: true,
        ..Load::default()
    };
    let plan = plan_with(
        &mut Planner::new(),
        "b",
        &["s6", "s7"],
        &shards(8),
        &leases,
        &beats,
        &settled,
        Some(2),
        Instant::now(),
    );
    assert!(plan.ask.is_empty(), "{plan:?}");
}
