//! A replay's range ([`Range`]): where each shard's reading starts, where
//! it stops, and how far each shard got (for the replay's progress bars).
//!
//! A reader given a range (`ReaderContext::range`) reads only what lies in
//! it and then reports the shard's end, exactly as at the end of a closed
//! shard: settlement checkpoints `SHARD_END` once everything read has
//! settled, and the lease keeper starts a split's or merge's children
//! only after their parents ended. So a replay reads parents before
//! children, and a shard whose part of the range is done is never read
//! again when the replay is run again under the same name.
//!
//! # Where reading starts
//! A shard with a checkpoint (a replay resumed) goes on after it. A shard
//! without one starts at the range's start: `AT_TIMESTAMP` of the start
//! time, or `AT_SEQUENCE_NUMBER` of the shard's start sequence number. A
//! range given in sequence numbers covers only the shards it names: any
//! other shard ends at once, unread.
//!
//! # Where reading stops
//! A shard stops at the first record past the range's end (arrival time
//! later than the end time, or sequence number above the shard's end
//! sequence number), which is not handed out; at the end of a closed shard;
//! or at the shard's tip (an empty read `0` ms behind the latest record).
//! The tip is the end because a replay covers only records already in the
//! stream: its end time is never later than its start (the command refuses
//! a future `--to`), so every record put after it began arrives past it;
//! and a sequence number given as an end names a record already there.
//!
//! Floor 6 (records in and out) of the crate's layers (see "Layers" in the
//! crate docs): imports only its own floor and those below.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use crate::config::StartPosition;
use crate::ids::{SequenceNumber, ShardId};
use crate::kinesis::{Fetched, ReadFrom};

/// One edge of a range: a time, or a sequence number per shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Edge {
    /// Milliseconds since the Unix epoch, compared with records' arrival.
    Time(u64),
    /// A sequence number for each shard named.
    Sequences(BTreeMap<ShardId, SequenceNumber>),
}

/// How far one shard of a range got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ShardProgress {
    /// Records handed out (each KPL aggregate counts once).
    pub read: u64,
    /// The latest arrival time handed out, ms since the Unix epoch.
    pub last_arrival_ms: u64,
    /// The shard's part of the range was read to its end.
    pub done: bool,
}

/// A replay's range (module docs), shared by its readers and the command
/// that shows their progress.
#[derive(Debug)]
pub(crate) struct Range {
    from: Edge,
    /// `None`: to each shard's tip, keeping an open shard's place there
    /// (see [`Range::open_ended`]).
    to: Option<Edge>,
    progress: Mutex<BTreeMap<ShardId, ShardProgress>>,
}

impl Range {
    /// The records from `from` through `to`, both included.
    pub(crate) fn new(from: Edge, to: Edge) -> Self {
        Self {
            from,
            to: Some(to),
            progress: Mutex::new(BTreeMap::new()),
        }
    }

