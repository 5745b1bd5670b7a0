//! Parked keys: a subscription's quarantine, as its lease store keeps it —
//! one item per parked partition key ([`ParkedKey`]) — and the pure rules
//! that change one.
//!
//! A key is parked when one of its records runs out of attempts or age
//! under `on_failure = "quarantine"`; from then on each of its records is
//! put to the dead-letter stream instead of being handled, until the key
//! is released (`shardlane redrive --key`). Its item says when and why it
//! was parked, by which instance, how many records it holds, the first
//! and the last of them (their place in the source stream), which parking
//! it is ([`ParkedKey::parking`], written into every dead letter of it),
//! and where the first of those dead letters lies in the dead-letter
//! stream ([`ParkedKey::first_put`]).
//!
//! Every change of an item moves its `revision`, and the store writes a
//! change only over the revision it was made from, so two writers at once
//! never lose each other's change: the loser reads again and applies its
//! change on top. A park is one small write of one item, however many
//! keys are parked.
//!
//! # A record parked twice
//! After a crash between a park and the checkpoint that passes it, the
//! record is read again and parked again. [`ParkedKey::park_again`] then
//! changes nothing: a record at or before the key's `last` was counted
//! already (on the same shard, sequence numbers order them; a key's
//! records on another shard are later ones, as a child shard starts only
//! after its parent ended). The dead letter may be put twice: it carries
//! the record's id (its place in the source), and redrive hands each id
//! back once.
//!
//! A release names the last record its caller saw parked: it lands only
//! if no record was parked since, so a record parked while the key's
//! records were being redriven is never left behind (see `failure`'s
//! quarantine for the whole protocol).
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use serde::{Deserialize, Serialize};

use crate::ids::SequenceNumber;

/// Where a parked record lies in its source stream.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Source {
    /// Its shard.
    pub shard: String,
    /// Its sequence number.
    pub sequence: String,
    /// Its index in a KPL aggregate, for a user record.
    #[serde(default)]
    pub sub: Option<u32>,
}

impl Source {
    /// Whether this record comes after `other` among one key's records:
    /// later on the same shard, or on another shard (a key's records on a
    /// child shard come after its parent's).
    pub fn after(&self, other: &Source) -> bool {
        if self.shard != other.shard {
            return true;
        }
        match (
            SequenceNumber::parse(&self.sequence),
            SequenceNumber::parse(&other.sequence),
        ) {
            (Ok(a), Ok(b)) => (a, self.sub.unwrap_or(0)) > (b, other.sub.unwrap_or(0)),
            // Not sequence numbers (never from Kinesis): only equal ones are
            // the same record.
            _ => self != other,
        }
    }

    /// The record's id in dead letters and redrives: `shard/sequence`, and
    /// `/sub` for a user record of a KPL aggregate.
    pub fn id(&self) -> String {
        self.to_string()
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.shard, self.sequence)?;
        if let Some(sub) = self.sub {
            write!(f, "/{sub}")?;
        }
        Ok(())
    }
}

/// Where a dead letter lies in the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Put {
    /// The dead-letter stream's shard.
    pub shard: String,
    /// Its sequence number there.
    pub sequence: String,
}

/// One parked key, as its item holds it (module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedKey {
    /// Moved by every change (the store writes conditionally on it).
    pub revision: u64,
    /// This parking's identity, in every dead letter of it: a key parked,
    /// released and parked again is another parking.
    pub parking: String,
    /// When it was parked (ms since the Unix epoch, the parking host's
    /// clock): shown, never compared.
    pub since_ms: u64,
    /// The instance that parked it.
    pub by: String,
    /// Why: the last failure of the record that parked it.
    pub reason: String,
    /// Records parked (that one included).
    pub records: u64,
    /// The record that parked it.
    pub first: Source,
    /// The latest record parked.
    pub last: Source,
    /// Where the dead letter of `first` lies, once put: where
    /// `redrive --key` starts reading.
    #[serde(default)]
    pub first_put: Option<Put>,
}

/// What a quarantine may hold (`quarantine = { max_keys, max_records }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParkLimits {
    /// Keys parked at once, per subscription.
    pub max_keys: usize,
    /// Records parked per key.
    pub max_records: u64,
}

/// Why a record could not be parked: the quarantine is full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParkRefused {
    /// As many keys as it may hold are parked.
    #[error("{0} keys are parked already (quarantine max_keys)")]
    Keys(usize),
    /// The key holds as many records as it may.
    #[error("the key holds {0} parked records already (quarantine max_records)")]
    Records(u64),
}

/// Why a release did not land.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseRefused {
    /// The key is not parked.
    #[error("key {0:?} is not parked")]
    NotParked(String),
    /// A record was parked after the one the caller saw last.
    #[error("key {key:?} parked another record meanwhile (now {last})")]
    Moved {
        /// The key.
        key: String,
        /// Its latest parked record now.
        last: Source,
    },
}

