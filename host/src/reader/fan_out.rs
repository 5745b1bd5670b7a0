//! The enhanced fan-out kind of shard reader: the same [`ShardReader`]
//! (settlement, lease validity, KPL de-aggregation, the channel), fed by a
//! `SubscribeToShard` event stream instead of GetRecords polling.
//!
//! Loop: subscribe from the reader's position (after the last record
//! handed out, or the checkpoint, or the start position); take events one
//! at a time, handing each one's records out before taking the next (a full
//! channel holds the subscription; nothing is buffered beyond one event);
//! after each event the position moves to its continuation sequence number.
//! A subscription that ends (Kinesis ends each after five minutes), fails,
//! or sends nothing for [`EVENT_TIMEOUT`] is replaced by a new one from the
//! position; `ResourceInUseException` (the previous owner's subscription
//! is still open) and `LimitExceededException` back off and retry.
//!
//! The end of a closed shard: Kinesis sends a last event with no
//! continuation and the child shards. Not every service does (kinesis-local
//! keeps sending empty events with a continuation), so after [`PROBE_AFTER`]
//! of events without records the reader also asks GetRecords once, after
//! its position: an answer with no next iterator (and no records) means the
//! shard is closed and read to its end. Two calls per quiet shard per
//! [`PROBE_AFTER`], well within any read budget. Cancelling the
//! reader (lease lost, handed over, shutdown) drops the subscription, which
//! closes its connection.

use std::time::Duration;

use super::{ReaderExit, Reading, ShardEvents, ShardReader, ShardSubscriber};
use crate::ids::Position;
use crate::kinesis::{FanOutEvent, KinesisError, ReadFrom};
use crate::settlement::SettlementMsg;

/// A subscription that sends no event for this long is replaced (Kinesis
/// sends one at least every few seconds, with or without records).
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);
/// After this long without records, the reader checks whether the shard
/// has ended (module docs).
const PROBE_AFTER: Duration = Duration::from_secs(10);

impl ShardReader {
    /// Reads the shard through `fan_out` until cancelled or the shard
    /// ends (module docs).
    pub(super) async fn subscribe_loop(
        &mut self,
        fan_out: &dyn ShardSubscriber,
        reading: &mut Reading,
    ) -> ReaderExit {
        loop {
            if self.lease_valid().await.is_none() {
                return ReaderExit::Cancelled;
            }
            let subscription = match self.subscribe(fan_out, reading).await {
                Ok(Some(subscription)) => subscription,
                Ok(None) => continue,
                Err(exit) => return exit,
            };
            if let Some(exit) = self.read_events(subscription, reading).await {
                return exit;
            }
        }
    }

