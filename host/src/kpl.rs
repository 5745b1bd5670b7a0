//! KPL de-aggregation: takes the user records out of a Kinesis Producer
//! Library aggregate. Pure, no I/O; the shard reader calls [`unpack`] on
//! every record it reads, before anything is tracked or delivered.
//!
//! The format (KPL's `aggregation-format.md`): the 4 magic bytes
//! `F3 89 9A C2`, a protobuf `AggregatedRecord`, then the MD5 digest of
//! that protobuf. The message holds a table of partition keys, a table of
//! explicit hash keys, and the user records, each pointing into the tables
//! by index. The messages are declared by hand below with `prost`'s derive
//! (three small proto2 messages: a build-time `protoc` would add a tool to
//! every build for nothing).
//!
//! What comes out, and why:
//! - an aggregate whose digest checks and whose body decodes into at least
//!   one user record with valid table indices: [`Unpacked::Aggregate`], one
//!   [`UserRecord`] each, with **its own** partition key;
//! - anything with the magic that does not check (bad digest, undecodable
//!   body, an index past its table, no user records at all): delivered as
//!   the plain record it is, as KCL does, and reported as
//!   [`Unpacked::Corrupt`] so that the reader counts it;
//! - anything else: [`Unpacked::Plain`].
//!
//! A user record's hash key (its explicit hash key, or else the MD5 of its
//! partition key as a big-endian 128-bit number) decides which shard the
//! producer meant it for. KCL 2.x drops user records whose hash key is not
//! in the range of the shard being read; shardlane delivers them (they
//! exist nowhere else) and the reader counts them, using
//! [`UserRecord::hash_key`].
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use md5::{Digest as _, Md5};
use prost::Message as _;

/// The bytes every KPL aggregate starts with.
pub(crate) const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];
const DIGEST_LEN: usize = 16;

/// `AggregatedRecord` of KPL's `messages.proto`.
#[derive(Clone, PartialEq, prost::Message)]
struct AggregatedRecord {
    #[prost(string, repeated, tag = "1")]
    partition_key_table: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    explicit_hash_key_table: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    records: Vec<Record>,
}

/// `Record` of KPL's `messages.proto` (its `tags`, field 4, are skipped).
#[derive(Clone, PartialEq, prost::Message)]
struct Record {
    #[prost(uint64, required, tag = "1")]
    partition_key_index: u64,
    #[prost(uint64, optional, tag = "2")]
    explicit_hash_key_index: Option<u64>,
    #[prost(bytes = "vec", required, tag = "3")]
    data: Vec<u8>,
}

/// One user record out of an aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserRecord {
    /// The partition key the producer gave this user record.
    pub partition_key: String,
    /// Its explicit hash key, when the producer set one.
    pub explicit_hash_key: Option<u128>,
    /// The payload.
    pub data: Vec<u8>,
}

impl UserRecord {
    /// The hash key that places the record on a shard: the explicit one,
    /// or the MD5 of the partition key as a big-endian number.
    pub(crate) fn hash_key(&self) -> u128 {
        self.explicit_hash_key
            .unwrap_or_else(|| partition_key_hash(&self.partition_key))
    }
}

/// The hash key Kinesis derives from a partition key: the MD5 of its UTF-8
/// bytes, read as a big-endian unsigned 128-bit number.
pub(crate) fn partition_key_hash(partition_key: &str) -> u128 {
    u128::from_be_bytes(Md5::digest(partition_key.as_bytes()).into())
}

/// Why a blob with the magic bytes is not a usable aggregate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Corrupt {
    /// Shorter than the magic and a digest.
    #[error("too short for an aggregate")]
    TooShort,
    /// The trailing MD5 does not match the body.
    #[error("its MD5 digest does not match")]
    Digest,
    /// The body is not an `AggregatedRecord`.
    #[error("its body does not decode: {0}")]
    Decode(String),
    /// A user record points past a table.
    #[error("user record {record} points past the {table} table")]
    Index {
        /// The user record's index.
        record: usize,
        /// Which table.
        table: &'static str,
    },
    /// An explicit hash key that is not a 128-bit decimal number.
    #[error("explicit hash key {0:?} is not a 128-bit number")]
    HashKey(String),
    /// No user records at all (the KPL never writes one).
    #[error("it holds no user records")]
    Empty,
}

/// What a record read from Kinesis turned out to be (module docs).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unpacked {
    /// Not an aggregate.
    Plain,
    /// An aggregate's user records, in order (index = sub-sequence number).
    Aggregate(Vec<UserRecord>),
    /// Had the magic but is not a valid aggregate: deliver it as it is.
    Corrupt(Corrupt),
}

/// Looks at `data` (module docs).
pub(crate) fn unpack(data: &[u8]) -> Unpacked {
    if !data.starts_with(&MAGIC) {
        return Unpacked::Plain;
    }
    match decode(data) {
        Ok(records) => Unpacked::Aggregate(records),
        Err(e) => Unpacked::Corrupt(e),
    }
}

