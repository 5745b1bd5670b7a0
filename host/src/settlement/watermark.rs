//! The per-shard settlement watermark: a pure structure, no I/O.
//!
//! A shard's records are tracked in arrival order, each under an [`Offset`]
//! (0, 1, 2, ... within one reader session). They settle in any order (acks
//! from parallel lanes, rejects, dead-letters). The checkpoint is the
//! position of the last record of the longest settled prefix: it
//! never passes a record that has not settled, and reaches the last record
//! once all have. An end-of-shard marker, tracked after a closed shard's
//! last record, turns the checkpoint into [`Checkpoint::ShardEnd`] once
//! everything before it has settled.
//!
//! Cost: `track` and `settle` are O(1) amortised (a ring buffer indexed by
//! offset); memory is one entry per record read but not yet below the
//! watermark.
//!
//! A *hold* (a window's, see `reader::windowing`) is tracked like a record,
//! right before the window's first record, but has no position of its
//! own. Its *scope* is every record tracked after it until the reader ends
//! it ([`Watermark::end_hold`]): the window's records. It is released once
//! its references are gone — the reader's (given up by `end_hold`), and
//! one per [`Watermark::retain`] (a close), each given up by a settle — and
//! it is *done* once released and every record of its scope has settled.
//! The checkpoint never passes a hold that is not done, and moves over a
//! done hold and its whole scope at once, never onto the hold: so it never
//! stops inside a window whose closes were not all done. A hold is not a
//! record read: it does not count as unsettled, so a reader that stops
//! drains without it (its checkpoint stays before the hold).
//!
//! KPL aggregates need nothing special here: the reader tracks each user
//! record under its own [`Position`] (the last one of an aggregate as the
//! whole record), so a checkpoint may stop inside an aggregate and the
//! aggregate is done once its last user record is.

use std::collections::VecDeque;

use crate::ids::Position;
use crate::progress::{Checkpoint, Offset};

#[derive(Debug)]
enum Entry {
    Record {
        position: Position,
        settled: bool,
        /// The hold whose scope it is in.
        hold: Option<Offset>,
    },
    Hold(Hold),
    End,
}

/// A hold's counts (module docs).
#[derive(Debug)]
struct Hold {
    /// References not yet given up.
    pending: u32,
    /// Records of its scope not settled yet.
    inside: usize,
    /// The reader has not ended its scope.
    open: bool,
}

impl Hold {
    fn done(&self) -> bool {
        self.pending == 0 && self.inside == 0 && !self.open
    }
}

/// What [`Watermark::settle`] made of a settlement.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Recorded; the checkpoint moved (or not) accordingly.
    Ok,
    /// A hold, recorded likewise.
    Hold,
    /// That offset had already settled, or was never tracked: ignored.
    Unknown,
}

/// The settlement state of one shard (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Watermark {
    /// Offset of `entries[0]`.
    base: Offset,
    entries: VecDeque<Entry>,
    checkpoint: Option<Checkpoint>,
    /// Tracked records not settled yet.
    unsettled: usize,
    /// The hold whose scope is open: records tracked now are in it.
    scoping: Option<Offset>,
}

impl Watermark {
    /// An empty watermark; offsets start at 0.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Tracks the next record read from the shard and returns its offset.
    /// Records must be tracked in the order the shard returned them.
    pub(crate) fn track(&mut self, position: Position) -> Offset {
        debug_assert!(
            !matches!(self.entries.back(), Some(Entry::End)),
            "record tracked after the end of its shard"
        );
        let hold = self.scoping;
        if let Some(Entry::Hold(h)) = hold.and_then(|h| self.entry(h)) {
            h.inside += 1;
        }
        self.entries.push_back(Entry::Record {
            position,
            settled: false,
            hold,
        });
        self.unsettled += 1;
        self.next_offset() - 1
    }

    fn entry(&mut self, offset: Offset) -> Option<&mut Entry> {
        let index = offset.checked_sub(self.base)?;
        self.entries.get_mut(index as usize)
    }

