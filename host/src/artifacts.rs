//! Where plugin versions' bytes live so that every instance can read them:
//! an artifact store, content-addressed by the bytes' sha256 digest
//! ([`PluginDigest`]).
//!
//! # Kinds
//! Named by `[artifacts] location` in the config ([`ArtifactLocation`]):
//! - **a folder** (`/path` or `file:///path`): `<folder>/sha256-<hex>.wasm`,
//!   for one host (or hosts sharing a file system) ([`folder`]);
//! - **S3** (`s3://bucket/prefix`): the object `<prefix>/sha256-<hex>.wasm`,
//!   through the AWS SDK with the host's credentials (`s3:PutObject` for
//!   whoever deploys, `s3:GetObject` for every instance) ([`s3`]);
//! - **an OCI registry** (`oci://host[:port]/repository`, or
//!   `oci+http://…` for a registry on plain HTTP), each version pushed as
//!   the Wasm ecosystem publishes components ([`oci`]).
//!
//! Without `location`, a lease store that lives on one host has a store of
//! its own, so its versions keep their bytes too: the memory store keeps
//! them in the process ([`memory`]), the file store in the folder
//! `<lease file>.artifacts` beside it. A DynamoDB fleet without
//! `location` has none: its only version is the config's plugin that
//! every instance holds, and it can deploy nothing (see
//! `crate::rollout`).
//!
//! # What it promises
//! - **Checked bytes.** [`ArtifactStore::fetch`] never returns bytes whose
//!   sha256 is not the digest asked for, nor more than
//!   [`MAX_PLUGIN_BYTES`]: a blob replaced in the bucket, the registry or
//!   the folder is refused here, before anything compiles it. A folder
//!   never keeps a wrong file under a version's name: storing the version
//!   replaces it.
//! - **No version without its bytes.** [`ArtifactStore::publish`] stores
//!   the bytes, then reads them back by their digest and checks them:
//!   only then may a caller record the version (`crate::rollout`,
//!   `shardlane deploy`).
//! - **Every call bounded.** Connecting, the first byte of an answer (and
//!   any stall between two reads of it) and the whole call each have a
//!   deadline (`[artifacts] connect_timeout`, `first_byte_timeout`,
//!   `transfer_timeout`): a store that refuses, hangs or trickles makes a
//!   call fail within `transfer_timeout`, never wait for ever. Every call
//!   is a future its caller may drop (a shutdown does): a folder's file
//!   calls run on a thread of their own ([`crate::files::on_thread`]), so
//!   a hung network file system holds neither the runtime nor its
//!   shutdown. Retrying is the caller's (with a backoff it can cancel).
//!
//! Floor 3 (sinks and clients) of the crate's layers (see "Layers" in the
//! crate docs): imports only its own floor and those below.

mod folder;
mod memory;
mod oci;
mod s3;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

use crate::cause::Cause;
use crate::config::{ArtifactLocation, ArtifactTimeouts, ArtifactsConfig, LeaseBackend};
use crate::files::MAX_PLUGIN_BYTES;
use crate::ids::PluginDigest;

/// Why a version's bytes could not be stored or fetched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ArtifactError {
    /// The store does not hold the version.
    #[error("{digest} is not in {location}")]
    Missing {
        /// The version.
        digest: PluginDigest,
        /// The store.
        location: String,
    },
    /// The bytes found are not the version asked for.
    #[error("{location} holds other bytes under {expected} (their digest is {found}): refused")]
    WrongDigest {
        /// The version asked for.
        expected: PluginDigest,
        /// The digest of what was found.
        found: PluginDigest,
        /// The store.
        location: String,
    },
    /// More bytes than a plugin may have.
    #[error("{digest} in {location} is larger than {MAX_PLUGIN_BYTES} bytes: refused")]
    TooLarge {
        /// The version.
        digest: PluginDigest,
        /// The store.
        location: String,
    },
    /// One of `[artifacts]`' deadlines ended the call, whichever fired
    /// first: the client's connect or first-byte deadline, or the whole
    /// call's.
    #[error("{location}: no answer within {deadline}")]
    TimedOut {
        /// The store.
        location: String,
        /// The deadline that ended it.
        deadline: Deadline,
    },
    /// The store could not be reached or failed.
    #[error("{location}: {cause}")]
    Failed {
        /// The store.
        location: String,
        /// What failed.
        #[source]
        cause: Cause,
    },
}

/// The deadline that ended a call: its length and the `[artifacts]` key
/// that sets it, shown as `10s ([artifacts] first_byte_timeout)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    /// How long it was.
    pub(crate) after: Duration,
    /// The key (or keys, where the client does not say which fired).
    pub(crate) key: &'static str,
}

impl Deadline {
    /// `connect_timeout`.
    fn connect(timeouts: ArtifactTimeouts) -> Self {
        Self {
            after: timeouts.connect,
            key: "connect_timeout",
        }
    }

    /// `first_byte_timeout`.
    fn first_byte(timeouts: ArtifactTimeouts) -> Self {
        Self {
            after: timeouts.first_byte,
            key: "first_byte_timeout",
        }
    }

    /// Either of the client's own deadlines, when it does not say which
    /// (the AWS SDK's connector); the longer one is shown.
    fn connect_or_first_byte(timeouts: ArtifactTimeouts) -> Self {
        Self {
            after: timeouts.connect.max(timeouts.first_byte),
            key: "connect_timeout or first_byte_timeout",
        }
    }

