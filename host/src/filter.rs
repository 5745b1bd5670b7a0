//! Event filters: Lambda's `FilterCriteria` for Kinesis, evaluated by the
//! host before anything else sees a record.
//!
//! A subscription's `filter` is a list of up to five patterns, each a JSON
//! string in the syntax of Lambda's event filtering (EventBridge's event
//! patterns). A record is delivered when it matches **any** pattern; one
//! that matches none is settled at once by its reader (the checkpoint
//! passes it), counted in `shardlane_records_filtered_total`, and never
//! reaches the channel, a lane, the guest or a dead-letter stream.
//!
//! # What a pattern sees
//! A record is the JSON object Lambda's Kinesis event carries, by Lambda's
//! names: `partitionKey`, `sequenceNumber`, `approximateArrivalTimestamp`
//! (seconds since the epoch, with milliseconds, as Lambda gives it),
//! `kinesisSchemaVersion` (`"1.0"`), and `data` — the record's bytes parsed
//! as JSON when they are JSON. A pattern with any rule under `data` does
//! not match a record whose data is not JSON (Lambda drops those too).
//!
//! # The rules (Lambda's, case by case in the tests)
//! - A pattern is an object; its keys are fields, all of which must match
//!   (and). A key's value is an object (a nested field) or a non-empty
//!   array of matchers, any of which may match (or). `"$or": [p, q, …]`
//!   beside the fields matches when any of its alternatives does.
//! - Matchers: a JSON value — a string, number, `true`/`false` or `null` —
//!   matches that exact value (numbers by value: `5` matches `5.0`; a
//!   number never matches a string, so `"5"` does not match `5`);
//!   `{"prefix": s}`, `{"suffix": s}` (each also with
//!   `{"equals-ignore-case": s}` inside); `{"equals-ignore-case": s}`;
//!   `{"wildcard": s}` (`*` any run of characters, `\*` a star, `\\` a
//!   backslash; `**` is refused); `{"numeric": [op, n]}` or `[op, n, op,
//!   m]` with `<`, `<=`, `=`, `>`, `>=` (a range: a lower bound then an
//!   upper one), numbers only; `{"exists": true|false}`; `{"anything-but":
//!   v}` with a value, a list of strings or of numbers, or `{"prefix": s}`,
//!   `{"suffix": s}`, `{"equals-ignore-case": s | [s…]}`, `{"wildcard": s
//!   | [s…]}`.
//! - A field that is missing matches only `{"exists": false}`;
//!   `anything-but` never matches a missing field. `exists: true` matches a
//!   field holding a value that is not an object (null included).
//! - A field holding an array matches when any of its elements does;
//!   nested fields are looked up through arrays of objects the same way.
//! - String matchers match strings only; `numeric` and number values match
//!   numbers only. Case-insensitive comparison lower-cases both sides.
//!
//! # Limits and errors
//! At most five patterns of at most 4096 bytes each, nested at most 32
//! deep (Lambda's limits: five filters, 4096-character patterns). A pattern
//! that breaks a rule is refused at start-up (and by `shardlane validate`)
//! with one line naming the pattern by its place in the list and the fault.
//!
//! # Why by hand
//! No well-kept Rust crate implements these patterns: the crates.io ports
//! of EventBridge's matchers (`quamina` 0.7, `event-ruler` 0.1) are early
//! and their operator coverage is not documented against Lambda's. The
//! matcher here is a direct reading of the rules above, a tree walk per
//! pattern (patterns are small and few; a record is parsed once), checked
//! by a table of cases taken from Lambda's and EventBridge's documentation.
//!
//! The module holds the pattern tree and the matcher; `parse` turns a
//! pattern's text into the tree, `pick` parses a record's data only as far
//! as the patterns look.
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::FilterDigest;

/// Lambda's limits.
const MAX_PATTERNS: usize = 5;
const MAX_PATTERN_BYTES: usize = 4096;
const MAX_DEPTH: usize = 32;

/// A filter as a version carries it: its patterns' canonical text (each
/// re-written as compact JSON with its keys in order, so the same patterns
/// written two ways are one filter) and the digest of that text. The
/// fleet's versions keep it (see `crate::fleet_versions`); every instance
/// compiles it with [`FilterText::compile`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterText {
    /// The digest of the patterns' canonical text.
    pub digest: FilterDigest,
    /// The patterns, canonical.
    pub patterns: Vec<String>,
}

impl FilterText {
    /// The filter these patterns make.
    ///
    /// # Errors
    /// As [`Filter::parse`] (a text kept by another release may break a
    /// rule of this one).
    pub fn compile(&self) -> Result<Filter, FilterError> {
        Filter::parse(&self.patterns)
    }
}

