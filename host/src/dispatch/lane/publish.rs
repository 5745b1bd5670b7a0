//! Outputs on their way out of a lane: a call's outputs sorted to their
//! inputs, and publishes held back so that a key's outputs keep the order
//! of its inputs.
//!
//! # Why hold back
//! In a batch, a record may be retried while a later record acks. If both
//! have the same partition key and outputs, publishing the later one at
//! once would put its outputs before those of the earlier record, which is
//! published only once its retry acks. So once a record of a group is to
//! be tried again, every later publish of the group is held, and released
//! in the records' lane order when the whole group has settled or been
//! given up. Holding back every key, not only the retried one's, keeps the
//! rule simple; it delays only records that wait for the group anyway (the
//! lane takes nothing new until the group is done). A group cut off by
//! `hard_stop` publishes nothing it held: those inputs stay unsettled and
//! are read again.

use std::collections::BTreeMap;

use crate::outputs::Output;
use crate::progress::Ticket;

/// A call's outputs, taken input by input in index order.
pub(super) struct OutputsByInput {
    outputs: std::iter::Peekable<std::vec::IntoIter<Output>>,
}

impl OutputsByInput {
    pub(super) fn new(mut outputs: Vec<Output>) -> Self {
        // Stable: an input's outputs keep their publish order.
        outputs.sort_by_key(|o| o.input);
        Self {
            outputs: outputs.into_iter().peekable(),
        }
    }

    /// The outputs of input `index` (earlier inputs' leftovers dropped).
    pub(super) fn take(&mut self, index: usize) -> Vec<Output> {
        let mut mine = Vec::new();
        while let Some(next) = self.outputs.peek() {
            match (next.input as usize).cmp(&index) {
                std::cmp::Ordering::Less => {
                    self.outputs.next();
                }
                std::cmp::Ordering::Equal => mine.extend(self.outputs.next()),
                std::cmp::Ordering::Greater => break,
            }
        }
        mine
    }
}

/// Publishes held back within one group (module docs).
#[derive(Default)]
pub(super) struct Deferred {
    holding: bool,
    held: BTreeMap<u32, (Ticket, Vec<Output>)>,
}

impl Deferred {
    /// Forgets what a group cut off held; a new group publishes at once.
    pub(super) fn clear(&mut self) {
        self.holding = false;
        self.held.clear();
    }

    /// A record of the group is to be tried again: later publishes wait.
    pub(super) fn start(&mut self) {
        self.holding = true;
    }

    /// True once publishes of this group wait.
    pub(super) fn holding(&self) -> bool {
        self.holding
    }

    /// Holds the publish of the record at `position` in its group.
    pub(super) fn hold(&mut self, position: u32, ticket: Ticket, outputs: Vec<Output>) {
        self.held.insert(position, (ticket, outputs));
    }

    /// The group settled: what was held, in lane order.
    pub(super) fn release(&mut self) -> impl Iterator<Item = (Ticket, Vec<Output>)> + use<> {
        self.holding = false;
        std::mem::take(&mut self.held).into_values()
    }
}
