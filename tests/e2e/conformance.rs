//! The conformance suite: the same three examples (`echo`, `batch-sum`,
//! `poison`), written in every guest language, run through the real host
//! against the emulator, with the same observable results: the records
//! handled, the exact log lines, the outcomes (retries with attempt 1..3,
//! rejects to the dead-letter stream, acks), and per-key order with
//! `workers = 4, by_key = true`.
//!
//! The contract 0.2.0 examples run the same way: `enrich` (outputs, config,
//! HTTP) and `running-total` (per-key state), with the same outputs and
//! totals in every language.
//!
//! One host per language runs all three examples as three subscriptions.
//! Each language's examples are built by its own `build.sh`; a language
//! whose toolchain is missing fails its test (`.ci/run` installs them all).

use std::collections::{BTreeMap, HashMap};

use shardlane_testkit::http_server::HttpServer;
use shardlane_testkit::{HostProcess, Kinesis, Language, LogLine, build_examples, unique_name};

use crate::common::{config, field, seq_key, shardlane_bin, subscription};

/// Guest lines of one subscription, in log order.
fn guest<'a>(lines: &'a [LogLine], subscription: &str) -> Vec<&'a LogLine> {
    lines
        .iter()
        .filter(|l| field(l, "target") == "guest" && field(l, "subscription") == subscription)
        .collect()
}

/// (records, valid, sum) of a `batch-sum` log line.
fn batch_sum(message: &str) -> (usize, usize, i64) {
    let parts: Vec<&str> = message.split(' ').collect();
    let value = |i: usize, name: &str| {
        parts
            .get(i)
            .and_then(|p| p.strip_prefix(name))
            .unwrap_or_else(|| panic!("not a batch-sum line: {message:?}"))
            .to_owned()
    };
    assert_eq!(parts.len(), 4, "{message:?}");
    assert_eq!(parts[0], "batch-sum", "{message:?}");
    (
        value(1, "records=").parse().unwrap(),
        value(2, "valid=").parse().unwrap(),
        value(3, "sum=").parse().unwrap(),
    )
}

fn dead_lettered(lines: &[LogLine], subscription: &str) -> usize {
    lines
        .iter()
        .filter(|l| {
            field(l, "message") == "record dead-lettered"
                && field(l, "subscription") == subscription
        })
        .count()
}