    /// Tracks a hold after the records tracked so far, opens its scope,
    /// and returns its offset.
    pub(crate) fn track_hold(&mut self) -> Offset {
        self.entries.push_back(Entry::Hold(Hold {
            pending: 1,
            inside: 0,
            open: true,
        }));
        let offset = self.next_offset() - 1;
        self.scoping = Some(offset);
        offset
    }

    /// One more reference to the hold at `offset`; false when there is no
    /// such hold, or it was released.
    pub(crate) fn retain(&mut self, offset: Offset) -> bool {
        match self.entry(offset) {
            Some(Entry::Hold(h)) if h.pending > 0 => {
                h.pending += 1;
                true
            }
            _ => false,
        }
    }

    /// Ends the scope of the hold at `offset` (records tracked from now on
    /// are outside it) and gives up the reader's reference; false when
    /// there is no such open hold.
    pub(crate) fn end_hold(&mut self, offset: Offset) -> bool {
        match self.entry(offset) {
            Some(Entry::Hold(h)) if h.open => {
                h.open = false;
                h.pending -= 1;
            }
            _ => return false,
        }
        if self.scoping == Some(offset) {
            self.scoping = None;
        }
        self.advance_if_front(offset);
        true
    }

    fn advance_if_front(&mut self, offset: Offset) {
        if offset == self.base {
            self.advance();
        }
    }

    /// Tracks the end of a closed shard, after its last record.
    pub(crate) fn track_end(&mut self) {
        self.entries.push_back(Entry::End);
        self.advance();
    }

    /// The offset the next tracked record will get.
    pub(crate) fn next_offset(&self) -> Offset {
        self.base + self.entries.len() as Offset
    }

    /// Marks the record at `offset` as settled and moves the checkpoint over
    /// every settled record at the front.
    pub(crate) fn settle(&mut self, offset: Offset) -> Settled {
        let Some(index) = offset.checked_sub(self.base) else {
            return Settled::Unknown;
        };
        match self.entries.get_mut(index as usize) {
            Some(Entry::Record { settled, hold, .. }) if !*settled => {
                *settled = true;
                let hold = *hold;
                self.unsettled -= 1;
                if index == 0 {
                    self.advance();
                }
                if let Some(h) = hold
                    && let Some(Entry::Hold(held)) = self.entry(h)
                {
                    held.inside -= 1;
                    self.advance_if_front(h);
                }
                Settled::Ok
            }
            Some(Entry::Hold(h)) if h.pending > 0 => {
                h.pending -= 1;
                self.advance_if_front(offset);
                Settled::Hold
            }
            _ => Settled::Unknown,
        }
    }

    fn advance(&mut self) {
        while let Some(front) = self.entries.front() {
            match front {
                Entry::Record { settled: true, .. } => {
                    if let Some(Entry::Record { position, .. }) = self.entries.pop_front() {
                        self.checkpoint = Some(Checkpoint::At(position));
                    }
                    self.base += 1;
                }
                Entry::Hold(h) if h.done() => {
                    self.entries.pop_front();
                    self.base += 1;
                }
                Entry::End => {
                    self.entries.pop_front();
                    self.base += 1;
                    self.checkpoint = Some(Checkpoint::ShardEnd);
                }
                Entry::Record { settled: false, .. } | Entry::Hold(_) => break,
            }
        }
    }

    /// Forgets the records at `next` and after: they were tracked but never
    /// handed to a handler (the reader stopped first), so they will never
    /// settle here. Returns how many unsettled records were dropped.
    pub(crate) fn truncate(&mut self, next: Offset) -> usize {
        let keep = next.saturating_sub(self.base) as usize;
        let mut dropped = 0;
        while self.entries.len() > keep {
            if let Some(Entry::Record { settled: false, .. }) = self.entries.pop_back() {
                dropped += 1;
            }
        }
        self.unsettled -= dropped;
        dropped
    }

