//! The batch collector: a pure structure (the clock is passed in) deciding
//! when a batch is complete.
//!
//! A batch closes when it holds `max` records or `max_bytes` bytes, or when
//! `window` has passed since its first record arrived, whichever comes
//! first; so under light load batches are smaller than `max` and no record
//! waits longer than `window` for its batch to start. A record that would
//! take the open batch past `max_bytes` closes it and starts the next one;
//! a record of `max_bytes` or more alone is a batch of its own, due at once
//! (a batch always takes at least one record, however large).
//!
//! `max_bytes` bounds what is lowered into the guest's memory in one call
//! (`max_batch_bytes`; Lambda caps a batch's payload at 6 MB): a batch
//! larger than the guest's memory would fail every time.

use std::time::Duration;

use tokio::time::Instant;

/// Collects items into batches (see the module docs).
#[derive(Debug)]
pub(super) struct BatchCollector<T> {
    max: usize,
    max_bytes: usize,
    window: Duration,
    items: Vec<T>,
    bytes: usize,
    /// When the open batch closes by time: `window` after its first item,
    /// or at once when it is full by bytes.
    due_at: Option<Instant>,
}

impl<T> BatchCollector<T> {
    /// A collector of batches of up to `max` items and `max_bytes` bytes
    /// over `window`.
    pub(super) fn new(max: usize, max_bytes: usize, window: Duration) -> Self {
        Self {
            max: max.max(1),
            max_bytes: max_bytes.max(1),
            window,
            items: Vec::with_capacity(max.max(1)),
            bytes: 0,
            due_at: None,
        }
    }

    /// Adds an item of `bytes` bytes that arrived at `now`; returns the
    /// batch it closed, if any: the open one when the item made it full, or
    /// when the item would take it past `max_bytes` (the item then opens the
    /// next batch).
    pub(super) fn push(&mut self, item: T, bytes: usize, now: Instant) -> Option<Vec<T>> {
        let closed = (!self.items.is_empty() && self.bytes.saturating_add(bytes) > self.max_bytes)
            .then(|| self.take_all());
        if self.items.is_empty() {
            self.due_at = Some(now + self.window);
        }
        self.items.push(item);
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes >= self.max_bytes {
            // Full by bytes: due now. When it also closed the previous batch,
            // it is taken at the next look (`deadline`, `take_due`).
            self.due_at = Some(now);
        }
        if closed.is_some() {
            return closed;
        }
        (self.items.len() >= self.max || self.bytes >= self.max_bytes).then(|| self.take_all())
    }

