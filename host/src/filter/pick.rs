//! A record's data parsed only as far as the patterns look: the fields
//! they name ([`Shape`]) are built, the rest is skipped by the parser.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Field, Object};

/// The fields some pattern names, as a tree: `data` is parsed keeping only
/// these (everything else is skipped by the parser without being built),
/// which makes a record's parse cost what the patterns look at.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Shape {
    pub(super) fields: BTreeMap<String, Shape>,
}

impl Shape {
    /// Adds what `object` names at this level (its `$or` alternatives too).
    pub(super) fn add(&mut self, object: &Object) {
        for (name, field) in &object.fields {
            let sub = self.fields.entry(name.clone()).or_default();
            if let Field::Nested(nested) = field {
                sub.add(nested);
            }
        }
        for alt in object.ors.iter().flatten() {
            self.add(alt);
        }
    }
}

/// Parses a JSON value keeping, in objects, only the fields of a [`Shape`]
/// (at any depth, through arrays); the rest is skipped unbuilt.
pub(super) struct Pick<'a>(pub(super) &'a Shape);

impl<'de> serde::de::DeserializeSeed<'de> for Pick<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Pick<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Pick(self.0))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut kept = serde_json::Map::new();
        while let Some(wanted) = map.next_key_seed(Wanted(self.0))? {
            match wanted {
                Some((name, shape)) => {
                    let value = map.next_value_seed(Pick(shape))?;
                    kept.insert(name.to_owned(), value);
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(kept))
    }
}

/// An object's key, looked up in a shape without being allocated.
struct Wanted<'a>(&'a Shape);

impl<'de, 'a> serde::de::DeserializeSeed<'de> for Wanted<'a> {
    type Value = Option<(&'a str, &'a Shape)>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'a> serde::de::Visitor<'_> for Wanted<'a> {
    type Value = Option<(&'a str, &'a Shape)>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.fields.get_key_value(v).map(|(k, s)| (k.as_str(), s)))
    }
}
