//! Per-key state in the DynamoDB lease table, committed with the checkpoint
//! by single-item conditional writes only (no `TransactWriteItems`: it
//! holds 100 items and 4 MB, and dynalite, the emulator the tests run
//! against, does not implement it).
//!
//! # Items
//! | item | `lease_group` | `shard_id` | attributes |
//! |---|---|---|---|
//! | a key's state | `<subscription>#!state#<partition key>` | `-` | `state` (B, committed, absent: none), `version` (N), and while a commit is pending: `pending` (B; absent with `pending_gone`), `pending_tag` (S), `pending_group` + `pending_shard` (the lease whose commit decides it) |
//! | a commit's manifest | `<subscription>#!commit#<tag>` | chunk number | `keys` (L of S): the keys the commit wrote |
//! | the lease | as in [`super`] | | plus `state_commit` (S): the tag of the shard's last committed state commit |
//!
//! Stream names cannot hold `!` and no shard id is `-`, so these items
//! never meet a lease's key.
//!
//! # Commit (checkpoint `C` of shard `S` with the new states `W`)
//! 0. Read `S`'s lease (owner and counter must be ours). If it names a
//!    last commit `T0`, roll `T0` forward: for each key of its manifest not
//!    in `W`, `state := pending` where `pending_tag = T0` (a no-op where
//!    it is not).
//! 1. Write the manifest of a fresh tag `T`: the keys of `W`.
//! 2. For each key of `W`: read its item, resolve its committed value (the
//!    reader's rule, below), and write `state := committed, pending :=
//!    new, pending_tag := T, version + 1`, on condition that `version` is
//!    still what was read.
//! 3. **The commit point**: update `S`'s lease, on owner and counter, with
//!    `checkpoint := C, state_commit := T`. Then delete `T0`'s manifest.
//!
//! # Reading a key
//! Its committed value is `pending` when it has a `pending_tag` equal to
//! the `state_commit` of the lease it names (`pending_gone`: no value),
//! else `state`.
//!
//! # Why it holds
//! - *Atomic with the checkpoint.* Before step 3 lands, every pending value
//!   of `T` reads as not committed (its lease names another tag); once it
//!   lands, all of them read as committed, in the same single-item write
//!   that moves the checkpoint. A crash in between leaves pending values of
//!   a tag no lease will ever name (tags are never reused): they read as
//!   not committed, and the next write of the key replaces them.
//! - *The commit point is fenced*: it is the lease write, conditional on
//!   owner and counter, so an instance that lost the lease commits
//!   nothing.
//! - *Superseding a commit loses nothing.* `state_commit` moves from `T0`
//!   to `T` only after step 0 made `state` hold `T0`'s value in every item
//!   `T0` wrote (or step 2 did, writing the committed value back as
//!   `state`): an item still pending on `T0` is one that `T` rewrites.
//! - *A zombie cannot undo a commit.* Step 2 is conditional on the item's
//!   version as read, and writes back the committed value it resolved: an
//!   instance that lost the lease either writes the true committed value
//!   with a pending value that never commits, or finds the item changed
//!   and reads it again. Rolling forward moves no version: it changes no
//!   committed value.
//! - *Keys follow their shard.* A key is written by the owner of the shard
//!   that holds it; a child starts only once its parents' `SHARD_END`
//!   checkpoint — their last commit — is durable, and resolves a parent's
//!   pending value through the parent's lease.
//!
//! Item writes of steps 0 and 2 run [`PARALLEL`] at a time, and a commit
//! that lasts renews its lease as it goes.
//!
//! Writes per checkpoint: one per key written since the last, plus the
//! manifest and the lease; plus, for keys of the previous commit that this
//! one does not write again, one roll-forward each.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::AttributeValue;

use super::error::{Kind, failed, kind};
use super::{CHECKPOINT, COUNTER, DynamoDbLeaseStore, GROUP, OWNER, SHARD, group, s};
use crate::cause::{Cause, Classify};
use crate::ids::{PartitionKey, SubscriptionName};
use crate::lease::{HeldLease, LeaseError, StateWrite};
use crate::progress::Checkpoint;