    /// When the open batch closes by time, if one is open.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.due_at
    }

    /// The open batch, if its window has passed at `now` (or it is full).
    pub(super) fn take_due(&mut self, now: Instant) -> Option<Vec<T>> {
        match self.deadline() {
            Some(deadline) if now >= deadline => Some(self.take_all()),
            _ => None,
        }
    }

    /// How many more records the lane may let wait before it looks at its
    /// inbox again (see "Waking per fill" in the lane's docs): what the
    /// open batch lacks of `max`, when the count is what closes it. When
    /// its bytes would close it first (at the size of its records so far),
    /// the next record's size decides, which only a look tells: 1, a look
    /// at each record, as without waiting for fills.
    pub(super) fn wanted(&self) -> usize {
        let by_count = self.max.saturating_sub(self.items.len()).max(1);
        let by_bytes = match self.items.len() {
            0 => return by_count,
            n => {
                let mean = (self.bytes / n).max(1);
                self.max_bytes.saturating_sub(self.bytes).div_ceil(mean)
            }
        };
        if by_bytes <= by_count { 1 } else { by_count }
    }

    /// The open batch, whatever its size or age (on shutdown).
    pub(super) fn flush(&mut self) -> Option<Vec<T>> {
        (!self.items.is_empty()).then(|| self.take_all())
    }

    fn take_all(&mut self) -> Vec<T> {
        self.due_at = None;
        self.bytes = 0;
        std::mem::replace(&mut self.items, Vec::with_capacity(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_millis(50);

    #[test]
    fn closes_when_full() {
        let t0 = Instant::now();
        let mut c = BatchCollector::new(3, usize::MAX, WINDOW);
        assert_eq!(c.push(1, 1, t0), None);
        assert_eq!(c.push(2, 1, t0), None);
        assert_eq!(c.push(3, 1, t0), Some(vec![1, 2, 3]));
        assert_eq!(c.deadline(), None);
        assert_eq!(c.flush(), None, "nothing left open");
    }

    #[test]
    fn closes_when_the_window_after_the_first_record_passes() {
        let t0 = Instant::now();
        let mut c = BatchCollector::new(100, usize::MAX, WINDOW);
        c.push("a", 1, t0);
        c.push("b", 1, t0 + Duration::from_millis(30));
        assert_eq!(
            c.deadline(),
            Some(t0 + WINDOW),
            "window counts from the first record"
        );
        assert_eq!(c.take_due(t0 + Duration::from_millis(49)), None);
        assert_eq!(c.take_due(t0 + WINDOW), Some(vec!["a", "b"]));
        // The next batch's window starts with its own first record.
        let t1 = t0 + Duration::from_millis(200);
        c.push("c", 1, t1);
        assert_eq!(c.deadline(), Some(t1 + WINDOW));
    }

    #[test]
    fn wanted_is_what_closes_the_batch_by_count_or_by_bytes() {
        let t0 = Instant::now();
        let mut c = BatchCollector::new(100, 10_000, WINDOW);
        assert_eq!(c.wanted(), 100, "nothing open: a whole batch");
        c.push('a', 10, t0);
        assert_eq!(c.wanted(), 99, "small records: the count decides");
        let mut c = BatchCollector::new(100, 10_000, WINDOW);
        c.push('a', 3_000, t0);
        assert_eq!(
            c.wanted(),
            1,
            "records of 3,000 bytes: the bytes close it, each record is looked at"
        );
        let mut c = BatchCollector::new(3, 10_000, WINDOW);
        c.push('a', 10, t0);
        c.push('b', 10, t0);
        assert_eq!(c.wanted(), 1, "one short of the count");
    }

    #[test]
    fn flush_takes_whatever_is_open() {
        let mut c = BatchCollector::new(10, usize::MAX, WINDOW);
        assert_eq!(c.flush(), None::<Vec<u8>>);
        c.push(7u8, 1, Instant::now());
        assert_eq!(c.flush(), Some(vec![7]));
        assert_eq!(c.flush(), None);
    }

    #[test]
    fn closes_before_the_byte_limit() {
        let t0 = Instant::now();
        let mut c = BatchCollector::new(100, 1_000, WINDOW);
        assert_eq!(c.push('a', 400, t0), None);
        assert_eq!(c.push('b', 400, t0), None);
        // 'c' would take the batch to 1,200 bytes: the open batch closes and
        // 'c' starts the next one, with its own window.
        let t1 = t0 + Duration::from_millis(10);
        assert_eq!(c.push('c', 400, t1), Some(vec!['a', 'b']));
        assert_eq!(
            c.deadline(),
            Some(t1 + WINDOW),
            "'c' alone, in a new window"
        );
        // Exactly at the limit: full, closed at once.
        assert_eq!(c.push('d', 600, t1), Some(vec!['c', 'd']));
        assert_eq!(c.flush(), None);
    }

    #[test]
    fn a_record_over_the_byte_limit_is_a_batch_of_its_own() {
        let t0 = Instant::now();
        let mut c = BatchCollector::new(100, 1_000, WINDOW);
        // Alone: closed at once.
        assert_eq!(c.push("huge", 5_000, t0), Some(vec!["huge"]));
        // After others: they close, and it is due at once, without waiting
        // for the window.
        assert_eq!(c.push("small", 10, t0), None);
        assert_eq!(c.push("huge", 5_000, t0), Some(vec!["small"]));
        assert_eq!(c.deadline(), Some(t0));
        assert_eq!(c.take_due(t0), Some(vec!["huge"]));
        assert_eq!(c.deadline(), None);
        assert_eq!(c.flush(), None, "nothing left open");
    }

    #[test]
    fn no_batch_ever_exceeds_the_byte_limit_unless_it_is_one_record() {
        let t0 = Instant::now();
        let max_bytes = 6 << 20;
        let mut c = BatchCollector::new(10_000, max_bytes, WINDOW);
        let mut batches = Vec::new();
        // Sizes of up to 1 MiB + a key, as Kinesis allows, in a fixed mix.
        for i in 0..500usize {
            let size = (i * 7919) % (1 << 20) + 256;
            batches.extend(c.push(size, size, t0));
            batches.extend(c.take_due(t0));
        }
        batches.extend(c.flush());
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 500);
        for b in &batches {
            assert!(
                b.len() == 1 || b.iter().sum::<usize>() <= max_bytes,
                "{b:?}"
            );
        }
    }

    #[test]
    fn size_one_batches_close_at_once() {
        let mut c = BatchCollector::new(1, usize::MAX, WINDOW);
        assert_eq!(c.push('x', 1, Instant::now()), Some(vec!['x']));
    }
}