    /// Subscribes to the shard at the reader's position; `Ok(None)` after
    /// a failure it backed off from.
    async fn subscribe(
        &mut self,
        fan_out: &dyn ShardSubscriber,
        reading: &mut Reading,
    ) -> Result<Option<Box<dyn ShardEvents>>, ReaderExit> {
        let subscribe = fan_out.subscribe(&self.shard, &self.position);
        let subscribed = tokio::select! {
            _ = self.cancel.cancelled() => return Err(ReaderExit::Cancelled),
            r = subscribe => r,
        };
        match subscribed {
            Ok(subscription) => {
                self.opened_at_position();
                tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, position = ?self.position, "subscribed to the shard");
                self.ctx.status.reader_positioned(&self.shard);
                Ok(Some(subscription))
            }
            Err(e) => {
                let wait = reading.backoff.next_wait();
                if let KinesisError::Throttled(_) = e {
                    reading.throttles.inc();
                }
                tracing::warn!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, error = %e, ?wait, "cannot subscribe to the shard; retrying");
                self.sleep(wait).await.map(|()| None)
            }
        }
    }

    /// Hands out a subscription's events until it ends, fails, stays
    /// silent or outlives the lease's validity (`None`: subscribe again),
    /// or until the reader ends (`Some`).
    async fn read_events(
        &mut self,
        mut subscription: Box<dyn ShardEvents>,
        reading: &mut Reading,
    ) -> Option<ReaderExit> {
        let sub = self.ctx.subscription.name.clone();
        let mut quiet_since = tokio::time::Instant::now();
        let mut events = 0u64;
        loop {
            let until = *self.valid_until.borrow();
            let next = tokio::select! {
                _ = self.cancel.cancelled() => return Some(ReaderExit::Cancelled),
                // Past the lease's validity: no subscription is kept open
                // on a lease that may have changed hands (the caller waits
                // for a renewal, or for the stop).
                _ = tokio::time::sleep_until(until) => {
                    if tokio::time::Instant::now() < *self.valid_until.borrow() {
                        // Renewed meanwhile.
                        continue;
                    }
                    tracing::warn!(subscription = %sub, shard_id = %self.shard, "lease not renewed within its duration; subscription closed until it is");
                    return None;
                }
                _ = tokio::time::sleep(EVENT_TIMEOUT) => {
                    tracing::warn!(subscription = %sub, shard_id = %self.shard, timeout = ?EVENT_TIMEOUT, "no event from the shard subscription; subscribing again");
                    return None;
                }
                e = subscription.next() => e,
            };
            let event = match next {
                Ok(Some(event)) => event,
                Ok(None) => {
                    tracing::debug!(subscription = %sub, shard_id = %self.shard, events, "shard subscription ended; subscribing again");
                    if events == 0 {
                        // Ended before its first event: not the five-minute
                        // end. Back off before the next.
                        let wait = reading.backoff.next_wait();
                        return self.sleep(wait).await.err();
                    }
                    return None;
                }
                Err(KinesisError::Malformed(e)) => {
                    tracing::error!(subscription = %sub, shard_id = %self.shard, error = %e, "bad sequence number from Kinesis; reader stops");
                    return Some(ReaderExit::Cancelled);
                }
                Err(e) => {
                    let wait = reading.backoff.next_wait();
                    tracing::warn!(subscription = %sub, shard_id = %self.shard, error = %e, ?wait, "shard subscription failed; subscribing again");
                    return self.sleep(wait).await.err();
                }
            };
            events += 1;
            if let Some(exit) = self.on_event(event, reading, &mut quiet_since).await {
                return Some(exit);
            }
        }
    }

    /// One event: its records handed out, the position moved to its
    /// continuation, and the shard's end told (by the event, or by a
    /// probe of a shard quiet for [`PROBE_AFTER`]). `Some` when the reader
    /// ends.
    async fn on_event(
        &mut self,
        event: FanOutEvent,
        reading: &mut Reading,
        quiet_since: &mut tokio::time::Instant,
    ) -> Option<ReaderExit> {
        reading.backoff.reset();
        reading.behind.set(event.millis_behind);
        self.ctx.status.lag(&self.shard, event.millis_behind);
        if event.records.is_empty() {
            reading.reads_empty.inc();
        } else {
            *quiet_since = tokio::time::Instant::now();
            reading.reads_with_records.inc();
            if !self.hand_out(event.records, reading).await {
                return Some(ReaderExit::Cancelled);
            }
        }
        if event.millis_behind == 0 && !self.quiet_at_tip().await {
            return Some(ReaderExit::Cancelled);
        }
        if let Some(continuation) = event.continuation {
            let next = Position::whole(continuation);
            let ahead = match &self.position {
                ReadFrom::After(p) => &next > p,
                ReadFrom::Start(_) | ReadFrom::At(_) => true,
            };
            if ahead && self.skip_through.is_none() {
                self.position = ReadFrom::After(next);
            }
        }
        let mut ended = event.shard_ended;
        if !ended && quiet_since.elapsed() >= PROBE_AFTER {
            *quiet_since = tokio::time::Instant::now();
            ended = self.probe_end().await;
        }
        if !ended {
            return None;
        }
        tracing::info!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, "shard read to its end");
        let end = SettlementMsg::End {
            shard: self.shard.clone(),
            session: self.session,
        };
        Some(if self.send_settlement(end).await {
            ReaderExit::ShardEnd
        } else {
            ReaderExit::Cancelled
        })
    }

    /// Whether the shard is closed and read to its end: one GetRecords
    /// after the reader's position (module docs). False when it cannot
    /// say (a failed call, a position inside an aggregate or not yet
    /// known).
    async fn probe_end(&self) -> bool {
        if self.skip_through.is_some() || !matches!(self.position, ReadFrom::After(_)) {
            return false;
        }
        let probe = async {
            let iterator = self
                .ctx
                .reads
                .open_iterator(&self.ctx.subscription.stream, &self.shard, &self.position)
                .await?;
            self.ctx.reads.get_records(&iterator, 1).await
        };
        let page = tokio::select! {
            _ = self.cancel.cancelled() => return false,
            page = probe => page,
        };
        match page {
            Ok(page) => page.records.is_empty() && page.next_iterator.is_none(),
            Err(e) => {
                tracing::debug!(subscription = %self.ctx.subscription.name, shard_id = %self.shard, error = %e, "cannot check whether the shard ended; will ask again");
                false
            }
        }
    }
}