const STATE: &str = "state";
const VERSION: &str = "version";
const PENDING: &str = "pending";
const PENDING_GONE: &str = "pending_gone";
const PENDING_TAG: &str = "pending_tag";
const PENDING_GROUP: &str = "pending_group";
const PENDING_SHARD: &str = "pending_shard";
const STATE_COMMIT: &str = "state_commit";
const KEYS: &str = "keys";

/// Bytes of keys per manifest item: well under the 400 KB item limit.
const MANIFEST_CHUNK_BYTES: usize = 256 << 10;

/// Tries of step 2 for one key whose version moved meanwhile.
const ITEM_TRIES: usize = 5;

/// Item writes of a commit under way at once.
const PARALLEL: usize = 16;

/// A commit that lasts this long renews its lease as it goes (renewals
/// wait while a lease's write is under way, and the checkpoint write is).
const RENEW_DURING_COMMIT: Duration = Duration::from_secs(1);

/// Up to [`PARALLEL`] item writes under way; the first failure stops the
/// commit (what was written is pending under a tag that never commits).
#[derive(Default)]
struct Window {
    tasks: JoinSet<Result<(), LeaseError>>,
}

impl Window {
    async fn push(
        &mut self,
        write: impl Future<Output = Result<(), LeaseError>> + Send + 'static,
    ) -> Result<(), LeaseError> {
        if self.tasks.len() >= PARALLEL {
            self.next().await?;
        }
        self.tasks.spawn(write);
        Ok(())
    }

    async fn next(&mut self) -> Result<(), LeaseError> {
        match self.tasks.join_next().await {
            None => Ok(()),
            Some(joined) => joined.map_err(|e| LeaseError::Store(Cause::new(e)))?,
        }
    }

    async fn finish(mut self) -> Result<(), LeaseError> {
        while !self.tasks.is_empty() {
            self.next().await?;
        }
        Ok(())
    }
}

/// Makes commit tags unique within this process (with the owner and the
/// time, across processes).
static TAGS: AtomicU64 = AtomicU64::new(0);

type Item = HashMap<String, AttributeValue>;

fn state_item_key(subscription: &SubscriptionName, key: &PartitionKey) -> Item {
    HashMap::from([
        (GROUP.to_owned(), s(&format!("{subscription}#!state#{key}"))),
        (SHARD.to_owned(), s("-")),
    ])
}

fn manifest_group(subscription: &SubscriptionName, tag: &str) -> String {
    format!("{subscription}#!commit#{tag}")
}

fn string(item: &Item, name: &str) -> Option<String> {
    item.get(name).and_then(|v| v.as_s().ok()).cloned()
}

fn bytes(item: &Item, name: &str) -> Option<Vec<u8>> {
    item.get(name)
        .and_then(|v| v.as_b().ok())
        .map(|b| b.clone().into_inner())
}

fn version(item: &Item) -> u64 {
    item.get(VERSION)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn blob(value: &[u8]) -> AttributeValue {
    AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(value.to_vec()))
}

/// The keys of `writes`, in manifest items of at most
/// [`MANIFEST_CHUNK_BYTES`].
fn manifest_chunks(writes: &[StateWrite]) -> Vec<Vec<AttributeValue>> {
    let mut chunks = vec![Vec::new()];
    let mut size = 0;
    for write in writes {
        let len = write.key.as_str().len();
        if size + len > MANIFEST_CHUNK_BYTES && !chunks.last().is_some_and(Vec::is_empty) {
            chunks.push(Vec::new());
            size = 0;
        }
        size += len;
        if let Some(chunk) = chunks.last_mut() {
            chunk.push(s(write.key.as_str()));
        }
    }
    chunks
}

impl DynamoDbLeaseStore {
    /// The lease item of `held`, read consistently; `Lost` when it is not
    /// ours at our counter any more.
    async fn own_lease(&self, held: &HeldLease) -> Result<Item, LeaseError> {
        let item = self
            .client
            .get_item()
            .table_name(&self.table)
            .consistent_read(true)
            .set_key(Some(self.key_of(&held.key)))
            .send()
            .await
            .map_err(failed)?
            .item
            .ok_or_else(|| LeaseError::Lost(held.key.clone()))?;
        let counter = item
            .get(COUNTER)
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if string(&item, OWNER).as_deref() != Some(held.owner.as_str())
            || counter != Some(held.counter)
        {
            return Err(LeaseError::Lost(held.key.clone()));
        }
        Ok(item)
    }

