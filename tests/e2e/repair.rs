//! Repairing what a bad version did: `shardlane replay` of a range next to
//! a running service, against kinesis-local and a dynalite lease table.
//! Bounded in records and time, on loopback.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use shardlane::PluginDigest;
use shardlane_testkit::{Dynalite, HostProcess, Kinesis, LogLine, guests, unique_name};

use crate::common::{field, guest_lines, shardlane_bin};
use crate::leases::{QUICK_LEASES, dynamodb_config, env, split_first_shard};
use crate::state::committed_totals_of as totals;

/// The subscription's extra lines: per-key state, an output stream for
/// the publisher guest, and small reads (so a replay takes a while).
fn extra(output: &str) -> String {
    format!(
        "state = {{ max_value = \"1KiB\" }}\noutputs = [\"{output}\"]\nconfig = {{ out_stream = \"{output}\" }}\nread_limit = 5"
    )
}

/// Now, as `--from`/`--to` take it.
fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Puts one `add=1` record for each key.
async fn put_keys(kinesis: &Kinesis, stream: &str, keys: &[String]) {
    let records: Vec<(String, Vec<u8>)> = keys
        .iter()
        .map(|k| (k.clone(), b"add=1".to_vec()))
        .collect();
    kinesis.put_records(stream, &records).await.unwrap();
}

fn keys(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i}")).collect()
}

/// The keys whose records the stateful guest handled, in the order of its
/// lines (`total key=<k> …`), with the shard each came from.
fn handled(lines: &[LogLine]) -> Vec<(String, String)> {
    guest_lines(lines, "total key=")
        .iter()
        .map(|l| {
            (
                field(l, "partition_key").to_owned(),
                field(l, "shard_id").to_owned(),
            )
        })
        .collect()
}

/// Every item of the lease table: (lease group, sort key) → checkpoint.
async fn items(dynalite: &Dynalite, table: &str) -> BTreeMap<(String, String), Option<String>> {
    let Ok(scan) = dynalite
        .client()
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
    else {
        return BTreeMap::new();
    };
    let s = |item: &HashMap<String, AttributeValue>, k: &str| {
        item.get(k).and_then(|v| v.as_s().ok()).cloned()
    };
    scan.items()
        .iter()
        .map(|item| {
            (
                (
                    s(item, "lease_group").unwrap_or_default(),
                    s(item, "shard_id").unwrap_or_default(),
                ),
                s(item, "checkpoint"),
            )
        })
        .collect()
}

/// The checkpoints of the service's leases (not a replay's).
async fn live_checkpoints(
    dynalite: &Dynalite,
    table: &str,
    stream: &str,
) -> BTreeMap<String, Option<String>> {
    items(dynalite, table)
        .await
        .into_iter()
        .filter(|((group, shard), _)| {
            group == &format!("fleet#{stream}") && shard.starts_with("shardId-")
        })
        .map(|((_, shard), checkpoint)| (shard, checkpoint))
        .collect()
}

/// The items any replay wrote.
async fn replay_items(dynalite: &Dynalite, table: &str) -> usize {
    items(dynalite, table)
        .await
        .keys()
        .filter(|(group, _)| group.contains("~replay~"))
        .count()
}

/// Runs `shardlane replay <args>` to its end; returns it (exited).
async fn replay(
    config: &str,
    args: &[&str],
    env: &[(&str, &str)],
    within: Duration,
) -> (HostProcess, std::process::ExitStatus) {
    let mut args = args.to_vec();
    args.extend(["--subscription", "fleet"]);
    let mut process =
        HostProcess::start_command(shardlane_bin(), "replay", config, &args, env).unwrap();
    let status = process.wait_exit(within).await.unwrap();
    (process, status)
}

