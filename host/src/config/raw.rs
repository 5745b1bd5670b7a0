//! The config file as written: serde mirrors of its tables, unknown keys
//! refused, durations and sizes still strings. [`super::validate`] turns
//! them into the typed config.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

use super::LeaseStoreKind;

/// A shardlane config file (shardlane.toml).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    /// AWS access: region, credentials, endpoints and the deadlines of every AWS call.
    #[serde(default)]
    pub(super) aws: RawAws,
    /// The operations server: health, readiness, metrics, the status page and the write endpoints.
    #[serde(default)]
    pub(super) admin: RawAdmin,
    /// The read-only routes on a listener of their own, and CloudWatch EMF.
    #[serde(default)]
    pub(super) metrics: RawMetrics,
    /// The Wasm engine: the compile cache and plugin size limits.
    #[serde(default)]
    pub(super) engine: RawEngine,
    /// Where leases, checkpoints, fleet versions and state live.
    #[serde(default)]
    pub(super) lease: RawLease,
    /// Export handler-call and GetRecords spans over OTLP/HTTP.
    #[serde(default)]
    pub(super) traces: RawTraces,
    /// Where plugin versions' bytes are kept for the fleet, and the deadlines of every call to it.
    #[serde(default)]
    pub(super) artifacts: RawArtifacts,
    /// One block per subscription: a stream read by a plugin; several run side by side.
    #[serde(default, rename = "subscription")]
    pub(super) subscriptions: Vec<RawSubscription>,
}

/// `[artifacts]`: where plugin versions are kept for the fleet.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawArtifacts {
    /// "s3://bucket/prefix", "oci://host/repository", "oci+http://host:port/repository" or a folder (relative to the config). Default: the memory or file lease store's own; none for DynamoDB (deploys refused).
    pub(super) location: Option<String>,
    /// Artifact-store calls: connecting (default "3s").
    pub(super) connect_timeout: Option<String>,
    /// Artifact-store calls: the first byte of an answer, and any stall between two reads (default "10s").
    pub(super) first_byte_timeout: Option<String>,
    /// Artifact-store calls: the whole call (default "60s").
    pub(super) transfer_timeout: Option<String>,
}

/// `[aws]`: AWS access and the deadlines of every AWS call.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAws {
    /// The AWS region; else AWS_REGION or the profile's.
    pub(super) region: Option<String>,
    /// A named profile of ~/.aws/config and ~/.aws/credentials; environment credentials still come first.
    pub(super) profile: Option<String>,
    /// Assume this role (STS) for every call, with the credentials found otherwise.
    pub(super) role_arn: Option<String>,
    /// The external id to assume role_arn with.
    pub(super) external_id: Option<String>,
    /// The Kinesis endpoint (an emulator); else AWS_ENDPOINT_URL_KINESIS.
    pub(super) endpoint_url: Option<String>,
    /// The DynamoDB endpoint (an emulator); else AWS_ENDPOINT_URL_DYNAMODB.
    pub(super) dynamodb_endpoint_url: Option<String>,
    /// Every AWS call: establishing a connection (default "3s").
    pub(super) connect_timeout: Option<String>,
    /// Every AWS call: from sending a request to its answer's first byte (default "10s").
    pub(super) read_timeout: Option<String>,
    /// Every AWS call: one attempt, whole answer included (default "15s").
    pub(super) attempt_timeout: Option<String>,
    /// Every AWS call: one call, the SDK's retries included (default "30s").
    pub(super) call_timeout: Option<String>,
}

/// `[engine]`: the Wasm engine.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEngine {
    /// Where compiled plugins are cached; default $XDG_CACHE_HOME/shardlane/components (else ~/.cache/shardlane/components); "off" disables it.
    pub(super) cache_dir: Option<String>,
    /// Core module instances one plugin may contain (default 64); a larger plugin is refused at load.
    pub(super) max_core_instances: Option<i64>,
}

/// `[traces]`: OTLP/HTTP span export.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTraces {
    /// The OTLP/HTTP collector's base URL (spans go to /v1/traces).
    pub(super) otlp_endpoint: Option<String>,
    /// The spans' service.name (default "shardlane").
    pub(super) service_name: Option<String>,
}

/// `[metrics]`: the read-only routes on a listener of their own.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    /// Serve /healthz, /readyz, /metrics and the status page here; `[admin]` listen then serves only the writes.
    pub(super) listen: Option<String>,
    /// Also write the metrics as CloudWatch embedded metric format JSON lines: "stdout" or a file path.
    pub(super) emf: Option<String>,
    /// How often EMF lines are written (default "60s").
    pub(super) emf_every: Option<String>,
    /// The CloudWatch namespace of EMF lines (default "shardlane").
    pub(super) emf_namespace: Option<String>,
}

