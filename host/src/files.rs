//! Reading the files the host is pointed at — plugins and the config —
//! without letting the file decide how much is read or whether the read
//! ends.
//!
//! A path in the config, on the command line or under a watched folder may
//! name anything: a symlink to `/dev/zero` (endless bytes), a FIFO (an open
//! that blocks until a writer appears, possibly never), a device, a file
//! that keeps growing. [`read_regular`] reads only a regular file, up to a
//! stated maximum ([`MAX_PLUGIN_BYTES`], [`MAX_CONFIG_BYTES`]):
//!
//! - the path's type is checked before opening it, so a device is never
//!   even opened;
//! - it is opened with `O_NONBLOCK`, so a FIFO swapped in after that check
//!   cannot block the open, and the type is checked again on the opened
//!   descriptor (`fstat`), which is what is actually read;
//! - at most `max + 1` bytes are read, whatever the size said, so a file
//!   growing while it is read cannot exceed the limit unnoticed.
//!
//! A symlink in the configured path is followed (the target must still be a
//! regular file). [`open_no_follow`] is the stricter variant for files the
//! host itself wrote (the compile cache): a symlink is refused.
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::fs::{File, Metadata};
use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

/// The largest plugin component read. Python components (an interpreter and
/// its standard library) are about 18 MB and JavaScript ones about 10 MB;
/// 256 MiB leaves more than ten times that room, while a mistaken or hostile
/// path cannot make the host hold more than this (compiling it costs a few
/// times as much again).
pub const MAX_PLUGIN_BYTES: u64 = 256 * 1024 * 1024;

/// The largest config file read. A config with a hundred subscriptions is
/// tens of kilobytes; anything near a megabyte is not a config.
pub(crate) const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Why a file was not read. The message is the reason only: callers name
/// the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The OS refused (missing, no permission, ...).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A FIFO, device, socket or folder.
    #[error("not a regular file (it is {kind})")]
    NotRegular {
        /// What it is instead, e.g. "a FIFO".
        kind: &'static str,
    },
    /// A symlink where none is followed ([`open_no_follow`]).
    #[error("is a symbolic link, which is not followed here")]
    Symlink,
    /// Over the limit.
    #[error("larger than the limit of {max} bytes")]
    TooLarge {
        /// The limit.
        max: u64,
    },
}

impl From<ReadError> for std::io::Error {
    /// For errors that carry an [`std::io::Error`]: the OS error itself, or
    /// one wrapping the [`ReadError`] (recoverable with `get_ref` and
    /// `downcast_ref`).
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Io(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::InvalidData, other),
        }
    }
}

/// Reads the regular file at `path` (following symlinks), at most `max`
/// bytes, never blocking on the open (see the module docs).
///
/// # Errors
/// [`ReadError`]: the file cannot be opened or read, is not a regular file,
/// or holds more than `max` bytes.
pub(crate) fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    // Checked before opening, so a device is never opened at all; checked
    // again on the descriptor below, which is what counts.
    regular(&std::fs::metadata(path)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    regular(&meta)?;
    read_to_limit(file, &meta, max)
}

/// Opens the regular file at `path` for reading without following a
/// symlink in its last component, and returns it with its metadata, taken
/// from the opened descriptor (so checks on it cannot be raced by a rename).
///
/// # Errors
/// [`ReadError::Symlink`] for a symlink, [`ReadError::NotRegular`] for
/// anything but a regular file, [`ReadError::Io`] otherwise.
pub(crate) fn open_no_follow(path: &Path) -> Result<(File, Metadata), ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => ReadError::Symlink,
            _ => ReadError::Io(e),
        })?;
    let meta = file.metadata()?;
    regular(&meta)?;
    Ok((file, meta))
}

