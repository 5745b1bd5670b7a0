//! How far a shard has come: the ground values that readers, settlement,
//! the lease keeper, the state stage and the status page all speak of — a
//! delivered record's [`Ticket`] (its shard, reader session and [`Offset`])
//! and a shard's stored [`Checkpoint`].
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::fmt;

use crate::ids::{Position, SessionId, ShardId};

/// The position of a tracked record within its shard's reader session.
pub(crate) type Offset = u64;

/// Where one delivered record settles.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Ticket {
    /// The record's shard.
    pub shard: ShardId,
    /// The reader session that read it.
    pub session: SessionId,
    /// Its offset within that session.
    pub offset: Offset,
}

/// Where a shard's processing stands in the lease store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkpoint {
    /// Every record up to and including this position has settled (a
    /// position may end inside a KPL aggregate: see [`Position`]).
    At(Position),
    /// The shard is closed and every record in it has settled: its children
    /// may start.
    ShardEnd,
}

impl Checkpoint {
    /// Parses the stored form: `SHARD_END` as KCL writes it, or a
    /// [`Position`] (`<sequence number>` or `<sequence number>:<index>`).
    ///
    /// # Errors
    /// When the string is neither.
    pub fn parse(value: &str) -> Result<Self, crate::ids::PositionError> {
        if value == "SHARD_END" {
            Ok(Checkpoint::ShardEnd)
        } else {
            Position::parse(value).map(Checkpoint::At)
        }
    }
}

/// The stored form (see [`Checkpoint::parse`]).
impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checkpoint::At(position) => fmt::Display::fmt(position, f),
            Checkpoint::ShardEnd => f.write_str("SHARD_END"),
        }
    }
}
