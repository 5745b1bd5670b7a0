//! Newtypes for the names and numbers that flow through the pipeline.
//!
//! Every stage talks about shards, sequence numbers, partition keys and
//! subscriptions; giving each its own type keeps a shard id from being passed
//! where a stream name belongs, and gives [`SequenceNumber`] the one ordering
//! that is correct for Kinesis.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Wraps a value as it came from config or from AWS.
            pub fn new(value: impl Into<Arc<str>>) -> Self {
                Self(value.into())
            }

            /// The value as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::new(value)
            }
        }
    };
}

name_type!(
    /// The name of a Kinesis data stream.
    StreamName
);
name_type!(
    /// A shard's id within its stream, e.g. `shardId-000000000003`.
    ShardId
);
name_type!(
    /// The key a producer chose for a record; Kinesis keeps one key's records
    /// in order on one shard, and so do lanes.
    PartitionKey
);
name_type!(
    /// A subscription's name: the application name that keys its leases and
    /// checkpoints.
    SubscriptionName
);
name_type!(
    /// Who holds a lease: one per host process.
    OwnerId
);

impl PartitionKey {
    /// 64-bit FNV-1a of the key's UTF-8 bytes (offset basis
    /// `0xcbf29ce484222325`, prime `0x100000001b3`): the hash by_key lanes
    /// and canary slices are chosen by. Part of the product's contract: the
    /// same key hashes alike in every process and version, so a key's
    /// records never spread over two lanes. FNV-1a is tiny, has no seed
    /// (unlike std's `RandomState`), and spreads short keys well enough for
    /// lane counts in the tens.
    pub fn fnv1a_64(&self) -> u64 {
        fnv1a_64(self.as_str().as_bytes())
    }
}

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`.
fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    })
}

/// One taking of a shard's lease by this process, and the reader session
/// that reads it: offsets of settlement restart with each, and results,
/// tickets and checkpoint requests of an older session are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A plugin's sha256 digest (`sha256:` and 64 hex digits): how every version
/// of a plugin is known.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PluginDigest(Arc<str>);

impl PluginDigest {
    /// The digest of a component's bytes.
    pub fn of(bytes: &[u8]) -> Self {
        let hash = Sha256::digest(bytes);
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        Self(format!("sha256:{hex}").into())
    }

    /// `sha256:` and the first 12 hex digits: enough to tell versions apart
    /// in a log line.
    pub fn short(&self) -> &str {
        &self.0[..19]
    }
}

impl fmt::Display for PluginDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One lane of a subscription's dispatch stage (0-based): one handler
/// instance, one record or batch at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneId(pub u32);

impl fmt::Display for LaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A Kinesis sequence number: a decimal string of up to 129 digits.
///
/// Ordered numerically without ever parsing into a fixed-width integer: a
/// shorter string is smaller (Kinesis does not pad with leading zeros), and
/// strings of equal length compare digit by digit.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SequenceNumber(Arc<str>);

/// Why a string is not a sequence number.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SequenceNumberError {
    /// Nothing at all.
    #[error("a sequence number cannot be empty")]
    Empty,
    /// More than Kinesis ever hands out.
    #[error("a sequence number has at most 129 digits, this one has {0}")]
    TooLong(usize),
    /// Something other than decimal digits.
    #[error("a sequence number is made of decimal digits only: {0:?}")]
    NotDigits(String),
}

impl SequenceNumber {
    /// The longest sequence number Kinesis hands out, in digits.
    pub const MAX_DIGITS: usize = 129;

    /// Parses a sequence number as Kinesis returns it.
    ///
    /// # Errors
    /// When `value` is empty, longer than [`Self::MAX_DIGITS`], or holds
    /// anything but ASCII digits.
    pub fn parse(value: &str) -> Result<Self, SequenceNumberError> {
        if value.is_empty() {
            return Err(SequenceNumberError::Empty);
        }
        if value.len() > Self::MAX_DIGITS {
            return Err(SequenceNumberError::TooLong(value.len()));
        }
        if !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(SequenceNumberError::NotDigits(value.to_owned()));
        }
        // Leading zeros would break the length-first ordering; Kinesis never
        // sends them, so normalise rather than reject.
        let trimmed = value.trim_start_matches('0');
        let canonical = if trimmed.is_empty() { "0" } else { trimmed };
        Ok(Self(canonical.into()))
    }

    /// The number as the decimal string Kinesis uses.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.as_bytes().cmp(other.0.as_bytes()))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap()
    }

    #[test]
    fn matches_published_fnv1a_vectors() {
        // From the FNV reference test suite.
        assert_eq!(fnv1a_64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x85944171f73967e8);
        assert_eq!(PartitionKey::from("foobar").fnv1a_64(), 0x85944171f73967e8);
    }

    #[test]
    fn shorter_is_smaller_whatever_the_digits() {
        assert!(seq("9") < seq("10"));
        assert!(seq("99999999999999999999") < seq("100000000000000000000"));
    }

    #[test]
    fn equal_length_compares_digit_by_digit() {
        let a = "49590338271490256608559692538361571095921575989136588898";
        let b = "49590338271490256608559692540925702759324208523137515618";
        assert!(seq(a) < seq(b));
        assert_eq!(seq(a), seq(a));
    }

    #[test]
    fn beyond_u128_still_ordered() {
        let big = "1".repeat(129);
        let bigger = format!("2{}", "0".repeat(128));
        assert!(seq(&big) < seq(&bigger));
    }

    #[test]
    fn leading_zeros_are_normalised() {
        assert_eq!(seq("007"), seq("7"));
        assert!(seq("0009") < seq("10"));
        assert_eq!(seq("000").as_str(), "0");
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(SequenceNumber::parse(""), Err(SequenceNumberError::Empty));
        assert_eq!(
            SequenceNumber::parse(&"1".repeat(130)),
            Err(SequenceNumberError::TooLong(130))
        );
        assert!(matches!(
            SequenceNumber::parse("12a"),
            Err(SequenceNumberError::NotDigits(_))
        ));
        assert!(matches!(
            SequenceNumber::parse("-1"),
            Err(SequenceNumberError::NotDigits(_))
        ));
    }

    proptest! {
        /// Against a big-integer reference: u128 covers up to 38 digits, and
        /// the ordering must agree with it everywhere in that range.
        #[test]
        fn agrees_with_integers(a in any::<u128>(), b in any::<u128>()) {
            prop_assert_eq!(seq(&a.to_string()).cmp(&seq(&b.to_string())), a.cmp(&b));
        }

        /// Long numbers: compare as numbers via zero-padding to equal width.
        #[test]
        fn agrees_with_padded_comparison(a in "[1-9][0-9]{0,128}", b in "[1-9][0-9]{0,128}") {
            let width = a.len().max(b.len());
            let pa = format!("{a:0>width$}");
            let pb = format!("{b:0>width$}");
            prop_assert_eq!(seq(&a).cmp(&seq(&b)), pa.cmp(&pb));
        }
    }
}
