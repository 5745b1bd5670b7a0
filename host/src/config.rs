//! The service's TOML config: parsed strictly, validated once into typed
//! config that the rest of the host uses.
//!
//! Two layers: `Raw*` structs mirror the file (serde, `deny_unknown_fields`,
//! durations and sizes as human strings such as `"200ms"` and `"64MiB"`,
//! parsed by `humantime` and `bytesize` in the validator, so that an error
//! names its key), and [`Config`] holds the
//! validated, typed values ([`Duration`], [`StartPosition`], newtypes). Every
//! error is one line naming the file, the key (e.g.
//! `subscription[0].poll_idle`) and what was wrong, so a bad config stops
//! start-up with a message an operator can act on.
//!
//! Environment overrides (`SHARDLANE__<PATH>`) are applied to the file's
//! contents before anything is checked (`config/overrides.rs`).
//!
//! Floor 2 (config) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::ids::{StreamName, SubscriptionName};
use crate::key_slice::KeySlice;

pub mod defaults;
mod location;
mod overrides;
mod raw;
mod validate;

pub(crate) use location::ArtifactLocation;
pub(crate) use overrides::OVERRIDE_PREFIX;
use overrides::apply_override;
use raw::RawConfig;
use validate::Validator;

/// A config that could not be loaded: always names the file, and the key when
/// one is to blame.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {file}: cannot read it: {reason}")]
    Read {
        /// The config file.
        file: PathBuf,
        /// Why reading failed.
        reason: std::io::Error,
    },
    /// The file is not valid TOML, or a key is unknown or of the wrong type.
    #[error("config file {file}: {location}{message}")]
    Syntax {
        /// The config file.
        file: PathBuf,
        /// `line N, key K: `, as far as known.
        location: String,
        /// What the parser said.
        message: String,
    },
    /// A key holds a value that parsed but makes no sense.
    #[error("config file {file}: key `{key}`: {message}")]
    Invalid {
        /// The config file.
        file: PathBuf,
        /// The full path of the key, e.g. `subscription[1].start`.
        key: String,
        /// What is wrong with its value.
        message: String,
    },
}

/// The validated config of one host process.
#[derive(Debug, Clone)]
pub struct Config {
    /// How to reach AWS.
    pub aws: AwsConfig,
    /// Where leases and checkpoints live.
    pub lease: LeaseConfig,
    /// Every subscription this host runs, side by side.
    pub subscriptions: Vec<SubscriptionConfig>,
    /// The operations and admin HTTP server.
    pub admin: AdminConfig,
    /// Where compiled components are cached; `None`: no cache.
    pub compile_cache: Option<PathBuf>,
    /// Most core module instances one plugin component may contain
    /// (`engine.max_core_instances`): a size of the instance pool.
    pub max_core_instances: u32,
    /// Where handler-call spans go over OTLP (`[traces]`); `None`: nowhere.
    pub traces: Option<TracesConfig>,
    /// Metrics as CloudWatch EMF (`[metrics] emf`); `None`: not written.
    pub emf: Option<EmfConfig>,
    /// Where plugin versions' bytes are kept for the fleet, and how long
    /// a call to that store may take (`[artifacts]`).
    pub artifacts: ArtifactsConfig,
}

/// The `[artifacts]` table: the artifact store (`crate::artifacts`) and
/// the bounds of every call to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactsConfig {
    /// `location`; `None`: no shared store (the lease store's own, if it
    /// has one: see `crate::artifacts`).
    pub location: Option<ArtifactLocation>,
    /// How long a store call may take, by phase.
    pub timeouts: ArtifactTimeouts,
}

/// Deadlines of one artifact-store call (`[artifacts] connect_timeout`,
/// `first_byte_timeout`, `transfer_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactTimeouts {
    /// Establishing a connection.
    pub connect: Duration,
    /// From sending a request to the first byte of its answer (and, for
    /// a body, between two reads of it).
    pub first_byte: Duration,
    /// The whole call: every byte stored or fetched, retries inside the
    /// client included.
    pub transfer: Duration,
}

