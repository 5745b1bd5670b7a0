//! Kinesis: the clients and every Kinesis call the pipeline makes, each
//! with a deadline and each error classified once, by type, into a
//! [`KinesisError`].
//!
//! The clients come from the standard AWS config chain (credentials,
//! region, `AWS_ENDPOINT_URL_KINESIS` / `AWS_ENDPOINT_URL_DYNAMODB`), with
//! the `[aws]` section's overrides on top: a region, a named profile of the
//! shared config files, a role to assume (the SDK's `AssumeRoleProvider`,
//! with an external id when given; it refreshes the role's credentials). Every call has deadlines from
//! `[aws]` ([`crate::config::AwsTimeouts`]: connecting, the first byte of an
//! answer, one attempt, the whole call); the SDK's own retries cover brief
//! failures, and callers add a jittered backoff on top (throttling is a
//! normal event, not an error). GetRecords is the exception: it is sent
//! once, because its throttling is how a shard reader learns what other
//! consumers leave of the shard's five reads a second
//! (`reader/pace.rs`), and the SDK's retries would spend more of them
//! unseen; the reader retries a throttled or failed read itself, keeping
//! its iterator (an expired one is reopened). The defaults survive seconds
//! of added network latency: a fixed 2 s per attempt once made 2 s of
//! latency a full outage.
//!
//! The calls: [`Kinesis::describe_stream`] (start-up checks),
//! [`Kinesis::list_shards`] (the lease keeper's shard sync),
//! [`Kinesis::open_iterator`] and [`Kinesis::get_records`] (shard
//! readers), [`Kinesis::put_record`] (dead letters) and
//! [`Kinesis::put_records`] (plugin outputs); for enhanced fan-out (in
//! [`fan_out`]) [`Kinesis::ensure_consumer`], [`Kinesis::subscribe`] and
//! [`Kinesis::deregister_consumer`]. Callers that must stop
//! mid-call drop the call's future (e.g. in a `select!` with their cancel
//! token): cancellation is not an error.
//!
//! Floor 3 (sinks and clients) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod error;
mod fan_out;

#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) use error::KinesisError;

pub(crate) use fan_out::{ConsumerArn, FanOutEvent, Subscription};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};

use crate::cause::Cause;
use crate::config::{ArtifactTimeouts, AwsConfig, StartPosition};
use crate::ids::{PartitionKey, Position, SequenceNumber, ShardId, StreamName};

async fn sdk_config(aws: &AwsConfig) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(aws.timeouts.connect)
                .read_timeout(aws.timeouts.read)
                .operation_attempt_timeout(aws.timeouts.attempt)
                .operation_timeout(aws.timeouts.call)
                .build(),
        )
        .retry_config(RetryConfig::standard().with_max_attempts(3));
    if let Some(region) = &aws.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(profile) = &aws.profile {
        loader = loader.profile_name(profile);
    }
    let sdk = loader.load().await;
    let Some(role) = &aws.role else {
        return sdk;
    };
    // The role's credentials, got with the ones found above and refreshed
    // by the SDK before they expire.
    let mut provider = aws_config::sts::AssumeRoleProvider::builder(&role.arn)
        .session_name("shardlane")
        .configure(&sdk);
    if let Some(id) = &role.external_id {
        provider = provider.external_id(id);
    }
    let provider = provider.build().await;
    sdk.into_builder()
        .credentials_provider(aws_sdk_kinesis::config::SharedCredentialsProvider::new(
            provider,
        ))
        .build()
}

/// Builds a DynamoDB client (for the lease store) the same way as the
/// Kinesis one: `AWS_ENDPOINT_URL_DYNAMODB` or `[aws] dynamodb_endpoint_url`
/// point it at an emulator.
pub(crate) async fn dynamodb_client(aws: &AwsConfig) -> aws_sdk_dynamodb::Client {
    let sdk = sdk_config(aws).await;
    let mut config = aws_sdk_dynamodb::config::Builder::from(&sdk);
    if let Some(url) = &aws.dynamodb_endpoint_url {
        config = config.endpoint_url(url);
    }
    aws_sdk_dynamodb::Client::from_conf(config.build())
}

