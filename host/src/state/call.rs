//! One call's view of state: for each distinct partition key among the
//! call's records, the key's state as the call found it (committed, plus
//! what earlier acked records of this session staged), changed in place by
//! the guest's writes, which are also kept per input record so that each
//! record's writes can be kept or discarded by its own outcome.
//!
//! Pure: the lane builds it with [`super::StateStage::prepare_keys`] before the
//! call, the `state` import acts on it during the call, and the lane hands
//! the acked records' [`Delta`]s to the stage after it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::codec::{KeyState, Value};
use crate::config::StateConfig;
use crate::ids::PartitionKey;

/// One record's writes under its key: per name, the new value (`None`:
/// deleted), the last write of a name winning.
pub(crate) type Delta = BTreeMap<String, Option<Value>>;

/// Why a state call did nothing (the contract's `state-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    /// The subscription has no `state` table.
    NotEnabled,
    /// No such input; the call's number of inputs.
    NoSuchInput(u32),
    /// A value over `max_value` (the limit).
    ValueTooLarge(u64),
    /// A key over `max_per_key` (the limit).
    KeyTooLarge(u64),
}

/// A key of the call.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) key: PartitionKey,
    /// The state as the call found it.
    pub(super) base: KeyState,
    /// The state as the call leaves it.
    pub(super) view: KeyState,
}

/// The state a call sees (see the module docs); the default is a call
/// without state (`not-enabled`).
#[derive(Debug, Default)]
pub struct CallState {
    inner: Option<Box<Inner>>,
}

#[derive(Debug)]
struct Inner {
    config: Arc<StateConfig>,
    now_ms: u64,
    /// Input index → its key's slot.
    inputs: Vec<usize>,
    slots: Vec<Slot>,
    /// Input index → its writes.
    deltas: Vec<Delta>,
}

impl CallState {
    pub(super) fn new(
        config: Arc<StateConfig>,
        now_ms: u64,
        inputs: Vec<usize>,
        slots: Vec<Slot>,
    ) -> Self {
        let deltas = vec![Delta::new(); inputs.len()];
        Self {
            inner: Some(Box::new(Inner {
                config,
                now_ms,
                inputs,
                slots,
                deltas,
            })),
        }
    }

    fn slot(&mut self, input: u32) -> Result<(&mut Inner, usize), StateError> {
        let inner = self.inner.as_deref_mut().ok_or(StateError::NotEnabled)?;
        let slot = *inner
            .inputs
            .get(input as usize)
            .ok_or(StateError::NoSuchInput(inner.inputs.len() as u32))?;
        Ok((inner, slot))
    }

    /// The value `name` under input `input`'s key.
    ///
    /// # Errors
    /// No state, or no such input.
    pub fn get(&mut self, input: u32, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let (inner, slot) = self.slot(input)?;
        Ok(inner.slots[slot]
            .view
            .get(name, inner.now_ms)
            .map(|v| v.data.clone()))
    }

    /// The names set under input `input`'s key, sorted.
    ///
    /// # Errors
    /// No state, or no such input.
    pub fn names(&mut self, input: u32) -> Result<Vec<String>, StateError> {
        let (inner, slot) = self.slot(input)?;
        Ok(inner.slots[slot]
            .view
            .names(inner.now_ms)
            .map(str::to_owned)
            .collect())
    }

    /// Sets the value `name` under input `input`'s key.
    ///
    /// # Errors
    /// No state, no such input, or over a size limit (nothing changes).
    pub fn set(&mut self, input: u32, name: &str, data: Vec<u8>) -> Result<(), StateError> {
        let (inner, slot) = self.slot(input)?;
        let config = &inner.config;
        if data.len() as u64 > config.max_value {
            return Err(StateError::ValueTooLarge(config.max_value));
        }
        let view = &mut inner.slots[slot].view;
        view.drop_expired(inner.now_ms);
        if view.bytes_with(name, data.len()) as u64 > config.max_per_key {
            return Err(StateError::KeyTooLarge(config.max_per_key));
        }
        let value = Value {
            data,
            expires_ms: config
                .ttl
                .map(|ttl| inner.now_ms.saturating_add(ttl.as_millis() as u64)),
        };
        view.put(name, Some(value.clone()));
        inner.deltas[input as usize].insert(name.to_owned(), Some(value));
        Ok(())
    }

