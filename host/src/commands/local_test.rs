//! `shardlane test`: a plugin run over a file of records on the author's
//! machine — no AWS, no emulator, no network — through the subscription's
//! own pipeline: its filter, dispatch mode, batching, failure policy,
//! sandbox limits, state (in memory, seeded from a file) and config.
//!
//! The records ([`records`]) are served as a stream of closed shards
//! through the seams the pipeline reads Kinesis through
//! ([`Source::Given`]), leases and state live in a memory lease store,
//! and outputs and dead letters go to the [`journal`], which also sees
//! every handler call through a wrapper around the plugin slot. So a
//! record takes the path it takes in the service — reader (filter, KPL
//! de-aggregation), the channel, lanes, retries with their backoff,
//! settlement, checkpoints with state — and the run is over once every
//! shard's end is checkpointed: every record has settled and every state
//! write is committed.
//!
//! What differs from the service, on purpose: no canary or shadow (one
//! version runs), the subscription reads from the start of each shard,
//! and checkpoints come every 50 ms so a run ends as soon as it is done.
//!
//! Floor 12 (commands) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod journal;
mod records;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::config::{Config, ReadMode, StartPosition, SubscriptionConfig};
use crate::filter::RecordView;
use crate::ids::{OwnerId, PartitionKey, StreamName};
use crate::lease::LeaseStore;
use crate::lease::memory::MemoryLeaseStore;
use crate::pipeline::{Effects, Parts, Pipeline, Source};
use crate::progress::Checkpoint;
use crate::reader::filter_feed::{ActiveFilter, FilterFeed};
use crate::slot::PluginSlot;
use crate::state::KeyState;
use crate::supervisor::plugin_host;
use crate::telemetry::Telemetry;
use journal::{Journal, Journaled, Style};
use records::LocalStream;

/// How often the run checkpoints (module docs).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);
/// How often the keeper looks for shards: the first look is at once.
const SHARD_SYNC_EVERY: Duration = Duration::from_millis(200);
/// How often the run checks whether every shard ended.
const DONE_EVERY: Duration = Duration::from_millis(20);

/// `shardlane test`.
#[derive(clap::Args)]
pub(crate) struct TestArgs {
    /// The TOML config file: the subscription's plugin, filter, dispatch,
    /// batching, failure policy, limits, state and config come from it.
    /// Nothing is read from or written to AWS.
    #[arg(long, short, env = "SHARDLANE_CONFIG")]
    config: PathBuf,
    /// The subscription's name (needed when the config has several).
    #[arg(long, short)]
    subscription: Option<String>,
    /// Run this plugin instead of the subscription's `plugin`.
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// The records: a file of JSON lines, `{"key": …, "data": …}` with
    /// optional `data_base64`, `arrival` and `shard`; `-` reads standard
    /// input.
    #[arg(long, short, default_value = "-")]
    records: String,
    /// State to start from: a JSON object of keys, each an object of
    /// names and values (text, or `{"base64": …}`).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Print one JSON object per line (`event`: `call`, `filtered`,
    /// `dead_letter`, `summary`) instead of text.
    #[arg(long)]
    json: bool,
    /// Exit 1 when a record is rejected or a call traps, times out or
    /// answers wrongly.
    #[arg(long)]
    strict: bool,
    /// Give up (exit 1) when the records have not all settled by then: a
    /// plugin that retries for ever.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    max_time: Duration,
}

