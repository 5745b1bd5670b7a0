//! The subscription status the page and `/readyz` read: coverage, lease
//! changes and the versions' outcomes.

use super::*;

#[test]
fn coverage_fails_only_past_the_grace() {
    let t0 = Instant::now();
    let s = |secs| t0 + Duration::from_secs(secs);
    let mut c = Coverage::default();
    assert_eq!(c.problem(s(100)), None, "no grace set: no verdict");
    c.grace = Duration::from_secs(5);
    c.synced(0, t0);
    assert_eq!(c.problem(s(4)), None);
    c.synced(2, s(4));
    assert_eq!(c.problem(s(8)), None, "unread, within the grace");
    c.synced(1, s(8));
    let problem = c.problem(s(10)).expect("unread since 4 s, for 6 s");
    assert!(problem.contains("1 shard(s) read by nobody"), "{problem}");
    c.synced(0, s(10));
    assert_eq!(c.problem(s(11)), None, "read again");
    let stale = c.problem(s(16)).expect("no sync for 6 s");
    assert!(stale.contains("no successful shard sync"), "{stale}");
}

#[test]
fn a_subscription_with_shards_nobody_reads_is_not_ready() {
    let status = SubscriptionStatus::new("sequential".into());
    status.set_coverage_grace(Duration::from_secs(1));
    assert!(!status.synced(0, Instant::now()));
    assert!(status.ready());
    assert!(
        status.synced(2, Instant::now() - Duration::from_secs(2)),
        "newly unread"
    );
    assert!(!status.ready());
}

#[test]
fn readiness_needs_a_sync_and_positioned_readers() {
    let s = SubscriptionStatus::new("sequential".into());
    let shard = ShardId::from("shard-0");
    assert!(!s.ready(), "no sync yet");
    s.synced(0, Instant::now());
    s.lease_taken(&shard, &OwnerId::from("me"), None);
    assert!(!s.ready(), "a reader still opening");
    s.reader_positioned(&shard);
    assert!(s.ready());
}

#[test]
fn owner_changes_are_kept_newest_first_and_first_sightings_elsewhere_are_not() {
    let s = SubscriptionStatus::new("sequential".into());
    let (me, them) = (OwnerId::from("me"), OwnerId::from("them"));
    let (a, b) = (ShardId::from("shard-a"), ShardId::from("shard-b"));
    s.held_elsewhere(&a, Some(&them), None);
    assert!(
        s.lease_changes().is_empty(),
        "a first sighting is no change"
    );
    s.lease_taken(&b, &me, None);
    s.held_elsewhere(&a, Some(&me), None);
    s.lease_taken(&a, &me, None);
    s.released(&b);
    let seen: Vec<_> = s
        .lease_changes()
        .into_iter()
        .map(|c| (c.shard, c.from, c.to))
        .collect();
    assert_eq!(
        seen,
        vec![
            (b.clone(), Some(me.clone()), None),
            (a.clone(), Some(them), Some(me.clone())),
            (b.clone(), None, Some(me.clone())),
        ]
    );
    for _ in 0..LEASE_CHANGES_KEPT {
        s.released(&b);
        s.lease_taken(&b, &me, None);
    }
    assert_eq!(s.lease_changes().len(), LEASE_CHANGES_KEPT);
}

#[test]
fn versions_show_every_record_without_a_canary_and_each_side_with_one() {
    let s = SubscriptionStatus::new("sequential".into());
    let mut all = VersionCounts::default();
    all.ack.add(5);
    all.failed = vec![Counter::default(), Counter::default()];
    all.failed[1].add(2);
    s.set_outcomes(all);
    s.set_versions("sha256:a".into(), None);
    let v = s.versions();
    assert_eq!(v.len(), 1);
    assert_eq!(
        (v[0].role, v[0].outcomes.ack, v[0].outcomes.failed),
        ("stable", 5, 2)
    );
    let candidate = VersionCounts::default();
    candidate.reject.add(3);
    s.set_versions(
        "sha256:a".into(),
        Some(CanaryView {
            describe: "sha256:b on 0.1 of the keys".into(),
            digest: "sha256:b".into(),
            stable: VersionCounts::default(),
            candidate,
        }),
    );
    let v = s.versions();
    assert_eq!(v[0].outcomes, Outcomes::default());
    assert_eq!(
        (v[1].role, v[1].digest.as_str(), v[1].outcomes.reject),
        ("candidate", "sha256:b", 3)
    );
    assert_eq!(s.canary().as_deref(), Some("sha256:b on 0.1 of the keys"));
}

#[test]
fn an_ended_shard_stays_ended_when_released_or_seen_again() {
    let s = SubscriptionStatus::new("sequential".into());
    let shard = ShardId::from("shard-0");
    s.lease_taken(&shard, &OwnerId::from("me"), None);
    s.reader_stopped(&shard, true);
    s.released(&shard);
    s.held_elsewhere(&shard, None, None);
    let (_, status) = s.shards().pop().unwrap();
    assert_eq!(status.state, ShardState::Ended);
    assert_eq!(status.owner, None);
    let other = ShardId::from("shard-1");
    s.lease_taken(&other, &OwnerId::from("me"), None);
    s.reader_stopped(&other, false);
    s.released(&other);
    assert_eq!(s.shards()[1].1.state, ShardState::Released);
    s.held_elsewhere(
        &other,
        Some(&OwnerId::from("them")),
        Some(&Checkpoint::ShardEnd),
    );
    assert_eq!(s.shards()[1].1.state, ShardState::Ended);
}