    /// The `state_commit` of the lease `(group, shard)`.
    async fn commit_of(&self, group: &str, shard: &str) -> Result<Option<String>, LeaseError> {
        let item = self
            .client
            .get_item()
            .table_name(&self.table)
            .consistent_read(true)
            .key(GROUP, s(group))
            .key(SHARD, s(shard))
            .send()
            .await
            .map_err(failed)?
            .item;
        Ok(item.and_then(|i| string(&i, STATE_COMMIT)))
    }

    /// A state item's committed value (see "Reading a key"); `known` is a
    /// lease's commit already read: (group, shard, its `state_commit`).
    async fn resolve(
        &self,
        item: &Item,
        known: Option<(&str, &str, Option<&str>)>,
    ) -> Result<Option<Vec<u8>>, LeaseError> {
        if let (Some(tag), Some(group), Some(shard)) = (
            string(item, PENDING_TAG),
            string(item, PENDING_GROUP),
            string(item, PENDING_SHARD),
        ) {
            let commit = match known {
                Some((g, sh, commit)) if g == group && sh == shard => commit.map(str::to_owned),
                _ => self.commit_of(&group, &shard).await?,
            };
            if commit.as_deref() == Some(tag.as_str()) {
                return Ok(if item.contains_key(PENDING_GONE) {
                    None
                } else {
                    bytes(item, PENDING)
                });
            }
        }
        Ok(bytes(item, STATE))
    }

    async fn state_item(
        &self,
        subscription: &SubscriptionName,
        key: &PartitionKey,
    ) -> Result<Option<Item>, LeaseError> {
        Ok(self
            .client
            .get_item()
            .table_name(&self.table)
            .consistent_read(true)
            .set_key(Some(state_item_key(subscription, key)))
            .send()
            .await
            .map_err(failed)?
            .item)
    }

    /// A key's committed state (see "Reading a key").
    pub(super) async fn load_committed(
        &self,
        subscription: &SubscriptionName,
        key: &PartitionKey,
    ) -> Result<Option<Vec<u8>>, LeaseError> {
        match self.state_item(subscription, key).await? {
            None => Ok(None),
            Some(item) => self.resolve(&item, None).await,
        }
    }

    /// A checkpoint with state writes (see "Commit").
    pub(super) async fn commit_state(
        &self,
        held: &HeldLease,
        checkpoint: &Checkpoint,
        writes: &[StateWrite],
    ) -> Result<HeldLease, LeaseError> {
        let sub = &held.key.subscription;
        let mut held = held.clone();
        let mut renewed = Instant::now();
        // 0. The lease is ours; roll its last commit forward.
        let lease = self.own_lease(&held).await?;
        let previous = string(&lease, STATE_COMMIT);
        let previous_chunks = match &previous {
            Some(t0) => {
                self.roll_forward_all(&mut held, &mut renewed, t0, writes)
                    .await?
            }
            None => Vec::new(),
        };
        // 1. The manifest of a fresh tag.
        let tag = format!(
            "{}:{}:{}:{}",
            held.owner,
            held.counter,
            crate::clock::now_ms(),
            TAGS.fetch_add(1, Ordering::Relaxed)
        );
        self.write_manifest(sub, &tag, writes).await?;
        // 2. Pending values, each over the committed value it replaces.
        self.write_all_pending(&mut held, &mut renewed, &tag, previous.as_deref(), writes)
            .await?;
        // 3. The commit point.
        let now = self
            .update_held(
                &held,
                &[
                    (CHECKPOINT, s(&checkpoint.to_string())),
                    (STATE_COMMIT, s(&tag)),
                ],
                false,
            )
            .await?;
        if let Some(t0) = &previous {
            // Superseded: no one needs it again. A failure leaves garbage,
            // never a wrong value.
            for chunk in previous_chunks {
                let _ = self
                    .client
                    .delete_item()
                    .table_name(&self.table)
                    .key(GROUP, s(&manifest_group(sub, t0)))
                    .key(SHARD, s(&chunk))
                    .send()
                    .await;
            }
        }
        Ok(now)
    }

