//! Newtypes for the names and numbers that flow through the pipeline.
//!
//! Every stage talks about shards, sequence numbers, partition keys and
//! subscriptions; giving each its own type keeps a shard id from being passed
//! where a stream name belongs, and gives [`SequenceNumber`] the one ordering
//! that is correct for Kinesis (and [`Position`] the one that also orders the
//! user records of a KPL aggregate).
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

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
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A plugin's sha256 digest (`sha256:` and 64 hex digits): how every version
/// of a plugin is known.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct PluginDigest(Arc<str>);

/// Why a text is not a plugin digest.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a plugin digest: expected sha256: and 64 lowercase hex digits")]
pub struct PluginDigestError(String);

impl TryFrom<String> for PluginDigest {
    type Error = PluginDigestError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<PluginDigest> for String {
    fn from(digest: PluginDigest) -> Self {
        digest.0.to_string()
    }
}

impl PluginDigest {
    /// Reads a digest as [`fmt::Display`] writes it.
    ///
    /// # Errors
    /// Anything but `sha256:` and 64 lowercase hex digits.
    pub fn parse(value: &str) -> Result<Self, PluginDigestError> {
        match value.strip_prefix("sha256:") {
            Some(hex)
                if hex.len() == 64
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
            {
                Ok(Self(value.into()))
            }
            _ => Err(PluginDigestError(value.to_owned())),
        }
    }

    /// The 64 hex digits alone (the name of the blob in an artifact store).
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

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

/// A filter's sha256 digest (`sha256:` and 64 hex digits, over the
/// canonical text of its patterns: see `crate::filter::FilterText`): how
/// the filter of a version is known in the fleet's versions, their history
/// and the `filter` label of `shardlane_records_filtered_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct FilterDigest(PluginDigest);

impl FilterDigest {
    /// The digest of a filter's canonical text.
    pub fn of(text: &[u8]) -> Self {
        Self(PluginDigest::of(text))
    }

    /// `sha256:` and the first 12 hex digits.
    pub fn short(&self) -> &str {
        self.0.short()
    }
}

impl fmt::Display for FilterDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
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

impl StreamName {
    /// Whether the stream is named by its ARN
    /// (`arn:aws:kinesis:REGION:ACCOUNT:stream/NAME`) rather than its name.
    pub fn is_arn(&self) -> bool {
        self.0.starts_with("arn:")
    }

    /// The `StreamName` parameter of a Kinesis call: the name, unless the
    /// stream is named by ARN.
    pub fn api_name(&self) -> Option<String> {
        (!self.is_arn()).then(|| self.0.to_string())
    }

    /// The `StreamARN` parameter of a Kinesis call: the ARN, when the
    /// stream is named by one (another account's stream, say).
    pub fn api_arn(&self) -> Option<String> {
        self.is_arn().then(|| self.0.to_string())
    }

    /// The parts of a stream ARN; `None` for a name or an ARN of another
    /// shape.
    pub fn arn_parts(&self) -> Option<StreamArnParts<'_>> {
        let rest = self.0.strip_prefix("arn:")?;
        let mut parts = rest.splitn(5, ':');
        let (_partition, service, region, account, resource) = (
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
        );
        let name = resource.strip_prefix("stream/")?;
        let valid = service == "kinesis"
            && !region.is_empty()
            && account.len() == 12
            && account.bytes().all(|b| b.is_ascii_digit())
            && !name.is_empty()
            && !name.contains('/');
        valid.then_some(StreamArnParts {
            region,
            account,
            name,
        })
    }
}

/// What a stream ARN (`arn:aws:kinesis:REGION:ACCOUNT:stream/NAME`) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamArnParts<'a> {
    /// The region.
    pub region: &'a str,
    /// The 12-digit account id.
    pub account: &'a str,
    /// The stream's name.
    pub name: &'a str,
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

/// Where a record stands in its shard, down to one user record of a Kinesis
/// Producer Library aggregate (KCL's "extended sequence number").
///
/// A plain Kinesis record is one position, [`Position::whole`]. An
/// aggregate is one Kinesis record (one sequence number) that carries many
/// user records; the user record at index `i` has position
/// [`Position::within`]`(seq, i)`, except the last one, whose position is
/// the whole record: once it is done, so is the aggregate. So a checkpoint
/// at a whole position always means "read after this sequence number", and
/// one within an aggregate means "read at this sequence number and skip the
/// user records up to this index".
///
/// Ordered by sequence number, then by index, a whole record after every
/// index of it. The stored form is the sequence number, followed by
/// `:<index>` within an aggregate: `49590…618` or `49590…618:3`. A
/// checkpoint written before aggregates were understood is a bare sequence
/// number and reads as a whole position.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Position {
    sequence: SequenceNumber,
    sub: Option<u32>,
}

