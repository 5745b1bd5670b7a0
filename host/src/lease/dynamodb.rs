//! [`DynamoDbLeaseStore`]: leases in a DynamoDB table shared by any number
//! of host instances.
//!
//! # Table schema
//! | attribute | type | role |
//! |---|---|---|
//! | `lease_group` | S | partition key: `<subscription>#<stream>` (stream names cannot hold `#`) |
//! | `shard_id` | S | sort key |
//! | `owner` | S | the holder's owner id; absent when the lease is free |
//! | `counter` | N | bumped by every write; a counter that stops moving means its owner is gone |
//! | `checkpoint` | S | a sequence number, or `SHARD_END`; absent before the first checkpoint |
//! | `handoff_to` | S | an instance that asked the owner to hand the lease over; kept when the lease is released, as that instance's reservation; absent otherwise |
//!
//! Each instance's heartbeat (see [`super`], "Heartbeats") is an item of
//! the same group, so the one Query a sync makes reads it with the leases:
//!
//! | attribute | type | role |
//! |---|---|---|
//! | `lease_group` | S | `<subscription>#<stream>` |
//! | `shard_id` | S | `!live#<owner id>` (no shard id starts with `!`) |
//! | `owner` | S | the instance |
//! | `counter` | N | bumped by every heartbeat |
//! | `load` | S | JSON: the instance's records a second, total and busiest shards |
//! | `asks` | N | bumped by each hand-over request placed on the instance's leases |
//!
//! A table of an earlier version needs no upgrade: heartbeat items are
//! added as instances start, and earlier versions skip them (their
//! planner only looks at the stream's shard ids).
//!
//! A subscription's documents (its fleet versions) and item collections
//! (its parked keys, its canary counts) are items of the same table (see
//! the `versions` and `items` submodules).
//!
//! Per-key state lives in the same table, in items whose keys no lease can
//! have, committed with the checkpoint (see the `state` submodule).
//!
//! Billing is on demand (PAY_PER_REQUEST) when the host creates the table
//! (`create_table = true`). One Query per sync lists a subscription's leases;
//! every read is strongly consistent.
//!
//! Every write is conditional (see [`super`]): `acquire` on the lease being
//! exactly as observed (absent, or this owner and counter), `renew`,
//! `checkpoint` and `release` on `owner` and `counter` being the caller's. A
//! failed condition is [`LeaseError::Lost`]; anything else is a transient
//! [`LeaseError::Store`], which the keeper retries before it concludes a
//! lease is gone.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValue,
    ScalarAttributeType, TableStatus,
};

mod error;
mod items;
mod state;
mod versions;

use error::{classify, failed};

use super::{
    Heartbeat, HeldLease, Lease, LeaseError, LeaseKey, LeaseStore, Load, StateWrite, Survey,
};
use crate::ids::{OwnerId, PartitionKey, ShardId, StreamName, SubscriptionName};
use crate::progress::Checkpoint;

const GROUP: &str = "lease_group";
const SHARD: &str = "shard_id";
const OWNER: &str = "owner";
const COUNTER: &str = "counter";
const CHECKPOINT: &str = "checkpoint";
const HANDOFF: &str = "handoff_to";
const LOAD: &str = "load";
const ASKS: &str = "asks";
/// The sort key prefix of heartbeat items.
const LIVE: &str = "!live#";

/// How long start-up waits for a new table to become ACTIVE.
const TABLE_ACTIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// Leases in a DynamoDB table (see the module docs).
#[derive(Clone)]
pub(crate) struct DynamoDbLeaseStore {
    client: Client,
    table: String,
}

fn group(subscription: &SubscriptionName, stream: &StreamName) -> String {
    format!("{subscription}#{stream}")
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn decode(key: LeaseKey, item: &HashMap<String, AttributeValue>) -> Result<Lease, LeaseError> {
    let counter = item
        .get(COUNTER)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| LeaseError::Store(format!("lease {key} has no valid counter").into()))?;
    let checkpoint = item
        .get(CHECKPOINT)
        .and_then(|v| v.as_s().ok())
        .map(|v| Checkpoint::parse(v))
        .transpose()
        .map_err(|e| LeaseError::Store(format!("lease {key}: {e}").into()))?;
    Ok(Lease {
        owner: item
            .get(OWNER)
            .and_then(|v| v.as_s().ok())
            .map(|o| OwnerId::new(o.as_str())),
        counter,
        checkpoint,
        handoff: item
            .get(HANDOFF)
            .and_then(|v| v.as_s().ok())
            .map(|o| OwnerId::new(o.as_str())),
        key,
    })
}

