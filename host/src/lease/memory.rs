//! [`MemoryLeaseStore`]: leases and checkpoints in this process's memory.
//!
//! Every host instance has its own, so each instance reads every shard, and
//! checkpoints are gone when the process ends. Right for a single instance
//! that may re-read from its start position after a restart, and for tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::{
    DocKind, Fence, Heartbeat, HeldLease, Item, ItemKind, ItemWrite, Lease, LeaseError, LeaseKey,
    LeaseStore, Load, StateWrite, Survey, revision_of, rules,
};
use crate::ids::{OwnerId, PartitionKey, StreamName, SubscriptionName};
use crate::progress::Checkpoint;

/// Leases (and state) in maps behind one std mutex: every operation is a
/// short, purely in-memory critical section, never held across an
/// `.await`, so a checkpoint and its state writes land together.
#[derive(Debug, Default)]
pub(crate) struct MemoryLeaseStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    leases: BTreeMap<LeaseKey, Lease>,
    state: BTreeMap<(SubscriptionName, PartitionKey), Vec<u8>>,
    heartbeats: BTreeMap<(SubscriptionName, StreamName, OwnerId), Heartbeat>,
    /// Each subscription's documents, by kind.
    docs: BTreeMap<(SubscriptionName, DocKind), String>,
    /// Each subscription's items, by collection and key.
    items: BTreeMap<(SubscriptionName, ItemKind, String), String>,
}

impl MemoryLeaseStore {
    /// An empty store.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Sets `key`'s committed state (its stored form) before anything
    /// runs: `shardlane test --state` seeds a run with it.
    pub(crate) fn seed_state(
        &self,
        subscription: &SubscriptionName,
        key: &PartitionKey,
        stored: Vec<u8>,
    ) {
        self.with_all(|inner| {
            inner
                .state
                .insert((subscription.clone(), key.clone()), stored);
        });
    }

    /// Every key's committed state (stored form) of `subscription`, by
    /// key: what `shardlane test` prints after a run.
    pub(crate) fn states(&self, subscription: &SubscriptionName) -> Vec<(PartitionKey, Vec<u8>)> {
        self.with_all(|inner| {
            inner
                .state
                .iter()
                .filter(|((sub, _), _)| sub == subscription)
                .map(|((_, key), stored)| (key.clone(), stored.clone()))
                .collect()
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<LeaseKey, Lease>) -> R) -> R {
        self.with_all(|inner| f(&mut inner.leases))
    }

    fn with_all<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A panic while holding the lock cannot leave a lease half-written
        // (each closure assigns whole values), so a poisoned map is usable.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// Applies `update` to a lease the caller holds, if it still does.
    fn update_held(
        &self,
        held: &HeldLease,
        update: impl FnOnce(&mut Lease),
    ) -> Result<HeldLease, LeaseError> {
        self.with(|leases| {
            let (lease, now) = rules::update_held(leases.get(&held.key).cloned(), held, update)?;
            leases.insert(held.key.clone(), lease);
            Ok(now)
        })
    }
}

#[async_trait]
impl LeaseStore for MemoryLeaseStore {
    async fn read_items(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
    ) -> Result<Vec<Item>, LeaseError> {
        Ok(self.with_all(|inner| {
            inner
                .items
                .iter()
                .filter(|((s, k, _), _)| s == subscription && *k == kind)
                .map(|((_, _, key), doc)| Item {
                    key: key.clone(),
                    revision: revision_of(doc),
                    doc: doc.clone(),
                })
                .collect()
        }))
    }

    async fn read_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
    ) -> Result<Option<Item>, LeaseError> {
        Ok(self.with_all(|inner| {
            inner
                .items
                .get(&(subscription.clone(), kind, key.to_owned()))
                .map(|doc| Item {
                    key: key.to_owned(),
                    revision: revision_of(doc),
                    doc: doc.clone(),
                })
        }))
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
        Ok(self.with_all(|inner| {
            let at = (subscription.clone(), kind, key.to_owned());
            let fence = fence.map(|f| (f, inner.leases.get(&f.lease)));
            let written =
                rules::write_item(inner.items.get(&at).map(String::as_str), revision, fence);
            if written == ItemWrite::Written {
                inner.items.insert(at, doc);
            }
            written
        }))
    }

