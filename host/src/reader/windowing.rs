//! Windows, at the reader: a shard's records placed in their tumbling
//! windows ([`crate::windows`]), and each window's close put into the
//! channel between the records where it belongs — exactly once with the
//! checkpoint.
//!
//! # The protocol
//! Windows of a shard never interleave ([`crate::windows`]): a window's
//! records come one stretch after the other, closed by the first record of
//! a later window.
//! 1. **Hold.** When a record opens a window, the reader first tracks a
//!    *hold* in settlement, right before that record, and opens its
//!    *scope*: the records it tracks until the window closes.
//! 2. **Records.** The window's records are handled as any record: an
//!    acked record's state writes are staged under its own position and
//!    commit only with a checkpoint that passes it ([`crate::state`]).
//! 3. **Close.** When the window closes (module docs of
//!    [`crate::windows`]), before the reader hands out anything after, it
//!    retains the hold once per close and puts the closes into the
//!    channel — one (`by = "shard"`) or one per key (`by = "key"`) — then
//!    ends the hold's scope and gives up its own reference. A close's state
//!    writes are staged under the position of the last record handed out
//!    before it (in the scope), and its outputs settle the hold once put;
//!    a close without outputs settles it when done.
//! 4. **Commit.** The watermark moves over a hold only when it is *done*
//!    — every close settled and every record of its scope settled — and
//!    then over the whole scope at once ([`crate::settlement`]'s
//!    watermark): a checkpoint never stops inside a window. The first
//!    checkpoint past the window carries, in one fenced write, every write
//!    of its records and of its closes.
//!
//! Why it holds. *kill -9*: before the checkpoint passes a window nothing
//! of it is committed (2, 4), and the checkpoint stays before its first
//! record; the next owner reads from there with the state as it was before
//! the window, builds the same window from the same records (a window
//! depends on arrival times only) and closes it again: the guest sees the
//! same calls. After it, the window is wholly behind the checkpoint: never
//! read, never closed again. *Hand-over*: a reader that stops leaves an
//! open window's hold in place (a hold is not a record, so the drain does
//! not wait for it); the final checkpoint stays before the window, its
//! staged writes go with the session ([`crate::state`], "Sessions"), and
//! the next owner reads the window again. *Resharding*: the end of a
//! parent shard closes its open window before settlement is told of the
//! end, and `SHARD_END` (which children wait for) is checkpointed only once
//! every hold before it is done, so a parent's windows are closed and
//! committed before its children start. *Order*: closes enter the channel
//! after every record of their window and before any later record; with
//! `by = "key"` a close goes to its key's lane (by_key or sequential
//! dispatch: config insists), after the key's records; with
//! `by = "shard"` dispatch is sequential, so every record before the
//! close has been handled when it runs.
//!
//! Outputs of a close are at least once, as a record's: a crash after they
//! are put and before the checkpoint closes the window again.
//!
//! The price, documented with the setting: a shard's checkpoint lags by up
//! to a window (and its grace, on a quiet shard), a crash re-reads up to a
//! window of records, and a window's staged writes stay in memory until it
//! commits (bounded by `state.max_per_key` per key).

use std::sync::Arc;

use crate::channel::{Record, WindowClose, Work};
use crate::ids::{PartitionKey, Position};
use crate::progress::Ticket;
use crate::settlement::SettlementMsg;
use crate::telemetry::Counter;
use crate::windows::{Closed, ShardWindows, WindowBy, WindowSpec};

use super::{ReaderContext, ShardReader};

/// A reader's windows on its shard, in one session.
pub(super) struct Windowing {
    by: WindowBy,
    windows: ShardWindows,
    /// The open window's hold.
    hold: Option<Ticket>,
    /// The last record handed out: where a close stages its writes.
    last: Option<Position>,
    late: Counter,
    closed: Counter,
}

