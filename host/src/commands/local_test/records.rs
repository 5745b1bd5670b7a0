//! The records `shardlane test` runs a plugin over: JSON lines read from
//! a file or stdin ([`parse`]), served as a stream of closed shards
//! ([`LocalStream`]) through the same seams the pipeline reads Kinesis
//! through — the keeper's [`ShardSource`] and the readers'
//! [`ShardReads`] — so the records take the path they take in the
//! service: reader (filter, KPL), channel, dispatch, settlement.
//!
//! One line is one record:
//!
//! ```json
//! {"key": "k1", "data": "any text"}
//! {"key": "k1", "data": {"kind": "order", "amount": 120}}
//! {"key": "k2", "data_base64": "AAEC", "arrival": "2026-12-07T10:00:05Z", "shard": "shardId-000000000001"}
//! ```
//!
//! `data` is text, or any other JSON value (written as its JSON text);
//! `data_base64` is bytes. `arrival` is milliseconds since the Unix epoch
//! or an RFC 3339 time (default: when the file was read). `shard` groups
//! records into shards (default `shardId-000000000000`); each shard's
//! records get sequence numbers 1, 2, … in file order. Every shard is
//! closed: once its records are read it ends, as a shard closed by a
//! reshard does, and the run is over when every shard's end is
//! checkpointed.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::ids::{PartitionKey, SequenceNumber, ShardId, StreamName};
use crate::kinesis::{Fetched, KinesisError, Page, ReadFrom, ShardInfo};
use crate::lease::ShardSource;
use crate::reader::ShardReads;

/// The shard a line without `shard` belongs to.
pub(super) const DEFAULT_SHARD: &str = "shardId-000000000000";

/// One line as written.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    key: String,
    #[serde(default)]
    data: Option<serde_json::Value>,
    #[serde(default)]
    data_base64: Option<String>,
    #[serde(default)]
    arrival: Option<serde_json::Value>,
    #[serde(default)]
    shard: Option<String>,
}

/// Records by shard, in file order.
#[derive(Debug, Default)]
pub(super) struct LocalStream {
    shards: BTreeMap<ShardId, Vec<Fetched>>,
}

impl LocalStream {
    /// Every record, by shard, in order.
    pub(super) fn shards(&self) -> &BTreeMap<ShardId, Vec<Fetched>> {
        &self.shards
    }

    /// How many records it holds.
    pub(super) fn len(&self) -> usize {
        self.shards.values().map(Vec::len).sum()
    }
}

/// The records of `text` (JSON lines; blank lines are skipped), arriving
/// at `now_ms` unless a line says otherwise; `source` names the input in
/// errors.
///
/// # Errors
/// One line naming the input, the line number and what is wrong with it.
pub(super) fn parse(text: &str, source: &str, now_ms: u64) -> anyhow::Result<LocalStream> {
    let mut stream = LocalStream::default();
    for (number, text) in (1..).zip(text.lines()) {
        if text.trim().is_empty() {
            continue;
        }
        let (shard, record) =
            record(text, now_ms).map_err(|e| anyhow::anyhow!("{source}, line {number}: {e}"))?;
        let records = stream.shards.entry(shard).or_default();
        records.push(Fetched {
            sequence: SequenceNumber::parse(&(records.len() + 1).to_string())?,
            ..record
        });
    }
    anyhow::ensure!(stream.len() > 0, "{source}: no records");
    Ok(stream)
}

/// One line's record (its sequence number set by the caller).
fn record(text: &str, now_ms: u64) -> Result<(ShardId, Fetched), String> {
    let line: Line = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if line.key.is_empty() || line.key.chars().count() > 256 {
        return Err(format!(
            "key {:?}: a partition key has 1 to 256 characters",
            line.key
        ));
    }
    let data = match (line.data, line.data_base64) {
        (Some(serde_json::Value::String(text)), None) => text.into_bytes(),
        (Some(value), None) => value.to_string().into_bytes(),
        (None, Some(b64)) => aws_smithy_types::base64::decode(&b64)
            .map_err(|_| format!("data_base64 {b64:?} is not base64"))?,
        (None, None) => return Err("no data (give data or data_base64)".to_owned()),
        (Some(_), Some(_)) => return Err("both data and data_base64: give one".to_owned()),
    };
    let arrival_ms = match line.arrival {
        None => now_ms,
        Some(value) => arrival(&value)?,
    };
    let shard = match line.shard {
        None => ShardId::new(DEFAULT_SHARD),
        Some(shard) if !shard.is_empty() && shard.len() <= 128 => ShardId::new(shard),
        Some(shard) => return Err(format!("shard {shard:?}: 1 to 128 characters")),
    };
    Ok((
        shard,
        Fetched {
            partition_key: PartitionKey::new(line.key),
            sequence: SequenceNumber::parse("0").map_err(|e| e.to_string())?,
            arrival_ms,
            data,
        },
    ))
}

/// `arrival`: milliseconds since the epoch, or an RFC 3339 time.
fn arrival(value: &serde_json::Value) -> Result<u64, String> {
    match value {
        serde_json::Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("arrival {n}: milliseconds since the Unix epoch, 0 or more")),
        serde_json::Value::String(text) => humantime::parse_rfc3339_weak(text)
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| u64::try_from(d.as_millis()).ok())
            .ok_or_else(|| format!("arrival {text:?}: not an RFC 3339 time")),
        other => Err(format!(
            "arrival {other}: milliseconds since the Unix epoch, or an RFC 3339 time"
        )),
    }
}