/// Builds an S3 client (for the artifact store) the same way as the
/// Kinesis one, with the artifact store's deadlines (`timeouts`: connect,
/// first byte, and the whole call per attempt and in all):
/// `AWS_ENDPOINT_URL_S3` points it at an emulator, and then addresses
/// buckets by path (`http://host:port/bucket/key`), since an emulator on
/// loopback has no per-bucket host names.
pub(crate) async fn s3_client(aws: &AwsConfig, timeouts: ArtifactTimeouts) -> aws_sdk_s3::Client {
    let sdk = sdk_config(aws).await;
    let overridden = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
    let config = aws_sdk_s3::config::Builder::from(&sdk)
        .force_path_style(overridden)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(timeouts.connect)
                .read_timeout(timeouts.first_byte)
                .operation_attempt_timeout(timeouts.transfer)
                .operation_timeout(timeouts.transfer)
                .build(),
        );
    aws_sdk_s3::Client::from_conf(config.build())
}

/// Where a reader opens a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadFrom {
    /// Right after this position (a checkpoint, or the last record handed
    /// out). Within a KPL aggregate the iterator opens *at* its sequence
    /// number and the reader skips the user records up to the position's
    /// index.
    After(Position),
    /// At a start position (a shard without checkpoint, or a child of a
    /// split or merge at its beginning).
    Start(StartPosition),
    /// At this record (a replay from a sequence number: `crate::reader`'s
    /// range).
    At(SequenceNumber),
}

impl ReadFrom {
    /// Where GetShardIterator and SubscribeToShard start: the iterator
    /// type, with its sequence number or timestamp. Inside a KPL aggregate
    /// that is *at* its sequence number (the reader skips what settled).
    fn starting(
        &self,
    ) -> (
        ShardIteratorType,
        Option<String>,
        Option<aws_smithy_types::DateTime>,
    ) {
        match self {
            ReadFrom::After(position) => (
                if position.sub().is_some() {
                    ShardIteratorType::AtSequenceNumber
                } else {
                    ShardIteratorType::AfterSequenceNumber
                },
                Some(position.sequence().as_str().to_owned()),
                None,
            ),
            ReadFrom::At(sequence) => (
                ShardIteratorType::AtSequenceNumber,
                Some(sequence.as_str().to_owned()),
                None,
            ),
            ReadFrom::Start(StartPosition::Latest) => (ShardIteratorType::Latest, None, None),
            ReadFrom::Start(StartPosition::TrimHorizon) => {
                (ShardIteratorType::TrimHorizon, None, None)
            }
            ReadFrom::Start(StartPosition::AtTimestamp(at)) => (
                ShardIteratorType::AtTimestamp,
                None,
                Some(aws_smithy_types::DateTime::from(*at)),
            ),
        }
    }
}

/// One record as GetRecords returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fetched {
    /// The producer's partition key.
    pub partition_key: PartitionKey,
    /// Its sequence number within the shard.
    pub sequence: SequenceNumber,
    /// When Kinesis accepted it, in ms since the Unix epoch (0: unknown).
    pub arrival_ms: u64,
    /// The payload.
    pub data: Vec<u8>,
}

/// A record as the SDK returns it, as the reader takes it.
///
/// # Errors
/// [`KinesisError::Malformed`] when its sequence number is not one.
fn fetched(r: aws_sdk_kinesis::types::Record) -> Result<Fetched, KinesisError> {
    Ok(Fetched {
        sequence: SequenceNumber::parse(&r.sequence_number).map_err(|e| {
            KinesisError::Malformed(format!("sequence number {:?}: {e}", r.sequence_number))
        })?,
        partition_key: PartitionKey::new(r.partition_key.unwrap_or_default()),
        arrival_ms: r
            .approximate_arrival_timestamp
            .and_then(|t| t.to_millis().ok())
            .and_then(|ms| u64::try_from(ms).ok())
            .unwrap_or(0),
        data: r.data.into_inner(),
    })
}

/// One GetRecords answer.
#[derive(Debug, Default)]
pub(crate) struct Page {
    /// The records, in shard order.
    pub records: Vec<Fetched>,
    /// Where to read next; `None` at the end of a closed shard.
    pub next_iterator: Option<String>,
    /// How far behind the shard's tip this read was.
    pub millis_behind: Option<u64>,
}

/// A shard as ListShards describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardInfo {
    /// Its id.
    pub id: ShardId,
    /// The shard it was split from, or one of the two it was merged from.
    pub parent: Option<ShardId>,
    /// The other shard of a merge.
    pub adjacent_parent: Option<ShardId>,
    /// Closed by a split or merge: it ends, and its children follow it.
    pub closed: bool,
    /// The hash keys it holds; `None` when ListShards did not say (KPL
    /// user records are then not checked against it).
    pub hash_keys: Option<HashKeyRange>,
}

/// A shard's range of 128-bit hash keys, both ends included: a record
/// belongs to the shard whose range holds the MD5 of its partition key (or
/// its explicit hash key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HashKeyRange {
    /// The lowest hash key.
    pub start: u128,
    /// The highest hash key.
    pub end: u128,
}