/// The patterns of a filter as JSON: Lambda's `FilterCriteria`
/// (`{"Filters": [{"Pattern": "<JSON text>"}, …]}`, as `aws lambda` takes
/// it), or a list of patterns (each an object, or its text). What
/// `shardlane deploy --filter` reads from its file and the admin API's
/// `PUT …/filter` from its body; an empty list is no filter.
///
/// # Errors
/// Not JSON, or neither shape (one line).
pub(crate) fn criteria_patterns(bytes: &[u8]) -> Result<Vec<String>, String> {
    const SHAPE: &str = r#"expected Lambda's FilterCriteria ({"Filters": [{"Pattern": "…"}]}) or a list of patterns"#;
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let items: Vec<&Value> = match &value {
        Value::Array(items) => items.iter().collect(),
        Value::Object(map) => match map.get("Filters") {
            Some(Value::Array(filters)) => filters
                .iter()
                .map(|f| {
                    f.get("Pattern")
                        .ok_or_else(|| format!(r#"a filter without "Pattern": {SHAPE}"#))
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(SHAPE.to_owned()),
        },
        _ => return Err(SHAPE.to_owned()),
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::String(text) => Ok(text.clone()),
            Value::Object(_) => Ok(item.to_string()),
            other => Err(format!(
                "a pattern is an object or its JSON text, not {other}"
            )),
        })
        .collect()
}

/// How a filter that may be missing is named in reports and logs: its
/// digest, or `none`.
pub(crate) fn filter_name(digest: Option<&FilterDigest>) -> String {
    digest.map_or_else(|| "none".to_owned(), ToString::to_string)
}

/// The filter a [`criteria_patterns`] JSON makes, checked as at start-up;
/// `None` for an empty list (no filter).
///
/// # Errors
/// Not one of the two shapes, or a pattern that breaks a rule (one line
/// naming it).
pub(crate) fn criteria_filter(bytes: &[u8]) -> Result<Option<FilterText>, String> {
    let patterns = criteria_patterns(bytes)?;
    if patterns.is_empty() {
        return Ok(None);
    }
    let filter = Filter::parse(&patterns).map_err(|e| e.to_string())?;
    Ok(Some(filter.text))
}

/// A subscription's filter: the patterns, any of which lets a record in.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    /// Its canonical text and digest.
    text: FilterText,
    patterns: Vec<Pattern>,
    /// What of `data` some pattern looks at (`None`: nothing, so it is
    /// never parsed).
    data_shape: Option<Shape>,
}

/// One pattern, and whether it has a rule on `data` (such a pattern never
/// matches a record whose data is not JSON), decided once at parse.
#[derive(Debug, Clone, PartialEq)]
struct Pattern {
    object: Object,
    reads_data: bool,
}

/// Why a pattern is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilterError {
    /// More patterns than Lambda allows.
    #[error("{0} patterns: at most {MAX_PATTERNS}")]
    TooMany(usize),
    /// One pattern is wrong.
    #[error("pattern {index}: {fault}")]
    Pattern {
        /// Its place in the list, from 1.
        index: usize,
        /// What is wrong, naming the field.
        fault: String,
    },
}

/// One level of a pattern: fields that must all match, and `$or` groups
/// of which one alternative must.
#[derive(Debug, Clone, PartialEq)]
struct Object {
    fields: Vec<(String, Field)>,
    ors: Vec<Vec<Object>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Field {
    Nested(Object),
    Leaf(Vec<Matcher>),
}

#[derive(Debug, Clone, PartialEq)]
enum Matcher {
    Exact(Value),
    Prefix(String, Case),
    Suffix(String, Case),
    EqualsIgnoreCase(String),
    Wildcard(Wildcard),
    Numeric(Vec<(Op, f64)>),
    Exists(bool),
    AnythingBut(AnythingBut),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Exact,
    Ignore,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Lt,
    Le,
    Eq,
    Gt,
    Ge,
}

#[derive(Debug, Clone, PartialEq)]
enum AnythingBut {
    Values(Vec<Value>),
    Prefix(String),
    Suffix(String),
    IgnoreCase(Vec<String>),
    Wildcard(Vec<Wildcard>),
}

/// A wildcard pattern as literal pieces between stars.
#[derive(Debug, Clone, PartialEq)]
struct Wildcard {
    pieces: Vec<String>,
}

impl Filter {
    /// Parses `patterns` (JSON strings).
    ///
    /// # Errors
    /// [`FilterError`] naming the first pattern that breaks a rule.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Self, FilterError> {
        if patterns.len() > MAX_PATTERNS {
            return Err(FilterError::TooMany(patterns.len()));
        }
        let mut parsed = Vec::with_capacity(patterns.len());
        let mut canonical = Vec::with_capacity(patterns.len());
        for (i, text) in patterns.iter().enumerate() {
            let fault = |fault: String| FilterError::Pattern {
                index: i + 1,
                fault,
            };
            let text = text.as_ref();
            if text.len() > MAX_PATTERN_BYTES {
                return Err(fault(format!(
                    "{} bytes: at most {MAX_PATTERN_BYTES}",
                    text.len()
                )));
            }
            let value: Value =
                serde_json::from_str(text).map_err(|e| fault(format!("not JSON: {e}")))?;
            parsed.push(object(&value, "", 0).map_err(fault)?);
            canonical.push(value.to_string());
        }
        let mut top = Shape::default();
        for pattern in &parsed {
            top.add(pattern);
        }
        let whole = serde_json::to_vec(&canonical).unwrap_or_default();
        Ok(Self {
            text: FilterText {
                digest: FilterDigest::of(&whole),
                patterns: canonical,
            },
            patterns: parsed
                .into_iter()
                .map(|object| Pattern {
                    reads_data: object.names("data"),
                    object,
                })
                .collect(),
            data_shape: top.fields.remove("data"),
        })
    }

    /// Its canonical text and digest.
    pub fn text(&self) -> &FilterText {
        &self.text
    }

    /// Its digest.
    pub fn digest(&self) -> &FilterDigest {
        &self.text.digest
    }

    /// Whether the record lets in: `data` is parsed only when some pattern
    /// looks at it.
    pub fn admits(&self, record: &RecordView<'_>) -> bool {
        if self.patterns.is_empty() {
            return true;
        }
        let data = self.data_shape.as_ref().and_then(|shape| {
            let mut json = serde_json::Deserializer::from_slice(record.data);
            let value = serde::de::DeserializeSeed::deserialize(Pick(shape), &mut json).ok()?;
            json.end().ok()?;
            Some(value)
        });
        let field = |name: &str| top_field(record, data.as_ref(), name);
        self.patterns
            .iter()
            .any(|p| (data.is_some() || !p.reads_data) && matches_object(&p.object, &field))
    }
}

/// What a filter looks at in a record.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    /// The partition key.
    pub partition_key: &'a str,
    /// The sequence number.
    pub sequence_number: &'a str,
    /// When Kinesis took it, in milliseconds since the epoch.
    pub approximate_arrival_ms: u64,
    /// Its bytes.
    pub data: &'a [u8],
}

