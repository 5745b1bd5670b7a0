//! CloudWatch embedded metric format (EMF) output, for users without
//! Prometheus: every `[metrics] emf_every` the host writes its metrics as
//! EMF JSON lines (to stdout, where CloudWatch Logs — Lambda, ECS's
//! `awslogs`, the CloudWatch agent — turns them into metrics, or to a file
//! the agent tails).
//!
//! Its source is the registry's own Prometheus exposition
//! ([`super::Telemetry::render`]), so EMF shows exactly the series
//! `/metrics` does, under the same names: one document per label set, the
//! labels as dimensions, at most 100 metrics a document (EMF's limit).
//! Counters (and a histogram's `_sum` and `_count`) are sent as what they
//! grew by since the previous document, so CloudWatch's Sum statistic adds
//! up; a counter that restarted (a shard read again) counts from zero.
//! Gauges are sent as they are; histogram buckets are left out. The
//! parser reads the one format `prometheus-client`'s encoder writes (it is
//! the same crate's output, a line per sample): a general Prometheus text
//! parser crate would pull in more than these few lines.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::Telemetry;
use crate::config::{EmfConfig, EmfTarget};

/// Most metrics one EMF document may declare.
const MAX_METRICS: usize = 100;

type Labels = Vec<(String, String)>;

/// One sample of the exposition.
#[derive(Debug, PartialEq)]
struct Sample {
    name: String,
    labels: Labels,
    value: f64,
}

/// Turns successive expositions into EMF documents (module docs).
pub(crate) struct EmfWriter {
    namespace: String,
    /// Each cumulative series' value at the previous document.
    previous: HashMap<(String, Labels), f64>,
}

impl EmfWriter {
    pub(crate) fn new(namespace: String) -> Self {
        Self {
            namespace,
            previous: HashMap::new(),
        }
    }

    /// The EMF documents (one JSON object per line) for `exposition`, taken
    /// at `now_ms`.
    pub(crate) fn documents(&mut self, exposition: &str, now_ms: u64) -> Vec<String> {
        let (kinds, samples) = parse(exposition);
        let mut by_labels: BTreeMap<Labels, Vec<(String, f64)>> = BTreeMap::new();
        for Sample {
            name,
            labels,
            value,
        } in samples
        {
            let Some(cumulative) = cumulative(&kinds, &name) else {
                continue;
            };
            let value = if cumulative {
                let key = (name.clone(), labels.clone());
                let before = self.previous.insert(key, value).unwrap_or(0.0);
                if value >= before {
                    value - before
                } else {
                    value
                }
            } else {
                value
            };
            by_labels.entry(labels).or_default().push((name, value));
        }
        let mut documents = Vec::new();
        for (labels, metrics) in by_labels {
            for chunk in metrics.chunks(MAX_METRICS) {
                let mut doc = Map::new();
                let declared: Vec<Value> = chunk
                    .iter()
                    .map(|(name, _)| json!({"Name": name, "Unit": unit(&kinds, name)}))
                    .collect();
                let dimensions: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
                doc.insert(
                    "_aws".into(),
                    json!({
                        "Timestamp": now_ms,
                        "CloudWatchMetrics": [{
                            "Namespace": self.namespace,
                            "Dimensions": [dimensions],
                            "Metrics": declared,
                        }],
                    }),
                );
                for (k, v) in &labels {
                    doc.insert(k.clone(), Value::from(v.as_str()));
                }
                for (name, value) in chunk {
                    doc.insert(name.clone(), json!(value));
                }
                documents.push(Value::Object(doc).to_string());
            }
        }
        documents
    }
}

/// Whether the series `name` is sent as its growth (counters, histogram
/// sums and counts) or as it is (gauges); `None`: left out (buckets).
fn cumulative(kinds: &HashMap<String, String>, name: &str) -> Option<bool> {
    if let Some(kind) = kinds.get(name) {
        return Some(kind == "counter");
    }
    for part in ["_sum", "_count"] {
        if let Some(family) = name.strip_suffix(part)
            && kinds.get(family).map(String::as_str) == Some("histogram")
        {
            return Some(true);
        }
    }
    None
}

/// The CloudWatch unit of `name`, from its Prometheus conventions.
fn unit(kinds: &HashMap<String, String>, name: &str) -> &'static str {
    let base = name.strip_suffix("_sum").unwrap_or(name);
    if base.ends_with("_seconds") || base.ends_with("_seconds_total") {
        "Seconds"
    } else if base.ends_with("_bytes") {
        "Bytes"
    } else if name.ends_with("_total")
        || name.ends_with("_count")
        || kinds.get(name).is_some_and(|k| k == "counter")
    {
        "Count"
    } else {
        "None"
    }
}

/// The `# TYPE` of every family, and every sample with a finite value.
fn parse(exposition: &str) -> (HashMap<String, String>, Vec<Sample>) {
    let mut kinds = HashMap::new();
    let mut samples = Vec::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                kinds.insert(name.to_owned(), kind.to_owned());
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(sample) = parse_sample(line) {
            samples.push(sample);
        }
    }
    (kinds, samples)
}

/// `name{k="v",...} value` or `name value`.
fn parse_sample(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok().filter(|v: &f64| v.is_finite())?;
    let Some((name, rest)) = series.split_once('{') else {
        return Some(Sample {
            name: series.to_owned(),
            labels: Vec::new(),
            value,
        });
    };
    let mut labels = Vec::new();
    let mut rest = rest.strip_suffix('}')?;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut chars = after.char_indices();
        let mut text = String::new();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => text.push('\n'),
                    c => text.push(c),
                },
                (i, '"') => break i,
                (_, c) => text.push(c),
            }
        };
        labels.push((key.to_owned(), text));
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Writes EMF documents every `config.every` until `stop`, then once more
/// (so what the last moments counted is sent too).
pub(crate) async fn run(telemetry: Arc<Telemetry>, config: EmfConfig, stop: CancellationToken) {
    let mut writer = EmfWriter::new(config.namespace.clone());
    let mut tick = tokio::time::interval(config.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.cancelled() => true,
        };
        let documents = writer.documents(&telemetry.render(), crate::clock::now_ms());
        if let Err(e) = write(&config.to, &documents) {
            tracing::warn!(error = %e, to = ?config.to, "cannot write EMF metrics");
        }
        if last {
            return;
        }
    }
}

