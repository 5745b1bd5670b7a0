//! Telemetry: the Prometheus metrics and the live status the operations
//! endpoints serve (`/metrics`, `/readyz`, the status page).
//!
//! Metrics live in a [`prometheus_client`] registry and are rendered in the
//! Prometheus text format (0.0.4) by its encoder. This module is the thin
//! layer the stages see: a series is registered on first use by name, help
//! and labels, and the stage keeps the handle it gets back (a [`Counter`] or
//! [`Gauge`] is an `Arc` of one atomic; a [`Histogram`] an `Arc` of a small
//! mutex-guarded bucket array, with an exact `f64` sum), so the hot path
//! never touches the registry. The layer adds what the crate leaves to its
//! users: series looked up by name at run time, and removing the series
//! of a shard this instance no longer reads ([`Telemetry::forget_series`]).
//! Process metrics (`process_cpu_seconds_total`, memory, threads, open
//! files; [`process`]) and per-shard checkpoint ages are computed at scrape.
//!
//! Each subscription's live status (plugin versions, shard states, lane
//! load) has one owner, [`SubscriptionStatus`] ([`status`]); handler and
//! GetRecords calls run in OpenTelemetry-shaped [`spans`].
//!
//! Names follow Prometheus conventions: `shardlane_` prefix, `_total` for
//! counters, `_seconds` for durations.
//!
//! Floor 3 (sinks and clients) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

pub(crate) mod emf;
mod process;
pub(crate) mod spans;
pub(crate) mod status;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, counter, gauge, histogram};
use prometheus_client::registry::Registry;

pub(crate) use status::{CanaryView, ShadowView, SubscriptionStatus, VersionCounts};

use crate::ids::SubscriptionName;

/// A monotonically increasing count.
#[derive(Clone, Default, Debug)]
pub(crate) struct Counter(counter::Counter<u64, AtomicU64>);

impl Counter {
    /// Adds one.
    pub(crate) fn inc(&self) {
        self.0.inc();
    }

    /// Adds `n`.
    pub(crate) fn add(&self, n: u64) {
        self.0.inc_by(n);
    }

    /// The count.
    pub(crate) fn get(&self) -> u64 {
        self.0.get()
    }
}

/// A value that goes up and down.
#[derive(Clone, Default, Debug)]
pub(crate) struct Gauge(gauge::Gauge<i64>);

impl Gauge {
    /// Sets it.
    pub(crate) fn set(&self, value: u64) {
        self.0.set(i64::try_from(value).unwrap_or(i64::MAX));
    }

    /// The value (tests and a replay's summary read it).
    pub(crate) fn get(&self) -> u64 {
        u64::try_from(self.0.get()).unwrap_or(0)
    }
}

/// A histogram with fixed bucket bounds.
#[derive(Clone, Debug)]
pub(crate) struct Histogram(histogram::Histogram);

impl Histogram {
    /// Records one observation.
    pub(crate) fn observe(&self, value: f64) {
        self.0.observe(value);
    }

    /// Records a duration in seconds.
    pub(crate) fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }
}

/// Bucket bounds for handler durations, in seconds.
pub(crate) const DURATION_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bucket bounds for batch sizes.
pub(crate) const BATCH_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

