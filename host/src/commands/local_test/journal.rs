//! What `shardlane test` shows of a run: every handler call as it
//! happens — each record's outcome (or the call's failure), the outputs
//! and state writes it made — the records the filter kept out, the dead
//! letters, and the state after the run, as text or as JSON lines
//! ([`Journal`]).
//!
//! It sees the run from the outside of the real stages: [`Journaled`]
//! wraps the plugin slot (the dispatch seam, [`HandlerFactory`]) and
//! notes what each call answered before the lane acts on it, and the
//! journal is the pipeline's effects ([`PutRecords`] for outputs,
//! [`DeadLetterSink`] for dead letters), so nothing leaves the process.
//! Outputs and state writes of an attempt that does not ack are shown as
//! discarded, as the host discards them.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Value as Json, json};

use crate::channel::{Record, WindowClose};
use crate::dispatch::{CallError, Handled, Handler, HandlerFactory, Outcome, Output};
use crate::failure::{DeadLetterSink, LastFailure, Put};
use crate::ids::{LaneId, PartitionKey, PluginDigest, ShardId, StreamName};
use crate::kinesis::{Fetched, KinesisError};
use crate::outputs::PutRecords;
use crate::state::{CallState, KeyState};

/// How the journal is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Style {
    /// Lines for a person.
    Text,
    /// One JSON object per line, each with an `event`.
    Json,
}

/// What the journal saw, counted: the summary's `counts`, and what
/// `--strict` fails on (rejects, failed calls).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(super) struct Counts {
    /// Handler calls.
    pub calls: u64,
    /// Records acked (an attempt each).
    pub ack: u64,
    /// Attempts that ended in `retry`.
    pub retry: u64,
    /// Records the handler rejected.
    pub reject: u64,
    /// Calls that trapped, timed out or answered wrongly.
    pub failed_calls: u64,
    /// Records put to the dead-letter stream (shown, not put).
    pub dead_lettered: u64,
    /// Records the filter kept out.
    pub filtered: u64,
    /// Window closes called (each attempt).
    pub closes: u64,
}

/// The run's journal (module docs): printed to stdout as it goes.
pub(super) struct Journal {
    style: Style,
    dead_letter_stream: StreamName,
    counts: Mutex<Counts>,
    out: Mutex<std::io::Stdout>,
}

impl Journal {
    /// A journal printed in `style`; `dead_letter_stream` is what the
    /// failure policy puts to (shown, never put).
    pub(super) fn new(style: Style, dead_letter_stream: StreamName) -> Self {
        Self {
            style,
            dead_letter_stream,
            counts: Mutex::new(Counts::default()),
            out: Mutex::new(std::io::stdout()),
        }
    }

    /// What it counted so far.
    pub(super) fn counts(&self) -> Counts {
        *self.tally()
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prints one event: `text` lines, or `json` as one line.
    fn print(&self, text: &[String], json: &Json) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // stdout gone (a closed pipe): nothing to tell anyone.
        let _ = match self.style {
            Style::Text => text.iter().try_for_each(|line| writeln!(out, "{line}")),
            Style::Json => writeln!(out, "{json}"),
        };
    }

    /// A record the subscription's filter kept out.
    pub(super) fn filtered(&self, shard: &ShardId, record: &Fetched) {
        self.tally().filtered += 1;
        let at = format!("{shard}/{}", record.sequence);
        self.print(
            &[format!(
                "{at} key {:?}: filtered (matches no pattern; settled without a call)",
                record.partition_key.as_str()
            )],
            &json!({
                "event": "filtered",
                "shard": shard.as_str(),
                "sequence": record.sequence.as_str(),
                "key": record.partition_key.as_str(),
            }),
        );
    }

