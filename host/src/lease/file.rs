//! [`FileLeaseStore`]: leases and checkpoints in an embedded, crash-safe
//! database on local disk (redb), for one instance that must resume after
//! its last checkpoint when it restarts, cleanly or after `kill -9`.
//!
//! Layout: one redb file, `<path>/leases.redb`, one table `leases` keyed by
//! `subscription \x1f stream \x1f shard`, each value a small JSON document
//! (`owner`, `counter`, `checkpoint`). Every operation is one redb write
//! transaction, so the owner-and-counter conditions are checked and the new
//! value written atomically, and a committed checkpoint survives a crash
//! (redb commits are durable: fsynced before `commit` returns).
//!
//! Per-key state ([`crate::state`]) lives in a second table, `state`, keyed
//! by `subscription \x1f partition key`, each value a key's whole state in
//! its stored form. A checkpoint and its state writes are one write
//! transaction: both land, or neither.
//!
//! One process per file: redb locks the file, and a second instance on the
//! same path fails at start-up with a message that says so. Since only this
//! process can own leases in the file, leases left owned by an earlier
//! process (one that was killed) are released when the store opens, so a
//! restarted instance resumes at once instead of waiting for them to expire.
//!
//! A file that cannot be read as a lease database stops start-up with one
//! line naming it, never a silent fresh start: an empty (0-byte) file, which
//! redb itself would take for a new database, included. Resuming from
//! nothing would handle every record again (`start = "trim_horizon"`) or
//! skip what arrived while the host was down (`start = "latest"`); moving the
//! file away is the operator's decision.
//!
//! A subscription's documents — its fleet versions ([`crate::fleet_versions`])
//! — live in a third table, `versions`, keyed by subscription, each value
//! the JSON document; its item collections — its parked keys
//! ([`crate::parked`]), its canary counts — in a fourth, `items`, keyed by
//! `subscription \x1f kind \x1f key`. A write checks the revision (and a
//! fenced one the lease's owner) and stores the new value in one write
//! transaction.
//!
//! Heartbeats (see [`super`]) are kept in memory: only this process can
//! open the file, so no other instance ever reads them, and leases an
//! earlier process left are released at open, not judged by heartbeat.
//!
//! redb is synchronous; each call runs on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::{
    DocKind, Fence, Heartbeat, HeldLease, Item, ItemKind, ItemWrite, Lease, LeaseError, LeaseKey,
    LeaseStore, Load, StateWrite, Survey, revision_of, rules,
};
use crate::cause::Cause;
use crate::ids::{OwnerId, PartitionKey, ShardId, StreamName, SubscriptionName};
use crate::progress::Checkpoint;

/// A document's key in [`DOCS`]: the subscription alone for its versions
/// (as an earlier version stored them).
fn doc_key(subscription: &SubscriptionName, kind: DocKind) -> String {
    match kind {
        DocKind::Versions => subscription.to_string(),
    }
}

const LEASES: TableDefinition<&str, &str> = TableDefinition::new("leases");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
/// Each subscription's documents ([`DocKind`]). Named for the first of
/// them: a file of an earlier version holds its versions here already.
const DOCS: TableDefinition<&str, &str> = TableDefinition::new("versions");
/// Each subscription's items ([`ItemKind`]), keyed by
/// `subscription \x1f kind \x1f key`.
const ITEMS: TableDefinition<&str, &str> = TableDefinition::new("items");
const SEP: char = '\u{1f}';

/// An item's key in [`ITEMS`].
fn item_key(subscription: &SubscriptionName, kind: ItemKind, key: &str) -> String {
    format!("{subscription}{SEP}{}{SEP}{key}", kind.name())
}

/// The stored form of one lease.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    owner: Option<String>,
    counter: u64,
    checkpoint: Option<String>,
    #[serde(default)]
    handoff: Option<String>,
}

/// Why the file store cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum FileStoreError {
    /// The folder cannot be created.
    #[error("lease store {path}: cannot create the folder: {reason}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// Why.
        reason: std::io::Error,
    },
    /// Another process has the file open.
    #[error(
        "lease store {path}: already in use by another process (the file store serves one instance; use store = \"dynamodb\" to share shards between instances)"
    )]
    InUse {
        /// The database file.
        path: PathBuf,
    },
    /// The file exists but holds nothing: not a database redb wrote (a
    /// commit makes it at least a header long), but one cut short or
    /// emptied. redb would take it for a new, empty store and every shard
    /// would start over at `start`, so it is refused instead.
    #[error(
        "lease store {path}: the file is empty (0 bytes), not a lease database: its checkpoints are lost (cut short by a crash or a full disk?); restore it, or move it away to start every shard afresh at `start`"
    )]
    Empty {
        /// The database file.
        path: PathBuf,
    },
    /// redb refused to open or repair the file.
    #[error("lease store {path}: cannot open it: {reason}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What redb said.
        reason: String,
    },
}

