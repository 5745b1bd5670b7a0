//! A folder artifact store: `<folder>/sha256-<hex>.wasm`, for one host or
//! hosts sharing a file system.
//!
//! A file is trusted by its bytes, never by its name: storing a version
//! whose name holds other bytes (a copy gone wrong, a file planted under
//! the name) replaces them, and a fetch checks what it read (in
//! [`super::ArtifactStore::fetch`]), so a wrong file is never served and
//! never blocks a version for good. Files are written aside and renamed
//! into place, so a reader never sees half of one. Every file call runs on
//! a thread of its own ([`crate::files::on_thread`]): a hung network file
//! system cannot hold the runtime.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::{ArtifactError, Backend, failed, file_name};
use crate::files::{self, MAX_PLUGIN_BYTES};
use crate::ids::PluginDigest;

/// A local folder.
pub(super) struct Folder {
    path: PathBuf,
}

impl Folder {
    pub(super) fn new(path: PathBuf) -> Self {
        Self { path }
    }
}

/// Writes `bytes` as `target` unless it holds them already: aside, then
/// renamed over whatever is there.
fn write_checked(dir: &Path, target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if let Ok(existing) = files::read_regular(target, MAX_PLUGIN_BYTES)
        && existing == bytes
    {
        return Ok(());
    }
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(target).map_err(|e| e.error)?;
    Ok(())
}

#[async_trait]
impl Backend for Folder {
    async fn store(&self, digest: &PluginDigest, bytes: Vec<u8>) -> Result<(), ArtifactError> {
        let dir = self.path.clone();
        let target = dir.join(file_name(digest));
        let location = self.location();
        files::on_thread("artifact-store", move || {
            write_checked(&dir, &target, &bytes)
        })
        .await
        .map_err(|e| failed(&location, e))?
        .map_err(|e| failed(&location, e))
    }

    async fn fetch(&self, digest: &PluginDigest) -> Result<Vec<u8>, ArtifactError> {
        let path = self.path.join(file_name(digest));
        let location = self.location();
        let read = files::on_thread("artifact-fetch", move || {
            files::read_regular(&path, MAX_PLUGIN_BYTES)
        })
        .await
        .map_err(|e| failed(&location, e))?;
        match read {
            Ok(bytes) => Ok(bytes),
            Err(files::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ArtifactError::Missing {
                    digest: digest.clone(),
                    location,
                })
            }
            Err(files::ReadError::TooLarge { .. }) => Err(ArtifactError::TooLarge {
                digest: digest.clone(),
                location,
            }),
            Err(e) => Err(failed(&location, e)),
        }
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }
}