fn write(to: &EmfTarget, documents: &[String]) -> std::io::Result<()> {
    let mut text = String::new();
    for doc in documents {
        text.push_str(doc);
        text.push('\n');
    }
    match to {
        EmfTarget::Stdout => std::io::stdout().lock().write_all(text.as_bytes()),
        EmfTarget::File(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?
            .write_all(text.as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: &str = r#"# HELP shardlane_records_total Records handled.
# TYPE shardlane_records_total counter
shardlane_records_total{subscription="a",outcome="ack"} 5
shardlane_records_total{subscription="a",outcome="retry"} 1
# HELP shardlane_leases_held Leases held.
# TYPE shardlane_leases_held gauge
shardlane_leases_held{subscription="a"} 4
# HELP shardlane_handler_duration_seconds Handler call time.
# TYPE shardlane_handler_duration_seconds histogram
shardlane_handler_duration_seconds_bucket{subscription="a",le="0.5"} 2
shardlane_handler_duration_seconds_bucket{subscription="a",le="+Inf"} 2
shardlane_handler_duration_seconds_sum{subscription="a"} 0.25
shardlane_handler_duration_seconds_count{subscription="a"} 2
# HELP process_threads Threads.
# TYPE process_threads gauge
process_threads 7.0
# HELP odd Quotes.
# TYPE odd gauge
odd{k="a \"b\" \\ c",j="x,y"} 1
"#;

    fn docs(writer: &mut EmfWriter, text: &str) -> Vec<Value> {
        writer
            .documents(text, 1_000)
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn one_document_per_label_set_with_counters_as_their_growth() {
        let mut writer = EmfWriter::new("shardlane".into());
        let first = docs(&mut writer, FIRST);
        let ack = first
            .iter()
            .find(|d| d["outcome"] == "ack")
            .expect("the ack series");
        assert_eq!(ack["shardlane_records_total"], 5.0);
        assert_eq!(ack["subscription"], "a");
        let directive = &ack["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "shardlane");
        assert_eq!(
            directive["Dimensions"],
            json!([["subscription", "outcome"]])
        );
        assert_eq!(
            directive["Metrics"],
            json!([{"Name": "shardlane_records_total", "Unit": "Count"}])
        );
        assert_eq!(ack["_aws"]["Timestamp"], 1_000);
        let sub = first
            .iter()
            .find(|d| d.get("shardlane_leases_held").is_some())
            .unwrap();
        assert_eq!(sub["shardlane_leases_held"], 4.0);
        assert_eq!(sub["shardlane_handler_duration_seconds_sum"], 0.25);
        assert_eq!(sub["shardlane_handler_duration_seconds_count"], 2.0);
        assert!(
            sub.get("shardlane_handler_duration_seconds_bucket")
                .is_none(),
            "buckets are left out: {sub}"
        );
        let process = first
            .iter()
            .find(|d| d.get("process_threads").is_some())
            .unwrap();
        assert_eq!(
            process["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([[]])
        );
        let odd = first.iter().find(|d| d.get("odd").is_some()).unwrap();
        assert_eq!(odd["k"], "a \"b\" \\ c");
        assert_eq!(odd["j"], "x,y");

        // Later: counters send what they grew by, a restarted one from
        // zero; gauges as they are.
        let second = FIRST
            .replace("outcome=\"ack\"} 5", "outcome=\"ack\"} 12")
            .replace("outcome=\"retry\"} 1", "outcome=\"retry\"} 0")
            .replace(
                "_sum{subscription=\"a\"} 0.25",
                "_sum{subscription=\"a\"} 1.25",
            );
        let second = docs(&mut writer, &second);
        let value = |outcome: &str| {
            second.iter().find(|d| d["outcome"] == outcome).unwrap()["shardlane_records_total"]
                .clone()
        };
        assert_eq!(value("ack"), 7.0);
        assert_eq!(value("retry"), 0.0);
        let sub = second
            .iter()
            .find(|d| d.get("shardlane_leases_held").is_some())
            .unwrap();
        assert_eq!(sub["shardlane_leases_held"], 4.0);
        assert_eq!(sub["shardlane_handler_duration_seconds_sum"], 1.0);
        assert_eq!(sub["shardlane_handler_duration_seconds_count"], 0.0);
        let units = &sub["_aws"]["CloudWatchMetrics"][0]["Metrics"];
        assert!(
            units.as_array().unwrap().contains(
                &json!({"Name": "shardlane_handler_duration_seconds_sum", "Unit": "Seconds"})
            ),
            "{units}"
        );
    }

    #[test]
    fn a_label_set_with_many_metrics_is_split_at_100() {
        let mut text = String::new();
        for i in 0..150 {
            text.push_str(&format!("# TYPE m{i} gauge\nm{i}{{s=\"a\"}} {i}\n"));
        }
        let documents = docs(&mut EmfWriter::new("n".into()), &text);
        assert_eq!(documents.len(), 2);
        let declared = |d: &Value| {
            d["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
                .len()
        };
        assert_eq!(
            (declared(&documents[0]), declared(&documents[1])),
            (100, 50)
        );
    }
}
