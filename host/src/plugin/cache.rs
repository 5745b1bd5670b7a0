//! The compile cache: compiled components on disk, trusted only when the
//! host's own user wrote them.
//!
//! # Threat model
//! Compiling a large component takes seconds, so compiled components are
//! kept on disk ([`CompileCache`]). Loading one is `unsafe`
//! (`Component::deserialize`, like `deserialize_file`): wasmtime maps the entry's bytes as executable
//! machine code and checks only that its header matches this engine and
//! wasmtime release, not that the code is what compiling the plugin would
//! give. So whoever can write an entry runs native code in the host process
//! — outside the sandbox, with the host's privileges, for every record —
//! while `/metrics` shows the digest of the plugin the operator deployed.
//! Entry names are no secret (they follow from that digest).
//!
//! Hence only the host's own user (its effective uid) may write the cache,
//! and root, who can do anything anyway. What is checked:
//! - The folder is created with mode 0700. At start-up an existing folder is
//!   refused when it is not a folder, not owned by the host's euid, or
//!   writable by group or others; the host then runs without a cache and
//!   says so in one line naming the folder and why. We refuse rather than
//!   fix the mode: entries may already have been planted; and we run without
//!   the cache rather than fail start-up: it saves compile time, nothing
//!   more.
//! - Every entry is opened without following a symlink (`O_NOFOLLOW`) and
//!   checked on the opened descriptor (not by path, which a rename could
//!   race): a regular file, owned by the host's euid, writable by no one
//!   else, with one hard link (a link is how an entry of another plugin
//!   could be passed off under this one's name), of bounded size. An entry
//!   that fails is ignored — compiled afresh and replaced — with a warning
//!   naming it. Checking entries as well as the folder covers a folder
//!   whose parent another user can write (they could swap the folder after
//!   start-up, but not make files owned by the host's user).
//! - Entries are written to a new file with an unpredictable name created
//!   with `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600, then renamed into
//!   place, so nothing planted in advance (a file, a symlink) is written
//!   through.

use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::one_line;
use crate::ids::PluginDigest;

/// The largest compile cache entry read. Compiled code is a few times the
/// size of the component ([`MAX_PLUGIN_BYTES`](crate::files::MAX_PLUGIN_BYTES)
/// at most); a larger entry is not one this host wrote, and is compiled
/// afresh.
const MAX_CACHE_ENTRY_BYTES: u64 = 4 * crate::files::MAX_PLUGIN_BYTES;

/// Compiled components on disk, so a large guest (Python, JavaScript: 10–20
/// MB, seconds to compile) is compiled once, not at every start.
///
/// An entry is the serialized component, named by the component's sha256
/// and a hash of the engine's compilation settings and wasmtime's version,
/// so a changed plugin, engine setting or wasmtime release never reads a
/// stale entry; wasmtime also refuses an incompatible artifact itself.
/// Entries are written to a temporary file and renamed into place, so a
/// reader never sees half of one.
///
/// # Trust
/// Loading an entry skips compilation and trusts the file's machine code,
/// so only the host's own user may write the cache: see "Compile cache" in
/// the [module docs](self) for what is checked, and when.
#[derive(Debug)]
pub struct CompileCache {
    dir: PathBuf,
    /// The effective uid the host runs as: the only owner trusted.
    euid: u32,
}

