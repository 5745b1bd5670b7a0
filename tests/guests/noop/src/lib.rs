//! Benchmark plugin: acks every record, doing nothing else, so the dispatch
//! benchmark measures the host's pipeline and the call itself.

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.1.0",
});

struct Noop;

impl Guest for Noop {
    fn handle(_record: KinesisRecord) -> Outcome {
        Outcome::Ack
    }
}

export!(Noop);
