//! The lease planner: which leases this instance should take, and from whom
//! it should ask for some. Pure: it sees the shard list, the lease table,
//! the instances' heartbeats and a clock reading passed in, and remembers
//! only its own observations.
//!
//! Rules, applied at every shard sync:
//! 1. A shard is *eligible* when it is not done (`SHARD_END`) and each of
//!    its parents still in the stream is done: children wait for parents.
//! 2. An instance's heartbeat is *stale* when its counter has not moved for
//!    `lease_duration`, as observed on this instance's own clock (KCL's
//!    rule, applied to the heartbeat: immune to clock skew between hosts).
//! 3. Another owner's lease is *expired* when its own counter has not moved
//!    for `lease_duration` **and** its owner has no heartbeat or a stale
//!    one. Either moving keeps it: the holder's validity deadline is
//!    measured from whichever of its two writes was sent last (see
//!    "Heartbeats" in [`super`] for why that fences a paused holder).
//! 4. *Live instances* are this one, every owner whose heartbeat is not
//!    stale — holding leases or not, so an instance counts from its first
//!    heartbeat — and every owner without a heartbeat (an instance of an
//!    earlier version) holding a lease that has not expired. The *fair
//!    share* is `ceil(eligible / live)`, capped by `max_leases_per_instance`.
//! 5. Take free (absent, unowned) and expired leases until holding the fair
//!    share, in an order of this instance's own (a hash of its id and the
//!    shard's), so instances starting together reach for different leases.
//!    A free lease released *for* another live instance (its `handoff_to`,
//!    kept as a reservation) is left to it until it has stood free for a
//!    lease duration: the instance that asked gets what it asked for, and
//!    takes it even one past its share (it asked by load, rule 7). A
//!    lease that names this instance but is not held here is judged by its
//!    own counter alone (this instance's heartbeat moves for this process,
//!    not for an earlier one): a lease lost while the store was unreachable
//!    is taken back once its counter has stood still for a lease duration —
//!    else its shard would never be read again. Such a lease is no other
//!    live instance.
//! 6. *By count*: if still below the fair share and nothing is free, ask for
//!    as many leases as are missing, each from the owner then holding the
//!    most (counting the asks already placed), if it holds more than the
//!    fair share; of its leases, the quietest (by the load its heartbeat
//!    publishes), in this instance's own order among equals. Leases this
//!    instance asked for and their owners have not released yet count as
//!    coming (not asked for again), and leases anyone asked for count as
//!    leaving their owner; nothing is asked for past
//!    `max_leases_per_instance`. Nobody takes
//!    beyond its share or asks someone at or below it, so moves by count
//!    never ping-pong, and a fleet far off converges in a few syncs, not
//!    one lease per sync.
//! 7. *By load*: when no live instance holds more than the fair share and
//!    this one holds no more than it, look at the instance with the highest
//!    published load `L_b`. If both loads are settled (every shard measured
//!    for 15 s: one just taken reads as quiet at first) and it is well above the fleet's mean (`L_b >=
//!    1.25 * mean`, and at least [`MIN_LOAD`]), ask it for its busiest
//!    shard (rate `r`) that this instance (load `L_me`) can take so that
//!    the pair's larger load drops clearly: `max(L_b - r, L_me + r) <= 0.8 *
//!    L_b`. One such ask per sync. The reverse move would need `L_b <= 0.8 *
//!    (L_me + r)`, which the first excludes, so a shard moved for load never
//!    moves straight back; no ask by load is placed while a move of this
//!    instance's is under way; and shards of about equal rates (a fleet that is
//!    balanced, give or take noise) never move at all. The count rule then
//!    evens the counts by moving the quietest leases, which barely change
//!    the loads.
//! 8. A heartbeat stale for [`RETIRE_AFTER`] lease durations whose owner
//!    holds no lease is deleted (conditional on its counter), so instances
//!    that came and went do not pile up in the table.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use super::{Heartbeat, Lease, Load};
use crate::ids::{OwnerId, ShardId};
use crate::kinesis::ShardInfo;
use crate::progress::Checkpoint;

