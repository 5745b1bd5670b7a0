//! The fleet's version rules as pure transitions: revisions, rollback targets,
//! canaries one at a time, declarations, decisions and the bounded history.

use super::*;

fn d(n: u8) -> PluginDigest {
    PluginDigest::of(&[n])
}

fn apply(v: &FleetVersions, c: Command) -> FleetVersions {
    v.apply(c, "test", 1_000).unwrap()
}

fn deployed(digests: &[u8]) -> FleetVersions {
    digests.iter().fold(FleetVersions::default(), |v, n| {
        apply(&v, Command::Deploy(d(*n)))
    })
}

/// Catches: a change that does not move the revision (two writers
/// would both succeed), or one not recorded in the history.
#[test]
fn every_change_moves_the_revision_and_is_recorded() {
    let v = deployed(&[1, 2]);
    assert_eq!(v.revision, 2);
    assert_eq!(v.stable, Some(d(2)));
    let actions: Vec<_> = v
        .history
        .iter()
        .map(|c| (c.action, c.digest.clone()))
        .collect();
    assert_eq!(actions, [(Action::Deploy, d(1)), (Action::Deploy, d(2))]);
    assert!(matches!(
        v.apply(Command::Deploy(d(2)), "t", 0),
        Err(VersionsError::Unchanged(_))
    ));
}

/// Catches: a rollback that goes to the wrong version (the current one,
/// or an older one than the previous), or one to a version never
/// deployed here.
#[test]
fn rollback_goes_to_the_version_before_or_one_named_from_the_history() {
    let v = deployed(&[1, 2, 3]);
    let back = apply(&v, Command::Rollback { to: None });
    assert_eq!(back.stable, Some(d(2)));
    // Rolling back again goes to the one before 2, not to 3.
    let twice = apply(&back, Command::Rollback { to: None });
    assert_eq!(
        twice.stable,
        Some(d(3)),
        "the entry before the rollback to 2 made 3 stable"
    );
    let named = apply(&v, Command::Rollback { to: Some(d(1)) });
    assert_eq!(named.stable, Some(d(1)));
    assert_eq!(
        v.apply(Command::Rollback { to: Some(d(9)) }, "t", 0),
        Err(VersionsError::Unknown(d(9)))
    );
    assert_eq!(
        deployed(&[1]).apply(Command::Rollback { to: None }, "t", 0),
        Err(VersionsError::NoEarlier)
    );
}

/// Catches: two canaries at once, a deploy that silently drops a
/// running canary, promote without one, or an automatic decision
/// applied to a candidate that was since replaced.
#[test]
fn a_canary_is_one_at_a_time_and_decisions_name_their_candidate() {
    let v = deployed(&[1]);
    let canary = Command::Canary {
        candidate: d(2),
        key_fraction: 0.1,
        rules: CanaryRules::default(),
    };
    let c = apply(&v, canary.clone());
    assert_eq!(c.canary.as_ref().unwrap().candidate, d(2));
    assert_eq!(c.running(), [&d(1), &d(2)]);
    assert_eq!(
        c.apply(canary, "t", 0),
        Err(VersionsError::CanaryRunning(d(2)))
    );
    assert_eq!(
        c.apply(Command::Deploy(d(3)), "t", 0),
        Err(VersionsError::CanaryRunning(d(2)))
    );
    assert_eq!(
        c.apply(
            Command::AutoRollback {
                candidate: d(3),
                note: String::new()
            },
            "t",
            0
        ),
        Err(VersionsError::NoCanary)
    );
    let promoted = apply(&c, Command::Promote);
    assert_eq!(
        (promoted.stable.clone(), promoted.canary.clone()),
        (Some(d(2)), None)
    );
    let dropped = apply(
        &c,
        Command::AutoRollback {
            candidate: d(2),
            note: "failures 20.0 % against 0.0 %".to_owned(),
        },
    );
    assert_eq!(
        (dropped.stable.clone(), dropped.canary.clone()),
        (Some(d(1)), None)
    );
    assert_eq!(dropped.history.last().unwrap().action, Action::AutoRollback);
    // A rollback right after a dropped canary goes to the version
    // before 1, not to the dropped candidate.
    assert_eq!(
        dropped.apply(Command::Rollback { to: None }, "t", 0),
        Err(VersionsError::NoEarlier)
    );
    assert_eq!(
        v.apply(Command::Promote, "t", 0),
        Err(VersionsError::NoCanary)
    );
}

