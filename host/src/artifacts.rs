//! Where plugin versions' bytes live so that every instance can read them:
//! an artifact store, content-addressed by the bytes' sha256 digest
//! ([`PluginDigest`]).
//!
//! Three kinds, named by `[artifacts] location` in the config
//! ([`ArtifactLocation`]):
//! - **a folder** (`/path` or `file:///path`): `<folder>/sha256-<hex>.wasm`,
//!   for one host (or hosts sharing a file system);
//! - **S3** (`s3://bucket/prefix`): the object `<prefix>/sha256-<hex>.wasm`,
//!   through the AWS SDK with the host's credentials (`s3:PutObject` for
//!   `shardlane deploy`, `s3:GetObject` for every instance);
//! - **an OCI registry** (`oci://host[:port]/repository`, or
//!   `oci+http://…` for a registry on plain HTTP): each version is pushed
//!   as the Wasm ecosystem publishes components (`wkg`, Spin, wasmCloud): an
//!   image manifest whose config has media type
//!   `application/vnd.wasm.config.v0+json` and whose one layer is the
//!   component (`application/wasm`), tagged `sha256-<hex>`. Since the
//!   layer's digest *is* the plugin's digest, an instance fetches the
//!   layer blob by digest directly (one request, no manifest); the tag keeps
//!   the blob from the registry's garbage collection.
//!
//! Whatever the kind, [`ArtifactStore::fetch`] never returns bytes whose
//! sha256 is not the digest asked for, nor more than
//! [`MAX_PLUGIN_BYTES`]: a blob replaced in the bucket or the registry is
//! refused here, before anything compiles it.
//!
//! Floor 3 (sinks and clients) of the crate's layers (see "Layers" in the
//! crate docs): imports only its own floor and those below.

use std::path::PathBuf;

use async_trait::async_trait;

use crate::cause::Cause;
use crate::config::ArtifactLocation;
use crate::files::{self, MAX_PLUGIN_BYTES};
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

/// Where versions' bytes are stored and fetched (see the module docs).
#[async_trait]
pub(crate) trait ArtifactStore: Send + Sync + 'static {
    /// Stores `bytes` under their digest (nothing happens when it is there
    /// already) and returns the digest.
    async fn store(&self, bytes: Vec<u8>) -> Result<PluginDigest, ArtifactError>;

    /// The bytes of `digest`, checked against it.
    async fn fetch(&self, digest: &PluginDigest) -> Result<Vec<u8>, ArtifactError>;

    /// Where it is, for messages.
    fn location(&self) -> String;
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

/// Opens the store at `location`; `s3` makes the S3 client when needed.
pub(crate) async fn open<F, Fut>(location: &ArtifactLocation, s3: F) -> Box<dyn ArtifactStore>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = aws_sdk_s3::Client>,
{
    match location {
        ArtifactLocation::Folder(path) => Box::new(Folder { path: path.clone() }),
        ArtifactLocation::S3 { bucket, prefix } => Box::new(S3 {
            client: s3().await,
            bucket: bucket.clone(),
            prefix: prefix.clone(),
        }),
        ArtifactLocation::Oci {
            registry,
            repository,
            plain_http,
        } => Box::new(Oci::new(registry, repository, *plain_http)),
    }
}

/// A local folder.
struct Folder {
    path: PathBuf,
}

