//! The echo plugin: logs each record's partition key, sequence number and
//! data (as text when it is UTF-8), and acks it.

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

struct Echo;

impl Guest for Echo {
    fn handle(record: KinesisRecord) -> Outcome {
        let data = match std::str::from_utf8(&record.data) {
            Ok(text) => format!("{text:?}"),
            Err(_) => format!("<{} bytes of binary data>", record.data.len()),
        };
        log(
            Level::Info,
            &format!(
                "echo key={} seq={} data={}",
                record.partition_key, record.sequence_number, data
            ),
        );
        Outcome::Ack
    }
}

export!(Echo);
