//! The memory lease store's own artifact store: versions' bytes kept in
//! the process, as the memory store keeps the versions themselves (both
//! end with it). The latest [`KEPT`] versions stay; a rollback to an
//! older one finds it missing and says so.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{ArtifactError, Backend};
use crate::ids::PluginDigest;

/// Versions kept, newest last.
const KEPT: usize = 16;

/// Versions' bytes in this process.
#[derive(Default)]
pub(super) struct Memory {
    kept: Mutex<VecDeque<(PluginDigest, Arc<Vec<u8>>)>>,
}

#[async_trait]
impl Backend for Memory {
    async fn store(&self, digest: &PluginDigest, bytes: Vec<u8>) -> Result<(), ArtifactError> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|(d, _)| d != digest);
        kept.push_back((digest.clone(), Arc::new(bytes)));
        while kept.len() > KEPT {
            kept.pop_front();
        }
        Ok(())
    }

    async fn fetch(&self, digest: &PluginDigest) -> Result<Vec<u8>, ArtifactError> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter()
            .find(|(d, _)| d == digest)
            .map(|(_, bytes)| bytes.to_vec())
            .ok_or_else(|| ArtifactError::Missing {
                digest: digest.clone(),
                location: self.location(),
            })
    }

    fn location(&self) -> String {
        "memory (this process)".to_owned()
    }
}