impl Default for ArtifactTimeouts {
    fn default() -> Self {
        Self {
            connect: defaults::ARTIFACT_CONNECT_TIMEOUT,
            first_byte: defaults::ARTIFACT_FIRST_BYTE_TIMEOUT,
            transfer: defaults::ARTIFACT_TRANSFER_TIMEOUT,
        }
    }
}

/// Where EMF documents go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmfTarget {
    /// Standard output, between the log lines.
    Stdout,
    /// Appended to this file.
    File(PathBuf),
}

/// The `[metrics] emf*` settings: metrics written as CloudWatch embedded
/// metric format documents ([`crate::telemetry`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmfConfig {
    /// Where the documents go (`emf`).
    pub to: EmfTarget,
    /// How often (`emf_every`).
    pub every: Duration,
    /// The CloudWatch namespace (`emf_namespace`).
    pub namespace: String,
}

/// The `[traces]` table: exporting the spans of handler calls and reads
/// over OTLP/HTTP (protobuf).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracesConfig {
    /// The URL spans are POSTed to: `otlp_endpoint` with `/v1/traces`.
    pub traces_url: String,
    /// `service.name` of the spans' resource.
    pub service_name: String,
}

/// The operations HTTP server (health, readiness, metrics, status page,
/// admin API), on one listener or two.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// Where it listens (`[admin] listen`); `None`: off. With
    /// `metrics_listen` set, only the write endpoints are served here.
    pub listen: Option<std::net::SocketAddr>,
    /// Where the read-only endpoints (health, readiness, metrics, status
    /// page) listen apart from the writes (`[metrics] listen`), so either
    /// can be exposed alone; `None`: on `listen`, with the writes.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The bearer token write endpoints require; `None`: writes are off.
    pub token: Option<String>,
}

/// How to reach AWS; anything unset falls back to the standard credential
/// chain and environment (`AWS_REGION`, `AWS_ENDPOINT_URL_KINESIS`, ...).
#[derive(Debug, Clone, Default)]
pub struct AwsConfig {
    /// Region override.
    pub region: Option<String>,
    /// A named profile of the shared config and credentials files
    /// (`~/.aws/config`, `~/.aws/credentials`) for credentials and region.
    pub profile: Option<String>,
    /// A role to assume (STS AssumeRole) with the credentials found
    /// otherwise, e.g. another account's.
    pub role: Option<AssumeRole>,
    /// Kinesis endpoint override (e.g. a local emulator).
    pub endpoint_url: Option<String>,
    /// DynamoDB endpoint override, for the dynamodb lease store.
    pub dynamodb_endpoint_url: Option<String>,
    /// Deadlines of every AWS call (Kinesis and DynamoDB).
    pub timeouts: AwsTimeouts,
}

/// A role the host assumes for its AWS calls (`[aws] role_arn`,
/// `external_id`), through the SDK's own provider: credentials are
/// refreshed before they expire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssumeRole {
    /// The role's ARN.
    pub arn: String,
    /// The external id the role's trust policy asks for, if any.
    pub external_id: Option<String>,
}

/// Deadlines of AWS calls (`[aws] connect_timeout`, `read_timeout`,
/// `attempt_timeout`, `call_timeout`). Connecting and waiting for an answer
/// are bounded apart, so a slow network (long round trips) is told from a
/// dead endpoint (no connection at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AwsTimeouts {
    /// Establishing a connection.
    pub connect: Duration,
    /// From sending a request to the first byte of its answer.
    pub read: Duration,
    /// One attempt, connection and whole answer included.
    pub attempt: Duration,
    /// One call, the SDK's retries included.
    pub call: Duration,
}

impl Default for AwsTimeouts {
    fn default() -> Self {
        Self {
            connect: defaults::CONNECT_TIMEOUT,
            read: defaults::READ_TIMEOUT,
            attempt: defaults::ATTEMPT_TIMEOUT,
            call: defaults::CALL_TIMEOUT,
        }
    }
}