/// Why a compile cache folder is refused. Each message is one line naming
/// the folder and the reason.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The folder cannot be created or inspected.
    #[error("compile cache {dir}: cannot create the folder: {reason}")]
    Create {
        /// The folder.
        dir: PathBuf,
        /// Why.
        reason: std::io::Error,
    },
    /// The path exists but is not a folder.
    #[error("compile cache {dir}: not a folder")]
    NotAFolder {
        /// The path.
        dir: PathBuf,
    },
    /// Another user owns it, and could plant code the host would run.
    #[error(
        "compile cache {dir}: owned by uid {owner}, not by the uid the host runs as ({euid}); refused, as its owner could make the host run any code"
    )]
    NotOwned {
        /// The folder.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
        /// The host's effective uid.
        euid: u32,
    },
    /// Group or others may write it, and could plant code the host would
    /// run.
    #[error(
        "compile cache {dir}: writable by group or others (mode {mode:03o}); refused, as any of them could make the host run any code (chmod go-w it)"
    )]
    Writable {
        /// The folder.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Why one cache entry was not loaded (it is compiled afresh and replaced).
#[derive(Debug, thiserror::Error)]
pub(super) enum EntryError {
    #[error("cannot open it: {0}")]
    Open(crate::files::ReadError),
    #[error("owned by uid {owner}, not by the uid the host runs as ({euid})")]
    NotOwned { owner: u32, euid: u32 },
    #[error("writable by group or others (mode {mode:03o})")]
    Writable { mode: u32 },
    #[error("has {nlink} hard links; the host writes entries with one")]
    Linked { nlink: u64 },
    #[error("cannot read it: {0}")]
    Read(crate::files::ReadError),
    #[error("not a usable compiled component: {0}")]
    Deserialize(String),
}

impl CompileCache {
    /// A cache in `dir`, created with mode 0700 when missing (and any
    /// missing parents with it).
    ///
    /// # Errors
    /// [`CacheError`] naming the folder: it cannot be created, is not a
    /// folder, is owned by another uid than the host's effective uid, or is
    /// writable by group or others.
    pub fn new(dir: PathBuf) -> Result<Self, CacheError> {
        use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
        let create_error = |reason| CacheError::Create {
            dir: dir.clone(),
            reason,
        };
        if let Err(reason) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
        {
            return Err(match std::fs::metadata(&dir) {
                Ok(meta) if !meta.is_dir() => CacheError::NotAFolder { dir },
                _ => create_error(reason),
            });
        }
        // Follows a symlink: the folder it names is what must be ours.
        let meta = std::fs::metadata(&dir).map_err(create_error)?;
        let euid = crate::files::euid();
        if !meta.is_dir() {
            return Err(CacheError::NotAFolder { dir });
        }
        if meta.uid() != euid {
            return Err(CacheError::NotOwned {
                dir,
                owner: meta.uid(),
                euid,
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(CacheError::Writable {
                dir,
                mode: meta.mode() & 0o7777,
            });
        }
        Ok(Self { dir, euid })
    }

    pub(super) fn entry(&self, engine: &Engine, digest: &PluginDigest) -> PathBuf {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        let hex = digest.to_string();
        let hex = hex.trim_start_matches("sha256:");
        self.dir
            .join(format!("{hex}-{:016x}.cwasm", hasher.finish()))
    }

    /// The component in `entry`: `None` when there is none, an error when
    /// there is one this host must not trust or cannot use.
    pub(super) fn load(
        &self,
        engine: &Engine,
        entry: &Path,
    ) -> Result<Option<Component>, EntryError> {
        use crate::files::{self, ReadError};
        use std::os::unix::fs::MetadataExt as _;
        // No symlink followed; every check below is on the opened file.
        let (file, meta) = match files::open_no_follow(entry) {
            Ok(opened) => opened,
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(EntryError::Open(e)),
        };
        if meta.uid() != self.euid {
            return Err(EntryError::NotOwned {
                owner: meta.uid(),
                euid: self.euid,
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(EntryError::Writable {
                mode: meta.mode() & 0o7777,
            });
        }
        if meta.nlink() != 1 {
            return Err(EntryError::Linked {
                nlink: meta.nlink(),
            });
        }
        let bytes =
            files::read_to_limit(file, &meta, MAX_CACHE_ENTRY_BYTES).map_err(EntryError::Read)?;
        // SAFETY: `deserialize` runs the bytes as machine code unchecked.
        // They come from a regular file, reached without a symlink, owned by
        // this host's user, writable by no one else and linked nowhere else,
        // in a folder that passed the same owner and mode checks: only this
        // user (or root) can have written it, and this host writes entries
        // only from what its own engine compiled. Wasmtime checks the
        // header against this engine's settings and version.
        unsafe { Component::deserialize(engine, &bytes) }
            .map(Some)
            .map_err(|e| EntryError::Deserialize(one_line(&e)))
    }

    /// Writes `bytes` as `entry`: to a new file with an unpredictable name
    /// (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, so nothing planted under
    /// that name is written through), then renamed over `entry`, which
    /// replaces whatever was there (a refused entry, a symlink) rather than
    /// writing into it.
    pub(super) fn store(&self, entry: &Path, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let name = entry.file_name().unwrap_or_default().to_string_lossy();
        let tmp = self
            .dir
            .join(format!(".{name}.{:032x}.tmp", rand::random::<u128>()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut file| {
                file.write_all(bytes)?;
                file.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, entry));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

#[cfg(test)]
mod cache_tests {
    //! The compile cache's trust checks. Tests run as root, so "another
    //! user" is uid 65534 (nobody), set with `chown`.
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    const NOBODY: u32 = 65534;

    fn chown_to_nobody(path: &Path) {
        std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY))
            .expect("chown to uid 65534 (these tests run as root)");
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A real compiled component, as an entry holds.
    fn serialized(engine: &Engine) -> Vec<u8> {
        Component::new(engine, "(component)")
            .unwrap()
            .serialize()
            .unwrap()
    }

    #[test]
    fn creates_the_folder_0700() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("a/b");
        CompileCache::new(cache.clone()).unwrap();
        let mode = std::fs::metadata(&cache).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "{mode:o}");
        // An existing folder only its owner can write is fine.
        chmod(&cache, 0o755);
        CompileCache::new(cache).unwrap();
    }

    #[test]
    fn refuses_a_folder_of_another_uid() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        chmod(&cache, 0o700);
        chown_to_nobody(&cache);
        let e = CompileCache::new(cache.clone()).unwrap_err();
        assert!(
            matches!(e, CacheError::NotOwned { owner: NOBODY, .. }),
            "{e}"
        );
        let line = e.to_string();
        assert_eq!(line.lines().count(), 1);
        assert!(line.contains(&cache.display().to_string()), "{line}");
        assert!(line.contains("owned by uid 65534"), "{line}");
    }

    #[test]
    fn refuses_a_folder_others_can_write() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        for mode in [0o777, 0o770, 0o702] {
            chmod(&cache, mode);
            let e = CompileCache::new(cache.clone()).unwrap_err();
            assert!(
                matches!(e, CacheError::Writable { mode: m, .. } if m == mode),
                "{e}"
            );
            assert!(e.to_string().contains(&cache.display().to_string()));
        }
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            CompileCache::new(file),
            Err(CacheError::NotAFolder { .. })
        ));
    }

    #[test]
    fn loads_only_entries_of_its_own_uid_unlinked_and_unwritable_by_others() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path().join("cache")).unwrap();
        let digest = PluginDigest::of(b"victim");
        let entry = cache.entry(&engine, &digest);
        assert!(matches!(cache.load(&engine, &entry), Ok(None)));

        // Another uid plants a real compiled component under the victim's
        // entry name: not loaded.
        std::fs::write(&entry, serialized(&engine)).unwrap();
        chmod(&entry, 0o644);
        chown_to_nobody(&entry);
        let e = cache.load(&engine, &entry).unwrap_err();
        assert!(
            matches!(e, EntryError::NotOwned { owner: NOBODY, .. }),
            "{e}"
        );

        // Ours, but writable by others: not loaded.
        let me = crate::files::euid();
        std::os::unix::fs::lchown(&entry, Some(me), Some(me)).unwrap();
        chmod(&entry, 0o666);
        let e = cache.load(&engine, &entry).unwrap_err();
        assert!(matches!(e, EntryError::Writable { mode: 0o666 }), "{e}");

        // Ours and private: loaded (the control).
        chmod(&entry, 0o600);
        assert!(matches!(cache.load(&engine, &entry), Ok(Some(_))));

        // The same file linked under another name: not loaded under either.
        let other = cache.entry(&engine, &PluginDigest::of(b"other"));
        std::fs::hard_link(&entry, &other).unwrap();
        let e = cache.load(&engine, &other).unwrap_err();
        assert!(matches!(e, EntryError::Linked { nlink: 2 }), "{e}");
        std::fs::remove_file(&other).unwrap();

        // A symlink to a trusted-looking entry: not followed.
        std::os::unix::fs::symlink(&entry, &other).unwrap();
        let e = cache.load(&engine, &other).unwrap_err();
        assert!(
            matches!(e, EntryError::Open(crate::files::ReadError::Symlink)),
            "{e}"
        );

        // Garbage of our own: refused by wasmtime, recompiled.
        std::fs::write(&entry, b"not compiled code").unwrap();
        assert!(matches!(
            cache.load(&engine, &entry),
            Err(EntryError::Deserialize(_))
        ));
    }

    #[test]
    fn stores_without_writing_through_what_was_planted() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path().join("cache")).unwrap();
        let entry = cache.entry(&engine, &PluginDigest::of(b"victim"));
        // A symlink planted under the entry's name, to a file of ours.
        let target = dir.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        std::os::unix::fs::symlink(&target, &entry).unwrap();
        cache.store(&entry, &serialized(&engine)).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        let meta = std::fs::symlink_metadata(&entry).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(matches!(cache.load(&engine, &entry), Ok(Some(_))));
        // Only the entry: the temporary file was renamed, not left behind.
        assert_eq!(std::fs::read_dir(&cache.dir).unwrap().count(), 1);
    }
}
