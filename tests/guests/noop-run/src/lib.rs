//! Benchmark plugin (contract 0.3.0): acks every record of every run,
//! doing nothing else, so the dispatch benchmark measures the host's
//! pipeline and the call itself with runs of records per call.

wit_bindgen::generate!({
    world: "shardlane:plugin/record-handler@0.3.0",
    path: "../../../wit",
    generate_all,
});

struct NoopRun;

impl Guest for NoopRun {
    fn handle_run(_run: RunContext, records: Vec<RunRecord>) -> Vec<Outcome> {
        records.iter().map(|_| Outcome::Ack).collect()
    }
}

export!(NoopRun);
