//! An S3 artifact store: the object `<prefix>/sha256-<hex>.wasm`, through
//! the AWS SDK with the host's credentials. The client carries
//! `[artifacts]`' connect and first-byte deadlines and the whole call as
//! its operation deadline (`crate::kinesis::s3_client`); the body, which
//! the SDK streams after the answer's head, is read within the store's
//! overall deadline ([`super::ArtifactStore`]) and never past the size a
//! plugin may have.

use async_trait::async_trait;

use aws_sdk_s3::error::SdkError;

use super::{ArtifactError, Backend, Deadline, failed, file_name, timed_out};
use crate::config::{ArtifactLocation, ArtifactTimeouts};
use crate::files::MAX_PLUGIN_BYTES;
use crate::ids::PluginDigest;

/// An S3 bucket.
pub(super) struct S3 {
    pub(super) client: aws_sdk_s3::Client,
    pub(super) bucket: String,
    pub(super) prefix: String,
    /// The deadlines the client carries, to name the one that fired.
    pub(super) timeouts: ArtifactTimeouts,
}

impl S3 {
    fn key(&self, digest: &PluginDigest) -> String {
        if self.prefix.is_empty() {
            file_name(digest)
        } else {
            format!("{}/{}", self.prefix, file_name(digest))
        }
    }

    /// A failed call as the store's error: a deadline of the client's
    /// named as one, anything else kept whole.
    fn failed<E, R>(&self, e: SdkError<E, R>) -> ArtifactError
    where
        E: std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        let location = self.location();
        match &e {
            SdkError::TimeoutError(_) => timed_out(&location, Deadline::transfer(self.timeouts)),
            SdkError::DispatchFailure(d) if d.is_timeout() => {
                timed_out(&location, Deadline::connect_or_first_byte(self.timeouts))
            }
            _ => failed(&location, e),
        }
    }
}

#[async_trait]
impl Backend for S3 {
    async fn store(&self, digest: &PluginDigest, bytes: Vec<u8>) -> Result<(), ArtifactError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(self.key(digest))
            .content_type("application/wasm")
            .body(bytes.into())
            .send()
            .await
            .map_err(|e| self.failed(e))?;
        Ok(())
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
            Err(e) => return Err(self.failed(e)),
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
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut => {
                timed_out(&location, Deadline::first_byte(self.timeouts))
            }
            _ => failed(&location, e),
        })?;
        Ok(bytes)
    }

    fn location(&self) -> String {
        ArtifactLocation::S3 {
            bucket: self.bucket.clone(),
            prefix: self.prefix.clone(),
        }
        .to_string()
    }
}
