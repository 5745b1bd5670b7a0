//! Test plugin (contract 0.3.0, `record-handler`): handles each run in
//! order and stops after the first record that is not acked, as the
//! contract asks. Logs `run stream=<s> shard=<id> key=<k> seq=<n>
//! attempt=<n> data=<data> window=<start>..<end>|none` for every record it
//! handles; data `retry…` is retried until attempt 2, `bad…` rejected,
//! `trap…` traps; everything else is acked.

wit_bindgen::generate!({
    world: "shardlane:plugin/record-handler@0.3.0",
    path: "../../../wit",
    generate_all,
});

use shardlane::plugin::log::{Level, log};

struct Runner;

fn handle(run: &RunContext, record: &RunRecord) -> Outcome {
    let data = String::from_utf8_lossy(&record.data);
    let window = record
        .window
        .map_or_else(|| "none".to_owned(), |w| format!("{}..{}", w.start, w.end));
    log(
        Level::Info,
        &format!(
            "run stream={} shard={} key={} seq={} attempt={} data={data} window={window}",
            run.stream, run.shard_id, record.partition_key, record.sequence_number, record.attempt
        ),
    );
    if data.starts_with("trap") {
        panic!("asked to trap");
    }
    if data.starts_with("retry") && record.attempt < 2 {
        Outcome::Retry(format!("{data} wants a second attempt"))
    } else if data.starts_with("bad") {
        Outcome::Reject(format!("{data} is bad"))
    } else {
        Outcome::Ack
    }
}

impl Guest for Runner {
    fn handle_run(run: RunContext, records: Vec<RunRecord>) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(records.len());
        for record in &records {
            let outcome = handle(&run, record);
            let stop = !matches!(outcome, Outcome::Ack);
            outcomes.push(outcome);
            if stop {
                break;
            }
        }
        outcomes
    }
}

export!(Runner);
