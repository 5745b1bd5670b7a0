//! The state stage of one subscription: the committed state of the keys
//! its lanes touch, cached per shard and reader session, and the writes of
//! acked records staged until the checkpoint that passes them commits them
//! (see "Commit protocol" in [`super`]).
//!
//! Shared by the lanes (which [`prepare_keys`](StateStage::prepare_keys) a call's
//! view and [`stage`](StateStage::stage) acked records' writes) and the
//! lease keeper (which [`open`](StateStage::open)s and
//! [`close`](StateStage::close)s a shard's session as it takes and loses
//! the lease, and asks for the [`commit`](StateStage::commit) that goes
//! with each checkpoint it writes). One std mutex, never held across an
//! `.await`: every critical section is a few map operations.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::StateMetrics;
use super::call::{CallState, Delta, Slot};
use super::codec::KeyState;
use crate::channel::Record;
use crate::config::StateConfig;
use crate::ids::{PartitionKey, Position, SessionId, ShardId, SubscriptionName};
use crate::lease::{CheckpointState, LeaseError, LeaseStore, StateWrite};
use crate::progress::{Checkpoint, Ticket};

/// Clean keys (no staged writes) kept per shard before a commit drops
/// them: a dropped key is read from the store again at its next record.
pub(crate) const CACHED_KEYS_PER_SHARD: usize = 10_000;

/// A key's state in a session.
#[derive(Debug, Default)]
struct Entry {
    /// As the store has it.
    committed: KeyState,
    /// With every staged write applied: what the next record sees.
    current: KeyState,
    /// Staged writes not yet committed.
    staged: usize,
}

/// A shard's state in one reader session.
#[derive(Debug)]
struct ShardStage {
    session: SessionId,
    keys: HashMap<PartitionKey, Entry>,
    /// The keys' current bytes, kept as they change (the metrics read it
    /// at every commit: no walk over the keys).
    bytes: usize,
    /// Acked records' writes by the record's position, in shard order.
    staged: BTreeMap<Position, Vec<(PartitionKey, Delta)>>,
    /// The commit of the checkpoint being written, if any.
    in_flight: Option<InFlight>,
}

/// The writes a checkpoint carries while it is being written: what the
/// stage's committed state becomes once it lands.
#[derive(Debug)]
struct InFlight {
    /// The checkpoint they go with.
    checkpoint: Checkpoint,
    /// The new state of every key written by a record the checkpoint
    /// passes that an earlier commit did not cover.
    states: Vec<(PartitionKey, KeyState)>,
    /// The last staged position it covers.
    upto: Option<Position>,
}

/// The state stage of one subscription (module docs).
pub(crate) struct StateStage {
    subscription: SubscriptionName,
    config: Arc<StateConfig>,
    store: Arc<dyn LeaseStore>,
    shards: Mutex<HashMap<ShardId, ShardStage>>,
    metrics: StateMetrics,
}

/// The position of a record as a checkpoint covers it: a user record of a
/// KPL aggregate by its index, any other by its sequence number.
fn position_of(record: &Record) -> Position {
    match record.sub_sequence {
        Some(sub) => Position::within(record.sequence.clone(), sub),
        None => Position::whole(record.sequence.clone()),
    }
}

fn covers(checkpoint: &Checkpoint, position: &Position) -> bool {
    match checkpoint {
        Checkpoint::ShardEnd => true,
        Checkpoint::At(at) => position <= at,
    }
}

