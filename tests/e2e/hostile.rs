//! Hostile guests and producers, end to end: what they send is chosen to
//! hurt the host (a record too large to dead-letter whole, a 10 MB reason,
//! an 80 KB trap message, forged log lines, a batch larger than the guest's
//! memory, a log flood), and the host bounds each one and keeps settling.
//! The guests are `tests/guests/hostile` and `tests/guests/hostile-batch`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardlane_testkit::{HostProcess, Kinesis, LogLine, guests, unique_name};

use crate::common::{config, field, guest_lines, shardlane_bin, wait_checkpoint};

/// A line written whole by the host is far below this; a guest string
/// logged uncut is far above it.
const LONGEST_LINE: usize = 32 * 1024;

fn messages<'a>(lines: &'a [LogLine], message: &str) -> Vec<&'a LogLine> {
    lines
        .iter()
        .filter(|l| field(l, "message") == message)
        .collect()
}

fn handled<'a>(lines: &'a [LogLine], head: &str) -> Vec<&'a LogLine> {
    guest_lines(lines, "handled bytes=")
        .into_iter()
        .filter(|l| field(l, "message").ends_with(&format!("head={head}")))
        .collect()
}

/// Puts `records` (key, data) to a fresh one-shard stream, plus a
/// dead-letter stream, and runs `plugin` on it with `extra` config.
async fn run(
    name: &str,
    plugin: &std::path::Path,
    records: &[(String, Vec<u8>)],
    extra: &str,
) -> (Kinesis, String, String, Vec<(String, String)>, HostProcess) {
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name(name);
    let dlq = unique_name("dlq");
    kinesis.create_stream(&stream, 1).await.unwrap();
    kinesis.create_stream(&dlq, 1).await.unwrap();
    let put = kinesis.put_records(&stream, records).await.unwrap();
    let cfg = config(
        name,
        &stream,
        plugin,
        &format!(
            "start = \"trim_horizon\"\nretry_backoff = {{ initial = \"50ms\", max = \"100ms\" }}\n{}",
            extra.replace("{dlq}", &dlq)
        ),
    );
    let host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    (kinesis, stream, dlq, put, host)
}

