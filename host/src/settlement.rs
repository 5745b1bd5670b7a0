//! Settlement: turns out-of-order acks into safe, coalesced checkpoints.
//!
//! One settlement task per subscription owns a [`Watermark`] per shard.
//! Readers tell it about every record they read (in shard order, before the
//! record enters the channel), and the dispatch stage tells it when a record
//! has settled (ack, reject). Acks may arrive in any order; the watermark only
//! moves over the settled prefix, so the checkpoint never passes a record that
//! has not settled, wherever that record is (in a reader's hands, in the
//! channel, in a handler, waiting for a retry).
//!
//! Checkpoints are coalesced: at most one write request per shard per
//! `checkpoint_every`, plus one right away for `SHARD_END` (children wait on
//! it) and one final request per shard when the task ends. Requests go, in
//! order, to the lease keeper, which owns the leases and performs the
//! conditional write; one queue and one writer keep the writes of a shard
//! serialized, so an older sequence number never overwrites a newer one.
//!
//! Reader sessions: each time a reader (re)opens a shard it starts a new
//! session and offsets restart at 0. Tickets of an older session (records
//! still in flight when a lease was lost) are ignored: the new session
//! re-reads those records from the checkpoint.
//!
//! Floor 5 (settling) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

pub(crate) mod watermark;

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::ids::{Position, SessionId, ShardId, SubscriptionName};
use crate::lease::CheckpointRequest;
use crate::progress::{Checkpoint, Offset, Ticket};
pub(crate) use watermark::{Settled, Watermark};

/// Messages queued to the settlement task before it falls behind: it does
/// O(1) work per message, so this only absorbs bursts.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) const SETTLEMENT_QUEUE: usize = 1024;

/// What readers and dispatch tell the settlement task.
#[derive(Debug)]
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) enum SettlementMsg {
    /// A reader session opened the shard: start a fresh watermark.
    Open {
        /// The shard.
        shard: ShardId,
        /// The new session.
        session: SessionId,
    },
    /// A reader read these records, in shard order; their offsets continue
    /// from the session's previous ones.
    Track {
        /// The shard.
        shard: ShardId,
        /// The session.
        session: SessionId,
        /// The records' positions, in order (a KPL aggregate's user
        /// records each under its own).
        positions: Vec<Position>,
    },
    /// A reader tracks a window's hold (see `reader::windowing`) at the
    /// session's next offset, after the records tracked so far: the
    /// checkpoint stays before it until the window is done.
    Hold {
        /// The shard.
        shard: ShardId,
        /// The session.
        session: SessionId,
    },
    /// One more settlement the hold `ticket` waits for (a close of its
    /// window, sent before the close enters the channel).
    Retain(Ticket),
    /// The reader closed the hold's window: records it tracks from now on
    /// are outside the hold's scope, and its reference is given up.
    EndHold(Ticket),
    /// The reader stopped (lease lost, handed over, shutdown) after handing
    /// out the records below offset `delivered`; once those have settled,
    /// the shard's final checkpoint goes to the keeper marked `drained`.
    Close {
        /// The shard.
        shard: ShardId,
        /// The session.
        session: SessionId,
        /// Offsets below this were sent into the channel.
        delivered: Offset,
    },
    /// The reader reached the end of a closed shard after its last record.
    End {
        /// The shard.
        shard: ShardId,
        /// The session.
        session: SessionId,
    },
    /// A record settled (acked, or given up on by policy).
    Settle(Ticket),
    /// Several records settled (a batch's outcomes), in any order.
    SettleMany(Vec<Ticket>),
}

/// Sends to a settlement task.
pub(crate) type SettlementSender = mpsc::Sender<SettlementMsg>;

struct ShardState {
    session: SessionId,
    watermark: Watermark,
    /// The reader stopped: report when everything settled.
    closing: bool,
    /// The last checkpoint requested.
    requested: Option<Checkpoint>,
    last_request: Option<Instant>,
}

/// The settlement stage of one subscription.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Settlement {
    subscription: SubscriptionName,
    checkpoint_every: Duration,
    shards: HashMap<ShardId, ShardState>,
    checkpoints: mpsc::Sender<CheckpointRequest>,
    /// Records read but not settled, over all shards, now and at most.
    unsettled: usize,
    max_unsettled: usize,
    unsettled_gauge: Option<crate::telemetry::Gauge>,
}

