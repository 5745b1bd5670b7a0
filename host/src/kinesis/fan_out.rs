//! Enhanced fan-out: the stream consumer a subscription reads through
//! (registered at start-up when missing, waited on until ACTIVE), and
//! `SubscribeToShard` event streams, one per leased shard.
//!
//! A subscription pushes a [`FanOutEvent`] about once a second (records,
//! the continuation sequence number, how far behind the tip it is) for up
//! to five minutes, then ends; the reader subscribes again from where it
//! got to. Nothing is read ahead: the reader takes the next event only
//! once the previous one's records are in the subscription channel, so a
//! full channel holds the subscription (the HTTP connection's flow control
//! holds Kinesis back).

use std::time::Duration;

use aws_sdk_kinesis::types::{ConsumerStatus, StartingPosition};

use super::{Fetched, Kinesis, KinesisError, ReadFrom, fetched};
use crate::cause::Cause;
use crate::ids::{SequenceNumber, ShardId, StreamName};

/// How long start-up waits for a new consumer to become ACTIVE.
const CONSUMER_ACTIVE_WITHIN: Duration = Duration::from_secs(120);

/// A registered stream consumer's ARN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsumerArn(pub String);

/// One event of a shard subscription.
#[derive(Debug)]
pub(crate) struct FanOutEvent {
    /// The records, in shard order.
    pub records: Vec<Fetched>,
    /// Where a new subscription continues after this event; `None` at the
    /// end of a closed shard.
    pub continuation: Option<SequenceNumber>,
    /// How far behind the shard's tip this event was.
    pub millis_behind: u64,
    /// The shard is closed and this event was its last.
    pub shard_ended: bool,
}

/// A running `SubscribeToShard` (module docs). Dropping it ends it.
pub(crate) struct Subscription {
    /// Its `event_stream` receives the events.
    output: aws_sdk_kinesis::operation::subscribe_to_shard::SubscribeToShardOutput,
}

impl Subscription {
    /// The next event; `None` when the subscription ended (after about
    /// five minutes, or when Kinesis closed it).
    ///
    /// # Errors
    /// The connection failed or Kinesis sent an error event.
    pub(crate) async fn next(&mut self) -> Result<Option<FanOutEvent>, KinesisError> {
        use aws_sdk_kinesis::types::SubscribeToShardEventStream as Stream;
        loop {
            let event = self
                .output
                .event_stream
                .recv()
                .await
                .map_err(|e| KinesisError::Failed(Cause::new(e)))?;
            let event = match event {
                None => return Ok(None),
                Some(Stream::SubscribeToShardEvent(event)) => event,
                // A kind of event this SDK does not know: skip it.
                Some(_) => continue,
            };
            return convert(event).map(Some);
        }
    }
}

/// An SDK event as the reader takes it: the end of a closed shard is an
/// event without a continuation that names child shards.
fn convert(
    event: aws_sdk_kinesis::types::SubscribeToShardEvent,
) -> Result<FanOutEvent, KinesisError> {
    let continuation = Some(event.continuation_sequence_number.as_str())
        .filter(|c| !c.is_empty())
        .map(|c| {
            SequenceNumber::parse(c).map_err(|e| {
                KinesisError::Malformed(format!("continuation sequence number {c:?}: {e}"))
            })
        })
        .transpose()?;
    let shard_ended =
        continuation.is_none() && event.child_shards.as_ref().is_some_and(|c| !c.is_empty());
    Ok(FanOutEvent {
        records: event
            .records
            .into_iter()
            .map(fetched)
            .collect::<Result<_, _>>()?,
        continuation,
        millis_behind: u64::try_from(event.millis_behind_latest).unwrap_or(0),
        shard_ended,
    })
}

impl Kinesis {
    /// The stream's ARN ([`Kinesis::describe_stream`]).
    async fn stream_arn(&self, stream: &StreamName) -> Result<String, KinesisError> {
        self.describe_stream(stream).await?.ok_or_else(|| {
            KinesisError::Malformed("DescribeStreamSummary without a summary".into())
        })
    }

