//! Per-key state, exactly once with the checkpoint (contract 0.2.0
//! `state`): named values under a record's partition key that a record's
//! handler reads and writes, whose writes become durable together with the
//! checkpoint that first passes the record.
//!
//! It sits beside dispatch and the lease keeper: a lane asks the
//! [`StateStage`] for the view of each call ([`CallState`]), hands it the
//! writes of the records that acked, and the keeper commits those writes
//! with each checkpoint it writes, in the same store and the same atomic
//! write as the checkpoint.
//!
//! # What is exactly once
//! For each record, the state it sees is the state after every earlier
//! record of its key, each applied exactly once — whatever crashes,
//! hand-overs and redeliveries happen — as long as a key's records are on
//! one shard at a time (Kinesis puts a partition key on the shard its hash
//! falls in; a producer that sets explicit hash keys so that one partition
//! key spans shards breaks this) and the subscription's dispatch is
//! ordered (sequential or `by_key`; config refuses `state` with unordered
//! workers). Outputs and HTTP calls stay at least once.
//!
//! # Commit protocol
//! 1. **Stage.** A lane calls a handler with a [`CallState`]: each key's
//!    current state (the committed state, read from the store the first
//!    time a session meets the key, with the writes already staged applied)
//!    and, per input record, the writes it makes. When a record acks, its
//!    writes are staged under the record's position, before the record
//!    settles. A record whose attempt ends otherwise stages nothing; in a
//!    batch, a later record of a key whose earlier record wrote and did
//!    not ack saw writes that are being discarded, so the lane turns its
//!    ack into a retry (see [`crate::dispatch`]).
//! 2. **Commit with the checkpoint.** When the keeper writes checkpoint `C`
//!    of shard `S`, it asks for the commit of `S` up to `C`: for every
//!    key that a staged record at or before `C` wrote, the key's state after
//!    the last such record (committed state plus the deltas, in shard
//!    order). The store writes `C` and those states in one atomic write,
//!    conditional on the lease being held (owner and counter): a redb write
//!    transaction for the file store, one critical section for the memory
//!    store, and for DynamoDB pending values committed by the lease item's
//!    conditional update (see [`crate::lease::dynamodb`], whose
//!    `state` module argues it). Only when it lands does the stage's
//!    committed state move.
//! 3. **Sessions.** A lease's taking is a reader session. The stage keeps
//!    a shard's cache and staged writes for its current session only: a new
//!    session (the lease taken again) starts from the store, and a session
//!    that ends (lease lost, released, handed over) drops what it staged.
//!
//! Why it holds. (a) A record's writes are durable iff a checkpoint at or
//! past it is: they are written in the same atomic, fenced write as the
//! first checkpoint that covers the record, and staged before the record
//! settles, so no checkpoint covers a record whose writes are not staged.
//! (b) After any crash, hand-over or lease loss, the next reader starts
//! after the durable checkpoint `C` and reads state from the store, which
//! holds exactly the writes of records at or before `C`: records after `C`
//! are handled again against the state as of `C`, so none is applied twice
//! and none is lost. (c) Writes of a lost lease never land: every commit is
//! conditional on owner and counter, which the next taker changed. (d) Within
//! a session a key's records run in order on one lane, and each sees the
//! current state, which includes every earlier acked record's writes; a
//! record that did not ack staged nothing, and a later record that saw its
//! writes is handled again. (e) After a split or merge the children start
//! only once the parents' `SHARD_END` checkpoint, with every parent record's
//! writes, is durable, and they read a key's state from the store: it
//! follows the key. State is stored per subscription and key, not per
//! shard.
//!
//! Size: a commit carries one write per key touched since the last one,
//! never one per record.
//!
//! Floor 5 (settling) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod call;
mod codec;
mod stage;

#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) use call::CallState;
pub(crate) use call::{Delta, StateError};
pub(crate) use codec::{KeyState, Value};
pub(crate) use stage::StateStage;

use crate::telemetry::{Gauge, Histogram, Telemetry};

/// Commit time buckets, in seconds.
const COMMIT_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Writes per commit buckets.
const WRITES_BUCKETS: &[f64] = &[0.0, 1.0, 10.0, 50.0, 100.0, 500.0, 1_000.0, 5_000.0];

/// A subscription's state metrics.
#[derive(Clone)]
pub(crate) struct StateMetrics {
    /// Keys held in the cache.
    pub keys: Gauge,
    /// Their bytes.
    pub bytes: Gauge,
    /// Time per checkpoint write carrying state.
    pub commit_seconds: Histogram,
    /// Keys written per commit.
    pub writes: Histogram,
}

impl StateMetrics {
    /// The series of subscription `sub`.
    pub(crate) fn new(t: &Telemetry, sub: &str) -> Self {
        Self {
            keys: t.gauge(
                "shardlane_state_keys",
                "Partition keys whose state this instance holds in memory (cached or staged).",
                &[("subscription", sub)],
            ),
            bytes: t.gauge(
                "shardlane_state_bytes",
                "Bytes (names and values) of the state this instance holds in memory.",
                &[("subscription", sub)],
            ),
            commit_seconds: t.histogram(
                "shardlane_state_commit_seconds",
                "Time to write a checkpoint together with its state writes.",
                &[("subscription", sub)],
                COMMIT_BUCKETS,
            ),
            writes: t.histogram(
                "shardlane_state_writes_per_commit",
                "Keys written with one checkpoint (one write per key touched since the last).",
                &[("subscription", sub)],
                WRITES_BUCKETS,
            ),
        }
    }
}