/// Which lease store backs leases and checkpoints (as written in config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LeaseStoreKind {
    /// In this process only.
    Memory,
    /// An embedded database on local disk.
    File,
    /// A DynamoDB table shared by many instances.
    Dynamodb,
}

/// The lease store, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseBackend {
    /// In this process only: every instance reads every shard, and
    /// checkpoints are lost on restart.
    Memory,
    /// A crash-safe embedded database in folder `path`, for one instance.
    File {
        /// The folder.
        path: PathBuf,
    },
    /// A DynamoDB table shared by any number of instances.
    DynamoDb {
        /// The table.
        table: String,
        /// Create it at start-up when missing.
        create_table: bool,
    },
}

/// Lease timing and the store.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// The backend.
    pub store: LeaseBackend,
    /// This instance's owner id; `None`: hostname, pid and a random suffix.
    pub owner_id: Option<String>,
    /// How long a lease whose counter has not moved counts as alive.
    pub lease_duration: Duration,
    /// How often held leases are renewed.
    pub renew_every: Duration,
    /// How often the stream's shards are listed and free leases taken.
    pub shard_sync_every: Duration,
    /// The most leases of a subscription one instance takes (KCL's
    /// `maxLeasesForWorker`); `None`: no cap beyond the fair share.
    pub max_leases_per_instance: Option<usize>,
}

/// Where a shard without a checkpoint starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPosition {
    /// Only records put after the reader opens the shard.
    Latest,
    /// The oldest record still in the shard.
    TrimHorizon,
    /// The first record that arrived at or after this time.
    AtTimestamp(SystemTime),
}

/// How a subscription's records are spread over handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchMode {
    /// One handler call at a time, in arrival order.
    Sequential,
    /// Up to n calls at once, in no particular order.
    Workers(usize),
    /// n lanes; a record goes to the lane its partition key hashes to, so a
    /// key's records keep their order.
    ByKey(usize),
}

impl DispatchMode {
    /// How many lanes (handler instances) the mode runs.
    pub fn lanes(self) -> usize {
        match self {
            DispatchMode::Sequential => 1,
            DispatchMode::Workers(n) | DispatchMode::ByKey(n) => n,
        }
    }
}

/// As the config writes it: `sequential`, `workers = 4`, `workers = 4,
/// by_key`.
impl fmt::Display for DispatchMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DispatchMode::Sequential => f.write_str("sequential"),
            DispatchMode::Workers(n) => write!(f, "workers = {n}"),
            DispatchMode::ByKey(n) => write!(f, "workers = {n}, by_key"),
        }
    }
}

/// Batch handling: `handle-batch` with up to `size` records and
/// `max_bytes` bytes, or what arrived within `window` of the batch's first
/// record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// Most records per call.
    pub size: usize,
    /// Most bytes per call (`max_batch_bytes`): each record's data and
    /// strings, what is lowered into the guest's memory. A record larger
    /// than this alone is a batch of one.
    pub max_bytes: usize,
    /// Longest a batch stays open after its first record.
    pub window: Duration,
}

/// As the status page shows it: `batch_size = 100, batch_window = 50ms`.
impl fmt::Display for BatchConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "batch_size = {}, batch_window = {:?}",
            self.size, self.window
        )
    }
}

/// What happens to a record whose handling keeps failing, or that the
/// handler rejects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnFailure {
    /// Hold the record (and its lane) and keep retrying; like Lambda.
    Block,
    /// Settle it with an error log and a counter.
    Skip,
    /// Put it to this stream (a JSON envelope) and only then settle it.
    DeadLetter(StreamName),
    /// Park its key: it and every later record of the key go to this
    /// stream (envelope reason `quarantined`), the other keys flow on.
    Quarantine(StreamName),
}

