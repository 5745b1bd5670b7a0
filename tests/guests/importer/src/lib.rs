//! Test plugin: a record-handler that also imports `test:importer/extra`,
//! which no shardlane host provides, for start-up and `check` to refuse by
//! name. Its WIT takes the shardlane package from the repository's `wit/`
//! through a symlink under `wit/deps`, so there is no copy to drift.

wit_bindgen::generate!({
    world: "importer",
    path: "wit",
    generate_all,
});

struct Importer;

impl Guest for Importer {
    fn handle(_record: KinesisRecord) -> Outcome {
        test::importer::extra::ping();
        Outcome::Ack
    }
}

export!(Importer);
