//! Contract 0.2.0: outputs settled with their inputs, plugin config, and
//! allow-listed outbound HTTP, against kinesis-local and a real local HTTP
//! server (`tests/guests/publisher`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use shardlane_testkit::http_server::HttpServer;
use shardlane_testkit::proxy::{FaultProxy, Faults, Injection};
use shardlane_testkit::{HostProcess, Kinesis, free_port, guests, unique_name};

use crate::common::{admin_addr, config, field, guest_lines, http, shardlane_bin};

/// What the output stream holds: data by partition key, in stream order.
async fn outputs_by_key(kinesis: &Kinesis, stream: &str) -> BTreeMap<String, Vec<String>> {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, data) in kinesis.read_all(stream).await.unwrap() {
        by_key
            .entry(key)
            .or_default()
            .push(String::from_utf8(data).unwrap());
    }
    by_key
}

/// Waits until the output stream holds at least `count` records.
async fn wait_outputs(kinesis: &Kinesis, stream: &str, count: usize, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let got = kinesis.read_all(stream).await.unwrap().len();
        if got >= count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{got} of {count} outputs after {within:?}"
        );
        // Polling the emulator; the host puts outputs as it acks.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The records an output test puts: 60 over 6 keys; every tenth+3 asks to
/// be retried once, every tenth+7 rejects.
fn inputs() -> Vec<(String, Vec<u8>)> {
    (0..60)
        .map(|i| {
            let data = match i % 10 {
                3 => format!("retry-once:r{i}"),
                7 => format!("reject:j{i}"),
                _ => format!("d{i}"),
            };
            (format!("k{}", i % 6), data.into_bytes())
        })
        .collect()
}

/// The outputs `inputs` must give, by key, in input order.
fn expected(prefix: &str) -> BTreeMap<String, Vec<String>> {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, data) in inputs() {
        let data = String::from_utf8(data).unwrap();
        let output = if let Some(x) = data.strip_prefix("retry-once:") {
            x.to_owned()
        } else if data.starts_with("reject:") {
            continue;
        } else {
            format!("{prefix}{data}")
        };
        by_key.entry(key).or_default().push(output);
    }
    by_key
}