/// A series' labels, in the order they are rendered.
type Labels = Vec<(&'static str, String)>;

/// Makes each histogram of a family with the family's bounds.
#[derive(Clone, Debug)]
struct Bounds(&'static [f64]);

impl MetricConstructor<histogram::Histogram> for Bounds {
    fn new_metric(&self) -> histogram::Histogram {
        histogram::Histogram::new(self.0.iter().copied())
    }
}

/// One registered family (its handle shares the series with the registry)
/// and the label sets made in it, so they can be found by a label's value.
enum Series {
    Counter(Family<Labels, counter::Counter<u64, AtomicU64>>),
    Gauge(Family<Labels, gauge::Gauge<i64>>),
    Histogram(Family<Labels, histogram::Histogram, Bounds>),
}

impl Series {
    fn remove(&self, labels: &Labels) {
        match self {
            Series::Counter(f) => f.remove(labels),
            Series::Gauge(f) => f.remove(labels),
            Series::Histogram(f) => f.remove(labels),
        };
    }
}

struct Registered {
    series: Series,
    made: Vec<Labels>,
}

type Subscriptions = Arc<Mutex<BTreeMap<SubscriptionName, Arc<SubscriptionStatus>>>>;

/// All metrics and status of one host process.
#[cfg_attr(feature = "bench-internals", visibility::make(pub))]
pub(crate) struct Telemetry {
    registry: Mutex<Registry>,
    families: Mutex<BTreeMap<&'static str, Registered>>,
    subscriptions: Subscriptions,
    /// Refreshes gauges whose value is read at scrape time.
    collectors: Mutex<Vec<Box<dyn Fn() + Send>>>,
}

impl Default for Telemetry {
    fn default() -> Self {
        let subscriptions = Subscriptions::default();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(process::ProcessCollector));
        registry.register_collector(Box::new(CheckpointAges(subscriptions.clone())));
        Self {
            registry: Mutex::new(registry),
            families: Mutex::default(),
            subscriptions,
            collectors: Mutex::default(),
        }
    }
}

impl Telemetry {
    /// An empty registry.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Runs `pick` on the family `name`, registering it with `make` first.
    /// Records `labels` as made in it.
    fn series<T>(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        make: impl FnOnce() -> Series,
        pick: impl FnOnce(&Series, &Labels) -> Option<T>,
    ) -> T {
        let labels = own(labels);
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name).or_insert_with(|| {
            let series = make();
            let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
            match &series {
                // The encoder appends `_total` to a counter's name.
                Series::Counter(f) => {
                    registry.register(name.strip_suffix("_total").unwrap_or(name), help, f.clone())
                }
                Series::Gauge(f) => registry.register(name, help, f.clone()),
                Series::Histogram(f) => registry.register(name, help, f.clone()),
            }
            Registered {
                series,
                made: Vec::new(),
            }
        });
        let Some(handle) = pick(&family.series, &labels) else {
            panic!("{name} is registered as another kind of metric");
        };
        if !family.made.contains(&labels) {
            family.made.push(labels);
        }
        handle
    }

    /// The counter `name{labels}`, registered on first use. `name` ends in
    /// `_total`.
    pub(crate) fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
    ) -> Counter {
        debug_assert!(name.ends_with("_total"), "counter {name} ends in _total");
        self.series(
            name,
            help,
            labels,
            || Series::Counter(Family::default()),
            |s, l| match s {
                Series::Counter(f) => Some(Counter(f.get_or_create_owned(l))),
                _ => None,
            },
        )
    }

    /// The gauge `name{labels}`, registered on first use.
    pub(crate) fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
    ) -> Gauge {
        self.series(
            name,
            help,
            labels,
            || Series::Gauge(Family::default()),
            |s, l| match s {
                Series::Gauge(f) => Some(Gauge(f.get_or_create_owned(l))),
                _ => None,
            },
        )
    }

    /// The histogram `name{labels}`, registered on first use with `bounds`.
    pub(crate) fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        bounds: &'static [f64],
    ) -> Histogram {
        self.series(
            name,
            help,
            labels,
            || Series::Histogram(Family::new_with_constructor(Bounds(bounds))),
            |s, l| match s {
                Series::Histogram(f) => Some(Histogram(f.get_or_create_owned(l))),
                _ => None,
            },
        )
    }

    /// Removes the one series of `name` with exactly these labels.
    pub(crate) fn forget_series(&self, name: &'static str, labels: &[(&'static str, &str)]) {
        let labels = own(labels);
        self.forget_where(name, |l| *l == labels);
    }

    fn forget_where(&self, name: &'static str, doomed: impl Fn(&Labels) -> bool) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(family) = families.get_mut(name) {
            let Registered { series, made } = family;
            made.retain(|labels| {
                let keep = !doomed(labels);
                if !keep {
                    series.remove(labels);
                }
                keep
            });
        }
    }

    /// The status of a subscription, made on first use.
    #[cfg_attr(feature = "bench-internals", visibility::make(pub))]
    pub(crate) fn subscription(
        &self,
        name: &SubscriptionName,
        mode: String,
    ) -> Arc<SubscriptionStatus> {
        let mut subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
        subs.entry(name.clone())
            .or_insert_with(|| Arc::new(SubscriptionStatus::new(mode)))
            .clone()
    }

    /// Every subscription's status.
    pub(crate) fn subscriptions(&self) -> Vec<(SubscriptionName, Arc<SubscriptionStatus>)> {
        let subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
        subs.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// True when every subscription is ready.
    pub(crate) fn ready(&self) -> bool {
        let subs = self.subscriptions();
        !subs.is_empty() && subs.iter().all(|(_, s)| s.ready())
    }

    /// Why not ready, one line per subscription that is not (or that none
    /// runs yet: the host is starting); empty when ready.
    pub(crate) fn not_ready(&self) -> Vec<String> {
        let subs = self.subscriptions();
        if subs.is_empty() {
            return vec!["starting: no subscription runs yet".to_owned()];
        }
        subs.iter()
            .filter_map(|(name, s)| s.not_ready().map(|why| format!("{name}: {why}")))
            .collect()
    }

    /// Runs `collect` before each render (e.g. to read a channel's fill).
    pub(crate) fn on_render(&self, collect: impl Fn() + Send + 'static) {
        self.collectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(collect));
    }

    /// The Prometheus text exposition (0.0.4) of every metric, with the
    /// values read at scrape time computed now.
    pub(crate) fn render(&self) -> String {
        for collect in self
            .collectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            collect();
        }
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }
}