#[async_trait]
impl ArtifactStore for Folder {
    async fn store(&self, bytes: Vec<u8>) -> Result<PluginDigest, ArtifactError> {
        let digest = PluginDigest::of(&bytes);
        let (dir, name) = (self.path.clone(), file_name(&digest));
        let location = self.location();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let target = dir.join(&name);
            if target.exists() {
                return Ok(());
            }
            // Written aside and renamed: a reader never sees half a file.
            let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
            std::io::Write::write_all(&mut tmp, &bytes)?;
            tmp.as_file().sync_all()?;
            tmp.persist(&target).map_err(|e| e.error)?;
            Ok(())
        })
        .await
        .map_err(|e| failed(&location, e))?
        .map_err(|e| failed(&location, e))?;
        Ok(digest)
    }

    async fn fetch(&self, digest: &PluginDigest) -> Result<Vec<u8>, ArtifactError> {
        let path = self.path.join(file_name(digest));
        let location = self.location();
        let read =
            tokio::task::spawn_blocking(move || files::read_regular(&path, MAX_PLUGIN_BYTES))
                .await
                .map_err(|e| failed(&location, e))?;
        match read {
            Ok(bytes) => verified(digest, bytes, location),
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

fn failed(location: &str, e: impl std::error::Error + Send + Sync + 'static) -> ArtifactError {
    ArtifactError::Failed {
        location: location.to_owned(),
        cause: Cause::new(e),
    }
}

/// An S3 bucket.
struct S3 {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
}

impl S3 {
    fn key(&self, digest: &PluginDigest) -> String {
        if self.prefix.is_empty() {
            file_name(digest)
        } else {
            format!("{}/{}", self.prefix, file_name(digest))
        }
    }
}

#[async_trait]
impl ArtifactStore for S3 {
    async fn store(&self, bytes: Vec<u8>) -> Result<PluginDigest, ArtifactError> {
        let digest = PluginDigest::of(&bytes);
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(self.key(&digest))
            .content_type("application/wasm")
            .body(bytes.into())
            .send()
            .await
            .map_err(|e| failed(&self.location(), e))?;
        Ok(digest)
    }

    async fn fetch(&self, digest: &PluginDigest) -> Result<Vec<u8>, ArtifactError> {
        let location = self.location();
        let output = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.key(digest))
            .send()
            .await
        {
            Ok(output) => output,
            Err(e) if e.as_service_error().is_some_and(|e| e.is_no_such_key()) => {
                return Err(ArtifactError::Missing {
                    digest: digest.clone(),
                    location,
                });
            }
            Err(e) => return Err(failed(&location, e)),
        };
        if output
            .content_length()
            .is_some_and(|n| n < 0 || n as u64 > MAX_PLUGIN_BYTES)
        {
            return Err(ArtifactError::TooLarge {
                digest: digest.clone(),
                location,
            });
        }
        // Read at most the limit (and one byte more), whatever the length
        // said: the body is a stream.
        let mut body = output.body.into_async_read();
        let mut bytes = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(
            &mut tokio::io::AsyncReadExt::take(&mut body, MAX_PLUGIN_BYTES + 1),
            &mut bytes,
        )
        .await
        .map_err(|e| failed(&location, e))?;
        verified(digest, bytes, location)
    }

    fn location(&self) -> String {
        ArtifactLocation::S3 {
            bucket: self.bucket.clone(),
            prefix: self.prefix.clone(),
        }
        .to_string()
    }
}

/// The media type of a Wasm component's config in an OCI manifest.
const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The media type of the component layer.
const WASM_LAYER: &str = "application/wasm";

/// An OCI registry.
struct Oci {
    client: oci_client::Client,
    registry: String,
    repository: String,
    plain_http: bool,
}

impl Oci {
    fn new(registry: &str, repository: &str, plain_http: bool) -> Self {
        let protocol = if plain_http {
            oci_client::client::ClientProtocol::Http
        } else {
            oci_client::client::ClientProtocol::Https
        };
        Self {
            client: oci_client::Client::new(oci_client::client::ClientConfig {
                protocol,
                ..Default::default()
            }),
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            plain_http,
        }
    }

    fn reference(&self, digest: &PluginDigest) -> oci_client::Reference {
        oci_client::Reference::with_tag(
            self.registry.clone(),
            self.repository.clone(),
            format!("sha256-{}", digest.hex()),
        )
    }

    /// Anonymous access, or `SHARDLANE_OCI_USERNAME` and
    /// `SHARDLANE_OCI_PASSWORD` (a registry token) when both are set.
    fn auth() -> oci_client::secrets::RegistryAuth {
        match (
            std::env::var("SHARDLANE_OCI_USERNAME"),
            std::env::var("SHARDLANE_OCI_PASSWORD"),
        ) {
            (Ok(user), Ok(password)) => oci_client::secrets::RegistryAuth::Basic(user, password),
            _ => oci_client::secrets::RegistryAuth::Anonymous,
        }
    }
}

#[async_trait]
impl ArtifactStore for Oci {
    async fn store(&self, bytes: Vec<u8>) -> Result<PluginDigest, ArtifactError> {
        let digest = PluginDigest::of(&bytes);
        let reference = self.reference(&digest);
        let config = oci_client::client::Config::new(b"{}".to_vec(), WASM_CONFIG.to_owned(), None);
        let layer = oci_client::client::ImageLayer::new(bytes, WASM_LAYER.to_owned(), None);
        self.client
            .push(&reference, &[layer], config, &Self::auth(), None)
            .await
            .map_err(|e| failed(&self.location(), e))?;
        Ok(digest)
    }

    async fn fetch(&self, digest: &PluginDigest) -> Result<Vec<u8>, ArtifactError> {
        let location = self.location();
        let reference = self.reference(digest);
        self.client
            .store_auth_if_needed(reference.resolve_registry(), &Self::auth())
            .await;
        let descriptor = oci_client::manifest::OciDescriptor {
            media_type: WASM_LAYER.to_owned(),
            digest: digest.to_string(),
            size: 0,
            ..Default::default()
        };
        let mut bytes = Vec::new();
        // A limited writer: a registry sending more than a plugin may hold
        // is cut off, not buffered.
        let mut out = Limited {
            bytes: &mut bytes,
            room: MAX_PLUGIN_BYTES + 1,
        };
        match self
            .client
            .pull_blob(&reference, &descriptor, &mut out)
            .await
        {
            Ok(()) => verified(digest, bytes, location),
            Err(e) if blob_unknown(&e) => Err(ArtifactError::Missing {
                digest: digest.clone(),
                location,
            }),
            Err(e) if out.room == 0 => {
                drop(e);
                Err(ArtifactError::TooLarge {
                    digest: digest.clone(),
                    location,
                })
            }
            // The client checks the blob against the digest as it reads:
            // other bytes under it fail here.
            Err(oci_client::errors::OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError { .. },
            )) => Err(ArtifactError::WrongDigest {
                expected: digest.clone(),
                found: PluginDigest::of(&bytes),
                location,
            }),
            Err(e) => Err(failed(&location, e)),
        }
    }

    fn location(&self) -> String {
        ArtifactLocation::Oci {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            plain_http: self.plain_http,
        }
        .to_string()
    }
}

