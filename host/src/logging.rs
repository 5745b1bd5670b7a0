//! Log output: human-readable text or one JSON object per line, on stdout;
//! and the two guards every guest- or producer-controlled string passes
//! before it is logged or stored: [`cap`] and, in text, control-character
//! escaping.
//!
//! Guest `log` calls arrive as events with target `guest` carrying the
//! subscription, plugin digest, stream, shard, sequence number and partition
//! key as fields (see [`crate::plugin`]). The level filter is `info` unless
//! `RUST_LOG` says otherwise.
//!
//! Handler calls and GetRecords calls run in spans with OpenTelemetry
//! messaging fields ([`crate::telemetry::spans`]). In JSON, every line
//! logged inside one lists them under `spans`; in text, where they would
//! make every guest line several times longer, they are off unless
//! `RUST_LOG` turns on their target (`shardlane::otel`). With `[traces]
//! otlp_endpoint` they are exported to an OpenTelemetry collector whatever
//! the log does with them ([`otlp`]).
//!
//! # Hostile text
//! Guests choose their log messages, `retry`/`reject` reasons and (through
//! function names and stack depth) their trap messages; producers choose
//! partition keys. Two rules keep them from hurting the log:
//! - **Size**: each is cut to [`MAX_GUEST_TEXT`] bytes by [`cap`] where it
//!   enters the host (the `log` import, a call's outcome, a trap), so a
//!   100 MB reason is neither logged, kept nor dead-lettered whole.
//! - **Lines**: in text output every field value and message is written
//!   through an escaper: C0 and C1 control characters, DEL and the Unicode
//!   line and paragraph separators become `\n`, `\r`, `\t` or `\u{..}`, so
//!   no value can start a line of its own (a forged
//!   `2030-01-01T00:00:00Z INFO shardlane::supervisor: shardlane stopped`)
//!   or drive a terminal. JSON output escapes them already.
//!
//! Floor 3 (sinks and clients) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::borrow::Cow;
use std::fmt;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::TracesConfig;

mod otlp;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};

/// Longest guest- or producer-controlled text kept (a log message, a
/// reason, a trap message): ample for a message or a backtrace worth
/// reading, small enough that a flood of them cannot fill the log or the
/// host's memory.
pub(crate) const MAX_GUEST_TEXT: usize = 8 * 1024;

/// What a cut string ends with, so a reader knows it was cut.
const CUT_MARK: &str = "…[truncated]";

/// Cuts `text` to at most `max` bytes (at a char boundary) and marks it as
/// cut; text within `max` is left alone. The one place guest text is cut.
pub(crate) fn cap(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut cut = max.saturating_sub(CUT_MARK.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(CUT_MARK);
    // A 100 MB reason should not stay 100 MB of capacity.
    text.shrink_to_fit();
}

/// [`cap`] for borrowed text: borrowed when it fits, a cut copy otherwise.
pub(crate) fn capped(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut cut = max.saturating_sub(CUT_MARK.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = String::with_capacity(cut + CUT_MARK.len());
    out.push_str(&text[..cut]);
    out.push_str(CUT_MARK);
    Cow::Owned(out)
}

/// True for a character that must not reach a text log line as itself:
/// C0 controls, DEL, C1 controls, and the Unicode line and paragraph
/// separators.
fn must_escape(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// Writes `s` to `out` with every character [`must_escape`] says escaped.
fn write_escaped(out: &mut dyn fmt::Write, s: &str) -> fmt::Result {
    let mut rest = s;
    while let Some(at) = rest.find(must_escape) {
        out.write_str(&rest[..at])?;
        let c = rest[at..]
            .chars()
            .next()
            .expect("find returned a char's index");
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c => write!(out, "\\u{{{:x}}}", c as u32)?,
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.write_str(rest)
}

/// A `fmt::Write` that escapes what passes through it.
struct Escaping<'a, 'w> {
    inner: &'a mut Writer<'w>,
}

impl fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_escaped(self.inner, s)
    }
}

/// Text output's field formatter: tracing-subscriber's own, with every
/// message and value written through the escaper (see "Hostile text").
/// The fields of one event or span are all a guest or producer can reach,
/// so the line's structure (time, level, target) stays the host's.
#[derive(Default)]
struct EscapedFields(DefaultFields);

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut escaping = Escaping { inner: &mut writer };
        self.0.format_fields(Writer::new(&mut escaping), fields)
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line, fields flattened to the top level.
    Json,
}

/// The log filter when `RUST_LOG` is not set: `info`, handler-call and
/// GetRecords spans off.
const DEFAULT_FILTER: &str = "info,shardlane::otel=off";

/// What must outlive the run: the OTLP span exporter, when `[traces]` has
/// one, which exports what is queued when this is dropped (after the async
/// runtime is gone).
#[must_use = "dropping it stops the span exporter"]
pub struct LogGuard {
    traces: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.traces.take() {
            otlp::shutdown(provider);
        }
    }
}

