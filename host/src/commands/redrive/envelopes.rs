//! A redrive's readers' seam ([`Decode`]): dead-letter envelopes turned
//! back into the records they carry — the ones this redrive hands out,
//! each id once, their data read back from the source when the envelope
//! left it out (see the module docs of [`super`]).

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::channel::Record;
use crate::ids::{PartitionKey, Position, SequenceNumber, ShardId, StreamName, SubscriptionName};
use crate::kinesis::{Kinesis, KinesisError, ReadFrom};
use crate::parked::{ParkedKey, Source};
use crate::reader::Decode;

/// Ids a redrive remembers to hand each record back once (see "Order, and
/// nothing twice" in [`super`]): a record's second envelope follows its
/// first within a crash's recovery, far closer than this many dead
/// letters; 100,000 ids are about 10 MB.
pub(crate) const IDS_KEPT: usize = 100_000;

/// Empty pages followed when reading a record back (Kinesis may answer
/// empty before it reaches the sequence number) before the read counts as
/// not answered yet (and is tried again).
const READ_BACK_PAGES: u32 = 5;

/// How often a read-back that keeps failing is logged.
const READ_BACK_LOG_EVERY: u32 = 10;

/// The parking a `--key` redrive brings back.
pub(super) struct Parking {
    /// The key.
    pub key: PartitionKey,
    /// Its parking's identity (every one of its dead letters carries it).
    pub parking: String,
}

/// What a redrive's readers did with envelopes.
#[derive(Default)]
pub(super) struct Counts {
    redriven: AtomicU64,
    other: AtomicU64,
    parked: AtomicU64,
    gone: AtomicU64,
    twice: AtomicU64,
    unreadable: AtomicU64,
}

impl Counts {
    /// The summary's first line.
    pub(super) fn describe(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "dead letters: {} redriven, {} of other subscriptions or keys left, {} parked (left for redrive --key), {} second envelopes of a record (handed back once), {} whose record is gone from its stream (past its retention), {} not envelopes",
            n(&self.redriven),
            n(&self.other),
            n(&self.parked),
            n(&self.twice),
            n(&self.gone),
            n(&self.unreadable),
        )
    }
}

/// The ids handed out, the latest [`IDS_KEPT`].
#[derive(Default)]
struct Ids {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl Ids {
    /// Notes `id`; false when it was handed out already.
    fn first_time(&mut self, id: &str) -> bool {
        if self.set.contains(id) {
            return false;
        }
        self.set.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        if self.order.len() > IDS_KEPT
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }
}

/// What a key's redrive saw.
pub(super) struct Seen {
    pub redriven: u64,
    pub gone: u64,
    pub first: Option<Source>,
    pub last: Option<Source>,
}

impl Seen {
    /// Whether the redrive found the whole parking `parked` and every
    /// record of it was acked (`acked` of them): the reason not, if not.
    pub(super) fn complete(&self, parked: &ParkedKey, acked: u64) -> Result<(), String> {
        if self.gone > 0 {
            return Err(format!(
                "{} of its parked records are gone from their stream (see the log)",
                self.gone
            ));
        }
        if acked < self.redriven {
            return Err(format!(
                "{} of its {} records were not acked",
                self.redriven - acked,
                self.redriven
            ));
        }
        if self.first.as_ref() != Some(&parked.first) || self.redriven < parked.records {
            return Err(format!(
                "{} of its {} parked records were found on the dead-letter stream, the first {} (the first parked is {}): past the stream's retention, before --since, or on a shard the stream split into since",
                self.redriven,
                parked.records,
                self.first
                    .as_ref()
                    .map_or("none".to_owned(), ToString::to_string),
                parked.first
            ));
        }
        if self.last.is_none() {
            return Err("none of its parked records was found".to_owned());
        }
        Ok(())
    }
}

/// Turns dead-letter envelopes back into records (the module docs).
pub(super) struct Envelopes {
    subscription: SubscriptionName,
    /// `--key`: only this parking's records.
    key: Option<Parking>,
    kinesis: Kinesis,
    pub(super) counts: Counts,
    ids: Mutex<Ids>,
    /// The first and the latest parked record handed out (`--key`).
    first: Mutex<Option<Source>>,
    last: Mutex<Option<Source>>,
}

/// A dead letter, as `crate::failure` writes it.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    id: Option<String>,
    reason: String,
    subscription: String,
    #[serde(default)]
    parking: Option<String>,
    source: EnvelopeSource,
    #[serde(default)]
    data_omitted: bool,
    data_base64: Option<String>,
}

