//! A key's state and its stored form: the named values under one
//! partition key, encoded as one protobuf message (`prost` derive, as for
//! KPL aggregates) so that every store keeps a key's state as one value —
//! one redb entry, one DynamoDB item — written whole by a commit.
//!
//! ```proto
//! message KeyState { repeated Value values = 1; }
//! message Value { string name = 1; bytes data = 2; optional uint64 expires_ms = 3; }
//! ```
//!
//! `expires_ms` (milliseconds since the Unix epoch) is set when the
//! subscription has a `state.ttl`; an expired value reads as absent and is
//! dropped at the key's next write.

use std::collections::BTreeMap;

use prost::Message as _;

/// One named value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    /// The bytes the guest set.
    pub data: Vec<u8>,
    /// When it expires (ms since the Unix epoch), with a `state.ttl`.
    pub expires_ms: Option<u64>,
}

impl Value {
    /// True when it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_ms.is_some_and(|at| at <= now_ms)
    }
}

/// Every named value under one partition key, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyState {
    values: BTreeMap<String, Value>,
    /// What `max_per_key` bounds: names and data, plus
    /// [`VALUE_OVERHEAD`] per value.
    bytes: usize,
}

/// A stored state that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("stored state does not decode: {0}")]
pub struct DecodeError(String);

#[derive(Clone, PartialEq, prost::Message)]
struct StoredKeyState {
    #[prost(message, repeated, tag = "1")]
    values: Vec<StoredValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredValue {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(bytes = "vec", tag = "2")]
    data: Vec<u8>,
    #[prost(uint64, optional, tag = "3")]
    expires_ms: Option<u64>,
}

/// Bytes counted per value on top of its name and data: at least what the
/// stored form adds (protobuf tags and lengths, the expiry), so a key's
/// stored state is never larger than its count.
pub(crate) const VALUE_OVERHEAD: usize = 24;

fn weight(name: &str, value: &Value) -> usize {
    name.len() + value.data.len() + VALUE_OVERHEAD
}

impl KeyState {
    /// The value `name`, unless it is absent or expired at `now_ms`.
    pub fn get(&self, name: &str, now_ms: u64) -> Option<&Value> {
        self.values.get(name).filter(|v| !v.expired(now_ms))
    }

    /// The names of the values not expired at `now_ms`, sorted.
    pub fn names(&self, now_ms: u64) -> impl Iterator<Item = &str> {
        self.values
            .iter()
            .filter(move |(_, v)| !v.expired(now_ms))
            .map(|(n, _)| n.as_str())
    }

    /// Sets (`Some`) or removes (`None`) the value `name`.
    pub fn put(&mut self, name: &str, value: Option<Value>) {
        if let Some(old) = self.values.remove(name) {
            self.bytes -= weight(name, &old);
        }
        if let Some(value) = value {
            self.bytes += weight(name, &value);
            self.values.insert(name.to_owned(), value);
        }
    }

    /// What the key's state weighs (names and data) once `name` is set to
    /// `data_len` bytes.
    pub fn bytes_with(&self, name: &str, data_len: usize) -> usize {
        let old = self.values.get(name).map_or(0, |v| weight(name, v));
        self.bytes - old + name.len() + data_len + VALUE_OVERHEAD
    }

    /// Names and data together, plus [`VALUE_OVERHEAD`] per value.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// True when no value is set (expired ones included).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Every value, expired ones included, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.values.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Drops the values expired at `now_ms`.
    pub fn drop_expired(&mut self, now_ms: u64) {
        let expired: Vec<String> = self
            .values
            .iter()
            .filter(|(_, v)| v.expired(now_ms))
            .map(|(n, _)| n.clone())
            .collect();
        for name in expired {
            self.put(&name, None);
        }
    }

    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        StoredKeyState {
            values: self
                .values
                .iter()
                .map(|(name, v)| StoredValue {
                    name: name.clone(),
                    data: v.data.clone(),
                    expires_ms: v.expires_ms,
                })
                .collect(),
        }
        .encode_to_vec()
    }

    /// Reads the stored form.
    ///
    /// # Errors
    /// When `bytes` is not a stored state.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let stored = StoredKeyState::decode(bytes).map_err(|e| DecodeError(e.to_string()))?;
        let mut state = KeyState::default();
        for v in stored.values {
            state.put(
                &v.name,
                Some(Value {
                    data: v.data,
                    expires_ms: v.expires_ms,
                }),
            );
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(data: &[u8], expires_ms: Option<u64>) -> Option<Value> {
        Some(Value {
            data: data.to_vec(),
            expires_ms,
        })
    }

    #[test]
    fn round_trips_and_counts_names_and_data() {
        let mut state = KeyState::default();
        state.put("total", value(b"42", None));
        state.put("seen", value(b"", Some(7)));
        let o = VALUE_OVERHEAD;
        assert_eq!(state.bytes(), "total".len() + 2 + "seen".len() + 2 * o);
        let back = KeyState::decode(&state.encode()).unwrap();
        assert_eq!(back, state);
        state.put("total", value(b"4200", None));
        assert_eq!(state.bytes(), "total".len() + 4 + "seen".len() + 2 * o);
        assert_eq!(
            state.bytes_with("total", 1),
            "total".len() + 1 + "seen".len() + 2 * o
        );
        state.put("total", None);
        state.put("seen", None);
        assert!(state.is_empty());
        assert_eq!(state.bytes(), 0);
    }

    #[test]
    fn expired_values_read_as_absent_and_go_at_the_next_write() {
        let mut state = KeyState::default();
        state.put("old", value(b"x", Some(100)));
        state.put("new", value(b"y", Some(200)));
        assert!(state.get("old", 99).is_some());
        assert!(state.get("old", 100).is_none());
        assert_eq!(state.names(150).collect::<Vec<_>>(), ["new"]);
        state.drop_expired(150);
        assert_eq!(state.iter().count(), 1);
    }

    #[test]
    fn the_stored_form_is_never_larger_than_the_count() {
        let mut state = KeyState::default();
        for i in 0..1_000u64 {
            state.put(&i.to_string(), value(b"", Some(u64::MAX - i)));
        }
        state.put(&"n".repeat(300), value(&[7; 70_000], Some(u64::MAX)));
        assert!(
            state.encode().len() <= state.bytes(),
            "{} > {}",
            state.encode().len(),
            state.bytes()
        );
    }

    #[test]
    fn garbage_does_not_decode() {
        assert!(KeyState::decode(&[0xff, 0xff, 0xff]).is_err());
    }
}
