//! `[artifacts] location`: where plugin versions' bytes are kept (the
//! artifact store itself is `crate::artifacts`, a floor up).

use std::fmt;
use std::path::{Path, PathBuf};

/// Where the artifact store is (see `crate::artifacts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArtifactLocation {
    /// A local folder.
    Folder(PathBuf),
    /// An S3 bucket and key prefix (no trailing `/`).
    S3 {
        /// The bucket.
        bucket: String,
        /// The key prefix; empty for the bucket's root.
        prefix: String,
    },
    /// An OCI registry and repository.
    Oci {
        /// `host[:port]`.
        registry: String,
        /// The repository, e.g. `team/orders-handler`.
        repository: String,
        /// Plain HTTP (`oci+http://`), for a registry on loopback.
        plain_http: bool,
    },
}

/// Why a location does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not an artifact location: {1}")]
pub struct LocationError(String, &'static str);

impl ArtifactLocation {
    /// Reads `s3://bucket/prefix`, `oci://host/repo`, `oci+http://host/repo`,
    /// `file:///path` or a path (relative paths are taken from `base`).
    ///
    /// # Errors
    /// A URL of another scheme, or one missing its bucket or repository.
    pub fn parse(value: &str, base: &Path) -> Result<Self, LocationError> {
        let bad = |why| Err(LocationError(value.to_owned(), why));
        if let Some(rest) = value.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return bad("no bucket (expected s3://bucket/prefix)");
            }
            return Ok(Self::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
            });
        }
        for (scheme, plain_http) in [("oci://", false), ("oci+http://", true)] {
            if let Some(rest) = value.strip_prefix(scheme) {
                let Some((registry, repository)) = rest.split_once('/') else {
                    return bad("no repository (expected oci://host[:port]/repository)");
                };
                let repository = repository.trim_matches('/');
                if registry.is_empty() || repository.is_empty() {
                    return bad(
                        "no registry or repository (expected oci://host[:port]/repository)",
                    );
                }
                if repository
                    .bytes()
                    .any(|b| b.is_ascii_uppercase() || b == b':' || b == b'@')
                {
                    return bad("a repository is lowercase, without a tag or digest");
                }
                return Ok(Self::Oci {
                    registry: registry.to_owned(),
                    repository: repository.to_owned(),
                    plain_http,
                });
            }
        }
        let path = value.strip_prefix("file://").unwrap_or(value);
        if path.is_empty() {
            return bad("empty");
        }
        if path.contains("://") {
            return bad("unknown scheme: use s3://, oci://, oci+http:// or a folder");
        }
        Ok(Self::Folder(base.join(path)))
    }
}

impl fmt::Display for ArtifactLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Folder(path) => write!(f, "{}", path.display()),
            Self::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Self::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            Self::Oci {
                registry,
                repository,
                plain_http,
            } => {
                let scheme = if *plain_http { "oci+http" } else { "oci" };
                write!(f, "{scheme}://{registry}/{repository}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a location read as the wrong kind, or a bad one accepted
    /// (a deploy would then store the bytes nowhere an instance looks).
    #[test]
    fn locations_parse_by_scheme() {
        let base = Path::new("/etc/shardlane");
        assert_eq!(
            ArtifactLocation::parse("s3://team-artifacts/shardlane/orders/", base).unwrap(),
            ArtifactLocation::S3 {
                bucket: "team-artifacts".into(),
                prefix: "shardlane/orders".into()
            }
        );
        assert_eq!(
            ArtifactLocation::parse("oci+http://127.0.0.1:5000/team/orders", base).unwrap(),
            ArtifactLocation::Oci {
                registry: "127.0.0.1:5000".into(),
                repository: "team/orders".into(),
                plain_http: true
            }
        );
        assert_eq!(
            ArtifactLocation::parse("artifacts", base).unwrap(),
            ArtifactLocation::Folder("/etc/shardlane/artifacts".into())
        );
        for bad in [
            "s3://",
            "oci://registry",
            "oci://r/Team:1",
            "http://x/y",
            "",
        ] {
            assert!(ArtifactLocation::parse(bad, base).is_err(), "{bad}");
        }
        let s3 = ArtifactLocation::parse("s3://b/p", base).unwrap();
        assert_eq!(s3.to_string(), "s3://b/p");
    }
}
