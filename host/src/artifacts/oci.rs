//! An OCI registry artifact store. Each version is pushed as the Wasm
//! ecosystem publishes components (`wkg`, Spin, wasmCloud): an image
//! manifest whose config has media type
//! `application/vnd.wasm.config.v0+json` and whose one layer is the
//! component (`application/wasm`), tagged `sha256-<hex>`. Since the
//! layer's digest *is* the plugin's digest, an instance fetches the layer
//! blob by digest directly (one request, no manifest); the tag keeps the
//! blob from the registry's garbage collection.
//!
//! The client carries `[artifacts]`' connect deadline and its first-byte
//! deadline as the read deadline (which also cuts a body that stalls
//! between two reads); the whole call is bounded by
//! [`super::ArtifactStore`].

use async_trait::async_trait;

use oci_client::errors::OciDistributionError;

use super::{ArtifactError, Backend, Deadline, failed, timed_out};
use crate::config::{ArtifactLocation, ArtifactTimeouts};
use crate::files::MAX_PLUGIN_BYTES;
use crate::ids::PluginDigest;

/// The media type of a Wasm component's config in an OCI manifest.
const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The media type of the component layer.
const WASM_LAYER: &str = "application/wasm";

/// An OCI registry.
pub(super) struct Oci {
    client: oci_client::Client,
    registry: String,
    repository: String,
    plain_http: bool,
    timeouts: ArtifactTimeouts,
}

impl Oci {
    pub(super) fn new(
        registry: &str,
        repository: &str,
        plain_http: bool,
        timeouts: ArtifactTimeouts,
    ) -> Self {
        let protocol = if plain_http {
            oci_client::client::ClientProtocol::Http
        } else {
            oci_client::client::ClientProtocol::Https
        };
        Self {
            client: oci_client::Client::new(oci_client::client::ClientConfig {
                protocol,
                connect_timeout: Some(timeouts.connect),
                read_timeout: Some(timeouts.first_byte),
                ..Default::default()
            }),
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            plain_http,
            timeouts,
        }
    }

    /// A failed call as the store's error: the client's connect or read
    /// deadline named as one, anything else kept whole.
    fn failed(&self, e: OciDistributionError) -> ArtifactError {
        let location = self.location();
        match &e {
            OciDistributionError::RequestError(r) if r.is_timeout() && r.is_connect() => {
                timed_out(&location, Deadline::connect(self.timeouts))
            }
            OciDistributionError::RequestError(r) if r.is_timeout() => {
                timed_out(&location, Deadline::first_byte(self.timeouts))
            }
            OciDistributionError::IoError(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                timed_out(&location, Deadline::first_byte(self.timeouts))
            }
            _ => failed(&location, e),
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
impl Backend for Oci {
    async fn store(&self, digest: &PluginDigest, bytes: Vec<u8>) -> Result<(), ArtifactError> {
        let reference = self.reference(digest);
        let config = oci_client::client::Config::new(b"{}".to_vec(), WASM_CONFIG.to_owned(), None);
        let layer = oci_client::client::ImageLayer::new(bytes, WASM_LAYER.to_owned(), None);
        self.client
            .push(&reference, &[layer], config, &Self::auth(), None)
            .await
            .map_err(|e| self.failed(e))?;
        Ok(())
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
            Ok(()) => Ok(bytes),
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
            Err(e) => Err(self.failed(e)),
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