fn oks(key: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| (key.to_owned(), format!("ok-{i}").into_bytes()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_too_large_to_dead_letter_whole_is_dead_lettered_by_reference() {
    let guests = guests::build().unwrap();
    // 1,000,000 bytes of data: Kinesis takes it, but its base64 envelope
    // (1.33 MB) would not fit a record.
    let mut big = b"reject:".to_vec();
    big.resize(1_000_000, b'x');
    let mut records = vec![("key-big".to_owned(), big)];
    records.extend(oks("key-big", 5));
    let (kinesis, stream, dlq, put, mut host) = run(
        "big-dead-letter",
        &guests.hostile,
        &records,
        "on_failure = \"dead_letter\"\ndead_letter_stream = \"{dlq}\"",
    )
    .await;
    host.wait_for(
        "the big record dead-lettered and the records after it handled",
        Duration::from_secs(60),
        |lines| {
            !messages(lines, "record dead-lettered").is_empty()
                && !handled(lines, "ok-4").is_empty()
        },
    )
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    assert!(
        messages(
            &lines,
            "dead-letter put failed; retrying (the record stays unsettled)"
        )
        .is_empty(),
        "the envelope fit at the first put"
    );
    let dead = messages(&lines, "record dead-lettered");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["data_omitted"], true, "{}", dead[0]);

    let letters = kinesis.read_all(&dlq).await.unwrap();
    assert_eq!(letters.len(), 1);
    let (key, data) = &letters[0];
    assert_eq!(key, "key-big");
    assert!(key.len() + data.len() <= 1 << 20, "fits a Kinesis record");
    let envelope: serde_json::Value = serde_json::from_slice(data).unwrap();
    assert_eq!(envelope["data_omitted"], true, "{envelope}");
    assert_eq!(envelope["data_bytes"], 1_000_000);
    assert_eq!(envelope["data_base64"], serde_json::Value::Null);
    assert_eq!(envelope["source"]["stream"], stream.as_str());
    assert_eq!(envelope["source"]["shard_id"], put[0].0.as_str());
    assert_eq!(envelope["source"]["sequence_number"], put[0].1.as_str());
    assert_eq!(envelope["reason"], "rejected: asked to reject");
}

#[tokio::test(flavor = "multi_thread")]
async fn huge_reasons_and_trap_messages_are_cut_everywhere_they_go() {
    let guests = guests::build().unwrap();
    let records = vec![
        // A 10 MB reject reason (the hostile run used 100 MB).
        ("k".to_owned(), b"reject-big:10000000".to_vec()),
        // A trap inside a function with an 80,000-character name.
        ("k".to_owned(), b"trap-long".to_vec()),
        ("k".to_owned(), b"ok-0".to_vec()),
    ];
    let (kinesis, _stream, dlq, _put, mut host) = run(
        "huge-reasons",
        &guests.hostile,
        &records,
        "max_attempts = 1\non_failure = \"dead_letter\"\ndead_letter_stream = \"{dlq}\"",
    )
    .await;
    host.wait_for(
        "both records dead-lettered and the next handled",
        Duration::from_secs(60),
        |lines| {
            messages(lines, "record dead-lettered").len() == 2 && !handled(lines, "ok-0").is_empty()
        },
    )
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    for line in &lines {
        let len = line.to_string().len();
        assert!(
            len < LONGEST_LINE,
            "a {len}-byte log line: {:.300}",
            line.to_string()
        );
    }
    let trap = messages(&lines, "handler failed; instance recycled");
    assert_eq!(trap.len(), 1);
    assert!(
        field(trap[0], "error").ends_with("…[truncated]"),
        "the trap message was long, and cut: {}",
        trap[0]
    );
    let dead = messages(&lines, "record dead-lettered");
    assert!(field(dead[0], "reason").starts_with("rejected: rrrr"));
    assert!(field(dead[0], "reason").ends_with("…[truncated]"));

    let letters = kinesis.read_all(&dlq).await.unwrap();
    assert_eq!(letters.len(), 2);
    for (_, data) in &letters {
        let envelope: serde_json::Value = serde_json::from_slice(data).unwrap();
        let reason = envelope["reason"].as_str().unwrap();
        assert!(reason.len() <= 8 * 1024, "a {}-byte reason", reason.len());
        assert!(reason.ends_with("…[truncated]"), "{reason:.200}");
        assert_eq!(envelope["data_omitted"], false, "small data travels whole");
    }
}

/// The forged line the hostile guest and producer try to slip in.
const FORGED: &str = "2030-01-01T00:00:00.000000Z INFO shardlane::supervisor: shardlane stopped";

#[tokio::test(flavor = "multi_thread")]
async fn forged_lines_never_start_a_line_in_text_mode() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("forge");
    kinesis.create_stream(&stream, 1).await.unwrap();
    // The producer forges with its partition key, the guest with its log
    // message and its reject reason.
    let key = format!("k\n{FORGED}");
    let records = vec![(key.clone(), b"forge".to_vec()), (key, b"ok-0".to_vec())];
    kinesis.put_records(&stream, &records).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("shardlane.toml");
    std::fs::write(
        &cfg_path,
        config(
            "forge",
            &stream,
            &guests.hostile,
            "start = \"trim_horizon\"",
        ),
    )
    .unwrap();
    let mut child = Command::new(shardlane_bin())
        .args(["run", "--log-format", "text", "--config"])
        .arg(&cfg_path)
        .env("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let stdout = child.stdout.take().unwrap();
    let collector = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = {
            let lines = lines.lock().unwrap();
            lines.iter().any(|l| l.contains("record skipped"))
                && lines.iter().any(|l| l.contains("head=ok-0"))
        };
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the forged record and the next were not handled within 60 s:\n{}",
            lines.lock().unwrap().join("\n")
        );
        // Polling the collected output.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let exit = child.wait().unwrap();
    collector.join().unwrap();
    assert!(exit.success());
    let lines = lines.lock().unwrap();
    let text = lines.join("\n");
    for line in lines.iter() {
        assert!(
            !line.starts_with("2030-"),
            "a forged line at column 0:\n{text}"
        );
        assert!(
            !line.contains('\x1b'),
            "an escape reached the output: {line:?}"
        );
    }
    let guest = lines
        .iter()
        .find(|l| l.contains("innocent"))
        .expect("the guest's line");
    assert!(guest.contains(&format!("innocent\\n{FORGED}")), "{guest}");
    let skipped = lines.iter().find(|l| l.contains("record skipped")).unwrap();
    assert!(
        skipped.contains(&format!("k\\n{FORGED}")),
        "the key, escaped: {skipped}"
    );
}

