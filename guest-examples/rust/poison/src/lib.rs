//! The poison plugin: retries a record whose data is `retry` until its
//! third attempt (then acks it), rejects `bad`, and acks everything else,
//! logging each call.

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

/// The attempt that finally succeeds for a `retry` record.
const SUCCEEDS_AT: u32 = 3;

struct Poison;

impl Guest for Poison {
    fn handle(record: KinesisRecord) -> Outcome {
        let (outcome, name) = match record.data.as_slice() {
            b"retry" if record.attempt < SUCCEEDS_AT => (
                Outcome::Retry(format!("attempt {} of {SUCCEEDS_AT}", record.attempt)),
                "retry",
            ),
            b"bad" => (Outcome::Reject("bad record".to_owned()), "reject"),
            _ => (Outcome::Ack, "ack"),
        };
        log(
            Level::Info,
            &format!(
                "poison key={} seq={} attempt={} outcome={name}",
                record.partition_key, record.sequence_number, record.attempt
            ),
        );
        outcome
    }
}

export!(Poison);
