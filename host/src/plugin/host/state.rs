//! `state`: per-key state, read and written on the call's [`CallState`](crate::state::CallState)
//! (see [`crate::state`]); the lane keeps a record's writes only if its
//! attempt acks. Every refusal is an error value to the guest, never a
//! trap.

use super::HostState;
use crate::plugin::bindings::{v2, v3};
use crate::state::StateError;

/// The one `state` of every contract version that has it: their
/// generated types differ, the rules do not.
macro_rules! state_host {
    ($version:ident) => {
        impl From<StateError> for $version::state::StateError {
            fn from(e: StateError) -> Self {
                match e {
                    StateError::NotEnabled => Self::NotEnabled,
                    StateError::NoSuchInput(n) => Self::NoSuchInput(n),
                    StateError::ValueTooLarge(limit) => Self::ValueTooLarge(limit),
                    StateError::KeyTooLarge(limit) => Self::KeyTooLarge(limit),
                }
            }
        }

        impl $version::state::Host for HostState {
            fn get(
                &mut self,
                input: u32,
                name: String,
            ) -> Result<Option<Vec<u8>>, $version::state::StateError> {
                Ok(self.state.get(input, &name)?)
            }

            fn set(
                &mut self,
                input: u32,
                name: String,
                value: Vec<u8>,
            ) -> Result<(), $version::state::StateError> {
                Ok(self.state.set(input, &name, value)?)
            }

            fn delete(
                &mut self,
                input: u32,
                name: String,
            ) -> Result<(), $version::state::StateError> {
                Ok(self.state.delete(input, &name)?)
            }

            fn names(&mut self, input: u32) -> Result<Vec<String>, $version::state::StateError> {
                Ok(self.state.names(input)?)
            }
        }
    };
}

state_host!(v2);
state_host!(v3);