#[derive(Deserialize)]
struct EnvelopeSource {
    stream: String,
    shard_id: String,
    sequence_number: String,
    sub_sequence_number: Option<u32>,
    partition_key: String,
    approximate_arrival: u64,
}

impl EnvelopeSource {
    fn place(&self) -> Source {
        Source {
            shard: self.shard_id.clone(),
            sequence: self.sequence_number.clone(),
            sub: self.sub_sequence_number,
        }
    }
}

/// Why a record's data could not be read back.
enum ReadBack {
    /// The stream says it no longer holds it.
    Gone(String),
    /// The redrive was interrupted.
    Cancelled,
}

impl Envelopes {
    pub(super) fn new(
        subscription: SubscriptionName,
        key: Option<Parking>,
        kinesis: Kinesis,
    ) -> Self {
        Self {
            subscription,
            key,
            kinesis,
            counts: Counts::default(),
            ids: Mutex::new(Ids::default()),
            first: Mutex::new(None),
            last: Mutex::new(None),
        }
    }

    /// What a key's redrive saw so far.
    pub(super) fn seen(&self) -> Seen {
        Seen {
            redriven: self.counts.redriven.load(Ordering::Relaxed),
            gone: self.counts.gone.load(Ordering::Relaxed),
            first: self.first.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            last: self.last.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }

    /// Whether this redrive hands `envelope`'s record out (module docs).
    fn selects(&self, envelope: &Envelope) -> bool {
        // The subscription's own, and those its replays and redrives put
        // (`<subscription>~…`).
        let ours = envelope.subscription == self.subscription.as_str()
            || envelope
                .subscription
                .strip_prefix(self.subscription.as_str())
                .is_some_and(|rest| rest.starts_with('~'));
        if !ours {
            self.counts.other.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let parked = envelope.reason == "quarantined";
        match &self.key {
            Some(k)
                if !parked
                    || envelope.source.partition_key != k.key.as_str()
                    || envelope.parking.as_deref() != Some(k.parking.as_str()) =>
            {
                self.counts.other.fetch_add(1, Ordering::Relaxed);
                false
            }
            Some(_) => true,
            None if parked => {
                self.counts.parked.fetch_add(1, Ordering::Relaxed);
                false
            }
            None => true,
        }
    }

    /// Whether `envelope`'s record is handed out for the first time in
    /// this redrive (its id, or its place for an envelope of an earlier
    /// version without one).
    fn first_time(&self, envelope: &Envelope) -> bool {
        let id = envelope
            .id
            .clone()
            .unwrap_or_else(|| envelope.source.place().id());
        let first = self
            .ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first_time(&id);
        if !first {
            self.counts.twice.fetch_add(1, Ordering::Relaxed);
        }
        first
    }

    /// The record `envelope` carries, its data read back from the source
    /// when the envelope left it out: `Ok(None)` when it is unreadable or
    /// gone (counted and logged), `Err` when `cancel` cut the read-back.
    async fn record(
        &self,
        envelope: Envelope,
        dead_letter: &Record,
        cancel: &CancellationToken,
    ) -> Result<Option<Record>, ()> {
        let source = envelope.source;
        let Ok(sequence) = SequenceNumber::parse(&source.sequence_number) else {
            self.unreadable(dead_letter, "its source sequence number is not one");
            return Ok(None);
        };
        let stream = StreamName::new(source.stream.as_str());
        let shard = ShardId::new(source.shard_id.as_str());
        let data = match (envelope.data_omitted, envelope.data_base64) {
            (false, Some(b64)) => match aws_smithy_types::base64::decode(&b64) {
                Ok(data) => data,
                Err(_) => {
                    self.unreadable(dead_letter, "its data_base64 is not base64");
                    return Ok(None);
                }
            },
            _ => match self
                .read_back(
                    &stream,
                    &shard,
                    &sequence,
                    source.sub_sequence_number,
                    cancel,
                )
                .await
            {
                Ok(data) => data,
                Err(ReadBack::Cancelled) => return Err(()),
                Err(ReadBack::Gone(why)) => {
                    self.counts.gone.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        subscription = %self.subscription, stream = %stream, shard_id = %shard, sequence_number = %sequence,
                        dead_letter_shard = %dead_letter.shard, dead_letter_sequence = %dead_letter.sequence, why,
                        "dead letter not redriven: its data was left out of the envelope and the record is no longer in its stream"
                    );
                    return Ok(None);
                }
            },
        };
        Ok(Some(Record {
            window: None,
            stream,
            shard,
            partition_key: PartitionKey::new(source.partition_key.as_str()),
            sequence,
            sub_sequence: source.sub_sequence_number,
            arrival_ms: source.approximate_arrival,
            data,
        }))
    }

    /// Counts and logs a dead letter that is not a readable envelope.
    fn unreadable(&self, dead_letter: &Record, why: &str) {
        self.counts.unreadable.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(subscription = %self.subscription, dead_letter_shard = %dead_letter.shard, dead_letter_sequence = %dead_letter.sequence, why, "not a dead-letter envelope; left alone");
    }

    /// A record's data read back from its stream (AT_SEQUENCE_NUMBER),
    /// the user record's within a KPL aggregate. A read that fails for a
    /// passing reason is tried again with a backoff until `cancel`; only
    /// the stream saying the record is no longer there is
    /// [`ReadBack::Gone`] (module docs).
    async fn read_back(
        &self,
        stream: &StreamName,
        shard: &ShardId,
        sequence: &SequenceNumber,
        sub: Option<u32>,
        cancel: &CancellationToken,
    ) -> Result<Vec<u8>, ReadBack> {
        let mut backoff = Backoff::new(
            std::time::Duration::from_millis(200),
            std::time::Duration::from_secs(5),
        );
        for tries in 1u32.. {
            let read = tokio::select! {
                _ = cancel.cancelled() => return Err(ReadBack::Cancelled),
                read = self.read_back_once(stream, shard, sequence, sub) => read,
            };
            let why = match read {
                Ok(data) => return Ok(data),
                Err(Failed::Gone(why)) => return Err(ReadBack::Gone(why)),
                Err(Failed::Passing(why)) => why,
            };
            if tries == 1 || tries.is_multiple_of(READ_BACK_LOG_EVERY) {
                tracing::warn!(subscription = %self.subscription, stream = %stream, shard_id = %shard, sequence_number = %sequence, tries, why, "cannot read a dead letter's record back yet; trying again (logged every {READ_BACK_LOG_EVERY} tries)");
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err(ReadBack::Cancelled),
                () = tokio::time::sleep(backoff.next_wait()) => {}
            }
        }
        unreachable!("the loop returns")
    }

    /// One try of [`Envelopes::read_back`].
    async fn read_back_once(
        &self,
        stream: &StreamName,
        shard: &ShardId,
        sequence: &SequenceNumber,
        sub: Option<u32>,
    ) -> Result<Vec<u8>, Failed> {
        let mut iterator = Some(
            self.kinesis
                .open_iterator(stream, shard, &ReadFrom::At(sequence.clone()))
                .await
                .map_err(Failed::of)?,
        );
        let mut found = None;
        for _ in 0..READ_BACK_PAGES {
            let Some(current) = iterator.take() else {
                break;
            };
            let page = self
                .kinesis
                .get_records(&current, 1)
                .await
                .map_err(Failed::of)?;
            if let Some(first) = page.records.into_iter().next() {
                found = Some(first);
                break;
            }
            iterator = page.next_iterator;
        }
        let found = match found {
            Some(found) if &found.sequence == sequence => found,
            // The stream starts past it: trimmed (past its retention).
            Some(later) => {
                return Err(Failed::Gone(format!(
                    "the shard now starts at {}, past it (the stream's retention)",
                    later.sequence
                )));
            }
            None if iterator.is_none() => {
                return Err(Failed::Gone("the shard ended without it".to_owned()));
            }
            None => return Err(Failed::Passing("no record answered yet".to_owned())),
        };
        match (sub, crate::kpl::unpack(&found.data)) {
            (None, _) => Ok(found.data),
            (Some(i), crate::kpl::Unpacked::Aggregate(records)) => records
                .into_iter()
                .nth(i as usize)
                .map(|r| r.data)
                .ok_or_else(|| Failed::Gone(format!("its aggregate holds no user record {i}"))),
            (Some(i), _) => Err(Failed::Gone(format!(
                "user record {i} of a record that is no aggregate"
            ))),
        }
    }
}

/// Why one try of a read-back failed.
enum Failed {
    /// For good: the stream no longer holds the record.
    Gone(String),
    /// For now: throttling, a timeout, the network, an answer that does
    /// not reach the record yet.
    Passing(String),
}

impl Failed {
    /// A Kinesis error, by its kind: the stream saying the shard or the
    /// sequence number is not there is for good; the rest passes.
    fn of(e: KinesisError) -> Self {
        match e {
            KinesisError::NotFound(_) | KinesisError::Refused(_) => Self::Gone(e.to_string()),
            KinesisError::Throttled(_)
            | KinesisError::ExpiredIterator
            | KinesisError::Malformed(_)
            | KinesisError::Failed(_) => Self::Passing(e.to_string()),
        }
    }
}

#[async_trait]
impl Decode for Envelopes {
    async fn decode(
        &self,
        records: Vec<(Record, Position)>,
        cancel: &CancellationToken,
    ) -> Option<Vec<(Record, Position)>> {
        let mut out = Vec::with_capacity(records.len());
        for (dead_letter, position) in records {
            let envelope: Envelope = match serde_json::from_slice(&dead_letter.data) {
                Ok(envelope) => envelope,
                Err(e) => {
                    self.counts.unreadable.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(subscription = %self.subscription, dead_letter_shard = %dead_letter.shard, dead_letter_sequence = %dead_letter.sequence, error = %e, "not a dead-letter envelope; left alone");
                    continue;
                }
            };
            if !self.selects(&envelope) || !self.first_time(&envelope) {
                continue;
            }
            let place = envelope.source.place();
            let Some(record) = self.record(envelope, &dead_letter, cancel).await.ok()? else {
                continue;
            };
            self.counts.redriven.fetch_add(1, Ordering::Relaxed);
            if self.key.is_some() {
                self.first
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(|| place.clone());
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(place);
            }
            out.push((record, position));
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a second envelope of a record handed back again (a
    /// duplicate, and out of order after the first's later records), or
    /// the window forgetting the newest ids.
    #[test]
    fn each_id_is_handed_out_once_within_the_window() {
        let mut ids = Ids::default();
        assert!(ids.first_time("s/1") && ids.first_time("s/2"));
        assert!(!ids.first_time("s/1"), "the re-parked record");
        for i in 0..IDS_KEPT {
            ids.first_time(&format!("t/{i}"));
        }
        assert!(ids.first_time("s/1"), "older than the window");
        assert!(!ids.first_time(&format!("t/{}", IDS_KEPT - 1)));
        assert_eq!(ids.set.len(), IDS_KEPT);
    }

    /// Catches: a throttled or timed-out read-back taken for a record gone
    /// for good (it would be skipped for ever).
    #[test]
    fn only_the_stream_saying_so_makes_a_record_gone() {
        let passing = [
            KinesisError::Throttled("slow down".into()),
            KinesisError::ExpiredIterator,
            KinesisError::Failed("timed out".into()),
        ];
        for e in passing {
            assert!(matches!(Failed::of(e), Failed::Passing(_)));
        }
        for e in [
            KinesisError::NotFound("no shard".into()),
            KinesisError::Refused("trimmed".into()),
        ] {
            assert!(matches!(Failed::of(e), Failed::Gone(_)));
        }
    }
}
