//! Test plugin (batch-handler): logs `batch size=<n>` and one
//! `item data=<data> attempt=<n>` per record; traps when the batch holds a
//! record whose data starts with `poison`; answers with one outcome too few
//! when it holds one starting with `short`; otherwise acks every record.

wit_bindgen::generate!({
    world: "batch-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

struct BadBatch;

impl Guest for BadBatch {
    fn handle_batch(records: Vec<KinesisRecord>) -> Vec<Outcome> {
        log(Level::Info, &format!("batch size={}", records.len()));
        let mut poison = false;
        let mut short = false;
        for record in &records {
            let data = String::from_utf8_lossy(&record.data);
            log(
                Level::Info,
                &format!("item data={data} attempt={}", record.attempt),
            );
            poison |= data.starts_with("poison");
            short |= data.starts_with("short");
        }
        if poison {
            panic!("poison record in the batch");
        }
        let mut outcomes: Vec<Outcome> = records.iter().map(|_| Outcome::Ack).collect();
        if short {
            outcomes.pop();
        }
        outcomes
    }
}

export!(BadBatch);
