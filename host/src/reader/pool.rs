//! The reader pool: acts on the lease keeper's [`Assignment`]s, starting a
//! reader task per assigned shard and stopping it when told to.
//!
//! The pool is the only stage that holds the subscription channel's and
//! settlement's senders on the readers' behalf (each reader holds clones).
//! When the keeper closes its assignments (shutdown), the pool stops every
//! reader, waits for them, and ends: its senders go with it, so the channel
//! closes once dispatch has drained it. Nothing has to be dropped from
//! outside for the pipeline to wind down.
//!
//! A stop names the reader session it is for: a stop of a lease lost and
//! since taken again leaves the new session's reader alone.
//!
//! A [`ShardReader`] reads by GetRecords polling, or by enhanced fan-out
//! when the subscription has a stream consumer (`ReaderContext::fan_out`):
//! the same task, settlement and fencing either way.

use std::collections::HashMap;

use tokio::sync::{mpsc, watch};
use tokio::task::{self, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{ReaderContext, ReaderExit, ShardReader};
use crate::ids::{SessionId, ShardId};
use crate::kinesis::{HashKeyRange, ReadFrom};
use crate::lease::{Assignment, StopReason};

/// The readers of one subscription (module docs).
pub(crate) struct ReaderPool {
    ctx: ReaderContext,
    readers: JoinSet<ReaderExit>,
    /// Each running reader by task: its shard, session and stop token.
    running: HashMap<task::Id, Running>,
}

struct Running {
    shard: ShardId,
    session: SessionId,
    cancel: CancellationToken,
}

impl ReaderPool {
    /// A pool starting readers with `ctx`.
    pub(crate) fn new(ctx: ReaderContext) -> Self {
        Self {
            ctx,
            readers: JoinSet::new(),
            running: HashMap::new(),
        }
    }

    /// Runs until `assignments` closes, then stops every reader and waits
    /// for them (each tells settlement how far it got).
    pub(crate) async fn run(mut self, mut assignments: mpsc::Receiver<Assignment>) {
        loop {
            tokio::select! {
                assignment = assignments.recv() => match assignment {
                    Some(Assignment::Read { shard, session, from, hash_keys, valid_until }) => {
                        self.start(shard, session, from, hash_keys, valid_until);
                    }
                    Some(Assignment::Stop { shard, session, why }) => self.stop(&shard, session, why),
                    None => break,
                },
                Some(joined) = self.readers.join_next_with_id() => self.finished(joined),
            }
        }
        for reader in self.running.values() {
            reader.cancel.cancel();
        }
        while let Some(joined) = self.readers.join_next_with_id().await {
            self.finished(joined);
        }
    }

    fn start(
        &mut self,
        shard: ShardId,
        session: SessionId,
        from: ReadFrom,
        hash_keys: Option<HashKeyRange>,
        valid_until: watch::Receiver<Instant>,
    ) {
        let cancel = CancellationToken::new();
        let reader = ShardReader::new(
            self.ctx.clone(),
            shard.clone(),
            session,
            from,
            hash_keys,
            cancel.clone(),
            valid_until,
        );
        let id = self.readers.spawn(reader.run()).id();
        self.running.insert(
            id,
            Running {
                shard,
                session,
                cancel,
            },
        );
    }

    fn stop(&mut self, shard: &ShardId, session: SessionId, why: StopReason) {
        if let Some(reader) = self
            .running
            .values()
            .find(|r| &r.shard == shard && r.session == session)
        {
            tracing::debug!(subscription = %self.ctx.subscription.name, shard_id = %shard, ?why, "stopping reader");
            reader.cancel.cancel();
        }
    }

    fn finished(&mut self, joined: Result<(task::Id, ReaderExit), task::JoinError>) {
        let (id, exit) = match joined {
            Ok((id, exit)) => (id, Ok(exit)),
            Err(e) => (e.id(), Err(e)),
        };
        let shard = self.running.remove(&id).map(|r| r.shard);
        let shard = shard.as_ref().map(ShardId::as_str);
        match exit {
            Ok(exit) => {
                tracing::debug!(subscription = %self.ctx.subscription.name, shard_id = shard, ?exit, "reader finished");
            }
            Err(e) => {
                tracing::error!(subscription = %self.ctx.subscription.name, shard_id = shard, error = %e, "reader task failed");
            }
        }
    }
}

#[cfg(test)]
mod tests;