fn decode(data: &[u8]) -> Result<Vec<UserRecord>, Corrupt> {
    if data.len() < MAGIC.len() + DIGEST_LEN {
        return Err(Corrupt::TooShort);
    }
    let (body, digest) = data[MAGIC.len()..].split_at(data.len() - MAGIC.len() - DIGEST_LEN);
    if Md5::digest(body).as_slice() != digest {
        return Err(Corrupt::Digest);
    }
    let aggregate = AggregatedRecord::decode(body).map_err(|e| Corrupt::Decode(e.to_string()))?;
    if aggregate.records.is_empty() {
        return Err(Corrupt::Empty);
    }
    let hash_keys = aggregate
        .explicit_hash_key_table
        .iter()
        .map(|k| k.parse::<u128>().map_err(|_| Corrupt::HashKey(k.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let keys = aggregate.partition_key_table;
    aggregate
        .records
        .into_iter()
        .enumerate()
        .map(|(record, r)| {
            let index = |i: u64, len: usize, table| {
                usize::try_from(i)
                    .ok()
                    .filter(|&i| i < len)
                    .ok_or(Corrupt::Index { record, table })
            };
            let key = index(r.partition_key_index, keys.len(), "partition key")?;
            let explicit_hash_key = r
                .explicit_hash_key_index
                .map(|i| index(i, hash_keys.len(), "explicit hash key").map(|i| hash_keys[i]))
                .transpose()?;
            Ok(UserRecord {
                partition_key: keys[key].clone(),
                explicit_hash_key,
                data: r.data,
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds an aggregate the way the KPL does (tests here and in the
    /// reader).
    pub(crate) fn aggregate(records: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut message = AggregatedRecord::default();
        for (key, hash, data) in records {
            let partition_key_index = table_index(&mut message.partition_key_table, key);
            let explicit_hash_key_index =
                hash.map(|h| table_index(&mut message.explicit_hash_key_table, h));
            message.records.push(Record {
                partition_key_index,
                explicit_hash_key_index,
                data: data.to_vec(),
            });
        }
        seal(&message.encode_to_vec())
    }

    fn table_index(table: &mut Vec<String>, value: &str) -> u64 {
        let at = table.iter().position(|v| v == value).unwrap_or_else(|| {
            table.push(value.to_owned());
            table.len() - 1
        });
        at as u64
    }

    fn seal(body: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(body);
        out.extend_from_slice(&Md5::digest(body));
        out
    }

    fn user(key: &str, hash: Option<u128>, data: &[u8]) -> UserRecord {
        UserRecord {
            partition_key: key.to_owned(),
            explicit_hash_key: hash,
            data: data.to_vec(),
        }
    }

    #[test]
    fn plain_records_stay_plain() {
        assert_eq!(unpack(b""), Unpacked::Plain);
        assert_eq!(unpack(b"{\"amount\": 3}"), Unpacked::Plain);
        assert_eq!(unpack(&MAGIC[..3]), Unpacked::Plain);
    }

    #[test]
    fn an_aggregate_yields_its_user_records_with_their_own_keys() {
        let blob = aggregate(&[
            ("alice", None, b"one"),
            ("bob", Some("42"), b"two"),
            ("alice", None, b""),
        ]);
        assert_eq!(
            unpack(&blob),
            Unpacked::Aggregate(vec![
                user("alice", None, b"one"),
                user("bob", Some(42), b"two"),
                user("alice", None, b""),
            ])
        );
    }

    /// Bytes made by PyPI's `aws-kinesis-agg` 1.2.3 (`RecordAggregator`,
    /// user records ("k1", "a"), ("k2", "bc", explicit hash key "7")):
    /// the decoder reads what the real library writes, not only what the
    /// test helper above writes.
    #[test]
    fn reads_what_the_aws_library_writes() {
        let blob = hex(
            "f3899ac20a026b310a026b321201371a0508001a01611a08080110001a026263c8926bfaf4f298b6c193b48a9eab73c8",
        );
        assert_eq!(
            unpack(&blob),
            Unpacked::Aggregate(vec![user("k1", None, b"a"), user("k2", Some(7), b"bc")])
        );
    }

    #[test]
    fn a_bad_digest_or_body_is_corrupt() {
        let mut blob = aggregate(&[("k", None, b"data")]);
        let last = blob.len() - 1;
        blob[last] ^= 1;
        assert_eq!(unpack(&blob), Unpacked::Corrupt(Corrupt::Digest));

        assert_eq!(
            unpack(&seal(&[0xff, 0xff])),
            Unpacked::Corrupt(Corrupt::Decode(unpack_error(&[0xff, 0xff])))
        );
        assert_eq!(unpack(&MAGIC), Unpacked::Corrupt(Corrupt::TooShort));
        assert_eq!(unpack(&seal(&[])), Unpacked::Corrupt(Corrupt::Empty));
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn unpack_error(body: &[u8]) -> String {
        AggregatedRecord::decode(body).unwrap_err().to_string()
    }

    #[test]
    fn indices_past_a_table_are_corrupt() {
        let message = AggregatedRecord {
            partition_key_table: vec!["k".into()],
            explicit_hash_key_table: vec![],
            records: vec![Record {
                partition_key_index: 0,
                explicit_hash_key_index: Some(0),
                data: vec![],
            }],
        };
        assert_eq!(
            unpack(&seal(&message.encode_to_vec())),
            Unpacked::Corrupt(Corrupt::Index {
                record: 0,
                table: "explicit hash key"
            })
        );
        let message = AggregatedRecord {
            records: vec![Record {
                partition_key_index: 1,
                explicit_hash_key_index: None,
                data: vec![],
            }],
            ..message
        };
        assert!(matches!(
            unpack(&seal(&message.encode_to_vec())),
            Unpacked::Corrupt(Corrupt::Index {
                table: "partition key",
                ..
            })
        ));
    }

    #[test]
    fn hash_keys_follow_kinesis() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e.
        assert_eq!(partition_key_hash(""), 0xd41d8cd98f00b204e9800998ecf8427e);
        assert_eq!(user("", Some(5), b"").hash_key(), 5);
        assert_eq!(
            user("", None, b"").hash_key(),
            0xd41d8cd98f00b204e9800998ecf8427e
        );
    }
}
