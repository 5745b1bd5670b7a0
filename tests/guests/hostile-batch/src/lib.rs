//! Test plugin (batch-handler): logs `batch size=<n> bytes=<total data
//! bytes>` per call and acks every record, allocating nothing per record.
//! Run with a small `max_memory`: a batch whose data does not fit in the
//! guest's memory cannot even be lowered into it.

wit_bindgen::generate!({
    world: "batch-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

struct HostileBatch;

impl Guest for HostileBatch {
    fn handle_batch(records: Vec<KinesisRecord>) -> Vec<Outcome> {
        let bytes: usize = records.iter().map(|r| r.data.len()).sum();
        log(
            Level::Info,
            &format!("batch size={} bytes={bytes}", records.len()),
        );
        records.iter().map(|_| Outcome::Ack).collect()
    }
}

export!(HostileBatch);
