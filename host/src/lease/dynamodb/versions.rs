//! A subscription's documents ([`DocKind`]: its fleet versions) in the
//! lease table: one item per subscription and kind, in a
//! partition no lease group can have (stream names cannot hold `!`), so no
//! sync's Query reads it and an earlier version of the host never sees it.
//!
//! | attribute | type | role |
//! |---|---|---|
//! | `lease_group` | S | `<subscription>#!versions` |
//! | `shard_id` | S | `-` |
//! | `revision` | N | the value's revision: every write is conditional on it |
//! | `doc` | S | the value, as JSON (the versions keep at most [`HISTORY_KEPT`] history entries: well under the 400 KB an item holds) |
//!
//! A write is a PutItem conditional on the item's absence (revision 1) or
//! on `revision` being the one the new value was made from; a failed
//! condition answers false. Reads are strongly
//! consistent: an instance that just wrote reads its own write.
//!
//! [`HISTORY_KEPT`]: crate::fleet_versions::HISTORY_KEPT

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::error::{Kind, failed, kind as kind_of};
use super::{DynamoDbLeaseStore, GROUP, SHARD, n, s};
use crate::ids::SubscriptionName;
use crate::lease::{DocKind, LeaseError};

/// The attribute every document's and item's write is conditional on.
pub(super) const REVISION: &str = "revision";
/// The attribute holding a document or an item.
pub(super) const DOC: &str = "doc";

fn key(subscription: &SubscriptionName, kind: DocKind) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (
            GROUP.to_owned(),
            s(&format!("{subscription}#!{}", kind.name())),
        ),
        (SHARD.to_owned(), s("-")),
    ])
}

impl DynamoDbLeaseStore {
    pub(super) async fn get_doc(
        &self,
        subscription: &SubscriptionName,
        kind: DocKind,
    ) -> Result<Option<String>, LeaseError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(subscription, kind)))
            .consistent_read(true)
            .send()
            .await
            .map_err(failed)?;
        let Some(item) = output.item() else {
            return Ok(None);
        };
        let doc = item.get(DOC).and_then(|v| v.as_s().ok()).ok_or_else(|| {
            LeaseError::Store(
                format!("the {} of {subscription}: no {DOC} attribute", kind.name()).into(),
            )
        })?;
        Ok(Some(doc.clone()))
    }

    pub(super) async fn put_doc(
        &self,
        subscription: &SubscriptionName,
        kind: DocKind,
        revision: u64,
        doc: String,
    ) -> Result<bool, LeaseError> {
        let mut item = key(subscription, kind);
        item.insert(REVISION.to_owned(), n(revision));
        item.insert(DOC.to_owned(), s(&doc));
        self.put_at_revision(item, revision).await
    }

    /// Puts `item`, whose `revision` attribute is `revision`, if the
    /// stored one's is `revision - 1` (absent for revision 1): false when
    /// another write came first. Documents and items alike.
    pub(super) async fn put_at_revision(
        &self,
        item: HashMap<String, AttributeValue>,
        revision: u64,
    ) -> Result<bool, LeaseError> {
        let request = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .expression_attribute_names("#r", REVISION);
        let request = if revision <= 1 {
            request.condition_expression("attribute_not_exists(#r)")
        } else {
            request
                .condition_expression("#r = :seen")
                .expression_attribute_values(":seen", n(revision - 1))
        };
        match request.send().await {
            Ok(_) => Ok(true),
            Err(e) if kind_of(&e) == Some(Kind::ConditionFailed) => Ok(false),
            Err(e) => Err(failed(e)),
        }
    }
}
