//! Lone acks on their way to settlement, held and sent in bulk.
//!
//! A lone record's ack is not sent to settlement on its own: the lane holds
//! it and sends what it holds as one message once [`ACKS_PER_MESSAGE`] are
//! held, before it waits for its next record on an empty inbox, once the
//! oldest has been held [`ACKS_HELD_AT_MOST`] (checked between records, so
//! a slow call holds them at most that call longer), before a backoff
//! wait, and when it ends. Settlement takes acks in any order, so holding
//! one only delays the checkpoint past it, by microseconds while records
//! flow; it saves settlement a wake-up per record.
//!
//! [`HeldAcks`] is the pure part — what is held and when it is due; the
//! lane does the sending.

use std::time::Duration;

use tokio::time::Instant;

use crate::settlement::SettlementMsg;

use crate::progress::Ticket;

/// Most lone acks a lane holds before it sends them.
pub(super) const ACKS_PER_MESSAGE: usize = 32;
/// Longest a lane holds a lone ack while records keep coming.
pub(super) const ACKS_HELD_AT_MOST: Duration = Duration::from_millis(10);

/// The acks a lane holds, and since when the oldest waits.
#[derive(Debug, Default)]
pub(super) struct HeldAcks {
    tickets: Vec<Ticket>,
    since: Option<Instant>,
}

impl HeldAcks {
    /// Holds `ticket` at `now`; the message to send when that fills it.
    pub(super) fn hold(&mut self, ticket: Ticket, now: Instant) -> Option<SettlementMsg> {
        self.tickets.push(ticket);
        self.since.get_or_insert(now);
        (self.tickets.len() >= ACKS_PER_MESSAGE)
            .then(|| self.take())
            .flatten()
    }

    /// Whether what it holds is to be sent before the lane waits for its
    /// next record: the inbox is empty, or the oldest waited long enough.
    pub(super) fn due(&self, inbox_empty: bool, now: Instant) -> bool {
        !self.tickets.is_empty()
            && (inbox_empty
                || self
                    .since
                    .is_some_and(|since| now.duration_since(since) >= ACKS_HELD_AT_MOST))
    }

    /// Everything held, as one message; `None` when nothing is.
    pub(super) fn take(&mut self) -> Option<SettlementMsg> {
        self.since = None;
        match self.tickets.len() {
            0 => None,
            1 => self.tickets.pop().map(SettlementMsg::Settle),
            _ => Some(SettlementMsg::SettleMany(std::mem::replace(
                &mut self.tickets,
                Vec::with_capacity(ACKS_PER_MESSAGE),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{SessionId, ShardId};

    fn ticket(offset: u64) -> Ticket {
        Ticket {
            shard: ShardId::from("shard-0"),
            session: SessionId(1),
            offset,
        }
    }

    fn offsets(msg: Option<SettlementMsg>) -> Vec<u64> {
        match msg {
            None => Vec::new(),
            Some(SettlementMsg::Settle(t)) => vec![t.offset],
            Some(SettlementMsg::SettleMany(ts)) => ts.iter().map(|t| t.offset).collect(),
            Some(other) => panic!("not an ack: {other:?}"),
        }
    }

    #[test]
    fn a_full_hold_is_sent_whole_and_a_single_ack_alone() {
        let now = Instant::now();
        let mut held = HeldAcks::default();
        for n in 0..ACKS_PER_MESSAGE as u64 - 1 {
            assert!(held.hold(ticket(n), now).is_none());
        }
        let sent = offsets(held.hold(ticket(31), now));
        assert_eq!(sent, (0..32).collect::<Vec<_>>());
        assert!(held.take().is_none(), "nothing left");
        held.hold(ticket(40), now);
        assert!(matches!(held.take(), Some(SettlementMsg::Settle(t)) if t.offset == 40));
    }

    #[test]
    fn due_on_an_empty_inbox_or_after_the_longest_hold() {
        let t0 = Instant::now();
        let mut held = HeldAcks::default();
        assert!(!held.due(true, t0), "nothing held: nothing due");
        held.hold(ticket(0), t0);
        held.hold(ticket(1), t0 + Duration::from_millis(8));
        assert!(held.due(true, t0), "the inbox ran dry");
        assert!(!held.due(false, t0 + Duration::from_millis(9)));
        assert!(
            held.due(false, t0 + ACKS_HELD_AT_MOST),
            "measured from the oldest"
        );
        assert_eq!(offsets(held.take()), vec![0, 1]);
        held.hold(ticket(2), t0 + Duration::from_millis(20));
        assert!(
            !held.due(false, t0 + Duration::from_millis(21)),
            "the clock restarts after a send"
        );
    }
}