impl HashKeyRange {
    /// Whether `key` falls in the range.
    pub(crate) fn contains(&self, key: u128) -> bool {
        (self.start..=self.end).contains(&key)
    }
}

impl ShardInfo {
    /// Its parents, if any.
    pub(crate) fn parents(&self) -> impl Iterator<Item = &ShardId> {
        self.parent.iter().chain(self.adjacent_parent.iter())
    }
}

/// The Kinesis client and its calls (module docs). Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Kinesis {
    client: Client,
    /// The same client without retries, for GetRecords (see
    /// [`Kinesis::get_records`]). Made once: overriding the retry config
    /// per call (`customize().config_override`) rebuilds the call's runtime
    /// components every time, ~9 % of an empty poll's CPU (BENCHMARKS.md,
    /// "Idle"). It shares the client's connection pool.
    reads: Client,
}

impl Kinesis {
    /// A client from the environment and `[aws]`.
    pub(crate) async fn connect(aws: &AwsConfig) -> Self {
        let sdk = sdk_config(aws).await;
        let mut config = aws_sdk_kinesis::config::Builder::from(&sdk);
        if let Some(url) = &aws.endpoint_url {
            config = config.endpoint_url(url);
        }
        Self::from_client(Client::from_conf(config.build()))
    }

    /// Around an SDK client made elsewhere (tests), or by [`Kinesis::connect`].
    pub(crate) fn from_client(client: Client) -> Self {
        let reads = Client::from_conf(
            client
                .config()
                .to_builder()
                .retry_config(RetryConfig::disabled())
                .build(),
        );
        Self { client, reads }
    }

    /// Checks that `stream` exists (DescribeStreamSummary); returns its
    /// ARN when the answer carries one.
    ///
    /// # Errors
    /// [`KinesisError::NotFound`] when it does not; another kind when
    /// Kinesis cannot say.
    pub(crate) async fn describe_stream(
        &self,
        stream: &StreamName,
    ) -> Result<Option<String>, KinesisError> {
        self.client
            .describe_stream_summary()
            .set_stream_name(stream.api_name())
            .set_stream_arn(stream.api_arn())
            .send()
            .await
            .map(|out| {
                out.stream_description_summary()
                    .map(|s| s.stream_arn().to_owned())
            })
            .map_err(KinesisError::from_sdk)
    }

    /// How long `stream` keeps its records (DescribeStreamSummary's
    /// retention period).
    ///
    /// # Errors
    /// [`KinesisError::NotFound`] when the stream does not exist; another
    /// kind when Kinesis cannot say.
    pub(crate) async fn retention(
        &self,
        stream: &StreamName,
    ) -> Result<std::time::Duration, KinesisError> {
        let out = self
            .client
            .describe_stream_summary()
            .set_stream_name(stream.api_name())
            .set_stream_arn(stream.api_arn())
            .send()
            .await
            .map_err(KinesisError::from_sdk)?;
        let hours = out
            .stream_description_summary()
            .map_or(24, |s| s.retention_period_hours());
        Ok(std::time::Duration::from_secs(
            u64::try_from(hours).unwrap_or(24) * 3_600,
        ))
    }

    /// Lists every shard of a stream, following pagination.
    ///
    /// # Errors
    /// The [`KinesisError`] of the page that could not be fetched.
    pub(crate) async fn list_shards(
        &self,
        stream: &StreamName,
    ) -> Result<Vec<ShardInfo>, KinesisError> {
        let mut shards = Vec::new();
        let mut next_token: Option<String> = None;
        loop {
            // A request with a token must not also name the stream.
            let request = match next_token.take() {
                Some(token) => self.client.list_shards().next_token(token),
                None => self
                    .client
                    .list_shards()
                    .set_stream_name(stream.api_name())
                    .set_stream_arn(stream.api_arn()),
            };
            let page = request.send().await.map_err(KinesisError::from_sdk)?;
            for shard in page.shards() {
                shards.push(ShardInfo {
                    id: ShardId::new(shard.shard_id()),
                    parent: shard.parent_shard_id().map(ShardId::new),
                    adjacent_parent: shard.adjacent_parent_shard_id().map(ShardId::new),
                    closed: shard
                        .sequence_number_range()
                        .and_then(|r| r.ending_sequence_number())
                        .is_some(),
                    hash_keys: shard.hash_key_range().and_then(|r| {
                        Some(HashKeyRange {
                            start: r.starting_hash_key().parse().ok()?,
                            end: r.ending_hash_key().parse().ok()?,
                        })
                    }),
                });
            }
            match page.next_token() {
                Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                _ => break,
            }
        }
        Ok(shards)
    }

