//! A guest can fail in every way and the host stays up: traps, endless
//! loops, unbounded allocation, log floods, wrong answers, rejects; and
//! each failed record's fate follows the failure policy (redelivered,
//! dead-lettered with its envelope, skipped, or blocking its shard).

use std::time::Duration;

use shardlane::PartitionKey;
use shardlane::lane_for;
use shardlane_testkit::{HostProcess, Kinesis, LogLine, guests, unique_name};

use crate::common::{config, field, guest_lines, shardlane_bin, wait_checkpoint};

fn calls<'a>(lines: &'a [LogLine], data: &str) -> Vec<&'a LogLine> {
    guest_lines(lines, &format!("handled data={data} attempt="))
}

fn messages<'a>(lines: &'a [LogLine], message: &str) -> Vec<&'a LogLine> {
    lines
        .iter()
        .filter(|l| field(l, "message") == message)
        .collect()
}

/// Two keys on different lanes of `workers = 2, by_key`: the misbehaving
/// record's key and a healthy key whose records must keep flowing.
fn two_lane_keys() -> (String, String) {
    let on = |lane| {
        (0..)
            .map(|i| format!("key-{i}"))
            .find(|k| lane_for(&PartitionKey::new(k.as_str()), 2) == lane)
            .unwrap()
    };
    (on(0), on(1))
}

/// Puts `bad` on one lane and 20 healthy records on the other, runs the
/// chaos guest with `policy`, and waits until the healthy records are
/// through and `done` holds.
async fn misbehave(
    bad: &str,
    policy: &str,
    done: impl Fn(&[LogLine]) -> bool,
) -> (Kinesis, String, HostProcess) {
    misbehave_with(bad, policy, &[], done).await
}

