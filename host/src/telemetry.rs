//! Telemetry: the Prometheus metrics and the live status the operations
//! endpoints serve (`/metrics`, `/readyz`, the status page).
//!
//! Stages get cheap handles once (a [`Counter`] or [`Gauge`] is an
//! `Arc<AtomicU64>`), so the hot path does one relaxed atomic add per
//! event; the registry's lock is taken only to register a series and to
//! render. Shard status (owner, checkpoint, lag, state) and per-lane load
//! live in small maps behind std mutexes, updated on lease and checkpoint
//! events (not per record) and read by the status page.
//!
//! Names follow Prometheus conventions: `shardlane_` prefix, `_total` for
//! counters, `_seconds` for durations.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
pub const DURATION_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bucket bounds for batch sizes.
pub const BATCH_BUCKETS: &[f64] = &[
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

/// A shard as the status page shows it.
#[derive(Debug, Clone, Default)]
pub struct ShardStatus {
    /// Who holds its lease (this instance's id while we read it).
    pub owner: String,
    /// The last checkpoint written.
    pub checkpoint: String,
    /// When that checkpoint was written.
    pub checkpoint_at: Option<Instant>,
    /// Reading, handing over, ended, ...
    pub state: String,
    /// How far behind the tip the last read was, in ms.
    pub behind_ms: Option<u64>,
}

/// A subscription as the status page and `/readyz` see it.
#[derive(Debug, Default)]
pub struct SubscriptionStatus {
    /// The plugin's current (stable) digest.
    pub digest: Mutex<String>,
    /// The canary's candidate digest and key fraction, while one runs.
    pub canary: Mutex<Option<String>>,
    /// Sequential, workers(n), by_key(n), with batches.
    pub mode: String,
    /// Shards by id.
    pub shards: Mutex<BTreeMap<String, ShardStatus>>,
    /// Calls per lane.
    pub lanes: Mutex<BTreeMap<u32, Counter>>,
    /// The keeper finished its first shard sync.
    pub synced: AtomicBool,
    /// Whether every shard of the stream is read by someone (the keeper
    /// writes it after each sync).
    pub coverage: Mutex<Coverage>,
}

/// What the keeper's syncs say about the shards nobody reads.
#[derive(Debug, Default, Clone)]
pub struct Coverage {
    /// How long shards may go unread, or syncs fail, before the
    /// subscription stops counting as ready; zero: never (not yet set).
    pub grace: Duration,
    /// When the last sync succeeded.
    pub last_sync: Option<Instant>,
    /// Eligible shards nobody held after the last sync.
    pub unread: usize,
    /// Since when some shard has been unread, sync after sync.
    pub unread_since: Option<Instant>,
}

impl Coverage {
    /// Why the subscription is not covered at `now`, if it is not: some
    /// shard unread for longer than the grace, or no successful sync for
    /// that long.
    pub fn problem(&self, now: Instant) -> Option<String> {
        if self.grace.is_zero() {
            return None;
        }
        if let Some(since) = self.unread_since
            && now.duration_since(since) > self.grace
        {
            return Some(format!(
                "{} shard(s) read by nobody for {:?}",
                self.unread,
                now.duration_since(since)
            ));
        }
        if let Some(at) = self.last_sync
            && now.duration_since(at) > self.grace
        {
            return Some(format!(
                "no successful shard sync for {:?}",
                now.duration_since(at)
            ));
        }
        None
    }

    /// Records a sync that left `unread` shards unheld at `now`.
    pub fn synced(&mut self, unread: usize, now: Instant) {
        self.last_sync = Some(now);
        self.unread = unread;
        if unread == 0 {
            self.unread_since = None;
        } else {
            self.unread_since.get_or_insert(now);
        }
    }
}

impl SubscriptionStatus {
    /// Updates one shard's status.
    pub fn shard(&self, shard: &str, update: impl FnOnce(&mut ShardStatus)) {
        let mut shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        update(shards.entry(shard.to_owned()).or_default());
    }

    /// The call counter of a lane.
    pub fn lane(&self, lane: u32) -> Counter {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        lanes.entry(lane).or_default().clone()
    }

    /// Ready: synced, every shard of the stream read by someone (see
    /// [`Coverage::problem`]), and every shard this instance reads
    /// positioned.
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
            && self
                .coverage
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .problem(Instant::now())
                .is_none()
            && self
                .shards
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .all(|s| s.state != "opening")
    }
}

/// All metrics and status of one host process.
#[derive(Default)]
pub struct Telemetry {
    families: Mutex<BTreeMap<&'static str, Family>>,
    subscriptions: Mutex<BTreeMap<String, Arc<SubscriptionStatus>>>,
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
    pub fn subscription(&self, name: &str, mode: String) -> Arc<SubscriptionStatus> {
        let mut subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
        subs.entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new(SubscriptionStatus {
                    mode,
                    ..Default::default()
                })
            })
            .clone()
    }

    /// Every subscription's status.
    pub fn subscriptions(&self) -> Vec<(String, Arc<SubscriptionStatus>)> {
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
            let shards = status.shards.lock().unwrap_or_else(|e| e.into_inner());
            for (shard, s) in shards.iter() {
                if let Some(at) = s.checkpoint_at {
                    let labels = vec![("subscription", sub.clone()), ("shard_id", shard.clone())];
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
    fn coverage_fails_only_past_the_grace() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let mut c = Coverage::default();
        assert_eq!(c.problem(s(100)), None, "no grace set: no verdict");
        c.grace = Duration::from_secs(5);
        c.synced(0, t0);
        assert_eq!(c.problem(s(4)), None);
        c.synced(2, s(4));
        assert_eq!(c.problem(s(8)), None, "unread, within the grace");
        c.synced(1, s(8));
        let problem = c.problem(s(10)).expect("unread since 4 s, for 6 s");
        assert!(problem.contains("1 shard(s) read by nobody"), "{problem}");
        c.synced(0, s(10));
        assert_eq!(c.problem(s(11)), None, "read again");
        let stale = c.problem(s(16)).expect("no sync for 6 s");
        assert!(stale.contains("no successful shard sync"), "{stale}");
    }

    #[test]
    fn a_subscription_with_shards_nobody_reads_is_not_ready() {
        let t = Telemetry::new();
        let status = t.subscription("s", "sequential".into());
        status.synced.store(true, Ordering::Relaxed);
        status.coverage.lock().unwrap().grace = Duration::from_secs(1);
        status.coverage.lock().unwrap().synced(0, Instant::now());
        assert!(t.ready());
        status.coverage.lock().unwrap().unread_since =
            Some(Instant::now() - Duration::from_secs(2));
        assert!(!t.ready());
    }

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
    fn readiness_needs_a_sync_and_positioned_readers() {
        let t = Telemetry::new();
        assert!(!t.ready(), "nothing registered");
        let s = t.subscription("a", "sequential".into());
        assert!(!t.ready());
        s.synced.store(true, Ordering::Relaxed);
        s.shard("shard-0", |sh| sh.state = "opening".into());
        assert!(!t.ready());
        s.shard("shard-0", |sh| sh.state = "reading".into());
        assert!(t.ready());
    }
}