    /// The highest safe checkpoint, if any record has settled yet.
    pub(crate) fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// Records tracked but not yet below the watermark (settled records
    /// waiting behind an unsettled one count too).
    pub(crate) fn in_flight(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Record { .. }))
            .count()
    }

    /// Records tracked and not settled yet: read but not yet handled.
    pub(crate) fn unsettled(&self) -> usize {
        self.unsettled
    }

    /// True when nothing tracked is left above the checkpoint.
    #[cfg(test)]
    fn is_drained(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::ids::SequenceNumber;

    /// The n-th tracked record: three user records per Kinesis record (an
    /// aggregate of three), so checkpoints stop inside aggregates too.
    fn seq(n: u64) -> Position {
        let sequence = SequenceNumber::parse(&(1_000_000 + (n / 3) * 7).to_string()).unwrap();
        match n % 3 {
            2 => Position::whole(sequence),
            sub => Position::within(sequence, sub as u32),
        }
    }

    #[test]
    fn checkpoint_waits_for_the_oldest_record() {
        let mut w = Watermark::new();
        let offsets: Vec<_> = (0..4).map(|n| w.track(seq(n))).collect();
        assert_eq!(offsets, vec![0, 1, 2, 3]);
        assert_eq!(w.settle(2), Settled::Ok);
        assert_eq!(w.settle(1), Settled::Ok);
        assert_eq!(w.checkpoint(), None);
        assert_eq!(w.unsettled(), 2);
        assert_eq!(w.in_flight(), 4);
        assert_eq!(w.settle(0), Settled::Ok);
        assert_eq!(w.checkpoint(), Some(&Checkpoint::At(seq(2))));
        assert_eq!(w.in_flight(), 1);
        assert_eq!(w.settle(3), Settled::Ok);
        assert_eq!(w.checkpoint(), Some(&Checkpoint::At(seq(3))));
        assert!(w.is_drained());
    }

    #[test]
    fn double_and_unknown_settlements_are_ignored() {
        let mut w = Watermark::new();
        w.track(seq(0));
        w.track(seq(1));
        assert_eq!(w.settle(1), Settled::Ok);
        assert_eq!(w.settle(1), Settled::Unknown);
        assert_eq!(w.settle(7), Settled::Unknown);
        assert_eq!(w.settle(0), Settled::Ok);
        assert_eq!(w.settle(0), Settled::Unknown);
        assert_eq!(w.checkpoint(), Some(&Checkpoint::At(seq(1))));
    }

    #[test]
    fn truncate_forgets_records_never_handed_out() {
        let mut w = Watermark::new();
        for n in 0..5 {
            w.track(seq(n));
        }
        w.settle(0);
        assert_eq!(w.truncate(3), 2, "offsets 3 and 4 were never delivered");
        assert_eq!(w.unsettled(), 2);
        w.settle(2);
        w.settle(1);
        assert!(w.is_drained());
        assert_eq!(w.checkpoint(), Some(&Checkpoint::At(seq(2))));
        assert_eq!(w.truncate(0), 0, "nothing left to drop");
    }

    #[test]
    fn shard_end_only_after_everything_settled() {
        let mut w = Watermark::new();
        w.track(seq(0));
        w.track(seq(1));
        w.track_end();
        w.settle(1);
        assert_eq!(w.checkpoint(), None);
        w.settle(0);
        assert_eq!(w.checkpoint(), Some(&Checkpoint::ShardEnd));
        assert!(w.is_drained());
    }

    #[test]
    fn a_hold_keeps_the_checkpoint_before_its_window_until_done() {
        let mut w = Watermark::new();
        w.track(seq(0));
        let hold = w.track_hold();
        assert_eq!(hold, 1);
        w.track(seq(2));
        w.track(seq(3));
        // The window closes: one close retained, the scope ended.
        assert!(w.retain(hold));
        assert!(w.end_hold(hold));
        let after = w.track(seq(5));
        w.settle(0);
        w.settle(2);
        w.settle(3);
        w.settle(after);
        assert_eq!(w.checkpoint(), Some(&Checkpoint::At(seq(0))));
        assert_eq!(w.unsettled(), 0, "a hold is not a record read");
        assert_eq!(w.settle(hold), Settled::Hold);
        assert_eq!(w.checkpoint(), Some(&Checkpoint::At(seq(5))));
        assert_eq!(w.settle(hold), Settled::Unknown);
        assert!(!w.retain(hold));
        assert!(w.is_drained());
    }

    #[test]
    fn a_released_hold_waits_for_every_record_of_its_window() {
        let mut w = Watermark::new();
        let hold = w.track_hold();
        w.track(seq(1));
        w.track(seq(2));
        assert!(w.retain(hold));
        assert!(w.end_hold(hold));
        let after = w.track(seq(4));
        w.settle(1);
        w.settle(hold);
        w.settle(after);
        assert_eq!(w.checkpoint(), None, "never inside the window");
        w.settle(2);
        assert_eq!(w.checkpoint(), Some(&Checkpoint::At(seq(4))));
    }

    #[test]
    fn a_hold_whose_scope_is_open_is_never_passed() {
        let mut w = Watermark::new();
        let hold = w.track_hold();
        w.track(seq(1));
        w.settle(1);
        assert_eq!(w.checkpoint(), None);
        w.track_end();
        assert!(w.end_hold(hold));
        assert_eq!(w.checkpoint(), Some(&Checkpoint::ShardEnd));
    }

    #[test]
    fn empty_closed_shard_ends_at_once() {
        let mut w = Watermark::new();
        w.track_end();
        assert_eq!(w.checkpoint(), Some(&Checkpoint::ShardEnd));
    }

    #[test]
    fn checkpoint_round_trips_through_its_stored_form() {
        for cp in [
            Checkpoint::ShardEnd,
            Checkpoint::At(seq(9)),
            Checkpoint::At(seq(10)),
        ] {
            assert_eq!(Checkpoint::parse(&cp.to_string()).unwrap(), cp);
        }
    }

    proptest! {
        /// Any interleaving of settlements across several shards: a shard's
        /// checkpoint is never at or above an unsettled record, and reaches
        /// the last record once all have settled.
        #[test]
        fn never_passes_an_unsettled_record(
            counts in proptest::collection::vec(1usize..40, 1..5),
            order_seed in proptest::collection::vec(any::<u64>(), 200),
            end in any::<bool>(),
        ) {
            let mut shards: Vec<Watermark> = counts.iter().map(|_| Watermark::new()).collect();
            let mut pending: Vec<(usize, Offset)> = Vec::new();
            for (s, &count) in counts.iter().enumerate() {
                for n in 0..count {
                    let off = shards[s].track(seq(n as u64));
                    pending.push((s, off));
                }
                if end {
                    shards[s].track_end();
                }
            }
            let mut settled: Vec<Vec<bool>> = counts.iter().map(|&c| vec![false; c]).collect();
            let mut i = 0;
            while !pending.is_empty() {
                let pick = (order_seed[i % order_seed.len()] as usize).wrapping_add(i) % pending.len();
                i += 1;
                let (s, off) = pending.swap_remove(pick);
                prop_assert_eq!(shards[s].settle(off), Settled::Ok);
                settled[s][off as usize] = true;
                // The checkpoint covers exactly the settled prefix.
                let prefix = settled[s].iter().take_while(|&&x| x).count();
                match shards[s].checkpoint() {
                    None => prop_assert_eq!(prefix, 0),
                    Some(Checkpoint::At(cp)) => {
                        prop_assert!(prefix > 0);
                        prop_assert_eq!(cp, &seq(prefix as u64 - 1));
                        // Never at or above an unsettled record.
                        for (n, done) in settled[s].iter().enumerate() {
                            if !done {
                                prop_assert!(cp < &seq(n as u64));
                            }
                        }
                    }
                    Some(Checkpoint::ShardEnd) => {
                        prop_assert!(end);
                        prop_assert!(settled[s].iter().all(|&x| x));
                    }
                }
            }
            for (s, w) in shards.iter().enumerate() {
                let want = if end {
                    Checkpoint::ShardEnd
                } else {
                    Checkpoint::At(seq(counts[s] as u64 - 1))
                };
                prop_assert_eq!(w.checkpoint(), Some(&want));
                prop_assert!(w.is_drained());
            }
        }
    }
}