/// Installs the global subscriber: the log, and with `traces` the OTLP
/// span exporter ([`otlp`]). Call once, at start-up, outside any async
/// runtime.
///
/// # Errors
/// When the span exporter cannot be built.
pub fn init(format: LogFormat, traces: Option<&TracesConfig>) -> anyhow::Result<LogGuard> {
    // Spans are off in the log by default in both formats: formatting a
    // span's fields costs ~2.5 µs a record, adding half to the host's
    // cost per record end to end (BENCHMARKS.md); `RUST_LOG` turns them on.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let log = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stdout)
            .with_ansi(false)
            .fmt_fields(EscapedFields::default())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stdout)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .boxed(),
    };
    let provider = traces.map(otlp::provider).transpose()?;
    let registry = tracing_subscriber::registry().with(log.with_filter(filter));
    // Not `.with(Option<layer>)`: a `None` layer declares interest in every
    // callsite, so each record's span would be made (and entered, exited,
    // closed) though nothing records it — ~5 % of the host's CPU a record.
    match provider.as_ref() {
        Some(provider) => registry.with(otlp::layer(provider)).init(),
        None => registry.init(),
    }
    Ok(LogGuard { traces: provider })
}

/// Installs the global subscriber of `shardlane test`: text to stderr (so
/// that stdout is the run's journal alone), the guest's lines at every
/// level and the host's warnings and errors, unless `RUST_LOG` says
/// otherwise.
pub(crate) fn init_stderr() -> LogGuard {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,guest=trace"));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .fmt_fields(EscapedFields::default());
    tracing_subscriber::registry()
        .with(log.with_filter(filter))
        .init();
    LogGuard { traces: None }
}

/// Lets a log line through at most once an interval, counting what it kept
/// back: for events that can come by the thousand a second (throttling,
/// refused requests, failing accepts), so the log says how often without
/// becoming the outage.
#[derive(Debug)]
pub(crate) struct LogGate {
    interval: std::time::Duration,
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl LogGate {
    /// A gate that opens at most once per `interval`.
    pub(crate) fn every(interval: std::time::Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// Notes one event at `now`: `Some(n)` when it is to be logged, `n`
    /// being the events kept back since the last logged one.
    pub(crate) fn note(&mut self, now: std::time::Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `s` with control characters escaped as text output writes it.
    fn escape_controls(s: &str) -> Cow<'_, str> {
        if !s.contains(must_escape) {
            return Cow::Borrowed(s);
        }
        let mut out = String::with_capacity(s.len() + 8);
        // Writing to a String cannot fail.
        let _ = write_escaped(&mut out, s);
        Cow::Owned(out)
    }

    use std::sync::{Arc, Mutex};

    #[test]
    fn the_gate_logs_the_first_then_once_per_interval_with_a_count() {
        let mut gate = LogGate::every(std::time::Duration::from_secs(10));
        let t0 = std::time::Instant::now();
        assert_eq!(gate.note(t0), Some(0));
        for ms in 1..=500 {
            assert_eq!(gate.note(t0 + std::time::Duration::from_millis(ms)), None);
        }
        assert_eq!(
            gate.note(t0 + std::time::Duration::from_secs(10)),
            Some(500)
        );
        assert_eq!(gate.note(t0 + std::time::Duration::from_secs(11)), None);
        assert_eq!(gate.note(t0 + std::time::Duration::from_secs(30)), Some(1));
    }

    #[test]
    fn cap_cuts_at_a_char_boundary_and_marks_the_cut() {
        let mut short = "fits".to_owned();
        cap(&mut short, 10);
        assert_eq!(short, "fits");
        // 'é' is two bytes: a cut inside one moves back to its start.
        let mut long = "é".repeat(100);
        cap(&mut long, 50 + CUT_MARK.len() + 1);
        assert!(long.len() <= 50 + CUT_MARK.len() + 1, "{}", long.len());
        assert!(long.ends_with(CUT_MARK));
        assert_eq!(long.trim_end_matches(CUT_MARK), "é".repeat(25));
        let big = "x".repeat(10_000_000);
        let cut = capped(&big, MAX_GUEST_TEXT);
        assert_eq!(cut.len(), MAX_GUEST_TEXT);
        assert!(cut.ends_with(CUT_MARK));
        let mut owned = big.clone();
        cap(&mut owned, MAX_GUEST_TEXT);
        assert_eq!(owned, cut);
        assert!(
            owned.capacity() < 2 * MAX_GUEST_TEXT,
            "the memory is given back"
        );
        assert!(matches!(capped("short", 10), Cow::Borrowed("short")));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape_controls("plain ✓"), Cow::Borrowed(_)));
        assert_eq!(
            escape_controls("a\nb\rc\td\x1b[31me\u{85}f\u{2028}g\u{7f}h\0"),
            "a\\nb\\rc\\td\\u{1b}[31me\\u{85}f\\u{2028}g\\u{7f}h\\u{0}"
        );
    }

    /// A writer collecting what a subscriber writes.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn text_output_cannot_be_forged_by_a_value() {
        const FORGED: &str =
            "2030-01-01T00:00:00.000000Z INFO shardlane::supervisor: shardlane stopped";
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .fmt_fields(EscapedFields::default())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let message = format!("hello\n{FORGED}");
            let key = format!("k\r\n{FORGED}\x1b[2J");
            let reason = format!("no\n{FORGED}");
            tracing::info!(target: "guest", partition_key = %key, reason, "{message}");
            tracing::warn!(error = %format_args!("trap\n{FORGED}"), "handler failed");
        });
        let out = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.lines().count(), 2, "{out}");
        for line in out.lines() {
            assert!(!line.starts_with("2030-"), "{line}");
            assert!(!line.contains('\x1b'), "{line}");
        }
        assert!(out.contains("hello\\n2030-01-01"), "{out}");
        assert!(out.contains("partition_key=k\\r\\n2030"), "{out}");
    }
}
