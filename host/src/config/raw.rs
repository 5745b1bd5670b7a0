//! The config file as written: serde mirrors of its tables, unknown keys
//! refused, durations and sizes still strings. [`super::validate`] turns
//! them into the typed config.

use std::path::PathBuf;

use serde::Deserialize;

use super::LeaseStoreKind;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) aws: RawAws,
    #[serde(default)]
    pub(super) admin: RawAdmin,
    #[serde(default)]
    pub(super) metrics: RawMetrics,
    #[serde(default)]
    pub(super) engine: RawEngine,
    #[serde(default)]
    pub(super) lease: RawLease,
    #[serde(default)]
    pub(super) traces: RawTraces,
    #[serde(default)]
    pub(super) artifacts: RawArtifacts,
    #[serde(default, rename = "subscription")]
    pub(super) subscriptions: Vec<RawSubscription>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawArtifacts {
    pub(super) location: Option<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) first_byte_timeout: Option<String>,
    pub(super) transfer_timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAws {
    pub(super) region: Option<String>,
    pub(super) profile: Option<String>,
    pub(super) role_arn: Option<String>,
    pub(super) external_id: Option<String>,
    pub(super) endpoint_url: Option<String>,
    pub(super) dynamodb_endpoint_url: Option<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) read_timeout: Option<String>,
    pub(super) attempt_timeout: Option<String>,
    pub(super) call_timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEngine {
    pub(super) cache_dir: Option<String>,
    pub(super) max_core_instances: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTraces {
    pub(super) otlp_endpoint: Option<String>,
    pub(super) service_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) listen: Option<String>,
    pub(super) emf: Option<String>,
    pub(super) emf_every: Option<String>,
    pub(super) emf_namespace: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub(super) listen: Option<String>,
    pub(super) token: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLease {
    pub(super) store: Option<LeaseStoreKind>,
    pub(super) path: Option<PathBuf>,
    pub(super) table: Option<String>,
    pub(super) create_table: Option<bool>,
    pub(super) owner_id: Option<String>,
    pub(super) lease_duration: Option<String>,
    pub(super) renew_every: Option<String>,
    pub(super) shard_sync_every: Option<String>,
    pub(super) max_leases_per_instance: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSubscription {
    pub(super) name: String,
    pub(super) stream: String,
    pub(super) plugin: PathBuf,
    pub(super) canary: Option<RawCanary>,
    pub(super) start: Option<RawStart>,
    pub(super) read: Option<String>,
    pub(super) consumer_name: Option<String>,
    pub(super) poll_idle: Option<String>,
    pub(super) poll_idle_max: Option<String>,
    pub(super) max_reads_per_second: Option<f64>,
    pub(super) checkpoint_every: Option<String>,
    pub(super) read_limit: Option<i64>,
    pub(super) handler_timeout: Option<String>,
    pub(super) retry_backoff: Option<RawBackoff>,
    pub(super) shutdown_timeout: Option<String>,
    pub(super) workers: Option<i64>,
    pub(super) by_key: Option<bool>,
    pub(super) batch_size: Option<i64>,
    pub(super) batch_window: Option<String>,
    pub(super) max_batch_bytes: Option<String>,
    pub(super) max_attempts: Option<i64>,
    pub(super) max_record_age: Option<String>,
    pub(super) on_failure: Option<RawOnFailure>,
    pub(super) dead_letter_stream: Option<String>,
    pub(super) quarantine: Option<RawQuarantine>,
    pub(super) bisect_on_error: Option<bool>,
    pub(super) max_memory: Option<String>,
    pub(super) fuel: Option<i64>,
    pub(super) env: Option<Vec<String>>,
    pub(super) preopen: Option<RawPreopen>,
    pub(super) log_rate: Option<i64>,
    pub(super) outputs: Option<Vec<String>>,
    pub(super) http: Option<RawHttp>,
    pub(super) config: Option<toml::Table>,
    pub(super) state: Option<RawState>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawState {
    pub(super) ttl: Option<String>,
    pub(super) max_value: Option<String>,
    pub(super) max_per_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) allow: Vec<String>,
    pub(super) timeout: Option<String>,
    pub(super) max_response: Option<String>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawOnFailure {
    Block,
    Skip,
    DeadLetter,
    Quarantine,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuarantine {
    pub(super) max_keys: Option<i64>,
    pub(super) max_records: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCanary {
    pub(super) plugin: PathBuf,
    pub(super) key_fraction: f64,
    pub(super) rollback_on: Option<RawRollbackOn>,
    pub(super) promote_after: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRollbackOn {
    pub(super) failure_rate: f64,
    pub(super) min_records: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPreopen {
    pub(super) host: PathBuf,
    pub(super) guest: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackoff {
    pub(super) initial: Option<String>,
    pub(super) max: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawStart {
    Named(String),
    Table(RawStartTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStartTable {
    pub(super) at_timestamp: String,
}