impl TestArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let config = super::bootstrap::config(&self.config)?;
        let sub = self.subscription(&config)?.clone();
        let text = read_records(&self.records)?;
        let now_ms = crate::clock::now_ms();
        let stream = Arc::new(records::parse(&text, self.records_name(), now_ms)?);
        let seed = match &self.state {
            Some(path) => seed_state(path, &sub)?,
            None => Vec::new(),
        };
        let _log = crate::logging::init_stderr();
        super::bootstrap::service(|mut signals| async move {
            let run = self.run_pipeline(&config, &sub, stream, seed);
            tokio::select! {
                ended = run => ended,
                () = signals.next() => bail!("interrupted"),
            }
        })
    }

    fn subscription<'a>(&self, config: &'a Config) -> anyhow::Result<&'a SubscriptionConfig> {
        match (&self.subscription, config.subscriptions.as_slice()) {
            (Some(name), _) => super::subscription(config, name),
            (None, [only]) => Ok(only),
            (None, _) => bail!(
                "the config has {} subscriptions: name one with --subscription",
                config.subscriptions.len()
            ),
        }
    }

    fn records_name(&self) -> &str {
        if self.records == "-" {
            "standard input"
        } else {
            &self.records
        }
    }

    /// Runs the pipeline until every shard ended, then prints the summary
    /// and the state; the exit code says how it went.
    async fn run_pipeline(
        &self,
        config: &Config,
        sub: &SubscriptionConfig,
        stream: Arc<LocalStream>,
        seed: Vec<(PartitionKey, Vec<u8>)>,
    ) -> anyhow::Result<ExitCode> {
        let telemetry = Telemetry::new();
        let plugins = plugin_host(config, Some(telemetry.clone()))?;
        let path = self.plugin.as_deref().unwrap_or(&sub.plugin);
        let bytes = crate::files::read_regular(path, crate::files::MAX_PLUGIN_BYTES)
            .with_context(|| format!("plugin {}", path.display()))?;
        let plugin = super::repair_run::compile(&plugins, sub, path, &bytes, &sub.name)?;
        let sub = Arc::new(local_subscription(sub));
        let store = Arc::new(MemoryLeaseStore::new());
        for (key, stored) in seed {
            store.seed_state(&sub.name, &key, stored);
        }
        let journal = Arc::new(Journal::new(
            if self.json { Style::Json } else { Style::Text },
            sub.failure
                .on_failure
                .dead_letter_stream()
                .cloned()
                .unwrap_or_else(|| StreamName::new("-")),
        ));
        print_filtered(&sub, &stream, &journal);
        let slot = Arc::new(PluginSlot::new(
            plugins,
            plugin,
            sub.handler_timeout,
            sub.sandbox.clone(),
            telemetry.subscription(&sub.name, sub.mode()),
            telemetry.clone(),
        ));
        let (pipeline, filter) = start(Local {
            config,
            sub: &sub,
            slot,
            stream: &stream,
            store: &store,
            journal: &journal,
            telemetry: &telemetry,
        });
        let ended = tokio::time::timeout(self.max_time, all_ended(&*store, &sub, &stream)).await;
        // Done: every record settled, nothing to drain. Out of time: stop
        // where it is (what has not settled never will here).
        let stopped = match &ended {
            Ok(()) => pipeline.shutdown().await,
            Err(_) => pipeline.stop_now().await,
        };
        let shards: Vec<_> = stream.shards().keys().cloned().collect();
        let summary = super::repair_run::summary(&telemetry, &sub, &shards, &filter.borrow(), None);
        journal.finish(&summary, &committed_state(&store, &sub)?);
        if ended.is_err() {
            bail!(
                "not every record settled within --max-time {} (a record retried for ever?)",
                humantime::format_duration(self.max_time)
            );
        }
        if !stopped {
            bail!("a pipeline task failed (see the log above)");
        }
        let counts = journal.counts();
        Ok(
            if self.strict && (counts.reject > 0 || counts.failed_calls > 0) {
                eprintln!(
                    "--strict: {} records rejected, {} calls failed",
                    counts.reject, counts.failed_calls
                );
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            },
        )
    }
}

/// What a test run's pipeline is made of.
struct Local<'a> {
    config: &'a Config,
    sub: &'a Arc<SubscriptionConfig>,
    slot: Arc<PluginSlot>,
    stream: &'a Arc<LocalStream>,
    store: &'a Arc<MemoryLeaseStore>,
    journal: &'a Arc<Journal>,
    telemetry: &'a Arc<Telemetry>,
}

/// Starts the subscription's pipeline over the local stream (module
/// docs): its calls noted and its effects kept by the journal.
fn start(local: Local<'_>) -> (Pipeline, FilterFeed) {
    let mut lease = local.config.lease.clone();
    lease.shard_sync_every = SHARD_SYNC_EVERY;
    lease.max_leases_per_instance = None;
    let filter = ActiveFilter::fixed(
        local.telemetry,
        &local.sub.name,
        local.slot.current().digest(),
        local.sub.filter.clone(),
    );
    let pipeline = Pipeline::start(Parts {
        subscription: local.sub.clone(),
        slot: Arc::new(Journaled {
            inner: local.slot,
            journal: local.journal.clone(),
        }),
        source: Source::Given {
            shards: local.stream.clone(),
            reads: local.stream.clone(),
            effects: Effects {
                outputs: local.journal.clone(),
                dead_letters: local.journal.clone(),
            },
        },
        store: local.store.clone(),
        lease,
        owner: OwnerId::new("shardlane-test"),
        telemetry: local.telemetry.clone(),
        range: None,
        decode: None,
        filter: filter.clone(),
    });
    (pipeline, filter)
}

