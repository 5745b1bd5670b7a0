//! Test plugin (record-handler): logs `handled bytes=<n> head=<first 24
//! bytes>` for every call, then does what the record's data asks:
//! - `reject-big:<n>`: rejects with a reason of `n` bytes;
//! - `reject…`: rejects with a short reason;
//! - `forge`: logs, and rejects with, text holding a newline followed by a
//!   forged host line (and ANSI escapes);
//! - `trap-long`: traps inside a function with an 80,000-character name;
//! - `flood:<ms>`: logs `flood line <i>` without pause for `ms` milliseconds;
//! - anything else: acks.

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

include!(concat!(env!("OUT_DIR"), "/long_name.rs"));

/// What a forged line looks like: a host line of its own, at column 0.
const FORGED: &str = "2030-01-01T00:00:00.000000Z INFO shardlane::supervisor: shardlane stopped";

struct Hostile;

impl Guest for Hostile {
    fn handle(record: KinesisRecord) -> Outcome {
        let head = String::from_utf8_lossy(&record.data[..record.data.len().min(24)]).into_owned();
        log(
            Level::Info,
            &format!("handled bytes={} head={head}", record.data.len()),
        );
        let data = &record.data[..];
        if let Some(n) = data.strip_prefix(b"reject-big:") {
            let n: usize = String::from_utf8_lossy(n)
                .trim()
                .parse()
                .unwrap_or(1_000_000);
            return Outcome::Reject("r".repeat(n));
        }
        if data.starts_with(b"reject") {
            return Outcome::Reject("asked to reject".to_owned());
        }
        if data == b"forge" {
            log(Level::Info, &format!("innocent\n{FORGED}\x1b[2J\x1b[31m"));
            return Outcome::Reject(format!("bad\n{FORGED}\r\n\x1b[0m"));
        }
        if let Some(ms) = data.strip_prefix(b"flood:") {
            let ms: u64 = String::from_utf8_lossy(ms).trim().parse().unwrap_or(1_000);
            let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
            let mut i = 0u64;
            while std::time::Instant::now() < until {
                log(Level::Info, &format!("flood line {i}"));
                i += 1;
            }
            log(Level::Info, &format!("flood done lines={i}"));
        }
        if data == b"trap-long" {
            trap_with_a_long_name("asked to trap");
        }
        Outcome::Ack
    }
}

export!(Hostile);