    /// One call's answer, before the lane acts on it.
    fn call(
        &self,
        lane: LaneId,
        records: &[(Arc<Record>, u32)],
        answer: Result<(Vec<Outcome>, &[Output]), &CallError>,
        state: &CallState,
    ) {
        let batch = records.len() > 1;
        let mut text = Vec::new();
        if batch {
            text.push(format!(
                "{} records in one call (lane {})",
                records.len(),
                lane.0
            ));
        }
        let indent = if batch { "  " } else { "" };
        let writes = state.deltas();
        let mut entries = Vec::new();
        for (index, (record, attempt)) in records.iter().enumerate() {
            let said = match &answer {
                Ok((outcomes, _)) => outcomes.get(index).map_or_else(
                    || "not reached (the run stopped before it: delivered again)".to_owned(),
                    outcome_text,
                ),
                Err(e) => format!("failed: {e}"),
            };
            let acked = matches!(&answer, Ok((o, _)) if o.get(index) == Some(&Outcome::Ack));
            let kept = if acked { "" } else { " (discarded)" };
            text.push(format!(
                "{indent}{}/{} key {:?} attempt {attempt}: {said}",
                record.shard,
                record.sequence,
                record.partition_key.as_str()
            ));
            let outputs: Vec<&Output> = match &answer {
                Ok((_, outputs)) => outputs
                    .iter()
                    .filter(|o| o.input as usize == index)
                    .collect(),
                Err(_) => Vec::new(),
            };
            let written = writes.get(index).cloned().unwrap_or_default();
            Self::effect_lines(&mut text, indent, kept, &outputs, &written);
            entries.push(json!({
                "shard": record.shard.as_str(),
                "sequence": record.sequence.as_str(),
                "key": record.partition_key.as_str(),
                "attempt": attempt,
                "outcome": match &answer {
                    Ok((outcomes, _)) => outcomes.get(index).map_or(Json::Null, outcome_json),
                    Err(e) => json!({"failed": e.to_string()}),
                },
                "kept": acked,
                "outputs": outputs.iter().map(|o| json!({
                    "stream": o.stream.as_str(),
                    "key": o.partition_key.as_str(),
                    "data": data_json(&o.data),
                })).collect::<Vec<_>>(),
                "state": written.iter().map(|(name, value)| json!({
                    "name": name,
                    "value": value.as_ref().map_or(Json::Null, |v| data_json(&v.data)),
                })).collect::<Vec<_>>(),
            }));
        }
        self.count(&answer);
        self.print(
            &text,
            &json!({"event": "call", "lane": lane.0, "records": entries}),
        );
    }

    /// The lines of one input's outputs and state writes.
    fn effect_lines(
        text: &mut Vec<String>,
        indent: &str,
        kept: &str,
        outputs: &[&Output],
        written: &crate::state::Delta,
    ) {
        for o in outputs {
            text.push(output_line(indent, o, kept));
        }
        for (name, value) in written {
            let value = value
                .as_ref()
                .map_or_else(|| "(deleted)".to_owned(), |v| shown(&v.data));
            text.push(format!("{indent}  state {name:?} = {value}{kept}"));
        }
    }

