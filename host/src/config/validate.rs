//! Validation: the file as written ([`super::raw`]) into the typed
//! [`Config`], one small check per section and key, each error one line
//! naming the file and the key.
//!
//! Sections are checked in the order an operator reads the file's effects:
//! `[lease]`, each `[[subscription]]` (its reading, dispatch, batches,
//! failure policy, sandbox and canary), `[admin]`, `[engine]`, `[aws]`; the
//! first bad key stops validation.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ids::StreamArnParts;

use super::raw::{
    RawAdmin, RawArtifacts, RawAws, RawConfig, RawEngine, RawLease, RawMetrics, RawSubscription,
    RawTraces,
};
use super::{
    AdminConfig, ArtifactLocation, ArtifactTimeouts, ArtifactsConfig, AssumeRole, AwsConfig,
    AwsTimeouts, Config, ConfigError, EmfConfig, EmfTarget, LeaseBackend, LeaseConfig,
    LeaseStoreKind, SubscriptionConfig, TracesConfig, default_cache_dir, defaults, parse_size,
};

mod subscription;

use subscription::Subscription;

/// Validates one file's raw config.
pub(super) struct Validator<'a> {
    pub(super) file: &'a Path,
}

/// The compile cache folder and pool size of `[engine]`.
type Engine = (Option<PathBuf>, u32);