impl Settlement {
    /// A settlement stage sending checkpoint requests to `checkpoints`.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn new(
        subscription: SubscriptionName,
        checkpoint_every: Duration,
        checkpoints: mpsc::Sender<CheckpointRequest>,
    ) -> Self {
        Self {
            subscription,
            checkpoint_every,
            shards: HashMap::new(),
            checkpoints,
            unsettled: 0,
            max_unsettled: 0,
            unsettled_gauge: None,
        }
    }

    /// Publishes the read-but-not-settled figure as a gauge.
    pub(crate) fn with_telemetry(mut self, telemetry: &crate::telemetry::Telemetry) -> Self {
        self.unsettled_gauge = Some(telemetry.gauge(
            "shardlane_records_unsettled",
            "Records read from Kinesis and not yet settled.",
            &[("subscription", self.subscription.as_str())],
        ));
        self
    }

    /// Runs until every sender of `inbox` is gone (readers stopped, dispatch
    /// drained), then requests each shard's final checkpoint and returns.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) async fn run(mut self, mut inbox: mpsc::Receiver<SettlementMsg>) {
        // Tick often enough that a checkpoint is requested soon after
        // `checkpoint_every` has passed, but never busy-loop.
        let tick =
            (self.checkpoint_every / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                msg = inbox.recv() => match msg {
                    Some(msg) => self.apply(msg).await,
                    None => break,
                },
                _ = ticker.tick() => {
                    if let Some(gauge) = &self.unsettled_gauge {
                        gauge.set(self.unsettled as u64);
                    }
                    self.flush(false).await;
                }
            }
        }
        self.flush(true).await;
        tracing::info!(
            subscription = %self.subscription, unsettled = self.unsettled,
            max_unsettled = self.max_unsettled, "settlement finished"
        );
    }

    async fn apply(&mut self, msg: SettlementMsg) {
        match msg {
            SettlementMsg::Open { shard, session } => {
                let previous = self.shards.insert(
                    shard.clone(),
                    ShardState {
                        session,
                        watermark: Watermark::new(),
                        closing: false,
                        requested: None,
                        last_request: None,
                    },
                );
                if let Some(prev) = previous
                    && prev.watermark.in_flight() > 0
                {
                    self.unsettled -= prev.watermark.unsettled();
                    tracing::debug!(
                        subscription = %self.subscription, shard_id = %shard,
                        abandoned = prev.watermark.in_flight(),
                        "shard reopened; records of the previous session will be read again"
                    );
                }
            }
            SettlementMsg::Track {
                shard,
                session,
                positions,
            } => {
                if let Some(state) = self.session(&shard, session) {
                    let count = positions.len();
                    for position in positions {
                        state.watermark.track(position);
                    }
                    self.unsettled += count;
                    self.max_unsettled = self.max_unsettled.max(self.unsettled);
                }
            }
            msg @ (SettlementMsg::Hold { .. }
            | SettlementMsg::Retain(_)
            | SettlementMsg::EndHold(_)) => {
                self.apply_hold(msg).await;
            }
            SettlementMsg::Close {
                shard,
                session,
                delivered,
            } => {
                if let Some(state) = self.session(&shard, session) {
                    let dropped = state.watermark.truncate(delivered);
                    state.closing = true;
                    self.unsettled -= dropped;
                    self.report_if_drained(&shard).await;
                }
            }
            SettlementMsg::End { shard, session } => {
                if let Some(state) = self.session(&shard, session) {
                    state.watermark.track_end();
                    self.request_if_ended(&shard).await;
                }
            }
            SettlementMsg::Settle(ticket) => self.settle(ticket).await,
            SettlementMsg::SettleMany(tickets) => {
                for ticket in tickets {
                    self.settle(ticket).await;
                }
            }
        }
    }

    /// A window's hold: tracked, retained by a close, or ended by its
    /// reader (see the watermark's module docs).
    async fn apply_hold(&mut self, msg: SettlementMsg) {
        match msg {
            SettlementMsg::Hold { shard, session } => {
                if let Some(state) = self.session(&shard, session) {
                    state.watermark.track_hold();
                }
            }
            SettlementMsg::Retain(ticket) => {
                if let Some(state) = self.session(&ticket.shard, ticket.session)
                    && !state.watermark.retain(ticket.offset)
                {
                    tracing::warn!(subscription = %self.subscription, shard_id = %ticket.shard, offset = ticket.offset, "retain of an unknown hold ignored");
                }
            }
            SettlementMsg::EndHold(ticket) => {
                if let Some(state) = self.session(&ticket.shard, ticket.session)
                    && !state.watermark.end_hold(ticket.offset)
                {
                    tracing::warn!(subscription = %self.subscription, shard_id = %ticket.shard, offset = ticket.offset, "end of an unknown hold ignored");
                }
                self.request_if_ended(&ticket.shard).await;
            }
            _ => {}
        }
    }

    async fn settle(&mut self, ticket: Ticket) {
        let Some(state) = self.session(&ticket.shard, ticket.session) else {
            return;
        };
        let settled = state.watermark.settle(ticket.offset);
        if settled == Settled::Unknown {
            tracing::warn!(
                subscription = %self.subscription, shard_id = %ticket.shard,
                offset = ticket.offset, "settlement of an unknown or settled record ignored"
            );
            return;
        }
        let ended = state.watermark.checkpoint() == Some(&Checkpoint::ShardEnd);
        let closing = state.closing;
        if settled == Settled::Ok {
            self.unsettled -= 1;
        }
        if ended {
            self.request_if_ended(&ticket.shard).await;
        } else if closing {
            self.report_if_drained(&ticket.shard).await;
        }
    }

    /// A closing shard whose handed-out records have all settled: its final
    /// checkpoint goes to the keeper, and the shard is forgotten.
    async fn report_if_drained(&mut self, shard: &ShardId) {
        let drained = self
            .shards
            .get(shard)
            .is_some_and(|s| s.closing && s.watermark.unsettled() == 0);
        if !drained {
            return;
        }
        if let Some(state) = self.shards.remove(shard) {
            self.send(CheckpointRequest {
                shard: shard.clone(),
                session: state.session,
                checkpoint: state.watermark.checkpoint().cloned(),
                drained: true,
            })
            .await;
        }
    }

    fn session(&mut self, shard: &ShardId, session: SessionId) -> Option<&mut ShardState> {
        self.shards
            .get_mut(shard)
            .filter(|state| state.session == session)
    }

    /// `SHARD_END` is requested at once: the shard's children wait for it.
    async fn request_if_ended(&mut self, shard: &ShardId) {
        let ended = self.shards.get(shard).is_some_and(|s| {
            s.watermark.checkpoint() == Some(&Checkpoint::ShardEnd)
                && s.requested.as_ref() != Some(&Checkpoint::ShardEnd)
        });
        if ended {
            self.request(shard.clone()).await;
        }
    }

    async fn flush(&mut self, all: bool) {
        let now = Instant::now();
        let due: Vec<ShardId> = self
            .shards
            .iter()
            .filter(|(_, s)| {
                s.watermark.checkpoint().is_some()
                    && s.watermark.checkpoint() != s.requested.as_ref()
                    && (all
                        || s.last_request
                            .is_none_or(|at| now.duration_since(at) >= self.checkpoint_every))
            })
            .map(|(shard, _)| shard.clone())
            .collect();
        for shard in due {
            self.request(shard).await;
        }
    }

    async fn request(&mut self, shard: ShardId) {
        let Some(state) = self.shards.get_mut(&shard) else {
            return;
        };
        let Some(checkpoint) = state.watermark.checkpoint().cloned() else {
            return;
        };
        state.requested = Some(checkpoint.clone());
        state.last_request = Some(Instant::now());
        let session = state.session;
        if checkpoint == Checkpoint::ShardEnd {
            // Nothing more will be read from this shard.
            self.shards.remove(&shard);
        }
        self.send(CheckpointRequest {
            shard,
            session,
            checkpoint: Some(checkpoint),
            drained: false,
        })
        .await;
    }

    async fn send(&self, request: CheckpointRequest) {
        // The keeper outlives this task (it waits for our sender to close),
        // so a send only fails if the keeper died; then nothing can be
        // written anyway and the records will be read again.
        if self.checkpoints.send(request).await.is_err() {
            tracing::error!(subscription = %self.subscription, "lease keeper is gone; checkpoint not written");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SequenceNumber;

    fn seq(n: u64) -> Position {
        Position::whole(SequenceNumber::parse(&(100 + n).to_string()).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn coalesces_and_flushes_on_close() {
        let (ck_tx, mut ck_rx) = mpsc::channel(16);
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(Settlement::new("s".into(), Duration::from_secs(1), ck_tx).run(rx));
        let shard = ShardId::from("shard-0");
        tx.send(SettlementMsg::Open {
            shard: shard.clone(),
            session: SessionId(1),
        })
        .await
        .unwrap();
        tx.send(SettlementMsg::Track {
            shard: shard.clone(),
            session: SessionId(1),
            positions: (0..3).map(seq).collect(),
        })
        .await
        .unwrap();
        let ticket = |offset| {
            SettlementMsg::Settle(Ticket {
                shard: shard.clone(),
                session: SessionId(1),
                offset,
            })
        };
        tx.send(ticket(1)).await.unwrap();
        tx.send(ticket(0)).await.unwrap();
        let first = ck_rx.recv().await.unwrap();
        assert_eq!(first.checkpoint, Some(Checkpoint::At(seq(1))));
        // A stale session's ticket is ignored.
        tx.send(SettlementMsg::Settle(Ticket {
            shard: shard.clone(),
            session: SessionId(0),
            offset: 2,
        }))
        .await
        .unwrap();
        tx.send(ticket(2)).await.unwrap();
        drop(tx);
        let last = ck_rx.recv().await.unwrap();
        assert_eq!(last.checkpoint, Some(Checkpoint::At(seq(2))));
        task.await.unwrap();
        assert!(ck_rx.recv().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn shard_end_is_requested_at_once() {
        let (ck_tx, mut ck_rx) = mpsc::channel(16);
        let (tx, rx) = mpsc::channel(16);
        let _task =
            tokio::spawn(Settlement::new("s".into(), Duration::from_secs(3600), ck_tx).run(rx));
        let shard = ShardId::from("shard-0");
        tx.send(SettlementMsg::Open {
            shard: shard.clone(),
            session: SessionId(1),
        })
        .await
        .unwrap();
        tx.send(SettlementMsg::Track {
            shard: shard.clone(),
            session: SessionId(1),
            positions: vec![seq(0)],
        })
        .await
        .unwrap();
        tx.send(SettlementMsg::End {
            shard: shard.clone(),
            session: SessionId(1),
        })
        .await
        .unwrap();
        tx.send(SettlementMsg::Settle(Ticket {
            shard: shard.clone(),
            session: SessionId(1),
            offset: 0,
        }))
        .await
        .unwrap();
        // The first tick may already have requested seq(0); SHARD_END follows
        // without waiting out the hour.
        let mut got = ck_rx.recv().await.unwrap();
        if got.checkpoint != Some(Checkpoint::ShardEnd) {
            got = ck_rx.recv().await.unwrap();
        }
        assert_eq!(got.checkpoint, Some(Checkpoint::ShardEnd));
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_shard_reports_drained_once_its_delivered_records_settle() {
        let (ck_tx, mut ck_rx) = mpsc::channel(16);
        let (tx, rx) = mpsc::channel(16);
        let _task =
            tokio::spawn(Settlement::new("s".into(), Duration::from_secs(3600), ck_tx).run(rx));
        let shard = ShardId::from("shard-0");
        tx.send(SettlementMsg::Open {
            shard: shard.clone(),
            session: SessionId(1),
        })
        .await
        .unwrap();
        tx.send(SettlementMsg::Track {
            shard: shard.clone(),
            session: SessionId(1),
            positions: (0..5).map(seq).collect(),
        })
        .await
        .unwrap();
        // Offsets 0..3 reached the channel; 3 and 4 never will.
        tx.send(SettlementMsg::Close {
            shard: shard.clone(),
            session: SessionId(1),
            delivered: 3,
        })
        .await
        .unwrap();
        for offset in [2, 0, 1] {
            tx.send(SettlementMsg::Settle(Ticket {
                shard: shard.clone(),
                session: SessionId(1),
                offset,
            }))
            .await
            .unwrap();
        }
        // A periodic tick may have requested the settled prefix on the way
        // (only offset 0 was ever a prefix before all three settled); the
        // drained request follows, at seq(2).
        let mut got = ck_rx.recv().await.unwrap();
        while !got.drained {
            assert_eq!(got.checkpoint, Some(Checkpoint::At(seq(0))), "{got:?}");
            got = ck_rx.recv().await.unwrap();
        }
        assert_eq!(
            got,
            CheckpointRequest {
                shard,
                session: SessionId(1),
                checkpoint: Some(Checkpoint::At(seq(2))),
                drained: true
            }
        );
    }
}