/// Below this many records a second (the busiest instance's), loads are
/// noise: nothing moves for load.
pub(super) const MIN_LOAD: f64 = 1.0;

/// A heartbeat stale for this many lease durations, of an owner holding no
/// lease, is deleted.
pub(super) const RETIRE_AFTER: u32 = 30;

/// What to do after a sync.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Plan {
    /// Leases to acquire, each with the lease as observed (`None`: absent).
    pub take: Vec<(ShardId, Option<Lease>)>,
    /// Leases to ask their owners to hand over.
    pub ask: Vec<Lease>,
    /// Every eligible shard that nobody holds as of this plan (free or
    /// expired, or naming this instance without being held here), whether
    /// or not this plan takes it: what is left after the takes succeed is
    /// read by nobody.
    pub free: Vec<ShardId>,
    /// The fair share this plan aimed at.
    pub fair_share: usize,
    /// Live instances counted.
    pub live: usize,
    /// A live owner has no heartbeat (an earlier version, which judges
    /// leases by their own counters): this instance must renew each lease
    /// it holds, as earlier versions did, for as long as one is live.
    pub legacy: bool,
    /// Heartbeats of instances long gone, to delete.
    pub retire: Vec<Heartbeat>,
}

/// What a plan is made from.
pub(super) struct Inputs<'a> {
    /// This instance.
    pub me: &'a OwnerId,
    /// The leases it holds and reads.
    pub held: &'a HashSet<ShardId>,
    /// The leases it holds and is giving up (not counted toward its share).
    pub releasing: &'a HashSet<ShardId>,
    /// The stream's shards.
    pub shards: &'a [ShardInfo],
    /// The lease table.
    pub leases: &'a HashMap<ShardId, Lease>,
    /// Every instance's heartbeat.
    pub heartbeats: &'a [Heartbeat],
    /// This instance's load, as measured here.
    pub load: &'a Load,
    /// The lease duration.
    pub lease_duration: Duration,
    /// `max_leases_per_instance`.
    pub max_leases: Option<usize>,
    /// When the table's answer arrived: a value seen for the first time
    /// was written no later (it starts standing still from here).
    pub observed_at: Instant,
    /// When the table was asked: every value read was still current then
    /// (it has stood still at least until here). Measuring stillness from
    /// the answer of the first read to the question of the latest one
    /// never overstates it, however slow the reads.
    pub read_at: Instant,
}

/// The planner's memory: when each lease counter and each heartbeat last
/// moved, as observed here.
#[derive(Debug, Default)]
pub(super) struct Planner {
    observed: HashMap<ShardId, (u64, Instant)>,
    beats: HashMap<OwnerId, (u64, Instant)>,
}

/// Since when `counter` has stood still, as `seen` remembers it.
fn still_since<K: Hash + Eq>(
    seen: &mut HashMap<K, (u64, Instant)>,
    key: K,
    counter: u64,
    now: Instant,
) -> Instant {
    let entry = seen.entry(key).or_insert((counter, now));
    if entry.0 != counter {
        *entry = (counter, now);
    }
    entry.1
}

/// This instance's own order of shards: a hash of its id and the shard's.
fn order(me: &OwnerId, shard: &ShardId) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    me.hash(&mut h);
    shard.hash(&mut h);
    h.finish()
}