/// A heartbeat item as stored (module docs); a `load` that does not
/// parse reads as no load (it only steers balancing).
fn decode_heartbeat(item: &HashMap<String, AttributeValue>) -> Result<Heartbeat, LeaseError> {
    let owner = item
        .get(OWNER)
        .and_then(|v| v.as_s().ok())
        .ok_or_else(|| LeaseError::Store("a heartbeat item has no owner".into()))?;
    let counter = item
        .get(COUNTER)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            LeaseError::Store(format!("heartbeat of {owner} has no valid counter").into())
        })?;
    let load = item
        .get(LOAD)
        .and_then(|v| v.as_s().ok())
        .and_then(|v| Load::from_json(v))
        .unwrap_or_default();
    let asks = item
        .get(ASKS)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(Heartbeat {
        owner: OwnerId::new(owner.as_str()),
        counter,
        load,
        asks,
    })
}

/// Creates the lease table (on demand, keyed by group and shard); a table
/// another instance created meanwhile is as good.
async fn create_table(client: &Client, table: &str) -> anyhow::Result<()> {
    let attribute = |name| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
    };
    let key = |name, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
    };
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute(GROUP)?)
        .attribute_definitions(attribute(SHARD)?)
        .key_schema(key(GROUP, KeyType::Hash)?)
        .key_schema(key(SHARD, KeyType::Range)?)
        .send()
        .await;
    match created {
        Ok(_) => tracing::info!(table, "lease table created"),
        // Another instance created it first.
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) => {}
        Err(e) => anyhow::bail!(
            "cannot create lease table {table:?}: {}",
            DisplayErrorContext(&e)
        ),
    }
    Ok(())
}

/// Waits, up to [`TABLE_ACTIVE_TIMEOUT`], for the table to be ACTIVE
/// (creation is asynchronous).
async fn wait_until_active(client: &Client, table: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + TABLE_ACTIVE_TIMEOUT;
    loop {
        let status = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot describe lease table {table:?}: {}",
                    DisplayErrorContext(&e)
                )
            })?
            .table()
            .and_then(|t| t.table_status().cloned());
        if status == Some(TableStatus::Active) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "lease table {table:?} not ACTIVE within {TABLE_ACTIVE_TIMEOUT:?} (status {status:?})"
        );
        // Polling the table's status: creation is asynchronous.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl DynamoDbLeaseStore {
    /// A store on `table`. With `create`, creates the table when it does not
    /// exist and waits until it is ACTIVE; without, checks that it exists.
    ///
    /// # Errors
    /// When the table does not exist (and may not be created), cannot be
    /// created, or does not become active.
    pub(crate) async fn open(client: Client, table: &str, create: bool) -> anyhow::Result<Self> {
        let described = client.describe_table().table_name(table).send().await;
        match described {
            Ok(_) => {}
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                anyhow::ensure!(
                    create,
                    "lease table {table:?} does not exist (set `lease.create_table = true` to create it)"
                );
                create_table(&client, table).await?;
            }
            Err(e) => anyhow::bail!(
                "cannot describe lease table {table:?}: {}",
                DisplayErrorContext(&e)
            ),
        }
        wait_until_active(&client, table).await?;
        Ok(Self {
            client,
            table: table.to_owned(),
        })
    }

    /// Every item whose `lease_group` is `group`, all pages, read
    /// consistently.
    async fn query_group(
        &self,
        group: &str,
    ) -> Result<Vec<HashMap<String, AttributeValue>>, LeaseError> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("#g = :g")
                .expression_attribute_names("#g", GROUP)
                .expression_attribute_values(":g", s(group))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(failed)?;
            let last = page.last_evaluated_key().filter(|l| !l.is_empty()).cloned();
            items.extend(page.items.unwrap_or_default());
            match last {
                Some(last) => start = Some(last),
                None => return Ok(items),
            }
        }
    }

    fn heartbeat_key(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
    ) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (GROUP.to_owned(), s(&group(subscription, stream))),
            (SHARD.to_owned(), s(&format!("{LIVE}{owner}"))),
        ])
    }

    fn key_of(&self, key: &LeaseKey) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (GROUP.to_owned(), s(&group(&key.subscription, &key.stream))),
            (SHARD.to_owned(), s(key.shard.as_str())),
        ])
    }

    /// Bumps the counter of a lease the caller holds, applying `set`/`remove`
    /// clauses too, conditional on owner and counter.
    async fn update_held(
        &self,
        held: &HeldLease,
        extra_set: &[(&str, AttributeValue)],
        remove_owner: bool,
    ) -> Result<HeldLease, LeaseError> {
        let mut update = "SET #c = #c + :one".to_owned();
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.key_of(&held.key)))
            .condition_expression("#o = :me AND #c = :seen")
            .expression_attribute_names("#c", COUNTER)
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":me", s(held.owner.as_str()))
            .expression_attribute_values(":seen", n(held.counter))
            .return_values(ReturnValue::AllNew);
        for (i, (attribute, value)) in extra_set.iter().enumerate() {
            update.push_str(&format!(", #x{i} = :x{i}"));
            request = request
                .expression_attribute_names(format!("#x{i}"), *attribute)
                .expression_attribute_values(format!(":x{i}"), value.clone());
        }
        if remove_owner {
            // The hand-over request stays: the asker's reservation.
            update.push_str(" REMOVE #o");
        }
        let output = request
            .update_expression(update)
            .send()
            .await
            .map_err(|e| classify(&held.key, e))?;
        let now = output
            .attributes()
            .map(|item| decode(held.key.clone(), item))
            .transpose()?;
        Ok(HeldLease {
            counter: now.as_ref().map_or(held.counter + 1, |l| l.counter),
            handoff: now.and_then(|l| l.handoff),
            ..held.clone()
        })
    }
}

