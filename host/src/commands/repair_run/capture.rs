//! A dry run's effects ([`Capture`]): outputs and dead letters counted and
//! sampled instead of put.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::channel::Record;
use crate::config::SubscriptionConfig;
use crate::failure::{DeadLetterSink, LastFailure, Put};
use crate::ids::{PartitionKey, StreamName};
use crate::kinesis::KinesisError;
use crate::outputs::PutRecords;
use crate::telemetry::Telemetry;

/// Samples of each stream's captured outputs a dry run prints.
const SAMPLES: usize = 3;

/// One stream's captured outputs: how many, and the first few.
#[derive(Default)]
struct Captured {
    count: u64,
    samples: Vec<(PartitionKey, Vec<u8>)>,
}

/// A dry run's effects: outputs and dead letters counted and sampled,
/// never put.
pub(crate) struct Capture {
    dead_letter_stream: StreamName,
    outputs: Mutex<BTreeMap<StreamName, Captured>>,
    dead_letters: Mutex<(u64, Vec<String>)>,
}

impl Capture {
    pub(crate) fn new(sub: &SubscriptionConfig) -> Self {
        Self {
            dead_letter_stream: sub
                .failure
                .on_failure
                .dead_letter_stream()
                .cloned()
                .unwrap_or_else(|| StreamName::new("-")),
            outputs: Mutex::new(BTreeMap::new()),
            dead_letters: Mutex::new((0, Vec::new())),
        }
    }

    pub(crate) fn lines(&self, t: &Telemetry, sub: &str) -> Vec<String> {
        let mut lines = Vec::new();
        let outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
        if outputs.is_empty() {
            lines.push("dry run: no outputs".to_owned());
        }
        for (stream, Captured { count, samples }) in outputs.iter() {
            lines.push(format!("dry run: {count} outputs for {stream} (not put)"));
            for (key, data) in samples {
                lines.push(format!(
                    "  {}: {}",
                    key.as_str().escape_debug(),
                    String::from_utf8_lossy(data).escape_debug()
                ));
            }
        }
        let (dead, samples) = &*self.dead_letters.lock().unwrap_or_else(|e| e.into_inner());
        lines.push(format!(
            "dry run: {dead} records would be dead-lettered (not put)"
        ));
        for sample in samples {
            lines.push(format!("  {sample}"));
        }
        let keys = t
            .gauge(
                "shardlane_state_keys",
                "Partition keys whose state this instance holds in memory (cached or staged).",
                &[("subscription", sub)],
            )
            .get();
        let bytes = t
            .gauge(
                "shardlane_state_bytes",
                "Bytes (names and values) of the state this instance holds in memory.",
                &[("subscription", sub)],
            )
            .get();
        lines.push(format!(
            "dry run: state of {keys} keys read or written, {bytes} bytes, kept in memory only (nothing written)"
        ));
        lines
    }
}

#[async_trait]
impl PutRecords for Capture {
    async fn put_records(
        &self,
        stream: &StreamName,
        records: &[(PartitionKey, Vec<u8>)],
    ) -> Result<Vec<Result<(), KinesisError>>, KinesisError> {
        let mut outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
        let Captured { count, samples } = outputs.entry(stream.clone()).or_default();
        *count += records.len() as u64;
        for record in records.iter().take(SAMPLES.saturating_sub(samples.len())) {
            samples.push(record.clone());
        }
        Ok(records.iter().map(|_| Ok(())).collect())
    }
}

#[async_trait]
impl DeadLetterSink for Capture {
    fn stream(&self) -> &StreamName {
        &self.dead_letter_stream
    }

    async fn put(&self, record: &Record, failure: LastFailure<'_>) -> Result<Put, KinesisError> {
        let mut dead = self.dead_letters.lock().unwrap_or_else(|e| e.into_inner());
        dead.0 += 1;
        if dead.1.len() < SAMPLES {
            dead.1.push(format!(
                "{} {} {}: {}",
                record.shard,
                record.sequence,
                record.partition_key.as_str().escape_debug(),
                failure.reason.escape_debug()
            ));
        }
        Ok(Put {
            shard: crate::ids::ShardId::new("dry-run"),
            sequence: "dry-run".to_owned(),
            data_omitted: false,
        })
    }
}
