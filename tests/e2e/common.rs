//! Helpers shared by the end-to-end tests.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use shardlane_testkit::{HostProcess, Kinesis, LogLine};
use tokio::task::JoinHandle;

/// The host binary under test.
pub(crate) fn shardlane_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_shardlane"))
}

/// A one-subscription config for `stream` (in-memory leases, an admin
/// server on a free port), with extra lines appended to the subscription
/// block; append more blocks with [`subscription`].
pub(crate) fn config(name: &str, stream: &str, plugin: &Path, extra: &str) -> String {
    format!(
        r#"
[aws]
region = "us-east-1"

[admin]
listen = "127.0.0.1:0"

[lease]
store = "memory"
shard_sync_every = "1s"
{}"#,
        subscription(name, stream, plugin, extra)
    )
}

/// A `[[subscription]]` block that polls and checkpoints quickly, with
/// `extra` lines appended. Tests count guest log lines, so the log rate
/// limit is lifted, and the read budget raised to 20 reads a second,
/// unless `extra` sets them.
pub(crate) fn subscription(name: &str, stream: &str, plugin: &Path, extra: &str) -> String {
    let log_rate = if extra.contains("log_rate") {
        ""
    } else {
        "log_rate = 1000000"
    };
    let budget = if extra.contains("max_reads_per_second") {
        ""
    } else {
        "max_reads_per_second = 20"
    };
    format!(
        r#"
[[subscription]]
name = "{name}"
stream = "{stream}"
plugin = "{plugin}"
poll_idle = "50ms"
checkpoint_every = "200ms"
{budget}
{log_rate}
{extra}
"#,
        plugin = plugin.display()
    )
}

/// The string value of a field of a JSON log line.
pub(crate) fn field<'a>(line: &'a LogLine, name: &str) -> &'a str {
    line[name].as_str().unwrap_or_default()
}

/// Guest log lines (`target` = `guest`) whose message starts with `prefix`.
pub(crate) fn guest_lines<'a>(lines: &'a [LogLine], prefix: &str) -> Vec<&'a LogLine> {
    lines
        .iter()
        .filter(|l| field(l, "target") == "guest" && field(l, "message").starts_with(prefix))
        .collect()
}

/// Groups guest lines' sequence numbers by shard, in handling order.
pub(crate) fn sequences_by_shard(lines: &[&LogLine]) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for line in lines {
        out.entry(field(line, "shard_id").to_owned())
            .or_default()
            .push(field(line, "sequence_number").to_owned());
    }
    out
}

/// Orders sequence numbers numerically (length, then digits).
pub(crate) fn seq_key(s: &str) -> (usize, &str) {
    (s.len(), s)
}

/// The admin server's address, from the host's log.
pub(crate) fn admin_addr(host: &HostProcess) -> String {
    host.lines()
        .iter()
        .find(|l| field(l, "message").starts_with("admin listening"))
        .map(|l| field(l, "addr").to_owned())
        .expect("the host logs where admin listens")
}

pub(crate) use shardlane_testkit::admin::http;

/// Waits until `host` logs a checkpoint written at sequence number `at`.
pub(crate) async fn wait_checkpoint(
    host: &mut HostProcess,
    what: &str,
    at: &str,
    within: Duration,
) {
    host.wait_for(what, within, |lines| {
        lines
            .iter()
            .any(|l| field(l, "message") == "checkpoint written" && field(l, "checkpoint") == at)
    })
    .await
    .unwrap();
}

/// Waits until the host has positioned a reader on `shards` shards: an
/// iterator opened (polling) or a subscription made (fan-out). Records put
/// after that are seen even at `latest`.
pub(crate) async fn wait_positioned(host: &mut HostProcess, shards: usize) {
    host.wait_for("readers positioned", Duration::from_secs(60), |lines| {
        lines
            .iter()
            .filter(|l| {
                let message = field(l, "message");
                message == "shard iterator opened" || message == "subscribed to the shard"
            })
            .count()
            >= shards
    })
    .await
    .unwrap();
}

/// Explicit hash keys in each half of the hash-key space: with two shards,
/// shard 0 holds the lower half and shard 1 the upper one.
pub(crate) const SHARD_HASH: [&str; 2] = ["1", "340282366920938463463374607431768211455"];

/// The data the echo guest printed in a line (`… data="…"`), unquoted.
pub(crate) fn echoed_data(line: &LogLine) -> String {
    let message = field(line, "message");
    let quoted = message.split_once(" data=").map_or("", |(_, d)| d);
    serde_json::from_str(quoted).unwrap_or_else(|_| quoted.to_owned())
}

/// The sequence numbers of `put` ((shard, sequence) pairs) per shard, in
/// order.
pub(crate) fn by_shard(put: &[(String, String)]) -> HashMap<String, Vec<String>> {
    let mut want: HashMap<String, Vec<String>> = HashMap::new();
    for (shard, seq) in put {
        want.entry(shard.clone()).or_default().push(seq.clone());
    }
    for seqs in want.values_mut() {
        seqs.sort_by(|a, b| seq_key(a).cmp(&seq_key(b)));
    }
    want
}

/// A producer for tests that run while records keep arriving: `per_tick`
/// records every `pause` until the returned flag is set, one PutRecord at a
/// time (so each key's order is exact). Record `n` (from 1) is `next(n)`:
/// its partition key, its data, and what to return for it; the task
/// returns those, in put order.
pub(crate) fn trickle<T: Send + 'static>(
    kinesis: &Kinesis,
    stream: &str,
    per_tick: usize,
    pause: Duration,
    mut next: impl FnMut(usize) -> (String, Vec<u8>, T) + Send + 'static,
) -> (Arc<AtomicBool>, JoinHandle<Vec<T>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let client = kinesis.client();
    let stream = stream.to_owned();
    let task = tokio::spawn(async move {
        let mut put = Vec::new();
        let mut n = 0;
        while !flag.load(Ordering::SeqCst) {
            for _ in 0..per_tick {
                n += 1;
                let (key, data, kept) = next(n);
                client
                    .put_record()
                    .stream_name(&stream)
                    .partition_key(key)
                    .data(aws_sdk_kinesis::primitives::Blob::new(data))
                    .send()
                    .await
                    .expect("PutRecord");
                put.push(kept);
            }
            tokio::time::sleep(pause).await;
        }
        put
    });
    (stop, task)
}