impl OnFailure {
    /// The dead-letter stream, for `dead_letter` and `quarantine`.
    pub fn dead_letter_stream(&self) -> Option<&StreamName> {
        match self {
            OnFailure::DeadLetter(stream) | OnFailure::Quarantine(stream) => Some(stream),
            OnFailure::Block | OnFailure::Skip => None,
        }
    }
}

/// The failure policy of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailurePolicy {
    /// Attempts before giving up (`retry` outcomes, traps and timeouts
    /// count); `None`: unlimited.
    pub max_attempts: Option<u32>,
    /// Give up on a record older than this (since it arrived in Kinesis).
    pub max_record_age: Option<Duration>,
    /// What giving up (or a `reject`) does.
    pub on_failure: OnFailure,
    /// Split a failing batch in halves and retry each, isolating a poison
    /// record.
    pub bisect_on_error: bool,
    /// What `on_failure = "quarantine"` may hold.
    pub quarantine: crate::parked::ParkLimits,
}

/// A read-only directory granted to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preopen {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it.
    pub guest: String,
}

/// What a guest may use: memory, CPU, capabilities, log volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Linear memory cap per instance, in bytes.
    pub max_memory: usize,
    /// Fuel per call (deterministic CPU bound); `None`: no fuel metering.
    pub fuel: Option<u64>,
    /// Environment variables granted, with their values at start-up.
    pub env: Vec<(String, String)>,
    /// A read-only directory granted.
    pub preopen: Option<Preopen>,
    /// Guest log lines per second per instance before lines are dropped
    /// (and counted).
    pub log_rate: u32,
    /// What the plugin may reach beyond logging (contract 0.2.0): output
    /// streams, its config table, HTTP destinations. Shared, immutable.
    pub grants: Arc<Grants>,
}

/// What a 0.2.0 plugin may reach, granted per subscription: nothing unless
/// the config says so.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Streams it may publish outputs to (`outputs`).
    pub outputs: BTreeSet<StreamName>,
    /// Its config table (`config`), read through `wasi:config/store`.
    pub config: BTreeMap<String, String>,
    /// Where it may send HTTP requests (`http`); `None`: nowhere.
    pub http: Option<HttpGrant>,
    /// Per-key state (`state`); `None`: none.
    pub state: Option<Arc<StateConfig>>,
}

/// A subscription's `state` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// Values expire this long after they were written; `None`: never.
    pub ttl: Option<Duration>,
    /// Largest value, in bytes.
    pub max_value: u64,
    /// Most bytes (names and values) under one key.
    pub max_per_key: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            ttl: None,
            max_value: defaults::STATE_MAX_VALUE,
            max_per_key: defaults::STATE_MAX_PER_KEY,
        }
    }
}

/// The `http` table: allowed destinations and per-request bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGrant {
    /// `host:port` pairs a request may go to (hosts compared without case;
    /// a URL without a port means 80 for `http`, 443 for `https`).
    pub allow: Vec<HttpDestination>,
    /// Longest a request may take to connect, to its first response byte,
    /// and between body bytes (never past the call's `handler_timeout`).
    pub timeout: Duration,
    /// Most response body bytes read; past it the body fails.
    pub max_response: u64,
    /// Only the methods that cannot change anything (RFC 9110's safe
    /// methods GET, HEAD and OPTIONS; TRACE, which echoes the request back,
    /// is left out): set for a shadow candidate, never from the config.
    pub safe_methods_only: bool,
}

/// One allowed HTTP destination.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HttpDestination {
    /// Host name or IP address, lower case.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl fmt::Display for HttpDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A canary: a candidate plugin version handling a stable slice of the
/// partition keys (see [`crate::slot`]).
#[derive(Debug, Clone)]
pub struct CanaryConfig {
    /// The candidate component file.
    pub plugin: PathBuf,
    /// The keys it handles.
    pub slice: KeySlice,
    /// When it rolls back or promotes by itself (none set: a person
    /// decides).
    pub rules: crate::fleet_versions::CanaryRules,
}