/// Leases in an embedded redb file (see the module docs).
#[derive(Clone)]
pub struct FileLeaseStore {
    db: Arc<Database>,
    /// This process's heartbeats (module docs).
    heartbeats: Arc<super::memory::MemoryLeaseStore>,
}

fn store_error(e: impl std::error::Error + Send + Sync + 'static) -> LeaseError {
    LeaseError::Store(Cause::new(e))
}

fn state_key(subscription: &SubscriptionName, key: &PartitionKey) -> String {
    format!("{subscription}{SEP}{key}")
}

fn db_key(key: &LeaseKey) -> String {
    format!("{}{SEP}{}{SEP}{}", key.subscription, key.stream, key.shard)
}

fn decode(key: LeaseKey, value: &str) -> Result<Lease, LeaseError> {
    let stored: Stored = serde_json::from_str(value).map_err(store_error)?;
    Ok(Lease {
        key,
        owner: stored.owner.map(OwnerId::new),
        handoff: stored.handoff.map(OwnerId::new),
        counter: stored.counter,
        checkpoint: stored
            .checkpoint
            .as_deref()
            .map(Checkpoint::parse)
            .transpose()
            .map_err(store_error)?,
    })
}

fn encode(lease: &Lease) -> String {
    let stored = Stored {
        owner: lease.owner.as_ref().map(|o| o.as_str().to_owned()),
        counter: lease.counter,
        checkpoint: lease.checkpoint.as_ref().map(|c| c.to_string()),
        handoff: lease.handoff.as_ref().map(|o| o.as_str().to_owned()),
    };
    // Serializing a struct of strings and an integer cannot fail.
    serde_json::to_string(&stored).expect("lease serializes")
}

impl FileLeaseStore {
    /// Opens (or creates) the store in folder `path`, releasing leases an
    /// earlier process left owned.
    ///
    /// # Errors
    /// [`FileStoreError`] naming the path: the folder cannot be made, the
    /// file is in use by another process, is empty, or cannot be opened.
    pub fn open(path: &Path) -> Result<Self, FileStoreError> {
        std::fs::create_dir_all(path).map_err(|reason| FileStoreError::Folder {
            path: path.to_owned(),
            reason,
        })?;
        let file = path.join("leases.redb");
        // redb treats an empty file as a new database; only a missing file
        // may start a new store.
        if let Ok(meta) = std::fs::metadata(&file)
            && meta.is_file()
            && meta.len() == 0
        {
            return Err(FileStoreError::Empty { path: file });
        }
        let db = Database::create(&file).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                FileStoreError::InUse { path: file.clone() }
            }
            other => FileStoreError::Open {
                path: file.clone(),
                reason: other.to_string(),
            },
        })?;
        let open_error = |e: &dyn std::fmt::Display| FileStoreError::Open {
            path: file.clone(),
            reason: e.to_string(),
        };
        // Release what an earlier process of this instance left owned.
        let txn = db.begin_write().map_err(|e| open_error(&e))?;
        {
            let mut table = txn.open_table(LEASES).map_err(|e| open_error(&e))?;
            let mut orphans = Vec::new();
            for entry in table.iter().map_err(|e| open_error(&e))? {
                let (k, v) = entry.map_err(|e| open_error(&e))?;
                let mut stored: Stored =
                    serde_json::from_str(v.value()).map_err(|e| open_error(&e))?;
                if stored.owner.take().is_some() {
                    stored.handoff = None;
                    stored.counter += 1;
                    orphans.push((k.value().to_owned(), stored));
                }
            }
            for (k, stored) in orphans {
                let value = serde_json::to_string(&stored).map_err(|e| open_error(&e))?;
                table
                    .insert(k.as_str(), value.as_str())
                    .map_err(|e| open_error(&e))?;
            }
        }
        txn.commit().map_err(|e| open_error(&e))?;
        Ok(Self {
            db: Arc::new(db),
            heartbeats: Arc::new(super::memory::MemoryLeaseStore::new()),
        })
    }

    /// Runs `f` in one write transaction on the blocking pool; commits when
    /// `f` returns `Ok`.
    async fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut redb::Table<&str, &str>) -> Result<R, LeaseError> + Send + 'static,
    ) -> Result<R, LeaseError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_write().map_err(store_error)?;
            let result = {
                let mut table = txn.open_table(LEASES).map_err(store_error)?;
                f(&mut table)?
            };
            txn.commit().map_err(store_error)?;
            Ok(result)
        })
        .await
        .map_err(store_error)?
    }

    /// Applies `update` to a lease the caller holds, if it still does.
    async fn update_held(
        &self,
        held: &HeldLease,
        update: impl FnOnce(&mut Lease) + Send + 'static,
    ) -> Result<HeldLease, LeaseError> {
        let held = held.clone();
        self.write(move |table| {
            let current = read_in(table, &held.key)?;
            let (lease, now) = rules::update_held(current, &held, update)?;
            write_in(table, &lease)?;
            Ok(now)
        })
        .await
    }
}