    /// Removes the value `name` under input `input`'s key.
    ///
    /// # Errors
    /// No state, or no such input.
    pub fn delete(&mut self, input: u32, name: &str) -> Result<(), StateError> {
        let (inner, slot) = self.slot(input)?;
        inner.slots[slot].view.put(name, None);
        inner.deltas[input as usize].insert(name.to_owned(), None);
        Ok(())
    }

    /// The view of a part of the call, its inputs `indices` (in order)
    /// renumbered from 0, with their keys' state as it stands. Each key of
    /// the part must have all its inputs in the part (a canary splits a
    /// batch by key); [`CallState::absorb`] puts the part back.
    pub fn part(&self, indices: &[usize]) -> CallState {
        let Some(inner) = self.inner.as_deref() else {
            return CallState::default();
        };
        let mut slots: Vec<Slot> = Vec::new();
        let mut from: Vec<usize> = Vec::new();
        let mut inputs = Vec::with_capacity(indices.len());
        for &i in indices {
            let slot = inner.inputs[i];
            let at = match from.iter().position(|&s| s == slot) {
                Some(at) => at,
                None => {
                    let whole = &inner.slots[slot];
                    slots.push(Slot {
                        key: whole.key.clone(),
                        base: whole.base.clone(),
                        view: whole.view.clone(),
                    });
                    from.push(slot);
                    slots.len() - 1
                }
            };
            inputs.push(at);
        }
        CallState::new(inner.config.clone(), inner.now_ms, inputs, slots)
    }

    /// Takes back a [`CallState::part`] made with the same `indices`: its
    /// inputs' writes and its keys' state.
    pub fn absorb(&mut self, part: CallState, indices: &[usize]) {
        let (Some(inner), Some(part)) = (self.inner.as_deref_mut(), part.inner) else {
            return;
        };
        let Inner {
            inputs,
            mut slots,
            deltas,
            ..
        } = *part;
        let mut to_whole = vec![None; slots.len()];
        for ((&i, delta), slot) in indices.iter().zip(deltas).zip(inputs) {
            inner.deltas[i] = delta;
            to_whole[slot] = Some(inner.inputs[i]);
        }
        for (slot, whole) in slots.iter_mut().zip(to_whole) {
            if let Some(whole) = whole {
                inner.slots[whole].view = std::mem::take(&mut slot.view);
            }
        }
    }

    /// What a [`Self::fork`] of this view holds, in bytes: each key's
    /// state as the call found it and as it leaves it, and the writes (a
    /// bound for the shadow's queue).
    pub fn bytes(&self) -> usize {
        self.inner.as_ref().map_or(0, |inner| {
            let slots: usize = inner
                .slots
                .iter()
                .map(|s| s.key.as_str().len() + s.base.bytes() + s.view.bytes())
                .sum();
            let deltas: usize = inner
                .deltas
                .iter()
                .flat_map(|d| d.iter())
                .map(|(name, v)| name.len() + v.as_ref().map_or(0, |v| v.data.len()))
                .sum();
            slots + deltas
        })
    }

    /// A copy for a shadow call (see `crate::slot`): the state as this
    /// call sees it now, with no writes of its own. Its writes are never
    /// staged or committed: whoever holds it only compares them.
    pub fn fork(&self) -> CallState {
        CallState {
            inner: self.inner.as_ref().map(|inner| {
                Box::new(Inner {
                    config: inner.config.clone(),
                    now_ms: inner.now_ms,
                    inputs: inner.inputs.clone(),
                    slots: inner.slots.clone(),
                    deltas: vec![Delta::new(); inner.inputs.len()],
                })
            }),
        }
    }

    /// Every input's writes so far, in input order (empty without state).
    pub fn deltas(&self) -> Vec<Delta> {
        self.inner
            .as_ref()
            .map_or_else(Vec::new, |i| i.deltas.clone())
    }