/// How a subscription reads its shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadMode {
    /// GetRecords, within the shard's read budget (`max_reads_per_second`).
    Polling,
    /// Enhanced fan-out: SubscribeToShard through this registered stream
    /// consumer (registered at start-up when missing).
    FanOut {
        /// The consumer's name (default: the subscription's name).
        consumer: String,
    },
}

/// One subscription: a stream, a plugin, and how to read.
#[derive(Debug, Clone)]
pub struct SubscriptionConfig {
    /// The application name: keys leases and checkpoints.
    pub name: SubscriptionName,
    /// The stream read.
    pub stream: StreamName,
    /// The plugin component file.
    pub plugin: PathBuf,
    /// A candidate version for a slice of the keys, until promoted or
    /// rolled back.
    pub canary: Option<CanaryConfig>,
    /// Where a shard without a checkpoint starts.
    pub start: StartPosition,
    /// How shards are read: polling, or enhanced fan-out.
    pub read: ReadMode,
    /// How long a reader waits after a read that returned no records.
    pub poll_idle: Duration,
    /// The longest wait after empty reads, once a shard has been quiet a
    /// while (see `reader::pace`).
    pub poll_idle_max: Duration,
    /// GetRecords per shard per second at most (finite, above zero).
    pub max_reads_per_second: f64,
    /// At most one checkpoint write per shard per this interval.
    pub checkpoint_every: Duration,
    /// Most records asked for in one GetRecords call.
    pub read_limit: i32,
    /// A handler call that runs longer fails (and is retried).
    pub handler_timeout: Duration,
    /// First backoff before a `retry` outcome is delivered again.
    pub retry_backoff_initial: Duration,
    /// Cap on the (doubling, jittered) retry backoff.
    pub retry_backoff_max: Duration,
    /// How long shutdown waits for in-flight records to be handled.
    pub shutdown_timeout: Duration,
    /// Sequential, workers or by-key lanes.
    pub dispatch: DispatchMode,
    /// Batch handling, for batch-handler plugins.
    pub batch: Option<BatchConfig>,
    /// Retries, giving up, dead letters.
    pub failure: FailurePolicy,
    /// Limits and capabilities of the guest.
    pub sandbox: SandboxConfig,
    /// The event filter (`filter`): a record that matches none of its
    /// patterns settles at its reader without a call (see
    /// [`crate::filter`]); `None` lets every record in.
    pub filter: Option<Arc<crate::filter::Filter>>,
    /// Tumbling windows (`window`, contract 0.3.0 windowed worlds); `None`
    /// without.
    pub window: Option<crate::windows::WindowSpec>,
}

impl SubscriptionConfig {
    /// How it dispatches, as the status page and `validate` show it:
    /// `workers = 4, by_key, batch_size = 100, batch_window = 50ms`.
    pub fn mode(&self) -> String {
        match self.batch {
            Some(batch) => format!("{}, {batch}", self.dispatch),
            None => self.dispatch.to_string(),
        }
    }
}

/// The default compile cache: `$XDG_CACHE_HOME/shardlane/components`, else
/// `~/.cache/shardlane/components`; none when neither is known.
pub(crate) fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("shardlane").join("components"))
}

/// Parses a size such as `"64MiB"`, `"512KiB"`, `"1GiB"`, `"100MB"`,
/// `"1.5 GiB"` or a plain number of bytes (the `bytesize` crate's syntax).
pub(crate) fn parse_size(value: &str) -> Option<usize> {
    let size: bytesize::ByteSize = value.trim().parse().ok()?;
    usize::try_from(size.as_u64()).ok()
}

impl Config {
    /// The JSON Schema of the config file, derived from the parser's own
    /// types ([`raw`]), so it cannot drift from what is accepted: every
    /// table and key, their TOML types and descriptions, unknown keys
    /// refused. Editors (taplo, Even Better TOML) complete and check a
    /// `shardlane.toml` with it; values' finer rules (durations, sizes,
    /// ranges, which keys go together) are the validator's, checked at
    /// start-up and by `shardlane validate`.
    #[must_use]
    pub fn schema() -> serde_json::Value {
        let mut schema = serde_json::to_value(schemars::schema_for!(RawConfig))
            .unwrap_or_else(|e| unreachable!("a derived schema serializes: {e}"));
        if let Some(object) = schema.as_object_mut() {
            object.insert("title".into(), "shardlane config".into());
        }
        schema
    }