/// The lease under `key` in a write transaction's table.
fn read_in(table: &redb::Table<&str, &str>, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
    table
        .get(db_key(key).as_str())
        .map_err(store_error)?
        .map(|v| decode(key.clone(), v.value()))
        .transpose()
}

/// Stores `lease` in a write transaction's table.
fn write_in(table: &mut redb::Table<&str, &str>, lease: &Lease) -> Result<(), LeaseError> {
    table
        .insert(db_key(&lease.key).as_str(), encode(lease).as_str())
        .map(|_| ())
        .map_err(store_error)
}

#[async_trait]
impl LeaseStore for FileLeaseStore {
    async fn read_items(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
    ) -> Result<Vec<Item>, LeaseError> {
        let db = self.db.clone();
        let prefix = item_key(subscription, kind, "");
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(store_error)?;
            let table = match txn.open_table(ITEMS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(store_error(e)),
            };
            let mut items = Vec::new();
            for entry in table.range(prefix.as_str()..).map_err(store_error)? {
                let (k, v) = entry.map_err(store_error)?;
                let Some(key) = k.value().strip_prefix(prefix.as_str()) else {
                    break;
                };
                let doc = v.value().to_owned();
                items.push(Item {
                    key: key.to_owned(),
                    revision: revision_of(&doc),
                    doc,
                });
            }
            Ok(items)
        })
        .await
        .map_err(store_error)?
    }

    async fn read_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
    ) -> Result<Option<Item>, LeaseError> {
        let db = self.db.clone();
        let at = item_key(subscription, kind, key);
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(store_error)?;
            let table = match txn.open_table(ITEMS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(store_error(e)),
            };
            let found = table.get(at.as_str()).map_err(store_error)?;
            Ok(found.map(|v| {
                let doc = v.value().to_owned();
                Item {
                    key,
                    revision: revision_of(&doc),
                    doc,
                }
            }))
        })
        .await
        .map_err(store_error)?
    }

    async fn write_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
        revision: u64,
        doc: String,
        fence: Option<&Fence>,
    ) -> Result<ItemWrite, LeaseError> {
        let db = self.db.clone();
        let at = item_key(subscription, kind, key);
        let fence = fence.cloned();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_write().map_err(store_error)?;
            let written = {
                let lease = match &fence {
                    Some(f) => read_in(&txn.open_table(LEASES).map_err(store_error)?, &f.lease)?,
                    None => None,
                };
                let mut table = txn.open_table(ITEMS).map_err(store_error)?;
                let current = table
                    .get(at.as_str())
                    .map_err(store_error)?
                    .map(|v| v.value().to_owned());
                let fence = fence.as_ref().map(|f| (f, lease.as_ref()));
                let written = rules::write_item(current.as_deref(), revision, fence);
                if written == ItemWrite::Written {
                    table
                        .insert(at.as_str(), doc.as_str())
                        .map_err(store_error)?;
                }
                written
            };
            txn.commit().map_err(store_error)?;
            Ok(written)
        })
        .await
        .map_err(store_error)?
    }

    async fn delete_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
        revision: u64,
    ) -> Result<bool, LeaseError> {
        let db = self.db.clone();
        let at = item_key(subscription, kind, key);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_write().map_err(store_error)?;
            let deleted = {
                let mut table = txn.open_table(ITEMS).map_err(store_error)?;
                let current = table
                    .get(at.as_str())
                    .map_err(store_error)?
                    .map(|v| revision_of(v.value()));
                let deleted = current.is_none_or(|r| r == revision);
                if deleted {
                    table.remove(at.as_str()).map_err(store_error)?;
                }
                deleted
            };
            txn.commit().map_err(store_error)?;
            Ok(deleted)
        })
        .await
        .map_err(store_error)?
    }

    async fn read_doc(
        &self,
        subscription: &SubscriptionName,
        kind: DocKind,
    ) -> Result<Option<String>, LeaseError> {
        let db = self.db.clone();
        let key = doc_key(subscription, kind);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(store_error)?;
            let table = match txn.open_table(DOCS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(store_error(e)),
            };
            let found = table.get(key.as_str()).map_err(store_error)?;
            Ok(found.map(|v| v.value().to_owned()))
        })
        .await
        .map_err(store_error)?
    }

    async fn write_doc(
        &self,
        subscription: &SubscriptionName,
        kind: DocKind,
        revision: u64,
        doc: String,
    ) -> Result<bool, LeaseError> {
        let db = self.db.clone();
        let key = doc_key(subscription, kind);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_write().map_err(store_error)?;
            let stored = {
                let mut table = txn.open_table(DOCS).map_err(store_error)?;
                let current = table
                    .get(key.as_str())
                    .map_err(store_error)?
                    .map(|v| v.value().to_owned());
                let stored = rules::write_doc(current.as_deref(), revision);
                if stored {
                    table
                        .insert(key.as_str(), doc.as_str())
                        .map_err(store_error)?;
                }
                stored
            };
            txn.commit().map_err(store_error)?;
            Ok(stored)
        })
        .await
        .map_err(store_error)?
    }

    async fn survey(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
    ) -> Result<Survey, LeaseError> {
        Ok(Survey {
            leases: self.list(subscription, stream).await?,
            heartbeats: self
                .heartbeats
                .survey(subscription, stream)
                .await?
                .heartbeats,
        })
    }

    async fn heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        load: &Load,
    ) -> Result<Heartbeat, LeaseError> {
        self.heartbeats
            .heartbeat(subscription, stream, owner, load)
            .await
    }

    async fn retire_heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        counter: u64,
    ) -> Result<(), LeaseError> {
        self.heartbeats
            .retire_heartbeat(subscription, stream, owner, counter)
            .await
    }

    async fn list(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
    ) -> Result<Vec<Lease>, LeaseError> {
        let db = self.db.clone();
        let (subscription, stream) = (subscription.clone(), stream.clone());
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(store_error)?;
            let table = match txn.open_table(LEASES) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(store_error(e)),
            };
            let prefix = format!("{subscription}{SEP}{stream}{SEP}");
            let mut leases = Vec::new();
            for entry in table.range(prefix.as_str()..).map_err(store_error)? {
                let (k, v) = entry.map_err(store_error)?;
                let Some(shard) = k.value().strip_prefix(prefix.as_str()) else {
                    break;
                };
                let key = LeaseKey {
                    subscription: subscription.clone(),
                    stream: stream.clone(),
                    shard: ShardId::new(shard),
                };
                leases.push(decode(key, v.value())?);
            }
            Ok(leases)
        })
        .await
        .map_err(store_error)?
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
        let db = self.db.clone();
        let key = key.clone();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(store_error)?;
            let table = match txn.open_table(LEASES) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(store_error(e)),
            };
            let found = table.get(db_key(&key).as_str()).map_err(store_error)?;
            found.map(|v| decode(key.clone(), v.value())).transpose()
        })
        .await
        .map_err(store_error)?
    }

    async fn acquire(
        &self,
        key: &LeaseKey,
        owner: &OwnerId,
        seen: Option<&Lease>,
    ) -> Result<HeldLease, LeaseError> {
        let (key, owner, seen) = (key.clone(), owner.clone(), seen.cloned());
        self.write(move |table| {
            let (lease, held) = rules::acquire(read_in(table, &key)?, &key, &owner, seen.as_ref())?;
            write_in(table, &lease)?;
            Ok(held)
        })
        .await
    }

    async fn renew(&self, held: &HeldLease) -> Result<HeldLease, LeaseError> {
        self.update_held(held, |_| {}).await
    }

    async fn checkpoint(
        &self,
        held: &HeldLease,
        checkpoint: &Checkpoint,
        state: &[StateWrite],
    ) -> Result<HeldLease, LeaseError> {
        let checkpoint = checkpoint.clone();
        if state.is_empty() {
            return self
                .update_held(held, move |lease| lease.checkpoint = Some(checkpoint))
                .await;
        }
        let (db, held, state) = (self.db.clone(), held.clone(), state.to_vec());
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_write().map_err(store_error)?;
            let now = {
                let mut leases = txn.open_table(LEASES).map_err(store_error)?;
                let current = read_in(&leases, &held.key)?;
                let (lease, now) = rules::update_held(current, &held, |lease| {
                    lease.checkpoint = Some(checkpoint)
                })?;
                write_in(&mut leases, &lease)?;
                let mut table = txn.open_table(STATE).map_err(store_error)?;
                for write in &state {
                    let key = state_key(&held.key.subscription, &write.key);
                    match &write.state {
                        Some(bytes) => table.insert(key.as_str(), bytes.as_slice()),
                        None => table.remove(key.as_str()),
                    }
                    .map_err(store_error)?;
                }
                now
            };
            // Dropped without a commit on any error above: nothing lands.
            txn.commit().map_err(store_error)?;
            Ok(now)
        })
        .await
        .map_err(store_error)?
    }

    async fn load_state(
        &self,
        subscription: &SubscriptionName,
        key: &PartitionKey,
    ) -> Result<Option<Vec<u8>>, LeaseError> {
        let db = self.db.clone();
        let key = state_key(subscription, key);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(store_error)?;
            let table = match txn.open_table(STATE) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(store_error(e)),
            };
            let found = table.get(key.as_str()).map_err(store_error)?;
            Ok(found.map(|v| v.value().to_vec()))
        })
        .await
        .map_err(store_error)?
    }

    async fn release(&self, held: &HeldLease) -> Result<(), LeaseError> {
        self.update_held(held, rules::release).await.map(|_| ())
    }

    async fn request_handoff(&self, seen: &Lease, to: &OwnerId) -> Result<(), LeaseError> {
        let (seen, to) = (seen.clone(), to.clone());
        self.write(move |table| {
            let lease = rules::request_handoff(read_in(table, &seen.key)?, &seen, &to)?;
            write_in(table, &lease)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Position, SequenceNumber};

    #[test]
    fn refuses_an_empty_file_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("leases.redb");
        std::fs::write(&file, b"").unwrap();
        let Err(e) = FileLeaseStore::open(dir.path()) else {
            panic!("an empty leases.redb was opened as an empty store");
        };
        assert!(
            matches!(&e, FileStoreError::Empty { path } if *path == file),
            "{e}"
        );
        let line = e.to_string();
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.contains(&file.display().to_string()), "{line}");
        assert!(line.contains("empty"), "{line}");
        // Nothing was written to it.
        assert_eq!(std::fs::metadata(&file).unwrap().len(), 0);
    }

    fn key(shard: &str) -> LeaseKey {
        LeaseKey {
            subscription: "app".into(),
            stream: "orders".into(),
            shard: shard.into(),
        }
    }

    #[tokio::test]
    async fn state_lands_with_its_checkpoint_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::At(Position::whole(SequenceNumber::parse("42").unwrap()));
        let (app, k) = (SubscriptionName::from("app"), PartitionKey::from("k"));
        let write = |state: Option<&[u8]>| StateWrite {
            key: k.clone(),
            state: state.map(<[u8]>::to_vec),
        };
        {
            let store = FileLeaseStore::open(dir.path()).unwrap();
            assert_eq!(store.load_state(&app, &k).await.unwrap(), None);
            let held = store.acquire(&key("s-1"), &"a".into(), None).await.unwrap();
            let renewed = store.renew(&held).await.unwrap();
            // A fenced write writes no state either.
            assert!(
                store
                    .checkpoint(&held, &cp, &[write(Some(b"x"))])
                    .await
                    .is_err()
            );
            assert_eq!(store.load_state(&app, &k).await.unwrap(), None);
            let held = store
                .checkpoint(&renewed, &cp, &[write(Some(b"v1"))])
                .await
                .unwrap();
            assert_eq!(
                store.load_state(&app, &k).await.unwrap().as_deref(),
                Some(&b"v1"[..])
            );
            let held = store.checkpoint(&held, &cp, &[write(None)]).await.unwrap();
            assert_eq!(store.load_state(&app, &k).await.unwrap(), None);
            let held = store.renew(&held).await.unwrap();
            store
                .checkpoint(&held, &cp, &[write(Some(b"v2"))])
                .await
                .unwrap();
        }
        // Durable across a reopen; another subscription's key is another key.
        let store = FileLeaseStore::open(dir.path()).unwrap();
        assert_eq!(
            store.load_state(&app, &k).await.unwrap().as_deref(),
            Some(&b"v2"[..])
        );
        assert_eq!(store.load_state(&"other".into(), &k).await.unwrap(), None);
    }

    #[tokio::test]
    async fn survives_reopen_and_frees_orphans() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::At(Position::within(
            SequenceNumber::parse("123456789").unwrap(),
            3,
        ));
        {
            let store = FileLeaseStore::open(dir.path()).unwrap();
            let held = store.acquire(&key("s-1"), &"a".into(), None).await.unwrap();
            let held = store.checkpoint(&held, &cp, &[]).await.unwrap();
            store.renew(&held).await.unwrap();
            assert!(
                store.checkpoint(&held, &cp, &[]).await.is_err(),
                "stale counter is fenced"
            );
            store.acquire(&key("s-2"), &"a".into(), None).await.unwrap();
            // Another subscription's lease is not listed with ours.
            let other = LeaseKey {
                subscription: "other".into(),
                ..key("s-9")
            };
            store.acquire(&other, &"a".into(), None).await.unwrap();
            assert!(
                FileLeaseStore::open(dir.path())
                    .is_err_and(|e| matches!(e, FileStoreError::InUse { .. }))
            );
        }
        let store = FileLeaseStore::open(dir.path()).unwrap();
        let leases = store.list(&"app".into(), &"orders".into()).await.unwrap();
        assert_eq!(leases.len(), 2);
        assert!(
            leases.iter().all(|l| l.owner.is_none()),
            "orphans released at open"
        );
        let s1 = leases
            .iter()
            .find(|l| l.key.shard.as_str() == "s-1")
            .unwrap();
        assert_eq!(s1.checkpoint, Some(cp.clone()));
        let held = store
            .acquire(&key("s-1"), &"b".into(), Some(s1))
            .await
            .unwrap();
        assert_eq!(held.checkpoint, Some(cp));
        store.release(&held).await.unwrap();
        assert_eq!(store.read(&key("s-1")).await.unwrap().unwrap().owner, None);
    }
}