async fn conformance(lang: Language) {
    let examples = build_examples(lang).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let name = |s: &str| unique_name(&format!("{}-{s}", lang.dir()));
    let (echo_stream, sums_stream, poison_stream) = (name("echo"), name("sums"), name("poison"));
    let (sums_dlq, poison_dlq) = (name("sums-dlq"), name("poison-dlq"));
    kinesis.create_stream(&echo_stream, 2).await.unwrap();
    for stream in [&sums_stream, &poison_stream, &sums_dlq, &poison_dlq] {
        kinesis.create_stream(stream, 1).await.unwrap();
    }

    // echo: 8 keys × 6 records over 2 shards.
    let echo_records: Vec<(String, Vec<u8>)> = (0..48)
        .map(|i| {
            let key = format!("user-{}", i % 8);
            let data = format!("{key} event {}", i / 8);
            (key, data.into_bytes())
        })
        .collect();
    let echo_put = kinesis
        .put_records(&echo_stream, &echo_records)
        .await
        .unwrap();

    // batch-sum: 40 valid amounts (some negative) and 5 invalid records.
    let mut sums_records: Vec<(String, Vec<u8>)> = (1..=40)
        .map(|i: i64| {
            (
                format!("acct-{}", i % 5),
                format!("{{\"amount\": {}}}", i * 3 - 50).into_bytes(),
            )
        })
        .collect();
    let invalid = [
        "not json",
        "{\"amt\": 3}",
        "{\"amount\": 1.5}",
        "{\"amount\": \"7\"}",
        "[1, 2]",
    ];
    for (i, bad) in invalid.iter().enumerate() {
        sums_records.insert(i * 9, (format!("acct-{i}"), bad.as_bytes().to_vec()));
    }
    // Integral numbers written as floats are integers in every language.
    sums_records.push(("acct-x".into(), b"{\"amount\": 5.0}".to_vec()));
    sums_records.push(("acct-y".into(), b"{\"amount\": 1e3}".to_vec()));
    let valid_sum: i64 = (1..=40).map(|i: i64| i * 3 - 50).sum::<i64>() + 5 + 1000;
    kinesis
        .put_records(&sums_stream, &sums_records)
        .await
        .unwrap();

    // poison: acks, two retried records, one rejected.
    let poison_data = ["ok-1", "retry", "bad", "ok-2", "retry", "ok-3"];
    let poison_records: Vec<(String, Vec<u8>)> = poison_data
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("order-{i}"), d.as_bytes().to_vec()))
        .collect();
    let poison_put = kinesis
        .put_records(&poison_stream, &poison_records)
        .await
        .unwrap();
    let poison_calls = 1 + 3 + 1 + 1 + 3 + 1;

    let start = "start = \"trim_horizon\"";
    let cfg = [
        config(
            "echo",
            &echo_stream,
            &examples.echo,
            &format!("{start}\nworkers = 4\nby_key = true"),
        ),
        subscription(
            "batch-sum",
            &sums_stream,
            &examples.batch_sum,
            &format!("{start}\nbatch_size = 10\nbatch_window = \"100ms\"\non_failure = \"dead_letter\"\ndead_letter_stream = \"{sums_dlq}\""),
        ),
        subscription(
            "poison",
            &poison_stream,
            &examples.poison,
            &format!("{start}\nretry_backoff = {{ initial = \"10ms\", max = \"20ms\" }}\non_failure = \"dead_letter\"\ndead_letter_stream = \"{poison_dlq}\""),
        ),
    ]
    .concat();
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for(
        "every example to handle every record",
        std::time::Duration::from_secs(180),
        |lines| {
            let sums: usize = guest(lines, "batch-sum")
                .iter()
                .map(|l| batch_sum(field(l, "message")).0)
                .sum();
            guest(lines, "echo").len() >= echo_records.len()
                && sums >= sums_records.len()
                && guest(lines, "poison").len() >= poison_calls
                && dead_lettered(lines, "batch-sum") >= invalid.len()
                && dead_lettered(lines, "poison") >= 1
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}: {e}", lang.dir()));
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();

    // echo: one exact line per record, each key in order.
    let echo_lines = guest(&lines, "echo");
    assert_eq!(echo_lines.len(), echo_records.len(), "one line per record");
    let mut want: BTreeMap<String, String> = BTreeMap::new();
    for ((key, data), (_, seq)) in echo_records.iter().zip(&echo_put) {
        let data = String::from_utf8(data.clone()).unwrap();
        want.insert(
            seq.clone(),
            format!("echo key={key} seq={seq} data=\"{data}\""),
        );
    }
    let mut per_key: HashMap<&str, Vec<&str>> = HashMap::new();
    for line in &echo_lines {
        let seq = field(line, "sequence_number");
        assert_eq!(field(line, "level"), "INFO");
        assert_eq!(
            Some(field(line, "message")),
            want.get(seq).map(String::as_str)
        );
        per_key
            .entry(field(line, "partition_key"))
            .or_default()
            .push(seq);
    }
    assert_eq!(per_key.len(), 8);
    for (key, seqs) in per_key {
        let mut sorted = seqs.clone();
        sorted.sort_by_key(|s| seq_key(s));
        assert_eq!(seqs, sorted, "{key} handled in order");
    }

    // batch-sum: every record once, the valid sum, the invalid rejected.
    let (mut records, mut valid, mut sum) = (0, 0, 0);
    for line in guest(&lines, "batch-sum") {
        let (r, v, s) = batch_sum(field(line, "message"));
        assert!((1..=10).contains(&r), "batch of {r}");
        (records, valid, sum) = (records + r, valid + v, sum + s);
    }
    assert_eq!(
        (records, valid, sum),
        (sums_records.len(), 42, valid_sum),
        "records, valid records, sum"
    );
    let mut rejected: Vec<String> = Vec::new();
    for (_, data) in kinesis.read_all(&sums_dlq).await.unwrap() {
        let envelope: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(
            envelope["reason"], "rejected: expected {\"amount\": <integer>}",
            "{envelope}"
        );
        let original =
            aws_smithy_types::base64::decode(envelope["data_base64"].as_str().unwrap()).unwrap();
        rejected.push(String::from_utf8(original).unwrap());
    }
    rejected.sort();
    let mut want_rejected: Vec<String> = invalid.iter().map(|s| s.to_string()).collect();
    want_rejected.sort();
    assert_eq!(rejected, want_rejected, "exactly the invalid records");

    // poison: attempts 1..3 for `retry`, `bad` rejected, the rest acked.
    let poison_lines = guest(&lines, "poison");
    let mut calls: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for line in &poison_lines {
        let seq = field(line, "sequence_number");
        calls
            .entry(seq)
            .or_default()
            .push(field(line, "message").to_owned());
    }
    for ((key, data), (_, seq)) in poison_records.iter().zip(&poison_put) {
        let line = |attempt: u32, outcome: &str| {
            format!("poison key={key} seq={seq} attempt={attempt} outcome={outcome}")
        };
        let want = match std::str::from_utf8(data).unwrap() {
            "retry" => vec![line(1, "retry"), line(2, "retry"), line(3, "ack")],
            "bad" => vec![line(1, "reject")],
            _ => vec![line(1, "ack")],
        };
        assert_eq!(calls.get(seq.as_str()), Some(&want), "{key}");
    }
    let mut reasons: Vec<&str> = lines
        .iter()
        .filter(|l| {
            field(l, "message") == "handler asked to retry" && field(l, "subscription") == "poison"
        })
        .map(|l| field(l, "reason"))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "attempt 1 of 3",
            "attempt 1 of 3",
            "attempt 2 of 3",
            "attempt 2 of 3"
        ]
    );
    let dlq = kinesis.read_all(&poison_dlq).await.unwrap();
    assert_eq!(dlq.len(), 1, "only `bad` is dead-lettered");
    let envelope: serde_json::Value = serde_json::from_slice(&dlq[0].1).unwrap();
    assert_eq!(envelope["reason"], "rejected: bad record");
    assert_eq!(envelope["attempts"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn rust() {
    conformance(Language::Rust).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python() {
    conformance(Language::Python).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn javascript() {
    conformance(Language::JavaScript).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn c() {
    conformance(Language::C).await;
}

/// A Python component has many core instances: it fits the default pool
/// (the `python` test runs it), and a pool sized below it refuses it at
/// load with one line naming the plugin, the limit and the config key.
/// `enrich` (contract 0.2.0): each record's key looked up over HTTP on a
/// local server, the record and what came back published to the output
/// stream, acked; a 5xx lookup is retried, a 4xx rejected. The same output
/// stream content in every language that has it.
async fn enrich(lang: Language) {
    let examples = build_examples(lang).unwrap();
    let plugin = examples.enrich;
    let kinesis = Kinesis::start().await.unwrap();
    let server = HttpServer::start().unwrap();
    let name = |s: &str| unique_name(&format!("{}-{s}", lang.dir()));
    let (input, output) = (name("orders"), name("enriched"));
    kinesis.create_stream(&input, 1).await.unwrap();
    kinesis.create_stream(&output, 1).await.unwrap();
    // Keys `flaky*`: the lookup answers 503 first, so those are retried.
    let records: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            let key = if i % 4 == 3 {
                format!("flaky{}", i % 8)
            } else {
                format!("c{}", i % 4)
            };
            (key, format!("{{\"amount\":{i}}}").into_bytes())
        })
        .collect();
    let put = kinesis.put_records(&input, &records).await.unwrap();
    let cfg = config(
        "enrich",
        &input,
        &plugin,
        &format!(
            "start = \"trim_horizon\"\noutputs = [\"{output}\"]\nconfig = {{ lookup_url = \"{}\", output_stream = \"{output}\" }}\nhttp = {{ allow = [\"{}\"] }}",
            server.url("/customers"),
            server.authority()
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    let got = loop {
        let got = kinesis.read_all(&output).await.unwrap();
        if got.len() >= records.len() || tokio::time::Instant::now() > deadline {
            break got;
        }
        // Polling the emulator while the host enriches.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    host.terminate().await.unwrap();
    assert_eq!(got.len(), records.len(), "one output per input");
    // Outputs of different keys may interleave in any order; each key's
    // keep its inputs' order.
    let mut by_id: HashMap<String, (String, serde_json::Value)> = HashMap::new();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, out) in &got {
        let out: serde_json::Value = serde_json::from_slice(out).unwrap();
        let id = out["id"].as_str().unwrap().to_owned();
        order.entry(key.clone()).or_default().push(id.clone());
        by_id.insert(id, (key.clone(), out));
    }
    let mut want_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for ((key, data), (shard, seq)) in records.iter().zip(&put) {
        let id = format!("{shard}/{seq}");
        want_order.entry(key.clone()).or_default().push(id.clone());
        let (out_key, out) = by_id
            .get(&id)
            .unwrap_or_else(|| panic!("no output for input {id}"));
        assert_eq!(out_key, key, "the input's partition key");
        assert_eq!(out["input"], String::from_utf8_lossy(data).as_ref());
        assert_eq!(out["customer"]["id"], key.as_str());
        assert_eq!(out["customer"]["name"], format!("customer {key}"));
    }
    assert_eq!(order, want_order, "per key, outputs in input order");
    let retried = host
        .lines()
        .iter()
        .filter(|l| field(l, "message") == "handler asked to retry")
        .count();
    assert_eq!(retried, 2, "one 503 per flaky key, each retried once");
}

#[tokio::test(flavor = "multi_thread")]
async fn rust_enrich() {
    enrich(Language::Rust).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_enrich() {
    enrich(Language::Python).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn javascript_enrich() {
    enrich(Language::JavaScript).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn c_enrich() {
    enrich(Language::C).await;
}

/// `running-total` (contract 0.2.0, per-key state): each record's amount
/// added to its key's total in state, the new total logged and published;
/// the same totals, outputs and committed state in every language. Totals
/// pass 2^53 (exact in JavaScript too) and go below zero; data that is not
/// `{"amount": <integer>}` is rejected.
async fn running_total(lang: Language) {
    let examples = build_examples(lang).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let name = |s: &str| unique_name(&format!("{}-{s}", lang.dir()));
    let (input, output) = (name("amounts"), name("totals"));
    kinesis.create_stream(&input, 2).await.unwrap();
    kinesis.create_stream(&output, 1).await.unwrap();
    let amount = |i: i64| match i % 5 {
        0 => 4_000_000_000_000_000,
        1 => -7,
        _ => i * 3,
    };
    let mut records: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            (
                format!("k{}", i % 4),
                format!("{{\"amount\": {}}}", amount(i)).into_bytes(),
            )
        })
        .collect();
    records.insert(17, ("k1".into(), b"not json".to_vec()));
    records.insert(23, ("k2".into(), b"{\"amount\": 1.5}".to_vec()));
    kinesis.put_records(&input, &records).await.unwrap();
    let mut want: BTreeMap<String, Vec<i128>> = BTreeMap::new();
    let mut sums: BTreeMap<String, i128> = BTreeMap::new();
    for (key, data) in &records {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
            continue;
        };
        let Some(amount) = value["amount"].as_i64() else {
            continue;
        };
        let sum = sums.entry(key.clone()).or_default();
        *sum += i128::from(amount);
        want.entry(key.clone()).or_default().push(*sum);
    }
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("shardlane.toml");
    let cfg = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[lease]\nstore = \"file\"\npath = \"{}\"\n{}",
        dir.path().join("leases").display(),
        subscription(
            "totals",
            &input,
            &examples.running_total,
            &format!(
                "start = \"trim_horizon\"\nworkers = 2\nby_key = true\nstate = {{}}\noutputs = [\"{output}\"]\nconfig = {{ output_stream = \"{output}\" }}"
            ),
        )
    );
    std::fs::write(&config_path, &cfg).unwrap();
    let valid: usize = want.values().map(Vec::len).sum();
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    let got = loop {
        let got = kinesis.read_all(&output).await.unwrap();
        if got.len() >= valid || tokio::time::Instant::now() > deadline {
            break got;
        }
        // Polling the emulator while the host adds up.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(host.terminate().await.unwrap().success());
    // Published: per key, the running totals in input order.
    let mut published: BTreeMap<String, Vec<i128>> = BTreeMap::new();
    for (key, out) in &got {
        let out: serde_json::Value = serde_json::from_slice(out).unwrap();
        assert_eq!(out["key"], key.as_str());
        // Parsed from the text: exact past 2^53.
        let total: i128 = serde_json::to_string(&out["total"])
            .unwrap()
            .parse()
            .unwrap();
        published.entry(key.clone()).or_default().push(total);
    }
    assert_eq!(published, want, "published totals");
    // Logged: the same.
    let lines = host.lines();
    let mut logged: BTreeMap<String, Vec<i128>> = BTreeMap::new();
    for line in guest(&lines, "totals") {
        let message = field(line, "message");
        let Some(rest) = message.strip_prefix("total key=") else {
            continue;
        };
        let (key, total) = rest.split_once(" total=").unwrap();
        logged
            .entry(key.to_owned())
            .or_default()
            .push(total.parse().unwrap());
    }
    assert_eq!(logged, want, "logged totals");
    let rejected = lines
        .iter()
        .filter(|l| {
            field(l, "message") == "record skipped" || field(l, "message") == "record dead-lettered"
        })
        .count();
    assert_eq!(rejected, 2, "the two records without an integer amount");
    // Committed: the final sums, as `shardlane state get` reads them.
    let mut cmd = std::process::Command::new(shardlane_bin());
    cmd.args(["state", "get", "--subscription", "totals", "--config"])
        .arg(&config_path);
    for key in sums.keys() {
        cmd.args(["--key", key]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed: BTreeMap<String, i128> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let parts: Vec<&str> = l.split('\t').collect();
            assert_eq!(parts[1], "total", "{l}");
            (parts[0].to_owned(), parts[2].parse().unwrap())
        })
        .collect();
    assert_eq!(committed, sums, "committed totals");
}

#[tokio::test(flavor = "multi_thread")]
async fn rust_running_total() {
    running_total(Language::Rust).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_running_total() {
    running_total(Language::Python).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn javascript_running_total() {
    running_total(Language::JavaScript).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn c_running_total() {
    running_total(Language::C).await;
}

#[test]
fn a_plugin_larger_than_the_pool_is_refused_naming_the_limit() {
    let examples = build_examples(Language::Python).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shardlane.toml");
    let cfg = |max: u32| {
        format!(
            "[engine]\ncache_dir = \"off\"\nmax_core_instances = {max}\n\n[[subscription]]\nname = \"py\"\nstream = \"s\"\nplugin = \"{}\"\n",
            examples.echo.display()
        )
    };
    std::fs::write(&config, cfg(4)).unwrap();
    let out = std::process::Command::new(shardlane_bin())
        .args(["validate", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "not one line: {stderr:?}");
    for part in [
        &examples.echo.display().to_string(),
        "does not fit the instance pool",
        "core module instances",
        "configured maximum of 4",
        "engine.max_core_instances",
    ] {
        assert!(line.contains(part), "{part:?} missing: {line}");
    }
}

/// `windowed-totals` through the host against the emulator: records put
/// in two bursts a second and a half apart, windows of a second by key;
/// every close publishes its window's sum once and logs it, the sums of a
/// key's windows add up to its amounts (exact past 2^53), the record that
/// is not JSON is rejected, and no `sum` is left in the committed state.
async fn windowed_totals(lang: Language) {
    let examples = build_examples(lang).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let name = |s: &str| unique_name(&format!("{}-{s}", lang.dir()));
    let (input, output) = (name("amounts"), name("sums"));
    kinesis.create_stream(&input, 2).await.unwrap();
    kinesis.create_stream(&output, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("shardlane.toml");
    let cfg = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[lease]\nstore = \"file\"\npath = \"{}\"\n{}",
        dir.path().join("leases").display(),
        subscription(
            "windows",
            &input,
            &examples.windowed_totals,
            &format!(
                "start = \"trim_horizon\"\nworkers = 2\nby_key = true\nstate = {{}}\noutputs = [\"{output}\"]\nconfig = {{ output_stream = \"{output}\" }}\nwindow = {{ size = \"1s\", by = \"key\", grace = \"200ms\" }}"
            ),
        )
    );
    std::fs::write(&config_path, &cfg).unwrap();
    let burst = |base: i64| -> Vec<(String, Vec<u8>)> {
        (0..12)
            .map(|i| {
                let amount = if i == 0 {
                    4_000_000_000_000_000
                } else {
                    base + i
                };
                (
                    format!("k{}", i % 4),
                    format!("{{\"amount\": {amount}}}").into_bytes(),
                )
            })
            .collect()
    };
    let mut first = burst(-5);
    first.insert(5, ("k1".into(), b"not json".to_vec()));
    let second = burst(100);
    let mut want: BTreeMap<String, i128> = BTreeMap::new();
    for (key, data) in first.iter().chain(&second) {
        if let Some(amount) = serde_json::from_slice::<serde_json::Value>(data)
            .ok()
            .and_then(|v| v["amount"].as_i64())
        {
            *want.entry(key.clone()).or_default() += i128::from(amount);
        }
    }
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    kinesis.put_records(&input, &first).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    kinesis.put_records(&input, &second).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    let sums_of = |got: &[(String, Vec<u8>)]| {
        let mut windows: BTreeMap<(String, u64), i128> = BTreeMap::new();
        for (key, out) in got {
            let out: serde_json::Value = serde_json::from_slice(out).unwrap();
            assert_eq!(out["key"], key.as_str());
            let start = out["start"].as_u64().unwrap();
            assert_eq!(out["end"].as_u64().unwrap(), start + 1000);
            // Parsed from the text: exact past 2^53.
            let sum: i128 = serde_json::to_string(&out["sum"]).unwrap().parse().unwrap();
            let before = windows.insert((key.clone(), start), sum);
            assert!(
                before.is_none_or(|b| b == sum),
                "a window published twice, differently"
            );
        }
        windows
    };
    let per_key = |windows: &BTreeMap<(String, u64), i128>| {
        let mut totals: BTreeMap<String, i128> = BTreeMap::new();
        for ((key, _), sum) in windows {
            *totals.entry(key.clone()).or_default() += sum;
        }
        totals
    };
    let published = loop {
        let published = sums_of(&kinesis.read_all(&output).await.unwrap());
        if per_key(&published) == want || tokio::time::Instant::now() > deadline {
            break published;
        }
        // Polling the emulator while the windows close.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(host.terminate().await.unwrap().success());
    assert_eq!(
        per_key(&published),
        want,
        "every key's windows add up to its amounts"
    );
    assert!(
        published.len() >= 8,
        "two windows per key at least: {published:?}"
    );
    // Logged: the same windows and sums.
    let lines = host.lines();
    let mut logged: BTreeMap<(String, u64), i128> = BTreeMap::new();
    for line in guest(&lines, "windows") {
        let message = field(line, "message");
        let Some(rest) = message.strip_prefix("window key=") else {
            continue;
        };
        let parts: Vec<&str> = rest.split(' ').collect();
        let value = |prefix: &str| parts.iter().find_map(|p| p.strip_prefix(prefix)).unwrap();
        logged.insert(
            (parts[0].to_owned(), value("start=").parse().unwrap()),
            value("sum=").parse().unwrap(),
        );
    }
    assert_eq!(logged, published, "logged sums");
    let rejected = lines
        .iter()
        .filter(|l| field(l, "message") == "record skipped")
        .count();
    assert_eq!(rejected, 1, "the record that is not JSON");
    let mut cmd = std::process::Command::new(shardlane_bin());
    cmd.args(["state", "get", "--subscription", "windows", "--config"])
        .arg(&config_path);
    for key in want.keys() {
        cmd.args(["--key", key]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: String = want.keys().map(|k| format!("{k}\t(no state)\n")).collect();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        expected,
        "every window's sum deleted at its close"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rust_windowed_totals() {
    windowed_totals(Language::Rust).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_windowed_totals() {
    windowed_totals(Language::Python).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn javascript_windowed_totals() {
    windowed_totals(Language::JavaScript).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn c_windowed_totals() {
    windowed_totals(Language::C).await;
}