#[async_trait]
impl LeaseStore for DynamoDbLeaseStore {
    async fn read_items(
        &self,
        subscription: &SubscriptionName,
        kind: super::ItemKind,
    ) -> Result<Vec<super::Item>, LeaseError> {
        self.query_items(subscription, kind).await
    }

    async fn read_item(
        &self,
        subscription: &SubscriptionName,
        kind: super::ItemKind,
        key: &str,
    ) -> Result<Option<super::Item>, LeaseError> {
        self.get_item(subscription, kind, key).await
    }

    async fn write_item(
        &self,
        subscription: &SubscriptionName,
        kind: super::ItemKind,
        key: &str,
        revision: u64,
        doc: String,
        fence: Option<&super::Fence>,
    ) -> Result<super::ItemWrite, LeaseError> {
        self.put_item(subscription, kind, key, revision, doc, fence)
            .await
    }

    async fn delete_item(
        &self,
        subscription: &SubscriptionName,
        kind: super::ItemKind,
        key: &str,
        revision: u64,
    ) -> Result<bool, LeaseError> {
        self.remove_item(subscription, kind, key, revision).await
    }

    async fn read_doc(
        &self,
        subscription: &SubscriptionName,
        kind: super::DocKind,
    ) -> Result<Option<String>, LeaseError> {
        self.get_doc(subscription, kind).await
    }

    async fn write_doc(
        &self,
        subscription: &SubscriptionName,
        kind: super::DocKind,
        revision: u64,
        doc: String,
    ) -> Result<bool, LeaseError> {
        self.put_doc(subscription, kind, revision, doc).await
    }

    async fn survey(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
    ) -> Result<Survey, LeaseError> {
        let mut survey = Survey::default();
        for item in self.query_group(&group(subscription, stream)).await? {
            let Some(shard) = item.get(SHARD).and_then(|v| v.as_s().ok()) else {
                continue;
            };
            if shard.starts_with(LIVE) {
                survey.heartbeats.push(decode_heartbeat(&item)?);
                continue;
            }
            let key = LeaseKey {
                subscription: subscription.clone(),
                stream: stream.clone(),
                shard: ShardId::new(shard.as_str()),
            };
            survey.leases.push(decode(key, &item)?);
        }
        Ok(survey)
    }

