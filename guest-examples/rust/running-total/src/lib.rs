//! The running-total plugin (contract `shardlane:plugin@0.2.0`): for each
//! record `{"amount": <integer>}`, adds the amount to the total kept in
//! per-key state under the record's partition key (`state`, value `total`,
//! decimal text), logs `total key=<key> total=<total>`, publishes
//! `{"key": <key>, "total": <total>, "id": "<shard>/<sequence>[/<sub>]"}`
//! to the stream named by config `output_stream` when there is one, and
//! acks. Data that is not such JSON is rejected.
//!
//! The host applies each record's state writes exactly once with the
//! checkpoint: after a crash or a hand-over the total is neither short of
//! an amount nor counts one twice. The published totals are at least once
//! (`id` names the input, to drop duplicates).

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.2.0",
    generate_all,
});

use shardlane::plugin::log::{Level, log};
use shardlane::plugin::outputs::publish;
use shardlane::plugin::state;
use wasi::config::store;

struct RunningTotal;

impl Guest for RunningTotal {
    fn handle(record: KinesisRecord) -> Outcome {
        let amount = match serde_json::from_slice::<serde_json::Value>(&record.data)
            .ok()
            .and_then(|v| v.get("amount").and_then(serde_json::Value::as_i64))
        {
            Some(amount) => amount,
            None => return Outcome::Reject("data is not {\"amount\": <integer>}".into()),
        };
        let total = match state::get(0, "total") {
            Ok(None) => 0,
            Ok(Some(bytes)) => match std::str::from_utf8(&bytes).ok().and_then(|t| t.parse::<i64>().ok()) {
                Some(total) => total,
                None => return Outcome::Reject("the stored total is not an integer".into()),
            },
            Err(e) => return Outcome::Retry(format!("cannot read state: {e:?}")),
        } + amount;
        if let Err(e) = state::set(0, "total", total.to_string().as_bytes()) {
            return Outcome::Reject(format!("cannot write state: {e:?}"));
        }
        log(Level::Info, &format!("total key={} total={total}", record.partition_key));
        if let Ok(Some(stream)) = store::get("output_stream") {
            let id = match record.sub_sequence_number {
                Some(sub) => format!("{}/{}/{sub}", record.shard_id, record.sequence_number),
                None => format!("{}/{}", record.shard_id, record.sequence_number),
            };
            let output = serde_json::json!({"key": record.partition_key, "total": total, "id": id});
            if let Err(e) = publish(0, &stream, &record.partition_key, output.to_string().as_bytes()) {
                return Outcome::Reject(format!("cannot publish: {e:?}"));
            }
        }
        Outcome::Ack
    }
}

export!(RunningTotal);
