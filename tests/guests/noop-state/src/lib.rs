//! Benchmark plugin, contract `shardlane:plugin@0.2.0`: per record, reads
//! the key's `n` from per-key state, writes `n + 1` back (8 bytes, little
//! endian) and acks: the cost of state over a no-op. A state call that
//! fails asks to retry.

wit_bindgen::generate!({
    world: "shardlane:plugin/record-handler@0.2.0",
    path: "../../../wit/v0.2.0",
    generate_all,
});

use shardlane::plugin::state;

struct NoopState;

impl Guest for NoopState {
    fn handle(_record: KinesisRecord) -> Outcome {
        let n = match state::get(0, "n") {
            Ok(Some(bytes)) if bytes.len() == 8 => {
                u64::from_le_bytes(bytes.try_into().unwrap_or_default())
            }
            Ok(_) => 0,
            Err(e) => return Outcome::Retry(format!("{e:?}")),
        };
        match state::set(0, "n", &(n + 1).to_le_bytes()) {
            Ok(()) => Outcome::Ack,
            Err(e) => Outcome::Retry(format!("{e:?}")),
        }
    }
}

export!(NoopState);