impl Planner {
    /// A planner with no observations yet (every lease and heartbeat
    /// counts as alive until seen unchanged for a lease duration).
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Plans a sync (see the module docs for the rules), phase by phase:
    /// the eligible shards, who is alive, what the table holds, the fair
    /// share, what to take, whom to ask.
    pub(super) fn plan(&mut self, inputs: &Inputs<'_>) -> Plan {
        let eligible = self.eligible(inputs);
        let alive = self.liveness(inputs);
        let table = self.classify(inputs, &eligible, &alive);
        let share = Share::of(inputs, &eligible, &alive, &table);
        let Table {
            free,
            lost,
            by_owner,
            legacy,
        } = table;
        let me = inputs.me;
        let mut unheld: Vec<ShardId> = free.iter().map(|(s, _)| s.clone()).collect();
        unheld.extend(lost);
        unheld.sort();
        let (take, asked_for) = take_free(me, free, &share);
        let took_free = !take.is_empty();
        // Nothing is asked for that could not be taken (at the cap).
        let mut ask = Vec::new();
        if !took_free && share.wanted > 0 && share.room > 0 {
            let wanted = share.wanted.min(share.room);
            ask = ask_by_count(me, wanted, share.fair, &by_owner, &alive.beating);
        }
        // Counts even (nobody above the share, nobody to ask by count), and
        // no move of ours under way: by load.
        if !took_free
            && ask.is_empty()
            && share.room > 0
            && share.coming == 0
            && asked_for == 0
            && share.mine <= share.fair
            && by_owner.values().all(|l| l.len() <= share.fair)
        {
            let load = inputs.load;
            ask.extend(ask_by_load(me, load, share.live, &by_owner, &alive.beating));
        }
        Plan {
            take,
            ask,
            free: unheld,
            fair_share: share.fair,
            live: share.live,
            legacy,
            retire: alive.retire,
        }
    }

    /// Rule 1: the shards that may be read now (not done, their parents
    /// still in the stream done); forgets what it saw of shards gone.
    fn eligible<'a>(&mut self, inputs: &Inputs<'a>) -> Vec<&'a ShardInfo> {
        let Inputs { shards, leases, .. } = *inputs;
        let present: HashSet<&ShardId> = shards.iter().map(|s| &s.id).collect();
        self.observed.retain(|shard, _| present.contains(shard));
        let done = |id: &ShardId| {
            leases
                .get(id)
                .is_some_and(|l| l.checkpoint == Some(Checkpoint::ShardEnd))
        };
        shards
            .iter()
            .filter(|s| !done(&s.id) && s.parents().all(|p| !present.contains(p) || done(p)))
            .collect()
    }

    /// Rules 2 and 8: whose heartbeat moves, and which long-stale ones of
    /// owners holding nothing to retire.
    fn liveness<'a>(&mut self, inputs: &Inputs<'a>) -> Alive<'a> {
        let Inputs {
            me,
            leases,
            heartbeats,
            lease_duration,
            observed_at,
            read_at,
            ..
        } = *inputs;
        let beating: HashMap<&OwnerId, &Heartbeat> =
            heartbeats.iter().map(|h| (&h.owner, h)).collect();
        self.beats.retain(|owner, _| beating.contains_key(owner));
        let mut owners = HashSet::new();
        let mut retire = Vec::new();
        for beat in heartbeats {
            let since = still_since(
                &mut self.beats,
                beat.owner.clone(),
                beat.counter,
                observed_at,
            );
            let still = read_at.saturating_duration_since(since);
            if &beat.owner == me || still < lease_duration {
                owners.insert(&beat.owner);
            } else if still >= lease_duration * RETIRE_AFTER
                && !leases
                    .values()
                    .any(|l| l.owner.as_ref() == Some(&beat.owner))
            {
                retire.push(beat.clone());
            }
        }
        Alive {
            owners,
            beating,
            retire,
        }
    }

    /// Rules 3 and 5: each eligible shard's lease, as free (absent,
    /// unowned, expired; reserved ones left to who asked), lost (ours in
    /// the table, not held here), or another owner's.
    fn classify<'a>(
        &mut self,
        inputs: &Inputs<'a>,
        eligible: &[&'a ShardInfo],
        alive: &Alive<'a>,
    ) -> Table<'a> {
        let Inputs {
            me,
            held,
            releasing,
            leases,
            lease_duration,
            observed_at,
            read_at,
            ..
        } = *inputs;
        let waited = |since: Option<Instant>| {
            since.is_some_and(|t| read_at.saturating_duration_since(t) >= lease_duration)
        };
        let mut table = Table::default();
        for shard in eligible {
            let lease = leases.get(&shard.id);
            let counter_since = lease
                .map(|l| still_since(&mut self.observed, shard.id.clone(), l.counter, observed_at));
            match lease.and_then(|l| l.owner.as_ref().map(|o| (l, o))) {
                None => {
                    // Rule 5: reserved for a live instance that asked.
                    let reserved = lease
                        .and_then(|l| l.handoff.as_ref())
                        .is_some_and(|to| to != me && alive.owners.contains(to));
                    if !reserved || waited(counter_since) {
                        table.free.push((shard.id.clone(), lease.cloned()));
                    }
                }
                Some((_, owner))
                    if owner == me
                        && (held.contains(&shard.id) || releasing.contains(&shard.id)) => {}
                Some((lease, owner)) => {
                    let beats = owner != me && alive.owners.contains(owner);
                    if waited(counter_since) && !beats {
                        table.free.push((shard.id.clone(), Some(lease.clone())));
                    } else if owner == me {
                        table.lost.push(shard.id.clone());
                    } else {
                        table.legacy |= !alive.beating.contains_key(owner);
                        table.by_owner.entry(owner).or_default().push(lease);
                    }
                }
            }
        }
        table
    }
}