impl ParkedKey {
    /// A key parked by `record` (its first item, revision 1).
    pub fn new(record: Source, parking: String, reason: &str, by: &str, now_ms: u64) -> Self {
        Self {
            revision: 1,
            parking,
            since_ms: now_ms,
            by: by.to_owned(),
            reason: reason.to_owned(),
            records: 1,
            first: record.clone(),
            last: record,
            first_put: None,
        }
    }

    /// The item with `record` parked behind the others; `None` when it was
    /// parked already (at or before `last`: a re-park after a crash,
    /// module docs), which changes nothing.
    ///
    /// # Errors
    /// [`ParkRefused::Records`] when the key holds as many as it may.
    pub fn park_again(
        &self,
        record: &Source,
        limits: ParkLimits,
    ) -> Result<Option<Self>, ParkRefused> {
        if !record.after(&self.last) {
            return Ok(None);
        }
        if self.records >= limits.max_records {
            return Err(ParkRefused::Records(self.records));
        }
        Ok(Some(Self {
            revision: self.revision + 1,
            records: self.records + 1,
            last: record.clone(),
            ..self.clone()
        }))
    }

    /// The item noting where its first dead letter was put.
    pub fn with_first_put(&self, put: Put) -> Self {
        Self {
            revision: self.revision + 1,
            first_put: Some(put),
            ..self.clone()
        }
    }

    /// Whether key `key` may be released by a caller that saw `seen_last`
    /// as its latest parked record.
    ///
    /// # Errors
    /// [`ReleaseRefused::Moved`] when a record was parked since.
    pub fn release(&self, key: &str, seen_last: &Source) -> Result<(), ReleaseRefused> {
        if &self.last != seen_last {
            return Err(ReleaseRefused::Moved {
                key: key.to_owned(),
                last: self.last.clone(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ParkLimits = ParkLimits {
        max_keys: 2,
        max_records: 3,
    };

    fn at(n: u32) -> Source {
        Source {
            shard: "shardId-000000000000".into(),
            sequence: format!("4960{n:04}"),
            sub: None,
        }
    }

    #[test]
    fn a_key_counts_its_records_and_is_released_only_as_seen() {
        let one = ParkedKey::new(at(1), "p1".into(), "guest trapped", "a", 7);
        assert_eq!((one.revision, one.records), (1, 1));
        let two = one.park_again(&at(2), LIMITS).unwrap().unwrap();
        assert_eq!(
            (two.revision, two.records, &two.first, &two.last),
            (2, 2, &at(1), &at(2))
        );
        assert_eq!(
            (
                two.since_ms,
                two.by.as_str(),
                two.reason.as_str(),
                two.parking.as_str()
            ),
            (7, "a", "guest trapped", "p1")
        );
        assert_eq!(
            two.release("k", &at(1)),
            Err(ReleaseRefused::Moved {
                key: "k".into(),
                last: at(2)
            }),
            "a record parked since the caller looked keeps the key parked"
        );
        assert_eq!(two.release("k", &at(2)), Ok(()));
    }

    /// Catches: a record parked again after a crash counted twice, or
    /// moving `last` back (a release would then leave later records
    /// behind, and redrive would hand them back out of order).
    #[test]
    fn a_record_parked_again_after_a_crash_changes_nothing() {
        let three = ParkedKey::new(at(1), "p".into(), "r", "a", 0)
            .park_again(&at(2), LIMITS)
            .unwrap()
            .unwrap()
            .park_again(&at(3), LIMITS)
            .unwrap()
            .unwrap();
        for again in [at(1), at(2), at(3)] {
            assert_eq!(three.park_again(&again, LIMITS), Ok(None), "{again}");
        }
        let user_record = Source {
            sub: Some(2),
            ..at(3)
        };
        assert_eq!(
            three.park_again(&user_record, LIMITS),
            Err(ParkRefused::Records(3)),
            "a later user record of the same aggregate is a new record"
        );
        let child = Source {
            shard: "shardId-000000000007".into(),
            sequence: "1".into(),
            sub: None,
        };
        assert!(child.after(&at(3)), "a child shard's records come after");
    }

    #[test]
    fn sequence_numbers_order_by_value_not_by_text() {
        let short = Source {
            sequence: "99".into(),
            ..at(0)
        };
        let long = Source {
            sequence: "100".into(),
            ..at(0)
        };
        assert!(long.after(&short) && !short.after(&long));
    }

    #[test]
    fn the_item_reads_back_as_it_was_written() {
        let doc = ParkedKey::new(
            Source {
                sub: Some(2),
                ..at(1)
            },
            "p".into(),
            "r",
            "a",
            5,
        )
        .with_first_put(Put {
            shard: "shardId-000000000001".into(),
            sequence: "777".into(),
        });
        let json = serde_json::to_string(&doc).unwrap();
        let revision = serde_json::from_str::<serde_json::Value>(&json).unwrap()["revision"]
            .as_u64()
            .unwrap();
        assert_eq!(
            revision, 2,
            "the store reads the revision from the top level"
        );
        assert_eq!(serde_json::from_str::<ParkedKey>(&json).unwrap(), doc);
    }
}
