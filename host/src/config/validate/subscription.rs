//! The checks of one `[[subscription]]` block: reading, dispatch, batches,
//! the failure policy, the sandbox and its grants, the canary.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::super::raw::{
    RawBackoff, RawCanary, RawHttp, RawOnFailure, RawPreopen, RawStart, RawState, RawSubscription,
};
use super::super::{
    BatchConfig, CanaryConfig, ConfigError, DispatchMode, FailurePolicy, Grants, HttpDestination,
    HttpGrant, OnFailure, Preopen, ReadMode, SandboxConfig, StartPosition, SubscriptionConfig,
    defaults,
};
use super::Validator;
use crate::config::StateConfig;
use crate::filter::Filter;
use crate::ids::{StreamName, SubscriptionName};
use crate::key_slice::KeySlice;
use crate::parked::ParkLimits;
use crate::windows::{WindowBy, WindowSpec};

/// The checks of `subscription[i]`, each naming its key under that prefix.
pub(super) struct Subscription<'a, 'f> {
    pub(super) v: &'a Validator<'f>,
    pub(super) i: usize,
}

impl Subscription<'_, '_> {
    fn at(&self, key: &str) -> String {
        format!("subscription[{}].{key}", self.i)
    }

    pub(super) fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        self.v.invalid(self.at(key), message)
    }

    fn duration(
        &self,
        key: &str,
        value: Option<&str>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        self.v.duration(&self.at(key), value, default)
    }

    /// Everything but the name (checked against the other subscriptions'
    /// first).
    pub(super) fn check(&self, sub: RawSubscription) -> Result<SubscriptionConfig, ConfigError> {
        if sub.stream.trim().is_empty() {
            return Err(self.invalid("stream", "must not be empty"));
        }
        let start = self.start(sub.start.as_ref())?;
        let read_limit = self.read_limit(sub.read_limit)?;
        let (poll_idle, poll_idle_max, max_reads_per_second) = self.read_budget(&sub)?;
        let read = self.read_mode(&sub)?;
        let (retry_backoff_initial, retry_backoff_max) =
            self.retry_backoff(sub.retry_backoff.as_ref())?;
        let dispatch = self.dispatch(sub.workers, sub.by_key)?;
        let batch = self.batch(&sub)?;
        let failure = self.failure(&sub, batch.is_some())?;
        let sandbox = self.sandbox(&sub, batch)?;
        if sandbox.grants.state.is_some() && matches!(dispatch, DispatchMode::Workers(_)) {
            return Err(self.invalid(
                "state",
                "needs ordered dispatch, where a key's records are handled one after another: sequential, or workers with by_key = true",
            ));
        }
        let canary = self.canary(sub.canary.as_ref())?;
        let filter = match sub.filter.as_deref() {
            None | Some([]) => None,
            Some(patterns) => Some(Arc::new(
                Filter::parse(patterns).map_err(|e| self.invalid("filter", e.to_string()))?,
            )),
        };
        let window = self.window(&sub, dispatch)?;
        Ok(SubscriptionConfig {
            window,
            filter,
            canary,
            failure,
            sandbox,
            dispatch,
            batch,
            name: SubscriptionName::new(sub.name),
            stream: StreamName::new(sub.stream),
            plugin: sub.plugin,
            start,
            read,
            poll_idle,
            poll_idle_max,
            max_reads_per_second,
            checkpoint_every: self.duration(
                "checkpoint_every",
                sub.checkpoint_every.as_deref(),
                defaults::CHECKPOINT_EVERY,
            )?,
            read_limit,
            handler_timeout: self.duration(
                "handler_timeout",
                sub.handler_timeout.as_deref(),
                defaults::HANDLER_TIMEOUT,
            )?,
            retry_backoff_initial,
            retry_backoff_max,
            shutdown_timeout: self.duration(
                "shutdown_timeout",
                sub.shutdown_timeout.as_deref(),
                defaults::SHUTDOWN_TIMEOUT,
            )?,
        })
    }

    /// `window`: its size, whom a close is for and its grace; and
    /// the order it needs (module docs of [`crate::windows`]).
    fn window(
        &self,
        sub: &RawSubscription,
        dispatch: DispatchMode,
    ) -> Result<Option<WindowSpec>, ConfigError> {
        let Some(raw) = &sub.window else {
            return Ok(None);
        };
        let size = self.duration("window.size", Some(&raw.size), Duration::ZERO)?;
        if size < Duration::from_secs(1) || size > defaults::WINDOW_MAX_SIZE {
            return Err(self.invalid(
                "window.size",
                format!("{} is out of range: a window lasts 1s to 15m", raw.size),
            ));
        }
        let by = match raw.by.as_deref() {
            None | Some("shard") => WindowBy::Shard,
            Some("key") => WindowBy::Key,
            Some(other) => {
                return Err(self.invalid(
                    "window.by",
                    format!("{other:?} is not a choice; use \"shard\" or \"key\""),
                ));
            }
        };
        let grace = self.duration("window.grace", raw.grace.as_deref(), defaults::WINDOW_GRACE)?;
        if grace > size {
            return Err(self.invalid("window.grace", "must not be longer than window.size"));
        }
        match (by, dispatch) {
            (_, DispatchMode::Sequential) | (WindowBy::Key, DispatchMode::ByKey(_)) => {}
            (WindowBy::Key, _) => {
                return Err(self.invalid(
                    "window",
                    "by = \"key\" needs ordered dispatch, where a key's close follows its records: sequential, or workers with by_key = true",
                ));
            }
            (WindowBy::Shard, _) => {
                return Err(self.invalid(
                    "window",
                    "by = \"shard\" needs sequential dispatch (no workers), where a shard's close follows every record of its window",
                ));
            }
        }
        Ok(Some(WindowSpec { size, by, grace }))
    }

    fn start(&self, start: Option<&RawStart>) -> Result<StartPosition, ConfigError> {
        Ok(match start {
            None => StartPosition::Latest,
            Some(RawStart::Named(name)) => match name.as_str() {
                "latest" => StartPosition::Latest,
                "trim_horizon" => StartPosition::TrimHorizon,
                other => {
                    return Err(self.invalid(
                        "start",
                        format!(
                            "{other:?} is not a start position; use \"latest\", \"trim_horizon\" or {{ at_timestamp = \"2026-12-01T00:00:00Z\" }}"
                        ),
                    ));
                }
            },
            Some(RawStart::Table(table)) => {
                let ts = humantime::parse_rfc3339_weak(&table.at_timestamp).map_err(|e| {
                    self.invalid(
                        "start.at_timestamp",
                        format!("{:?} is not an RFC 3339 time ({e})", table.at_timestamp),
                    )
                })?;
                StartPosition::AtTimestamp(ts)
            }
        })
    }

    /// `read` and `consumer_name`.
    fn read_mode(&self, sub: &RawSubscription) -> Result<ReadMode, ConfigError> {
        match sub.read.as_deref() {
            None | Some("polling") => {
                if sub.consumer_name.is_some() {
                    return Err(self.invalid(
                        "consumer_name",
                        "is for enhanced fan-out: set read = \"fan_out\" too, or remove it",
                    ));
                }
                Ok(ReadMode::Polling)
            }
            Some("fan_out") => {
                let consumer = sub
                    .consumer_name
                    .clone()
                    .unwrap_or_else(|| sub.name.clone());
                let valid = (1..=128).contains(&consumer.len())
                    && consumer
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
                if !valid {
                    return Err(self.invalid(
                        "consumer_name",
                        format!("{consumer:?} is not a stream consumer name: 1 to 128 letters, digits, '_', '.' or '-' (it defaults to the subscription's name)"),
                    ));
                }
                Ok(ReadMode::FanOut { consumer })
            }
            Some(other) => Err(self.invalid(
                "read",
                format!("{other:?} is not a way to read; use \"polling\" (default) or \"fan_out\""),
            )),
        }
    }

    /// `poll_idle`, `poll_idle_max` (at least `poll_idle`; by default the
    /// larger of its default and `poll_idle`) and `max_reads_per_second`.
    fn read_budget(&self, sub: &RawSubscription) -> Result<(Duration, Duration, f64), ConfigError> {
        let poll_idle =
            self.duration("poll_idle", sub.poll_idle.as_deref(), defaults::POLL_IDLE)?;
        let poll_idle_max = self.duration(
            "poll_idle_max",
            sub.poll_idle_max.as_deref(),
            defaults::POLL_IDLE_MAX.max(poll_idle),
        )?;
        // A shard iterator expires after five minutes: a longer wait only
        // forces a reopen (and a huge one would overflow the clock).
        for (key, wait) in [("poll_idle", poll_idle), ("poll_idle_max", poll_idle_max)] {
            if wait > Duration::from_secs(300) {
                return Err(self.invalid(
                    key,
                    format!(
                        "{wait:?} is longer than 5 minutes, after which a shard iterator expires"
                    ),
                ));
            }
        }
        if poll_idle_max < poll_idle {
            return Err(self.invalid(
                "poll_idle_max",
                format!("{poll_idle_max:?} is shorter than poll_idle ({poll_idle:?})"),
            ));
        }
        let rate = sub
            .max_reads_per_second
            .unwrap_or(defaults::MAX_READS_PER_SECOND);
        if !(rate.is_finite() && (0.01..=1000.0).contains(&rate)) {
            return Err(self.invalid(
                "max_reads_per_second",
                format!("{rate} is out of range: from 0.01 to 1000 (Kinesis allows 5 per shard, shared by every consumer)"),
            ));
        }
        Ok((poll_idle, poll_idle_max, rate))
    }

    fn read_limit(&self, read_limit: Option<i64>) -> Result<i32, ConfigError> {
        match read_limit {
            None => Ok(defaults::READ_LIMIT),
            Some(n @ 1..=10_000) => Ok(n as i32),
            Some(n) => Err(self.invalid(
                "read_limit",
                format!("{n} is out of range: GetRecords takes 1 to 10000"),
            )),
        }
    }

    fn retry_backoff(
        &self,
        backoff: Option<&RawBackoff>,
    ) -> Result<(Duration, Duration), ConfigError> {
        let (initial, max) =
            backoff.map_or((None, None), |b| (b.initial.as_deref(), b.max.as_deref()));
        let initial = self.duration(
            "retry_backoff.initial",
            initial,
            defaults::RETRY_BACKOFF_INITIAL,
        )?;
        let max = self.duration("retry_backoff.max", max, defaults::RETRY_BACKOFF_MAX)?;
        if max < initial {
            return Err(self.invalid(
                "retry_backoff.max",
                "must not be shorter than retry_backoff.initial",
            ));
        }
        Ok((initial, max))
    }

    fn dispatch(
        &self,
        workers: Option<i64>,
        by_key: Option<bool>,
    ) -> Result<DispatchMode, ConfigError> {
        match (workers, by_key.unwrap_or(false)) {
            (None, false) => Ok(DispatchMode::Sequential),
            (None, true) => Err(self.invalid(
                "by_key",
                "needs `workers`: by_key spreads keys over `workers` lanes",
            )),
            (Some(n @ 1..=defaults::MAX_WORKERS), true) => Ok(DispatchMode::ByKey(n as usize)),
            (Some(n @ 1..=defaults::MAX_WORKERS), false) => Ok(DispatchMode::Workers(n as usize)),
            (Some(n), _) => Err(self.invalid(
                "workers",
                format!("{n} is out of range: 1 to {}", defaults::MAX_WORKERS),
            )),
        }
    }

    fn batch(&self, sub: &RawSubscription) -> Result<Option<BatchConfig>, ConfigError> {
        if sub.batch_size.is_none() && sub.max_batch_bytes.is_some() {
            return Err(self.invalid(
                "max_batch_bytes",
                "needs `batch_size`: the byte limit only applies to batches",
            ));
        }
        match (sub.batch_size, &sub.batch_window) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(self.invalid(
                "batch_window",
                "needs `batch_size`: the window only applies to batches",
            )),
            (Some(size @ 1..=defaults::MAX_BATCH_SIZE), window) => Ok(Some(BatchConfig {
                size: size as usize,
                max_bytes: self.v.size(
                    &self.at("max_batch_bytes"),
                    sub.max_batch_bytes.as_deref(),
                    defaults::MAX_BATCH_BYTES,
                    (1 << 10, "1KiB"),
                    "\"6MiB\", \"512KiB\"",
                )?,
                window: self.duration("batch_window", window.as_deref(), defaults::BATCH_WINDOW)?,
            })),
            (Some(size), _) => Err(self.invalid(
                "batch_size",
                format!("{size} is out of range: 1 to {}", defaults::MAX_BATCH_SIZE),
            )),
        }
    }

    fn failure(&self, sub: &RawSubscription, batches: bool) -> Result<FailurePolicy, ConfigError> {
        let on_failure = match (
            sub.on_failure.unwrap_or(RawOnFailure::Block),
            &sub.dead_letter_stream,
        ) {
            (RawOnFailure::DeadLetter, Some(stream)) if !stream.trim().is_empty() => {
                OnFailure::DeadLetter(StreamName::new(stream.as_str()))
            }
            (RawOnFailure::Quarantine, Some(stream)) if !stream.trim().is_empty() => {
                OnFailure::Quarantine(StreamName::new(stream.as_str()))
            }
            (RawOnFailure::DeadLetter, _) => {
                return Err(self.invalid(
                    "dead_letter_stream",
                    "on_failure = \"dead_letter\" needs the stream to put failed records to",
                ));
            }
            (RawOnFailure::Quarantine, _) => {
                return Err(self.invalid(
                    "dead_letter_stream",
                    "on_failure = \"quarantine\" needs the stream to put parked records to",
                ));
            }
            (_, Some(_)) => {
                return Err(self.invalid(
                    "dead_letter_stream",
                    "only applies with on_failure = \"dead_letter\" or \"quarantine\"",
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
                    "max_attempts",
                    format!("{n} is out of range: 1 to 1000000, or -1 for unlimited"),
                ));
            }
        };
        let failure = FailurePolicy {
            max_attempts,
            max_record_age: match sub.max_record_age.as_deref() {
                None => None,
                Some(age) => Some(self.duration("max_record_age", Some(age), Duration::ZERO)?),
            },
            on_failure,
            bisect_on_error: sub.bisect_on_error.unwrap_or(false),
            quarantine: self.quarantine(sub)?,
        };
        if failure.bisect_on_error && !batches {
            return Err(self.invalid(
                "bisect_on_error",
                "only applies to batches (set batch_size)",
            ));
        }
        Ok(failure)
    }

    /// `quarantine = { max_keys, max_records }`, only with
    /// `on_failure = "quarantine"`.
    fn quarantine(&self, sub: &RawSubscription) -> Result<ParkLimits, ConfigError> {
        let mut limits = ParkLimits {
            max_keys: defaults::QUARANTINE_MAX_KEYS,
            max_records: defaults::QUARANTINE_MAX_RECORDS,
        };
        let Some(raw) = &sub.quarantine else {
            return Ok(limits);
        };
        if sub.on_failure != Some(RawOnFailure::Quarantine) {
            return Err(self.invalid(
                "quarantine",
                "only applies with on_failure = \"quarantine\"",
            ));
        }
        if let Some(keys) = raw.max_keys {
            limits.max_keys = match usize::try_from(keys) {
                Ok(n @ 1..=defaults::QUARANTINE_MAX_KEYS_LIMIT) => n,
                _ => {
                    return Err(self.invalid(
                        "quarantine.max_keys",
                        format!(
                            "{keys} is out of range: 1 to {}",
                            defaults::QUARANTINE_MAX_KEYS_LIMIT
                        ),
                    ));
                }
            };
        }
        if let Some(records) = raw.max_records {
            limits.max_records = match u64::try_from(records) {
                Ok(n @ 1..=10_000_000) => n,
                _ => {
                    return Err(self.invalid(
                        "quarantine.max_records",
                        format!("{records} is out of range: 1 to 10000000"),
                    ));
                }
            };
        }
        Ok(limits)
    }

    fn sandbox(
        &self,
        sub: &RawSubscription,
        batch: Option<BatchConfig>,
    ) -> Result<SandboxConfig, ConfigError> {
        let max_memory = self.v.size(
            &self.at("max_memory"),
            sub.max_memory.as_deref(),
            defaults::MAX_MEMORY,
            (1 << 20, "1MiB"),
            "\"64MiB\", \"1GiB\"",
        )?;
        // A batch set to exceed the guest's whole memory can never be
        // lowered into it. (The default limit may: such batches split when
        // lowering fails, see dispatch.)
        if let (Some(b), Some(text)) = (batch, sub.max_batch_bytes.as_deref())
            && b.max_bytes > max_memory
        {
            return Err(self.invalid(
                "max_batch_bytes",
                format!(
                    "{text:?} exceeds max_memory ({max_memory} bytes): such a batch cannot be lowered into the guest"
                ),
            ));
        }
        let fuel = match sub.fuel {
            None => None,
            Some(n) if n > 0 => Some(n as u64),
            Some(n) => return Err(self.invalid("fuel", format!("{n} must be positive"))),
        };
        let mut env = Vec::new();
        for name in sub.env.clone().unwrap_or_default() {
            match std::env::var(&name) {
                Ok(value) => env.push((name, value)),
                Err(_) => {
                    return Err(self.invalid(
                        "env",
                        format!("{name:?} is not set in the host's environment"),
                    ));
                }
            }
        }
        let preopen = match &sub.preopen {
            None => None,
            Some(p) => Some(self.preopen(p)?),
        };
        let log_rate = self.v.count(
            &self.at("log_rate"),
            sub.log_rate,
            defaults::LOG_RATE,
            1..=1_000_000,
            "1 to 1000000",
        )?;
        Ok(SandboxConfig {
            max_memory,
            fuel,
            env,
            preopen,
            log_rate,
            grants: Arc::new(self.grants(sub)?),
        })
    }

    /// `outputs`, `config` and `http`: what a 0.2.0 plugin may reach.
    fn grants(&self, sub: &RawSubscription) -> Result<Grants, ConfigError> {
        let mut outputs = BTreeSet::new();
        for (j, stream) in sub.outputs.iter().flatten().enumerate() {
            if stream.trim().is_empty() {
                return Err(self.invalid(&format!("outputs[{j}]"), "must not be empty"));
            }
            if !outputs.insert(StreamName::new(stream.as_str())) {
                return Err(self.invalid(
                    &format!("outputs[{j}]"),
                    format!("{stream:?} is listed twice"),
                ));
            }
        }
        let mut config = BTreeMap::new();
        for (key, value) in sub.config.iter().flatten() {
            let Some(text) = value.as_str() else {
                return Err(self.invalid(
                    &format!("config.{key}"),
                    format!(
                        "{value} ({}) is not a string: config values reach the plugin as strings (quote it)",
                        value.type_str()
                    ),
                ));
            };
            config.insert(key.clone(), text.to_owned());
        }
        let http = match &sub.http {
            None => None,
            Some(http) => Some(self.http(http)?),
        };
        let state = match &sub.state {
            None => None,
            Some(state) => Some(Arc::new(self.state(state)?)),
        };
        Ok(Grants {
            outputs,
            config,
            http,
            state,
        })
    }

    fn state(&self, state: &RawState) -> Result<StateConfig, ConfigError> {
        let ttl = match state.ttl.as_deref() {
            None => None,
            Some(ttl) => Some(self.duration("state.ttl", Some(ttl), Duration::ZERO)?),
        };
        let size = |key: &str, value: Option<&str>, default: u64| {
            self.v
                .size(
                    &self.at(key),
                    value,
                    default as usize,
                    (1, "1 byte"),
                    "\"64KiB\", \"1MiB\"",
                )
                .map(|n| n as u64)
        };
        let max_value = size(
            "state.max_value",
            state.max_value.as_deref(),
            defaults::STATE_MAX_VALUE,
        )?;
        let max_per_key = size(
            "state.max_per_key",
            state.max_per_key.as_deref(),
            defaults::STATE_MAX_PER_KEY.max(max_value),
        )?;
        if max_per_key < max_value {
            return Err(self.invalid(
                "state.max_per_key",
                format!("{max_per_key} bytes is less than state.max_value ({max_value} bytes)"),
            ));
        }
        Ok(StateConfig {
            ttl,
            max_value,
            max_per_key,
        })
    }

    fn http(&self, http: &RawHttp) -> Result<HttpGrant, ConfigError> {
        let mut allow = Vec::with_capacity(http.allow.len());
        for (j, entry) in http.allow.iter().enumerate() {
            allow.push(parse_destination(entry).map_err(|why| {
                self.invalid(&format!("http.allow[{j}]"), format!("{entry:?} {why}"))
            })?);
        }
        Ok(HttpGrant {
            allow,
            timeout: self.duration(
                "http.timeout",
                http.timeout.as_deref(),
                defaults::HTTP_TIMEOUT,
            )?,
            max_response: self.v.size(
                &self.at("http.max_response"),
                http.max_response.as_deref(),
                defaults::HTTP_MAX_RESPONSE as usize,
                (1, "1 byte"),
                "\"1MiB\", \"64KiB\"",
            )? as u64,
            safe_methods_only: false,
        })
    }

    fn preopen(&self, p: &RawPreopen) -> Result<Preopen, ConfigError> {
        if !p.host.is_dir() {
            return Err(self.invalid(
                "preopen.host",
                format!("{} is not a directory", p.host.display()),
            ));
        }
        if !p.guest.starts_with('/') {
            return Err(self.invalid("preopen.guest", "must be an absolute path, e.g. \"/data\""));
        }
        Ok(Preopen {
            host: p.host.clone(),
            guest: p.guest.clone(),
        })
    }

    fn canary(&self, canary: Option<&RawCanary>) -> Result<Option<CanaryConfig>, ConfigError> {
        let Some(c) = canary else {
            return Ok(None);
        };
        let slice = KeySlice::new(c.key_fraction).ok_or_else(|| {
            self.invalid(
                "canary.key_fraction",
                format!(
                    "{} is out of range: more than 0 (at least 0.000001), at most 1",
                    c.key_fraction
                ),
            )
        })?;
        let mut rules = crate::fleet_versions::CanaryRules {
            min_records: defaults::CANARY_MIN_RECORDS,
            ..Default::default()
        };
        if let Some(on) = &c.rollback_on {
            if !(0.0..1.0).contains(&on.failure_rate) {
                return Err(self.invalid(
                    "canary.rollback_on.failure_rate",
                    format!(
                        "{} is out of range: from 0 (any failure more than the stable version's) to less than 1",
                        on.failure_rate
                    ),
                ));
            }
            rules.rollback_failure_rate = Some(on.failure_rate);
            rules.min_records = on.min_records.unwrap_or(rules.min_records).max(1);
        }
        if let Some(after) = c.promote_after.as_deref() {
            let after = self.duration("canary.promote_after", Some(after), Duration::ZERO)?;
            rules.promote_after_ms = Some(after.as_millis() as u64);
        }
        Ok(Some(CanaryConfig {
            plugin: c.plugin.clone(),
            slice,
            rules,
        }))
    }
}

/// `host:port` (an IPv6 address in brackets: `[::1]:8080`), the port
/// required; the host kept in lower case.
fn parse_destination(entry: &str) -> Result<HttpDestination, &'static str> {
    let (host, port) = entry
        .rsplit_once(':')
        .ok_or("is not host:port (the port is required, e.g. \"api.example.com:443\")")?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty()
        || host.contains(['/', ' ', '@'])
        || host.contains(':') && !entry.starts_with('[')
    {
        return Err("is not host:port (write an IPv6 address in brackets: \"[::1]:8080\")");
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or("has no valid port (1 to 65535)")?;
    Ok(HttpDestination {
        host: host.to_ascii_lowercase(),
        port,
    })
}
