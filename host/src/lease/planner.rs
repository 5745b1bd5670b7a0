//! The lease planner: which leases this instance should take, and from whom
//! it should ask for one. Pure: it sees the shard list, the lease table and
//! a clock reading passed in, and remembers only its own observations.
//!
//! Rules, applied at every shard sync:
//! 1. A shard is *eligible* when it is not done (`SHARD_END`) and each of
//!    its parents still in the stream is done: children wait for parents.
//! 2. Another owner's lease is *expired* when its counter has not moved for
//!    `lease_duration`, as observed on this instance's own clock (KCL's
//!    rule: immune to clock skew between hosts).
//! 3. *Live instances* are this one plus every owner with a lease that is
//!    not expired. The *fair share* is `ceil(eligible / live)`.
//! 4. Take free (absent, unowned) and expired leases until holding the fair
//!    share. A lease that names this instance but is not held here is
//!    judged like any other owner's: a lease this instance lost (its
//!    renewals failed for a lease duration, say while the store was
//!    unreachable) that nobody else took still names it, and is taken back
//!    once its counter has stood still for a lease duration — else its
//!    shard would never be read again. Waiting for the counter rather than
//!    taking it at once keeps a second process misconfigured with the same
//!    `owner_id` from stealing leases the first still renews. Such a lease
//!    is no other live instance.
//! 5. If still below the fair share and nothing was free, ask one owner
//!    holding more than the fair share to hand one lease over (the owner
//!    with the most; its lease on the lowest shard id, for determinism). One
//!    request per sync: convergence is gradual, and since nobody takes beyond
//!    its share or asks someone at or below it, there is no ping-pong.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use super::Lease;
use crate::ids::{OwnerId, ShardId};
use crate::kinesis::ShardInfo;
use crate::progress::Checkpoint;

/// What to do after a sync.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// Leases to acquire, each with the lease as observed (`None`: absent).
    pub take: Vec<(ShardId, Option<Lease>)>,
    /// A lease to ask its owner to hand over.
    pub ask: Option<Lease>,
    /// Every eligible shard that nobody holds as of this plan (free or
    /// expired, or naming this instance without being held here), whether
    /// or not this plan takes it: what is left after the takes succeed is
    /// read by nobody.
    pub free: Vec<ShardId>,
    /// The fair share this plan aimed at.
    pub fair_share: usize,
    /// Live instances counted.
    pub live: usize,
}

/// The planner's memory: when each other owner's lease counter last moved.
#[derive(Debug, Default)]
pub(super) struct Planner {
    observed: HashMap<ShardId, (u64, Instant)>,
}

impl Planner {
    /// A planner with no observations yet (every lease counts as alive
    /// until seen unchanged for a lease duration).
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Plans for `me`, who holds and reads `held` and is giving up
    /// `releasing` (held too, but not counted toward its share), given the
    /// stream's `shards` and the table's `leases`, at `now`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan(
        &mut self,
        me: &OwnerId,
        held: &HashSet<ShardId>,
        releasing: &HashSet<ShardId>,
        shards: &[ShardInfo],
        leases: &HashMap<ShardId, Lease>,
        lease_duration: Duration,
        now: Instant,
    ) -> Plan {
        let present: HashSet<&ShardId> = shards.iter().map(|s| &s.id).collect();
        self.observed.retain(|shard, _| present.contains(shard));
        let done = |id: &ShardId| {
            leases
                .get(id)
                .is_some_and(|l| l.checkpoint == Some(Checkpoint::ShardEnd))
        };
        let eligible: Vec<&ShardInfo> = shards
            .iter()
            .filter(|s| !done(&s.id) && s.parents().all(|p| !present.contains(p) || done(p)))
            .collect();

        let mut free = Vec::new();
        // Ours in the table, not held here, not yet expired: nobody reads it.
        let mut lost = Vec::new();
        let mut by_owner: BTreeMap<&OwnerId, Vec<&Lease>> = BTreeMap::new();
        for shard in &eligible {
            let lease = leases.get(&shard.id);
            match lease.and_then(|l| l.owner.as_ref().map(|o| (l, o))) {
                None => free.push((shard.id.clone(), lease.cloned())),
                Some((_, owner))
                    if owner == me
                        && (held.contains(&shard.id) || releasing.contains(&shard.id)) => {}
                Some((lease, owner)) => {
                    let entry = self
                        .observed
                        .entry(shard.id.clone())
                        .or_insert((lease.counter, now));
                    if entry.0 != lease.counter {
                        *entry = (lease.counter, now);
                    }
                    if now.duration_since(entry.1) >= lease_duration {
                        free.push((shard.id.clone(), Some(lease.clone())));
                    } else if owner != me {
                        by_owner.entry(owner).or_default().push(lease);
                    } else {
                        lost.push(shard.id.clone());
                    }
                }
            }
        }

        let live = 1 + by_owner.len();
        let fair_share = eligible.len().div_ceil(live);
        let mine = eligible.iter().filter(|s| held.contains(&s.id)).count();
        let wanted = fair_share.saturating_sub(mine);
        let took_free = !free.is_empty() && wanted > 0;
        let mut unheld: Vec<ShardId> = free.iter().map(|(s, _)| s.clone()).collect();
        unheld.extend(lost);
        unheld.sort();
        let take: Vec<_> = free.into_iter().take(wanted).collect();

        let ask = if wanted > 0 && !took_free {
            by_owner
                .iter()
                .filter(|(_, leases)| leases.len() > fair_share)
                .max_by_key(|(owner, leases)| (leases.len(), std::cmp::Reverse(**owner)))
                .and_then(|(_, leases)| leases.iter().min_by_key(|l| &l.key.shard))
                .map(|l| (*l).clone())
        } else {
            None
        };
        Plan {
            take,
            ask,
            free: unheld,
            fair_share,
            live,
        }
    }
}