    /// Step 0 of a commit: every key of the lease's last commit `t0` that
    /// this one does not write again is rolled forward. Returns the chunks
    /// of `t0`'s manifest (deleted once the new commit lands).
    async fn roll_forward_all(
        &self,
        held: &mut HeldLease,
        renewed: &mut Instant,
        t0: &str,
        writes: &[StateWrite],
    ) -> Result<Vec<String>, LeaseError> {
        let sub = &held.key.subscription.clone();
        let writing: HashSet<&str> = writes.iter().map(|w| w.key.as_str()).collect();
        let mut chunks = Vec::new();
        let mut rolls = Window::default();
        for (chunk, keys) in self.manifest(sub, t0).await? {
            chunks.push(chunk);
            for key in keys.into_iter().filter(|k| !writing.contains(k.as_str())) {
                let (store, sub, t0) = (self.clone(), sub.clone(), t0.to_owned());
                rolls
                    .push(async move {
                        store
                            .roll_forward(&sub, &PartitionKey::new(key.as_str()), &t0)
                            .await
                    })
                    .await?;
                self.keep_alive(held, renewed).await?;
            }
        }
        rolls.finish().await?;
        Ok(chunks)
    }

    /// Step 1 of a commit: the keys it writes, under its `tag`.
    async fn write_manifest(
        &self,
        sub: &SubscriptionName,
        tag: &str,
        writes: &[StateWrite],
    ) -> Result<(), LeaseError> {
        for (i, keys) in manifest_chunks(writes).into_iter().enumerate() {
            self.client
                .put_item()
                .table_name(&self.table)
                .item(GROUP, s(&manifest_group(sub, tag)))
                .item(SHARD, s(&format!("{i:06}")))
                .item(KEYS, AttributeValue::L(keys))
                .send()
                .await
                .map_err(failed)?;
        }
        Ok(())
    }

    /// Step 2 of a commit: each write's pending value under `tag`, over
    /// the committed value it replaces (the lease's last commit being
    /// `previous`).
    async fn write_all_pending(
        &self,
        held: &mut HeldLease,
        renewed: &mut Instant,
        tag: &str,
        previous: Option<&str>,
        writes: &[StateWrite],
    ) -> Result<(), LeaseError> {
        let sub = held.key.subscription.clone();
        let lease_group = group(&sub, &held.key.stream);
        let shard = held.key.shard.as_str().to_owned();
        let mut pending = Window::default();
        for write in writes {
            let (store, sub, write, tag) =
                (self.clone(), sub.clone(), write.clone(), tag.to_owned());
            let (group, shard, previous) = (
                lease_group.clone(),
                shard.clone(),
                previous.map(str::to_owned),
            );
            pending
                .push(async move {
                    let known = (group.as_str(), shard.as_str(), previous.as_deref());
                    store.write_pending(&sub, &write, &tag, known).await
                })
                .await?;
            self.keep_alive(held, renewed).await?;
        }
        pending.finish().await
    }

    /// Renews the lease when the commit has gone on for
    /// [`RENEW_DURING_COMMIT`] since its last lease write, so that a long
    /// commit never holds the counter still (others would take the lease).
    async fn keep_alive(
        &self,
        held: &mut HeldLease,
        renewed: &mut Instant,
    ) -> Result<(), LeaseError> {
        if renewed.elapsed() >= RENEW_DURING_COMMIT {
            *held = self.update_held(held, &[], false).await?;
            *renewed = Instant::now();
        }
        Ok(())
    }

    /// The manifest of commit `tag`: (chunk id, its keys) per item.
    async fn manifest(
        &self,
        sub: &SubscriptionName,
        tag: &str,
    ) -> Result<Vec<(String, Vec<String>)>, LeaseError> {
        Ok(self
            .query_group(&manifest_group(sub, tag))
            .await?
            .iter()
            .map(|item| {
                let keys = item
                    .get(KEYS)
                    .and_then(|v| v.as_l().ok())
                    .map(|l| l.iter().filter_map(|k| k.as_s().ok().cloned()).collect())
                    .unwrap_or_default();
                (string(item, SHARD).unwrap_or_default(), keys)
            })
            .collect())
    }

