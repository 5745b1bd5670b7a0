//! `shardlane import-kcl`: moves a KCL application's checkpoints into a
//! subscription's lease store, so the application can switch to shardlane
//! without reading its stream again.
//!
//! KCL 2.x/3.x keeps a lease per shard in a DynamoDB table: `leaseKey` (the
//! shard id; `account:stream:creationEpoch:shardId` for a multi-stream
//! application), `checkpoint` (a sequence number, or one of the sentinels
//! `TRIM_HORIZON`, `LATEST`, `AT_TIMESTAMP`, `SHARD_END`) and
//! `checkpointSubSequenceNumber`. KCL reads a shard from its checkpoint
//! (seq, sub) and drops every user record at or before it, a plain record
//! counting as (seq, 0). So a KCL checkpoint (seq, sub) becomes
//! [`Position::within`]`(seq, sub)`: inside an aggregate it means the
//! same, and for a plain record at `seq` the reader takes `within(seq, 0)`
//! as covering it (see `reader::unpack`), so nothing is handled twice and
//! nothing is skipped. Sentinels other than `SHARD_END` mean "no checkpoint
//! yet": such shards start at the subscription's `start`.
//!
//! Each checkpoint is written through the lease store's own fenced
//! protocol (take the lease as `import-kcl-<pid>`, checkpoint, release), so
//! an import never overwrites a lease a running instance holds: stop the
//! subscription's instances (and the KCL application) first.

use anyhow::Context as _;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::config::Config;
use crate::ids::{OwnerId, Position, SequenceNumber, ShardId, StreamName, SubscriptionName};
use crate::lease::LeaseKey;
use crate::progress::Checkpoint;

/// One shard's checkpoint as a KCL lease holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KclLease {
    /// `leaseKey`.
    pub key: String,
    /// `checkpoint`, if set.
    pub checkpoint: Option<String>,
    /// `checkpointSubSequenceNumber`, if set.
    pub sub: Option<u64>,
}

/// What became of one KCL lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Imported {
    /// Written: the shard and its new checkpoint.
    Written(String, String),
    /// No checkpoint yet in KCL (a sentinel): nothing written.
    NoCheckpoint(String, String),
    /// A lease of another stream (a multi-stream KCL table).
    OtherStream(String),
}

/// The shard a KCL lease key names when it belongs to `stream`; `None` for
/// another stream's lease in a multi-stream table.
fn shard_of(key: &str, stream: &StreamName) -> Option<String> {
    match key.rsplit_once(':') {
        None => Some(key.to_owned()),
        Some((prefix, shard)) => {
            // account:stream:creationEpoch:shardId; a stream named by ARN
            // also names its account, which must match.
            let mut parts = prefix.split(':');
            let (account, name) = (parts.next()?, parts.next()?);
            let same = match stream.arn_parts() {
                Some(arn) => arn.name == name && arn.account == account,
                None => stream.as_str() == name,
            };
            same.then(|| shard.to_owned())
        }
    }
}

/// A KCL checkpoint as shardlane's (module docs); `Ok(None)` for a
/// sentinel that means "not started".
fn checkpoint_of(lease: &KclLease) -> anyhow::Result<Option<Checkpoint>> {
    let Some(value) = lease.checkpoint.as_deref() else {
        return Ok(None);
    };
    match value {
        "SHARD_END" => Ok(Some(Checkpoint::ShardEnd)),
        "TRIM_HORIZON" | "LATEST" | "AT_TIMESTAMP" => Ok(None),
        seq => {
            let sequence = SequenceNumber::parse(seq)
                .with_context(|| format!("lease {}: checkpoint {seq:?}", lease.key))?;
            let sub = u32::try_from(lease.sub.unwrap_or(0)).with_context(|| {
                format!(
                    "lease {}: checkpointSubSequenceNumber out of range",
                    lease.key
                )
            })?;
            Ok(Some(Checkpoint::At(Position::within(sequence, sub))))
        }
    }
}

/// Reads every lease of the KCL table `table` (a paginated Scan).
async fn read_kcl_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> anyhow::Result<Vec<KclLease>> {
    let mut leases = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(e)))
            .with_context(|| format!("cannot read the KCL lease table {table:?}"))?;
        for item in page.items() {
            let text = |name: &str| match item.get(name) {
                Some(AttributeValue::S(v)) => Some(v.clone()),
                _ => None,
            };
            let Some(key) = text("leaseKey") else {
                anyhow::bail!("table {table:?} is not a KCL lease table: an item without leaseKey");
            };
            let sub =
                match item.get("checkpointSubSequenceNumber") {
                    Some(AttributeValue::N(n)) => Some(n.parse().with_context(|| {
                        format!("lease {key}: checkpointSubSequenceNumber {n:?}")
                    })?),
                    _ => None,
                };
            leases.push(KclLease {
                key,
                checkpoint: text("checkpoint"),
                sub,
            });
        }
        match page.last_evaluated_key() {
            Some(key) if !key.is_empty() => start = Some(key.clone()),
            _ => break,
        }
    }
    Ok(leases)
}

