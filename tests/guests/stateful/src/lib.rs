//! Test plugin, contract `shardlane:plugin@0.2.0`: for a record whose data
//! is `add=<n>[;<then>]`, reads the key's `total` from per-key state, adds
//! `n`, writes it back, logs `total key=<key> total=<total> attempt=<a>
//! then=<then>`, and then:
//! - no `<then>`: acks;
//! - `retry-once` / `trap-once`: on attempt 1 asks to retry / traps, after
//!   the write (which must be discarded); acks on later attempts;
//! - `reject`: rejects after the write (which must be discarded).
//!
//! A state call that fails is logged as `state error: ...` and retried.

wit_bindgen::generate!({
    world: "shardlane:plugin/record-handler@0.2.0",
    path: "../../../wit/v0.2.0",
    generate_all,
});

use shardlane::plugin::log::{Level, log};
use shardlane::plugin::state;

struct Stateful;

impl Guest for Stateful {
    fn handle(record: KinesisRecord) -> Outcome {
        let data = String::from_utf8_lossy(&record.data).into_owned();
        let Some(rest) = data.strip_prefix("add=") else {
            return Outcome::Reject(format!("not add=<n>: {data}"));
        };
        let (n, then) = rest.split_once(';').unwrap_or((rest, ""));
        let Ok(n) = n.parse::<i64>() else {
            return Outcome::Reject(format!("not a number: {n}"));
        };
        let total = match state::get(0, "total") {
            Ok(value) => {
                value.map_or(0, |v| String::from_utf8_lossy(&v).parse::<i64>().unwrap_or(0)) + n
            }
            Err(e) => {
                log(Level::Error, &format!("state error: {e:?}"));
                return Outcome::Retry(format!("{e:?}"));
            }
        };
        if let Err(e) = state::set(0, "total", total.to_string().as_bytes()) {
            log(Level::Error, &format!("state error: {e:?}"));
            return Outcome::Retry(format!("{e:?}"));
        }
        log(
            Level::Info,
            &format!(
                "total key={} total={total} attempt={} then={then}",
                record.partition_key, record.attempt
            ),
        );
        match then {
            "retry-once" if record.attempt == 1 => Outcome::Retry("once".into()),
            "trap-once" if record.attempt == 1 => panic!("trap after a state write"),
            "reject" => Outcome::Reject("rejected after a state write".into()),
            _ => Outcome::Ack,
        }
    }
}

export!(Stateful);