#[cfg(test)]
mod versions_tests {
    use super::*;
    use crate::fleet_versions::{Command, FleetVersions, VersionsError};
    use crate::ids::PluginDigest;
    use crate::lease::{VersionsUpdateError, update_versions};

    /// Catches: fleet versions that do not survive a restart (a restarted
    /// host would run its config's plugin again, undoing a deploy), a
    /// write over a revision it was not made from (two deploys at once
    /// interleaving), or one subscription's versions read as another's.
    #[tokio::test]
    async fn versions_survive_reopen_and_writes_are_conditional() {
        let dir = tempfile::tempdir().unwrap();
        let app = SubscriptionName::from("app");
        let (one, two) = (PluginDigest::of(b"one"), PluginDigest::of(b"two"));
        {
            let store = FileLeaseStore::open(dir.path()).unwrap();
            assert_eq!(store.read_versions(&app).await.unwrap(), None);
            let first = update_versions(&store, &app, Command::Deploy(one.clone().into()), "t")
                .await
                .unwrap();
            // A value made from revision 0 again is refused: the store
            // holds revision 1.
            let stale = FleetVersions::default()
                .apply(Command::Deploy(two.clone().into()), "t", 0)
                .unwrap();
            assert!(matches!(
                store.write_versions(&app, &stale).await,
                Err(LeaseError::VersionsChanged(_))
            ));
            assert_eq!(store.read_versions(&app).await.unwrap(), Some(first));
            // The rules refuse through the helper too, and nothing is written.
            assert!(matches!(
                update_versions(&store, &app, Command::Deploy(one.clone().into()), "t").await,
                Err(VersionsUpdateError::Refused(VersionsError::Unchanged(_)))
            ));
        }
        let store = FileLeaseStore::open(dir.path()).unwrap();
        let back = store.read_versions(&app).await.unwrap().unwrap();
        assert_eq!((back.revision, back.stable), (1, Some(one)));
        assert_eq!(store.read_versions(&"other".into()).await.unwrap(), None);
    }
}
