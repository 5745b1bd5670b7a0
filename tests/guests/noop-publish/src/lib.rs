//! Test plugin, contract `shardlane:plugin@0.2.0`: publishes each record's
//! data, unchanged and with its partition key, to the stream `bench-out`,
//! and acks. The benchmarks' guest with one output per input.

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.2.0",
    generate_all,
});

use shardlane::plugin::outputs::publish;

struct NoopPublish;

impl Guest for NoopPublish {
    fn handle(record: KinesisRecord) -> Outcome {
        match publish(0, "bench-out", &record.partition_key, &record.data) {
            Ok(()) => Outcome::Ack,
            Err(e) => Outcome::Reject(format!("{e:?}")),
        }
    }
}

export!(NoopPublish);
