//! From a GetRecords page to the records a reader hands out, each with the
//! [`Position`] it settles at: plain records as they are, KPL aggregates as
//! their user records ([`crate::kpl`]). Pure; the reader owns the counters.
//!
//! Positions: a plain record is its whole sequence number; the user record
//! `i` of an aggregate of `n` is `within(seq, i)`, except the last, which
//! is `whole(seq)` (see [`Position`]). Its delivered sub-sequence number is
//! `i` in both cases.
//!
//! Resuming inside an aggregate: the reader opens the shard *at* the
//! aggregate's sequence number and passes the checkpoint as `skip_through`;
//! every user record at or before it is dropped here, so nothing settled is
//! handed out again.

use crate::channel::Record;
use crate::ids::{PartitionKey, Position, ShardId, StreamName};
use crate::kinesis::{Fetched, HashKeyRange};
use crate::kpl::{self, Unpacked};

/// What unpacking a page found, for the reader's counters.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    /// User records taken out of aggregates.
    pub user_records: u64,
    /// Records with the KPL magic that were not valid aggregates (handed
    /// out as they are).
    pub corrupt: u64,
    /// User records whose hash key lies outside the shard's range (handed
    /// out all the same).
    pub hash_key_mismatch: u64,
}

/// Where the records of one shard come from.
pub(crate) struct Source<'a> {
    /// The stream.
    pub stream: &'a StreamName,
    /// The shard.
    pub shard: &'a ShardId,
    /// The shard's hash keys, when known.
    pub hash_keys: Option<HashKeyRange>,
}

/// Whether the record at `position`, index `index` in its Kinesis record
/// (0 for a plain record), is covered by the checkpoint `skip_through`:
/// at or before it, or at its sequence number with an index up to its own.
/// The second rule is how KCL counts (an imported checkpoint, see
/// `import_kcl`): a plain record is index 0, and the last user record of
/// an aggregate is checkpointed by its index. shardlane's own checkpoints
/// stop at an index only inside an aggregate and never at its last user
/// record (that is the whole record), so the rule skips nothing else.
fn covered(skip_through: Option<&Position>, position: &Position, index: u32) -> bool {
    skip_through.is_some_and(|s| {
        position <= s
            || (s.sequence() == position.sequence() && s.sub().is_some_and(|k| index <= k))
    })
}

