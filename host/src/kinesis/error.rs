//! How a Kinesis call fails: [`KinesisError`], by the kind of failure the
//! caller acts on, with what went wrong kept as its [`source`](std::error::Error::source).
//!
//! Every operation's SDK error becomes a `KinesisError` in one place,
//! [`KinesisError::from_sdk`], through one table (the `kinds!` call
//! below, [`crate::cause::kinds`]) from each operation's modeled errors — the SDK's typed
//! `is_*_exception` predicates, never the text — to a kind. A new
//! throttling code, or a new operation, is one line of that table.
//! `ValidationException`, which Kinesis does not model, is known by its
//! error code, the one place a code is compared.

use std::fmt;

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};

use crate::cause::{Cause, Classify, kinds};
use aws_sdk_kinesis::operation::{
    deregister_stream_consumer::DeregisterStreamConsumerError,
    describe_stream_consumer::DescribeStreamConsumerError,
    describe_stream_summary::DescribeStreamSummaryError, get_records::GetRecordsError,
    get_shard_iterator::GetShardIteratorError, list_shards::ListShardsError,
    put_record::PutRecordError, put_records::PutRecordsError,
    register_stream_consumer::RegisterStreamConsumerError,
    subscribe_to_shard::SubscribeToShardError,
};

/// Why a Kinesis call failed, by the kind of failure the caller acts on.
/// Each message says the kind and then its cause in one line (what a log
/// line needs); [`source`](std::error::Error::source) is the cause itself
/// (the SDK's error, for a caller that needs its type).
#[derive(Debug, Clone, thiserror::Error)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) enum KinesisError {
    /// Over the stream's or account's throughput (or KMS's): back off and
    /// try again; a reader keeps its iterator.
    #[error("throttled: {0}")]
    Throttled(#[source] Cause),
    /// The shard iterator is older than five minutes: open a new one.
    #[error("shard iterator expired")]
    ExpiredIterator,
    /// The stream (or shard, or consumer) does not exist.
    #[error("not found: {0}")]
    NotFound(#[source] Cause),
    /// Kinesis refused what was sent (an invalid argument, a failed
    /// validation such as a record over its size): the same request would
    /// be refused again.
    #[error("refused: {0}")]
    Refused(#[source] Cause),
    /// Kinesis answered with something no caller can use (a malformed
    /// sequence number): never seen in practice, and never skipped.
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// Anything else: the network, a timeout, a server error, access
    /// denied. Worth retrying with backoff.
    #[error("{0}")]
    Failed(#[source] Cause),
}

/// The kind of a modeled error, as a caller acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Throttled,
    ExpiredIterator,
    NotFound,
    Refused,
}

kinds! {
    Kind;
    DescribeStreamSummaryError => [
        is_resource_not_found_exception => NotFound,
        is_limit_exceeded_exception => Throttled,
        is_invalid_argument_exception => Refused,
    ],
    ListShardsError => [
        is_resource_not_found_exception => NotFound,
        is_limit_exceeded_exception => Throttled,
    ],
    GetShardIteratorError => [
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_resource_not_found_exception => NotFound,
        is_invalid_argument_exception => Refused,
    ],
    GetRecordsError => [
        is_expired_iterator_exception => ExpiredIterator,
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_kms_throttling_exception => Throttled,
        is_resource_not_found_exception => NotFound,
        is_invalid_argument_exception => Refused,
    ],
    PutRecordError => [
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_kms_throttling_exception => Throttled,
        is_resource_not_found_exception => NotFound,
        is_invalid_argument_exception => Refused,
    ],
    PutRecordsError => [
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_kms_throttling_exception => Throttled,
        is_resource_not_found_exception => NotFound,
        is_invalid_argument_exception => Refused,
    ],
    // ResourceInUse: another subscription of this consumer to the shard is
    // still open (e.g. of the instance that held the lease before): worth
    // trying again after a backoff, as throttling is.
    SubscribeToShardError => [
        is_limit_exceeded_exception => Throttled,
        is_resource_in_use_exception => Throttled,
        is_resource_not_found_exception => NotFound,
        is_invalid_argument_exception => Refused,
    ],
    RegisterStreamConsumerError => [
        is_limit_exceeded_exception => Throttled,
    ],
    // Not found: the caller registers the consumer.
    DescribeStreamConsumerError => [
        is_limit_exceeded_exception => Throttled,
    ],
    // Not found: the caller says there was nothing to deregister.
    DeregisterStreamConsumerError => [],
}

impl KinesisError {
    /// The error a failed call of any operation is, by its modeled kind
    /// (the table above); the SDK's error is kept as the cause.
    pub(super) fn from_sdk<E, R>(error: SdkError<E, R>) -> Self
    where
        E: Classify<Kind> + ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        let kind = error.as_service_error().and_then(|service| {
            service.kind().or_else(|| {
                (service.code() == Some("ValidationException")).then_some(Kind::Refused)
            })
        });
        let cause = Cause::new(error);
        match kind {
            Some(Kind::Throttled) => Self::Throttled(cause),
            Some(Kind::ExpiredIterator) => Self::ExpiredIterator,
            Some(Kind::NotFound) => Self::NotFound(cause),
            Some(Kind::Refused) => Self::Refused(cause),
            None => Self::Failed(cause),
        }
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_kinesis::error::ErrorMetadata;
    use aws_sdk_kinesis::types::error::{
        ExpiredIteratorException, KmsThrottlingException, ProvisionedThroughputExceededException,
    };

    use super::*;

    /// A service error as the SDK returns it (the raw response does not
    /// matter to the mapping).
    fn service<E>(error: E) -> SdkError<E, ()> {
        SdkError::service_error(error, ())
    }

    /// Catches a mapping that loses a throttling code (the reader would then
    /// back off as for a failure and never slow its pace), that treats an
    /// expired iterator as a failure (the reader would retry a dead
    /// iterator forever), or that drops the SDK's error as the source.
    #[test]
    fn modeled_errors_map_to_their_kind_and_keep_the_sdk_error_as_the_source() {
        let throttled = KinesisError::from_sdk(service(
            GetRecordsError::ProvisionedThroughputExceededException(
                ProvisionedThroughputExceededException::builder()
                    .message("Rate exceeded for shard")
                    .build(),
            ),
        ));
        let KinesisError::Throttled(cause) = &throttled else {
            panic!("{throttled:?}");
        };
        assert!(
            throttled.to_string().contains("Rate exceeded for shard"),
            "{throttled}"
        );
        let sdk = cause
            .get()
            .expect("an error, not a message")
            .downcast_ref::<SdkError<GetRecordsError, ()>>()
            .expect("the SDK's error is the cause");
        assert!(sdk.as_service_error().is_some());
        assert!(matches!(
            KinesisError::from_sdk(service(GetRecordsError::KmsThrottlingException(
                KmsThrottlingException::builder().build()
            ))),
            KinesisError::Throttled(_)
        ));
        assert!(matches!(
            KinesisError::from_sdk(service(GetRecordsError::ExpiredIteratorException(
                ExpiredIteratorException::builder().build()
            ))),
            KinesisError::ExpiredIterator
        ));
    }

    /// Catches an unmodeled `ValidationException` taken for a transient
    /// failure (a record over its size would be retried forever), and any
    /// other unmodeled code taken for anything but a failure.
    #[test]
    fn unmodeled_codes_are_refused_when_validation_and_failed_otherwise() {
        let unmodeled = |code: &str| {
            KinesisError::from_sdk(service(PutRecordError::generic(
                ErrorMetadata::builder().code(code).message("no").build(),
            )))
        };
        assert!(matches!(
            unmodeled("ValidationException"),
            KinesisError::Refused(_)
        ));
        assert!(matches!(
            unmodeled("InternalFailure"),
            KinesisError::Failed(_)
        ));
    }
}