    /// `state := pending` where the item is still pending on `tag`.
    async fn roll_forward(
        &self,
        sub: &SubscriptionName,
        key: &PartitionKey,
        tag: &str,
    ) -> Result<(), LeaseError> {
        let Some(item) = self.state_item(sub, key).await? else {
            return Ok(());
        };
        if string(&item, PENDING_TAG).as_deref() != Some(tag) {
            return Ok(());
        }
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(state_item_key(sub, key)))
            .condition_expression("#t = :t")
            .expression_attribute_names("#t", PENDING_TAG)
            .expression_attribute_names("#p", PENDING)
            .expression_attribute_names("#pg", PENDING_GONE)
            .expression_attribute_names("#gr", PENDING_GROUP)
            .expression_attribute_names("#sh", PENDING_SHARD)
            .expression_attribute_names("#s", STATE)
            .expression_attribute_values(":t", s(tag));
        request = match bytes(&item, PENDING) {
            Some(value) if !item.contains_key(PENDING_GONE) => request
                .update_expression("SET #s = :v REMOVE #p, #pg, #t, #gr, #sh")
                .expression_attribute_values(":v", blob(&value)),
            _ => request.update_expression("REMOVE #s, #p, #pg, #t, #gr, #sh"),
        };
        match request.send().await {
            Ok(_) => Ok(()),
            // Written meanwhile: nothing left to roll.
            Err(e) if condition_failed(&e) => Ok(()),
            Err(e) => Err(failed(e)),
        }
    }

    /// Step 2 for one key: its pending value of commit `tag`, over its
    /// committed value, conditional on its version.
    async fn write_pending(
        &self,
        sub: &SubscriptionName,
        write: &StateWrite,
        tag: &str,
        (lease_group, shard, commit): (&str, &str, Option<&str>),
    ) -> Result<(), LeaseError> {
        for _ in 0..ITEM_TRIES {
            let item = self.state_item(sub, &write.key).await?;
            let (committed, seen) = match &item {
                None => (None, None),
                Some(item) => (
                    self.resolve(item, Some((lease_group, shard, commit)))
                        .await?,
                    Some(version(item)),
                ),
            };
            let mut item = state_item_key(sub, &write.key);
            if let Some(value) = &committed {
                item.insert(STATE.to_owned(), blob(value));
            }
            match &write.state {
                Some(value) => item.insert(PENDING.to_owned(), blob(value)),
                None => item.insert(PENDING_GONE.to_owned(), AttributeValue::Bool(true)),
            };
            item.insert(PENDING_TAG.to_owned(), s(tag));
            item.insert(PENDING_GROUP.to_owned(), s(lease_group));
            item.insert(PENDING_SHARD.to_owned(), s(shard));
            item.insert(
                VERSION.to_owned(),
                AttributeValue::N((seen.unwrap_or(0) + 1).to_string()),
            );
            let mut request = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .expression_attribute_names("#v", VERSION);
            request = match seen {
                None => request.condition_expression("attribute_not_exists(#v)"),
                Some(v) => request
                    .condition_expression("#v = :v")
                    .expression_attribute_values(":v", AttributeValue::N(v.to_string())),
            };
            match request.send().await {
                Ok(_) => return Ok(()),
                // Written since it was read (a zombie's pending value, or
                // our own earlier try): read it again.
                Err(e) if condition_failed(&e) => continue,
                Err(e) => return Err(failed(e)),
            }
        }
        Err(LeaseError::Store(
            format!(
                "state of key {:?} kept changing while it was written ({ITEM_TRIES} tries)",
                write.key.as_str()
            )
            .into(),
        ))
    }
}

/// True when a conditional write found the item otherwise.
fn condition_failed<E: Classify<Kind>>(e: &SdkError<E>) -> bool {
    kind(e) == Some(Kind::ConditionFailed)
}