impl StateStage {
    /// A stage reading committed state from `store`.
    pub(crate) fn new(
        subscription: SubscriptionName,
        config: Arc<StateConfig>,
        store: Arc<dyn LeaseStore>,
        metrics: StateMetrics,
    ) -> Self {
        Self {
            subscription,
            config,
            store,
            shards: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<ShardId, ShardStage>) -> R) -> R {
        // Every section leaves whole values behind: a poisoned map is usable.
        let mut guard = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// The view of a call whose inputs are these keys (a call's records'
    /// partition keys, or a window close's keys), in call order, each with
    /// its shard and reader session: each distinct key's current state,
    /// read from the store when this session has not seen the key yet.
    ///
    /// # Errors
    /// The store could not be read (the lane waits and tries again).
    pub(crate) async fn prepare_keys<'k>(
        &self,
        inputs_keys: impl Iterator<Item = (&'k PartitionKey, &'k ShardId, SessionId)>,
    ) -> Result<CallState, LeaseError> {
        let mut slots: Vec<Slot> = Vec::new();
        let mut inputs = Vec::new();
        for (key, shard, session) in inputs_keys {
            if let Some(at) = slots.iter().position(|s| s.key == *key) {
                inputs.push(at);
                continue;
            }
            let cached = self.with(|shards| {
                shards
                    .get(shard)
                    .filter(|s| s.session == session)
                    .and_then(|s| s.keys.get(key))
                    .map(|e| e.current.clone())
            });
            let state = match cached {
                Some(state) => state,
                None => self.load(key).await?,
            };
            inputs.push(slots.len());
            slots.push(Slot {
                key: key.clone(),
                base: state.clone(),
                view: state,
            });
        }
        Ok(CallState::new(
            self.config.clone(),
            crate::clock::now_ms(),
            inputs,
            slots,
        ))
    }

    async fn load(&self, key: &PartitionKey) -> Result<KeyState, LeaseError> {
        let stored = self.store.load_state(&self.subscription, key).await?;
        match stored {
            None => Ok(KeyState::default()),
            Some(bytes) => KeyState::decode(&bytes)
                .map_err(|e| LeaseError::Store(format!("state of key {key}: {e}").into())),
        }
    }

    /// Stages an acked record's writes under `key`, whose state was `base`
    /// when its call began. Writes of a session no longer current are
    /// dropped: its records are read again.
    pub(crate) fn stage(
        &self,
        record: &Record,
        ticket: &Ticket,
        key: &PartitionKey,
        base: &KeyState,
        delta: Delta,
    ) {
        let at = (&ticket.shard, ticket.session, position_of(record));
        self.stage_at(at, key, base, delta);
    }

    /// Stages writes as [`StateStage::stage`] does, under a position of
    /// the shard's `session` (a window's close: the last record handed out
    /// before it).
    pub(crate) fn stage_at(
        &self,
        (shard, session, position): (&ShardId, SessionId, Position),
        key: &PartitionKey,
        base: &KeyState,
        delta: Delta,
    ) {
        if delta.is_empty() {
            return;
        }
        self.with(|shards| {
            let Some(shard) = shards.get_mut(shard).filter(|s| s.session == session) else {
                return;
            };
            // A key dropped from the cache since the call began was clean:
            // its committed state is what the call began with.
            let mut added = false;
            let entry = shard.keys.entry(key.clone()).or_insert_with(|| {
                added = true;
                Entry {
                    committed: base.clone(),
                    current: base.clone(),
                    staged: 0,
                }
            });
            let before = if added { 0 } else { entry.current.bytes() };
            for (name, value) in &delta {
                entry.current.put(name, value.clone());
            }
            entry.staged += 1;
            shard.bytes = shard.bytes - before + entry.current.bytes();
            shard
                .staged
                .entry(position)
                .or_default()
                .push((key.clone(), delta));
        });
    }

    /// The subscription's state metrics.
    #[cfg(test)]
    pub(crate) fn metrics(&self) -> &StateMetrics {
        &self.metrics
    }

    fn report(&self) {
        let (keys, bytes) = self.with(|shards| {
            shards.values().fold((0, 0), |(k, b), s| {
                (k + s.keys.len() as u64, b + s.bytes as u64)
            })
        });
        self.metrics.keys.set(keys);
        self.metrics.bytes.set(bytes);
    }
}

/// The keeper's side (see [`CheckpointState`]).
impl CheckpointState for StateStage {
    /// The keeper took the shard's lease for `session`: its state starts
    /// afresh from the store (another instance may have written it since
    /// this one last held it).
    fn open(&self, shard: &ShardId, session: SessionId) {
        self.with(|shards| {
            shards.insert(
                shard.clone(),
                ShardStage {
                    session,
                    keys: HashMap::new(),
                    bytes: 0,
                    staged: BTreeMap::new(),
                    in_flight: None,
                },
            );
        });
        self.report();
    }

