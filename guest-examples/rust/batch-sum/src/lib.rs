//! The batch-sum plugin: reads each record's data as JSON `{"amount": n}`
//! with an integer n, logs the batch's sum, acks the valid records and
//! rejects the others (one outcome per record).

wit_bindgen::generate!({
    world: "batch-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

const INVALID: &str = r#"expected {"amount": <integer>}"#;

struct BatchSum;

/// The record's amount, when its data is `{"amount": <integer>}`. As in
/// JavaScript and Python, a number with a zero fraction (`5.0`, `1e3`) is
/// an integer.
fn amount(data: &[u8]) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_slice(data).ok()?;
    let amount = value.as_object()?.get("amount")?;
    amount.as_i64().or_else(|| {
        amount
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
            .map(|f| f as i64)
    })
}

impl Guest for BatchSum {
    fn handle_batch(records: Vec<KinesisRecord>) -> Vec<Outcome> {
        let mut sum = 0i64;
        let mut valid = 0usize;
        let outcomes: Vec<Outcome> = records
            .iter()
            .map(|record| match amount(&record.data) {
                Some(n) => {
                    sum += n;
                    valid += 1;
                    Outcome::Ack
                }
                None => Outcome::Reject(INVALID.to_owned()),
            })
            .collect();
        log(
            Level::Info,
            &format!(
                "batch-sum records={} valid={valid} sum={sum}",
                records.len()
            ),
        );
        outcomes
    }
}

export!(BatchSum);