    /// True when input `input` wrote.
    pub fn wrote(&self, input: usize) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.deltas.get(input).is_some_and(|d| !d.is_empty()))
    }

    /// The slot of input `input`'s key (inputs of one key share one).
    pub fn key_of(&self, input: usize) -> Option<usize> {
        self.inner
            .as_ref()
            .and_then(|i| i.inputs.get(input).copied())
    }

    /// Takes input `input`'s writes, with its key and the state its key
    /// had when the call began (see [`super::StateStage::stage`]).
    pub fn take(&mut self, input: usize) -> Option<(&PartitionKey, &KeyState, Delta)> {
        let inner = self.inner.as_deref_mut()?;
        let delta = std::mem::take(inner.deltas.get_mut(input)?);
        let slot = &inner.slots[inner.inputs[input]];
        Some((&slot.key, &slot.base, delta))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn call(config: StateConfig, keys: &[&str]) -> CallState {
        let mut slots: Vec<Slot> = Vec::new();
        let mut inputs = Vec::new();
        for key in keys {
            let at = match slots.iter().position(|s| s.key.as_str() == *key) {
                Some(at) => at,
                None => {
                    slots.push(Slot {
                        key: PartitionKey::new(*key),
                        base: KeyState::default(),
                        view: KeyState::default(),
                    });
                    slots.len() - 1
                }
            };
            inputs.push(at);
        }
        CallState::new(Arc::new(config), 1_000, inputs, slots)
    }

    #[test]
    fn inputs_of_one_key_share_its_state_and_keep_their_own_writes() {
        let mut state = call(StateConfig::default(), &["a", "b", "a"]);
        state.set(0, "total", b"1".to_vec()).unwrap();
        assert_eq!(state.get(2, "total").unwrap(), Some(b"1".to_vec()));
        assert_eq!(state.get(1, "total").unwrap(), None);
        state.set(2, "total", b"3".to_vec()).unwrap();
        state.delete(2, "gone").unwrap();
        assert_eq!(state.names(0).unwrap(), ["total"]);
        assert!(state.wrote(0) && !state.wrote(1) && state.wrote(2));
        assert_eq!(state.key_of(0), state.key_of(2));
        let (key, base, delta) = state.take(2).unwrap();
        assert_eq!(key.as_str(), "a");
        assert!(base.is_empty());
        assert_eq!(delta.len(), 2);
        assert_eq!(delta["gone"], None);
        assert!(!state.wrote(2));
    }

    #[test]
    fn limits_and_bad_inputs_are_errors_that_change_nothing() {
        let config = StateConfig {
            max_value: 4,
            // "name" = 1234 weighs 4 + 4 + 24; with "other" it would be 65.
            max_per_key: 60,
            ttl: None,
        };
        let mut state = call(config, &["k"]);
        assert_eq!(
            state.set(0, "n", b"12345".to_vec()),
            Err(StateError::ValueTooLarge(4))
        );
        state.set(0, "name", b"1234".to_vec()).unwrap();
        assert_eq!(
            state.set(0, "other", b"1234".to_vec()),
            Err(StateError::KeyTooLarge(60))
        );
        // Replacing a value counts it once.
        state.set(0, "name", b"5678".to_vec()).unwrap();
        assert_eq!(state.get(1, "name"), Err(StateError::NoSuchInput(1)));
        assert_eq!(state.names(0).unwrap(), ["name"]);
        assert_eq!(
            CallState::default().get(0, "x"),
            Err(StateError::NotEnabled)
        );
    }

    #[test]
    fn a_part_of_a_call_writes_through_to_the_whole() {
        let mut whole = call(StateConfig::default(), &["a", "b", "c", "b"]);
        let indices = [1, 2, 3];
        let mut part = whole.part(&indices);
        part.set(0, "n", b"b".to_vec()).unwrap();
        part.set(1, "n", b"c".to_vec()).unwrap();
        assert_eq!(part.get(3, "n"), Err(StateError::NoSuchInput(3)));
        whole.absorb(part, &indices);
        assert!(!whole.wrote(0) && whole.wrote(1) && whole.wrote(2) && !whole.wrote(3));
        assert_eq!(whole.get(3, "n").unwrap(), Some(b"b".to_vec()));
        assert_eq!(whole.get(2, "n").unwrap(), Some(b"c".to_vec()));
        assert_eq!(whole.get(0, "n").unwrap(), None);
    }

    #[test]
    fn a_ttl_stamps_each_write() {
        let config = StateConfig {
            ttl: Some(Duration::from_secs(2)),
            ..StateConfig::default()
        };
        let mut state = call(config, &["k"]);
        state.set(0, "v", b"x".to_vec()).unwrap();
        let (_, _, delta) = state.take(0).unwrap();
        assert_eq!(delta["v"].as_ref().unwrap().expires_ms, Some(3_000));
    }
}