    /// The shard's `session` ended (lease lost, released, handed over):
    /// writes it staged and did not commit are dropped; its records are
    /// read again from the checkpoint by whoever takes the lease next.
    fn close(&self, shard: &ShardId, session: SessionId) {
        self.with(|shards| {
            if shards.get(shard).is_some_and(|s| s.session == session) {
                shards.remove(shard);
            }
        });
        self.report();
    }

    /// The state writes that go with checkpoint `upto` of `shard` in
    /// `session`: each key written by a staged record at or before it, in
    /// its state after the last such record. Empty for a session no
    /// longer current.
    fn commit(&self, shard: &ShardId, session: SessionId, upto: &Checkpoint) -> Vec<StateWrite> {
        self.with(|shards| {
            let Some(stage) = shards.get_mut(shard).filter(|s| s.session == session) else {
                return Vec::new();
            };
            let mut states: BTreeMap<&PartitionKey, KeyState> = BTreeMap::new();
            let mut last = None;
            for (position, writes) in stage.staged.iter().take_while(|(p, _)| covers(upto, p)) {
                for (key, delta) in writes {
                    let state = states
                        .entry(key)
                        .or_insert_with(|| stage.keys[key].committed.clone());
                    for (name, value) in delta {
                        state.put(name, value.clone());
                    }
                }
                last = Some(position.clone());
            }
            let now = crate::clock::now_ms();
            let mut writes = Vec::with_capacity(states.len());
            let mut committed = Vec::with_capacity(states.len());
            for (key, mut state) in states {
                state.drop_expired(now);
                writes.push(StateWrite {
                    key: key.clone(),
                    state: (!state.is_empty()).then(|| state.encode()),
                });
                committed.push((key.clone(), state));
            }
            stage.in_flight = Some(InFlight {
                checkpoint: upto.clone(),
                states: committed,
                upto: last,
            });
            writes
        })
    }

