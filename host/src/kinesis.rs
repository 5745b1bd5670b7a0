//! The Kinesis client and the calls the pipeline makes with it, each with a
//! deadline.
//!
//! The client comes from the standard AWS config chain (credentials, region,
//! `AWS_ENDPOINT_URL_KINESIS`), with the `[aws]` section's overrides on top.
//! Every call has deadlines from `[aws]` ([`crate::config::AwsTimeouts`]: connecting,
//! the first byte of an answer, one attempt, the whole call); the SDK's own
//! retries cover brief failures, and callers add a jittered backoff on top
//! (throttling is a normal event, not an error). The defaults survive
//! seconds of added network latency: a fixed 2 s per attempt once made
//! 2 s of latency a full outage.

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_kinesis::Client;

use crate::config::AwsConfig;
use crate::ids::{ShardId, StreamName};

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
    loader.load().await
}

/// Builds a Kinesis client from the environment and `[aws]`.
pub async fn client(aws: &AwsConfig) -> Client {
    let sdk = sdk_config(aws).await;
    let mut config = aws_sdk_kinesis::config::Builder::from(&sdk);
    if let Some(url) = &aws.endpoint_url {
        config = config.endpoint_url(url);
    }
    Client::from_conf(config.build())
}

/// Builds a DynamoDB client (for the lease store) the same way:
/// `AWS_ENDPOINT_URL_DYNAMODB` or `[aws] dynamodb_endpoint_url` point it at
/// an emulator.
pub async fn dynamodb_client(aws: &AwsConfig) -> aws_sdk_dynamodb::Client {
    let sdk = sdk_config(aws).await;
    let mut config = aws_sdk_dynamodb::config::Builder::from(&sdk);
    if let Some(url) = &aws.dynamodb_endpoint_url {
        config = config.endpoint_url(url);
    }
    aws_sdk_dynamodb::Client::from_conf(config.build())
}

/// A shard as ListShards describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// Its id.
    pub id: ShardId,
    /// The shard it was split from, or one of the two it was merged from.
    pub parent: Option<ShardId>,
    /// The other shard of a merge.
    pub adjacent_parent: Option<ShardId>,
    /// Closed by a split or merge: it ends, and its children follow it.
    pub closed: bool,
}

impl ShardInfo {
    /// Its parents, if any.
    pub fn parents(&self) -> impl Iterator<Item = &ShardId> {
        self.parent.iter().chain(self.adjacent_parent.iter())
    }
}

/// Lists every shard of a stream, following pagination.
///
/// # Errors
/// The SDK's error, when a page cannot be fetched.
pub async fn list_shards(client: &Client, stream: &StreamName) -> anyhow::Result<Vec<ShardInfo>> {
    let mut shards = Vec::new();
    let mut next_token: Option<String> = None;
    loop {
        // A request with a token must not also name the stream.
        let request = match next_token.take() {
            Some(token) => client.list_shards().next_token(token),
            None => client.list_shards().stream_name(stream.as_str()),
        };
        let page = request.send().await?;
        for shard in page.shards() {
            shards.push(ShardInfo {
                id: ShardId::new(shard.shard_id()),
                parent: shard.parent_shard_id().map(ShardId::new),
                adjacent_parent: shard.adjacent_parent_shard_id().map(ShardId::new),
                closed: shard
                    .sequence_number_range()
                    .and_then(|r| r.ending_sequence_number())
                    .is_some(),
            });
        }
        match page.next_token() {
            Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
            _ => break,
        }
    }
    Ok(shards)
}