    async fn delete_item(
        &self,
        subscription: &SubscriptionName,
        kind: ItemKind,
        key: &str,
        revision: u64,
    ) -> Result<bool, LeaseError> {
        Ok(self.with_all(|inner| {
            let at = (subscription.clone(), kind, key.to_owned());
            match inner.items.get(&at) {
                Some(doc) if revision_of(doc) != revision => false,
                _ => {
                    inner.items.remove(&at);
                    true
                }
            }
        }))
    }

    async fn read_doc(
        &self,
        subscription: &SubscriptionName,
        kind: DocKind,
    ) -> Result<Option<String>, LeaseError> {
        Ok(self.with_all(|inner| inner.docs.get(&(subscription.clone(), kind)).cloned()))
    }

    async fn write_doc(
        &self,
        subscription: &SubscriptionName,
        kind: DocKind,
        revision: u64,
        doc: String,
    ) -> Result<bool, LeaseError> {
        Ok(self.with_all(|inner| {
            let key = (subscription.clone(), kind);
            let stored = rules::write_doc(inner.docs.get(&key).map(String::as_str), revision);
            if stored {
                inner.docs.insert(key, doc);
            }
            stored
        }))
    }

    async fn survey(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
    ) -> Result<Survey, LeaseError> {
        Ok(self.with_all(|inner| Survey {
            leases: inner
                .leases
                .values()
                .filter(|l| &l.key.subscription == subscription && &l.key.stream == stream)
                .cloned()
                .collect(),
            heartbeats: inner
                .heartbeats
                .iter()
                .filter(|((sub, st, _), _)| sub == subscription && st == stream)
                .map(|(_, h)| h.clone())
                .collect(),
        }))
    }

