//! Telemetry: the Prometheus metrics and the live status the operations
//! endpoints serve (`/metrics`, `/readyz`, the status page).
//!
//! Stages get cheap handles once (a [`Counter`] or [`Gauge`] is an
//! `Arc<AtomicU64>`), so the hot path does one relaxed atomic add per
//! event; the registry's lock is taken only to register a series and to
//! render. Each subscription's live status (plugin versions, shard states,
//! lane load) has one owner, [`SubscriptionStatus`] ([`status`]); handler
//! and GetRecords calls run in OpenTelemetry-shaped [`spans`].
//!
//! Names follow Prometheus conventions: `shardlane_` prefix, `_total` for
//! counters, `_seconds` for durations.

pub(crate) mod spans;
mod status;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use status::SubscriptionStatus;

use crate::ids::SubscriptionName;

/// A monotonically increasing count.
#[derive(Clone, Default, Debug)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The count.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Clone, Default, Debug)]
pub struct Gauge(Arc<AtomicU64>);

impl Gauge {
    /// Sets it.
    pub fn set(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }

    /// The value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A histogram with fixed bucket bounds.
#[derive(Clone, Debug)]
pub struct Histogram(Arc<HistogramInner>);

#[derive(Debug)]
struct HistogramInner {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in millionths of the unit, to stay atomic.
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self(Arc::new(HistogramInner {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }))
    }

    /// Records one observation.
    pub fn observe(&self, value: f64) {
        let h = &self.0;
        if let Some(i) = h.bounds.iter().position(|&b| value <= b) {
            h.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        h.count.fetch_add(1, Ordering::Relaxed);
        h.sum_micros
            .fetch_add((value * 1e6) as u64, Ordering::Relaxed);
    }

    /// Records a duration in seconds.
    pub fn observe_duration(&self, d: Duration) {
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

type Labels = Vec<(&'static str, String)>;

enum Series {
    Counter(Counter),
    Gauge(Gauge),
    Histogram(Histogram),
}

struct Family {
    help: &'static str,
    kind: &'static str,
    series: Vec<(Labels, Series)>,
}

/// All metrics and status of one host process.
#[derive(Default)]
pub struct Telemetry {
    families: Mutex<BTreeMap<&'static str, Family>>,
    subscriptions: Mutex<BTreeMap<SubscriptionName, Arc<SubscriptionStatus>>>,
    /// Refreshes gauges whose value is read at scrape time.
    collectors: Mutex<Vec<Box<dyn Fn() + Send>>>,
}

impl Telemetry {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn register(
        &self,
        name: &'static str,
        help: &'static str,
        kind: &'static str,
        labels: Labels,
        make: impl FnOnce() -> Series,
    ) -> Series {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name).or_insert_with(|| Family {
            help,
            kind,
            series: Vec::new(),
        });
        if let Some((_, series)) = family.series.iter().find(|(l, _)| *l == labels) {
            return match series {
                Series::Counter(c) => Series::Counter(c.clone()),
                Series::Gauge(g) => Series::Gauge(g.clone()),
                Series::Histogram(h) => Series::Histogram(h.clone()),
            };
        }
        let series = make();
        let copy = match &series {
            Series::Counter(c) => Series::Counter(c.clone()),
            Series::Gauge(g) => Series::Gauge(g.clone()),
            Series::Histogram(h) => Series::Histogram(h.clone()),
        };
        family.series.push((labels, series));
        copy
    }

    /// The counter `name{labels}`, registered on first use.
    pub fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
    ) -> Counter {
        match self.register(name, help, "counter", own(labels), || {
            Series::Counter(Counter::default())
        }) {
            Series::Counter(c) => c,
            _ => unreachable!("{name} is a counter"),
        }
    }

    /// The gauge `name{labels}`, registered on first use.
    pub fn gauge(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
    ) -> Gauge {
        match self.register(name, help, "gauge", own(labels), || {
            Series::Gauge(Gauge::default())
        }) {
            Series::Gauge(g) => g,
            _ => unreachable!("{name} is a gauge"),
        }
    }

    /// The histogram `name{labels}`, registered on first use.
    pub fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        bounds: &'static [f64],
    ) -> Histogram {
        match self.register(name, help, "histogram", own(labels), || {
            Series::Histogram(Histogram::new(bounds))
        }) {
            Series::Histogram(h) => h,
            _ => unreachable!("{name} is a histogram"),
        }
    }

    /// Removes every series of `name` whose labels include `label = value`
    /// (e.g. a shard this instance no longer reads).
    pub fn forget(&self, name: &'static str, label: &'static str, value: &str) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(family) = families.get_mut(name) {
            family
                .series
                .retain(|(labels, _)| !labels.iter().any(|(k, v)| *k == label && v == value));
        }
    }