/// A record's top-level field, by Lambda's names; `data` is the record's
/// data as parsed (when it is JSON and some pattern reads it).
fn top_field<'v>(
    record: &RecordView<'_>,
    data: Option<&'v Value>,
    name: &str,
) -> Option<Cow<'v, Value>> {
    Some(match name {
        "partitionKey" => Cow::Owned(Value::from(record.partition_key)),
        "sequenceNumber" => Cow::Owned(Value::from(record.sequence_number)),
        #[allow(clippy::cast_precision_loss)]
        "approximateArrivalTimestamp" => {
            Cow::Owned(Value::from(record.approximate_arrival_ms as f64 / 1000.0))
        }
        "kinesisSchemaVersion" => Cow::Owned(Value::from("1.0")),
        "data" => Cow::Borrowed(data?),
        _ => return None,
    })
}

impl Object {
    /// Whether this level (or an `$or` alternative) names `field`.
    fn names(&self, field: &str) -> bool {
        self.fields.iter().any(|(n, _)| n == field)
            || self.ors.iter().flatten().any(|alt| alt.names(field))
    }
}

fn matches_field(value: Option<&Value>, field: &Field) -> bool {
    match field {
        Field::Leaf(matchers) => matchers.iter().any(|m| matches_leaf(value, m)),
        Field::Nested(object) => match value {
            Some(Value::Object(map)) => {
                matches_object(object, &|name: &str| map.get(name).map(Cow::Borrowed))
            }
            Some(Value::Array(items)) => items.iter().any(|item| matches_field(Some(item), field)),
            // A missing (or non-object) parent: only `exists: false` rules
            // below it can match.
            _ => matches_object(object, &|_: &str| None),
        },
    }
}