    /// The checkpoint is durable with the writes of its commit: their keys'
    /// committed state moves on, and clean keys beyond the cache's size are
    /// dropped.
    fn committed(&self, shard: &ShardId, session: SessionId, upto: &Checkpoint, took: Duration) {
        let landed = self.with(|shards| {
            let stage = shards.get_mut(shard).filter(|s| s.session == session)?;
            let commit = stage.in_flight.take_if(|c| c.checkpoint == *upto)?;
            if commit.states.is_empty() {
                return None;
            }
            let writes = commit.states.len();
            let Some(upto) = commit.upto else {
                return Some(writes);
            };
            let rest = match stage.staged.keys().find(|p| **p > upto).cloned() {
                Some(next) => stage.staged.split_off(&next),
                None => BTreeMap::new(),
            };
            let done = std::mem::replace(&mut stage.staged, rest);
            for (_, writes) in done {
                for (key, _) in writes {
                    if let Some(entry) = stage.keys.get_mut(&key) {
                        entry.staged -= 1;
                    }
                }
            }
            for (key, state) in commit.states {
                if let Some(entry) = stage.keys.get_mut(&key) {
                    entry.committed = state;
                }
            }
            if stage.keys.len() > CACHED_KEYS_PER_SHARD {
                let mut dropped = 0;
                stage.keys.retain(|_, e| {
                    let keep = e.staged > 0;
                    if !keep {
                        dropped += e.current.bytes();
                    }
                    keep
                });
                stage.bytes -= dropped;
            }
            Some(writes)
        });
        if let Some(writes) = landed {
            self.metrics.commit_seconds.observe_duration(took);
            self.metrics.writes.observe(writes as f64);
            self.report();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{SequenceNumber, StreamName};
    use crate::lease::memory::MemoryLeaseStore;
    use crate::lease::{HeldLease, LeaseKey};
    use crate::telemetry::Telemetry;

    const SHARD: &str = "shardId-000000000000";

    fn record(seq: u64, key: &str) -> (Record, Ticket) {
        let record = Record {
            window: None,
            stream: StreamName::from("s"),
            shard: ShardId::from(SHARD),
            partition_key: PartitionKey::from(key),
            sequence: SequenceNumber::parse(&seq.to_string()).unwrap(),
            sub_sequence: None,
            arrival_ms: 0,
            data: Vec::new(),
        };
        let ticket = Ticket {
            shard: ShardId::from(SHARD),
            session: SessionId(1),
            offset: seq,
        };
        (record, ticket)
    }

    fn at(seq: u64) -> Checkpoint {
        Checkpoint::At(Position::whole(
            SequenceNumber::parse(&seq.to_string()).unwrap(),
        ))
    }

    async fn setup() -> (Arc<MemoryLeaseStore>, StateStage, HeldLease) {
        let store = Arc::new(MemoryLeaseStore::new());
        let key = LeaseKey {
            subscription: "app".into(),
            stream: "s".into(),
            shard: SHARD.into(),
        };
        let held = store.acquire(&key, &"me".into(), None).await.unwrap();
        let stage = StateStage::new(
            "app".into(),
            Arc::new(StateConfig::default()),
            store.clone(),
            StateMetrics::new(&Telemetry::new(), "app"),
        );
        stage.open(&ShardId::from(SHARD), SessionId(1));
        (store, stage, held)
    }

    /// Handles `seq` (key `key`): adds `amount` to its "total", acks.
    async fn add(stage: &StateStage, seq: u64, key: &str, amount: u64) -> u64 {
        let (record, ticket) = record(seq, key);
        let mut call = stage
            .prepare_keys([(&record.partition_key, &ticket.shard, ticket.session)].into_iter())
            .await
            .unwrap();
        let total = call
            .get(0, "total")
            .unwrap()
            .map_or(0, |v| String::from_utf8(v).unwrap().parse::<u64>().unwrap())
            + amount;
        call.set(0, "total", total.to_string().into_bytes())
            .unwrap();
        let (key, base, delta) = call.take(0).unwrap();
        stage.stage(&record, &ticket, key, base, delta);
        total
    }

    async fn stored_total(store: &MemoryLeaseStore, key: &str) -> Option<String> {
        let bytes = store
            .load_state(&"app".into(), &PartitionKey::from(key))
            .await
            .unwrap()?;
        let state = KeyState::decode(&bytes).unwrap();
        state
            .get("total", 0)
            .map(|v| String::from_utf8(v.data.clone()).unwrap())
    }

    #[tokio::test]
    async fn a_checkpoint_commits_exactly_the_writes_of_the_records_it_passes() {
        let (store, stage, held) = setup().await;
        let shard = ShardId::from(SHARD);
        assert_eq!(add(&stage, 1, "a", 5).await, 5);
        assert_eq!(add(&stage, 2, "b", 1).await, 1);
        assert_eq!(add(&stage, 3, "a", 2).await, 7);
        // Reads see every staged write at once.
        assert_eq!(add(&stage, 4, "a", 1).await, 8);

        let writes = stage.commit(&shard, SessionId(1), &at(3));
        assert_eq!(writes.len(), 2, "one write per key, not per record");
        let held = store.checkpoint(&held, &at(3), &writes).await.unwrap();
        stage.committed(&shard, SessionId(1), &at(3), Duration::ZERO);
        assert_eq!(stored_total(&store, "a").await.as_deref(), Some("7"));
        assert_eq!(stored_total(&store, "b").await.as_deref(), Some("1"));
        // What the stage holds, reported at the commit: two keys, each one
        // value named "total" ("8" and "1").
        let weight =
            |digits: usize| ("total".len() + digits + super::super::codec::VALUE_OVERHEAD) as u64;
        assert_eq!(stage.metrics().keys.get(), 2);
        assert_eq!(stage.metrics().bytes.get(), weight(1) + weight(1));

        // Nothing new up to 3; record 4 goes with the next checkpoint.
        assert!(stage.commit(&shard, SessionId(1), &at(3)).is_empty());
        let writes = stage.commit(&shard, SessionId(1), &at(4));
        assert_eq!(writes.len(), 1);
        store.checkpoint(&held, &at(4), &writes).await.unwrap();
        stage.committed(&shard, SessionId(1), &at(4), Duration::ZERO);
        assert_eq!(stored_total(&store, "a").await.as_deref(), Some("8"));
    }

    #[tokio::test]
    async fn a_new_session_starts_from_what_was_committed() {
        let (store, stage, held) = setup().await;
        let shard = ShardId::from(SHARD);
        add(&stage, 1, "a", 5).await;
        let writes = stage.commit(&shard, SessionId(1), &at(1));
        store.checkpoint(&held, &at(1), &writes).await.unwrap();
        stage.committed(&shard, SessionId(1), &at(1), Duration::ZERO);
        // Staged, never committed: lost with the session (the lease went).
        add(&stage, 2, "a", 100).await;
        stage.close(&shard, SessionId(1));
        stage.open(&shard, SessionId(2));
        let (record, mut ticket) = record(2, "a");
        ticket.session = SessionId(2);
        let mut call = stage
            .prepare_keys([(&record.partition_key, &ticket.shard, ticket.session)].into_iter())
            .await
            .unwrap();
        assert_eq!(call.get(0, "total").unwrap(), Some(b"5".to_vec()));
        // A late write of the old session changes nothing.
        let (old, old_ticket) = super::tests::record(3, "a");
        let (key, base, delta) = {
            let mut c = stage
                .prepare_keys(
                    [(&old.partition_key, &old_ticket.shard, old_ticket.session)].into_iter(),
                )
                .await
                .unwrap();
            c.set(0, "total", b"999".to_vec()).unwrap();
            let (k, b, d) = c.take(0).unwrap();
            (k.clone(), b.clone(), d)
        };
        stage.stage(&old, &old_ticket, &key, &base, delta);
        assert!(stage.commit(&shard, SessionId(2), &at(10)).is_empty());
        assert!(stage.commit(&shard, SessionId(1), &at(10)).is_empty());
    }

    #[tokio::test]
    async fn a_refused_commit_leaves_the_store_and_the_stage_as_they_were() {
        let (store, stage, held) = setup().await;
        let shard = ShardId::from(SHARD);
        add(&stage, 1, "a", 5).await;
        let writes = stage.commit(&shard, SessionId(1), &at(1));
        // The lease changed hands: the write is refused, state and all.
        let stale = HeldLease {
            counter: held.counter + 7,
            ..held.clone()
        };
        assert!(store.checkpoint(&stale, &at(1), &writes).await.is_err());
        assert_eq!(stored_total(&store, "a").await, None);
        drop(writes);
        // Tried again, the same writes go.
        let writes = stage.commit(&shard, SessionId(1), &at(1));
        assert_eq!(writes.len(), 1);
        store.checkpoint(&held, &at(1), &writes).await.unwrap();
        stage.committed(&shard, SessionId(1), &at(1), Duration::ZERO);
        assert_eq!(stored_total(&store, "a").await.as_deref(), Some("5"));
    }

    /// Catches a stage that applies whatever is in flight on any landing:
    /// the keeper's report of another checkpoint must not move the
    /// committed state (the writes would then never be written).
    #[tokio::test]
    async fn only_the_landing_of_the_checkpoint_in_flight_moves_the_committed_state() {
        let (_store, stage, _held) = setup().await;
        let shard = ShardId::from(SHARD);
        add(&stage, 1, "a", 5).await;
        assert_eq!(stage.commit(&shard, SessionId(1), &at(1)).len(), 1);
        stage.committed(&shard, SessionId(1), &at(2), Duration::ZERO);
        stage.committed(&shard, SessionId(2), &at(1), Duration::ZERO);
        // Nothing landed: the same write is still due.
        assert_eq!(stage.commit(&shard, SessionId(1), &at(1)).len(), 1);
        stage.committed(&shard, SessionId(1), &at(1), Duration::ZERO);
        assert!(stage.commit(&shard, SessionId(1), &at(1)).is_empty());
    }

    #[test]
    fn a_checkpoint_inside_an_aggregate_covers_the_user_records_up_to_its_index() {
        let seq = SequenceNumber::parse("7").unwrap();
        let within = |i| Checkpoint::At(Position::within(seq.clone(), i));
        assert!(covers(&within(2), &Position::within(seq.clone(), 2)));
        assert!(!covers(&within(2), &Position::within(seq.clone(), 3)));
        assert!(covers(&at(7), &Position::within(seq.clone(), 9)));
        assert!(covers(&Checkpoint::ShardEnd, &Position::whole(seq)));
    }
}
