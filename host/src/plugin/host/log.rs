//! `log`: guest log lines into the host's log, in both contract versions,
//! rate-limited per instance and cut to [`MAX_LOG_MESSAGE`], each carrying
//! the call's record(s), the subscription, the lane and the plugin digest.

use std::time::Instant;

use super::{CallContext, HostState};
use crate::plugin::MAX_LOG_MESSAGE;
use crate::plugin::bindings::{v1, v2, v3};

/// Emits a guest log line at a tracing level chosen at run time (`event!`
/// needs a constant level, hence one arm per level).
macro_rules! guest_event {
    ($level:expr, $($fields:tt)+) => {
        match $level {
            tracing::Level::TRACE => tracing::event!(target: "guest", tracing::Level::TRACE, $($fields)+),
            tracing::Level::DEBUG => tracing::event!(target: "guest", tracing::Level::DEBUG, $($fields)+),
            tracing::Level::INFO => tracing::event!(target: "guest", tracing::Level::INFO, $($fields)+),
            tracing::Level::WARN => tracing::event!(target: "guest", tracing::Level::WARN, $($fields)+),
            tracing::Level::ERROR => tracing::event!(target: "guest", tracing::Level::ERROR, $($fields)+),
        }
    };
}

impl HostState {
    fn guest_log(&mut self, level: tracing::Level, mut message: String) {
        if !self.log_budget.take(Instant::now()) {
            return;
        }
        self.report_dropped(false);
        crate::logging::cap(&mut message, MAX_LOG_MESSAGE);
        let subscription = self.subscription.as_str();
        let plugin = self.digest.short();
        let lane = self.lane.0;
        match &self.call {
            CallContext::Record(r) => guest_event!(
                level,
                subscription,
                plugin,
                lane,
                stream = r.stream.as_str(),
                shard_id = r.shard.as_str(),
                sequence_number = r.sequence.as_str(),
                sub_sequence_number = r.sub_sequence,
                partition_key = r.partition_key.as_str(),
                "{message}"
            ),
            CallContext::Batch { first, len } => guest_event!(
                level,
                subscription,
                plugin,
                lane,
                stream = first.stream.as_str(),
                shard_id = first.shard.as_str(),
                sequence_number = first.sequence.as_str(),
                partition_key = first.partition_key.as_str(),
                batch_len = len,
                "{message}"
            ),
            CallContext::Close(close) => guest_event!(
                level,
                subscription,
                plugin,
                lane,
                stream = close.stream.as_str(),
                shard_id = close.shard.as_str(),
                window_start = close.window.start,
                window_end = close.window.end,
                keys = close.keys.len(),
                "{message}"
            ),
            CallContext::Idle => guest_event!(level, subscription, plugin, lane, "{message}"),
        }
    }
}

/// The one `log` of every contract version: their generated types
/// differ, the levels do not.
macro_rules! log_host {
    ($version:ident) => {
        impl $version::log::Host for HostState {
            fn log(&mut self, level: $version::log::Level, message: String) {
                use $version::log::Level;
                let level = match level {
                    Level::Trace => tracing::Level::TRACE,
                    Level::Debug => tracing::Level::DEBUG,
                    Level::Info => tracing::Level::INFO,
                    Level::Warn => tracing::Level::WARN,
                    Level::Error => tracing::Level::ERROR,
                };
                self.guest_log(level, message);
            }
        }
    };
}

log_host!(v1);
log_host!(v2);
log_host!(v3);
