//! Event filters through the whole host: records matching no pattern never
//! reach the guest, are counted, and the checkpoint passes them — even
//! when a shard's last records are all filtered out; a filter deployed and
//! rolled back as part of the fleet's version.

use std::collections::HashSet;
use std::time::Duration;

use shardlane_testkit::admin::metric_sum;
use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::leases::{env, fleet_config};
use crate::versions::{Rig, cli};

use crate::common::{
    admin_addr, config, echoed_data, field, guest_lines, http, shardlane_bin, wait_checkpoint,
};

#[tokio::test(flavor = "multi_thread")]
async fn records_matching_no_pattern_settle_without_a_call_and_are_counted() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("filtered");
    kinesis.create_stream(&stream, 1).await.unwrap();
    // 1 in 10 is an order over 100; key "vip-3" always passes; the last 40
    // records are views, filtered out, so only the filter moves the
    // checkpoint to the end. Some data is not JSON at all.
    let records: Vec<(String, Vec<u8>)> = (0..240)
        .map(|i| {
            let key = if i == 57 {
                "vip-3".to_owned()
            } else {
                format!("k-{}", i % 7)
            };
            let data = match i {
                i if i % 10 == 0 && i < 200 => {
                    format!(r#"{{"kind": "order", "amount": {}, "i": {i}}}"#, 150 + i)
                }
                i if i % 10 == 5 && i < 200 => {
                    format!(r#"{{"kind": "order", "amount": 99, "i": {i}}}"#)
                }
                i if i % 13 == 0 => format!("plain text {i}"),
                i => format!(r#"{{"kind": "view", "i": {i}}}"#),
            };
            (key, data.into_bytes())
        })
        .collect();
    let wanted: Vec<String> = records
        .iter()
        .filter(|(key, data)| {
            let text = String::from_utf8_lossy(data);
            key == "vip-3" || (text.contains("\"order\"") && !text.contains("\"amount\": 99,"))
        })
        .map(|(_, data)| String::from_utf8_lossy(data).into_owned())
        .collect();
    assert_eq!(wanted.len(), 21, "20 big orders and the vip record");
    let put = kinesis.put_records(&stream, &records).await.unwrap();
    let last = put.last().unwrap().1.clone();

    let cfg = config(
        "filtered",
        &stream,
        &guests.echo,
        "start = \"trim_horizon\"\nfilter = [\n  \
         '{\"data\": {\"kind\": [\"order\"], \"amount\": [{\"numeric\": [\">\", 100]}]}}',\n  \
         '{\"partitionKey\": [{\"prefix\": \"vip-\"}]}',\n]",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    wait_checkpoint(
        &mut host,
        "the checkpoint at the last record",
        &last,
        Duration::from_secs(60),
    )
    .await;
    let admin = admin_addr(&host);
    let (_, metrics) = http(&admin, "GET", "/metrics", None, b"");
    let filtered = metric_sum(&metrics, "shardlane_records_filtered_total", &[]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(host.terminate().await.unwrap().success());

    let lines = host.lines();
    let echoed: Vec<String> = guest_lines(&lines, "echo ")
        .iter()
        .map(|l| echoed_data(l))
        .collect();
    assert_eq!(
        echoed, wanted,
        "exactly the records a pattern lets in, in order"
    );
    assert_eq!(filtered, 219.0, "every other record counted as filtered");
    let handled = metric_sum(&metrics, "shardlane_records_total", &[]);
    assert_eq!(handled, 21.0, "filtered records are not handled: {handled}");
    assert!(
        !lines.iter().any(|l| field(l, "message").contains("dead")),
        "nothing dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_pattern_stops_start_up_with_one_line_naming_it() {
    let guests = guests::build().unwrap();
    let cfg = config(
        "filtered",
        "any",
        &guests.echo,
        "filter = ['{\"data\": {\"kind\": [\"order\"]}}', '{\"data\": {\"amount\": [{\"numeric\": [\">\", \"100\"]}]}}']",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(&path, cfg).unwrap();
    let out = std::process::Command::new(shardlane_bin())
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "subscription[0].filter`: pattern 2: data.amount: numeric \"100\": not a number"
        ),
        "{stderr}"
    );
}

/// Puts one phase's records: ten whose key starts `keep-` and ten `drop-`;
/// returns the data of each kind.
async fn put_phase(kinesis: &Kinesis, stream: &str, phase: u32) -> (Vec<String>, Vec<String>) {
    let mut records = Vec::new();
    let (mut keep, mut drop) = (Vec::new(), Vec::new());
    for i in 0..20 {
        let kind = if i % 2 == 0 { "keep" } else { "drop" };
        let data = format!("{kind}-{}#p{phase}-{i}", i % 5);
        records.push((format!("{kind}-{}", i % 5), data.clone().into_bytes()));
        if kind == "keep" {
            keep.push(data)
        } else {
            drop.push(data)
        }
    }
    kinesis.put_records(stream, &records).await.unwrap();
    (keep, drop)
}

/// Every record's data the echo guest logged.
fn echoes(lines: &[shardlane_testkit::LogLine]) -> HashSet<String> {
    guest_lines(lines, "echo ")
        .iter()
        .map(|l| echoed_data(l))
        .collect()
}

/// Waits until `a` and `b` between them echoed every one of `wanted`.
async fn all_echoed(a: &mut HostProcess, b: &HostProcess, wanted: &[String]) {
    a.wait_for("every record echoed", Duration::from_secs(60), |lines| {
        let mut seen = echoes(lines);
        seen.extend(echoes(&b.lines()));
        wanted.iter().all(|d| seen.contains(d))
    })
    .await
    .unwrap();
}

/// Waits until `host` logs that the fleet's filter `filter` (a digest, or
/// `none`) is in force.
async fn in_force(host: &mut HostProcess, filter: &str) {
    host.wait_for(
        &format!("filter {filter} in force"),
        Duration::from_secs(30),
        |lines| {
            lines.iter().any(|l| {
                field(l, "message") == "the fleet's filter is in force here"
                    && field(l, "filter") == filter
            })
        },
    )
    .await
    .unwrap();
}

/// Catches: a filter that is not part of the fleet's version (an instance
/// that keeps its config's, a deploy not in the history, a rollback that
/// leaves the filter), a bad filter recorded, or a filtered record that
/// reaches the guest after the deploy.
#[tokio::test(flavor = "multi_thread")]
async fn a_filter_is_deployed_and_rolled_back_fleet_wide() {
    let Rig {
        guests,
        kinesis,
        dynalite,
        dir,
        stream,
        table,
    } = Rig::start("filter-deploy", 2).await;
    let env = env(&kinesis, &dynalite);
    let config = |owner: &str| fleet_config(owner, &table, &stream, &guests.echo, "");
    let start =
        |owner: &str| HostProcess::start_with(shardlane_bin(), &config(owner), &env).unwrap();
    let (mut a, mut b) = (start("a"), start("b"));
    let operator = dir.path().join("operator.toml");
    std::fs::write(&operator, config("operator")).unwrap();
    let operator = operator.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = cli(args, &env);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        (out.status.success(), stdout, stderr)
    };

    // No filter yet: every record reaches the guest.
    let (keep, drop) = put_phase(&kinesis, &stream, 1).await;
    all_echoed(&mut a, &b, &[keep, drop].concat()).await;

    // `deploy --filter` with a file `name` holding Lambda's FilterCriteria
    // (as `aws lambda` takes it) with one pattern.
    let deploy_filter = |name: &str, pattern: &str| {
        let file = dir.path().join(name);
        let criteria = serde_json::json!({ "Filters": [{ "Pattern": pattern }] });
        std::fs::write(&file, criteria.to_string()).unwrap();
        run(&[
            "deploy",
            "-c",
            operator,
            "-s",
            "fleet",
            "--filter",
            file.to_str().unwrap(),
        ])
    };

    // A bad filter: one line, nothing recorded.
    let (ok, _, stderr) =
        deploy_filter("bad.json", r#"{"partitionKey": [{"numeric": [">", "x"]}]}"#);
    assert!(!ok && stderr.trim().lines().count() == 1, "{stderr}");
    assert!(
        stderr.contains("pattern 1") && stderr.contains("bad.json"),
        "{stderr}"
    );

    // The filter deployed.
    let (ok, stdout, stderr) =
        deploy_filter("filter.json", r#"{"partitionKey": [{"prefix": "keep-"}]}"#);
    assert!(ok, "{stderr}");
    let digest = stdout
        .lines()
        .find_map(|l| l.strip_prefix("filter:  sha256:"))
        .map(|hex| format!("sha256:{hex}"))
        .unwrap_or_else(|| panic!("the deploy prints the filter: {stdout}"));
    in_force(&mut a, &digest).await;
    in_force(&mut b, &digest).await;
    let (keep, drop) = put_phase(&kinesis, &stream, 2).await;
    all_echoed(&mut a, &b, &keep).await;
    let short = format!("filter=\"{}\"", &digest[..19]);
    let version = format!(
        "version=\"{}\"",
        shardlane::PluginDigest::of(&std::fs::read(&guests.echo).unwrap()).short()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let filtered: f64 = [&a, &b]
            .iter()
            .map(|h| {
                let (_, page) = http(&admin_addr(h), "GET", "/metrics", None, b"");
                metric_sum(
                    &page,
                    "shardlane_records_filtered_total",
                    &[&short, &version],
                )
            })
            .sum();
        if filtered >= 10.0 {
            assert_eq!(filtered, 10.0, "each filtered record counted once");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "filtered: {filtered}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen: HashSet<String> = echoes(&a.lines())
        .union(&echoes(&b.lines()))
        .cloned()
        .collect();
    let leaked: Vec<_> = drop.iter().filter(|d| seen.contains(*d)).collect();
    assert!(
        leaked.is_empty(),
        "filtered records reached the guest: {leaked:?}"
    );

    // Rolled back: plugin and filter back to the version before, everywhere.
    let (ok, stdout, stderr) = run(&["rollback", "-c", operator, "-s", "fleet"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("filter:  none"), "{stdout}");
    in_force(&mut a, "none").await;
    in_force(&mut b, "none").await;
    let (keep, drop) = put_phase(&kinesis, &stream, 3).await;
    all_echoed(&mut a, &b, &[keep, drop].concat()).await;

    let (ok, stdout, stderr) = run(&["versions", "-c", operator, "-s", "fleet"]);
    assert!(ok, "{stderr}");
    let history: Vec<&str> = stdout.lines().filter(|l| l.starts_with("20")).collect();
    assert_eq!(history.len(), 3, "declared, deploy, rollback: {stdout}");
    assert!(
        history[1].contains("deploy") && history[1].contains(&digest[..19]),
        "{stdout}"
    );
    assert!(history[2].contains("rollback"), "{stdout}");
    for host in [&mut a, &mut b] {
        assert!(host.terminate().await.unwrap().success());
    }
}
