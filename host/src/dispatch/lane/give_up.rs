//! A lane's failure path: after a failed attempt, try again or give the
//! record up by the policy (see [`crate::failure`]), and settle what was
//! given up (skipped, or dead-lettered first).

use tokio_util::sync::CancellationToken;

use super::{BLOCKED_LOG_EVERY, DEAD_LETTER_BACKOFF, Item, Lane, Stopped, sleep};
use crate::backoff::Backoff;
use crate::channel::Record;
use crate::dispatch::HandlerFactory;
use crate::failure::{self, LastFailure, Next, ParkError, Parking, Quarantine};
use crate::ids::PluginDigest;
use crate::settlement::SettlementMsg;

impl<F: HandlerFactory> Lane<F> {
    /// After a failed attempt of one record: the record to try again (its
    /// attempt counted), or `None` when it was given up on and settled.
    pub(super) async fn after_failure(
        &mut self,
        mut item: Item,
        reason: &str,
        version: Option<PluginDigest>,
        stop: &CancellationToken,
    ) -> Result<Option<Item>, Stopped> {
        let policy = self.policy.clone();
        match policy.after_failure(item.attempt, failure::age(&item.record)) {
            Next::Retry => {}
            Next::Blocked => self.log_blocked(&item.record, item.attempt, reason),
            Next::Quarantine(q) => {
                let failure = LastFailure {
                    reason,
                    attempts: item.attempt,
                    version: version.as_ref(),
                    cause: None,
                    parking: None,
                };
                // Full: blocks as `on_failure = "block"` (see the quarantine's "Bounds").
                match self.park(&item.record, q, failure, true, stop).await? {
                    Some(Parking::Parked) => {
                        self.settle(SettlementMsg::Settle(item.ticket)).await;
                        return Ok(None);
                    }
                    // The lease is another's: the record is theirs to read
                    // again; it stays unsettled here (its session is over).
                    Some(Parking::Fenced) => return Ok(None),
                    Some(Parking::Released) | None => {}
                }
                self.log_blocked(&item.record, item.attempt, reason);
            }
            next => {
                return if self.give_up(item, next, reason, version, stop).await {
                    Ok(None)
                } else {
                    Err(Stopped)
                };
            }
        }
        item.attempt = item.attempt.saturating_add(1);
        Ok(Some(item))
    }

    /// Parks `record` in the quarantine `q` (its key's first, or a later
    /// record of a parked key), trying again with backoff while the store
    /// or the dead-letter put fails. `None` when the quarantine is full for
    /// a first record (the caller blocks it); a later record of a key at
    /// its bound waits here until the key is released.
    pub(super) async fn park(
        &mut self,
        record: &Record,
        q: &Quarantine,
        failure: LastFailure<'_>,
        first: bool,
        stop: &CancellationToken,
    ) -> Result<Option<Parking>, Stopped> {
        let mut backoff = Backoff::new(DEAD_LETTER_BACKOFF.0, DEAD_LETTER_BACKOFF.1);
        loop {
            let parked = tokio::select! {
                _ = stop.cancelled() => return Err(Stopped),
                parked = q.park(record, failure, first) => parked,
            };
            match parked {
                Ok(parking) => return Ok(Some(parking)),
                Err(ParkError::Full(e)) if first => {
                    tracing::error!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, partition_key = %record.partition_key, error = %e, "quarantine full: the record's key is not parked, the record blocks its lane until keys are released");
                    return Ok(None);
                }
                Err(e) => {
                    tracing::error!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, partition_key = %record.partition_key, error = %e, "cannot park the record; retrying (it stays unsettled)");
                    if !sleep(backoff.next_wait(), stop).await {
                        return Err(Stopped);
                    }
                }
            }
        }
    }

    /// Parks the records of `group` whose key is parked, in order, and
    /// keeps the rest (and any whose key was released meanwhile) for the
    /// handler. False when `stop` cut it off.
    pub(super) async fn forward_parked(
        &mut self,
        group: &mut Vec<Item>,
        q: &Quarantine,
        stop: &CancellationToken,
    ) -> bool {
        let mut kept = Vec::with_capacity(group.len());
        for item in std::mem::take(group) {
            if !q.is_parked(&item.record.partition_key) {
                kept.push(item);
                continue;
            }
            let version = self.version_of(&item.record);
            let failure = LastFailure {
                reason: "its key is parked",
                attempts: 0,
                version: version.as_ref(),
                cause: None,
                parking: None,
            };
            match self.park(&item.record, q, failure, false, stop).await {
                Err(Stopped) => return false,
                Ok(Some(Parking::Parked)) => {
                    self.settle(SettlementMsg::Settle(item.ticket)).await;
                }
                // Left unsettled for the shard's new owner.
                Ok(Some(Parking::Fenced)) => {}
                Ok(Some(Parking::Released) | None) => kept.push(item),
            }
        }
        *group = kept;
        true
    }

    fn log_blocked(&self, record: &Record, attempt: u32, reason: &str) {
        self.metrics.blocked.inc();
        let since = attempt.saturating_sub(self.policy.max_attempts().unwrap_or(0));
        if since.is_multiple_of(BLOCKED_LOG_EVERY) || since <= 1 {
            tracing::error!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, attempt, reason, "record blocked: out of attempts, on_failure = block keeps retrying it (the lane waits)");
        }
    }

    /// Settles a record given up on as `next` says: dead-letters it first
    /// (retrying the put until it succeeds), or skips it. False when
    /// `hard_stop` cut it off (the record then stays unsettled).
    pub(super) async fn give_up(
        &mut self,
        item: Item,
        next: Next<'_>,
        reason: &str,
        version: Option<PluginDigest>,
        stop: &CancellationToken,
    ) -> bool {
        let Item {
            record,
            ticket,
            attempt: attempts,
            ..
        } = item;
        let sub = self.subscription.name.clone();
        match next {
            Next::DeadLetter(sink) => {
                let failure = LastFailure {
                    reason,
                    attempts,
                    version: version.as_ref(),
                    cause: None,
                    parking: None,
                };
                let mut backoff = Backoff::new(DEAD_LETTER_BACKOFF.0, DEAD_LETTER_BACKOFF.1);
                loop {
                    let put = tokio::select! {
                        _ = stop.cancelled() => return false,
                        put = sink.put(&record, failure) => put,
                    };
                    match put {
                        Ok(put) => {
                            self.metrics.dead_lettered.inc();
                            tracing::warn!(subscription = %sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, partition_key = %record.partition_key, attempts, reason, dead_letter_stream = %sink.stream(), dead_letter_sequence = put.sequence, data_omitted = put.data_omitted, data_bytes = record.data.len(), "record dead-lettered");
                            break;
                        }
                        Err(e) => {
                            tracing::error!(subscription = %sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, error = %e, "dead-letter put failed; retrying (the record stays unsettled)");
                            if !sleep(backoff.next_wait(), stop).await {
                                return false;
                            }
                        }
                    }
                }
            }
            // Retry, Blocked and Quarantine never reach here (see
            // `after_failure`; a reject under quarantine dead-letters).
            Next::Skip | Next::Retry | Next::Blocked | Next::Quarantine(_) => {
                self.metrics.skipped.inc();
                tracing::error!(subscription = %sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, partition_key = %record.partition_key, attempts, reason, "record skipped");
            }
        }
        self.settle(SettlementMsg::Settle(ticket)).await;
        true
    }
}
