//! How a DynamoDB call fails, as the lease store reports it: one table
//! (the [`kinds`] call below) from each operation's modeled errors — the
//! SDK's typed predicates, never the error code's text — to the two kinds
//! the store acts on: a failed condition (the lease, or a state item, is
//! not as the write expected) and throttling. Everything else is a
//! transient [`LeaseError::Store`]. The SDK's error is kept as the cause.

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::{
    delete_item::DeleteItemError, get_item::GetItemError, put_item::PutItemError,
    query::QueryError, scan::ScanError, update_item::UpdateItemError,
};

use crate::cause::{Cause, Classify, kinds};
use crate::lease::{LeaseError, LeaseKey};

/// The kinds of a modeled DynamoDB error the store acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A conditional write found the item otherwise.
    ConditionFailed,
    /// Over the table's or the account's throughput.
    Throttled,
}

kinds! {
    Kind;
    PutItemError => [
        is_conditional_check_failed_exception => ConditionFailed,
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_throttling_exception => Throttled,
        is_request_limit_exceeded => Throttled,
    ],
    UpdateItemError => [
        is_conditional_check_failed_exception => ConditionFailed,
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_throttling_exception => Throttled,
        is_request_limit_exceeded => Throttled,
    ],
    DeleteItemError => [
        is_conditional_check_failed_exception => ConditionFailed,
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_throttling_exception => Throttled,
        is_request_limit_exceeded => Throttled,
    ],
    GetItemError => [
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_throttling_exception => Throttled,
        is_request_limit_exceeded => Throttled,
    ],
    QueryError => [
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_throttling_exception => Throttled,
        is_request_limit_exceeded => Throttled,
    ],
    ScanError => [
        is_provisioned_throughput_exceeded_exception => Throttled,
        is_throttling_exception => Throttled,
        is_request_limit_exceeded => Throttled,
    ],
}

/// The kind of a failed call, if it is one of [`Kind`].
pub(super) fn kind<E: Classify<Kind>>(e: &SdkError<E>) -> Option<Kind> {
    e.as_service_error().and_then(Classify::kind)
}

/// A failed write conditional on lease `key`: a failed condition means
/// the lease is not ours.
pub(super) fn classify<E>(key: &LeaseKey, e: SdkError<E>) -> LeaseError
where
    E: Classify<Kind> + std::error::Error + Send + Sync + 'static,
{
    if kind(&e) == Some(Kind::ConditionFailed) {
        LeaseError::Lost(key.clone())
    } else {
        failed(e)
    }
}

/// A failed call that is not about the lease's condition: throttling, or
/// a transient failure.
pub(super) fn failed<E>(e: SdkError<E>) -> LeaseError
where
    E: Classify<Kind> + std::error::Error + Send + Sync + 'static,
{
    if kind(&e) == Some(Kind::Throttled) {
        LeaseError::Throttled(Cause::new(e))
    } else {
        LeaseError::Store(Cause::new(e))
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::types::error::{
        ConditionalCheckFailedException, RequestLimitExceeded, ThrottlingException,
    };

    use super::*;
    use aws_sdk_dynamodb::config::http::HttpResponse;
    use aws_smithy_types::body::SdkBody;

    fn service<E>(error: E) -> SdkError<E> {
        let response = HttpResponse::new(400.try_into().unwrap(), SdkBody::empty());
        SdkError::service_error(error, response)
    }

    fn key() -> LeaseKey {
        LeaseKey {
            subscription: "s".into(),
            stream: "orders".into(),
            shard: "shard-0".into(),
        }
    }

    /// Catches a failed condition taken for a store failure (the keeper
    /// would retry a write it can never make instead of letting the lease
    /// go), a throttling code taken for a failure (no throttling metric, no
    /// slower retries), and the SDK's error lost as the source.
    #[test]
    fn modeled_errors_map_to_lost_throttled_or_failed() {
        let lost = classify(
            &key(),
            service(UpdateItemError::ConditionalCheckFailedException(
                ConditionalCheckFailedException::builder().build(),
            )),
        );
        assert!(matches!(lost, LeaseError::Lost(k) if k == key()));
        for throttled in [
            failed(service(PutItemError::ThrottlingException(
                ThrottlingException::builder().build(),
            ))),
            failed(service(PutItemError::RequestLimitExceeded(
                RequestLimitExceeded::builder().message("slow").build(),
            ))),
        ] {
            let LeaseError::Throttled(cause) = &throttled else {
                panic!("{throttled:?}");
            };
            assert!(
                cause
                    .get()
                    .expect("an error, not a message")
                    .downcast_ref::<SdkError<PutItemError>>()
                    .is_some(),
                "the SDK's error is the cause"
            );
        }
        let unmodeled = failed(service(GetItemError::generic(
            ErrorMetadata::builder().code("InternalServerError").build(),
        )));
        assert!(matches!(unmodeled, LeaseError::Store(_)), "{unmodeled:?}");
    }
}