/// `shardlane_checkpoint_age_seconds`: the time since each read shard's last
/// checkpoint write, computed at scrape.
#[derive(Debug)]
struct CheckpointAges(Subscriptions);

impl Collector for CheckpointAges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let subs: Vec<_> = {
            let subs = self.0.lock().unwrap_or_else(|e| e.into_inner());
            subs.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let mut family = encoder.encode_descriptor(
            "shardlane_checkpoint_age_seconds",
            "Time since the shard's last checkpoint write.",
            None,
            MetricType::Gauge,
        )?;
        for (sub, status) in subs {
            for (shard, s) in status.shards() {
                if let Some(at) = s.checkpoint_at {
                    let labels = [
                        ("subscription", sub.to_string()),
                        ("shard_id", shard.to_string()),
                    ];
                    ConstGauge::new(at.elapsed().as_secs_f64())
                        .encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

fn own(labels: &[(&'static str, &str)]) -> Labels {
    labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let t = Telemetry::new();
        let c = t.counter(
            "shardlane_records_total",
            "Records handled, by outcome.",
            &[("subscription", "a"), ("outcome", "ack")],
        );
        c.add(3);
        // The same series again is the same counter.
        t.counter(
            "shardlane_records_total",
            "Records handled, by outcome.",
            &[("subscription", "a"), ("outcome", "ack")],
        )
        .inc();
        t.gauge(
            "shardlane_leases_held",
            "Leases held.",
            &[("subscription", "a")],
        )
        .set(4);
        let h = t.histogram(
            "shardlane_handler_duration_seconds",
            "Handler call time.",
            &[("subscription", "a")],
            DURATION_BUCKETS,
        );
        h.observe(0.0003);
        h.observe(2.0);
        let text = t.render();
        assert!(
            text.contains("# TYPE shardlane_records_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(
            text.contains("shardlane_records_total{subscription=\"a\",outcome=\"ack\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("shardlane_leases_held{subscription=\"a\"} 4"),
            "{text}"
        );
        assert!(
            text.contains(
                "shardlane_handler_duration_seconds_bucket{subscription=\"a\",le=\"0.0005\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "shardlane_handler_duration_seconds_bucket{subscription=\"a\",le=\"+Inf\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("shardlane_handler_duration_seconds_count{subscription=\"a\"} 2"),
            "{text}"
        );
        t.forget_series("shardlane_leases_held", &[("subscription", "a")]);
        assert!(!t.render().contains("shardlane_leases_held{"));
    }

    #[test]
    fn histogram_sums_are_exact_and_process_metrics_are_rendered() {
        let t = Telemetry::new();
        let h = t.histogram(
            "shardlane_batch_size",
            "Records per handler call.",
            &[("subscription", "a")],
            BATCH_BUCKETS,
        );
        // Sums kept in millionths would lose the fraction below 1e-6.
        for _ in 0..3 {
            h.observe(0.000_000_25);
        }
        h.observe(2.0);
        let text = t.render();
        assert!(
            text.contains("shardlane_batch_size_sum{subscription=\"a\"} 2.00000075"),
            "{text}"
        );
        for series in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_threads ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
        t.forget_series("shardlane_batch_size", &[("subscription", "a")]);
        assert!(!t.render().contains("shardlane_batch_size_sum{"));
    }

    #[test]
    fn ready_only_when_every_subscription_is() {
        let t = Telemetry::new();
        assert!(!t.ready(), "nothing registered");
        let a = t.subscription(&"a".into(), "sequential".into());
        let b = t.subscription(&"b".into(), "sequential".into());
        a.synced(0, std::time::Instant::now());
        assert!(!t.ready(), "b has not synced");
        b.synced(0, std::time::Instant::now());
        assert!(t.ready());
    }
}