/// Catches: a config's bytes declared again on every restart (an old
/// pod restarting would undo a command's deploy), or a config change
/// that does not win.
#[test]
fn a_configs_bytes_are_declared_once() {
    let v = apply(&FleetVersions::default(), Command::Declare(d(1)));
    assert_eq!(v.stable, Some(d(1)));
    let deployed = apply(&v, Command::Deploy(d(2)));
    assert!(matches!(
        deployed.apply(Command::Declare(d(1)), "t", 0),
        Err(VersionsError::Unchanged(_))
    ));
    let new_config = apply(&deployed, Command::Declare(d(3)));
    assert_eq!(new_config.stable, Some(d(3)));
    assert_eq!(new_config.history.last().unwrap().action, Action::Declared);
}

/// Catches: a canary judged on too few records, one rolled back for
/// failures the stable version shows as much (bad input, not a bad
/// version), one promoted before its window, or one promoted although
/// its rule was broken.
#[test]
fn a_canary_is_judged_against_the_stable_version_over_enough_records() {
    let plan = CanaryPlan {
        candidate: d(2),
        key_fraction: 0.2,
        since_ms: 1_000,
        rules: CanaryRules {
            rollback_failure_rate: Some(0.05),
            min_records: 100,
            promote_after_ms: Some(60_000),
        },
    };
    let counts = |sr, sf, cr, cf| CanaryCounts {
        candidate: Some(d(2)),
        stable_records: sr,
        stable_failures: sf,
        candidate_records: cr,
        candidate_failures: cf,
    };
    // 20 % failing, but only 50 records: wait.
    assert_eq!(plan.decide(&counts(400, 0, 50, 10), 2_000), Decision::Wait);
    // 20 % against 0 % over 100: roll back, with the figures.
    match plan.decide(&counts(400, 0, 100, 20), 2_000) {
        Decision::Rollback(note) => assert!(note.contains("20.0 %"), "{note}"),
        other => panic!("{other:?}"),
    }
    // 20 % against 18 %: the input, not the candidate.
    assert_eq!(
        plan.decide(&counts(400, 72, 100, 20), 2_000),
        Decision::Wait
    );
    // Healthy, window not passed: wait; passed: promote.
    assert_eq!(plan.decide(&counts(400, 0, 100, 1), 60_999), Decision::Wait);
    assert!(matches!(
        plan.decide(&counts(400, 0, 100, 1), 61_000),
        Decision::Promote(_)
    ));
    // Broken rule at the end of the window: rolled back, not promoted.
    assert!(matches!(
        plan.decide(&counts(400, 0, 100, 20), 61_000),
        Decision::Rollback(_)
    ));
    // Window passed on too little traffic: wait.
    assert_eq!(plan.decide(&counts(400, 0, 99, 0), 61_000), Decision::Wait);
}

/// Catches: a history that grows without bound (a DynamoDB item holds
/// 400 KB), or one that drops the newest entries.
#[test]
fn the_history_keeps_the_newest_entries() {
    let mut v = FleetVersions::default();
    for i in 0..(HISTORY_KEPT + 10) {
        v = apply(&v, Command::Deploy(PluginDigest::of(&i.to_le_bytes())));
    }
    assert_eq!(v.history.len(), HISTORY_KEPT);
    assert_eq!(
        v.history.last().unwrap().digest,
        PluginDigest::of(&(HISTORY_KEPT + 9).to_le_bytes())
    );
    let json = serde_json::to_string(&v).unwrap();
    assert!(json.len() < 100_000, "{} bytes", json.len());
    let back: FleetVersions = serde_json::from_str(&json).unwrap();
    assert_eq!(back, v);
}
