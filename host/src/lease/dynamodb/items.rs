//! A subscription's item collections ([`ItemKind`]: its parked keys, its
//! canary counts) in the lease table: one item per key, in a partition
//! per collection that no lease group can have (stream names cannot hold
//! `!`), so no sync's Query reads them.
//!
//! | attribute | type | role |
//! |---|---|---|
//! | `lease_group` | S | `<subscription>#!parked-keys`, `<subscription>#!tallies` |
//! | `shard_id` | S | the item's key (a partition key; `<canary>#<owner>`) |
//! | `revision` | N | the document's revision: every write is conditional on it |
//! | `doc` | S | the document, as JSON |
//!
//! A write is one PutItem conditional on the item's absence (revision 1)
//! or on `revision` being the one the new document was made from. A
//! fenced write first reads its lease (GetItem, strongly consistent) and
//! writes only if the fence's owner holds it (see "Items" in
//! [`crate::lease`] for what that leaves open). One collection is read with
//! one paginated Query.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::error::{Kind, failed, kind as kind_of};
use super::versions::{DOC, REVISION};
use super::{DynamoDbLeaseStore, GROUP, OWNER, SHARD, n, s};
use crate::ids::SubscriptionName;
use crate::lease::{Fence, Item, ItemKind, ItemWrite, LeaseError};

fn group(subscription: &SubscriptionName, kind: ItemKind) -> String {
    format!("{subscription}#!{}", kind.name())
}

fn decode(item: &HashMap<String, AttributeValue>) -> Option<Item> {
    let key = item.get(SHARD)?.as_s().ok()?.clone();
    let doc = item.get(DOC)?.as_s().ok()?.clone();
    let revision = item.get(REVISION)?.as_n().ok()?.parse().ok()?;
    Some(Item { key, revision, doc })
}

impl DynamoDbLeaseStore {
    pub(super) async fn query_items(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
    ) -> Result<Vec<Item>, LeaseError> {
        let items = self.query_group(&group(subscription, kind)).await?;
        items
            .iter()
            .map(|item| {
                decode(item).ok_or_else(|| {
                    LeaseError::Store(
                        format!(
                            "an item of the {} of {subscription} is malformed",
                            kind.name()
                        )
                        .into(),
                    )
                })
            })
            .collect()
    }

    pub(super) async fn get_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
    ) -> Result<Option<Item>, LeaseError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(HashMap::from([
                (GROUP.to_owned(), s(&group(subscription, kind))),
                (SHARD.to_owned(), s(key)),
            ])))
            .consistent_read(true)
            .send()
            .await
            .map_err(failed)?;
        Ok(output.item().and_then(decode))
    }

    /// Whether the fence's owner holds its lease, as a strongly
    /// consistent read says.
    async fn holds(&self, fence: &Fence) -> Result<bool, LeaseError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.key_of(&fence.lease)))
            .consistent_read(true)
            .send()
            .await
            .map_err(failed)?;
        Ok(output
            .item()
            .and_then(|item| item.get(OWNER))
            .and_then(|v| v.as_s().ok())
            .is_some_and(|owner| owner == fence.owner.as_str()))
    }

    pub(super) async fn put_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
        revision: u64,
        doc: String,
        fence: Option<&Fence>,
    ) -> Result<ItemWrite, LeaseError> {
        if let Some(fence) = fence
            && !self.holds(fence).await?
        {
            return Ok(ItemWrite::Fenced);
        }
        let item = HashMap::from([
            (GROUP.to_owned(), s(&group(subscription, kind))),
            (SHARD.to_owned(), s(key)),
            (REVISION.to_owned(), n(revision)),
            (DOC.to_owned(), s(&doc)),
        ]);
        Ok(if self.put_at_revision(item, revision).await? {
            ItemWrite::Written
        } else {
            ItemWrite::Changed
        })
    }

    pub(super) async fn remove_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
        revision: u64,
    ) -> Result<bool, LeaseError> {
        let deleted = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(HashMap::from([
                (GROUP.to_owned(), s(&group(subscription, kind))),
                (SHARD.to_owned(), s(key)),
            ])))
            .condition_expression("attribute_not_exists(#r) OR #r = :seen")
            .expression_attribute_names("#r", REVISION)
            .expression_attribute_values(":seen", n(revision))
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(true),
            Err(e) if kind_of(&e) == Some(Kind::ConditionFailed) => Ok(false),
            Err(e) => Err(failed(e)),
        }
    }
}