    /// Opens a shard iterator (GetShardIterator).
    ///
    /// # Errors
    /// The call's [`KinesisError`].
    pub(crate) async fn open_iterator(
        &self,
        stream: &StreamName,
        shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<String, KinesisError> {
        let request = self
            .client
            .get_shard_iterator()
            .set_stream_name(stream.api_name())
            .set_stream_arn(stream.api_arn())
            .shard_id(shard.as_str());
        let (kind, sequence, timestamp) = from.starting();
        let request = request
            .shard_iterator_type(kind)
            .set_starting_sequence_number(sequence)
            .set_timestamp(timestamp);
        let output = request.send().await.map_err(KinesisError::from_sdk)?;
        output
            .shard_iterator
            .ok_or_else(|| KinesisError::Malformed("GetShardIterator returned no iterator".into()))
    }

    /// Reads up to `limit` records at `iterator` (GetRecords), in one
    /// attempt (module docs: the caller retries). The payloads are taken
    /// from the answer, not copied.
    ///
    /// # Errors
    /// The call's [`KinesisError`]; [`KinesisError::Malformed`] for a
    /// record whose sequence number is not one.
    pub(crate) async fn get_records(
        &self,
        iterator: &str,
        limit: i32,
    ) -> Result<Page, KinesisError> {
        let output = self
            .reads
            .get_records()
            .shard_iterator(iterator)
            .limit(limit)
            .send()
            .await
            .map_err(KinesisError::from_sdk)?;
        let records = output
            .records
            .into_iter()
            .map(fetched)
            .collect::<Result<_, KinesisError>>()?;
        Ok(Page {
            records,
            next_iterator: output.next_shard_iterator,
            millis_behind: output
                .millis_behind_latest
                .map(|ms| u64::try_from(ms).unwrap_or(0)),
        })
    }

    /// Puts one record (PutRecord); returns the shard it went to and its
    /// sequence number there.
    ///
    /// # Errors
    /// The call's [`KinesisError`]: [`KinesisError::Refused`] when the
    /// record itself was refused (too large, invalid).
    pub(crate) async fn put_record(
        &self,
        stream: &StreamName,
        key: &PartitionKey,
        data: Vec<u8>,
    ) -> Result<(ShardId, String), KinesisError> {
        let output = self
            .client
            .put_record()
            .set_stream_name(stream.api_name())
            .set_stream_arn(stream.api_arn())
            .partition_key(key.as_str())
            .data(Blob::new(data))
            .send()
            .await
            .map_err(KinesisError::from_sdk)?;
        Ok((ShardId::new(output.shard_id), output.sequence_number))
    }

    /// Puts `records` (partition key, data) to `stream` in one PutRecords
    /// call: the outcome of each, in order. Kinesis may accept some and
    /// refuse others (throttled, internal failure), which reorders them:
    /// callers that need order put at most one record per key per call.
    ///
    /// # Errors
    /// The call's [`KinesisError`] when it failed as a whole.
    pub(crate) async fn put_records(
        &self,
        stream: &StreamName,
        records: &[(PartitionKey, Vec<u8>)],
    ) -> Result<Vec<Result<(), KinesisError>>, KinesisError> {
        let entries = records
            .iter()
            .map(|(key, data)| {
                PutRecordsRequestEntry::builder()
                    .partition_key(key.as_str())
                    .data(Blob::new(data.clone()))
                    .build()
                    .map_err(|e| KinesisError::Refused(Cause::new(e)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let output = self
            .client
            .put_records()
            .set_stream_name(stream.api_name())
            .set_stream_arn(stream.api_arn())
            .set_records(Some(entries))
            .send()
            .await
            .map_err(KinesisError::from_sdk)?;
        if output.records.len() != records.len() {
            return Err(KinesisError::Malformed(format!(
                "PutRecords answered {} entries for {} records",
                output.records.len(),
                records.len()
            )));
        }
        Ok(output
            .records
            .into_iter()
            .map(|entry| match entry.error_code {
                None => Ok(()),
                // The entry's error code names the failure's type.
                Some(code) if code == "ProvisionedThroughputExceededException" => Err(
                    KinesisError::Throttled(entry.error_message.unwrap_or(code).into()),
                ),
                Some(code) => Err(KinesisError::Failed(
                    format!("{code}: {}", entry.error_message.unwrap_or_default()).into(),
                )),
            })
            .collect())
    }
}