    /// A window's close and its answer, before the lane acts on it.
    fn closed(
        &self,
        close: &WindowClose,
        attempt: u32,
        answer: Result<(Outcome, &[Output]), &CallError>,
        state: &CallState,
    ) {
        let said = match &answer {
            Ok((outcome, _)) => outcome_text(outcome),
            Err(e) => format!("failed: {e}"),
        };
        let acked = matches!(&answer, Ok((Outcome::Ack, _)));
        let kept = if acked { "" } else { " (discarded)" };
        let window = format!("{}..{}", close.window.start, close.window.end);
        let mut text = vec![format!(
            "{} window {window} closed, keys {:?}, attempt {attempt}: {said}",
            close.shard,
            close.keys.iter().map(|k| k.as_str()).collect::<Vec<_>>()
        )];
        let outputs: &[Output] = match &answer {
            Ok((_, outputs)) => outputs,
            Err(_) => &[],
        };
        for o in outputs {
            text.push(output_line("", o, kept));
        }
        let writes = state.deltas();
        let mut written = Vec::new();
        for (index, key) in close.keys.iter().enumerate() {
            for (name, value) in writes.get(index).cloned().unwrap_or_default() {
                let value = value.as_ref().map(|v| v.data.clone());
                let shown_value = value
                    .as_deref()
                    .map_or_else(|| "(deleted)".to_owned(), shown);
                text.push(format!(
                    "  state of {:?}: {name:?} = {shown_value}{kept}",
                    key.as_str()
                ));
                written.push(json!({
                    "key": key.as_str(),
                    "name": name,
                    "value": value.as_deref().map_or(Json::Null, data_json),
                }));
            }
        }
        {
            let mut counts = self.tally();
            counts.closes += 1;
        }
        self.print(
            &text,
            &json!({
                "event": "close",
                "shard": close.shard.as_str(),
                "window": {"start": close.window.start, "end": close.window.end},
                "keys": close.keys.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
                "attempt": attempt,
                "outcome": match &answer {
                    Ok((outcome, _)) => outcome_json(outcome),
                    Err(e) => json!({"failed": e.to_string()}),
                },
                "kept": acked,
                "outputs": outputs.iter().map(|o| json!({
                    "stream": o.stream.as_str(),
                    "key": o.partition_key.as_str(),
                    "data": data_json(&o.data),
                })).collect::<Vec<_>>(),
                "state": written,
            }),
        );
    }

    fn count(&self, answer: &Result<(Vec<Outcome>, &[Output]), &CallError>) {
        let mut counts = self.tally();
        counts.calls += 1;
        match answer {
            Ok((outcomes, _)) => {
                for outcome in outcomes {
                    match outcome {
                        Outcome::Ack => counts.ack += 1,
                        Outcome::Retry(_) => counts.retry += 1,
                        Outcome::Reject(_) => counts.reject += 1,
                    }
                }
            }
            Err(_) => counts.failed_calls += 1,
        }
    }

    /// The summary lines and the committed state after the run.
    pub(super) fn finish(&self, summary: &[String], state: &[(PartitionKey, KeyState)]) {
        let mut text = summary.to_vec();
        if !state.is_empty() {
            text.push("state after the run:".to_owned());
        }
        let mut keys = BTreeMap::new();
        for (key, values) in state {
            let mut named = serde_json::Map::new();
            for (name, value) in values.iter() {
                text.push(format!(
                    "  {:?} {name:?} = {}",
                    key.as_str(),
                    shown(&value.data)
                ));
                named.insert(name.to_owned(), data_json(&value.data));
            }
            keys.insert(key.as_str().to_owned(), Json::Object(named));
        }
        let counts = self.counts();
        self.print(
            &text,
            &json!({"event": "summary", "counts": counts, "lines": summary, "state": keys}),
        );
    }
}

/// An outcome as a line says it.
fn outcome_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Ack => "ack".to_owned(),
        Outcome::Retry(reason) => format!("retry: {reason}"),
        Outcome::Reject(reason) => format!("reject: {reason}"),
    }
}

fn outcome_json(outcome: &Outcome) -> Json {
    match outcome {
        Outcome::Ack => json!("ack"),
        Outcome::Retry(reason) => json!({"retry": reason}),
        Outcome::Reject(reason) => json!({"reject": reason}),
    }
}

/// One output as a text line (`kept`: empty, or why it is not kept).
fn output_line(indent: &str, o: &Output, kept: &str) -> String {
    format!(
        "{indent}  output to {} key {:?}: {}{kept}",
        o.stream,
        o.partition_key.as_str(),
        shown(&o.data)
    )
}

