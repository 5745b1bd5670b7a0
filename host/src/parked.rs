//! Parked keys: a subscription's quarantine, as its lease store keeps it
//! (one document per subscription, [`ParkedKeys`]), and the pure rules
//! that change it.
//!
//! A key is parked when one of its records runs out of attempts or age
//! under `on_failure = "quarantine"`; from then on each of its records is
//! put to the dead-letter stream instead of being handled, until the key
//! is released (`shardlane redrive --key`). The document says, per key,
//! when and why it was parked, by which instance, how many records it
//! holds, and the first and the last of them (their place in the source
//! stream). Every change bumps `revision`, and the store writes a change
//! only over the revision it was made from, so two instances parking at
//! once, or a release racing a park, never lose each other's change: the
//! loser reads again and applies its change on top.
//!
//! A release names the last record its caller saw parked: it lands only
//! if no record was parked since, so a record parked while the key's
//! records were being redriven is never left behind (see `failure`'s
//! quarantine for the whole protocol).
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.shard, self.sequence)?;
        if let Some(sub) = self.sub {
            write!(f, "/{sub}")?;
        }
        Ok(())
    }
}

/// One parked key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedKey {
    /// When it was parked (ms since the Unix epoch).
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
}

/// A subscription's parked keys (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedKeys {
    /// Bumped by every change.
    pub revision: u64,
    /// By partition key.
    pub keys: BTreeMap<String, ParkedKey>,
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

impl ParkedKeys {
    /// Whether `key` is parked.
    pub fn is_parked(&self, key: &str) -> bool {
        self.keys.contains_key(key)
    }

    /// The document with `record` of `key` parked: the key parked by it
    /// when it was not yet, counted on otherwise. A record already the
    /// key's latest (parked again after a crash) changes nothing but the
    /// revision.
    ///
    /// # Errors
    /// [`ParkRefused`] when the quarantine is full.
    pub fn park(
        &self,
        key: &str,
        record: Source,
        reason: &str,
        by: &str,
        now_ms: u64,
        limits: ParkLimits,
    ) -> Result<Self, ParkRefused> {
        let mut next = self.clone();
        next.revision += 1;
        match next.keys.get_mut(key) {
            Some(parked) => add(parked, record, limits)?,
            None => {
                if self.keys.len() >= limits.max_keys {
                    return Err(ParkRefused::Keys(self.keys.len()));
                }
                next.keys.insert(
                    key.to_owned(),
                    ParkedKey {
                        since_ms: now_ms,
                        by: by.to_owned(),
                        reason: reason.to_owned(),
                        records: 1,
                        first: record.clone(),
                        last: record,
                    },
                );
            }
        }
        Ok(next)
    }

    /// The document with a later `record` of `key` parked behind the
    /// first; `None` when the key is not parked (it was released: the
    /// record is handled).
    ///
    /// # Errors
    /// [`ParkRefused::Records`] when the key holds as many as it may.
    pub fn add(
        &self,
        key: &str,
        record: Source,
        limits: ParkLimits,
    ) -> Result<Option<Self>, ParkRefused> {
        let mut next = self.clone();
        let Some(parked) = next.keys.get_mut(key) else {
            return Ok(None);
        };
        add(parked, record, limits)?;
        next.revision += 1;
        Ok(Some(next))
    }

    /// The document with `key` released, if its latest parked record is
    /// still `seen_last`.
    ///
    /// # Errors
    /// [`ReleaseRefused`] naming why not.
    pub fn release(&self, key: &str, seen_last: &Source) -> Result<Self, ReleaseRefused> {
        let Some(parked) = self.keys.get(key) else {
            return Err(ReleaseRefused::NotParked(key.to_owned()));
        };
        if &parked.last != seen_last {
            return Err(ReleaseRefused::Moved {
                key: key.to_owned(),
                last: parked.last.clone(),
            });
        }
        let mut next = self.clone();
        next.keys.remove(key);
        next.revision += 1;
        Ok(next)
    }
}

