//! The lease keeper's store calls, as they run in the keeper's own tasks
//! (see "Store calls never block the keeper" in [`super`]): each bounded
//! by a lease duration, each reporting back as one [`Io`] message.

use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::ids::{OwnerId, SessionId, ShardId};
use crate::kinesis::{KinesisError, ShardInfo};
use crate::lease::{
    CheckpointRequest, Heartbeat, HeldLease, Lease, LeaseError, LeaseStore, StateWrite, Survey,
};
use crate::progress::Checkpoint;

/// A store call's answer, back from its task.
pub(super) enum Io {
    Listed {
        shards: Result<Vec<ShardInfo>, KinesisError>,
        survey: Result<Survey, LeaseError>,
        /// When the listing was sent: the table read is no older.
        sent_at: Instant,
    },
    Beat {
        sent_at: Instant,
        result: Result<Heartbeat, LeaseError>,
    },
    Retired {
        owner: OwnerId,
        result: Result<(), LeaseError>,
    },
    Acquired {
        shard: ShardId,
        seen: Option<Lease>,
        sent_at: Instant,
        result: Result<HeldLease, LeaseError>,
    },
    Renewed {
        shard: ShardId,
        session: SessionId,
        sent_at: Instant,
        /// The lease, and whether this renewal wrote it (a recovered lease
        /// was written earlier, so it does not move the deadline).
        result: Result<(HeldLease, bool), LeaseError>,
    },
    Checkpointed {
        /// What was written, for which session of the lease.
        request: CheckpointRequest,
        /// How many state writes went with it.
        state_writes: usize,
        sent_at: Instant,
        result: Result<HeldLease, LeaseError>,
    },
    Released {
        shard: ShardId,
        result: Result<(), LeaseError>,
    },
    Asked {
        lease: Lease,
        fair_share: usize,
        live: usize,
        result: Result<(), LeaseError>,
    },
}

/// Runs a store call, bounded by `limit`: an answer later than a lease
/// duration is worthless, and a hung call must not hold the lease's writes.
pub(super) async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, LeaseError>>,
) -> Result<T, LeaseError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(LeaseError::Store(
            format!("no answer within {}", humantime::format_duration(limit)).into(),
        )),
    }
}

/// After a refused write: if the lease is still ours (our own earlier
/// write landed but its answer was lost), carry on with its counter;
/// otherwise it is lost.
async fn recover(
    store: &dyn LeaseStore,
    owner: &OwnerId,
    held: &HeldLease,
) -> Result<HeldLease, LeaseError> {
    match store.read(&held.key).await? {
        Some(lease) if lease.owner.as_ref() == Some(owner) => Ok(HeldLease {
            counter: lease.counter,
            handoff: lease.handoff,
            ..held.clone()
        }),
        _ => Err(LeaseError::Lost(held.key.clone())),
    }
}

/// A renewal, recovering from a lost answer; `true` when it wrote.
pub(super) async fn renew(
    store: &dyn LeaseStore,
    owner: &OwnerId,
    held: &HeldLease,
) -> Result<(HeldLease, bool), LeaseError> {
    match store.renew(held).await {
        Err(LeaseError::Lost(_)) => recover(store, owner, held).await.map(|l| (l, false)),
        other => other.map(|l| (l, true)),
    }
}

/// A checkpoint write, recovering from a lost answer (in its own task: the
/// keeper goes on). A transient failure is not retried here, where it would
/// hold the lease's only write slot: the request goes back in line and is
/// tried again after a backoff, renewals taking their turn.
pub(super) async fn checkpoint(
    store: &dyn LeaseStore,
    owner: &OwnerId,
    held: &HeldLease,
    checkpoint: &Checkpoint,
    state: &[StateWrite],
    limit: Duration,
) -> Result<HeldLease, LeaseError> {
    match bounded(limit, store.checkpoint(held, checkpoint, state)).await {
        Err(LeaseError::Lost(_)) => {
            let lease = bounded(limit, recover(store, owner, held)).await?;
            bounded(limit, store.checkpoint(&lease, checkpoint, state)).await
        }
        other => other,
    }
}

/// Releases `held`, trying again after `backoff` while the store fails
/// transiently, until `limit` has passed since the first try: by then
/// the lease has expired, and another instance takes it without us.
pub(super) async fn release(
    store: &dyn LeaseStore,
    held: &HeldLease,
    limit: Duration,
    mut backoff: Backoff,
) -> Result<(), LeaseError> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match bounded(left, store.release(held)).await {
            Err(LeaseError::Store(_) | LeaseError::Throttled(_))
                if Instant::now() + backoff.clone().next_wait() < deadline =>
            {
                // Waiting out the backoff before the next try.
                tokio::time::sleep(backoff.next_wait()).await;
            }
            other => return other,
        }
    }
}
