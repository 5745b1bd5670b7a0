//! The standard Prometheus process metrics (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, …, with client_golang's names and help),
//! read from `/proc/self` through the `procfs` crate at each scrape.
//!
//! `prometheus-client` leaves process metrics to its users, so this is the
//! small collector that reads them; a read that fails (no `/proc`) leaves the
//! series out of that scrape rather than failing it.

use procfs::WithCurrentSystemInfo;
use procfs::process::{LimitValue, Process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Encodes this process's metrics at each scrape.
#[derive(Debug)]
pub(super) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(me) = Process::myself() else {
            return Ok(());
        };
        if let Ok(stat) = me.stat() {
            let ticks = procfs::ticks_per_second() as f64;
            gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                stat.rss_bytes().get() as f64,
            )?;
            gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                stat.vsize as f64,
            )?;
            gauge(
                &mut encoder,
                "process_threads",
                "Number of OS threads in the process.",
                stat.num_threads as f64,
            )?;
            if let Ok(boot) = procfs::boot_time_secs() {
                gauge(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    boot as f64 + stat.starttime as f64 / ticks,
                )?;
            }
            let cpu = ConstCounter::new((stat.utime + stat.stime) as f64 / ticks);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                MetricType::Counter,
            )?)?;
        }
        if let Ok(open) = me.fd_count() {
            gauge(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors.",
                open as f64,
            )?;
        }
        if let Ok(limits) = me.limits()
            && let LimitValue::Value(max) = limits.max_open_files.soft_limit
        {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max as f64,
            )?;
        }
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}