#[cfg(test)]
mod tests {
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

    fn taken(plan: &Plan) -> Vec<&str> {
        plan.take.iter().map(|(s, _)| s.as_str()).collect()
    }

    const LEASE: Duration = Duration::from_secs(10);

    #[test]
    fn a_lone_instance_takes_everything() {
        let mut p = Planner::new();
        let plan = p.plan(
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
        assert_eq!(plan.ask, None);
    }

    #[test]
    fn a_newcomer_asks_the_busiest_owner_for_one_lease() {
        let mut p = Planner::new();
        let leases: HashMap<_, _> = (0..8)
            .map(|i| lease(&format!("s{i}"), Some(if i < 6 { "a" } else { "b" }), 1))
            .collect();
        let plan = p.plan(
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
        let ask = plan.ask.expect("asks a for one");
        assert_eq!(ask.owner, Some("a".into()));
        assert_eq!(ask.key.shard.as_str(), "s0");
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
        let plan = p.plan(
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
                ask: None,
                free: vec![],
                fair_share: 3,
                live: 3
            }
        );
    }

    #[test]
    fn expired_leases_are_taken_after_a_lease_duration_of_no_movement() {
        let mut p = Planner::new();
        let t0 = Instant::now();
        let leases: HashMap<_, _> =
            [lease("s0", Some("dead"), 7), lease("s1", Some("dead"), 9)].into();
        let plan = p.plan(
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
        let moved: HashMap<_, _> =
            [lease("s0", Some("dead"), 8), lease("s1", Some("dead"), 9)].into();
        p.plan(
            &"a".into(),
            &HashSet::new(),
            &HashSet::new(),
            &shards(2),
            &moved,
            LEASE,
            t0 + LEASE / 2,
        );
        let plan = p.plan(
            &"a".into(),
            &HashSet::new(),
            &HashSet::new(),
            &shards(2),
            &moved,
            LEASE,
            t0 + LEASE,
        );
        assert_eq!(taken(&plan), vec!["s1"]);
        let plan = p.plan(
            &"a".into(),
            &HashSet::new(),
            &HashSet::new(),
            &shards(2),
            &moved,
            LEASE,
            t0 + LEASE * 2,
        );
        assert_eq!(taken(&plan), vec!["s0", "s1"]);
        assert_eq!(
            plan.take[0].1.as_ref().unwrap().counter,
            8,
            "taken as observed"
        );
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
        let plan = p.plan(
            &"a".into(),
            &HashSet::new(),
            &HashSet::new(),
            &list,
            &HashMap::new(),
            LEASE,
            Instant::now(),
        );
        assert_eq!(taken(&plan), vec!["p1", "p2", "orphan"]);

        let leases: HashMap<_, _> = [ended(lease("p1", None, 3))].into();
        let plan = p.plan(
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
            vec!["p2", "c1", "orphan"],
            "merge child still waits for p2"
        );

        let leases: HashMap<_, _> =
            [ended(lease("p1", None, 3)), ended(lease("p2", None, 3))].into();
        let plan = p.plan(
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
        let plan = p.plan(
            &"a".into(),
            &HashSet::new(),
            &HashSet::new(),
            &shards(6),
            &leases,
            LEASE,
            Instant::now(),
        );
        assert_eq!(plan.fair_share, 3);
        assert_eq!(taken(&plan), vec!["s2", "s3", "s4"]);
        assert_eq!(plan.ask, None);
    }

    #[test]
    fn own_held_leases_count_toward_the_share() {
        let mut p = Planner::new();
        let leases: HashMap<_, _> = [lease("s0", Some("a"), 4), lease("s1", Some("a"), 4)].into();
        let held: HashSet<ShardId> = ["s0", "s1"].iter().map(|s| ShardId::from(*s)).collect();
        let plan = p.plan(
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
        let plan = p.plan(
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
        let plan = p.plan(
            &"a".into(),
            &held,
            &HashSet::new(),
            &shards(3),
            &leases,
            LEASE,
            t0 + LEASE,
        );
        assert_eq!(taken(&plan), vec!["s1", "s2"]);
        assert_eq!(
            plan.take[0].1.as_ref().map(|l| l.counter),
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
            let plan = p.plan(
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
        let plan = p.plan(
            &"a".into(),
            &HashSet::new(),
            &HashSet::new(),
            &shards(6),
            &leases,
            LEASE,
            Instant::now(),
        );
        assert_eq!(taken(&plan), vec!["s2", "s3", "s4"]);
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
            let plan = p.plan(
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
}