impl Validator<'_> {
    fn invalid(&self, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            key: key.into(),
            message: message.into(),
        }
    }

    /// The whole config, section by section (module docs).
    pub(super) fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let lease = self.lease(&raw.lease)?;
        let subscriptions = self.subscriptions(raw.subscriptions)?;
        let emf = self.emf(&raw.metrics)?;
        let admin = self.admin(raw.admin, raw.metrics)?;
        let (compile_cache, max_core_instances) = self.engine(&raw.engine)?;
        let aws = self.aws(raw.aws)?;
        self.stream_arns(&aws, &subscriptions)?;
        self.state_fits(&lease, &subscriptions)?;
        let traces = self.traces(&raw.traces)?;
        let artifacts = self.artifacts(&raw.artifacts)?;
        Ok(Config {
            artifacts,
            emf,
            traces,
            compile_cache,
            max_core_instances,
            admin,
            aws,
            lease,
            subscriptions,
        })
    }

    /// The `[artifacts]` table: where, and how long a call may take.
    fn artifacts(&self, raw: &RawArtifacts) -> Result<ArtifactsConfig, ConfigError> {
        let location = raw
            .location
            .as_deref()
            .map(|l| {
                let base = self.file.parent().unwrap_or(Path::new("."));
                ArtifactLocation::parse(l, base)
                    .map_err(|e| self.invalid("artifacts.location", e.to_string()))
            })
            .transpose()?;
        let timeouts = ArtifactTimeouts {
            connect: self.duration(
                "artifacts.connect_timeout",
                raw.connect_timeout.as_deref(),
                defaults::ARTIFACT_CONNECT_TIMEOUT,
            )?,
            first_byte: self.duration(
                "artifacts.first_byte_timeout",
                raw.first_byte_timeout.as_deref(),
                defaults::ARTIFACT_FIRST_BYTE_TIMEOUT,
            )?,
            transfer: self.duration(
                "artifacts.transfer_timeout",
                raw.transfer_timeout.as_deref(),
                defaults::ARTIFACT_TRANSFER_TIMEOUT,
            )?,
        };
        for (key, shorter) in [
            ("artifacts.connect_timeout", timeouts.connect),
            ("artifacts.first_byte_timeout", timeouts.first_byte),
        ] {
            if shorter > timeouts.transfer {
                return Err(self.invalid(
                    key,
                    format!(
                        "{} is longer than artifacts.transfer_timeout ({}), which bounds the whole call",
                        humantime::format_duration(shorter),
                        humantime::format_duration(timeouts.transfer)
                    ),
                ));
            }
        }
        Ok(ArtifactsConfig { location, timeouts })
    }

    /// With the DynamoDB store a key's state is one item, which holds its
    /// committed and its pending state in at most 400 KB.
    fn state_fits(
        &self,
        lease: &LeaseConfig,
        subscriptions: &[SubscriptionConfig],
    ) -> Result<(), ConfigError> {
        if !matches!(lease.store, LeaseBackend::DynamoDb { .. }) {
            return Ok(());
        }
        for (i, sub) in subscriptions.iter().enumerate() {
            if let Some(state) = &sub.sandbox.grants.state
                && state.max_per_key > defaults::STATE_MAX_PER_KEY_DYNAMODB
            {
                return Err(self.invalid(
                    format!("subscription[{i}].state.max_per_key"),
                    format!(
                        "{} bytes is more than the dynamodb store holds per key ({} bytes: a key's item holds its committed and its pending state, at most 400 KB)",
                        state.max_per_key,
                        defaults::STATE_MAX_PER_KEY_DYNAMODB
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Streams named by ARN (`stream`, `dead_letter_stream`, `outputs`):
    /// a Kinesis stream ARN, in `[aws] region` when that is set (calls go
    /// to that region's endpoint).
    fn stream_arns(
        &self,
        aws: &AwsConfig,
        subscriptions: &[SubscriptionConfig],
    ) -> Result<(), ConfigError> {
        for (i, sub) in subscriptions.iter().enumerate() {
            let dead_letter = sub.failure.on_failure.dead_letter_stream();
            let named = std::iter::once(("stream", &sub.stream))
                .chain(dead_letter.map(|s| ("dead_letter_stream", s)))
                .chain(sub.sandbox.grants.outputs.iter().map(|s| ("outputs", s)));
            for (key, stream) in named {
                if !stream.is_arn() {
                    continue;
                }
                let key = format!("subscription[{i}].{key}");
                let Some(StreamArnParts { region, .. }) = stream.arn_parts() else {
                    return Err(self.invalid(
                        &key,
                        format!("{:?} is not a Kinesis stream ARN: arn:aws:kinesis:REGION:ACCOUNT_ID:stream/NAME", stream.as_str()),
                    ));
                };
                if let Some(configured) = &aws.region
                    && configured != region
                {
                    return Err(self.invalid(
                        &key,
                        format!("the stream is in region {region} but [aws] region is {configured}: calls go to one region's endpoint"),
                    ));
                }
            }
        }
        Ok(())
    }

    // ---- values

    fn duration(
        &self,
        key: &str,
        value: Option<&str>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let Some(value) = value else {
            return Ok(default);
        };
        let parsed = humantime::parse_duration(value).map_err(|e| {
            self.invalid(
                key,
                format!("{value:?} is not a duration ({e}); write e.g. \"200ms\", \"5s\", \"1m\""),
            )
        })?;
        if parsed.is_zero() {
            return Err(self.invalid(key, format!("{value:?} must be longer than zero")));
        }
        Ok(parsed)
    }

    /// A size of at least `min` bytes (`min_text` in words), or `default`;
    /// `example` shows how to write one.
    fn size(
        &self,
        key: &str,
        value: Option<&str>,
        default: usize,
        (min, min_text): (usize, &str),
        example: &str,
    ) -> Result<usize, ConfigError> {
        let Some(text) = value else {
            return Ok(default);
        };
        match parse_size(text) {
            Some(bytes) if bytes >= min => Ok(bytes),
            Some(_) => {
                Err(self.invalid(key, format!("{text:?} is too small: at least {min_text}")))
            }
            None => Err(self.invalid(key, format!("{text:?} is not a size; write e.g. {example}"))),
        }
    }

    /// An integer in `range`, or `default`; `describe` says the range.
    fn count(
        &self,
        key: &str,
        value: Option<i64>,
        default: u32,
        range: std::ops::RangeInclusive<i64>,
        describe: &str,
    ) -> Result<u32, ConfigError> {
        match value {
            None => Ok(default),
            Some(n) if range.contains(&n) => Ok(n as u32),
            Some(n) => Err(self.invalid(key, format!("{n} is out of range: {describe}"))),
        }
    }

    // ---- [lease]

    fn lease(&self, raw: &RawLease) -> Result<LeaseConfig, ConfigError> {
        let store = self.lease_store(raw)?;
        if raw.owner_id.as_deref().is_some_and(|o| o.trim().is_empty()) {
            return Err(self.invalid("lease.owner_id", "must not be empty"));
        }
        let lease = LeaseConfig {
            store,
            owner_id: raw.owner_id.clone(),
            lease_duration: self.duration(
                "lease.lease_duration",
                raw.lease_duration.as_deref(),
                defaults::LEASE_DURATION,
            )?,
            renew_every: self.duration(
                "lease.renew_every",
                raw.renew_every.as_deref(),
                defaults::RENEW_EVERY,
            )?,
            shard_sync_every: self.duration(
                "lease.shard_sync_every",
                raw.shard_sync_every.as_deref(),
                defaults::SHARD_SYNC_EVERY,
            )?,
            max_leases_per_instance: match raw.max_leases_per_instance {
                None => None,
                Some(n) => Some(self.count(
                    "lease.max_leases_per_instance",
                    Some(n),
                    0,
                    1..=100_000,
                    "at least 1",
                )? as usize),
            },
        };
        if lease.renew_every >= lease.lease_duration {
            return Err(self.invalid(
                "lease.renew_every",
                format!(
                    "must be shorter than lease.lease_duration ({}), or leases lapse between renewals",
                    humantime::format_duration(lease.lease_duration)
                ),
            ));
        }
        Ok(lease)
    }

    /// `store` and the keys that belong to it (and only to it).
    fn lease_store(&self, raw: &RawLease) -> Result<LeaseBackend, ConfigError> {
        let store = match raw.store.unwrap_or(LeaseStoreKind::File) {
            LeaseStoreKind::Memory => LeaseBackend::Memory,
            LeaseStoreKind::File => LeaseBackend::File {
                path: raw
                    .path
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(defaults::FILE_STORE_PATH)),
            },
            LeaseStoreKind::Dynamodb => match raw.table.clone() {
                Some(table) if !table.trim().is_empty() => LeaseBackend::DynamoDb {
                    table,
                    create_table: raw.create_table.unwrap_or(false),
                },
                _ => {
                    return Err(
                        self.invalid("lease.table", "store = \"dynamodb\" needs the table's name")
                    );
                }
            },
        };
        if raw.path.is_some() && !matches!(store, LeaseBackend::File { .. }) {
            return Err(self.invalid("lease.path", "only applies to store = \"file\""));
        }
        if (raw.table.is_some() || raw.create_table.is_some())
            && !matches!(store, LeaseBackend::DynamoDb { .. })
        {
            let key = if raw.table.is_some() {
                "lease.table"
            } else {
                "lease.create_table"
            };
            return Err(self.invalid(key, "only applies to store = \"dynamodb\""));
        }
        Ok(store)
    }

    // ---- [[subscription]]

    fn subscriptions(
        &self,
        raw: Vec<RawSubscription>,
    ) -> Result<Vec<SubscriptionConfig>, ConfigError> {
        if raw.is_empty() {
            return Err(self.invalid(
                "subscription",
                "no [[subscription]] block: there is nothing to run",
            ));
        }
        let mut names = HashSet::new();
        let mut subscriptions = Vec::with_capacity(raw.len());
        for (i, sub) in raw.into_iter().enumerate() {
            let at = Subscription { v: self, i };
            if sub.name.trim().is_empty() {
                return Err(at.invalid("name", "must not be empty"));
            }
            if !names.insert(sub.name.clone()) {
                return Err(at.invalid(
                    "name",
                    format!(
                        "{:?} is used by another subscription; names key leases and must be unique",
                        sub.name
                    ),
                ));
            }
            subscriptions.push(at.check(sub)?);
        }
        Ok(subscriptions)
    }

    // ---- [admin], [engine], [aws]

    fn admin(&self, raw: RawAdmin, metrics: RawMetrics) -> Result<AdminConfig, ConfigError> {
        let listen = self.listen(
            "admin.listen",
            raw.listen.as_deref().unwrap_or(defaults::ADMIN_LISTEN),
        )?;
        let metrics_listen = match metrics.listen.as_deref() {
            None => None,
            Some(addr) => self.listen("metrics.listen", addr)?,
        };
        if let (Some(admin), Some(metrics)) = (listen, metrics_listen)
            && admin == metrics
            && admin.port() != 0
        {
            return Err(self.invalid(
                "metrics.listen",
                format!("{metrics} is admin.listen too: give each its own port, or leave metrics.listen out to serve both on one"),
            ));
        }
        let token = raw
            .token
            .or_else(|| std::env::var("SHARDLANE_ADMIN_TOKEN").ok())
            .filter(|t| !t.trim().is_empty());
        Ok(AdminConfig {
            listen,
            metrics_listen,
            token,
        })
    }

    /// `[metrics] emf` (`"stdout"` or a file path), `emf_every` (60 s) and
    /// `emf_namespace` (`shardlane`).
    fn emf(&self, raw: &RawMetrics) -> Result<Option<EmfConfig>, ConfigError> {
        let Some(to) = raw.emf.as_deref() else {
            for (key, set) in [
                ("metrics.emf_every", raw.emf_every.is_some()),
                ("metrics.emf_namespace", raw.emf_namespace.is_some()),
            ] {
                if set {
                    return Err(self.invalid(key, "needs metrics.emf (\"stdout\" or a file path)"));
                }
            }
            return Ok(None);
        };
        let to = match to.trim() {
            "" => {
                return Err(
                    self.invalid("metrics.emf", "is empty: write \"stdout\" or a file path")
                );
            }
            "stdout" => EmfTarget::Stdout,
            path => EmfTarget::File(PathBuf::from(path)),
        };
        let every = self.duration(
            "metrics.emf_every",
            raw.emf_every.as_deref(),
            defaults::EMF_EVERY,
        )?;
        let namespace = raw
            .emf_namespace
            .clone()
            .unwrap_or_else(|| "shardlane".to_owned());
        // CloudWatch: 1 to 255 characters, none of them a colon.
        if namespace.is_empty() || namespace.len() > 255 || namespace.contains(':') {
            return Err(self.invalid(
                "metrics.emf_namespace",
                format!(
                    "{namespace:?} is not a CloudWatch namespace (1 to 255 characters, no ':')"
                ),
            ));
        }
        Ok(Some(EmfConfig {
            to,
            every,
            namespace,
        }))
    }

    /// `[traces]`: an OTLP/HTTP endpoint (the collector's base URL, e.g.
    /// `http://127.0.0.1:4318`), or nothing.
    fn traces(&self, raw: &RawTraces) -> Result<Option<TracesConfig>, ConfigError> {
        let Some(endpoint) = raw.otlp_endpoint.as_deref() else {
            if raw.service_name.is_some() {
                return Err(self.invalid(
                    "traces.service_name",
                    "needs traces.otlp_endpoint: spans go nowhere without one",
                ));
            }
            return Ok(None);
        };
        let base = endpoint.trim_end_matches('/');
        let valid = base
            .strip_prefix("http://")
            .or_else(|| base.strip_prefix("https://"))
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace));
        if !valid {
            return Err(self.invalid(
                "traces.otlp_endpoint",
                format!(
                    "{endpoint:?} is not an http:// or https:// URL, e.g. \"http://127.0.0.1:4318\""
                ),
            ));
        }
        let traces_url = if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        };
        Ok(Some(TracesConfig {
            traces_url,
            service_name: raw
                .service_name
                .clone()
                .unwrap_or_else(|| "shardlane".to_owned()),
        }))
    }

    /// A listen address, or `"off"`.
    fn listen(&self, key: &str, addr: &str) -> Result<Option<SocketAddr>, ConfigError> {
        match addr {
            "off" => Ok(None),
            addr => addr.parse().map(Some).map_err(|e| {
                self.invalid(
                    key,
                    format!("{addr:?} is not an address like \"127.0.0.1:9090\" or \"off\" ({e})"),
                )
            }),
        }
    }

    fn engine(&self, raw: &RawEngine) -> Result<Engine, ConfigError> {
        let compile_cache = match raw.cache_dir.as_deref() {
            Some("off") => None,
            Some(dir) => Some(PathBuf::from(dir)),
            None => default_cache_dir(),
        };
        let max_core_instances = self.count(
            "engine.max_core_instances",
            raw.max_core_instances,
            defaults::MAX_CORE_INSTANCES,
            1..=i64::from(defaults::MAX_CORE_INSTANCES_LIMIT),
            &format!("1 to {}", defaults::MAX_CORE_INSTANCES_LIMIT),
        )?;
        Ok((compile_cache, max_core_instances))
    }

    fn aws(&self, raw: RawAws) -> Result<AwsConfig, ConfigError> {
        if raw.profile.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err(self.invalid("aws.profile", "must not be empty"));
        }
        let timeouts = self.aws_timeouts(&raw)?;
        let role = match (raw.role_arn, raw.external_id) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(self.invalid(
                    "aws.external_id",
                    "is for assuming a role: set aws.role_arn too",
                ));
            }
            (Some(arn), external_id) => {
                let valid = arn.starts_with("arn:")
                    && arn.split(':').nth(2) == Some("iam")
                    && arn
                        .split(':')
                        .nth(5)
                        .is_some_and(|r| r.starts_with("role/"));
                if !valid {
                    return Err(self.invalid(
                        "aws.role_arn",
                        format!("{arn:?} is not a role ARN: arn:aws:iam::ACCOUNT_ID:role/NAME"),
                    ));
                }
                Some(AssumeRole { arn, external_id })
            }
        };
        Ok(AwsConfig {
            timeouts,
            profile: raw.profile,
            role,
            region: raw.region,
            endpoint_url: raw.endpoint_url,
            dynamodb_endpoint_url: raw.dynamodb_endpoint_url,
        })
    }

    /// `[aws]`'s deadlines: each within the next (connect and read within
    /// an attempt, an attempt within a call).
    fn aws_timeouts(&self, raw: &RawAws) -> Result<AwsTimeouts, ConfigError> {
        let t = AwsTimeouts {
            connect: self.duration(
                "aws.connect_timeout",
                raw.connect_timeout.as_deref(),
                defaults::CONNECT_TIMEOUT,
            )?,
            read: self.duration(
                "aws.read_timeout",
                raw.read_timeout.as_deref(),
                defaults::READ_TIMEOUT,
            )?,
            attempt: self.duration(
                "aws.attempt_timeout",
                raw.attempt_timeout.as_deref(),
                defaults::ATTEMPT_TIMEOUT,
            )?,
            call: self.duration(
                "aws.call_timeout",
                raw.call_timeout.as_deref(),
                defaults::CALL_TIMEOUT,
            )?,
        };
        let within = [
            (
                "aws.connect_timeout",
                t.connect,
                "aws.attempt_timeout",
                t.attempt,
            ),
            ("aws.read_timeout", t.read, "aws.attempt_timeout", t.attempt),
            ("aws.attempt_timeout", t.attempt, "aws.call_timeout", t.call),
        ];
        for (key, value, outer, limit) in within {
            if value > limit {
                return Err(self.invalid(
                    key,
                    format!(
                        "{} is longer than {outer} ({}), which would cut it short",
                        humantime::format_duration(value),
                        humantime::format_duration(limit)
                    ),
                ));
            }
        }
        Ok(t)
    }
}