fn batch_sizes(lines: &[LogLine]) -> Vec<usize> {
    guest_lines(lines, "batch size=")
        .iter()
        .map(|l| {
            let m = field(l, "message");
            m["batch size=".len()..m.find(" bytes=").unwrap()]
                .parse()
                .unwrap()
        })
        .collect()
}

fn sized(n: usize, bytes: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| (format!("k{i}"), vec![b'0' + (i % 10) as u8; bytes]))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_too_big_for_the_guests_memory_is_split_until_it_fits() {
    let guests = guests::build().unwrap();
    // 32 × 60 KB: about 1.9 MB of data for a guest of at most 2 MiB, about
    // 1 MiB of which is its stack. Read in one call, batched in one.
    let (_kinesis, _stream, _dlq, _put, mut host) = run(
        "oom-batch",
        &guests.hostile_batch,
        &sized(32, 60_000),
        "batch_size = 32\nbatch_window = \"1s\"\nmax_memory = \"2MiB\"",
    )
    .await;
    host.wait_for("all 32 records handled", Duration::from_secs(60), |lines| {
        batch_sizes(lines).iter().sum::<usize>() >= 32
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    assert_eq!(batch_sizes(&lines).iter().sum::<usize>(), 32, "each once");
    let splits = messages(&lines, "batch too big for the guest's memory; splitting it");
    assert!(!splits.is_empty(), "the full batch could not be lowered");
    assert!(splits.len() < 32, "halving ends: {} splits", splits.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_close_before_max_batch_bytes() {
    let guests = guests::build().unwrap();
    // 20 × 60 KB with a 256 KiB limit: at most 4 records a batch.
    let (_kinesis, _stream, _dlq, _put, mut host) = run(
        "batch-bytes",
        &guests.hostile_batch,
        &sized(20, 60_000),
        "batch_size = 100\nbatch_window = \"1s\"\nmax_batch_bytes = \"256KiB\"",
    )
    .await;
    host.wait_for("all 20 records handled", Duration::from_secs(60), |lines| {
        batch_sizes(lines).iter().sum::<usize>() >= 20
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
    let sizes = batch_sizes(&host.lines());
    assert_eq!(sizes.iter().sum::<usize>(), 20);
    assert!(sizes.iter().all(|&n| (1..=4).contains(&n)), "{sizes:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_log_flood_is_summarized_once_a_second() {
    let guests = guests::build().unwrap();
    let (_kinesis, _stream, _dlq, put, mut host) = run(
        "flood",
        &guests.hostile,
        &[
            ("k".to_owned(), b"flood:3000".to_vec()),
            ("k".to_owned(), b"ok-0".to_vec()),
        ],
        "log_rate = 50",
    )
    .await;
    // The next record's own lines may be dropped too (the bucket is empty
    // after the flood): wait for its checkpoint instead.
    let last = put[1].1.clone();
    wait_checkpoint(
        &mut host,
        "the flood and the next record checkpointed",
        &last,
        Duration::from_secs(60),
    )
    .await;
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    let passed = guest_lines(&lines, "flood line ").len();
    let reports = messages(&lines, "guest log lines dropped by the rate limit");
    // 3 s of flood at 50 lines a second: about 250 lines pass; a report a
    // second (plus the first and the last), not one per line.
    assert!(passed > 100, "{passed} lines passed");
    assert!(
        reports.len() <= 6,
        "{} dropped-lines reports for {passed} lines",
        reports.len()
    );
}