/// Reads `file` to its end, refusing more than `max` bytes; `meta` (its
/// metadata) sizes the buffer and refuses an oversized file without reading.
///
/// # Errors
/// [`ReadError::TooLarge`] over the limit, [`ReadError::Io`] when a read
/// fails.
pub(crate) fn read_to_limit(file: File, meta: &Metadata, max: u64) -> Result<Vec<u8>, ReadError> {
    if meta.len() > max {
        return Err(ReadError::TooLarge { max });
    }
    // The size may be stale (the file may grow): `take` is the real bound.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge { max });
    }
    Ok(bytes)
}

/// Runs `work` on a thread of its own and waits for it without blocking
/// the runtime: for file-system calls that may never return (a read stuck
/// in the kernel on a hung network file system).
///
/// Not tokio's blocking pool: such a call would hold that pool's thread,
/// and the runtime waits for its threads when it shuts down. This thread
/// owns nothing but the call; a caller that stops waiting (a timeout, a
/// shutdown) leaves it to end with the process.
///
/// # Errors
/// When no thread can be started, or the thread ended without a result.
pub(crate) async fn on_thread<T, F>(name: &str, work: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = tx.send(work());
        })?;
    rx.await
        .map_err(|_| std::io::Error::other("the thread ended without a result"))
}

/// The effective user id of this process.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn regular(meta: &Metadata) -> Result<(), ReadError> {
    let ty = meta.file_type();
    let kind = if ty.is_file() {
        return Ok(());
    } else if ty.is_dir() {
        "a directory"
    } else if ty.is_fifo() {
        "a FIFO"
    } else if ty.is_char_device() {
        "a character device"
    } else if ty.is_block_device() {
        "a block device"
    } else if ty.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    Err(ReadError::NotRegular { kind })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt as _;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn reads_a_regular_file_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read_regular(&path, 5).unwrap(), b"12345");
        assert!(matches!(
            read_regular(&path, 4),
            Err(ReadError::TooLarge { max: 4 })
        ));
        // Through a symlink: followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(read_regular(&link, 5).unwrap(), b"12345");
    }

    #[test]
    fn a_symlink_to_dev_zero_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("zero.wasm");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let started = Instant::now();
        let e = read_regular(&link, MAX_PLUGIN_BYTES).unwrap_err();
        assert!(
            matches!(
                e,
                ReadError::NotRegular {
                    kind: "a character device"
                }
            ),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_growing_device_cannot_pass_the_limit() {
        // The descriptor check aside, the read itself stops at max + 1.
        // The size the metadata claims (0) is not trusted either.
        let empty = tempfile::NamedTempFile::new().unwrap();
        let meta = empty.as_file().metadata().unwrap();
        let file = File::open("/dev/zero").unwrap();
        assert!(matches!(
            read_to_limit(file, &meta, 1000),
            Err(ReadError::TooLarge { max: 1000 })
        ));
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("plugin.wasm");
        mkfifo(&fifo);
        // A blocking read would hang the test: run it on a thread, bounded.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read_regular(&path, MAX_PLUGIN_BYTES).map(|_| ()));
            let _ = tx.send(open_no_follow(&path).map(|_| ()));
        });
        for _ in 0..2 {
            let result = rx.recv_timeout(Duration::from_secs(5)).expect("blocked");
            assert!(
                matches!(result, Err(ReadError::NotRegular { kind: "a FIFO" })),
                "{result:?}"
            );
        }
    }

    #[test]
    fn no_follow_refuses_symlinks_and_folders() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(open_no_follow(&link), Err(ReadError::Symlink)));
        assert!(matches!(
            open_no_follow(dir.path()),
            Err(ReadError::NotRegular {
                kind: "a directory"
            })
        ));
        let (_, meta) = open_no_follow(&target).unwrap();
        assert_eq!(meta.len(), 1);
    }

    #[test]
    fn converts_to_an_io_error_keeping_the_reason() {
        let e: std::io::Error = ReadError::TooLarge { max: 7 }.into();
        assert_eq!(e.to_string(), "larger than the limit of 7 bytes");
        assert!(matches!(
            e.get_ref().and_then(|e| e.downcast_ref::<ReadError>()),
            Some(ReadError::TooLarge { max: 7 })
        ));
    }
}