    /// The consumer `name` of `stream`: registered when missing
    /// (RegisterStreamConsumer), then waited on until ACTIVE
    /// (DescribeStreamConsumer).
    ///
    /// # Errors
    /// When it cannot be registered or does not become ACTIVE in time.
    pub(crate) async fn ensure_consumer(
        &self,
        stream: &StreamName,
        name: &str,
    ) -> Result<ConsumerArn, KinesisError> {
        let stream_arn = self.stream_arn(stream).await?;
        let deadline = tokio::time::Instant::now() + CONSUMER_ACTIVE_WITHIN;
        let mut registered = false;
        loop {
            let described = self
                .client
                .describe_stream_consumer()
                .stream_arn(&stream_arn)
                .consumer_name(name)
                .send()
                .await;
            match described {
                Ok(out) => {
                    let Some(consumer) = out.consumer_description() else {
                        return Err(KinesisError::Malformed(
                            "DescribeStreamConsumer without a description".into(),
                        ));
                    };
                    match consumer.consumer_status() {
                        ConsumerStatus::Active => {
                            return Ok(ConsumerArn(consumer.consumer_arn().to_owned()));
                        }
                        status => {
                            tracing::info!(stream = %stream, consumer = name, ?status, "waiting for the stream consumer to become ACTIVE");
                        }
                    }
                }
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception())
                        && !registered =>
                {
                    tracing::info!(stream = %stream, consumer = name, "registering the stream consumer");
                    self.client
                        .register_stream_consumer()
                        .stream_arn(&stream_arn)
                        .consumer_name(name)
                        .send()
                        .await
                        .map(drop)
                        .or_else(|e| match e.as_service_error() {
                            // Registered meanwhile by another instance.
                            Some(s) if s.is_resource_in_use_exception() => Ok(()),
                            _ => Err(KinesisError::from_sdk(e)),
                        })?;
                    registered = true;
                }
                Err(e) => {
                    let e = KinesisError::from_sdk(e);
                    if !matches!(e, KinesisError::Throttled(_)) && !registered {
                        return Err(e);
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KinesisError::Failed(
                    format!(
                        "stream consumer {name:?} did not become ACTIVE within {CONSUMER_ACTIVE_WITHIN:?}"
                    )
                    .into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Deregisters the consumer `name` of `stream`
    /// (DeregisterStreamConsumer). True when it existed.
    ///
    /// # Errors
    /// When Kinesis refuses or cannot be reached.
    pub(crate) async fn deregister_consumer(
        &self,
        stream: &StreamName,
        name: &str,
    ) -> Result<bool, KinesisError> {
        let stream_arn = self.stream_arn(stream).await?;
        match self
            .client
            .deregister_stream_consumer()
            .stream_arn(&stream_arn)
            .consumer_name(name)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(KinesisError::from_sdk(e)),
        }
    }

    /// Subscribes to `shard` through `consumer` (SubscribeToShard), from
    /// `from`; returns once the subscription has answered.
    ///
    /// # Errors
    /// [`KinesisError::Throttled`] for `LimitExceededException` and for
    /// `ResourceInUseException` (another subscription of this consumer to
    /// the shard is still open, e.g. of the instance that held the lease
    /// before): both are worth trying again after a backoff.
    pub(crate) async fn subscribe(
        &self,
        consumer: &ConsumerArn,
        shard: &ShardId,
        from: &ReadFrom,
    ) -> Result<Subscription, KinesisError> {
        let (kind, sequence, timestamp) = from.starting();
        let position = StartingPosition::builder()
            .r#type(kind)
            .set_sequence_number(sequence)
            .set_timestamp(timestamp)
            .build()
            .map_err(|e| KinesisError::Refused(Cause::new(e)))?;
        let out = self
            .client
            .subscribe_to_shard()
            .consumer_arn(&consumer.0)
            .shard_id(shard.as_str())
            .starting_position(position)
            .send()
            .await
            .map_err(KinesisError::from_sdk)?;
        Ok(Subscription { output: out })
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_kinesis::primitives::Blob;
    use aws_sdk_kinesis::types::{ChildShard, HashKeyRange, Record, SubscribeToShardEvent};

    use super::*;

    fn event(continuation: &str, children: Option<Vec<ChildShard>>) -> SubscribeToShardEvent {
        SubscribeToShardEvent::builder()
            .set_records(Some(vec![
                Record::builder()
                    .sequence_number("42")
                    .partition_key("k")
                    .data(Blob::new(b"x".to_vec()))
                    .build()
                    .unwrap(),
            ]))
            .continuation_sequence_number(continuation)
            .millis_behind_latest(7)
            .set_child_shards(children)
            .build()
            .unwrap()
    }

    fn child() -> ChildShard {
        ChildShard::builder()
            .shard_id("shardId-000000000002")
            .parent_shards("shardId-000000000000")
            .hash_key_range(
                HashKeyRange::builder()
                    .starting_hash_key("0")
                    .ending_hash_key("1")
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    }

    #[test]
    fn an_event_with_a_continuation_goes_on() {
        let e = convert(event("43", None)).unwrap();
        assert_eq!(e.records.len(), 1);
        assert_eq!(e.continuation, Some(SequenceNumber::parse("43").unwrap()));
        assert_eq!(e.millis_behind, 7);
        assert!(!e.shard_ended);
    }

    #[test]
    fn no_continuation_and_child_shards_end_the_shard() {
        let e = convert(event("", Some(vec![child()]))).unwrap();
        assert!(e.shard_ended);
        assert_eq!(e.continuation, None);
        assert_eq!(e.records.len(), 1, "the last records still come");
        // Child shards with a continuation (a resharding in progress) do not.
        assert!(
            !convert(event("43", Some(vec![child()])))
                .unwrap()
                .shard_ended
        );
    }

    #[test]
    fn a_bad_continuation_is_malformed() {
        assert!(matches!(
            convert(event("12x", None)),
            Err(KinesisError::Malformed(_))
        ));
    }
}