    /// The records from `from` to each shard's tip, read again and again by
    /// runs under one name (a redrive): an open shard's reading stops at
    /// its tip with an ordinary checkpoint there, never `SHARD_END`, so
    /// the next run goes on from it; only a closed shard's true end is one.
    pub(crate) fn open_ended(from: Edge) -> Self {
        Self {
            from,
            to: None,
            progress: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether an open shard keeps its place at the tip (an open-ended
    /// range) rather than ending there.
    pub(crate) fn keeps_place_at_tip(&self) -> bool {
        self.to.is_none()
    }

    /// Where a shard's reading starts (module docs): `from` as the keeper
    /// gave it when the shard has a checkpoint, the range's start
    /// otherwise; `None` for a shard outside the range.
    pub(crate) fn first_read(&self, shard: &ShardId, from: ReadFrom) -> Option<ReadFrom> {
        // An end in sequence numbers names every shard it reads to.
        if let Some(Edge::Sequences(ends)) = &self.to
            && !ends.contains_key(shard)
        {
            return None;
        }
        let start = match &self.from {
            Edge::Sequences(starts) => ReadFrom::At(starts.get(shard)?.clone()),
            Edge::Time(ms) => ReadFrom::Start(StartPosition::AtTimestamp(
                UNIX_EPOCH + Duration::from_millis(*ms),
            )),
        };
        Some(match from {
            ReadFrom::Start(_) => start,
            resumed @ (ReadFrom::After(_) | ReadFrom::At(_)) => resumed,
        })
    }

    /// Drops the records of `page` from the first one past the range's end
    /// on; true when there was one (the shard's part of the range is read).
    pub(crate) fn cut(&self, shard: &ShardId, page: &mut Vec<Fetched>) -> bool {
        let past = |f: &Fetched| match &self.to {
            None => false,
            Some(Edge::Time(ms)) => f.arrival_ms > *ms,
            Some(Edge::Sequences(ends)) => ends.get(shard).is_some_and(|end| &f.sequence > end),
        };
        match page.iter().position(past) {
            Some(first) => {
                page.truncate(first);
                true
            }
            None => false,
        }
    }

    /// Whether a read that returned `records` at `millis_behind` found
    /// the shard's tip, where a replay stops (module docs).
    pub(crate) fn at_tip(records: usize, millis_behind: Option<u64>) -> bool {
        records == 0 && millis_behind.is_none_or(|behind| behind == 0)
    }

    /// Notes `page`, about to be handed out, in `shard`'s progress.
    pub(crate) fn note(&self, shard: &ShardId, page: &[Fetched]) {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let entry = progress.entry(shard.clone()).or_default();
        entry.read += page.len() as u64;
        if let Some(last) = page.iter().map(|f| f.arrival_ms).max() {
            entry.last_arrival_ms = entry.last_arrival_ms.max(last);
        }
    }

    /// Notes that `shard`'s part of the range is read.
    pub(crate) fn ended(&self, shard: &ShardId) {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.entry(shard.clone()).or_default().done = true;
    }

    /// Every shard's progress so far.
    pub(crate) fn progress(&self) -> BTreeMap<ShardId, ShardProgress> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How much of the range's time `p` covers, from 0 to 1: the basis of
    /// a shard's estimated total (records read so far over this). `None`
    /// for a range in sequence numbers, or before the first record.
    pub(crate) fn fraction(&self, p: &ShardProgress) -> Option<f64> {
        if p.done {
            return Some(1.0);
        }
        let (Edge::Time(from), Some(Edge::Time(to))) = (&self.from, &self.to) else {
            return None;
        };
        if p.last_arrival_ms == 0 || to <= from {
            return None;
        }
        let covered = p.last_arrival_ms.saturating_sub(*from) as f64 / (to - from) as f64;
        (covered > 0.0).then_some(covered.min(1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{PartitionKey, Position};

    fn seq(n: u64) -> SequenceNumber {
        SequenceNumber::parse(&format!("4960{n:052}")).unwrap()
    }

    fn fetched(n: u64, arrival_ms: u64) -> Fetched {
        Fetched {
            partition_key: PartitionKey::new("k"),
            sequence: seq(n),
            arrival_ms,
            data: Vec::new(),
        }
    }

    fn shard(n: u32) -> ShardId {
        ShardId::new(format!("shardId-{n:012}"))
    }

    #[test]
    fn a_shard_without_checkpoint_starts_at_the_range_and_a_resumed_one_after_its_checkpoint() {
        let by_time = Range::new(Edge::Time(1_000), Edge::Time(2_000));
        assert_eq!(
            by_time.first_read(&shard(0), ReadFrom::Start(StartPosition::TrimHorizon)),
            Some(ReadFrom::Start(StartPosition::AtTimestamp(
                UNIX_EPOCH + Duration::from_secs(1)
            )))
        );
        let resumed = ReadFrom::After(Position::whole(seq(7)));
        assert_eq!(
            by_time.first_read(&shard(0), resumed.clone()),
            Some(resumed.clone())
        );
        let by_sequence = Range::new(
            Edge::Sequences(BTreeMap::from([(shard(1), seq(5))])),
            Edge::Time(2_000),
        );
        assert_eq!(
            by_sequence.first_read(&shard(1), ReadFrom::Start(StartPosition::Latest)),
            Some(ReadFrom::At(seq(5)))
        );
        assert_eq!(
            by_sequence.first_read(&shard(1), resumed.clone()),
            Some(resumed)
        );
        assert_eq!(
            by_sequence.first_read(&shard(0), ReadFrom::Start(StartPosition::Latest)),
            None,
            "a shard the range does not name is not read"
        );
    }

    #[test]
    fn a_page_is_cut_at_the_first_record_past_the_end() {
        let by_time = Range::new(Edge::Time(0), Edge::Time(2_000));
        let mut page = vec![
            fetched(1, 1_000),
            fetched(2, 2_000),
            fetched(3, 2_001),
            fetched(4, 1_500),
        ];
        assert!(by_time.cut(&shard(0), &mut page));
        assert_eq!(
            page,
            vec![fetched(1, 1_000), fetched(2, 2_000)],
            "the end is included"
        );
        let mut before = vec![fetched(1, 1_000)];
        assert!(!by_time.cut(&shard(0), &mut before));
        assert_eq!(before.len(), 1);
        let unknown_arrival = &mut vec![fetched(9, 0)];
        assert!(
            !by_time.cut(&shard(0), unknown_arrival),
            "an unknown arrival never ends a range"
        );

        let by_sequence = Range::new(
            Edge::Time(0),
            Edge::Sequences(BTreeMap::from([(shard(1), seq(2))])),
        );
        let mut page = vec![fetched(1, 1), fetched(2, 2), fetched(3, 3)];
        assert!(by_sequence.cut(&shard(1), &mut page));
        assert_eq!(page.len(), 2);
        assert_eq!(
            by_sequence.first_read(&shard(0), ReadFrom::Start(StartPosition::Latest)),
            None,
            "a shard an end in sequence numbers does not name is not read"
        );
        let open = Range::open_ended(Edge::Time(0));
        let mut all = vec![fetched(1, 1), fetched(3, u64::MAX)];
        assert!(
            !open.cut(&shard(0), &mut all),
            "an open-ended range never cuts"
        );
        assert!(open.keeps_place_at_tip() && !by_sequence.keeps_place_at_tip());
    }

    #[test]
    fn the_tip_is_an_empty_read_at_the_latest_record() {
        assert!(Range::at_tip(0, Some(0)));
        assert!(Range::at_tip(0, None));
        assert!(
            !Range::at_tip(0, Some(5_000)),
            "an empty read behind the tip is a gap"
        );
        assert!(!Range::at_tip(3, Some(0)));
    }

    #[test]
    fn progress_estimates_the_covered_fraction_of_the_time_range() {
        let range = Range::new(Edge::Time(1_000), Edge::Time(3_000));
        range.note(&shard(0), &[fetched(1, 1_500), fetched(2, 2_000)]);
        let p = range.progress()[&shard(0)].clone();
        assert_eq!(p.read, 2);
        assert_eq!(range.fraction(&p), Some(0.5));
        range.ended(&shard(0));
        let p = range.progress()[&shard(0)].clone();
        assert!(p.done);
        assert_eq!(range.fraction(&p), Some(1.0));
        assert_eq!(range.fraction(&ShardProgress::default()), None);
        let by_sequence = Range::new(Edge::Sequences(BTreeMap::new()), Edge::Time(5));
        assert_eq!(
            by_sequence.fraction(&ShardProgress {
                read: 3,
                last_arrival_ms: 4,
                done: false
            }),
            None
        );
    }
}
