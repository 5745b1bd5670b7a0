//! KPL aggregates for tests, made by AWS's own aggregation library (PyPI
//! `aws-kinesis-agg`, run by `tests/tools/kpl_aggregate.py` in the tools
//! venv), and put into a stream as the KPL would put them.

use std::io::Write as _;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};
use aws_sdk_kinesis::primitives::Blob;
use aws_smithy_types::base64;

use crate::{Kinesis, repo_root, tools_python};

/// One user record to aggregate.
#[derive(Debug, Clone)]
pub struct UserRecord {
    /// Its partition key.
    pub key: String,
    /// Its explicit hash key (a decimal 128-bit number), if any.
    pub explicit_hash_key: Option<String>,
    /// Its data.
    pub data: Vec<u8>,
}

impl UserRecord {
    /// A user record with no explicit hash key.
    pub fn new(key: impl Into<String>, data: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            explicit_hash_key: None,
            data: data.into(),
        }
    }
}

/// A Kinesis record as the KPL would put it: the container's partition key
/// and explicit hash key, and the aggregate's bytes.
#[derive(Debug, Clone)]
pub struct Aggregate {
    /// The container's partition key (the library's choice).
    pub key: String,
    /// The container's explicit hash key, if any.
    pub explicit_hash_key: Option<String>,
    /// The aggregate: magic, protobuf, MD5.
    pub data: Vec<u8>,
}

/// Aggregates each group of user records into one Kinesis record.
///
/// # Errors
/// When the tools venv or the library fails.
pub fn aggregate(groups: &[Vec<UserRecord>]) -> anyhow::Result<Vec<Aggregate>> {
    let input: Vec<Vec<serde_json::Value>> = groups
        .iter()
        .map(|g| {
            g.iter()
                .map(|u| {
                    serde_json::json!({
                        "key": u.key,
                        "explicit_hash_key": u.explicit_hash_key,
                        "data_base64": base64::encode(&u.data),
                    })
                })
                .collect()
        })
        .collect();
    let mut child = Command::new(tools_python()?)
        .arg(repo_root().join("tests/tools/kpl_aggregate.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("run tests/tools/kpl_aggregate.py")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(&serde_json::to_vec(&input)?)?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kpl_aggregate.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let made: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    made.iter()
        .map(|a| {
            Ok(Aggregate {
                key: a["key"].as_str().context("key")?.to_owned(),
                explicit_hash_key: a["explicit_hash_key"].as_str().map(str::to_owned),
                data: base64::decode(a["data_base64"].as_str().context("data")?)?,
            })
        })
        .collect()
}

impl Kinesis {
    /// Puts one record (PutRecord), with an explicit hash key if given;
    /// returns its (shard id, sequence number).
    ///
    /// # Errors
    /// When the call fails.
    pub async fn put_record(
        &self,
        stream: &str,
        key: &str,
        explicit_hash_key: Option<&str>,
        data: &[u8],
    ) -> anyhow::Result<(String, String)> {
        let out = self
            .client()
            .put_record()
            .stream_name(stream)
            .partition_key(key)
            .set_explicit_hash_key(explicit_hash_key.map(str::to_owned))
            .data(Blob::new(data.to_vec()))
            .send()
            .await
            .context("PutRecord")?;
        Ok((out.shard_id().to_owned(), out.sequence_number().to_owned()))
    }
}
