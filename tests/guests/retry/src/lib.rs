//! Test plugin: logs `handled data=<data> attempt=<n>` for every call, and
//! returns `retry` for records whose data starts with `retry` on their first
//! attempt (ack on the second), and for records whose data is `hold:<n>`
//! until their attempt `n`; acks everything else.

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

struct Retry;

impl Guest for Retry {
    fn handle(record: KinesisRecord) -> Outcome {
        let data = String::from_utf8_lossy(&record.data);
        log(
            Level::Info,
            &format!("handled data={data} attempt={}", record.attempt),
        );
        let hold_until = data
            .strip_prefix("hold:")
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        if data.starts_with("retry") && record.attempt < 2 {
            Outcome::Retry(format!("{data} wants a second attempt"))
        } else if record.attempt < hold_until {
            Outcome::Retry(format!("held until attempt {hold_until}"))
        } else {
            Outcome::Ack
        }
    }
}

export!(Retry);
