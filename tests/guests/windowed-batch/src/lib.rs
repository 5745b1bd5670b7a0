//! Test plugin (contract 0.3.0, `windowed-batch-handler`): the `windowed`
//! fixture in the batch world (a batch per call, outcomes for all). For a
//! record
//! whose data is `{"amount": n}` and that is in a window, adds `n` to the
//! key's state value `sum@<window start>`; a record in no window (late)
//! is acked and logged as `late key=<k>`. At a window's close, for each of
//! its keys: adds the window's sum to the key's `total`, adds 1 to its
//! `windows`, deletes the window's sum, and logs `closed key=<k>
//! window=<start>..<end> sum=<s> total=<t> shard=<id>`. So a key's
//! committed `total` is the sum of its amounts if, and only if, every
//! window of it was closed exactly once.

wit_bindgen::generate!({
    world: "shardlane:plugin/windowed-batch-handler@0.3.0",
    path: "../../../wit",
    generate_all,
});

use shardlane::plugin::log::{Level, log};
use shardlane::plugin::state;

struct WindowedBatch;

fn number(input: u32, name: &str) -> Result<i64, String> {
    match state::get(input, name) {
        Ok(value) => Ok(value.map_or(0, |v| String::from_utf8_lossy(&v).parse().unwrap_or(0))),
        Err(e) => Err(format!("state error: {e:?}")),
    }
}

fn set(input: u32, name: &str, value: i64) -> Result<(), String> {
    state::set(input, name, value.to_string().as_bytes()).map_err(|e| format!("state error: {e:?}"))
}

fn amount(data: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(data).ok()?;
    let rest = text.split("\"amount\":").nth(1)?;
    rest.trim().trim_end_matches('}').trim().parse().ok()
}

fn handle(input: u32, record: &KinesisRecord) -> Result<(), String> {
    let Some(window) = record.window else {
        log(Level::Info, &format!("late key={}", record.partition_key));
        return Ok(());
    };
    let n = amount(&record.data).ok_or("not {\"amount\": n}")?;
    let name = format!("sum@{}", window.start);
    let sum = number(input, &name)? + n;
    set(input, &name, sum)
}

fn close(window: &ClosedWindow) -> Result<(), String> {
    let name = format!("sum@{}", window.window.start);
    for (i, key) in window.keys.iter().enumerate() {
        let input = i as u32;
        let sum = number(input, &name)?;
        let total = number(input, "total")? + sum;
        set(input, "total", total)?;
        set(input, "windows", number(input, "windows")? + 1)?;
        state::delete(input, &name).map_err(|e| format!("state error: {e:?}"))?;
        log(
            Level::Info,
            &format!(
                "closed key={key} window={}..{} sum={sum} total={total} shard={}",
                window.window.start, window.window.end, window.shard_id
            ),
        );
    }
    Ok(())
}

impl Guest for WindowedBatch {
    fn handle_batch(records: Vec<KinesisRecord>) -> Vec<Outcome> {
        records
            .iter()
            .enumerate()
            .map(|(i, record)| match handle(i as u32, record) {
                Ok(()) => Outcome::Ack,
                Err(e) => {
                    log(Level::Error, &e);
                    Outcome::Retry(e)
                }
            })
            .collect()
    }

    fn close_window(window: ClosedWindow) -> Outcome {
        match close(&window) {
            Ok(()) => Outcome::Ack,
            Err(e) => {
                log(Level::Error, &e);
                Outcome::Retry(e)
            }
        }
    }
}

export!(WindowedBatch);