    /// Reads and validates a config file. Relative plugin paths are taken
    /// relative to the current directory, as a shell user expects.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file and key when the file cannot be read
    /// (also: not a regular file, or over
    /// [`MAX_CONFIG_BYTES`](crate::files::MAX_CONFIG_BYTES)), is not TOML,
    /// has an unknown key, or holds a bad value.
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        let read_error = |reason| ConfigError::Read {
            file: file.to_owned(),
            reason,
        };
        // A regular file of bounded size only: `--config /dev/zero` (or a
        // FIFO) must fail at once, not read forever.
        let bytes = crate::files::read_regular(file, crate::files::MAX_CONFIG_BYTES)
            .map_err(|e| read_error(e.into()))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            read_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not UTF-8 text ({e})"),
            ))
        })?;
        // `vars_os`: a variable that is not UTF-8 (any, not only ours)
        // must not panic; ours must be UTF-8 to be read at all.
        let vars = std::env::vars_os().filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with(OVERRIDE_PREFIX).then_some(())?;
            Some((k, v.into_string().ok()?))
        });
        Self::parse_with_overrides(&text, file, vars)
    }

    /// Parses and validates config text; `file` only names it in errors.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn parse(text: &str, file: &Path) -> Result<Self, ConfigError> {
        Self::parse_with_overrides(text, file, std::iter::empty())
    }

    /// Parses config text with the `SHARDLANE__…` overrides among `vars`
    /// (module docs) applied.
    ///
    /// # Errors
    /// As [`Config::load`]; an override of a subscription the file does
    /// not have is [`ConfigError::Invalid`] naming the variable.
    pub fn parse_with_overrides(
        text: &str,
        file: &Path,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut overrides: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(name, _)| name.starts_with(OVERRIDE_PREFIX))
            .collect();
        // A fixed order: a table and a key inside it set by two variables
        // end the same way whatever the environment's order.
        overrides.sort();
        if overrides.is_empty() {
            return Self::parse_text(text, file, "");
        }
        let mut table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    file: file.to_owned(),
                    location: line_of(text, e.span()),
                    message: e.message().trim().replace('\n', " "),
                })?;
        let mut names: Vec<&str> = Vec::new();
        for (name, value) in &overrides {
            apply_override(&mut table, name, value).map_err(|message| ConfigError::Invalid {
                file: file.to_owned(),
                key: name.clone(),
                message,
            })?;
            names.push(name);
        }
        names.sort_unstable();
        let merged = toml::to_string(&table).expect("a TOML table serializes");
        Self::parse_text(
            &merged,
            file,
            &format!("with the environment overrides {}: ", names.join(", ")),
        )
    }

    /// Parses and validates `text`; syntax errors say `note` (where the
    /// text came from) instead of a line when `note` is not empty.
    fn parse_text(text: &str, file: &Path, note: &str) -> Result<Self, ConfigError> {
        let line_of = |text: &str, span| {
            if note.is_empty() {
                line_of(text, span)
            } else {
                note.to_owned()
            }
        };
        let syntax = |location: String, message: &str| ConfigError::Syntax {
            file: file.to_owned(),
            location,
            message: message.trim().replace('\n', " "),
        };
        let deserializer = toml::Deserializer::parse(text)
            .map_err(|e| syntax(line_of(text, e.span()), e.message()))?;
        let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let mut location = line_of(text, inner.span());
            if path != "." && !path.is_empty() {
                location.push_str(&format!("key `{path}`: "));
            }
            syntax(location, inner.message())
        })?;
        Validator { file }.config(raw)
    }
}

fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}, ")
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests;