/// Who is alive (rule 2), as one sync sees it.
struct Alive<'a> {
    /// Owners whose heartbeat moves (and this instance).
    owners: HashSet<&'a OwnerId>,
    /// Every heartbeat, by owner.
    beating: HashMap<&'a OwnerId, &'a Heartbeat>,
    /// Heartbeats to delete (rule 8).
    retire: Vec<Heartbeat>,
}

/// The eligible shards' leases, as one sync classifies them.
#[derive(Default)]
struct Table<'a> {
    /// Free or expired, with the lease as observed.
    free: Vec<(ShardId, Option<Lease>)>,
    /// Ours in the table, not held here, not yet expired: nobody reads it.
    lost: Vec<ShardId>,
    /// Other owners' live leases.
    by_owner: BTreeMap<&'a OwnerId, Vec<&'a Lease>>,
    /// A live owner has no heartbeat (an earlier version).
    legacy: bool,
}

/// Rule 4 and the counts taking and asking go by.
struct Share {
    /// Live instances.
    live: usize,
    /// The fair share.
    fair: usize,
    /// Eligible shards held here.
    mine: usize,
    /// Leases asked for by this instance and not yet released.
    coming: usize,
    /// Leases missing to the fair share.
    wanted: usize,
    /// Leases this instance may still take (`max_leases_per_instance`).
    room: usize,
}

impl Share {
    fn of(
        inputs: &Inputs<'_>,
        eligible: &[&ShardInfo],
        alive: &Alive<'_>,
        table: &Table<'_>,
    ) -> Self {
        let Inputs {
            me,
            held,
            max_leases,
            ..
        } = *inputs;
        let live = alive
            .owners
            .iter()
            .copied()
            .chain(table.by_owner.keys().copied())
            .chain(std::iter::once(me))
            .collect::<HashSet<&OwnerId>>()
            .len();
        let mut fair = eligible.len().div_ceil(live);
        if let Some(cap) = max_leases {
            fair = fair.min(cap);
        }
        let mine = eligible.iter().filter(|s| held.contains(&s.id)).count();
        // Asked for by us and not yet released: already coming, so not
        // asked for again (the owner may take longer to drain than a sync).
        let coming = table
            .by_owner
            .values()
            .flatten()
            .filter(|l| l.handoff.as_ref() == Some(me))
            .count();
        Self {
            live,
            fair,
            mine,
            coming,
            wanted: fair.saturating_sub(mine + coming),
            room: max_leases.map_or(usize::MAX, |cap| cap.saturating_sub(mine)),
        }
    }
}

