//! Tumbling windows of arrival time on one shard: which window a record
//! falls in, when a window opens and closes, and which records come too
//! late. Pure logic, no I/O: the reader owns one [`ShardWindows`] per shard
//! it reads and acts on what it answers (see `reader::windowing`, which
//! holds the exactly-once argument).
//!
//! # Rules
//! - A record is in the window its `approximate-arrival` falls in:
//!   `[start, start + size)` with `start` a multiple of `size` since the
//!   Unix epoch, so a replay of a range of the shard yields the same
//!   windows.
//! - A window opens with the first record that falls in it, and closes
//!   when a record of a later window arrives (the close goes before that
//!   record), when the shard is quiet at its tip and the clock passes its
//!   end plus `grace` ([`ShardWindows::quiet`]: records still on their way
//!   into Kinesis get that long), or when the shard ends
//!   ([`ShardWindows::finish`]).
//! - So at most one window is open on a shard at a time, and windows never
//!   interleave: a shard's records run window after window. That is what
//!   lets a window commit whole (see the reader's argument). A record
//!   whose window is older than the one open, or than the last one closed
//!   (Kinesis's arrival times are approximate: within a shard they may
//!   step back a little), is *late*: handled in no window, and counted.
//!
//! Cost: O(1) per record (a hash-set insert for the key); memory is one
//! entry per distinct partition key of the open window.
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the
//! crate docs): imports only its own floor.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use crate::ids::PartitionKey;

/// A tumbling window of arrival time, in ms since the Unix epoch: `start`
/// included, `end` excluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    /// Its first millisecond.
    pub start: u64,
    /// The first millisecond after it.
    pub end: u64,
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |ms: u64| {
            humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms))
        };
        write!(f, "[{}, {})", at(self.start), at(self.end))
    }
}

/// Whom a window's close is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowBy {
    /// One close per window of a shard, naming every key that had a record
    /// in it (Lambda's tumbling windows).
    Shard,
    /// One close per key that had a record in the window.
    Key,
}

impl fmt::Display for WindowBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WindowBy::Shard => "shard",
            WindowBy::Key => "key",
        })
    }
}

/// A subscription's windows, as its config sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    /// The length of a window.
    pub size: Duration,
    /// Whom a close is for.
    pub by: WindowBy,
    /// How long past its end a window stays open on a quiet shard.
    pub grace: Duration,
}

impl WindowSpec {
    /// The window `arrival_ms` falls in.
    pub fn window_of(&self, arrival_ms: u64) -> Window {
        let size = self.size.as_millis().max(1) as u64;
        let start = arrival_ms - arrival_ms % size;
        Window {
            start,
            end: start.saturating_add(size),
        }
    }
}

/// A window that closed on a shard, with the keys that had a record in
/// it, in the order their first record came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Closed {
    /// The window.
    pub(crate) window: Window,
    /// Its keys.
    pub(crate) keys: Vec<PartitionKey>,
}

#[derive(Debug)]
struct Open {
    window: Window,
    keys: Vec<PartitionKey>,
    seen: HashSet<PartitionKey>,
}

/// What [`ShardWindows::assign`] made of one record.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Assigned {
    /// The window that closed before it: its closes go before the record.
    pub(crate) closed: Option<Closed>,
    /// The record opened its window: the window's hold goes right before
    /// it.
    pub(crate) opened: bool,
    /// Its window; `None` when it came too late.
    pub(crate) window: Option<Window>,
}

/// The windows of one shard in one reader session (module docs).
#[derive(Debug)]
pub(crate) struct ShardWindows {
    spec: WindowSpec,
    open: Option<Open>,
    /// The newest window opened: a record of an older one is late.
    newest: Option<Window>,
}

impl ShardWindows {
    /// No window open yet.
    pub(crate) fn new(spec: WindowSpec) -> Self {
        Self {
            spec,
            open: None,
            newest: None,
        }
    }

    /// Whether a window is open.
    pub(crate) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Places the next record of the shard, of partition key `key` that
    /// arrived at `arrival_ms` (module docs).
    pub(crate) fn assign(&mut self, key: &PartitionKey, arrival_ms: u64) -> Assigned {
        let window = self.spec.window_of(arrival_ms);
        let closed = match &self.open {
            Some(open) if window > open.window => self.close(),
            _ => None,
        };
        let late = self
            .newest
            .is_some_and(|n| window < n || (window == n && self.open.is_none()));
        if late {
            return Assigned {
                closed,
                opened: false,
                window: None,
            };
        }
        let opened = self.open.is_none();
        let open = self.open.get_or_insert_with(|| Open {
            window,
            keys: Vec::new(),
            seen: HashSet::new(),
        });
        if open.seen.insert(key.clone()) {
            open.keys.push(key.clone());
        }
        self.newest = Some(window);
        Assigned {
            closed,
            opened,
            window: Some(window),
        }
    }