/// Bytes as a line shows them: text as it is (quoted), other bytes as hex.
pub(super) fn shown(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!(
            "0x{}",
            data.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

/// Bytes in JSON: a string when they are UTF-8, else `{"base64": …}`.
fn data_json(data: &[u8]) -> Json {
    match std::str::from_utf8(data) {
        Ok(text) => json!(text),
        Err(_) => json!({"base64": aws_smithy_types::base64::encode(data)}),
    }
}

/// The plugin slot with every call noted in the journal (module docs).
pub(super) struct Journaled<F> {
    /// The slot.
    pub inner: Arc<F>,
    /// Where calls are noted.
    pub journal: Arc<Journal>,
}

impl<F: HandlerFactory> HandlerFactory for Journaled<F> {
    type Handler = JournaledHandler<F::Handler>;
    type Error = F::Error;

    async fn create(&self, lane: LaneId) -> Result<Self::Handler, F::Error> {
        Ok(JournaledHandler {
            inner: self.inner.create(lane).await?,
            journal: self.journal.clone(),
            lane,
        })
    }

    fn generation(&self) -> u64 {
        self.inner.generation()
    }
}

/// One lane's instance, its calls noted.
pub(super) struct JournaledHandler<H> {
    inner: H,
    journal: Arc<Journal>,
    lane: LaneId,
}

impl<H: Handler> Handler for JournaledHandler<H> {
    async fn handle(
        &mut self,
        record: &Arc<Record>,
        attempt: u32,
        state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        let result = self.inner.handle(record, attempt, state).await;
        let records = [(record.clone(), attempt)];
        let answer = match &result {
            Ok(h) => Ok((vec![h.outcome.clone()], h.outputs.as_slice())),
            Err(e) => Err(e),
        };
        self.journal.call(self.lane, &records, answer, state);
        result
    }

    async fn handle_batch(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        let result = self.inner.handle_batch(records, state).await;
        let answer = match &result {
            Ok(h) => Ok((h.outcome.clone(), h.outputs.as_slice())),
            Err(e) => Err(e),
        };
        self.journal.call(self.lane, records, answer, state);
        result
    }

    fn max_run(&self) -> usize {
        self.inner.max_run()
    }

    async fn handle_run(
        &mut self,
        records: &[(Arc<Record>, u32)],
        state: &mut CallState,
    ) -> Result<Handled<Vec<Outcome>>, CallError> {
        let result = self.inner.handle_run(records, state).await;
        let answer = match &result {
            Ok(h) => Ok((h.outcome.clone(), h.outputs.as_slice())),
            Err(e) => Err(e),
        };
        self.journal.call(self.lane, records, answer, state);
        result
    }

    async fn close_window(
        &mut self,
        close: &Arc<WindowClose>,
        attempt: u32,
        state: &mut CallState,
    ) -> Result<Handled<Outcome>, CallError> {
        let result = self.inner.close_window(close, attempt, state).await;
        let answer = match &result {
            Ok(h) => Ok((h.outcome.clone(), h.outputs.as_slice())),
            Err(e) => Err(e),
        };
        self.journal.closed(close, attempt, answer, state);
        result
    }

    fn version(&self, record: &Record) -> Option<PluginDigest> {
        self.inner.version(record)
    }
}

#[async_trait]
impl PutRecords for Journal {
    async fn put_records(
        &self,
        _: &StreamName,
        records: &[(PartitionKey, Vec<u8>)],
    ) -> Result<Vec<Result<(), KinesisError>>, KinesisError> {
        // Shown with the call that made them; counted by the output stage.
        Ok(records.iter().map(|_| Ok(())).collect())
    }
}

#[async_trait]
impl DeadLetterSink for Journal {
    fn stream(&self) -> &StreamName {
        &self.dead_letter_stream
    }

    async fn put(&self, record: &Record, failure: LastFailure<'_>) -> Result<Put, KinesisError> {
        self.tally().dead_lettered += 1;
        self.print(
            &[format!(
                "{}/{} key {:?}: dead-lettered to {} (not put): {}",
                record.shard,
                record.sequence,
                record.partition_key.as_str(),
                self.dead_letter_stream,
                failure.reason
            )],
            &json!({
                "event": "dead_letter",
                "shard": record.shard.as_str(),
                "sequence": record.sequence.as_str(),
                "key": record.partition_key.as_str(),
                "stream": self.dead_letter_stream.as_str(),
                "reason": failure.reason,
            }),
        );
        Ok(Put {
            shard: ShardId::new("local"),
            sequence: "local".to_owned(),
            data_omitted: false,
        })
    }
}
