//! `state`: per-key state, read and written on the call's [`CallState`](crate::state::CallState)
//! (see [`crate::state`]); the lane keeps a record's writes only if its
//! attempt acks. Every refusal is an error value to the guest, never a
//! trap.

use super::HostState;
use crate::plugin::bindings::v2::state::{Host, StateError as Wit};
use crate::state::StateError;

fn wit(e: StateError) -> Wit {
    match e {
        StateError::NotEnabled => Wit::NotEnabled,
        StateError::NoSuchInput(n) => Wit::NoSuchInput(n),
        StateError::ValueTooLarge(limit) => Wit::ValueTooLarge(limit),
        StateError::KeyTooLarge(limit) => Wit::KeyTooLarge(limit),
    }
}

impl Host for HostState {
    fn get(&mut self, input: u32, name: String) -> Result<Option<Vec<u8>>, Wit> {
        self.state.get(input, &name).map_err(wit)
    }

    fn set(&mut self, input: u32, name: String, value: Vec<u8>) -> Result<(), Wit> {
        self.state.set(input, &name, value).map_err(wit)
    }

    fn delete(&mut self, input: u32, name: String) -> Result<(), Wit> {
        self.state.delete(input, &name).map_err(wit)
    }

    fn names(&mut self, input: u32) -> Result<Vec<String>, Wit> {
        self.state.names(input).map_err(wit)
    }
}
