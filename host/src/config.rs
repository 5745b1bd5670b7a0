//! The service's TOML config: parsed strictly, validated once into typed
//! config that the rest of the host uses.
//!
//! Two layers: `Raw*` structs mirror the file (serde, `deny_unknown_fields`,
//! durations as human strings such as `"200ms"`), and [`Config`] holds the
//! validated, typed values ([`Duration`], [`StartPosition`], newtypes). Every
//! error is one line naming the file, the key (e.g.
//! `subscription[0].poll_idle`) and what was wrong, so a bad config stops
//! start-up with a message an operator can act on.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::dispatch::routing::KeySlice;
use crate::ids::{StreamName, SubscriptionName};

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
}

/// The operations HTTP server (health, readiness, metrics, status page,
/// admin API).
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// Where it listens; `None`: off.
    pub listen: Option<std::net::SocketAddr>,
    /// The bearer token write endpoints require; `None`: writes are off.
    pub token: Option<String>,
}

/// How to reach AWS; anything unset falls back to the standard credential
/// chain and environment (`AWS_REGION`, `AWS_ENDPOINT_URL_KINESIS`, ...).
#[derive(Debug, Clone, Default)]
pub struct AwsConfig {
    /// Region override.
    pub region: Option<String>,
    /// Kinesis endpoint override (e.g. a local emulator).
    pub endpoint_url: Option<String>,
    /// DynamoDB endpoint override, for the dynamodb lease store.
    pub dynamodb_endpoint_url: Option<String>,
    /// Deadlines of every AWS call (Kinesis and DynamoDB).
    pub timeouts: AwsTimeouts,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStoreKind {
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
}

/// A canary: a candidate plugin version handling a stable slice of the
/// partition keys (see [`crate::swap`]).
#[derive(Debug, Clone)]
pub struct CanaryConfig {
    /// The candidate component file.
    pub plugin: PathBuf,
    /// The keys it handles.
    pub slice: KeySlice,
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
    /// How long a reader waits after a read that returned no records.
    pub poll_idle: Duration,
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
}

/// Defaults, with the reasoning behind each.
pub mod defaults {
    use std::time::Duration;