impl Source<'_> {
    /// The records of `page`, in shard order, with their positions; drops
    /// those at or before `skip_through`.
    pub(crate) fn unpack(
        &self,
        page: Vec<Fetched>,
        skip_through: Option<&Position>,
        found: &mut Found,
    ) -> Vec<(Record, Position)> {
        let mut out = Vec::with_capacity(page.len());
        for fetched in page {
            match kpl::unpack(&fetched.data) {
                Unpacked::Plain => self.push_plain(&mut out, fetched, skip_through),
                Unpacked::Corrupt(why) => {
                    found.corrupt += 1;
                    tracing::debug!(stream = %self.stream, shard_id = %self.shard, sequence_number = %fetched.sequence, reason = %why, "record has the KPL magic but is not a valid aggregate; delivered as it is");
                    self.push_plain(&mut out, fetched, skip_through);
                }
                Unpacked::Aggregate(users) => {
                    found.user_records += users.len() as u64;
                    let last = users.len() - 1;
                    for (i, user) in users.into_iter().enumerate() {
                        let sub = i as u32;
                        let position = if i == last {
                            Position::whole(fetched.sequence.clone())
                        } else {
                            Position::within(fetched.sequence.clone(), sub)
                        };
                        if covered(skip_through, &position, sub) {
                            continue;
                        }
                        if self.hash_keys.is_some_and(|r| !r.contains(user.hash_key())) {
                            found.hash_key_mismatch += 1;
                        }
                        let record = Record {
                            window: None,
                            stream: self.stream.clone(),
                            shard: self.shard.clone(),
                            partition_key: PartitionKey::from(user.partition_key.as_str()),
                            sequence: fetched.sequence.clone(),
                            sub_sequence: Some(sub),
                            arrival_ms: fetched.arrival_ms,
                            data: user.data,
                        };
                        out.push((record, position));
                    }
                }
            }
        }
        out
    }

    fn push_plain(
        &self,
        out: &mut Vec<(Record, Position)>,
        fetched: Fetched,
        skip_through: Option<&Position>,
    ) {
        let position = Position::whole(fetched.sequence.clone());
        if covered(skip_through, &position, 0) {
            return;
        }
        out.push((
            Record {
                window: None,
                stream: self.stream.clone(),
                shard: self.shard.clone(),
                partition_key: fetched.partition_key,
                sequence: fetched.sequence,
                sub_sequence: None,
                arrival_ms: fetched.arrival_ms,
                data: fetched.data,
            },
            position,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SequenceNumber;
    use crate::kpl::tests::aggregate;

    fn fetched(key: &str, seq: u64, data: Vec<u8>) -> Fetched {
        Fetched {
            partition_key: PartitionKey::from(key),
            sequence: SequenceNumber::parse(&seq.to_string()).unwrap(),
            arrival_ms: 7,
            data,
        }
    }

    fn summary(out: &[(Record, Position)]) -> Vec<(String, String, Option<u32>, String)> {
        out.iter()
            .map(|(r, p)| {
                (
                    r.partition_key.as_str().to_owned(),
                    String::from_utf8_lossy(&r.data).into_owned(),
                    r.sub_sequence,
                    p.to_string(),
                )
            })
            .collect()
    }

    fn row(
        key: &str,
        data: &str,
        sub: Option<u32>,
        position: &str,
    ) -> (String, String, Option<u32>, String) {
        (key.into(), data.into(), sub, position.into())
    }

    fn page() -> Vec<Fetched> {
        vec![
            fetched("plain-key", 10, b"p1".to_vec()),
            fetched(
                "container",
                11,
                aggregate(&[("a", None, b"u0"), ("b", None, b"u1"), ("a", None, b"u2")]),
            ),
            fetched("plain-key", 12, b"p2".to_vec()),
        ]
    }

    fn source<'a>(stream: &'a StreamName, shard: &'a ShardId) -> Source<'a> {
        Source {
            stream,
            shard,
            hash_keys: None,
        }
    }

    #[test]
    fn aggregates_become_user_records_with_their_own_keys_and_positions() {
        let (stream, shard) = (StreamName::from("s"), ShardId::from("shardId-0"));
        let mut found = Found::default();
        let out = source(&stream, &shard).unpack(page(), None, &mut found);
        assert_eq!(
            summary(&out),
            vec![
                row("plain-key", "p1", None, "10"),
                row("a", "u0", Some(0), "11:0"),
                row("b", "u1", Some(1), "11:1"),
                row("a", "u2", Some(2), "11"),
                row("plain-key", "p2", None, "12"),
            ]
        );
        assert!(
            out.iter()
                .all(|(r, _)| r.arrival_ms == 7 && r.shard == shard)
        );
        assert_eq!(
            found,
            Found {
                user_records: 3,
                ..Found::default()
            }
        );
    }

    #[test]
    fn resuming_inside_an_aggregate_skips_what_settled() {
        let (stream, shard) = (StreamName::from("s"), ShardId::from("shardId-0"));
        let skip = Position::parse("11:0").unwrap();
        let out = source(&stream, &shard).unpack(page(), Some(&skip), &mut Found::default());
        assert_eq!(
            summary(&out),
            vec![
                row("b", "u1", Some(1), "11:1"),
                row("a", "u2", Some(2), "11"),
                row("plain-key", "p2", None, "12"),
            ]
        );
    }

    #[test]
    fn a_kcl_checkpoint_at_the_last_index_covers_the_whole_aggregate() {
        let (stream, shard) = (StreamName::from("s"), ShardId::from("shardId-0"));
        let skip = Position::parse("11:2").unwrap();
        let out = source(&stream, &shard).unpack(page(), Some(&skip), &mut Found::default());
        assert_eq!(summary(&out), vec![row("plain-key", "p2", None, "12")]);
    }

    #[test]
    fn a_kcl_checkpoint_at_index_0_covers_a_plain_record() {
        let (stream, shard) = (StreamName::from("s"), ShardId::from("shardId-0"));
        let skip = Position::parse("10:0").unwrap();
        let out = source(&stream, &shard).unpack(page(), Some(&skip), &mut Found::default());
        assert_eq!(
            summary(&out)[0],
            row("a", "u0", Some(0), "11:0"),
            "record 10 is covered"
        );
        let skip = Position::parse("11:0").unwrap();
        let out = source(&stream, &shard).unpack(page(), Some(&skip), &mut Found::default());
        assert_eq!(
            summary(&out)[0],
            row("b", "u1", Some(1), "11:1"),
            "inside an aggregate: index 0 only"
        );
    }

    #[test]
    fn corrupt_aggregates_are_delivered_raw_and_counted() {
        let (stream, shard) = (StreamName::from("s"), ShardId::from("shardId-0"));
        let mut blob = aggregate(&[("a", None, b"u0")]);
        let last = blob.len() - 1;
        blob[last] ^= 0xff;
        let mut found = Found::default();
        let out = source(&stream, &shard).unpack(
            vec![fetched("container", 5, blob.clone())],
            None,
            &mut found,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0.data, blob);
        assert_eq!(out[0].0.partition_key.as_str(), "container");
        assert_eq!(out[0].0.sub_sequence, None);
        assert_eq!(found.corrupt, 1);
    }

    #[test]
    fn user_records_outside_the_shard_are_delivered_and_counted() {
        let (stream, shard) = (StreamName::from("s"), ShardId::from("shardId-0"));
        let source = Source {
            stream: &stream,
            shard: &shard,
            hash_keys: Some(HashKeyRange { start: 0, end: 100 }),
        };
        let blob = aggregate(&[("a", Some("50"), b"in"), ("b", Some("101"), b"out")]);
        let mut found = Found::default();
        let out = source.unpack(vec![fetched("c", 5, blob)], None, &mut found);
        assert_eq!(
            out.len(),
            2,
            "a user record outside the shard is not dropped"
        );
        assert_eq!(found.hash_key_mismatch, 1);
    }
}