/// `[admin]`: the operations server.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    /// Where the operations server listens (default "127.0.0.1:9090"), or "off".
    pub(super) listen: Option<String>,
    /// Enables the write endpoints (Authorization: Bearer); or SHARDLANE_ADMIN_TOKEN.
    pub(super) token: Option<String>,
}

/// `[lease]`: the lease store.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLease {
    /// "file" (default), "memory" or "dynamodb".
    pub(super) store: Option<LeaseStoreKind>,
    /// The file store's folder (default "shardlane-state").
    pub(super) path: Option<PathBuf>,
    /// The DynamoDB store's table (required with store = "dynamodb").
    pub(super) table: Option<String>,
    /// DynamoDB store: create the table at start-up when missing (default false).
    pub(super) create_table: Option<bool>,
    /// This instance's id; default hostname-pid-random.
    pub(super) owner_id: Option<String>,
    /// A lease whose counter and owner's heartbeat have not moved this long is free (default "10s").
    pub(super) lease_duration: Option<String>,
    /// The heartbeat's interval; shorter than lease_duration (default "3s").
    pub(super) renew_every: Option<String>,
    /// How often shards are listed: new shards, resharding, balancing (default "10s").
    pub(super) shard_sync_every: Option<String>,
    /// The most leases of a subscription one instance takes (KCL's maxLeasesForWorker).
    pub(super) max_leases_per_instance: Option<i64>,
}

/// `[[subscription]]`: one stream read by one plugin.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSubscription {
    /// The application's name; keys its leases, checkpoints and versions.
    pub(super) name: String,
    /// The stream's name, or its ARN (another account's, in `[aws]` region).
    pub(super) stream: String,
    /// The plugin component (relative to the config): the first declaration of an empty fleet.
    pub(super) plugin: PathBuf,
    /// A canary candidate for a slice of the keys, optionally with rules that decide.
    pub(super) canary: Option<RawCanary>,
    /// Where a shard without a checkpoint starts: "latest" (default), "trim_horizon" or { at_timestamp = "…" }.
    pub(super) start: Option<RawStart>,
    /// "polling" (default) or "fan_out" (enhanced fan-out).
    pub(super) read: Option<String>,
    /// Fan-out: the stream consumer's name; default the subscription's.
    pub(super) consumer_name: Option<String>,
    /// Wait after a read that returned nothing (default "200ms").
    pub(super) poll_idle: Option<String>,
    /// ...growing to this on a shard quiet for 30 s (default "1500ms").
    pub(super) poll_idle_max: Option<String>,
    /// GetRecords per shard per second at most (default 5).
    pub(super) max_reads_per_second: Option<f64>,
    /// At most one checkpoint write per shard per interval (default "10s").
    pub(super) checkpoint_every: Option<String>,
    /// Records per GetRecords, 1 to 10000 (default 1000).
    pub(super) read_limit: Option<i64>,
    /// A longer handler call is interrupted and retried (default "30s").
    pub(super) handler_timeout: Option<String>,
    /// The jittered, doubling wait before a retry.
    pub(super) retry_backoff: Option<RawBackoff>,
    /// Time in-flight records get on shutdown or hand-over (default "10s").
    pub(super) shutdown_timeout: Option<String>,
    /// Up to this many handler calls at once (unordered unless by_key).
    pub(super) workers: Option<i64>,
    /// With workers: lanes by partition key, per-key order kept.
    pub(super) by_key: Option<bool>,
    /// Batch-handler plugins: up to this many records per call.
    pub(super) batch_size: Option<i64>,
    /// ...or what arrived within this of the batch's first record (default "50ms").
    pub(super) batch_window: Option<String>,
    /// ...and never more bytes than this (default "6MiB", Lambda's limit).
    pub(super) max_batch_bytes: Option<String>,
    /// Attempts before on_failure applies; default unlimited (-1).
    pub(super) max_attempts: Option<i64>,
    /// Give up on records older than this.
    pub(super) max_record_age: Option<String>,
    /// What happens to a record given up on: "block" (default), "skip", "dead_letter" or "quarantine".
    pub(super) on_failure: Option<RawOnFailure>,
    /// With on_failure = "dead_letter" or "quarantine": the stream given-up records go to; must exist.
    pub(super) dead_letter_stream: Option<String>,
    /// With on_failure = "quarantine": how many keys may be parked at once, and records per key.
    pub(super) quarantine: Option<RawQuarantine>,
    /// Batches: split a failing batch in halves (default false).
    pub(super) bisect_on_error: Option<bool>,
    /// Linear memory per instance (default "128MiB").
    pub(super) max_memory: Option<String>,
    /// Fuel per call: a deterministic CPU bound (default none).
    pub(super) fuel: Option<i64>,
    /// Environment variables granted to the plugin (values from the host's).
    pub(super) env: Option<Vec<String>>,
    /// One read-only directory granted to the plugin.
    pub(super) preopen: Option<RawPreopen>,
    /// Guest log lines per second per instance, in bursts of twice that (default 1000).
    pub(super) log_rate: Option<i64>,
    /// Contract 0.2.0: the streams the plugin may publish to; each must exist.
    pub(super) outputs: Option<Vec<String>>,
    /// Contract 0.2.0: the hosts the plugin may reach over wasi:http, and its limits.
    pub(super) http: Option<RawHttp>,
    /// Contract 0.2.0: the plugin's wasi:config/store values (strings).
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub(super) config: Option<toml::Table>,
    /// Contract 0.2.0: per-key state, committed with the checkpoint (ordered dispatch only).
    pub(super) state: Option<RawState>,
    /// Lambda-style event filter: up to five patterns (JSON strings); a record matching none settles without a call.
    pub(super) filter: Option<Vec<String>>,
    /// Contract 0.3.0: tumbling windows of arrival time, closed by the plugin's close-window, exactly once with the checkpoint.
    pub(super) window: Option<RawWindow>,
}