/// The summary lines a replay printed (its stdout lines that are not log
/// lines).
fn summary(process: &HostProcess) -> String {
    process
        .lines()
        .iter()
        .filter_map(|l| l["unparsed"].as_str().map(str::to_owned))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What both tests start: the emulators, a stream of `shards` and an
/// output stream, the fleet's config (stateful guest) written to a file.
struct Rig {
    guests: guests::Guests,
    kinesis: Kinesis,
    dynalite: Dynalite,
    dir: tempfile::TempDir,
    stream: String,
    output: String,
    table: String,
    config: String,
    config_path: std::path::PathBuf,
}

impl Rig {
    async fn start(shards: i32) -> Self {
        let (guests, kinesis, dynalite) = emulators().await;
        let dir = tempfile::tempdir().unwrap();
        let (stream, output, table) = (
            unique_name("replay"),
            unique_name("replay-out"),
            unique_name("leases"),
        );
        kinesis.create_stream(&stream, shards).await.unwrap();
        kinesis.create_stream(&output, 1).await.unwrap();
        let config = dynamodb_config(
            "live",
            &table,
            &stream,
            &guests.stateful,
            QUICK_LEASES,
            &extra(&output),
        );
        let config_path = dir.path().join("shardlane.toml");
        std::fs::write(&config_path, &config).unwrap();
        Self {
            guests,
            kinesis,
            dynalite,
            dir,
            stream,
            output,
            table,
            config,
            config_path,
        }
    }

    fn env(&self) -> [(&'static str, &str); 2] {
        env(&self.kinesis, &self.dynalite)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_handles_its_range_once_parents_first_next_to_the_service() {
    let rig = Rig::start(1).await;
    let Rig {
        guests,
        kinesis,
        dynalite,
        dir,
        stream,
        output: _,
        table,
        config,
        config_path,
    } = &rig;
    let env = rig.env();
    let mut service = HostProcess::start_with(shardlane_bin(), config, &env).unwrap();

    put_keys(kinesis, stream, &keys("before", 0..10)).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let from = now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    put_keys(kinesis, stream, &keys("in", 0..20)).await;
    // A split inside the range: the rest of it lands on the children.
    split_first_shard(kinesis, stream).await;
    put_keys(kinesis, stream, &keys("in", 20..40)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let to = now();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    put_keys(kinesis, stream, &keys("after", 0..10)).await;

    let all: Vec<String> = [
        keys("before", 0..10),
        keys("in", 0..40),
        keys("after", 0..10),
    ]
    .concat();
    service
        .wait_for(
            "the service handled everything",
            Duration::from_secs(60),
            |lines| {
                let seen: BTreeSet<String> = handled(lines).into_iter().map(|(k, _)| k).collect();
                all.iter().all(|k| seen.contains(k))
            },
        )
        .await
        .unwrap();
    // Its checkpoints (every 200 ms) catch up; then they stay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let live_before = live_checkpoints(dynalite, table, stream).await;
    assert_eq!(
        live_before.len(),
        3,
        "a parent and two children: {live_before:?}"
    );

    let fixed = guests::variant(&guests.stateful, "fixed", dir.path()).unwrap();
    let fixed_digest = PluginDigest::of(&std::fs::read(&fixed).unwrap());
    let plugin = fixed.to_str().unwrap();
    let (run, status) = replay(
        config,
        &[
            "--from", &from, "--to", &to, "--plugin", plugin, "--name", "fix",
        ],
        &env,
        Duration::from_secs(120),
    )
    .await;
    assert!(
        status.success(),
        "replay failed: {}\n{}",
        run.stderr(),
        summary(&run)
    );
    let lines = run.lines();
    let replayed = handled(&lines);
    let replayed_keys: Vec<&str> = replayed.iter().map(|(k, _)| k.as_str()).collect();
    let mut sorted = replayed_keys.clone();
    sorted.sort_unstable();
    let mut want = keys("in", 0..40);
    want.sort_unstable();
    assert_eq!(sorted, want, "every record in range once, none outside it");
    assert!(
        guest_lines(&lines, "total key=")
            .iter()
            .all(|l| field(l, "plugin") == fixed_digest.short()),
        "handled by the version given"
    );
    // Parents first: every record of the parent before any of its children.
    let parent = "shardId-000000000000";
    let last_parent = replayed.iter().rposition(|(_, s)| s == parent).unwrap();
    let first_child = replayed.iter().position(|(_, s)| s != parent).unwrap();
    assert!(last_parent < first_child, "{replayed:?}");
    assert!(summary(&run).contains("ack 40"), "{}", summary(&run));

    // The service's checkpoints and state are as they were.
    assert_eq!(live_checkpoints(dynalite, table, stream).await, live_before);
    let live = totals(config_path, "fleet", &all, &env);
    assert!(all.iter().all(|k| live.get(k) == Some(&1)), "{live:?}");
    // The replay's state is its own: the range's keys, once each.
    let own = totals(config_path, "fleet~replay~fix", &all, &env);
    assert_eq!(own.keys().cloned().collect::<Vec<_>>(), want);
    assert!(own.values().all(|t| *t == 1), "{own:?}");

    // Run again under its name: nothing is left to do.
    let (again, status) = replay(
        config,
        &["--name", "fix", "--plugin", plugin],
        &env,
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "{}", again.stderr());
    assert_eq!(handled(&again.lines()), Vec::new(), "nothing handled twice");
    assert!(
        again.stderr().contains("resuming replay fix"),
        "{}",
        again.stderr()
    );
    service.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_refuses_bad_ranges_dry_runs_and_resumes_after_kill_9() {
    let rig = Rig::start(2).await;
    let Rig {
        guests,
        kinesis,
        dynalite,
        dir: _,
        stream,
        output,
        table,
        config,
        config_path,
    } = &rig;
    let env = rig.env();
    let all = keys("k", 0..100);
    put_keys(kinesis, stream, &all).await;
    let seq = "49590338271490256608559692538361571095921575989136588898";

    // Bad input: one line, a non-zero exit, nothing written.
    for (args, said) in [
        (vec!["--from", "-1m", "--to", "-2m"], "error: --to "),
        (vec!["--from", "-48h"], "error: --from "),
        (
            vec!["--from", "-1m", "--to", "2999-01-01T00:00:00Z"],
            "error: --to 2999-01-01T00:00:00.000Z: in the future",
        ),
        (
            vec!["--from", &format!("shardId-000000000009={seq}")],
            "error: --from names shard shardId-000000000009, which stream",
        ),
        (
            vec!["--from", "yesterday"],
            "error: --from \"yesterday\": not a time",
        ),
        (
            vec!["--name", "never-started"],
            "error: no replay named never-started was started",
        ),
    ] {
        let (run, status) = replay(config, &args, &env, Duration::from_secs(60)).await;
        assert!(!status.success(), "{args:?}");
        let stderr = run.stderr();
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(said), "{args:?}: {stderr}");
        assert_eq!(
            replay_items(dynalite, table).await,
            0,
            "{args:?} wrote nothing"
        );
    }
    let mut unknown = std::process::Command::new(shardlane_bin());
    let out = unknown
        .args([
            "replay",
            "--subscription",
            "nope",
            "--from",
            "-1m",
            "--config",
        ])
        .arg(config_path)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: no subscription named \"nope\" in the config"
    );

    // A dry run through the publisher: outputs counted, nothing put or written.
    let publisher = guests.publisher.to_str().unwrap();
    let (run, status) = replay(
        config,
        &["--from", "-10m", "--dry-run", "--plugin", publisher],
        &env,
        Duration::from_secs(120),
    )
    .await;
    assert!(status.success(), "{}", run.stderr());
    let said = summary(&run);
    assert!(
        said.contains(&format!("dry run: 100 outputs for {output} (not put)")),
        "{said}"
    );
    assert!(said.contains("ack 100"), "{said}");
    assert_eq!(
        kinesis.read_all(output).await.unwrap().len(),
        0,
        "nothing published"
    );
    assert_eq!(replay_items(dynalite, table).await, 0, "nothing written");

    // A replay killed halfway, run again under its name: every record's
    // effect once, and nothing it had committed handled again.
    let args = [
        "--from",
        "-10m",
        "--name",
        "slow",
        "--reads-per-second",
        "1",
    ];
    let mut first = HostProcess::start_command(
        shardlane_bin(),
        "replay",
        config,
        &[&args[..], &["--subscription", "fleet"]].concat(),
        &env,
    )
    .unwrap();
    first
        .wait_for("a third handled", Duration::from_secs(60), |lines| {
            handled(lines).len() >= 35
        })
        .await
        .unwrap();
    first.kill9().unwrap();
    let before_kill: BTreeSet<String> = handled(&first.lines())
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(before_kill.len() < all.len(), "killed halfway");
    let committed = totals(config_path, "fleet~replay~slow", &all, &env);
    assert!(!committed.is_empty(), "some of it was checkpointed");
    let (second, status) =
        replay(config, &["--name", "slow"], &env, Duration::from_secs(120)).await;
    assert!(status.success(), "{}", second.stderr());
    let again: BTreeSet<String> = handled(&second.lines())
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let twice: Vec<&String> = again
        .iter()
        .filter(|k| committed.contains_key(*k))
        .collect();
    assert!(
        twice.is_empty(),
        "committed before the kill, handled again: {twice:?}"
    );
    let done: BTreeSet<String> = before_kill.union(&again).cloned().collect();
    assert_eq!(done.len(), all.len(), "every record handled");
    let finally = totals(config_path, "fleet~replay~slow", &all, &env);
    assert_eq!(finally.len(), all.len());
    assert!(
        finally.values().all(|t| *t == 1),
        "every effect once: {finally:?}"
    );
}

/// The guests built, and kinesis-local and dynalite started.
async fn emulators() -> (guests::Guests, Kinesis, Dynalite) {
    (
        guests::build().unwrap(),
        Kinesis::start().await.unwrap(),
        Dynalite::start().await.unwrap(),
    )
}

/// A stream and its dead-letter stream of `shards` each, and a lease
/// table's name.
async fn streams(kinesis: &Kinesis, name: &str, shards: i32) -> (String, String, String) {
    let (stream, dlq) = (unique_name(name), unique_name(&format!("{name}-dlq")));
    kinesis.create_stream(&stream, shards).await.unwrap();
    kinesis.create_stream(&dlq, shards).await.unwrap();
    (stream, dlq, unique_name("leases"))
}

/// The data the retry guest handled (`handled data=<d> attempt=<n>`), in
/// order.
fn retried(lines: &[LogLine]) -> Vec<String> {
    guest_lines(lines, "handled data=")
        .iter()
        .map(|l| {
            let m = field(l, "message");
            m["handled data=".len()..]
                .split(' ')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The dead letters of `key` on `dlq`, as parsed envelopes, in order.
async fn dead_letters_of(kinesis: &Kinesis, dlq: &str, key: &str) -> Vec<serde_json::Value> {
    kinesis
        .read_all(dlq)
        .await
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, data)| serde_json::from_slice(&data).unwrap())
        .collect()
}

/// The original data of envelopes, decoded.
fn data_of(envelopes: &[serde_json::Value]) -> Vec<String> {
    envelopes
        .iter()
        .map(|e| {
            let b = aws_smithy_types::base64::decode(e["data_base64"].as_str().unwrap()).unwrap();
            String::from_utf8(b).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_key_is_parked_while_the_other_keys_flow_and_stays_parked_across_a_restart() {
    let (guests, kinesis, dynalite) = emulators().await;
    let (stream, dlq, table) = streams(&kinesis, "poison", 1).await;
    let env = env(&kinesis, &dynalite);
    // One lane for all 50 keys; the poison record asks to retry until
    // attempt 100, far past max_attempts.
    let config = quarantined(&guests, &table, &stream, &dlq, 3);
    let mut records = Vec::new();
    for round in 0..4 {
        for key in 0..50 {
            let data = if key == 0 && round == 0 {
                "hold:100".to_owned()
            } else {
                format!("key-{key}#{round}")
            };
            records.push((format!("key-{key}"), data.into_bytes()));
        }
    }
    kinesis.put_records(&stream, &records).await.unwrap();
    let others: Vec<String> = (1..50)
        .flat_map(|k| (0..4).map(move |r| format!("key-{k}#{r}")))
        .collect();
    let mut service = HostProcess::start_with(shardlane_bin(), &config, &env).unwrap();
    service
        .wait_for(
            "the other 49 keys handled",
            Duration::from_secs(60),
            |lines| {
                let seen: BTreeSet<String> = retried(lines).into_iter().collect();
                others.iter().all(|d| seen.contains(d))
            },
        )
        .await
        .unwrap();
    let handled = retried(&service.lines());
    assert_eq!(
        handled.iter().filter(|d| *d == "hold:100").count(),
        3,
        "tried max_attempts times"
    );
    assert!(
        !handled.iter().any(|d| d.starts_with("key-0#")),
        "no later record of the parked key ran: {handled:?}"
    );
    let parked = dead_letters_of(&kinesis, &dlq, "key-0").await;
    assert_eq!(
        data_of(&parked),
        vec!["hold:100", "key-0#1", "key-0#2", "key-0#3"],
        "every record of the key dead-lettered, in order"
    );
    assert!(parked.iter().all(|e| e["reason"] == "quarantined"));
    assert!(
        parked[0]["cause"]
            .as_str()
            .unwrap()
            .contains("held until attempt 100"),
        "{}",
        parked[0]
    );
    let listed = quarantine_list(&config, &env);
    let row = listed
        .lines()
        .find(|l| l.starts_with("key-0 "))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(row.split_whitespace().nth(2) == Some("4"), "{row}");
    let admin = crate::common::admin_addr(&service);
    let (_, status) = crate::common::http(&admin, "GET", "/status.json", None, b"");
    assert!(
        status.contains("1 key parked (quarantine): key-0"),
        "{status}"
    );

    // A restart keeps it parked: the key's new records go after the others.
    service.terminate().await.unwrap();
    kinesis
        .put_records(
            &stream,
            &[
                ("key-0".to_owned(), b"key-0#4".to_vec()),
                ("key-7".to_owned(), b"key-7#4".to_vec()),
            ],
        )
        .await
        .unwrap();
    let mut again = HostProcess::start_with(shardlane_bin(), &config, &env).unwrap();
    again
        .wait_for("key-7's new record", Duration::from_secs(60), |lines| {
            retried(lines).iter().any(|d| d == "key-7#4")
        })
        .await
        .unwrap();
    assert!(
        !retried(&again.lines())
            .iter()
            .any(|d| d.starts_with("key-0#") || d == "hold:100")
    );
    let parked = dead_letters_of(&kinesis, &dlq, "key-0").await;
    assert_eq!(data_of(&parked).last().map(String::as_str), Some("key-0#4"));

    // A redrive of the key through a fixed version brings its records back
    // in order and releases it; the service then handles its next record.
    let redrive = redrive_key(&guests, &config, "key-0", &env).await;
    assert_eq!(
        echoed(&redrive.lines()),
        vec![
            ("key-0".to_owned(), "\"hold:100\"".to_owned()),
            ("key-0".to_owned(), "\"key-0#1\"".to_owned()),
            ("key-0".to_owned(), "\"key-0#2\"".to_owned()),
            ("key-0".to_owned(), "\"key-0#3\"".to_owned()),
            ("key-0".to_owned(), "\"key-0#4\"".to_owned()),
        ],
        "the parked records, in order, through the fixed version"
    );
    assert!(
        summary(&redrive).contains("key key-0 released"),
        "{}",
        summary(&redrive)
    );
    let out = quarantine_list(&config, &env);
    assert!(out.contains("no key of \"fleet\" is parked"), "{out}");
    kinesis
        .put_records(&stream, &[("key-0".to_owned(), b"key-0#5".to_vec())])
        .await
        .unwrap();
    again
        .wait_for("key-0 handled again", Duration::from_secs(30), |lines| {
            retried(lines).iter().any(|d| d == "key-0#5")
        })
        .await
        .unwrap();
    let echo = guests.echo.to_str().unwrap();
    let again_args = [
        "--subscription",
        "fleet",
        "--key",
        "key-0",
        "--plugin",
        echo,
    ];
    let (twice, status) = run_cli("redrive", &config, &again_args, &env).await;
    assert!(!status.success());
    assert!(
        twice
            .stderr()
            .starts_with("error: key \"key-0\" is not parked"),
        "{}",
        twice.stderr()
    );
    again.terminate().await.unwrap();
}

/// A fleet member's config reading `stream` through the retry guest,
/// quarantining to `dlq` after `max_attempts` (quick retries).
fn quarantined(
    guests: &guests::Guests,
    table: &str,
    stream: &str,
    dlq: &str,
    max_attempts: u32,
) -> String {
    dynamodb_config(
        "live",
        table,
        stream,
        &guests.retry,
        QUICK_LEASES,
        &format!(
            "max_attempts = {max_attempts}\nretry_backoff = {{ initial = \"20ms\", max = \"50ms\" }}\non_failure = \"quarantine\"\ndead_letter_stream = \"{dlq}\""
        ),
    )
}

/// Records parked in `lines` (the host's log line for each).
fn parks(lines: &[LogLine]) -> usize {
    lines
        .iter()
        .filter(|l| field(l, "message") == "record parked: its key is quarantined")
        .count()
}

/// `shardlane redrive --key key` through the echo example, which must
/// succeed; its process.
async fn redrive_key(
    guests: &guests::Guests,
    config: &str,
    key: &str,
    env: &[(&str, &str)],
) -> HostProcess {
    let echo = guests.echo.to_str().unwrap();
    let args = ["--subscription", "fleet", "--key", key, "--plugin", echo];
    let (redrive, status) = run_cli("redrive", config, &args, env).await;
    assert!(
        status.success(),
        "{}\n{}",
        redrive.stderr(),
        summary(&redrive)
    );
    redrive
}

/// `shardlane quarantine list` of subscription `fleet`: its stdout.
fn quarantine_list(config: &str, env: &[(&str, &str)]) -> String {
    let file = service_config(config);
    let out = std::process::Command::new(shardlane_bin())
        .args(["quarantine", "list", "--subscription", "fleet", "--config"])
        .arg(file.path())
        .envs(env.iter().copied())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `shardlane <command> <args>` (a bounded command with JSON logs) to
/// its end.
async fn run_cli(
    command: &str,
    config: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (HostProcess, std::process::ExitStatus) {
    let mut process =
        HostProcess::start_command(shardlane_bin(), command, config, args, env).unwrap();
    let status = process.wait_exit(Duration::from_secs(120)).await.unwrap();
    (process, status)
}

/// What the echo example logged: `(key, data)` of each record, in order.
fn echoed(lines: &[LogLine]) -> Vec<(String, String)> {
    guest_lines(lines, "echo key=")
        .iter()
        .map(|l| {
            let m = field(l, "message");
            let key = m["echo key=".len()..].split(' ').next().unwrap().to_owned();
            let data = m.split_once(" data=").unwrap().1.to_owned();
            (key, data)
        })
        .collect()
}

/// A config written to a file, for the CLI.
fn service_config(config: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), config).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_come_back_through_a_fixed_version_in_key_order_once() {
    let (guests, kinesis, dynalite) = emulators().await;
    let (stream, dlq, table) = streams(&kinesis, "redrive", 2).await;
    let env = env(&kinesis, &dynalite);
    // The failing version rejects whatever is not `add=<n>`: every record
    // here is dead-lettered, the big one by reference (its data left out).
    let policy = format!(
        "state = {{ max_value = \"1KiB\" }}\non_failure = \"dead_letter\"\ndead_letter_stream = \"{dlq}\""
    );
    let config = dynamodb_config(
        "live",
        &table,
        &stream,
        &guests.stateful,
        QUICK_LEASES,
        &policy,
    );

    // Bad input first: one line, a non-zero exit, nothing read or written.
    let no_dlq = dynamodb_config("live", &table, &stream, &guests.stateful, QUICK_LEASES, "");
    let missing = dynamodb_config(
        "live",
        &table,
        &stream,
        &guests.stateful,
        QUICK_LEASES,
        "on_failure = \"dead_letter\"\ndead_letter_stream = \"no-such-dlq\"",
    );
    for (cfg, args, said) in [
        (
            &no_dlq,
            vec![],
            "error: subscription \"fleet\" has no dead_letter_stream",
        ),
        (
            &missing,
            vec![],
            "error: dead_letter_stream \"no-such-dlq\" does not exist",
        ),
        (
            &config,
            vec!["--key", "nope"],
            "error: key \"nope\" is not parked",
        ),
        (
            &config,
            vec!["--since", "soon"],
            "error: --since \"soon\": not a time",
        ),
        (
            &config,
            vec!["--subscription", "nope"],
            "error: no subscription named \"nope\"",
        ),
    ] {
        let mut all = args.clone();
        if !all.contains(&"--subscription") {
            all.extend(["--subscription", "fleet"]);
        }
        let (run, status) = run_cli("redrive", cfg, &all, &env).await;
        assert!(!status.success(), "{all:?}");
        let stderr = run.stderr();
        assert_eq!(stderr.lines().count(), 1, "{all:?}: {stderr}");
        assert!(stderr.starts_with(said), "{all:?}: {stderr}");
        assert_eq!(replay_items(&dynalite, &table).await, 0);
    }

    let mut records = Vec::new();
    for round in 0..3 {
        for key in 0..5 {
            records.push((
                format!("k-{key}"),
                format!("bad-{key}-{round}").into_bytes(),
            ));
        }
    }
    let big = vec![0xff_u8; 800_000];
    kinesis.put_records(&stream, &records).await.unwrap();
    kinesis
        .put_records(&stream, &[("big".to_owned(), big.clone())])
        .await
        .unwrap();
    let mut service = HostProcess::start_with(shardlane_bin(), &config, &env).unwrap();
    service
        .wait_for(
            "every record dead-lettered",
            Duration::from_secs(60),
            |lines| {
                lines
                    .iter()
                    .filter(|l| field(l, "message") == "record dead-lettered")
                    .count()
                    == 16
            },
        )
        .await
        .unwrap();
    let dead = kinesis.read_all(&dlq).await.unwrap();
    let by_reference: Vec<serde_json::Value> = dead
        .iter()
        .map(|(_, d)| serde_json::from_slice::<serde_json::Value>(d).unwrap())
        .filter(|e| e["data_omitted"] == true)
        .collect();
    assert_eq!(by_reference.len(), 1, "the big record travels by reference");
    service.terminate().await.unwrap();

    let echo = guests.echo.to_str().unwrap();
    let (first, status) = run_cli(
        "redrive",
        &config,
        &["--subscription", "fleet", "--plugin", echo],
        &env,
    )
    .await;
    assert!(status.success(), "{}\n{}", first.stderr(), summary(&first));
    let handled = echoed(&first.lines());
    for key in 0..5 {
        let mine: Vec<&str> = handled
            .iter()
            .filter(|(k, _)| k == &format!("k-{key}"))
            .map(|(_, d)| d.as_str())
            .collect();
        let want: Vec<String> = (0..3).map(|r| format!("\"bad-{key}-{r}\"")).collect();
        assert_eq!(mine, want, "k-{key}: once each, in order");
    }
    assert!(
        handled.contains(&("big".to_owned(), "<800000 bytes of binary data>".to_owned())),
        "the big record's data read back from its stream: {handled:?}"
    );
    assert_eq!(handled.len(), 16);
    assert!(
        summary(&first).contains("dead letters: 16 redriven"),
        "{}",
        summary(&first)
    );

    // Run again: nothing is handled twice.
    let (second, status) = run_cli(
        "redrive",
        &config,
        &["--subscription", "fleet", "--plugin", echo],
        &env,
    )
    .await;
    assert!(status.success(), "{}", second.stderr());
    assert_eq!(echoed(&second.lines()), Vec::new());
    assert!(
        summary(&second).contains("dead letters: 0 redriven"),
        "{}",
        summary(&second)
    );

    // Dead letters put since are redriven by the next run, and only they.
    let mut service = HostProcess::start_with(shardlane_bin(), &config, &env).unwrap();
    kinesis
        .put_records(
            &stream,
            &[
                ("k-0".to_owned(), b"bad-0-3".to_vec()),
                ("k-0".to_owned(), b"bad-0-4".to_vec()),
            ],
        )
        .await
        .unwrap();
    service
        .wait_for("two more dead-lettered", Duration::from_secs(60), |lines| {
            lines
                .iter()
                .filter(|l| field(l, "message") == "record dead-lettered")
                .count()
                == 2
        })
        .await
        .unwrap();
    service.terminate().await.unwrap();
    let (third, status) = run_cli(
        "redrive",
        &config,
        &["--subscription", "fleet", "--plugin", echo],
        &env,
    )
    .await;
    assert!(status.success(), "{}", third.stderr());
    assert_eq!(
        echoed(&third.lines()),
        vec![
            ("k-0".to_owned(), "\"bad-0-3\"".to_owned()),
            ("k-0".to_owned(), "\"bad-0-4\"".to_owned()),
        ]
    );
}

/// Catches: a record parked twice after a crash (its put done, the
/// checkpoint past it never written) redriven twice, or its second
/// envelope moving the key's last parked record back (out of order).
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_park_and_checkpoint_redrives_each_record_once_in_order() {
    let (guests, kinesis, dynalite) = emulators().await;
    let (stream, dlq, table) = streams(&kinesis, "reparked", 1).await;
    let env = env(&kinesis, &dynalite);
    // No checkpoint within the test before the kill: every parked record
    // is read and parked again after it.
    let config = quarantined(&guests, &table, &stream, &dlq, 2)
        .replace("checkpoint_every = \"200ms\"", "checkpoint_every = \"10m\"");
    let records: Vec<(String, Vec<u8>)> = ["hold:100", "key-0#1", "key-0#2"]
        .iter()
        .map(|d| ("key-0".to_owned(), d.as_bytes().to_vec()))
        .chain([("key-1".to_owned(), b"key-1#0".to_vec())])
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let mut service = HostProcess::start_with(shardlane_bin(), &config, &env).unwrap();
    service
        .wait_for("key-0 parked", Duration::from_secs(60), |lines| {
            parks(lines) == 3
        })
        .await
        .unwrap();
    service.kill9().unwrap();

    // Restarted: the three are read again and parked again (put twice).
    let mut again = HostProcess::start_with(shardlane_bin(), &config, &env).unwrap();
    again
        .wait_for("key-0 parked again", Duration::from_secs(60), |lines| {
            parks(lines) == 3
        })
        .await
        .unwrap();
    assert!(again.terminate().await.unwrap().success());
    let parked = dead_letters_of(&kinesis, &dlq, "key-0").await;
    let ids: Vec<&str> = parked.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 6, "each put twice: {ids:?}");
    assert_eq!(ids[..3], ids[3..], "the same ids both times");
    let listed = quarantine_list(&config, &env);
    let row = listed
        .lines()
        .find(|l| l.starts_with("key-0 "))
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(
        row.split_whitespace().nth(2),
        Some("3"),
        "counted once: {row}"
    );

    let redrive = redrive_key(&guests, &config, "key-0", &env).await;
    assert_eq!(
        echoed(&redrive.lines()),
        vec![
            ("key-0".to_owned(), "\"hold:100\"".to_owned()),
            ("key-0".to_owned(), "\"key-0#1\"".to_owned()),
            ("key-0".to_owned(), "\"key-0#2\"".to_owned()),
        ],
        "once each, in order"
    );
    let said = summary(&redrive);
    assert!(said.contains("3 second envelopes of a record"), "{said}");
    assert!(said.contains("key key-0 released"), "{said}");
}

/// Catches: a dead letter whose record is read back by reference taken
/// for gone (and skipped for good) because the read-back was throttled.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_read_back_is_retried_and_nothing_is_skipped() {
    let (guests, kinesis, dynalite) = emulators().await;
    let (stream, dlq, table) = streams(&kinesis, "readback", 1).await;
    let env = env(&kinesis, &dynalite);
    let policy = format!(
        "state = {{ max_value = \"1KiB\" }}\non_failure = \"dead_letter\"\ndead_letter_stream = \"{dlq}\""
    );
    let config = dynamodb_config(
        "live",
        &table,
        &stream,
        &guests.stateful,
        QUICK_LEASES,
        &policy,
    );
    // The stateful guest rejects data that is not `add=<n>`: dead-lettered
    // by reference (too large to travel whole).
    kinesis
        .put_records(&stream, &[("big".to_owned(), vec![0xff_u8; 800_000])])
        .await
        .unwrap();
    let mut service = HostProcess::start_with(shardlane_bin(), &config, &env).unwrap();
    service
        .wait_for("dead-lettered", Duration::from_secs(60), |lines| {
            lines
                .iter()
                .any(|l| field(l, "message") == "record dead-lettered")
        })
        .await
        .unwrap();
    service.terminate().await.unwrap();

    // The redrive reaches Kinesis through the proxy, which throttles every
    // read of the source stream (the read-back), not the dead-letter
    // stream's, for a few seconds.
    let proxy = shardlane_testkit::proxy::FaultProxy::start(kinesis.endpoint())
        .await
        .unwrap();
    proxy.set(shardlane_testkit::proxy::Faults {
        inject: Some(shardlane_testkit::proxy::Injection::throttle_where(
            "GetShardIterator",
            &format!("\"{stream}\""),
        )),
        ..Default::default()
    });
    let endpoint = proxy.endpoint();
    let env: Vec<(&str, &str)> = vec![
        ("AWS_ENDPOINT_URL_KINESIS", &endpoint),
        ("AWS_ENDPOINT_URL_DYNAMODB", dynalite.endpoint()),
    ];
    let echo = guests.echo.to_str().unwrap();
    let args = ["--subscription", "fleet", "--plugin", echo];
    let mut redrive =
        HostProcess::start_command(shardlane_bin(), "redrive", &config, &args, &env).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // More than the 12 an earlier version took before it called the record
    // gone (4 tries of 3 attempts).
    while proxy.injected() < 16 {
        assert!(std::time::Instant::now() < deadline, "never throttled");
        // Waiting for the read-back to be throttled that often.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.clear();
    let status = redrive.wait_exit(Duration::from_secs(120)).await.unwrap();
    assert!(
        status.success(),
        "{}\n{}",
        redrive.stderr(),
        summary(&redrive)
    );
    let said = summary(&redrive);
    assert!(said.contains("dead letters: 1 redriven"), "{said}");
    assert!(said.contains("0 whose record is gone"), "{said}");
    assert_eq!(
        echoed(&redrive.lines()),
        vec![("big".to_owned(), "<800000 bytes of binary data>".to_owned())]
    );
}