#[tokio::test(flavor = "multi_thread")]
async fn outputs_are_published_once_per_acked_input_in_input_order_per_key() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let (input, output) = (unique_name("orders"), unique_name("enriched"));
    kinesis.create_stream(&input, 2).await.unwrap();
    kinesis.create_stream(&output, 2).await.unwrap();
    kinesis.put_records(&input, &inputs()).await.unwrap();
    let cfg = config(
        "outputs",
        &input,
        &guests.publisher,
        &format!(
            "start = \"trim_horizon\"\nworkers = 3\nby_key = true\non_failure = \"skip\"\nretry_backoff = {{ initial = \"10ms\", max = \"50ms\" }}\noutputs = [\"{output}\"]\nconfig = {{ out_stream = \"{output}\", prefix = \"p:\" }}"
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let want = expected("p:");
    let count: usize = want.values().map(Vec::len).sum();
    wait_outputs(&kinesis, &output, count, Duration::from_secs(120)).await;
    // A moment in which no output may be published twice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics = http(&admin_addr(&host), "GET", "/metrics", None, b"").1;
    let status = host.terminate().await.unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status}");

    let got = outputs_by_key(&kinesis, &output).await;
    assert_eq!(
        got, want,
        "exactly one output per acked input, none of retried attempts or rejects, each key in input order"
    );
    let handled = guest_lines(&host.lines(), "handled data=").len();
    assert_eq!(handled, 60 + 6, "every input once, retried ones twice");
    let put_line =
        format!("shardlane_outputs_total{{subscription=\"outputs\",stream=\"{output}\"}} {count}");
    assert!(metrics.contains(&put_line), "{put_line} in {metrics}");
    let final_checkpoints = host
        .lines()
        .iter()
        .filter(|l| field(l, "message") == "final checkpoint written")
        .count();
    assert_eq!(final_checkpoints, 2, "both shards settled to their end");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_input_stays_unsettled_until_its_outputs_are_put() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let proxy = FaultProxy::start(kinesis.endpoint()).await.unwrap();
    let (input, output) = (unique_name("orders"), unique_name("enriched"));
    kinesis.create_stream(&input, 1).await.unwrap();
    kinesis.create_stream(&output, 1).await.unwrap();
    // Every PutRecords fails (as a 5xx) until the faults are cleared.
    proxy.set(Faults {
        inject: Some(Injection {
            operation: "PutRecords".into(),
            error: "InternalFailure".into(),
            status: 500,
            body: None,
        }),
        ..Faults::default()
    });
    let records: Vec<(String, Vec<u8>)> = (0..10)
        .map(|i| (format!("k{}", i % 3), format!("d{i}").into_bytes()))
        .collect();
    let put = kinesis.put_records(&input, &records).await.unwrap();
    let last = put.last().unwrap().1.clone();
    let cfg = config(
        "held",
        &input,
        &guests.publisher,
        &format!(
            "start = \"trim_horizon\"\noutputs = [\"{output}\"]\nconfig = {{ out_stream = \"{output}\" }}"
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, &proxy.endpoint()).unwrap();
    host.wait_for("10 records handled", Duration::from_secs(60), |lines| {
        guest_lines(lines, "handled data=").len() >= 10
    })
    .await
    .unwrap();
    // Several checkpoint intervals (200 ms) pass while the puts fail.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let checkpoints: Vec<String> = host
        .lines()
        .iter()
        .filter(|l| field(l, "message") == "checkpoint written")
        .map(|l| field(l, "checkpoint").to_owned())
        .collect();
    assert!(
        checkpoints.is_empty(),
        "no checkpoint may pass inputs whose outputs are not put: {checkpoints:?}"
    );
    let metrics = http(&admin_addr(&host), "GET", "/metrics", None, b"").1;
    assert!(
        metrics.contains("shardlane_outputs_pending{subscription=\"held\"} 10"),
        "{metrics}"
    );
    assert!(proxy.injected() > 0, "the puts were tried");
    // The SDK retries a failed call itself before the stage sees it fail
    // and says so: wait for that line.
    host.wait_for("the outage logged", Duration::from_secs(30), |lines| {
        lines
            .iter()
            .any(|l| field(l, "message").starts_with("outputs not put yet"))
    })
    .await
    .unwrap();
    assert!(
        kinesis.read_all(&output).await.unwrap().is_empty(),
        "nothing published yet"
    );

    proxy.clear();
    wait_outputs(&kinesis, &output, 10, Duration::from_secs(60)).await;
    crate::common::wait_checkpoint(&mut host, "the last input", &last, Duration::from_secs(30))
        .await;
    host.terminate().await.unwrap();
    let got = outputs_by_key(&kinesis, &output).await;
    let total: usize = got.values().map(Vec::len).sum();
    assert_eq!(total, 10, "each output once: {got:?}");
    for (key, data) in &got {
        let mut sorted = data.clone();
        sorted.sort_by_key(|d| d.trim_start_matches("unset:d").parse::<u32>().unwrap());
        assert_eq!(data, &sorted, "key {key} in input order");
    }
    let warnings = host
        .lines()
        .iter()
        .filter(|l| field(l, "message").starts_with("outputs not put yet"))
        .count();
    assert!(
        (1..=2).contains(&warnings),
        "the outage is logged once per interval, not per record: {warnings}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_every_acked_input_has_its_outputs_at_least_once() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let (input, output) = (unique_name("orders"), unique_name("enriched"));
    kinesis.create_stream(&input, 2).await.unwrap();
    kinesis.create_stream(&output, 2).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let cfg = config(
        "crash",
        &input,
        &guests.publisher,
        &format!(
            "start = \"trim_horizon\"\noutputs = [\"{output}\"]\nconfig = {{ out_stream = \"{output}\" }}"
        ),
    )
    .replace(
        "store = \"memory\"",
        &format!("store = \"file\"\npath = \"{}\"", state.path().display()),
    );
    let records: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("k{}", i % 8), format!("d{i}").into_bytes()))
        .collect();
    kinesis.put_records(&input, &records).await.unwrap();
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("some records handled", Duration::from_secs(60), |lines| {
        guest_lines(lines, "handled data=").len() >= 50
    })
    .await
    .unwrap();
    host.kill9().unwrap();

    let mut again = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    wait_outputs(&kinesis, &output, 200, Duration::from_secs(120)).await;
    again.terminate().await.unwrap();
    let got = outputs_by_key(&kinesis, &output).await;
    for (key, data) in records {
        let want = format!("unset:{}", String::from_utf8(data).unwrap());
        assert!(
            got.get(&key).is_some_and(|d| d.contains(&want)),
            "{want} of {key} was published"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn http_reaches_allowed_hosts_only_within_its_bounds_and_config_reaches_the_guest() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let server = HttpServer::start().unwrap();
    let (input, output) = (unique_name("orders"), unique_name("fetched"));
    kinesis.create_stream(&input, 1).await.unwrap();
    kinesis.create_stream(&output, 1).await.unwrap();
    let denied = format!("http://127.0.0.1:{}/ok", free_port());
    let cases: Vec<(&str, String)> = vec![
        ("slow", format!("get:{}", server.url("/slow"))),
        ("plain", "plain".to_owned()),
        ("ok", format!("get:{}", server.url("/ok"))),
        ("big", format!("get:{}", server.url("/big"))),
        ("denied", format!("get:{denied}")),
    ];
    let records: Vec<(String, Vec<u8>)> = cases
        .iter()
        .map(|(key, data)| ((*key).to_owned(), data.clone().into_bytes()))
        .collect();
    kinesis.put_records(&input, &records).await.unwrap();
    let cfg = config(
        "fetch",
        &input,
        &guests.publisher,
        &format!(
            "start = \"trim_horizon\"\nworkers = 2\nhandler_timeout = \"10s\"\noutputs = [\"{output}\"]\nconfig = {{ out_stream = \"{output}\" }}\nhttp = {{ allow = [\"{}\"], timeout = \"1s\", max_response = \"1MiB\" }}",
            server.authority()
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    wait_outputs(&kinesis, &output, cases.len(), Duration::from_secs(60)).await;
    let metrics = http(&admin_addr(&host), "GET", "/metrics", None, b"").1;
    host.terminate().await.unwrap();

    let got: HashMap<String, String> = outputs_by_key(&kinesis, &output)
        .await
        .into_iter()
        .map(|(k, mut v)| (k, v.remove(0)))
        .collect();
    assert_eq!(got["ok"], "status=200 bytes=5");
    assert_eq!(got["plain"], "unset:plain", "an unset config key is none");
    assert!(got["denied"].contains("Denied"), "{}", got["denied"]);
    assert!(
        got["slow"].starts_with("error=") && got["slow"].contains("Timeout"),
        "{}",
        got["slow"]
    );
    assert!(
        got["big"].contains("error=HTTP response body size exceeds limit: 1048576 bytes"),
        "{}",
        got["big"]
    );
    // The plain record, on the other lane, did not wait for the slow one.
    let lines = host.lines();
    let position = |needle: &str| {
        lines
            .iter()
            .position(|l| field(l, "message").starts_with(needle))
            .unwrap_or_else(|| panic!("no line {needle}"))
    };
    assert!(
        position("handled data=plain") < position(&format!("fetched {}", server.url("/slow"))),
        "another lane keeps flowing while a request waits"
    );
    for (outcome, at_least) in [("ok", 2), ("denied", 1), ("failed", 1)] {
        let line = format!(
            "shardlane_http_requests_total{{subscription=\"fetch\",outcome=\"{outcome}\"}}"
        );
        let count: u64 = metrics
            .lines()
            .find(|l| l.starts_with(&line))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line} in {metrics}"));
        assert!(count >= at_least, "{line} = {count}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_stream_that_does_not_exist_stops_start_up_naming_it() {
    let kinesis = Kinesis::start().await.unwrap();
    let input = unique_name("orders");
    kinesis.create_stream(&input, 1).await.unwrap();
    let (ok, stderr) =
        crate::config::start_against(kinesis.endpoint(), &input, "outputs = [\"no-such-output\"]")
            .await;
    assert!(!ok);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.contains("subscription[0] (a): outputs \"no-such-output\" does not exist"),
        "{stderr}"
    );
}