    /// The shard is quiet at its tip and the clock reads `now_ms`: the
    /// open window closes once its end plus grace has passed.
    pub(crate) fn quiet(&mut self, now_ms: u64) -> Option<Closed> {
        let grace = self.spec.grace.as_millis() as u64;
        match &self.open {
            Some(open) if open.window.end.saturating_add(grace) <= now_ms => self.close(),
            _ => None,
        }
    }

    /// The shard ended: the open window closes (nothing can follow).
    pub(crate) fn finish(&mut self) -> Option<Closed> {
        self.close()
    }

    fn close(&mut self) -> Option<Closed> {
        let open = self.open.take()?;
        Some(Closed {
            window: open.window,
            keys: open.keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WindowSpec {
        WindowSpec {
            size: Duration::from_secs(60),
            by: WindowBy::Shard,
            grace: Duration::from_secs(5),
        }
    }

    fn key(k: &str) -> PartitionKey {
        PartitionKey::new(k)
    }

    fn w(start_s: u64) -> Window {
        Window {
            start: start_s * 1000,
            end: (start_s + 60) * 1000,
        }
    }

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        assert_eq!(spec().window_of(0), w(0));
        assert_eq!(spec().window_of(59_999), w(0));
        assert_eq!(spec().window_of(60_000), w(60));
        assert_eq!(spec().window_of(1_764_633_601_234), w(1_764_633_600));
    }

    #[test]
    fn a_record_of_a_later_window_closes_the_open_one_before_it() {
        let mut ws = ShardWindows::new(spec());
        let first = ws.assign(&key("a"), 1_000);
        assert_eq!(
            first,
            Assigned {
                closed: None,
                opened: true,
                window: Some(w(0)),
            }
        );
        assert!(!ws.assign(&key("b"), 2_000).opened);
        ws.assign(&key("a"), 3_000);
        let next = ws.assign(&key("c"), 61_000);
        assert_eq!(
            next.closed,
            Some(Closed {
                window: w(0),
                keys: vec![key("a"), key("b")],
            })
        );
        assert!(next.opened);
        assert_eq!(next.window, Some(w(60)));
        let skipped = ws.assign(&key("c"), 200_000);
        assert_eq!(skipped.closed.map(|c| c.window), Some(w(60)));
        assert_eq!(
            skipped.window,
            Some(w(180)),
            "an empty window is never opened"
        );
    }

    #[test]
    fn a_record_of_an_older_window_is_late() {
        let mut ws = ShardWindows::new(spec());
        ws.assign(&key("a"), 61_000);
        let back = ws.assign(&key("b"), 59_000);
        assert_eq!(back, Assigned::default(), "older than the open window");
        assert!(ws.is_open());
        assert!(ws.quiet(1_000_000).is_some());
        let after = ws.assign(&key("b"), 62_000);
        assert_eq!(after.window, None, "its window closed");
        assert!(!ws.is_open());
    }

    #[test]
    fn a_quiet_shard_closes_its_window_once_the_grace_passed() {
        let mut ws = ShardWindows::new(spec());
        ws.assign(&key("a"), 1_000);
        assert_eq!(ws.quiet(64_999), None);
        let closed = ws.quiet(65_000).expect("closed");
        assert_eq!(closed.window, w(0));
        assert!(!ws.is_open());
        assert_eq!(ws.quiet(1_000_000), None);
    }

    #[test]
    fn the_end_of_a_shard_closes_the_open_window() {
        let mut ws = ShardWindows::new(spec());
        ws.assign(&key("a"), 1_000);
        assert_eq!(ws.finish().map(|c| c.window), Some(w(0)));
        assert_eq!(ws.finish(), None);
    }

    #[test]
    fn keys_are_listed_once_in_the_order_they_came() {
        let mut ws = ShardWindows::new(spec());
        for k in ["b", "a", "b", "c", "a"] {
            ws.assign(&key(k), 1_000);
        }
        assert_eq!(ws.finish().unwrap().keys, [key("b"), key("a"), key("c")]);
    }
}