/// Whether `object` matches where `field` finds each field's value
/// (`None`: missing): its fields all, and one alternative of each `$or`.
fn matches_object<'v, F>(object: &Object, field: &F) -> bool
where
    F: Fn(&str) -> Option<Cow<'v, Value>>,
{
    object
        .fields
        .iter()
        .all(|(name, rule)| matches_field(field(name).as_deref(), rule))
        && object
            .ors
            .iter()
            .all(|alts| alts.iter().any(|alt| matches_object(alt, field)))
}

fn matches_leaf(value: Option<&Value>, matcher: &Matcher) -> bool {
    match (matcher, value) {
        (Matcher::Exists(wanted), v) => *wanted == exists(v),
        (_, None) => false,
        (_, Some(Value::Array(items))) => items.iter().any(|i| matches_one(i, matcher)),
        (_, Some(v)) => matches_one(v, matcher),
    }
}

fn exists(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Object(_)) => false,
        Some(Value::Array(items)) => !items.is_empty(),
        Some(_) => true,
    }
}

/// One value (not an array) against one matcher.
fn matches_one(value: &Value, matcher: &Matcher) -> bool {
    match matcher {
        Matcher::Exact(wanted) => same(value, wanted),
        Matcher::Prefix(p, case) => value.as_str().is_some_and(|s| case.fold(s).starts_with(p)),
        Matcher::Suffix(p, case) => value.as_str().is_some_and(|s| case.fold(s).ends_with(p)),
        Matcher::EqualsIgnoreCase(w) => value.as_str().is_some_and(|s| s.to_lowercase() == *w),
        Matcher::Wildcard(w) => value.as_str().is_some_and(|s| w.matches(s)),
        Matcher::Numeric(bounds) => value
            .as_f64()
            .is_some_and(|n| bounds.iter().all(|(op, b)| op.holds(n, *b))),
        Matcher::Exists(_) => unreachable!("exists is decided before"),
        Matcher::AnythingBut(but) => !but.excludes(value),
    }
}

/// Exact equality, numbers by value.
fn same(value: &Value, wanted: &Value) -> bool {
    match (value, wanted) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

impl Case {
    fn fold(self, s: &str) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Exact => s.into(),
            Self::Ignore => s.to_lowercase().into(),
        }
    }
}

impl Op {
    fn holds(self, n: f64, bound: f64) -> bool {
        match self {
            Self::Lt => n < bound,
            Self::Le => n <= bound,
            #[allow(clippy::float_cmp)]
            Self::Eq => n == bound,
            Self::Gt => n > bound,
            Self::Ge => n >= bound,
        }
    }
}

impl AnythingBut {
    /// Whether `value` is one of what is excluded.
    fn excludes(&self, value: &Value) -> bool {
        match self {
            Self::Values(values) => values.iter().any(|v| same(value, v)),
            Self::Prefix(p) => value.as_str().is_some_and(|s| s.starts_with(p.as_str())),
            Self::Suffix(p) => value.as_str().is_some_and(|s| s.ends_with(p.as_str())),
            Self::IgnoreCase(values) => value
                .as_str()
                .is_some_and(|s| values.contains(&s.to_lowercase())),
            Self::Wildcard(patterns) => value
                .as_str()
                .is_some_and(|s| patterns.iter().any(|w| w.matches(s))),
        }
    }
}

impl Wildcard {
    fn parse(pattern: &str) -> Result<Self, String> {
        let mut pieces = vec![String::new()];
        let mut chars = pattern.chars();
        let mut last_star = false;
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(e @ ('*' | '\\')) => {
                        pieces.last_mut().unwrap_or_else(|| unreachable!()).push(e);
                    }
                    _ => {
                        return Err(format!(
                            "wildcard {pattern:?}: `\\` escapes only `*` or `\\`"
                        ));
                    }
                },
                '*' if last_star => {
                    return Err(format!(
                        "wildcard {pattern:?}: consecutive `*` are not allowed"
                    ));
                }
                '*' => pieces.push(String::new()),
                c => pieces.last_mut().unwrap_or_else(|| unreachable!()).push(c),
            }
            last_star = c == '*';
        }
        Ok(Self { pieces })
    }

    /// Whether `s` is the pieces with anything between them.
    fn matches(&self, s: &str) -> bool {
        let [first, middle @ .., last] = self.pieces.as_slice() else {
            // One piece: no star.
            return self.pieces.first().is_some_and(|p| p == s);
        };
        let Some(mut rest) = s.strip_prefix(first.as_str()) else {
            return false;
        };
        for piece in middle {
            match rest.find(piece.as_str()) {
                Some(at) => rest = &rest[at + piece.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last.as_str())
    }
}

mod parse;
mod pick;
#[cfg(test)]
mod tests;

use parse::object;
use pick::{Pick, Shape};
