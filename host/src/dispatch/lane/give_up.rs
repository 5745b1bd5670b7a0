//! A lane's failure path: after a failed attempt, try again or give the
//! record up by the policy (see [`crate::failure`]), and settle what was
//! given up (skipped, or dead-lettered first).

use tokio_util::sync::CancellationToken;

use super::{BLOCKED_LOG_EVERY, DEAD_LETTER_BACKOFF, Item, Lane, Stopped, sleep};
use crate::backoff::Backoff;
use crate::channel::Record;
use crate::dispatch::HandlerFactory;
use crate::failure::{self, LastFailure, Next};
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
            // Retry and Blocked never reach here (see `after_failure`).
            Next::Skip | Next::Retry | Next::Blocked => {
                self.metrics.skipped.inc();
                tracing::error!(subscription = %sub, lane = self.id.0, shard_id = %record.shard, sequence_number = %record.sequence, partition_key = %record.partition_key, attempts, reason, "record skipped");
            }
        }
        self.settle(SettlementMsg::Settle(ticket)).await;
        true
    }
}