    /// Kinesis allows 5 GetRecords calls per shard per second; 200 ms keeps
    /// an idle shard within that and a new record under a second away.
    pub const POLL_IDLE: Duration = Duration::from_millis(200);
    /// One write a second per shard keeps store traffic small while bounding
    /// redelivery after a crash to about a second of records.
    pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
    /// Small reads keep the records held by a blocked reader (read but not
    /// yet in the channel) bounded; Kinesis allows up to 10,000.
    pub const READ_LIMIT: i32 = 1_000;
    /// A handler that takes longer than this is stuck, not slow.
    pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(30);
    /// First retry backoff.
    pub const RETRY_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
    /// Retry backoff cap.
    pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(30);
    /// Time given to in-flight records on shutdown.
    pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
    /// Lambda's default window: a batch waits at most this long for more
    /// records after its first.
    pub const BATCH_WINDOW: Duration = Duration::from_millis(50);
    /// Most lanes a subscription may run: each owns a Wasm instance.
    pub const MAX_WORKERS: i64 = 256;
    /// Most records per batch (Lambda's Kinesis maximum).
    pub const MAX_BATCH_SIZE: i64 = 10_000;
    /// Most bytes per batch: Lambda's 6 MB invocation payload, and well
    /// inside the default `max_memory`, so a full batch can be lowered
    /// into the guest.
    pub const MAX_BATCH_BYTES: usize = 6 << 20;
    /// A TCP (and TLS) connection to an AWS endpoint normally takes
    /// milliseconds; 3 s is many round trips on a slow network, and an
    /// endpoint that accepts nothing for that long is down.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
    /// Kinesis and DynamoDB answer in tens of milliseconds; 10 s leaves
    /// room for seconds of added network latency, and a renewal still
    /// lands within the default lease duration.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// One attempt: connection plus a whole answer (a GetRecords answer is
    /// up to 10 MB).
    pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
    /// One call with the SDK's retries (three attempts).
    pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
    /// KCL's default: a lease whose counter has not moved for 10 s is free.
    pub const LEASE_DURATION: Duration = Duration::from_secs(10);
    /// Renew three times per lease duration, so one slow renewal is harmless.
    pub const RENEW_EVERY: Duration = Duration::from_secs(3);
    /// Picks up new shards after a reshard within this interval.
    pub const SHARD_SYNC_EVERY: Duration = Duration::from_secs(10);
    /// Memory per guest instance: ample for handlers in Rust (about 1 MiB)
    /// and Python or JavaScript (tens of MiB), small enough that a runaway
    /// guest cannot exhaust the host.
    pub const MAX_MEMORY: usize = 128 << 20;
    /// Guest log lines per second per instance; a burst of twice that is
    /// allowed. Enough for a line per record at a thousand records a second
    /// per lane; a guest logging in a loop is cut off.
    pub const LOG_RATE: u32 = 1_000;
    /// Where the operations server listens: loopback only.
    pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
    /// Where the file lease store keeps its database.
    pub const FILE_STORE_PATH: &str = "shardlane-state";
    /// Core module instances per component: the Rust and JavaScript
    /// examples have 3, the C ones 4, the Python ones (componentize-py
    /// 0.25) 14; room to spare for larger runtimes.
    pub const MAX_CORE_INSTANCES: u32 = 64;
    /// The most `engine.max_core_instances` may be: each slot of the pool
    /// reserves room for this many instances.
    pub const MAX_CORE_INSTANCES_LIMIT: u32 = 1_024;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    aws: RawAws,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    engine: RawEngine,
    #[serde(default)]
    lease: RawLease,
    #[serde(default, rename = "subscription")]
    subscriptions: Vec<RawSubscription>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAws {
    region: Option<String>,
    endpoint_url: Option<String>,
    dynamodb_endpoint_url: Option<String>,
    connect_timeout: Option<String>,
    read_timeout: Option<String>,
    attempt_timeout: Option<String>,
    call_timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEngine {
    cache_dir: Option<String>,
    max_core_instances: Option<i64>,
}

/// The default compile cache: `$XDG_CACHE_HOME/shardlane/components`, else
/// `~/.cache/shardlane/components`; none when neither is known.
pub fn default_cache_dir() -> Option<PathBuf> {
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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    listen: Option<String>,
    token: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLease {
    store: Option<LeaseStoreKind>,
    path: Option<PathBuf>,
    table: Option<String>,
    create_table: Option<bool>,
    owner_id: Option<String>,
    lease_duration: Option<String>,
    renew_every: Option<String>,
    shard_sync_every: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubscription {
    name: String,
    stream: String,
    plugin: PathBuf,
    canary: Option<RawCanary>,
    start: Option<RawStart>,
    poll_idle: Option<String>,
    checkpoint_every: Option<String>,
    read_limit: Option<i64>,
    handler_timeout: Option<String>,
    retry_backoff: Option<RawBackoff>,
    shutdown_timeout: Option<String>,
    workers: Option<i64>,
    by_key: Option<bool>,
    batch_size: Option<i64>,
    batch_window: Option<String>,
    max_batch_bytes: Option<String>,
    max_attempts: Option<i64>,
    max_record_age: Option<String>,
    on_failure: Option<RawOnFailure>,
    dead_letter_stream: Option<String>,
    bisect_on_error: Option<bool>,
    max_memory: Option<String>,
    fuel: Option<i64>,
    env: Option<Vec<String>>,
    preopen: Option<RawPreopen>,
    log_rate: Option<i64>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum RawOnFailure {
    Block,
    Skip,
    DeadLetter,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCanary {
    plugin: PathBuf,
    key_fraction: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPreopen {
    host: PathBuf,
    guest: String,
}

/// Parses a size such as `"64MiB"`, `"512KiB"`, `"1GiB"`, `"100MB"` or a
/// plain number of bytes.
pub fn parse_size(value: &str) -> Option<usize> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: usize = number.parse().ok()?;
    let multiplier: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackoff {
    initial: Option<String>,
    max: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawStart {
    Named(String),
    Table(RawStartTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStartTable {
    at_timestamp: String,
}

impl Config {
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
        Self::parse(&text, file)
    }

    /// Parses and validates config text; `file` only names it in errors.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn parse(text: &str, file: &Path) -> Result<Self, ConfigError> {
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

struct Validator<'a> {
    file: &'a Path,
}

impl Validator<'_> {
    fn invalid(&self, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            key: key.into(),
            message: message.into(),
        }
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

    /// `max_batch_bytes`: a size of at least 1 KiB, or the default.
    fn batch_bytes(&self, key: &str, value: Option<&str>) -> Result<usize, ConfigError> {
        let Some(text) = value else {
            return Ok(defaults::MAX_BATCH_BYTES);
        };
        match parse_size(text) {
            Some(bytes) if bytes >= 1 << 10 => Ok(bytes),
            Some(_) => Err(self.invalid(key, format!("{text:?} is too small: at least 1KiB"))),
            None => Err(self.invalid(
                key,
                format!("{text:?} is not a size; write e.g. \"6MiB\", \"512KiB\""),
            )),
        }
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let store = match raw.lease.store.unwrap_or(LeaseStoreKind::File) {
            LeaseStoreKind::Memory => LeaseBackend::Memory,
            LeaseStoreKind::File => LeaseBackend::File {
                path: raw
                    .lease
                    .path
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(defaults::FILE_STORE_PATH)),
            },
            LeaseStoreKind::Dynamodb => match raw.lease.table.clone() {
                Some(table) if !table.trim().is_empty() => LeaseBackend::DynamoDb {
                    table,
                    create_table: raw.lease.create_table.unwrap_or(false),
                },
                _ => {
                    return Err(
                        self.invalid("lease.table", "store = \"dynamodb\" needs the table's name")
                    );
                }
            },
        };
        if raw.lease.path.is_some() && !matches!(store, LeaseBackend::File { .. }) {
            return Err(self.invalid("lease.path", "only applies to store = \"file\""));
        }
        if (raw.lease.table.is_some() || raw.lease.create_table.is_some())
            && !matches!(store, LeaseBackend::DynamoDb { .. })
        {
            let key = if raw.lease.table.is_some() {
                "lease.table"
            } else {
                "lease.create_table"
            };
            return Err(self.invalid(key, "only applies to store = \"dynamodb\""));
        }
        if raw
            .lease
            .owner_id
            .as_deref()
            .is_some_and(|o| o.trim().is_empty())
        {
            return Err(self.invalid("lease.owner_id", "must not be empty"));
        }
        let lease = LeaseConfig {
            store,
            owner_id: raw.lease.owner_id.clone(),
            lease_duration: self.duration(
                "lease.lease_duration",
                raw.lease.lease_duration.as_deref(),
                defaults::LEASE_DURATION,
            )?,
            renew_every: self.duration(
                "lease.renew_every",
                raw.lease.renew_every.as_deref(),
                defaults::RENEW_EVERY,
            )?,
            shard_sync_every: self.duration(
                "lease.shard_sync_every",
                raw.lease.shard_sync_every.as_deref(),
                defaults::SHARD_SYNC_EVERY,
            )?,
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
        if raw.subscriptions.is_empty() {
            return Err(self.invalid(
                "subscription",
                "no [[subscription]] block: there is nothing to run",
            ));
        }
        let mut names = HashSet::new();
        let mut subscriptions = Vec::with_capacity(raw.subscriptions.len());
        for (i, sub) in raw.subscriptions.into_iter().enumerate() {
            let at = |key: &str| format!("subscription[{i}].{key}");
            if sub.name.trim().is_empty() {
                return Err(self.invalid(at("name"), "must not be empty"));
            }
            if !names.insert(sub.name.clone()) {
                return Err(self.invalid(
                    at("name"),
                    format!(
                        "{:?} is used by another subscription; names key leases and must be unique",
                        sub.name
                    ),
                ));
            }
            if sub.stream.trim().is_empty() {
                return Err(self.invalid(at("stream"), "must not be empty"));
            }
            let start = match sub.start {
                None => StartPosition::Latest,
                Some(RawStart::Named(name)) => match name.as_str() {
                    "latest" => StartPosition::Latest,
                    "trim_horizon" => StartPosition::TrimHorizon,
                    other => {
                        return Err(self.invalid(
                            at("start"),
                            format!(
                                "{other:?} is not a start position; use \"latest\", \"trim_horizon\" or {{ at_timestamp = \"2026-12-01T00:00:00Z\" }}"
                            ),
                        ));
                    }
                },
                Some(RawStart::Table(table)) => {
                    let ts = humantime::parse_rfc3339_weak(&table.at_timestamp).map_err(|e| {
                        self.invalid(
                            at("start.at_timestamp"),
                            format!("{:?} is not an RFC 3339 time ({e})", table.at_timestamp),
                        )
                    })?;
                    StartPosition::AtTimestamp(ts)
                }
            };
            let read_limit = match sub.read_limit {
                None => defaults::READ_LIMIT,
                Some(n @ 1..=10_000) => n as i32,
                Some(n) => {
                    return Err(self.invalid(
                        at("read_limit"),
                        format!("{n} is out of range: GetRecords takes 1 to 10000"),
                    ));
                }
            };
            let backoff = sub.retry_backoff.unwrap_or(RawBackoff {
                initial: None,
                max: None,
            });
            let retry_backoff_initial = self.duration(
                &at("retry_backoff.initial"),
                backoff.initial.as_deref(),
                defaults::RETRY_BACKOFF_INITIAL,
            )?;
            let retry_backoff_max = self.duration(
                &at("retry_backoff.max"),
                backoff.max.as_deref(),
                defaults::RETRY_BACKOFF_MAX,
            )?;
            if retry_backoff_max < retry_backoff_initial {
                return Err(self.invalid(
                    at("retry_backoff.max"),
                    "must not be shorter than retry_backoff.initial",
                ));
            }
            let dispatch = match (sub.workers, sub.by_key.unwrap_or(false)) {
                (None, false) => DispatchMode::Sequential,
                (None, true) => {
                    return Err(self.invalid(
                        at("by_key"),
                        "needs `workers`: by_key spreads keys over `workers` lanes",
                    ));
                }
                (Some(n @ 1..=defaults::MAX_WORKERS), by_key) => {
                    if by_key {
                        DispatchMode::ByKey(n as usize)
                    } else {
                        DispatchMode::Workers(n as usize)
                    }
                }
                (Some(n), _) => {
                    return Err(self.invalid(
                        at("workers"),
                        format!("{n} is out of range: 1 to {}", defaults::MAX_WORKERS),
                    ));
                }
            };
            if sub.batch_size.is_none() && sub.max_batch_bytes.is_some() {
                return Err(self.invalid(
                    at("max_batch_bytes"),
                    "needs `batch_size`: the byte limit only applies to batches",
                ));
            }
            let batch = match (sub.batch_size, sub.batch_window) {
                (None, None) => None,
                (None, Some(_)) => {
                    return Err(self.invalid(
                        at("batch_window"),
                        "needs `batch_size`: the window only applies to batches",
                    ));
                }
                (Some(size @ 1..=defaults::MAX_BATCH_SIZE), window) => Some(BatchConfig {
                    size: size as usize,
                    max_bytes: self
                        .batch_bytes(&at("max_batch_bytes"), sub.max_batch_bytes.as_deref())?,
                    window: self.duration(
                        &at("batch_window"),
                        window.as_deref(),
                        defaults::BATCH_WINDOW,
                    )?,
                }),
                (Some(size), _) => {
                    return Err(self.invalid(
                        at("batch_size"),
                        format!("{size} is out of range: 1 to {}", defaults::MAX_BATCH_SIZE),
                    ));
                }
            };
            let on_failure = match (
                sub.on_failure.unwrap_or(RawOnFailure::Block),
                sub.dead_letter_stream,
            ) {
                (RawOnFailure::DeadLetter, Some(stream)) if !stream.trim().is_empty() => {
                    OnFailure::DeadLetter(StreamName::new(stream))
                }
                (RawOnFailure::DeadLetter, _) => {
                    return Err(self.invalid(
                        at("dead_letter_stream"),
                        "on_failure = \"dead_letter\" needs the stream to put failed records to",
                    ));
                }
                (_, Some(_)) => {
                    return Err(self.invalid(
                        at("dead_letter_stream"),
                        "only applies with on_failure = \"dead_letter\"",
                    ));
                }
                (RawOnFailure::Block, None) => OnFailure::Block,
                (RawOnFailure::Skip, None) => OnFailure::Skip,
            };
            let max_attempts = match sub.max_attempts {
                None | Some(-1) => None,
                Some(n @ 1..=1_000_000) => Some(n as u32),
                Some(n) => {
                    return Err(self.invalid(
                        at("max_attempts"),
                        format!("{n} is out of range: 1 to 1000000, or -1 for unlimited"),
                    ));
                }
            };
            let failure = FailurePolicy {
                max_attempts,
                max_record_age: match sub.max_record_age.as_deref() {
                    None => None,
                    Some(age) => {
                        Some(self.duration(&at("max_record_age"), Some(age), Duration::ZERO)?)
                    }
                },
                on_failure,
                bisect_on_error: sub.bisect_on_error.unwrap_or(false),
            };
            if failure.bisect_on_error && batch.is_none() {
                return Err(self.invalid(
                    at("bisect_on_error"),
                    "only applies to batches (set batch_size)",
                ));
            }
            let max_memory = match sub.max_memory.as_deref() {
                None => defaults::MAX_MEMORY,
                Some(text) => match parse_size(text) {
                    Some(bytes) if bytes >= 1 << 20 => bytes,
                    Some(_) => {
                        return Err(self.invalid(
                            at("max_memory"),
                            format!("{text:?} is too small: at least 1MiB"),
                        ));
                    }
                    None => {
                        return Err(self.invalid(
                            at("max_memory"),
                            format!("{text:?} is not a size; write e.g. \"64MiB\", \"1GiB\""),
                        ));
                    }
                },
            };
            // A batch set to exceed the guest's whole memory can never be
            // lowered into it. (The default limit may: such batches split
            // when lowering fails, see dispatch.)
            if let (Some(b), Some(text)) = (batch, sub.max_batch_bytes.as_deref())
                && b.max_bytes > max_memory
            {
                return Err(self.invalid(
                    at("max_batch_bytes"),
                    format!(
                        "{text:?} exceeds max_memory ({max_memory} bytes): such a batch cannot be lowered into the guest"
                    ),
                ));
            }
            let fuel = match sub.fuel {
                None => None,
                Some(n) if n > 0 => Some(n as u64),
                Some(n) => return Err(self.invalid(at("fuel"), format!("{n} must be positive"))),
            };
            let mut env = Vec::new();
            for name in sub.env.unwrap_or_default() {
                match std::env::var(&name) {
                    Ok(value) => env.push((name, value)),
                    Err(_) => {
                        return Err(self.invalid(
                            at("env"),
                            format!("{name:?} is not set in the host's environment"),
                        ));
                    }
                }
            }
            let preopen = match sub.preopen {
                None => None,
                Some(p) => {
                    if !p.host.is_dir() {
                        return Err(self.invalid(
                            at("preopen.host"),
                            format!("{} is not a directory", p.host.display()),
                        ));
                    }
                    if !p.guest.starts_with('/') {
                        return Err(self.invalid(
                            at("preopen.guest"),
                            "must be an absolute path, e.g. \"/data\"",
                        ));
                    }
                    Some(Preopen {
                        host: p.host,
                        guest: p.guest,
                    })
                }
            };
            let log_rate = match sub.log_rate {
                None => defaults::LOG_RATE,
                Some(n @ 1..=1_000_000) => n as u32,
                Some(n) => {
                    return Err(
                        self.invalid(at("log_rate"), format!("{n} is out of range: 1 to 1000000"))
                    );
                }
            };
            let canary = match sub.canary {
                None => None,
                Some(c) => Some(CanaryConfig {
                    plugin: c.plugin,
                    slice: KeySlice::new(c.key_fraction).ok_or_else(|| {
                        self.invalid(
                            at("canary.key_fraction"),
                            format!(
                                "{} is out of range: more than 0 (at least 0.000001), at most 1",
                                c.key_fraction
                            ),
                        )
                    })?,
                }),
            };
            subscriptions.push(SubscriptionConfig {
                canary,
                failure,
                sandbox: SandboxConfig {
                    max_memory,
                    fuel,
                    env,
                    preopen,
                    log_rate,
                },
                dispatch,
                batch,
                name: SubscriptionName::new(sub.name),
                stream: StreamName::new(sub.stream),
                plugin: sub.plugin,
                start,
                poll_idle: self.duration(
                    &at("poll_idle"),
                    sub.poll_idle.as_deref(),
                    defaults::POLL_IDLE,
                )?,
                checkpoint_every: self.duration(
                    &at("checkpoint_every"),
                    sub.checkpoint_every.as_deref(),
                    defaults::CHECKPOINT_EVERY,
                )?,
                read_limit,
                handler_timeout: self.duration(
                    &at("handler_timeout"),
                    sub.handler_timeout.as_deref(),
                    defaults::HANDLER_TIMEOUT,
                )?,
                retry_backoff_initial,
                retry_backoff_max,
                shutdown_timeout: self.duration(
                    &at("shutdown_timeout"),
                    sub.shutdown_timeout.as_deref(),
                    defaults::SHUTDOWN_TIMEOUT,
                )?,
            });
        }
        let listen = match raw
            .admin
            .listen
            .as_deref()
            .unwrap_or(defaults::ADMIN_LISTEN)
        {
            "off" => None,
            addr => Some(addr.parse().map_err(|e| {
                self.invalid(
                    "admin.listen",
                    format!("{addr:?} is not an address like \"127.0.0.1:9090\" or \"off\" ({e})"),
                )
            })?),
        };
        let token = raw
            .admin
            .token
            .or_else(|| std::env::var("SHARDLANE_ADMIN_TOKEN").ok())
            .filter(|t| !t.trim().is_empty());
        let compile_cache = match raw.engine.cache_dir.as_deref() {
            Some("off") => None,
            Some(dir) => Some(PathBuf::from(dir)),
            None => default_cache_dir(),
        };
        let max_core_instances = match raw.engine.max_core_instances {
            None => defaults::MAX_CORE_INSTANCES,
            Some(n) if (1..=i64::from(defaults::MAX_CORE_INSTANCES_LIMIT)).contains(&n) => n as u32,
            Some(n) => {
                return Err(self.invalid(
                    "engine.max_core_instances",
                    format!(
                        "{n} is out of range: 1 to {}",
                        defaults::MAX_CORE_INSTANCES_LIMIT
                    ),
                ));
            }
        };
        Ok(Config {
            compile_cache,
            max_core_instances,
            admin: AdminConfig { listen, token },
            aws: AwsConfig {
                timeouts: self.aws_timeouts(&raw.aws)?,
                region: raw.aws.region,
                endpoint_url: raw.aws.endpoint_url,
                dynamodb_endpoint_url: raw.aws.dynamodb_endpoint_url,
            },
            lease,
            subscriptions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[[subscription]]
name = "orders-audit"
stream = "orders"
plugin = "echo.wasm"
"#;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("test.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn minimal_config_takes_defaults() {
        let config = parse(MINIMAL).unwrap();
        let sub = &config.subscriptions[0];
        assert_eq!(sub.name.as_str(), "orders-audit");
        assert_eq!(sub.start, StartPosition::Latest);
        assert_eq!(sub.poll_idle, defaults::POLL_IDLE);
        assert_eq!(sub.checkpoint_every, defaults::CHECKPOINT_EVERY);
        assert_eq!(
            config.lease.store,
            LeaseBackend::File {
                path: PathBuf::from("shardlane-state")
            },
            "the file store is the default"
        );
    }

    #[test]
    fn full_example_parses() {
        let config = parse(
            r#"
[aws]
region = "us-east-1"
endpoint_url = "http://127.0.0.1:4568"

[lease]
store = "memory"

[[subscription]]
name = "a"
stream = "orders"
plugin = "a.wasm"
start = "trim_horizon"
poll_idle = "50ms"
checkpoint_every = "2s"

[[subscription]]
name = "b"
stream = "orders"
plugin = "b.wasm"
start = { at_timestamp = "2026-12-01T00:00:00Z" }
"#,
        )
        .unwrap();
        assert_eq!(config.subscriptions.len(), 2);
        assert_eq!(config.subscriptions[0].start, StartPosition::TrimHorizon);
        assert_eq!(config.subscriptions[0].poll_idle, Duration::from_millis(50));
        assert!(matches!(
            config.subscriptions[1].start,
            StartPosition::AtTimestamp(_)
        ));
    }

    #[test]
    fn unknown_key_is_named_on_one_line() {
        let err = parse(&format!("{MINIMAL}colour = \"blue\"\n")).unwrap_err();
        assert!(err.contains("subscription[0]"), "{err}");
        assert!(err.contains("colour"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn unknown_top_level_table_is_named() {
        let err = parse(&format!("[aws]\nregoin = \"x\"\n{MINIMAL}")).unwrap_err();
        assert!(err.contains("regoin"), "{err}");
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn bad_duration_names_key_and_value() {
        let err = parse(&format!("{MINIMAL}poll_idle = \"soon\"\n")).unwrap_err();
        assert!(err.contains("subscription[0].poll_idle"), "{err}");
        assert!(err.contains("\"soon\""), "{err}");
    }

    #[test]
    fn bad_start_is_named() {
        let err = parse(&format!("{MINIMAL}start = \"beginning\"\n")).unwrap_err();
        assert!(err.contains("subscription[0].start"), "{err}");
        let err = parse(&format!(
            "{MINIMAL}start = {{ at_timestamp = \"yesterday\" }}\n"
        ))
        .unwrap_err();
        assert!(err.contains("start.at_timestamp"), "{err}");
    }

    #[test]
    fn duplicate_names_and_empty_config_are_refused() {
        let err = parse(&format!("{MINIMAL}{MINIMAL}")).unwrap_err();
        assert!(err.contains("subscription[1].name"), "{err}");
        let err = parse("").unwrap_err();
        assert!(err.contains("no [[subscription]]"), "{err}");
    }

    #[test]
    fn dispatch_modes_and_batches() {
        let sub =
            |extra: &str| parse(&format!("{MINIMAL}{extra}")).map(|c| c.subscriptions[0].clone());
        assert_eq!(sub("").unwrap().dispatch, DispatchMode::Sequential);
        assert_eq!(
            sub("workers = 4\n").unwrap().dispatch,
            DispatchMode::Workers(4)
        );
        assert_eq!(
            sub("workers = 4\nby_key = true\n").unwrap().dispatch,
            DispatchMode::ByKey(4)
        );
        let batch = sub("batch_size = 100\n").unwrap().batch.unwrap();
        assert_eq!(batch.size, 100);
        assert_eq!(batch.window, defaults::BATCH_WINDOW);
        let batch = sub("batch_size = 5\nbatch_window = \"2s\"\n")
            .unwrap()
            .batch
            .unwrap();
        assert_eq!(batch.window, Duration::from_secs(2));
        assert_eq!(batch.max_bytes, defaults::MAX_BATCH_BYTES);
        let batch = sub("batch_size = 5\nmax_batch_bytes = \"512KiB\"\n")
            .unwrap()
            .batch
            .unwrap();
        assert_eq!(batch.max_bytes, 512 << 10);
        for bad in [
            "max_batch_bytes = \"1MiB\"\n",
            "batch_size = 5\nmax_batch_bytes = \"1B\"\n",
            "batch_size = 5\nmax_batch_bytes = \"lots\"\n",
            "batch_size = 5\nmax_memory = \"4MiB\"\nmax_batch_bytes = \"8MiB\"\n",
        ] {
            let err = sub(bad).unwrap_err();
            assert!(
                err.contains("subscription[0].max_batch_bytes"),
                "{bad}: {err}"
            );
        }
        assert!(
            sub("by_key = true\n")
                .unwrap_err()
                .contains("subscription[0].by_key")
        );
        assert!(
            sub("workers = 0\n")
                .unwrap_err()
                .contains("subscription[0].workers")
        );
        assert!(
            sub("batch_size = 0\n")
                .unwrap_err()
                .contains("subscription[0].batch_size")
        );
        assert!(
            sub("batch_window = \"1s\"\n")
                .unwrap_err()
                .contains("subscription[0].batch_window")
        );
    }

    #[test]
    fn canary() {
        let sub =
            |extra: &str| parse(&format!("{MINIMAL}{extra}")).map(|c| c.subscriptions[0].clone());
        assert!(sub("").unwrap().canary.is_none());
        let c = sub("canary = { plugin = \"next.wasm\", key_fraction = 0.1 }\n")
            .unwrap()
            .canary
            .unwrap();
        assert_eq!(c.plugin, PathBuf::from("next.wasm"));
        assert_eq!(c.slice.fraction(), 0.1);
        for bad in ["0", "1.5", "-0.2"] {
            let err = sub(&format!(
                "canary = {{ plugin = \"n.wasm\", key_fraction = {bad} }}\n"
            ))
            .unwrap_err();
            assert!(err.contains("subscription[0].canary.key_fraction"), "{err}");
        }
        let err = sub("canary = { plugin = \"n.wasm\" }\n").unwrap_err();
        assert!(err.contains("key_fraction"), "{err}");
    }

    #[test]
    fn engine_pool_size() {
        assert_eq!(
            parse(MINIMAL).unwrap().max_core_instances,
            defaults::MAX_CORE_INSTANCES
        );
        let with = |n: &str| parse(&format!("[engine]\nmax_core_instances = {n}\n{MINIMAL}"));
        assert_eq!(with("200").unwrap().max_core_instances, 200);
        for bad in ["0", "-3", "100000"] {
            let err = with(bad).unwrap_err();
            assert!(err.contains("engine.max_core_instances"), "{err}");
            assert!(err.contains("out of range"), "{err}");
        }
    }

    #[test]
    fn failure_policy_and_sandbox() {
        let sub =
            |extra: &str| parse(&format!("{MINIMAL}{extra}")).map(|c| c.subscriptions[0].clone());
        let d = sub("").unwrap();
        assert_eq!(d.failure.on_failure, OnFailure::Block);
        assert_eq!(d.failure.max_attempts, None);
        assert_eq!(d.sandbox.max_memory, defaults::MAX_MEMORY);
        let s = sub("on_failure = \"dead_letter\"\ndead_letter_stream = \"dlq\"\nmax_attempts = 3\nmax_record_age = \"1h\"\nmax_memory = \"64MiB\"\nfuel = 1000000\n").unwrap();
        assert_eq!(s.failure.on_failure, OnFailure::DeadLetter("dlq".into()));
        assert_eq!(s.failure.max_attempts, Some(3));
        assert_eq!(s.failure.max_record_age, Some(Duration::from_secs(3600)));
        assert_eq!(s.sandbox.max_memory, 64 << 20);
        assert_eq!(s.sandbox.fuel, Some(1_000_000));
        assert_eq!(
            sub("max_attempts = -1\n").unwrap().failure.max_attempts,
            None
        );
        assert!(
            sub("on_failure = \"dead_letter\"\n")
                .unwrap_err()
                .contains("subscription[0].dead_letter_stream")
        );
        assert!(
            sub("dead_letter_stream = \"x\"\n")
                .unwrap_err()
                .contains("subscription[0].dead_letter_stream")
        );
        assert!(
            sub("on_failure = \"explode\"\n")
                .unwrap_err()
                .contains("on_failure")
        );
        assert!(
            sub("max_memory = \"lots\"\n")
                .unwrap_err()
                .contains("subscription[0].max_memory")
        );
        assert!(
            sub("max_attempts = 0\n")
                .unwrap_err()
                .contains("subscription[0].max_attempts")
        );
        assert!(
            sub("bisect_on_error = true\n")
                .unwrap_err()
                .contains("subscription[0].bisect_on_error")
        );
        assert!(
            sub("env = [\"SHARDLANE_SURELY_UNSET_VARIABLE\"]\n")
                .unwrap_err()
                .contains("subscription[0].env")
        );
        assert!(
            sub("preopen = { host = \"/nonexistent-dir\", guest = \"/data\" }\n")
                .unwrap_err()
                .contains("subscription[0].preopen.host")
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("512KiB"), Some(512 << 10));
        assert_eq!(parse_size("100MB"), Some(100_000_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("MiB"), None);
        assert_eq!(parse_size("12 parsecs"), None);
    }

    #[test]
    fn lease_stores() {
        let lease =
            |text: &str| parse(&format!("[lease]\n{text}\n{MINIMAL}")).map(|c| c.lease.store);
        assert_eq!(lease("store = \"memory\"").unwrap(), LeaseBackend::Memory);
        assert_eq!(
            lease("store = \"file\"\npath = \"/var/lib/x\"").unwrap(),
            LeaseBackend::File {
                path: "/var/lib/x".into()
            }
        );
        assert_eq!(
            lease("store = \"dynamodb\"\ntable = \"leases\"\ncreate_table = true").unwrap(),
            LeaseBackend::DynamoDb {
                table: "leases".into(),
                create_table: true
            }
        );
        assert!(
            lease("store = \"dynamodb\"")
                .unwrap_err()
                .contains("lease.table")
        );
        assert!(
            lease("store = \"memory\"\ntable = \"t\"")
                .unwrap_err()
                .contains("lease.table")
        );
        assert!(
            lease("store = \"dynamodb\"\ntable = \"t\"\npath = \"p\"")
                .unwrap_err()
                .contains("lease.path")
        );
    }

    #[test]
    fn unknown_lease_store_is_named() {
        let err = parse(&format!("[lease]\nstore = \"etcd\"\n{MINIMAL}")).unwrap_err();
        assert!(err.contains("lease.store"), "{err}");
        assert!(err.contains("etcd"), "{err}");
    }
}