    async fn heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        load: &Load,
    ) -> Result<Heartbeat, LeaseError> {
        let load = load.to_json();
        let output = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.heartbeat_key(subscription, stream, owner)))
            .update_expression("SET #c = if_not_exists(#c, :base) + :one, #o = :me, #l = :load")
            .expression_attribute_names("#c", COUNTER)
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_names("#l", LOAD)
            // A new heartbeat starts at the wall clock (see `heartbeat_base`).
            .expression_attribute_values(":base", n(super::heartbeat_base()))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":me", s(owner.as_str()))
            .expression_attribute_values(":load", s(&load))
            .return_values(ReturnValue::AllNew)
            .send()
            .await
            .map_err(failed)?;
        match output.attributes() {
            Some(item) => decode_heartbeat(item),
            None => Err(LeaseError::Store(
                format!("heartbeat of {owner}: no attributes returned").into(),
            )),
        }
    }

    async fn retire_heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        counter: u64,
    ) -> Result<(), LeaseError> {
        let deleted = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(self.heartbeat_key(subscription, stream, owner)))
            .condition_expression("#c = :seen")
            .expression_attribute_names("#c", COUNTER)
            .expression_attribute_values(":seen", n(counter))
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(()),
            // It moved: its instance is alive after all, and keeps it.
            Err(e) if error::kind(&e) == Some(error::Kind::ConditionFailed) => Ok(()),
            Err(e) => Err(failed(e)),
        }
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .consistent_read(true)
            .set_key(Some(self.key_of(key)))
            .send()
            .await
            .map_err(failed)?;
        output
            .item()
            .map(|item| decode(key.clone(), item))
            .transpose()
    }

    async fn acquire(
        &self,
        key: &LeaseKey,
        owner: &OwnerId,
        seen: Option<&Lease>,
    ) -> Result<HeldLease, LeaseError> {
        match seen {
            None => {
                let mut item = self.key_of(key);
                item.insert(OWNER.to_owned(), s(owner.as_str()));
                item.insert(COUNTER.to_owned(), n(1));
                self.client
                    .put_item()
                    .table_name(&self.table)
                    .set_item(Some(item))
                    .condition_expression("attribute_not_exists(#s)")
                    .expression_attribute_names("#s", SHARD)
                    .send()
                    .await
                    .map_err(|e| classify(key, e))?;
                Ok(HeldLease {
                    key: key.clone(),
                    owner: owner.clone(),
                    counter: 1,
                    checkpoint: None,
                    handoff: None,
                })
            }
            Some(seen) => {
                let mut request = self
                    .client
                    .update_item()
                    .table_name(&self.table)
                    .set_key(Some(self.key_of(key)))
                    .update_expression("SET #o = :me, #c = #c + :one REMOVE #h")
                    .expression_attribute_names("#h", HANDOFF)
                    .expression_attribute_names("#o", OWNER)
                    .expression_attribute_names("#c", COUNTER)
                    .expression_attribute_values(":me", s(owner.as_str()))
                    .expression_attribute_values(":one", n(1))
                    .expression_attribute_values(":seen", n(seen.counter))
                    .return_values(ReturnValue::AllNew);
                request = match &seen.owner {
                    None => request.condition_expression("#c = :seen AND attribute_not_exists(#o)"),
                    Some(previous) => request
                        .condition_expression("#c = :seen AND #o = :prev")
                        .expression_attribute_values(":prev", s(previous.as_str())),
                };
                let output = request.send().await.map_err(|e| classify(key, e))?;
                let lease = match output.attributes() {
                    Some(item) => decode(key.clone(), item)?,
                    None => {
                        return Err(LeaseError::Store(
                            format!("lease {key}: no attributes returned").into(),
                        ));
                    }
                };
                Ok(HeldLease {
                    key: key.clone(),
                    owner: owner.clone(),
                    counter: lease.counter,
                    checkpoint: lease.checkpoint,
                    handoff: None,
                })
            }
        }
    }

    async fn renew(&self, held: &HeldLease) -> Result<HeldLease, LeaseError> {
        self.update_held(held, &[], false).await
    }

    async fn checkpoint(
        &self,
        held: &HeldLease,
        checkpoint: &Checkpoint,
        state: &[StateWrite],
    ) -> Result<HeldLease, LeaseError> {
        if !state.is_empty() {
            return self.commit_state(held, checkpoint, state).await;
        }
        self.update_held(held, &[(CHECKPOINT, s(&checkpoint.to_string()))], false)
            .await
    }

    async fn load_state(
        &self,
        subscription: &SubscriptionName,
        key: &PartitionKey,
    ) -> Result<Option<Vec<u8>>, LeaseError> {
        self.load_committed(subscription, key).await
    }

    async fn release(&self, held: &HeldLease) -> Result<(), LeaseError> {
        self.update_held(held, &[], true).await.map(|_| ())
    }

    async fn request_handoff(&self, seen: &Lease, to: &OwnerId) -> Result<(), LeaseError> {
        let Some(owner) = &seen.owner else {
            return Err(LeaseError::Lost(seen.key.clone()));
        };
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.key_of(&seen.key)))
            .update_expression("SET #h = :to")
            .condition_expression("#o = :owner AND #c = :seen AND attribute_not_exists(#h)")
            .expression_attribute_names("#h", HANDOFF)
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_names("#c", COUNTER)
            .expression_attribute_values(":to", s(to.as_str()))
            .expression_attribute_values(":owner", s(owner.as_str()))
            .expression_attribute_values(":seen", n(seen.counter))
            .send()
            .await
            .map_err(|e| classify(&seen.key, e))?;
        // The hint: the owner's heartbeat, where it looks every interval.
        let hinted = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.heartbeat_key(
                &seen.key.subscription,
                &seen.key.stream,
                owner,
            )))
            .update_expression("ADD #a :one")
            .condition_expression("attribute_exists(#o)")
            .expression_attribute_names("#a", ASKS)
            .expression_attribute_names("#o", OWNER)
            .expression_attribute_values(":one", n(1))
            .send()
            .await;
        if let Err(e) = hinted {
            tracing::debug!(owner = %owner, error = %DisplayErrorContext(&e), "hand-over hint not placed; the owner sees the request at its next sync");
        }
        Ok(())
    }
}