/// Iterators are `<shard>/<index of the next record>`.
fn iterator(shard: &ShardId, index: usize) -> String {
    format!("{shard}/{index}")
}

#[async_trait]
impl ShardSource for LocalStream {
    async fn list_shards(&self, _: &StreamName) -> Result<Vec<ShardInfo>, KinesisError> {
        Ok(self
            .shards
            .keys()
            .map(|id| ShardInfo {
                id: id.clone(),
                parent: None,
                adjacent_parent: None,
                closed: true,
                hash_keys: None,
            })
            .collect())
    }
}

#[async_trait]
impl ShardReads for LocalStream {
    async fn open_iterator(
        &self,
        _: &StreamName,
        shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<String, KinesisError> {
        let records = self
            .shards
            .get(shard)
            .ok_or_else(|| KinesisError::Malformed(format!("no shard {shard}")))?;
        let index = match from {
            ReadFrom::Start(_) => 0,
            ReadFrom::After(position) => {
                records.partition_point(|r| &r.sequence <= position.sequence())
            }
            ReadFrom::At(sequence) => records.partition_point(|r| &r.sequence < sequence),
        };
        Ok(iterator(shard, index))
    }

    async fn get_records(&self, at: &str, limit: i32) -> Result<Page, KinesisError> {
        let malformed = || KinesisError::Malformed(format!("iterator {at:?}"));
        let (shard, index) = at.rsplit_once('/').ok_or_else(malformed)?;
        let index: usize = index.parse().map_err(|_| malformed())?;
        let shard = ShardId::new(shard);
        let records = self.shards.get(&shard).ok_or_else(malformed)?;
        let end = records
            .len()
            .min(index + usize::try_from(limit.max(1)).unwrap_or(1));
        let page = records.get(index..end).unwrap_or_default().to_vec();
        Ok(Page {
            records: page,
            // The end of a closed shard: the reader checkpoints SHARD_END
            // once everything before it settled.
            next_iterator: (end < records.len()).then(|| iterator(&shard, end)),
            millis_behind: Some(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StartPosition;

    /// Catches: lines read into the wrong shard, order, data or arrival;
    /// a bad line accepted, or rejected without its line number.
    #[test]
    fn lines_become_records_by_shard_in_order() {
        let text = r#"{"key": "a", "data": "one"}

{"key": "b", "data": {"n": 2}, "shard": "s1", "arrival": 1700000000000}
{"key": "a", "data_base64": "AAE=", "arrival": "2026-12-07T10:00:00Z"}
"#;
        let stream = parse(text, "records.jsonl", 42).unwrap();
        let shard0 = &stream.shards()[&ShardId::new(DEFAULT_SHARD)];
        assert_eq!(shard0.len(), 2);
        assert_eq!(shard0[0].data, b"one");
        assert_eq!(shard0[0].arrival_ms, 42);
        assert_eq!(shard0[0].sequence.as_str(), "1");
        assert_eq!(shard0[1].data, [0, 1]);
        assert_eq!(shard0[1].arrival_ms, 1_796_637_600_000);
        assert_eq!(shard0[1].sequence.as_str(), "2");
        let s1 = &stream.shards()[&ShardId::new("s1")];
        assert_eq!(s1[0].data, br#"{"n":2}"#);
        assert_eq!(s1[0].arrival_ms, 1_700_000_000_000);

        for (bad, says) in [
            (r#"{"key": "a"}"#, "line 1: no data"),
            (r#"{"key": "", "data": "x"}"#, "partition key"),
            (r#"{"key": "a", "data": "x", "colour": 1}"#, "unknown field"),
            (r#"{"key": "a", "data_base64": "%%"}"#, "not base64"),
            (
                r#"{"key": "a", "data": "x", "arrival": "soon"}"#,
                "RFC 3339",
            ),
            ("", "no records"),
        ] {
            let e = parse(bad, "in", 0).unwrap_err().to_string();
            assert!(e.starts_with("in"), "{e}");
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// Catches: a reader that re-opens after a position reading a record
    /// twice or skipping one, or a shard that never ends.
    #[tokio::test]
    async fn a_shard_is_read_in_pages_from_any_position_to_its_end() {
        let text = (0..5)
            .map(|i| format!(r#"{{"key": "k", "data": "{i}"}}"#))
            .collect::<Vec<_>>()
            .join("\n");
        let stream = parse(&text, "in", 0).unwrap();
        let shard = ShardId::new(DEFAULT_SHARD);
        let name = StreamName::new("s");
        let listed = stream.list_shards(&name).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].closed);

        let from = ReadFrom::Start(StartPosition::TrimHorizon);
        let mut at = Some(stream.open_iterator(&name, &shard, &from).await.unwrap());
        let mut read = Vec::new();
        while let Some(it) = at {
            let page = stream.get_records(&it, 2).await.unwrap();
            read.extend(page.records.iter().map(|r| r.data.clone()));
            at = page.next_iterator;
        }
        assert_eq!(read, [b"0", b"1", b"2", b"3", b"4"]);

        let third = stream.shards()[&shard][2].sequence.clone();
        let after = ReadFrom::After(crate::ids::Position::whole(third.clone()));
        let it = stream.open_iterator(&name, &shard, &after).await.unwrap();
        let page = stream.get_records(&it, 10).await.unwrap();
        assert_eq!(page.records[0].data, b"3");
        assert!(page.next_iterator.is_none());
        let it = stream
            .open_iterator(&name, &shard, &ReadFrom::At(third))
            .await
            .unwrap();
        assert_eq!(
            stream.get_records(&it, 1).await.unwrap().records[0].data,
            b"2"
        );
    }
}
