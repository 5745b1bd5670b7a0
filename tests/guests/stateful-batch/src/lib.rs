//! Test plugin, contract `shardlane:plugin@0.2.0`, batch world: for each
//! record `add=<n>[;<then>]`, in batch order, reads its key's `total` from
//! per-key state, adds `n`, writes it back, logs `total key=<key>
//! total=<total> attempt=<a> then=<then>`, and answers:
//! - no `<then>`: ack;
//! - `retry-once`: retry on attempt 1 (after the write), ack later;
//! - `reject`: reject (after the write).

wit_bindgen::generate!({
    world: "shardlane:plugin/batch-handler@0.2.0",
    path: "../../../wit/v0.2.0",
    generate_all,
});

use shardlane::plugin::log::{Level, log};
use shardlane::plugin::state;

struct StatefulBatch;

impl Guest for StatefulBatch {
    fn handle_batch(records: Vec<KinesisRecord>) -> Vec<Outcome> {
        records
            .iter()
            .enumerate()
            .map(|(i, record)| {
                let input = i as u32;
                let data = String::from_utf8_lossy(&record.data).into_owned();
                let Some(rest) = data.strip_prefix("add=") else {
                    return Outcome::Reject(format!("not add=<n>: {data}"));
                };
                let (n, then) = rest.split_once(';').unwrap_or((rest, ""));
                let n: i64 = n.parse().unwrap_or(0);
                let total = match state::get(input, "total") {
                    Ok(v) => v.map_or(0, |v| String::from_utf8_lossy(&v).parse().unwrap_or(0)) + n,
                    Err(e) => return Outcome::Retry(format!("{e:?}")),
                };
                if let Err(e) = state::set(input, "total", total.to_string().as_bytes()) {
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
                    "reject" => Outcome::Reject("rejected after a state write".into()),
                    _ => Outcome::Ack,
                }
            })
            .collect()
    }
}

export!(StatefulBatch);
