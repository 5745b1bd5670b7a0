//! Log output: human-readable text or one JSON object per line, on stdout.
//!
//! Guest `log` calls arrive as events with target `guest` carrying the
//! subscription, plugin digest, stream, shard, sequence number and partition
//! key as fields (see [`crate::plugin`]). The level filter is `info` unless
//! `RUST_LOG` says otherwise.
//!
//! Handler calls and GetRecords calls run in spans with OpenTelemetry
//! messaging fields ([`crate::dispatch::spans`]). In JSON, every line
//! logged inside one lists them under `spans`; in text, where they would
//! make every guest line several times longer, they are off unless
//! `RUST_LOG` turns on their target (`shardlane::otel`).

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line, fields flattened to the top level.
    Json,
}

/// Installs the global subscriber. Call once, at start-up.
pub fn init(format: LogFormat) {
    let default = match format {
        LogFormat::Text => "info,shardlane::otel=off",
        LogFormat::Json => "info",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout);
    match format {
        LogFormat::Text => builder.with_ansi(false).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}