/// Whether a registry said it has no such blob (or repository).
fn blob_unknown(e: &oci_client::errors::OciDistributionError) -> bool {
    use oci_client::errors::{OciDistributionError, OciErrorCode};
    match e {
        OciDistributionError::ServerError { code: 404, .. } => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::BlobUnknown
                    | OciErrorCode::NameUnknown
                    | OciErrorCode::ManifestUnknown
            )
        }),
        _ => false,
    }
}

/// An `AsyncWrite` into a vector that refuses more than `room` bytes.
struct Limited<'a> {
    bytes: &'a mut Vec<u8>,
    room: u64,
}

impl tokio::io::AsyncWrite for Limited<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.room {
            self.room = 0;
            return std::task::Poll::Ready(Err(std::io::Error::other(
                "larger than a plugin may be",
            )));
        }
        self.room -= buf.len() as u64;
        self.bytes.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a folder store that hands out bytes that are not the
    /// version asked for (replaced on disk), or that reports a missing
    /// version as a failure to reach the store.
    #[tokio::test]
    async fn a_folder_store_checks_what_it_hands_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = Folder {
            path: dir.path().join("artifacts"),
        };
        let digest = store.store(b"component bytes".to_vec()).await.unwrap();
        assert_eq!(digest, PluginDigest::of(b"component bytes"));
        assert_eq!(store.fetch(&digest).await.unwrap(), b"component bytes");
        // The same bytes again change nothing.
        assert_eq!(
            store.store(b"component bytes".to_vec()).await.unwrap(),
            digest
        );
        std::fs::write(
            dir.path().join("artifacts").join(file_name(&digest)),
            b"other",
        )
        .unwrap();
        assert!(matches!(
            store.fetch(&digest).await,
            Err(ArtifactError::WrongDigest { found, .. }) if found == PluginDigest::of(b"other")
        ));
        assert!(matches!(
            store.fetch(&PluginDigest::of(b"never stored")).await,
            Err(ArtifactError::Missing { .. })
        ));
    }
}