    /// `transfer_timeout`: the whole call.
    fn transfer(timeouts: ArtifactTimeouts) -> Self {
        Self {
            after: timeouts.transfer,
            key: "transfer_timeout",
        }
    }
}

impl std::fmt::Display for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ([artifacts] {})",
            humantime::format_duration(self.after),
            self.key
        )
    }
}

/// One kind of store, as its module speaks to it; [`ArtifactStore`] bounds
/// and checks every call.
#[async_trait]
trait Backend: Send + Sync + 'static {
    /// Stores `bytes` (whose digest is `digest`) under it: nothing
    /// happens when the store holds them already.
    async fn store(&self, digest: &PluginDigest, bytes: Vec<u8>) -> Result<(), ArtifactError>;

    /// The bytes stored under `digest`, at most [`MAX_PLUGIN_BYTES`] and
    /// one more (the caller checks them).
    async fn fetch(&self, digest: &PluginDigest) -> Result<Vec<u8>, ArtifactError>;

    /// Where it is, for messages and the fleet's record.
    fn location(&self) -> String;
}

/// Where versions' bytes are stored and fetched, every call bounded and
/// every fetch checked (see the module docs).
pub(crate) struct ArtifactStore {
    backend: Box<dyn Backend>,
    timeouts: ArtifactTimeouts,
}

impl ArtifactStore {
    /// The bytes of `digest`, checked against it: one bounded try.
    ///
    /// # Errors
    /// [`ArtifactError`]: missing, other bytes, too large, timed out, or
    /// the store failed.
    pub(crate) async fn fetch(&self, digest: &PluginDigest) -> Result<Vec<u8>, ArtifactError> {
        let bytes = self.bounded(self.backend.fetch(digest)).await?;
        verified(digest, bytes, self.location())
    }

    /// Stores `bytes`, reads them back by their digest and checks them
    /// ("No version without its bytes"); returns the digest.
    ///
    /// # Errors
    /// As [`Self::fetch`], for either step: the version must not be
    /// recorded then.
    pub(crate) async fn publish(&self, bytes: Vec<u8>) -> Result<PluginDigest, ArtifactError> {
        let digest = PluginDigest::of(&bytes);
        self.bounded(self.backend.store(&digest, bytes)).await?;
        self.fetch(&digest).await?;
        Ok(digest)
    }

    /// Where it is (what the fleet's versions record as theirs).
    pub(crate) fn location(&self) -> String {
        self.backend.location()
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, ArtifactError>>,
    ) -> Result<T, ArtifactError> {
        let deadline = Deadline::transfer(self.timeouts);
        tokio::time::timeout(deadline.after, call)
            .await
            .unwrap_or_else(|_| Err(timed_out(&self.location(), deadline)))
    }
}

/// Checks fetched bytes against the digest asked for.
fn verified(
    digest: &PluginDigest,
    bytes: Vec<u8>,
    location: String,
) -> Result<Vec<u8>, ArtifactError> {
    if bytes.len() as u64 > MAX_PLUGIN_BYTES {
        return Err(ArtifactError::TooLarge {
            digest: digest.clone(),
            location,
        });
    }
    let found = PluginDigest::of(&bytes);
    if &found != digest {
        return Err(ArtifactError::WrongDigest {
            expected: digest.clone(),
            found,
            location,
        });
    }
    Ok(bytes)
}

/// The name of a version's bytes in a folder or a bucket.
fn file_name(digest: &PluginDigest) -> String {
    format!("sha256-{}.wasm", digest.hex())
}

fn timed_out(location: &str, deadline: Deadline) -> ArtifactError {
    ArtifactError::TimedOut {
        location: location.to_owned(),
        deadline,
    }
}

fn failed(location: &str, e: impl std::error::Error + Send + Sync + 'static) -> ArtifactError {
    ArtifactError::Failed {
        location: location.to_owned(),
        cause: Cause::new(e),
    }
}

/// The artifact store of a host whose `[artifacts]` is `config` and whose
/// lease store is `lease` (module docs, "Kinds"); `None` for a DynamoDB
/// fleet without `location`. `s3` makes the S3 client when needed.
pub(crate) async fn open<F, Fut>(
    config: &ArtifactsConfig,
    lease: &LeaseBackend,
    s3: F,
) -> Option<ArtifactStore>
where
    F: FnOnce(ArtifactTimeouts) -> Fut,
    Fut: Future<Output = aws_sdk_s3::Client>,
{
    let timeouts = config.timeouts;
    let backend: Box<dyn Backend> = match (&config.location, lease) {
        (Some(ArtifactLocation::Folder(path)), _) => Box::new(folder::Folder::new(path.clone())),
        (Some(ArtifactLocation::S3 { bucket, prefix }), _) => Box::new(s3::S3 {
            client: s3(timeouts).await,
            bucket: bucket.clone(),
            prefix: prefix.clone(),
            timeouts,
        }),
        (
            Some(ArtifactLocation::Oci {
                registry,
                repository,
                plain_http,
            }),
            _,
        ) => Box::new(oci::Oci::new(registry, repository, *plain_http, timeouts)),
        (None, LeaseBackend::Memory) => Box::new(memory::Memory::default()),
        (None, LeaseBackend::File { path }) => {
            Box::new(folder::Folder::new(beside_lease_file(path)))
        }
        (None, LeaseBackend::DynamoDb { .. }) => return None,
    };
    Some(ArtifactStore { backend, timeouts })
}

/// The file store's own artifact folder: `<lease file>.artifacts`.
fn beside_lease_file(path: &std::path::Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".artifacts");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests;
