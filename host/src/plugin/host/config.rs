//! `wasi:config/store`: the subscription's `config` table, read-only. A key
//! that is not set is `none`; values are strings (start-up refuses others).

use super::HostState;
use crate::plugin::bindings::v2::config::{Error, Host};

impl Host for HostState {
    fn get(&mut self, key: String) -> Result<Option<String>, Error> {
        Ok(self.grants.config.get(&key).cloned())
    }

    fn get_all(&mut self) -> Result<Vec<(String, String)>, Error> {
        Ok(self
            .grants
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