/// The subscription as a test run runs it (module docs).
fn local_subscription(sub: &SubscriptionConfig) -> SubscriptionConfig {
    let mut local = sub.clone();
    local.read = ReadMode::Polling;
    local.canary = None;
    local.start = StartPosition::TrimHorizon;
    local.checkpoint_every = CHECKPOINT_EVERY;
    local.max_reads_per_second = 5.0;
    local
}

/// The file's text, or standard input's.
fn read_records(source: &str) -> anyhow::Result<String> {
    if source == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the records from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(source).with_context(|| format!("--records {source}"))
}

/// Notes each record the subscription's filter keeps out (the reader
/// settles them without a call; the summary counts them).
fn print_filtered(sub: &SubscriptionConfig, stream: &LocalStream, journal: &Journal) {
    let Some(filter) = &sub.filter else {
        return;
    };
    for (shard, records) in stream.shards() {
        for record in records {
            let view = RecordView {
                partition_key: record.partition_key.as_str(),
                sequence_number: record.sequence.as_str(),
                approximate_arrival_ms: record.arrival_ms,
                data: &record.data,
            };
            if !filter.admits(&view) {
                journal.filtered(shard, record);
            }
        }
    }
}

/// Waits until every shard's end is checkpointed.
async fn all_ended(store: &dyn LeaseStore, sub: &SubscriptionConfig, stream: &LocalStream) {
    loop {
        if let Ok(leases) = store.list(&sub.name, &sub.stream).await {
            let ended = leases
                .iter()
                .filter(|l| l.checkpoint == Some(Checkpoint::ShardEnd))
                .count();
            if ended == stream.shards().len() {
                return;
            }
        }
        tokio::time::sleep(DONE_EVERY).await;
    }
}

/// `--state`: `{"key": {"name": "text" | {"base64": "…"}}}`, as each key's
/// stored state.
///
/// # Errors
/// One line: unreadable, not that shape, or a subscription without state.
fn seed_state(
    path: &Path,
    sub: &SubscriptionConfig,
) -> anyhow::Result<Vec<(PartitionKey, Vec<u8>)>> {
    let what = || format!("--state {}", path.display());
    anyhow::ensure!(
        sub.sandbox.grants.state.is_some(),
        "{}: subscription {} keeps no state (its config has no `state` table)",
        what(),
        sub.name
    );
    let text = std::fs::read_to_string(path).with_context(what)?;
    let keys: std::collections::BTreeMap<String, std::collections::BTreeMap<String, SeedValue>> =
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: not a JSON object of keys, each an object of names and values",
                what()
            )
        })?;
    let mut seeded = Vec::new();
    for (key, values) in keys {
        let mut state = KeyState::default();
        for (name, value) in values {
            let data = match value {
                SeedValue::Text(text) => text.into_bytes(),
                SeedValue::Bytes { base64 } => {
                    aws_smithy_types::base64::decode(&base64).map_err(|_| {
                        anyhow::anyhow!("{}: key {key:?} value {name:?} is not base64", what())
                    })?
                }
            };
            state.put(
                &name,
                Some(crate::state::Value {
                    data,
                    expires_ms: None,
                }),
            );
        }
        seeded.push((PartitionKey::new(key), state.encode()));
    }
    Ok(seeded)
}

/// A value of `--state`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum SeedValue {
    Text(String),
    Bytes { base64: String },
}

/// Every key's committed state after the run.
fn committed_state(
    store: &MemoryLeaseStore,
    sub: &SubscriptionConfig,
) -> anyhow::Result<Vec<(PartitionKey, KeyState)>> {
    store
        .states(&sub.name)
        .into_iter()
        .map(|(key, stored)| {
            let state =
                KeyState::decode(&stored).with_context(|| format!("state of key {key:?}"))?;
            Ok((key, state))
        })
        .collect()
}