impl Windowing {
    pub(super) fn new(ctx: &ReaderContext, spec: WindowSpec) -> Self {
        let sub = [("subscription", ctx.subscription.name.as_str())];
        Self {
            by: spec.by,
            windows: ShardWindows::new(spec),
            hold: None,
            last: None,
            late: ctx.telemetry.counter(
                "shardlane_window_late_records_total",
                "Records that came after their window closed on their shard, handled in no window.",
                &sub,
            ),
            closed: ctx.telemetry.counter(
                "shardlane_windows_closed_total",
                "Windows closed (one per window of a shard), their closes handed to the plugin.",
                &sub,
            ),
        }
    }
}

impl ShardReader {
    /// Places `record` in its window, first closing the window it closes
    /// and tracking a hold when it opens one. False when cancelled.
    pub(super) async fn window_record(&mut self, record: &mut Record) -> bool {
        let Some(w) = self.windowing.as_mut() else {
            return true;
        };
        let placed = w.windows.assign(&record.partition_key, record.arrival_ms);
        record.window = placed.window;
        if placed.window.is_none() {
            w.late.inc();
        }
        if let Some(closed) = placed.closed
            && !self.close_window(closed).await
        {
            return false;
        }
        if placed.opened {
            let hold = Ticket {
                shard: self.shard.clone(),
                session: self.session,
                offset: self.next_offset,
            };
            let msg = SettlementMsg::Hold {
                shard: self.shard.clone(),
                session: self.session,
            };
            if !self.send_settlement(msg).await {
                return false;
            }
            self.next_offset += 1;
            if let Some(w) = self.windowing.as_mut() {
                w.hold = Some(hold);
            }
        }
        true
    }

    /// Notes the record just handed out (where closes stage their writes).
    pub(super) fn handed_out(&mut self, position: &Position) {
        if let Some(w) = self.windowing.as_mut() {
            w.last = Some(position.clone());
        }
    }

    /// At the shard's tip: closes the open window once its end plus grace
    /// has passed. False when cancelled.
    pub(super) async fn quiet_at_tip(&mut self) -> bool {
        let Some(w) = self.windowing.as_mut() else {
            return true;
        };
        if !w.windows.is_open() {
            return true;
        }
        match w.windows.quiet(crate::clock::now_ms()) {
            Some(closed) => self.close_window(closed).await,
            None => true,
        }
    }

    /// At the shard's end: the open window closes. False when cancelled.
    pub(super) async fn finish_windows(&mut self) -> bool {
        let Some(w) = self.windowing.as_mut() else {
            return true;
        };
        match w.windows.finish() {
            Some(closed) => self.close_window(closed).await,
            None => true,
        }
    }

    /// Retains the hold once per close of `closed`, puts the closes into
    /// the channel, then ends the hold (step 3 of the protocol). False
    /// when cancelled: the hold then stays, and the window is read again
    /// by whoever reads the shard next.
    async fn close_window(&mut self, closed: Closed) -> bool {
        let Some(w) = self.windowing.as_mut() else {
            return true;
        };
        // A window opens with a record handed out: both are there.
        let (Some(hold), Some(stage_at)) = (w.hold.take(), w.last.clone()) else {
            return true;
        };
        w.closed.inc();
        let keys: Vec<Vec<PartitionKey>> = match w.by {
            WindowBy::Shard => vec![closed.keys],
            WindowBy::Key => closed.keys.into_iter().map(|k| vec![k]).collect(),
        };
        for keys in keys {
            if !self
                .send_settlement(SettlementMsg::Retain(hold.clone()))
                .await
            {
                return false;
            }
            let close = WindowClose {
                stream: self.ctx.subscription.stream.clone(),
                shard: self.shard.clone(),
                session: self.session,
                window: closed.window,
                keys,
                stage_at: stage_at.clone(),
                hold: hold.clone(),
            };
            if !self.deliver(Work::Close(Arc::new(close))).await {
                return false;
            }
        }
        self.send_settlement(SettlementMsg::EndHold(hold)).await
    }
}