/// Counts `record` on a parked key, unless it is the latest already.
fn add(parked: &mut ParkedKey, record: Source, limits: ParkLimits) -> Result<(), ParkRefused> {
    if parked.last == record {
        return Ok(());
    }
    if parked.records >= limits.max_records {
        return Err(ParkRefused::Records(parked.records));
    }
    parked.records += 1;
    parked.last = record;
    Ok(())
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
    fn a_key_parks_counts_its_records_and_is_released_only_as_seen() {
        let none = ParkedKeys::default();
        let one = none
            .park("k", at(1), "guest trapped", "a", 7, LIMITS)
            .unwrap();
        assert_eq!(one.revision, 1);
        assert!(one.is_parked("k") && !one.is_parked("j"));
        let two = one.add("k", at(2), LIMITS).unwrap().unwrap();
        let parked = &two.keys["k"];
        assert_eq!(
            (parked.records, &parked.first, &parked.last),
            (2, &at(1), &at(2))
        );
        assert_eq!(
            (parked.since_ms, parked.by.as_str(), parked.reason.as_str()),
            (7, "a", "guest trapped")
        );
        assert_eq!(
            two.add("j", at(3), LIMITS).unwrap(),
            None,
            "not parked: handled"
        );
        assert_eq!(
            two.release("k", &at(1)),
            Err(ReleaseRefused::Moved {
                key: "k".into(),
                last: at(2)
            }),
            "a record parked since the caller looked keeps the key parked"
        );
        let released = two.release("k", &at(2)).unwrap();
        assert!(!released.is_parked("k"));
        assert_eq!(released.revision, 3);
        assert_eq!(
            released.release("k", &at(2)),
            Err(ReleaseRefused::NotParked("k".into()))
        );
    }

    #[test]
    fn a_record_parked_again_after_a_crash_counts_once() {
        let one = ParkedKeys::default()
            .park("k", at(1), "r", "a", 0, LIMITS)
            .unwrap();
        let again = one.park("k", at(1), "r", "b", 9, LIMITS).unwrap();
        assert_eq!(again.keys["k"].records, 1);
        let two = again.add("k", at(2), LIMITS).unwrap().unwrap();
        let same = two.add("k", at(2), LIMITS).unwrap().unwrap();
        assert_eq!(same.keys["k"].records, 2);
    }

    #[test]
    fn a_full_quarantine_refuses_keys_and_records_past_its_bounds() {
        let two = ParkedKeys::default()
            .park("a", at(1), "r", "x", 0, LIMITS)
            .unwrap()
            .park("b", at(2), "r", "x", 0, LIMITS)
            .unwrap();
        assert_eq!(
            two.park("c", at(3), "r", "x", 0, LIMITS),
            Err(ParkRefused::Keys(2))
        );
        let full = two
            .add("a", at(4), LIMITS)
            .unwrap()
            .unwrap()
            .add("a", at(5), LIMITS)
            .unwrap()
            .unwrap();
        assert_eq!(full.keys["a"].records, 3);
        assert_eq!(full.add("a", at(6), LIMITS), Err(ParkRefused::Records(3)));
        assert_eq!(
            full.park("a", at(6), "r", "x", 0, LIMITS),
            Err(ParkRefused::Records(3))
        );
    }

    #[test]
    fn the_document_reads_back_as_it_was_written() {
        let doc = ParkedKeys::default()
            .park(
                "k",
                Source {
                    sub: Some(2),
                    ..at(1)
                },
                "r",
                "a",
                5,
                LIMITS,
            )
            .unwrap();
        let json = serde_json::to_string(&doc).unwrap();
        assert_eq!(crate_revision(&json), 1);
        assert_eq!(serde_json::from_str::<ParkedKeys>(&json).unwrap(), doc);
    }

    /// The store reads a document's revision from its top level.
    fn crate_revision(json: &str) -> u64 {
        serde_json::from_str::<serde_json::Value>(json).unwrap()["revision"]
            .as_u64()
            .unwrap()
    }
}
