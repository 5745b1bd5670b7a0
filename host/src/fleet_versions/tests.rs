//! The fleet's version rules as pure transitions: revisions, rollback targets,
//! canaries one at a time, declarations, decisions, filters as part of a
//! version, and the bounded history.

use super::*;

fn d(n: u8) -> PluginDigest {
    PluginDigest::of(&[n])
}

fn apply(v: &FleetVersions, c: Command) -> FleetVersions {
    v.apply(c, "test", 1_000).unwrap()
}

fn deployed(digests: &[u8]) -> FleetVersions {
    digests.iter().fold(FleetVersions::default(), |v, n| {
        apply(&v, Command::Deploy(d(*n).into()))
    })
}

/// A version stored in `store`.
fn in_store(n: u8, store: &str) -> Stored {
    Stored {
        digest: d(n),
        location: Some(store.to_owned()),
    }
}

fn canary(n: u8) -> Command {
    Command::Canary(CanaryStart {
        candidate: d(n).into(),
        key_fraction: 0.1,
        rules: CanaryRules::default(),
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
        v.apply(Command::Deploy(d(2).into()), "t", 0),
        Err(VersionsError::Unchanged(_))
    ));
    let revisions: Vec<u64> = v.history.iter().map(|c| c.revision).collect();
    assert_eq!(revisions, [1, 2], "each entry names the revision it made");
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
    let c = apply(&v, canary(2));
    let id = c.canary.as_ref().unwrap().id;
    assert_eq!(
        id, c.revision,
        "a canary is known by the revision that started it"
    );
    assert_eq!(c.canary.as_ref().unwrap().candidate, d(2));
    assert_eq!(c.running(), [&d(1), &d(2)]);
    assert_eq!(
        c.apply(canary(2), "t", 0),
        Err(VersionsError::CanaryRunning(d(2)))
    );
    assert_eq!(
        c.apply(Command::Deploy(d(3).into()), "t", 0),
        Err(VersionsError::CanaryRunning(d(2)))
    );
    assert_eq!(
        c.apply(
            Command::Decided {
                rollout: id + 1,
                promote: false,
                note: String::new()
            },
            "t",
            0
        ),
        Err(VersionsError::OtherCanary(id + 1))
    );
    let promoted = apply(&c, Command::Promote);
    assert_eq!(
        (promoted.stable.clone(), promoted.canary.clone()),
        (Some(d(2)), None)
    );
    let dropped = apply(
        &c,
        Command::Decided {
            rollout: id,
            promote: false,
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
    // The same candidate deployed again is another canary: a decision
    // about the first does not apply to it.
    let again = apply(&dropped, canary(2));
    let second = again.canary.as_ref().unwrap().id;
    assert_ne!(second, id);
    assert_eq!(
        again.apply(
            Command::Decided {
                rollout: id,
                promote: true,
                note: String::new()
            },
            "t",
            0
        ),
        Err(VersionsError::OtherCanary(id))
    );
}

/// Catches: a config's plugin declared over a fleet that has versions
/// (a restart, or a stray instance with other bytes, would undo or
/// override a deploy), or a declaration that loses the config's canary.
#[test]
fn a_config_declares_only_into_an_empty_fleet() {
    let declare = |n: u8, canary: Option<CanaryStart>| Command::Declare {
        stable: in_store(n, "s3://a"),
        filter: None,
        canary,
        lone: false,
    };
    let start = CanaryStart {
        candidate: in_store(2, "s3://a"),
        key_fraction: 0.25,
        rules: CanaryRules::default(),
    };
    let v = apply(&FleetVersions::default(), declare(1, Some(start)));
    assert_eq!(v.stable, Some(d(1)));
    assert_eq!(
        v.canary.as_ref().map(|c| (c.candidate.clone(), c.id)),
        Some((d(2), 1))
    );
    assert_eq!(v.revision, 1, "one change, one revision");
    assert_eq!(v.artifacts.as_deref(), Some("s3://a"));
    let actions: Vec<_> = v.history.iter().map(|c| c.action).collect();
    assert_eq!(actions, [Action::Declared, Action::Canary]);
    for n in [1, 3] {
        assert!(matches!(
            v.apply(declare(n, None), "t", 0),
            Err(VersionsError::Unchanged(_))
        ));
    }
}

/// Catches: a lone host's config change lost (its config is how it is
/// told), or a restart with bytes declared before undoing a later deploy.
#[test]
fn a_lone_hosts_config_declares_bytes_it_never_declared() {
    let declare = |n: u8| Command::Declare {
        stable: d(n).into(),
        filter: None,
        canary: None,
        lone: true,
    };
    let v = apply(&FleetVersions::default(), declare(1));
    let deployed = apply(&v, Command::Deploy(d(2).into()));
    assert!(matches!(
        deployed.apply(declare(1), "t", 0),
        Err(VersionsError::Unchanged(_))
    ));
    let changed = apply(&deployed, declare(3));
    assert_eq!(changed.stable, Some(d(3)));
    assert_eq!(changed.history.last().unwrap().action, Action::Declared);
}

/// Catches: a version recorded whose bytes are in a store the fleet does
/// not read (every instance would then wait for it for ever).
#[test]
fn every_version_is_in_the_fleets_store() {
    let v = apply(
        &FleetVersions::default(),
        Command::Deploy(in_store(1, "s3://a")),
    );
    assert_eq!(v.artifacts.as_deref(), Some("s3://a"));
    assert_eq!(
        v.apply(Command::Deploy(in_store(2, "s3://b")), "t", 0),
        Err(VersionsError::OtherStore {
            fleet: "s3://a".into(),
            given: "s3://b".into()
        })
    );
    assert!(matches!(
        v.apply(Command::Deploy(d(2).into()), "t", 0),
        Err(VersionsError::OtherStore { .. })
    ));
    assert!(matches!(
        v.apply(Command::Shadow(in_store(2, "oci://r/x")), "t", 0),
        Err(VersionsError::OtherStore { .. })
    ));
    let next = apply(&v, Command::Deploy(in_store(2, "s3://a")));
    assert_eq!(next.stable, Some(d(2)));
    // A fleet that never had a store takes the first one a version names.
    let bare = apply(&FleetVersions::default(), Command::Deploy(d(1).into()));
    assert_eq!(bare.artifacts, None);
    let stored = apply(&bare, Command::Deploy(in_store(2, "s3://a")));
    assert_eq!(stored.artifacts.as_deref(), Some("s3://a"));
}

/// Catches: a canary judged on too few records, one rolled back for
/// failures the stable version shows as much (bad input, not a bad
/// version), one promoted before its window, or one promoted although
/// its rule was broken.
#[test]
fn a_canary_is_judged_against_the_stable_version_over_enough_records() {
    let plan = CanaryPlan {
        id: 7,
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
        rollout: 7,
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
        v = apply(
            &v,
            Command::Deploy(PluginDigest::of(&i.to_le_bytes()).into()),
        );
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

/// A filter letting in the partition key `k<n>`.
fn f(n: u8) -> FilterText {
    crate::filter::Filter::parse(&[format!(r#"{{"partitionKey": ["k{n}"]}}"#)])
        .unwrap()
        .text()
        .clone()
}

fn deploy_filter(n: u8, plugin: Option<u8>) -> Command {
    Command::DeployFilter {
        filter: Some(f(n)),
        plugin: plugin.map(|p| d(p).into()),
    }
}

/// The stable version: its plugin and its filter's digest.
fn stable(v: &FleetVersions) -> (PluginDigest, Option<FilterDigest>) {
    (v.stable.clone().unwrap(), v.filter.clone())
}

/// Catches: a filter change that is not a version (not in the history,
/// not rolled back with the plugin), a plugin deploy that drops the
/// filter, or a rollback that restores the plugin with the wrong filter.
#[test]
fn a_filter_is_deployed_and_rolled_back_as_part_of_the_version() {
    let v = deployed(&[1]);
    let filtered = apply(&v, deploy_filter(7, None));
    assert_eq!(stable(&filtered), (d(1), Some(f(7).digest)));
    assert_eq!(filtered.stable_filter().unwrap(), Some(&f(7)));
    let last = filtered.history.last().unwrap();
    assert_eq!(
        (last.action, last.filter.clone()),
        (Action::Deploy, Some(f(7).digest))
    );
    assert!(last.note.contains(f(7).digest.short()), "{}", last.note);
    assert!(matches!(
        filtered.apply(deploy_filter(7, None), "t", 0),
        Err(VersionsError::Unchanged(_))
    ));
    // A plugin deploy keeps the filter; plugin and filter at once are one
    // change.
    let two = apply(&filtered, Command::Deploy(d(2).into()));
    assert_eq!(stable(&two), (d(2), Some(f(7).digest)));
    let both = apply(&two, deploy_filter(8, Some(3)));
    assert_eq!(stable(&both), (d(3), Some(f(8).digest)));
    assert_eq!(both.revision, two.revision + 1);
    // Back to the version before: plugin and filter together; a second
    // rollback undoes the first, as for a plugin alone.
    let back = apply(&both, Command::Rollback { to: None });
    assert_eq!(stable(&back), (d(2), Some(f(7).digest)));
    assert_eq!(back.stable_filter().unwrap(), Some(&f(7)));
    let again = apply(&back, Command::Rollback { to: None });
    assert_eq!(stable(&again), (d(3), Some(f(8).digest)));
    // A filter-only deploy is a version of its own.
    let back = apply(&filtered, Command::Rollback { to: None });
    assert_eq!(stable(&back), (d(1), None));
    // Named: the newest version with that plugin other than the running one.
    let named = apply(&both, Command::Rollback { to: Some(d(1)) });
    assert_eq!(stable(&named), (d(1), Some(f(7).digest)));
    let named = apply(&named, Command::Rollback { to: Some(d(1)) });
    assert_eq!(stable(&named), (d(1), None), "the first, without a filter");
    // No filter is a filter change too.
    let cleared = apply(
        &both,
        Command::DeployFilter {
            filter: None,
            plugin: None,
        },
    );
    assert_eq!(stable(&cleared), (d(3), None));
    assert_eq!(cleared.stable_filter().unwrap(), None);
}

/// Catches: a filter changed under a running canary (whose candidate
/// runs behind the stable version's filter), or a promotion that drops it.
#[test]
fn a_canary_runs_behind_the_stable_filter() {
    let v = apply(&deployed(&[1]), deploy_filter(7, None));
    let with_canary = apply(&v, canary(2));
    assert!(matches!(
        with_canary.apply(deploy_filter(8, None), "t", 0),
        Err(VersionsError::CanaryRunning(_))
    ));
    let promoted = apply(&with_canary, Command::Promote);
    assert_eq!(stable(&promoted), (d(2), Some(f(7).digest)));
}

/// Catches: filter texts that grow without bound (a DynamoDB item holds
/// 400 KB), the stable one dropped, or a rollback to a version whose
/// filter is gone that runs it without one.
#[test]
fn filter_texts_are_kept_for_the_latest_versions() {
    let mut v = apply(&deployed(&[3]), deploy_filter(0, None));
    v = apply(&v, Command::Deploy(d(1).into()));
    for n in 1..=10 {
        v = apply(&v, deploy_filter(n, None));
    }
    assert_eq!(v.filters.len(), FILTERS_KEPT);
    assert_eq!(v.stable_filter().unwrap(), Some(&f(10)));
    assert_eq!(
        v.apply(Command::Rollback { to: Some(d(3)) }, "t", 0),
        Err(VersionsError::FilterGone(f(0).digest))
    );
    let back = apply(&v, Command::Rollback { to: None });
    assert_eq!(stable(&back), (d(1), Some(f(9).digest)));
    let json = serde_json::to_string(&v).unwrap();
    let again: FleetVersions = serde_json::from_str(&json).unwrap();
    assert_eq!(again, v);
}

/// Catches: a lone host's restart undoing a filter deployed by command,
/// or a config's new filter lost.
#[test]
fn a_lone_hosts_config_declares_a_filter_it_never_declared() {
    let declare = |n: Option<u8>| Command::Declare {
        stable: d(1).into(),
        filter: n.map(f),
        canary: None,
        lone: true,
    };
    let v = apply(&FleetVersions::default(), declare(Some(7)));
    assert_eq!(stable(&v), (d(1), Some(f(7).digest)));
    let deployed = apply(&v, deploy_filter(8, None));
    assert!(matches!(
        deployed.apply(declare(Some(7)), "t", 0),
        Err(VersionsError::Unchanged(_))
    ));
    let changed = apply(&deployed, declare(None));
    assert_eq!(stable(&changed), (d(1), None));
    let last = changed.history.last().unwrap();
    assert_eq!(last.action, Action::Declared);
    assert!(last.note.contains("filter"), "{}", last.note);
}

/// Catches: an empty fleet declared without its config's filter.
#[test]
fn a_fleets_first_declaration_carries_the_configs_filter() {
    let v = apply(
        &FleetVersions::default(),
        Command::Declare {
            stable: d(1).into(),
            filter: Some(f(7)),
            canary: None,
            lone: false,
        },
    );
    assert_eq!(stable(&v), (d(1), Some(f(7).digest)));
    assert_eq!(v.stable_filter().unwrap(), Some(&f(7)));
}

/// Catches: a fleet whose versions were recorded before filters were part
/// of them dropping its config's filter on upgrade, or a later start
/// overriding a filter deployed since.
#[test]
fn versions_from_before_filters_take_the_configs_filter_once() {
    let old = deployed(&[1]);
    assert!(!old.filter_declared);
    let declare = |n: u8| Command::Declare {
        stable: d(2).into(),
        filter: Some(f(n)),
        canary: None,
        lone: false,
    };
    let v = apply(&old, declare(7));
    assert_eq!(
        stable(&v),
        (d(1), Some(f(7).digest)),
        "the fleet's plugin stays"
    );
    assert!(v.filter_declared);
    assert!(matches!(
        v.apply(declare(8), "t", 0),
        Err(VersionsError::Unchanged(_))
    ));
}