/// Tumbling windows: `{ size = "60s", by = "key" }`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWindow {
    /// The length of a window, "1s" to "15m" (Lambda's TumblingWindowInSeconds).
    pub(super) size: String,
    /// "shard" (default: one close per window of a shard) or "key" (one close per key of the window).
    pub(super) by: Option<String>,
    /// How long past its end a window stays open on a quiet shard (default "1s", at most size).
    pub(super) grace: Option<String>,
}

/// Per-key state limits.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawState {
    /// A value not written for this long expires (default: never).
    pub(super) ttl: Option<String>,
    /// The largest value (default "64KiB").
    pub(super) max_value: Option<String>,
    /// The most bytes one key's values take (default "128KiB").
    pub(super) max_per_key: Option<String>,
}

/// Outbound HTTP granted to the plugin.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    /// The host:port pairs the plugin may reach.
    pub(super) allow: Vec<String>,
    /// Per request, never past handler_timeout (default "5s").
    pub(super) timeout: Option<String>,
    /// Response bodies are cut at this size (default "1MiB").
    pub(super) max_response: Option<String>,
}

/// What happens to a record given up on.
#[derive(Deserialize, JsonSchema, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawOnFailure {
    /// Keep retrying; the shard waits (the default).
    Block,
    /// Drop the record and go on.
    Skip,
    /// Put the record to dead_letter_stream and go on.
    DeadLetter,
    /// Park the record's key: it and every later record of the key go to dead_letter_stream.
    Quarantine,
}

/// Parked-key limits of on_failure = "quarantine".
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuarantine {
    /// Keys parked at once, 1 to 100000 (default 100).
    pub(super) max_keys: Option<i64>,
    /// Records one parked key may hold (default 100000).
    pub(super) max_records: Option<i64>,
}

/// A canary candidate.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCanary {
    /// The candidate component (relative to the config).
    pub(super) plugin: PathBuf,
    /// The share of partition keys the candidate handles, 0 to 1.
    pub(super) key_fraction: f64,
    /// Roll back by itself when the candidate fails this much more than stable.
    pub(super) rollback_on: Option<RawRollbackOn>,
    /// Promote by itself once this has passed without a rollback.
    pub(super) promote_after: Option<String>,
}

/// A canary's rollback rule.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRollbackOn {
    /// Roll back when the candidate's failure rate exceeds stable's by more than this (0 to 1).
    pub(super) failure_rate: f64,
    /// Records the candidate must handle before it is judged (default 100).
    pub(super) min_records: Option<u64>,
}

/// A read-only directory granted to the plugin.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPreopen {
    /// The host directory.
    pub(super) host: PathBuf,
    /// Where the plugin sees it.
    pub(super) guest: String,
}

/// A jittered, doubling backoff.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackoff {
    /// The first wait (default "100ms").
    pub(super) initial: Option<String>,
    /// The longest wait (default "30s").
    pub(super) max: Option<String>,
}

/// Where a shard without a checkpoint starts.
#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum RawStart {
    /// "latest" or "trim_horizon".
    Named(String),
    /// { at_timestamp = "…" }.
    Table(RawStartTable),
}

/// Start at a time.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStartTable {
    /// An RFC 3339 time: start at the first record that arrived then or later.
    pub(super) at_timestamp: String,
}