async fn misbehave_with(
    bad: &str,
    policy: &str,
    env: &[(&str, &str)],
    done: impl Fn(&[LogLine]) -> bool,
) -> (Kinesis, String, HostProcess) {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("chaos");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let (bad_key, good_key) = two_lane_keys();
    let mut records = vec![(bad_key, bad.as_bytes().to_vec())];
    records.extend((0..20).map(|i| (good_key.clone(), format!("good-{i}").into_bytes())));
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "chaos",
        &stream,
        &guests.chaos,
        &format!(
            "start = \"trim_horizon\"\nworkers = 2\nby_key = true\nretry_backoff = {{ initial = \"50ms\", max = \"100ms\" }}\n{policy}"
        ),
    );
    let mut vars = vec![("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())];
    vars.extend_from_slice(env);
    let mut host = HostProcess::start_with(shardlane_bin(), &cfg, &vars).unwrap();
    host.wait_for(
        "the healthy lane's records and the bad record's fate",
        Duration::from_secs(60),
        |lines| calls(lines, "good-19").len() == 1 && done(lines),
    )
    .await
    .unwrap();
    (kinesis, stream, host)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trap_is_retried_then_dead_lettered_with_its_envelope() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("trap");
    let dlq = unique_name("dlq");
    kinesis.create_stream(&stream, 1).await.unwrap();
    kinesis.create_stream(&dlq, 1).await.unwrap();
    let (bad_key, good_key) = two_lane_keys();
    let mut records = vec![(bad_key.clone(), b"trap-me".to_vec())];
    records.extend((0..20).map(|i| (good_key.clone(), format!("good-{i}").into_bytes())));
    let put = kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "trap",
        &stream,
        &guests.chaos,
        &format!(
            "start = \"trim_horizon\"\nworkers = 2\nby_key = true\nretry_backoff = {{ initial = \"50ms\", max = \"100ms\" }}\nmax_attempts = 3\non_failure = \"dead_letter\"\ndead_letter_stream = \"{dlq}\""
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("dead-lettered", Duration::from_secs(60), |lines| {
        !messages(lines, "record dead-lettered").is_empty() && calls(lines, "good-19").len() == 1
    })
    .await
    .unwrap();
    assert!(
        host.terminate().await.unwrap().success(),
        "the host survived the traps"
    );
    let lines = host.lines();
    let attempts: Vec<&str> = calls(&lines, "trap-me")
        .iter()
        .map(|l| field(l, "message"))
        .collect();
    assert_eq!(
        attempts,
        vec![
            "handled data=trap-me attempt=1",
            "handled data=trap-me attempt=2",
            "handled data=trap-me attempt=3"
        ]
    );
    assert_eq!(
        messages(&lines, "handler failed; instance recycled").len(),
        3
    );
    assert_eq!(
        guest_lines(&lines, "handled data=good-").len(),
        20,
        "the other lane handled everything once"
    );

    let dead = kinesis.read_all(&dlq).await.unwrap();
    assert_eq!(dead.len(), 1);
    let (key, data) = &dead[0];
    assert_eq!(key, &bad_key, "same partition key");
    let envelope: serde_json::Value = serde_json::from_slice(data).unwrap();
    assert_eq!(envelope["attempts"], 3);
    assert!(
        envelope["reason"].as_str().unwrap().contains("trapped"),
        "{envelope}"
    );
    assert_eq!(envelope["subscription"], "trap");
    let chaos = shardlane::PluginDigest::of(&std::fs::read(&guests.chaos).unwrap());
    assert_eq!(
        envelope["plugin"],
        chaos.to_string(),
        "the version that failed it"
    );
    assert_eq!(envelope["source"]["stream"], stream.as_str());
    assert_eq!(envelope["source"]["shard_id"], put[0].0.as_str());
    assert_eq!(envelope["source"]["sequence_number"], put[0].1.as_str());
    assert_eq!(envelope["source"]["partition_key"], bad_key.as_str());
    let original =
        aws_smithy_types::base64::decode(envelope["data_base64"].as_str().unwrap()).unwrap();
    assert_eq!(original, b"trap-me", "the data, unchanged");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endless_loop_times_out_and_is_skipped() {
    let (_kinesis, _stream, mut host) = misbehave(
        "loop-forever",
        "handler_timeout = \"300ms\"\nmax_attempts = 2\non_failure = \"skip\"",
        |lines| !messages(lines, "record skipped").is_empty(),
    )
    .await;
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    assert_eq!(calls(&lines, "loop-forever").len(), 2);
    let failures = messages(&lines, "handler failed; instance recycled");
    assert_eq!(failures.len(), 2);
    assert!(
        field(failures[0], "error").contains("timed out"),
        "{}",
        failures[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unbounded_allocation_fails_the_call_not_the_host() {
    let (_kinesis, _stream, mut host) = misbehave(
        "alloc-everything",
        "max_memory = \"32MiB\"\nmax_attempts = 2\non_failure = \"skip\"",
        |lines| !messages(lines, "record skipped").is_empty(),
    )
    .await;
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    assert_eq!(calls(&lines, "alloc-everything").len(), 2);
    assert_eq!(
        messages(&lines, "handler failed; instance recycled").len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_log_flood_is_rate_limited_and_counted() {
    let (_kinesis, _stream, mut host) = misbehave("flood-the-log", "log_rate = 50", |lines| {
        !messages(lines, "guest log lines dropped by the rate limit").is_empty()
    })
    .await;
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    let passed = guest_lines(&lines, "flood line ");
    let flood = passed.len();
    // The bucket holds a burst of 2 × 50 and refills 50 a second: however
    // slow the machine, no more than that passed between the first and the
    // last line that got through.
    let at = |l: &LogLine| humantime::parse_rfc3339_weak(field(l, "timestamp")).unwrap();
    let span = at(passed[flood - 1])
        .duration_since(at(passed[0]))
        .unwrap_or_default();
    let allowed = 100 + (50.0 * span.as_secs_f64()).ceil() as usize + 1;
    assert!(
        flood <= allowed,
        "at most the burst (2 × 50) plus 50/s over {span:?} passed, got {flood}"
    );
    let dropped: u64 = messages(&lines, "guest log lines dropped by the rate limit")
        .iter()
        .map(|l| l["dropped"].as_u64().unwrap())
        .sum();
    assert_eq!(
        flood as u64 + dropped,
        10_000,
        "every line either written or counted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_are_dead_lettered_at_once_or_skipped() {
    let (_kinesis, _stream, mut host) = misbehave("reject-me", "", |lines| {
        !messages(lines, "record skipped").is_empty()
    })
    .await;
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    assert_eq!(
        calls(&lines, "reject-me").len(),
        1,
        "block does not apply to rejects: skipped at once"
    );
    let skipped = messages(&lines, "record skipped");
    assert!(
        field(skipped[0], "reason").starts_with("rejected: "),
        "{}",
        skipped[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn block_holds_the_lane_and_keeps_retrying() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("block");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let (bad_key, good_key) = two_lane_keys();
    let mut records = vec![
        (bad_key.clone(), b"hold:1000".to_vec()),
        (bad_key.clone(), b"after-the-held".to_vec()),
    ];
    records.extend((0..20).map(|i| (good_key.clone(), format!("good-{i}").into_bytes())));
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "block",
        &stream,
        &guests.retry,
        "start = \"trim_horizon\"\nworkers = 2\nby_key = true\nretry_backoff = { initial = \"20ms\", max = \"20ms\" }\nmax_attempts = 3",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for(
        "the record blocked past its attempts",
        Duration::from_secs(60),
        |lines| {
            guest_lines(lines, "handled data=hold:1000 attempt=").len() >= 15
                && guest_lines(lines, "handled data=good-19 ").len() == 1
        },
    )
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    assert!(
        !messages(
            &lines,
            "record blocked: out of attempts, on_failure = block keeps retrying it (the lane waits)"
        )
        .is_empty()
    );
    assert!(
        guest_lines(&lines, "handled data=after-the-held").is_empty(),
        "the key's next record waits behind the blocked one"
    );
    assert!(messages(&lines, "record skipped").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn capabilities_are_denied_unless_granted() {
    let (_k, _s, mut host) =
        misbehave("caps", "", |lines| !guest_lines(lines, "caps ").is_empty()).await;
    host.terminate().await.unwrap();
    let lines = host.lines();
    let caps = field(guest_lines(&lines, "caps ")[0], "message").to_owned();
    assert!(caps.contains("file=denied("), "{caps}");
    assert!(caps.contains("preopen=denied("), "{caps}");
    assert!(caps.contains("env=denied("), "{caps}");
    assert!(caps.contains("socket=denied("), "{caps}");

    // Granted: one env var and a read-only directory; still no network.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hi from the host\n").unwrap();
    // The host grants the variable from its own environment.
    let (_k, _s, mut host) = misbehave_with(
        "caps",
        &format!(
            "env = [\"SHARDLANE_TEST_VAR\"]\npreopen = {{ host = \"{}\", guest = \"/data\" }}",
            dir.path().display()
        ),
        &[("SHARDLANE_TEST_VAR", "granted-value")],
        |lines| !guest_lines(lines, "caps ").is_empty(),
    )
    .await;
    host.terminate().await.unwrap();
    let lines = host.lines();
    let caps = field(guest_lines(&lines, "caps ")[0], "message").to_owned();
    assert!(
        caps.contains("preopen=ok(hi_from_the_host)")
            || caps.contains("preopen=ok(hi from the host)"),
        "{caps}"
    );
    assert!(caps.contains("env=ok(granted-value)"), "{caps}");
    assert!(
        caps.contains("file=denied("),
        "only the preopened directory: {caps}"
    );
    assert!(caps.contains("socket=denied("), "{caps}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bisect_isolates_one_poison_record_in_a_batch_of_100() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("bisect");
    let dlq = unique_name("dlq");
    kinesis.create_stream(&stream, 1).await.unwrap();
    kinesis.create_stream(&dlq, 1).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..100)
        .map(|i| {
            let data = if i == 37 {
                "poison-37".to_owned()
            } else {
                format!("fine-{i}")
            };
            (format!("k{i}"), data.into_bytes())
        })
        .collect();
    let put = kinesis.put_records(&stream, &records).await.unwrap();
    let last = put.last().unwrap().1.clone();
    let cfg = config(
        "bisect",
        &stream,
        &guests.bad_batch,
        &format!(
            "start = \"trim_horizon\"\nbatch_size = 100\nbatch_window = \"1s\"\nbisect_on_error = true\nmax_attempts = 3\non_failure = \"dead_letter\"\ndead_letter_stream = \"{dlq}\"\nretry_backoff = {{ initial = \"10ms\", max = \"20ms\" }}"
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    wait_checkpoint(
        &mut host,
        "checkpoint past the whole batch",
        &last,
        Duration::from_secs(60),
    )
    .await;
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    let dead = messages(&lines, "record dead-lettered");
    assert_eq!(dead.len(), 1);
    assert_eq!(field(dead[0], "sequence_number"), put[37].1);
    let dlq_records = kinesis.read_all(&dlq).await.unwrap();
    assert_eq!(dlq_records.len(), 1);
    let envelope: serde_json::Value = serde_json::from_slice(&dlq_records[0].1).unwrap();
    assert_eq!(
        aws_smithy_types::base64::decode(envelope["data_base64"].as_str().unwrap()).unwrap(),
        b"poison-37"
    );
    // Every fine record was acked in a batch that did not trap: each
    // appears in a batch without the poison record.
    let sizes: Vec<usize> = guest_lines(&lines, "batch size=")
        .iter()
        .map(|l| field(l, "message")["batch size=".len()..].parse().unwrap())
        .collect();
    assert_eq!(sizes[0], 100);
    assert!(
        sizes.contains(&1),
        "bisected down to the poison record alone: {sizes:?}"
    );
    assert!(!messages(&lines, "bisecting the failed batch").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_number_of_outcomes_fails_the_whole_batch() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("short");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = ["a", "short-answer", "c"]
        .iter()
        .map(|d| ("k".to_owned(), d.as_bytes().to_vec()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = config(
        "short",
        &stream,
        &guests.bad_batch,
        "start = \"trim_horizon\"\nbatch_size = 10\nbatch_window = \"300ms\"\nmax_attempts = 2\non_failure = \"skip\"\nretry_backoff = { initial = \"10ms\", max = \"20ms\" }",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("all three skipped", Duration::from_secs(60), |lines| {
        messages(lines, "record skipped").len() == 3
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    let guest_errors = messages(&lines, "guest error: the whole batch failed");
    assert_eq!(guest_errors.len(), 2, "two attempts of the whole batch");
    assert!(field(guest_errors[0], "error").contains("returned 2 outcomes for a batch of 3"));
}