    async fn heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        load: &Load,
    ) -> Result<Heartbeat, LeaseError> {
        Ok(self.with_all(|inner| {
            let key = (subscription.clone(), stream.clone(), owner.clone());
            let beat = rules::heartbeat(inner.heartbeats.get(&key).cloned(), owner, load);
            inner.heartbeats.insert(key, beat.clone());
            beat
        }))
    }

    async fn retire_heartbeat(
        &self,
        subscription: &SubscriptionName,
        stream: &StreamName,
        owner: &OwnerId,
        counter: u64,
    ) -> Result<(), LeaseError> {
        self.with_all(|inner| {
            let key = (subscription.clone(), stream.clone(), owner.clone());
            if inner
                .heartbeats
                .get(&key)
                .is_some_and(|h| h.counter == counter)
            {
                inner.heartbeats.remove(&key);
            }
        });
        Ok(())
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
        Ok(self.with(|leases| leases.get(key).cloned()))
    }

    async fn acquire(
        &self,
        key: &LeaseKey,
        owner: &OwnerId,
        seen: Option<&Lease>,
    ) -> Result<HeldLease, LeaseError> {
        self.with(|leases| {
            let (lease, held) = rules::acquire(leases.get(key).cloned(), key, owner, seen)?;
            leases.insert(key.clone(), lease);
            Ok(held)
        })
    }

    async fn renew(&self, held: &HeldLease) -> Result<HeldLease, LeaseError> {
        self.update_held(held, |_| {})
    }

    async fn checkpoint(
        &self,
        held: &HeldLease,
        checkpoint: &Checkpoint,
        state: &[StateWrite],
    ) -> Result<HeldLease, LeaseError> {
        self.with_all(|inner| {
            let (lease, now) =
                rules::update_held(inner.leases.get(&held.key).cloned(), held, |lease| {
                    lease.checkpoint = Some(checkpoint.clone())
                })?;
            inner.leases.insert(held.key.clone(), lease);
            for write in state {
                let key = (held.key.subscription.clone(), write.key.clone());
                match &write.state {
                    Some(bytes) => inner.state.insert(key, bytes.clone()),
                    None => inner.state.remove(&key),
                };
            }
            Ok(now)
        })
    }

    async fn load_state(
        &self,
        subscription: &SubscriptionName,
        key: &PartitionKey,
    ) -> Result<Option<Vec<u8>>, LeaseError> {
        Ok(self.with_all(|inner| {
            inner
                .state
                .get(&(subscription.clone(), key.clone()))
                .cloned()
        }))
    }

    async fn release(&self, held: &HeldLease) -> Result<(), LeaseError> {
        self.update_held(held, rules::release).map(|_| ())
    }

    async fn request_handoff(&self, seen: &Lease, to: &OwnerId) -> Result<(), LeaseError> {
        self.with_all(|inner| {
            let lease = rules::request_handoff(inner.leases.get(&seen.key).cloned(), seen, to)?;
            inner.leases.insert(seen.key.clone(), lease);
            if let Some(owner) = &seen.owner {
                let key = (
                    seen.key.subscription.clone(),
                    seen.key.stream.clone(),
                    owner.clone(),
                );
                if let Some(beat) = inner.heartbeats.get_mut(&key) {
                    beat.asks += 1;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Position, SequenceNumber};

    fn key() -> LeaseKey {
        LeaseKey {
            subscription: "app".into(),
            stream: "orders".into(),
            shard: "shardId-0".into(),
        }
    }

    #[tokio::test]
    async fn writes_are_fenced_on_owner_and_counter() {
        let store = MemoryLeaseStore::new();
        let a = OwnerId::from("a");
        let b = OwnerId::from("b");
        let held_a = store.acquire(&key(), &a, None).await.unwrap();
        // b saw nothing, but the lease exists now: refused.
        assert!(matches!(
            store.acquire(&key(), &b, None).await,
            Err(LeaseError::Lost(_))
        ));
        let renewed = store.renew(&held_a).await.unwrap();
        assert_eq!(renewed.counter, held_a.counter + 1);
        // A hand-over request shows on the owner's next renewal, and does
        // not move the counter.
        let seen = store.read(&key()).await.unwrap().unwrap();
        store.request_handoff(&seen, &b).await.unwrap();
        assert!(
            store.request_handoff(&seen, &b).await.is_err(),
            "one request at a time"
        );
        let renewed = store.renew(&renewed).await.unwrap();
        assert_eq!(renewed.handoff, Some(b.clone()));
        // A stale view (old counter) cannot write.
        let cp = Checkpoint::At(Position::whole(SequenceNumber::parse("42").unwrap()));
        assert!(store.checkpoint(&held_a, &cp, &[]).await.is_err());
        // b takes it over as observed (e.g. after judging it expired).
        let seen = store.read(&key()).await.unwrap().unwrap();
        let held_b = store.acquire(&key(), &b, Some(&seen)).await.unwrap();
        assert!(
            store.checkpoint(&renewed, &cp, &[]).await.is_err(),
            "a is fenced out"
        );
        let held_b = store.checkpoint(&held_b, &cp, &[]).await.unwrap();
        store.release(&held_b).await.unwrap();
        let lease = store.read(&key()).await.unwrap().unwrap();
        assert_eq!(lease.owner, None);
        assert_eq!(lease.checkpoint, Some(cp.clone()));
        // Re-acquiring a released lease returns its checkpoint.
        let again = store.acquire(&key(), &a, Some(&lease)).await.unwrap();
        assert_eq!(again.checkpoint, Some(cp));
        assert_eq!(
            store
                .list(&"app".into(), &"orders".into())
                .await
                .unwrap()
                .len(),
            1
        );
    }
}

#[cfg(test)]
mod versions_tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::fleet_versions::{Action, Command};
    use crate::ids::PluginDigest;
    use crate::lease::update_versions;

    /// The memory store, where another writer's change lands just before
    /// this one's first write.
    struct Racing {
        inner: MemoryLeaseStore,
        raced: AtomicBool,
    }

    #[async_trait]
    impl LeaseStore for Racing {
        async fn read_doc(
            &self,
            subscription: &SubscriptionName,
            kind: DocKind,
        ) -> Result<Option<String>, LeaseError> {
            self.inner.read_doc(subscription, kind).await
        }

        async fn write_doc(
            &self,
            subscription: &SubscriptionName,
            kind: DocKind,
            revision: u64,
            doc: String,
        ) -> Result<bool, LeaseError> {
            if !self.raced.swap(true, Ordering::SeqCst) {
                let theirs = Command::Deploy(PluginDigest::of(b"theirs").into());
                update_versions(&self.inner, subscription, theirs, "other")
                    .await
                    .unwrap();
            }
            self.inner
                .write_doc(subscription, kind, revision, doc)
                .await
        }

        async fn survey(&self, _: &SubscriptionName, _: &StreamName) -> Result<Survey, LeaseError> {
            unreachable!()
        }
        async fn read_items(
            &self,
            _: &SubscriptionName,
            _: ItemKind,
        ) -> Result<Vec<Item>, LeaseError> {
            unreachable!()
        }
        async fn read_item(
            &self,
            _: &SubscriptionName,
            _: ItemKind,
            _: &str,
        ) -> Result<Option<Item>, LeaseError> {
            unreachable!()
        }
        async fn write_item(
            &self,
            _: &SubscriptionName,
            _: ItemKind,
            _: &str,
            _: u64,
            _: String,
            _: Option<&Fence>,
        ) -> Result<ItemWrite, LeaseError> {
            unreachable!()
        }
        async fn delete_item(
            &self,
            _: &SubscriptionName,
            _: ItemKind,
            _: &str,
            _: u64,
        ) -> Result<bool, LeaseError> {
            unreachable!()
        }
        async fn heartbeat(
            &self,
            _: &SubscriptionName,
            _: &StreamName,
            _: &OwnerId,
            _: &Load,
        ) -> Result<Heartbeat, LeaseError> {
            unreachable!()
        }
        async fn retire_heartbeat(
            &self,
            _: &SubscriptionName,
            _: &StreamName,
            _: &OwnerId,
            _: u64,
        ) -> Result<(), LeaseError> {
            unreachable!()
        }
        async fn read(&self, _: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
            unreachable!()
        }
        async fn acquire(
            &self,
            _: &LeaseKey,
            _: &OwnerId,
            _: Option<&Lease>,
        ) -> Result<HeldLease, LeaseError> {
            unreachable!()
        }
        async fn renew(&self, _: &HeldLease) -> Result<HeldLease, LeaseError> {
            unreachable!()
        }
        async fn request_handoff(&self, _: &Lease, _: &OwnerId) -> Result<(), LeaseError> {
            unreachable!()
        }
        async fn checkpoint(
            &self,
            _: &HeldLease,
            _: &Checkpoint,
            _: &[StateWrite],
        ) -> Result<HeldLease, LeaseError> {
            unreachable!()
        }
        async fn load_state(
            &self,
            _: &SubscriptionName,
            _: &PartitionKey,
        ) -> Result<Option<Vec<u8>>, LeaseError> {
            unreachable!()
        }
        async fn release(&self, _: &HeldLease) -> Result<(), LeaseError> {
            unreachable!()
        }
    }

    /// Catches: a change that overwrites another landed between its read
    /// and its write (the loop must read again and apply on top of it, so
    /// both are in the history, in the order they landed).
    #[tokio::test]
    async fn a_change_raced_by_another_is_applied_on_top_of_it() {
        let store = Racing {
            inner: MemoryLeaseStore::new(),
            raced: AtomicBool::new(false),
        };
        let app = SubscriptionName::from("app");
        let ours = PluginDigest::of(b"ours");
        update_versions(&store, &app, Command::Shadow(ours.clone().into()), "me")
            .await
            .unwrap();
        let v = store.read_versions(&app).await.unwrap().unwrap();
        assert_eq!(v.revision, 2);
        assert_eq!(v.stable, Some(PluginDigest::of(b"theirs")));
        assert_eq!(v.shadow, Some(ours));
        let actions: Vec<_> = v.history.iter().map(|c| c.action).collect();
        assert_eq!(actions, [Action::Deploy, Action::Shadow]);
    }
}
