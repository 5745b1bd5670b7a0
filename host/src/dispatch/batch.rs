//! The batch collector: a pure structure (the clock is passed in) deciding
//! when a batch is complete.
//!
//! A batch closes when it holds `max` records, or when `window` has passed
//! since its first record arrived, whichever comes first; so under light load
//! batches are smaller than `max` and no record waits longer than `window`
//! for its batch to start.

use std::time::Duration;

use tokio::time::Instant;

/// Collects items into batches (see the module docs).
#[derive(Debug)]
pub struct BatchCollector<T> {
    max: usize,
    window: Duration,
    items: Vec<T>,
    opened_at: Option<Instant>,
}

impl<T> BatchCollector<T> {
    /// A collector of batches of up to `max` items over `window`.
    pub fn new(max: usize, window: Duration) -> Self {
        Self {
            max: max.max(1),
            window,
            items: Vec::with_capacity(max.max(1)),
            opened_at: None,
        }
    }

    /// Adds an item that arrived at `now`; returns the batch if that made it
    /// full.
    pub fn push(&mut self, item: T, now: Instant) -> Option<Vec<T>> {
        if self.items.is_empty() {
            self.opened_at = Some(now);
        }
        self.items.push(item);
        (self.items.len() >= self.max).then(|| self.take_all())
    }

    /// When the open batch closes by time, if one is open.
    pub fn deadline(&self) -> Option<Instant> {
        self.opened_at.map(|at| at + self.window)
    }

    /// The open batch, if its window has passed at `now`.
    pub fn take_due(&mut self, now: Instant) -> Option<Vec<T>> {
        match self.deadline() {
            Some(deadline) if now >= deadline => Some(self.take_all()),
            _ => None,
        }
    }

    /// The open batch, whatever its size or age (on shutdown).
    pub fn flush(&mut self) -> Option<Vec<T>> {
        (!self.items.is_empty()).then(|| self.take_all())
    }

    /// Items in the open batch.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when no batch is open.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn take_all(&mut self) -> Vec<T> {
        self.opened_at = None;
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
        let mut c = BatchCollector::new(3, WINDOW);
        assert_eq!(c.push(1, t0), None);
        assert_eq!(c.push(2, t0), None);
        assert_eq!(c.push(3, t0), Some(vec![1, 2, 3]));
        assert!(c.is_empty());
        assert_eq!(c.deadline(), None);
    }

    #[test]
    fn closes_when_the_window_after_the_first_record_passes() {
        let t0 = Instant::now();
        let mut c = BatchCollector::new(100, WINDOW);
        c.push("a", t0);
        c.push("b", t0 + Duration::from_millis(30));
        assert_eq!(
            c.deadline(),
            Some(t0 + WINDOW),
            "window counts from the first record"
        );
        assert_eq!(c.take_due(t0 + Duration::from_millis(49)), None);
        assert_eq!(c.take_due(t0 + WINDOW), Some(vec!["a", "b"]));
        // The next batch's window starts with its own first record.
        let t1 = t0 + Duration::from_millis(200);
        c.push("c", t1);
        assert_eq!(c.deadline(), Some(t1 + WINDOW));
    }

    #[test]
    fn flush_takes_whatever_is_open() {
        let mut c = BatchCollector::new(10, WINDOW);
        assert_eq!(c.flush(), None::<Vec<u8>>);
        c.push(7u8, Instant::now());
        assert_eq!(c.len(), 1);
        assert_eq!(c.flush(), Some(vec![7]));
        assert_eq!(c.flush(), None);
    }

    #[test]
    fn size_one_batches_close_at_once() {
        let mut c = BatchCollector::new(1, WINDOW);
        assert_eq!(c.push('x', Instant::now()), Some(vec!['x']));
    }
}
