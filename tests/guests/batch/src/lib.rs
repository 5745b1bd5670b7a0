//! Test plugin (batch-handler): logs `batch size=<n>` per call and
//! `item data=<data> attempt=<n>` per record; retries records whose data
//! starts with `retry` on their first attempt, rejects those starting with
//! `reject`, acks the rest.

wit_bindgen::generate!({
    world: "batch-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

struct Batch;

impl Guest for Batch {
    fn handle_batch(records: Vec<KinesisRecord>) -> Vec<Outcome> {
        log(Level::Info, &format!("batch size={}", records.len()));
        records
            .iter()
            .map(|record| {
                let data = String::from_utf8_lossy(&record.data);
                log(
                    Level::Info,
                    &format!("item data={data} attempt={}", record.attempt),
                );
                if data.starts_with("retry") && record.attempt < 2 {
                    Outcome::Retry("first attempts of retry records fail".to_owned())
                } else if data.starts_with("reject") {
                    Outcome::Reject("reject records are never valid".to_owned())
                } else {
                    Outcome::Ack
                }
            })
            .collect()
    }
}

export!(Batch);
