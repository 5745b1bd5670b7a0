//! Benchmark plugin (batch-handler): acks every record of every batch,
//! doing nothing else.

wit_bindgen::generate!({
    world: "batch-handler",
    path: "../../../wit/v0.1.0",
});

struct NoopBatch;

impl Guest for NoopBatch {
    fn handle_batch(records: Vec<KinesisRecord>) -> Vec<Outcome> {
        records.iter().map(|_| Outcome::Ack).collect()
    }
}

export!(NoopBatch);
