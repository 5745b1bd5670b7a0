//! The windowed-totals plugin (contract `shardlane:plugin@0.3.0`, world
//! `windowed-record-handler`), for a subscription with
//! `window = { size = "60s", by = "key" }`:
//! - `handle` (made `handle-run` by the guest library, `shardlane-guest`):
//!   for each record `{"amount": <integer>}` in a window,
//!   adds the amount to the key's `sum` in per-key state (decimal text); a
//!   record in no window (late) is logged `late key=<key> amount=<n>` and
//!   acked; data that is not such JSON is rejected.
//! - `close-window`: for each key of the closed window, logs `window
//!   key=<key> start=<start> end=<end> sum=<sum>`, publishes `{"key":
//!   <key>, "start": <start>, "end": <end>, "sum": <sum>, "id":
//!   "<shard>/<start>/<key>"}` to the stream named by config
//!   `output_stream` when there is one, and deletes the key's `sum`.
//!
//! The host commits a window's state writes — its records' and its
//! close's — exactly once, with the checkpoint that passes the window: a
//! crash re-reads the window and closes it again with the same sum. The
//! published sums are at least once (`id` names the window).

wit_bindgen::generate!({
    world: "windowed-record-handler",
    path: "../../../wit",
    generate_all,
});

use shardlane::plugin::log::{Level, log};
use shardlane::plugin::outputs::publish;
use shardlane::plugin::state;
use wasi::config::store;

struct WindowedTotals;

/// The integer `amount` of a JSON object.
fn amount_of(data: &[u8]) -> Option<i64> {
    serde_json::from_slice::<serde_json::Value>(data)
        .ok()?
        .get("amount")?
        .as_i64()
}

/// The key's `sum` of input `input`, 0 when there is none.
fn sum_of(input: u32) -> Result<i64, String> {
    match state::get(input, "sum") {
        Ok(None) => Ok(0),
        Ok(Some(bytes)) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| "the stored sum is not an integer".to_owned()),
        Err(e) => Err(format!("cannot read state: {e:?}")),
    }
}

fn add(input: u32, record: &RunRecord) -> Outcome {
    let Some(amount) = amount_of(&record.data) else {
        return Outcome::Reject("data is not {\"amount\": <integer>}".into());
    };
    if record.window.is_none() {
        log(
            Level::Info,
            &format!("late key={} amount={amount}", record.partition_key),
        );
        return Outcome::Ack;
    }
    let sum = match sum_of(input) {
        Ok(sum) => sum + amount,
        Err(e) => return Outcome::Retry(e),
    };
    match state::set(input, "sum", sum.to_string().as_bytes()) {
        Ok(()) => Outcome::Ack,
        Err(e) => Outcome::Reject(format!("cannot write state: {e:?}")),
    }
}

fn close(window: &ClosedWindow) -> Result<(), String> {
    let (start, end) = (window.window.start, window.window.end);
    let stream = store::get("output_stream").map_err(|e| format!("cannot read config: {e:?}"))?;
    for (i, key) in window.keys.iter().enumerate() {
        let input = i as u32;
        let sum = sum_of(input)?;
        log(
            Level::Info,
            &format!("window key={key} start={start} end={end} sum={sum}"),
        );
        if let Some(stream) = &stream {
            let output = serde_json::json!({
                "key": key,
                "start": start,
                "end": end,
                "sum": sum,
                "id": format!("{}/{start}/{key}", window.shard_id),
            });
            publish(input, stream, key, output.to_string().as_bytes())
                .map_err(|e| format!("cannot publish: {e:?}"))?;
        }
        state::delete(input, "sum").map_err(|e| format!("cannot write state: {e:?}"))?;
    }
    Ok(())
}

impl WindowedTotals {
    fn handle(_run: &RunContext, input: u32, record: RunRecord) -> Outcome {
        add(input, &record)
    }

    fn close_window(window: ClosedWindow) -> Outcome {
        match close(&window) {
            Ok(()) => Outcome::Ack,
            Err(e) => Outcome::Retry(e),
        }
    }
}

// `handle-run` from `handle`, one record at a time (the guest library).
shardlane_guest::export_runs!(WindowedTotals, windowed);
export!(WindowedTotals);