    /// Removes the one series of `name` with exactly these labels.
    pub fn forget_series(&self, name: &'static str, labels: &[(&'static str, &str)]) {
        let labels = own(labels);
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(family) = families.get_mut(name) {
            family.series.retain(|(l, _)| *l != labels);
        }
    }

    /// The status of a subscription, made on first use.
    pub fn subscription(&self, name: &SubscriptionName, mode: String) -> Arc<SubscriptionStatus> {
        let mut subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
        subs.entry(name.clone())
            .or_insert_with(|| Arc::new(SubscriptionStatus::new(mode)))
            .clone()
    }

    /// Every subscription's status.
    pub fn subscriptions(&self) -> Vec<(SubscriptionName, Arc<SubscriptionStatus>)> {
        let subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
        subs.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// True when every subscription is ready.
    pub fn ready(&self) -> bool {
        let subs = self.subscriptions();
        !subs.is_empty() && subs.iter().all(|(_, s)| s.ready())
    }

    /// Runs `collect` before each render (e.g. to read a channel's fill).
    pub fn on_render(&self, collect: impl Fn() + Send + 'static) {
        self.collectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(collect));
    }

    /// The Prometheus text exposition of every metric, plus per-shard
    /// checkpoint ages computed now.
    pub fn render(&self) -> String {
        for collect in self
            .collectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            collect();
        }
        let mut out = String::new();
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        for (name, family) in families.iter() {
            let _ = writeln!(out, "# HELP {name} {}", family.help);
            let _ = writeln!(out, "# TYPE {name} {}", family.kind);
            for (labels, series) in &family.series {
                match series {
                    Series::Counter(c) => {
                        let _ = writeln!(out, "{name}{} {}", fmt_labels(labels, None), c.get());
                    }
                    Series::Gauge(g) => {
                        let _ = writeln!(out, "{name}{} {}", fmt_labels(labels, None), g.get());
                    }
                    Series::Histogram(h) => {
                        let mut cumulative = 0;
                        for (bound, bucket) in h.0.bounds.iter().zip(&h.0.buckets) {
                            cumulative += bucket.load(Ordering::Relaxed);
                            let le = format!("{bound}");
                            let _ = writeln!(
                                out,
                                "{name}_bucket{} {cumulative}",
                                fmt_labels(labels, Some(&le))
                            );
                        }
                        let count = h.0.count.load(Ordering::Relaxed);
                        let _ = writeln!(
                            out,
                            "{name}_bucket{} {count}",
                            fmt_labels(labels, Some("+Inf"))
                        );
                        let sum = h.0.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
                        let _ = writeln!(out, "{name}_sum{} {sum}", fmt_labels(labels, None));
                        let _ = writeln!(out, "{name}_count{} {count}", fmt_labels(labels, None));
                    }
                }
            }
        }
        drop(families);
        let _ = writeln!(
            out,
            "# HELP shardlane_checkpoint_age_seconds Time since the shard's last checkpoint write."
        );
        let _ = writeln!(out, "# TYPE shardlane_checkpoint_age_seconds gauge");
        for (sub, status) in self.subscriptions() {
            for (shard, s) in status.shards() {
                if let Some(at) = s.checkpoint_at {
                    let labels = vec![
                        ("subscription", sub.to_string()),
                        ("shard_id", shard.to_string()),
                    ];
                    let _ = writeln!(
                        out,
                        "shardlane_checkpoint_age_seconds{} {:.3}",
                        fmt_labels(&labels, None),
                        at.elapsed().as_secs_f64()
                    );
                }
            }
        }
        out
    }
}

fn own(labels: &[(&'static str, &str)]) -> Labels {
    labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

fn fmt_labels(labels: &Labels, le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}=\"{}\"",
                v.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n")
            )
        })
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
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
        t.forget("shardlane_leases_held", "subscription", "a");
        assert!(!t.render().contains("shardlane_leases_held{"));
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