/// Rule 5: the free leases to take, released-for-us first (ours, even one
/// past the share: an ask by load; the count rule then evens the counts),
/// then in this instance's own order; and how many were released for us.
fn take_free(
    me: &OwnerId,
    mut free: Vec<(ShardId, Option<Lease>)>,
    share: &Share,
) -> (Vec<(ShardId, Option<Lease>)>, usize) {
    let for_me = |l: &Option<Lease>| {
        l.as_ref()
            .is_some_and(|l| l.owner.is_none() && l.handoff.as_ref() == Some(me))
    };
    free.sort_by_key(|(s, l)| (!for_me(l), order(me, s)));
    let asked_for = free.iter().filter(|(_, l)| for_me(l)).count();
    let count = share.wanted.max(asked_for).min(share.room);
    (free.into_iter().take(count).collect(), asked_for)
}

/// Rule 6: up to `wanted` leases, each from the owner then holding the
/// most, if above `fair_share`; its quietest lease not already asked for.
fn ask_by_count(
    me: &OwnerId,
    wanted: usize,
    fair_share: usize,
    by_owner: &BTreeMap<&OwnerId, Vec<&Lease>>,
    beating: &HashMap<&OwnerId, &Heartbeat>,
) -> Vec<Lease> {
    // An owner's leases already asked for (by anyone) are leaving it.
    let mut counts: BTreeMap<&OwnerId, usize> = by_owner
        .iter()
        .map(|(o, l)| (*o, l.iter().filter(|l| l.handoff.is_none()).count()))
        .collect();
    let mut asked: Vec<Lease> = Vec::new();
    for _ in 0..wanted {
        let Some((&owner, _)) = counts
            .iter()
            .filter(|(_, n)| **n > fair_share)
            .max_by_key(|(owner, n)| (**n, std::cmp::Reverse(**owner)))
        else {
            break;
        };
        let rate = |l: &Lease| {
            beating
                .get(owner)
                .map_or(0.0, |h| h.load.rate_of(&l.key.shard))
        };
        let pick = by_owner[owner]
            .iter()
            .filter(|l| l.handoff.is_none() && !asked.iter().any(|a| a.key == l.key))
            .min_by(|a, b| {
                rate(a)
                    .total_cmp(&rate(b))
                    .then(order(me, &a.key.shard).cmp(&order(me, &b.key.shard)))
            });
        let Some(pick) = pick else {
            counts.remove(owner);
            continue;
        };
        asked.push((*pick).clone());
        *counts.get_mut(owner).expect("picked from it") -= 1;
    }
    asked
}

/// Rule 7: the busiest shard of the busiest instance, if that instance is
/// well above the mean and moving the shard here clearly lowers the pair's
/// larger load.
fn ask_by_load(
    me: &OwnerId,
    load: &Load,
    live: usize,
    by_owner: &BTreeMap<&OwnerId, Vec<&Lease>>,
    beating: &HashMap<&OwnerId, &Heartbeat>,
) -> Option<Lease> {
    let others = beating
        .iter()
        .filter(|(owner, _)| **owner != me && by_owner.contains_key(**owner));
    let total: f64 = load.total + others.clone().map(|(_, h)| h.load.total).sum::<f64>();
    let mean = total / live as f64;
    let (owner, busiest) =
        others.max_by(|a, b| a.1.load.total.total_cmp(&b.1.load.total).then(b.0.cmp(a.0)))?;
    let l_b = busiest.load.total;
    let settled = load.settled && busiest.load.settled;
    if !settled || l_b < MIN_LOAD || l_b < 1.25 * mean || load.total >= l_b {
        return None;
    }
    let leases = &by_owner[*owner];
    busiest.load.hottest.iter().find_map(|(shard, r)| {
        let after = (l_b - r).max(load.total + r);
        (after <= 0.8 * l_b)
            .then(|| {
                leases
                    .iter()
                    .find(|l| &l.key.shard == shard && l.handoff.is_none())
            })
            .flatten()
            .map(|l| (*l).clone())
    })
}

#[cfg(test)]
mod tests;