/// Why a string is not a stored [`Position`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PositionError {
    /// The sequence-number part.
    #[error(transparent)]
    Sequence(#[from] SequenceNumberError),
    /// The part after `:`.
    #[error("the index after ':' in a position is a number from 0 to 4294967295: {0:?}")]
    Sub(String),
}

impl Position {
    /// The whole record at `sequence` (a plain record, or all of an
    /// aggregate).
    pub fn whole(sequence: SequenceNumber) -> Self {
        Self {
            sequence,
            sub: None,
        }
    }

    /// The user records `0..=sub` of the aggregate at `sequence`.
    pub fn within(sequence: SequenceNumber, sub: u32) -> Self {
        Self {
            sequence,
            sub: Some(sub),
        }
    }

    /// The Kinesis record's sequence number.
    pub fn sequence(&self) -> &SequenceNumber {
        &self.sequence
    }

    /// The index of the last user record covered within an aggregate;
    /// `None` for a whole record.
    pub fn sub(&self) -> Option<u32> {
        self.sub
    }

    /// Parses the stored form (type docs).
    ///
    /// # Errors
    /// When the sequence number or the index is not valid.
    pub fn parse(value: &str) -> Result<Self, PositionError> {
        match value.split_once(':') {
            None => Ok(Self::whole(SequenceNumber::parse(value)?)),
            Some((seq, sub)) => {
                let sub = sub
                    .parse::<u32>()
                    .map_err(|_| PositionError::Sub(sub.to_owned()))?;
                Ok(Self::within(SequenceNumber::parse(seq)?, sub))
            }
        }
    }
}

impl Ord for Position {
    fn cmp(&self, other: &Self) -> Ordering {
        // `None` (the whole record) after every index: map it to one past
        // the largest.
        let sub = |p: &Self| p.sub.map_or(u64::from(u32::MAX) + 1, u64::from);
        self.sequence
            .cmp(&other.sequence)
            .then_with(|| sub(self).cmp(&sub(other)))
    }
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.sub {
            None => write!(f, "{}", self.sequence),
            Some(sub) => write!(f, "{}:{sub}", self.sequence),
        }
    }
}

impl fmt::Debug for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
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
    fn streams_named_by_arn_use_the_arn_parameter() {
        let arn = StreamName::from("arn:aws:kinesis:eu-west-1:123456789012:stream/orders");
        assert_eq!(arn.api_name(), None);
        assert_eq!(arn.api_arn().as_deref(), Some(arn.as_str()));
        assert_eq!(
            arn.arn_parts(),
            Some(StreamArnParts {
                region: "eu-west-1",
                account: "123456789012",
                name: "orders"
            })
        );
        let name = StreamName::from("orders");
        assert_eq!(name.api_name().as_deref(), Some("orders"));
        assert_eq!(name.api_arn(), None);
        assert_eq!(name.arn_parts(), None);
        for bad in [
            "arn:aws:kinesis:eu-west-1:123:stream/orders",
            "arn:aws:sqs:eu-west-1:123456789012:stream/orders",
            "arn:aws:kinesis:eu-west-1:123456789012:table/orders",
            "arn:aws:kinesis::123456789012:stream/orders",
            "arn:aws:kinesis:eu-west-1:123456789012:stream/",
        ] {
            assert_eq!(StreamName::from(bad).arn_parts(), None, "{bad}");
        }
    }

    #[test]
    fn positions_order_user_records_before_their_whole_record() {
        let p = |s: &str| Position::parse(s).unwrap();
        assert!(p("5:0") < p("5:1"));
        assert!(p("5:4294967295") < p("5"));
        assert!(p("5") < p("6:0"));
        assert!(p("9:7") < p("10"));
    }

    #[test]
    fn positions_round_trip_through_their_stored_form() {
        for s in [
            "0",
            "49590338271490256608559692538361571095921575989136588898",
            "12:0",
            "12:4294967295",
        ] {
            assert_eq!(Position::parse(s).unwrap().to_string(), s);
        }
        // Checkpoints of before: a bare sequence number is a whole record.
        assert_eq!(Position::parse("77").unwrap(), Position::whole(seq("77")));
        assert!(matches!(Position::parse("12:"), Err(PositionError::Sub(_))));
        assert!(matches!(
            Position::parse("12:-1"),
            Err(PositionError::Sub(_))
        ));
        assert!(matches!(
            Position::parse("12:4294967296"),
            Err(PositionError::Sub(_))
        ));
        assert!(matches!(
            Position::parse(":3"),
            Err(PositionError::Sequence(_))
        ));
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