/// Imports the checkpoints of the KCL table `table` into the lease store
/// of `subscription` (module docs); returns what became of each lease.
///
/// # Errors
/// When the subscription is not in `config`, a table or store cannot be
/// read or written, or a shard's lease is held by a running instance.
pub(crate) async fn import_kcl(
    config: &Config,
    subscription: &str,
    table: &str,
) -> anyhow::Result<Vec<Imported>> {
    let sub = config
        .subscriptions
        .iter()
        .find(|s| s.name.as_str() == subscription)
        .with_context(|| format!("no subscription named {subscription:?} in the config"))?;
    let client = crate::kinesis::dynamodb_client(&config.aws).await;
    let kcl = read_kcl_table(&client, table).await?;
    let store = crate::supervisor::open_store(config).await?;
    let owner = OwnerId::new(format!("import-kcl-{}", std::process::id()));
    let mut out = Vec::new();
    for lease in &kcl {
        let Some(shard) = shard_of(&lease.key, &sub.stream) else {
            out.push(Imported::OtherStream(lease.key.clone()));
            continue;
        };
        let Some(checkpoint) = checkpoint_of(lease)? else {
            out.push(Imported::NoCheckpoint(
                shard,
                lease.checkpoint.clone().unwrap_or_default(),
            ));
            continue;
        };
        let key = LeaseKey {
            subscription: SubscriptionName::new(subscription),
            stream: sub.stream.clone(),
            shard: ShardId::new(shard.as_str()),
        };
        let seen = store.read(&key).await?;
        if let Some(holder) = seen.as_ref().and_then(|l| l.owner.as_ref()) {
            anyhow::bail!(
                "shard {shard}: its lease is held by {holder}: stop every instance of subscription {subscription:?} first"
            );
        }
        let held = store.acquire(&key, &owner, seen.as_ref()).await?;
        let held = store.checkpoint(&held, &checkpoint, &[]).await?;
        store.release(&held).await?;
        out.push(Imported::Written(shard, checkpoint.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(key: &str, checkpoint: Option<&str>, sub: Option<u64>) -> KclLease {
        KclLease {
            key: key.into(),
            checkpoint: checkpoint.map(Into::into),
            sub,
        }
    }

    fn of(key: &str, stream: &str) -> Option<String> {
        shard_of(key, &StreamName::from(stream))
    }

    #[test]
    fn lease_keys_name_shards_of_this_stream() {
        assert_eq!(
            of("shardId-000000000001", "orders").as_deref(),
            Some("shardId-000000000001")
        );
        assert_eq!(
            of(
                "123456789012:orders:1700000000:shardId-000000000002",
                "orders"
            )
            .as_deref(),
            Some("shardId-000000000002")
        );
        assert_eq!(
            of(
                "123456789012:payments:1700000000:shardId-000000000002",
                "orders"
            ),
            None
        );
        assert_eq!(
            of(
                "123456789012:orders:1700000000:shardId-000000000003",
                "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"
            )
            .as_deref(),
            Some("shardId-000000000003")
        );
        assert_eq!(
            of(
                "999999999999:orders:1700000000:shardId-000000000003",
                "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"
            ),
            None,
            "another account's stream of the same name"
        );
    }

    #[test]
    fn kcl_checkpoints_become_positions_that_cover_what_kcl_covers() {
        let at = |s: &str| Some(Checkpoint::parse(s).unwrap());
        assert_eq!(
            checkpoint_of(&lease("s", Some("4959"), Some(3))).unwrap(),
            at("4959:3")
        );
        assert_eq!(
            checkpoint_of(&lease("s", Some("4959"), Some(0))).unwrap(),
            at("4959:0")
        );
        assert_eq!(
            checkpoint_of(&lease("s", Some("4959"), None)).unwrap(),
            at("4959:0")
        );
        assert_eq!(
            checkpoint_of(&lease("s", Some("SHARD_END"), Some(0))).unwrap(),
            Some(Checkpoint::ShardEnd)
        );
        for sentinel in ["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"] {
            assert_eq!(
                checkpoint_of(&lease("s", Some(sentinel), Some(0))).unwrap(),
                None
            );
        }
        assert_eq!(checkpoint_of(&lease("s", None, None)).unwrap(), None);
        assert!(checkpoint_of(&lease("s", Some("12ab"), None)).is_err());
        assert!(checkpoint_of(&lease("s", Some("12"), Some(1 << 40))).is_err());
    }
}

/// `shardlane import-kcl`.
#[derive(clap::Args)]
pub(crate) struct ImportKclArgs {
    /// The TOML config file.
    #[arg(long, short, env = "SHARDLANE_CONFIG")]
    config: std::path::PathBuf,
    /// The subscription to import into (its stream is the KCL one).
    #[arg(long, short)]
    subscription: String,
    /// The KCL application's lease table (its application name).
    #[arg(long, short)]
    table: String,
}

impl ImportKclArgs {
    pub(crate) fn run(self) -> anyhow::Result<std::process::ExitCode> {
        let Self {
            config,
            subscription,
            table,
        } = self;
        let config = super::bootstrap::config(&config)?;
        let imported = super::bootstrap::one_shot(import_kcl(&config, &subscription, &table))?;
        for lease in &imported {
            match lease {
                Imported::Written(shard, checkpoint) => {
                    println!("{shard}: checkpoint {checkpoint}");
                }
                Imported::NoCheckpoint(shard, sentinel) => {
                    println!("{shard}: no checkpoint in KCL yet ({sentinel:?}): starts at `start`");
                }
                Imported::OtherStream(key) => {
                    println!("{key}: another stream's lease, left alone");
                }
            }
        }
        println!(
            "imported {} checkpoints from KCL table {table:?} into subscription {subscription:?}",
            imported
                .iter()
                .filter(|l| matches!(l, Imported::Written(..)))
                .count()
        );
        Ok(std::process::ExitCode::SUCCESS)
    }
}
