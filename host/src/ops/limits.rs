//! The admin server's limits, and the pure parts that enforce them: the
//! accept backoff and the log gate that summarizes repeated events.
//!
//! The server must stay up for `/healthz` whatever a caller without a token
//! does, so every resource a connection can hold is bounded: how long it may
//! take to send a request head (and to sit idle between requests), how long
//! an upload may take, how long a connection may live, and how many may be
//! open at once. Whatever a caller can repeat (refused writes, connections
//! over the cap, accept errors at the file-descriptor limit) is logged at
//! most once per [`LOG_INTERVAL`] with a count, and any request-derived
//! string that is logged is cut to [`MAX_LOGGED`] bytes.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// How long a client may take to send a whole request head. Probes, scrapers
/// and `curl` send theirs in one packet; 5 s is ample even over a slow
/// link, and is how long a slowloris connection can hold a slot. hyper
/// restarts this timer whenever a keep-alive connection goes idle, so it is
/// also the idle bound between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long reading one upload's body may take: the largest plugin
/// ([`super::MAX_PLUGIN_UPLOAD`], 64 MiB) at about 1 MiB/s. A body trickled
/// slower than that is answered 408.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest any connection may live, whatever it does: longer than a
/// body read plus compiling the largest component (tens of seconds), so it
/// only ever ends a connection that a caller holds on purpose, such as one
/// that never reads its response.
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// Connections open at once. The admin server has a handful of legitimate
/// callers (a health probe, a metrics scraper, an operator); 32 leaves room
/// for all of them and bounds the file descriptors and memory a flood can
/// take. A connection over the cap is answered 503 and closed at once.
pub const MAX_CONNECTIONS: usize = 32;

/// The first pause after a failed accept (at the file-descriptor limit,
/// EMFILE/ENFILE, accept fails at once until a descriptor frees up).
pub(crate) const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(10);

/// The longest pause between accept attempts: a free descriptor is noticed
/// within a second.
pub(crate) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How often a repeated event (a refused write, a connection over the cap,
/// a failed accept) may be logged.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The most bytes of a request-derived string (a path, a subscription name)
/// that are logged.
pub(crate) const MAX_LOGGED: usize = 128;

/// `s` cut to at most [`MAX_LOGGED`] bytes on a character boundary, with
/// `…` when cut.
pub(super) fn capped(s: &str) -> String {
    if s.len() <= MAX_LOGGED {
        return s.to_owned();
    }
    let mut end = MAX_LOGGED;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

pub(super) use crate::logging::LogGate;

/// What the accept loop does after accept fails: pause (doubling from
/// [`ACCEPT_BACKOFF_FIRST`] to [`ACCEPT_BACKOFF_MAX`], reset by a success)
/// and log at most once per [`LOG_INTERVAL`].
#[derive(Debug)]
pub(super) struct AcceptBackoff {
    pause: Backoff,
    log: LogGate,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            pause: Backoff::new(ACCEPT_BACKOFF_FIRST, ACCEPT_BACKOFF_MAX),
            log: LogGate::every(LOG_INTERVAL),
        }
    }
}

impl AcceptBackoff {
    /// Accept failed at `now`: how long to pause, and `Some(n)` when to log
    /// it (`n` failures left out since the last logged one).
    pub(super) fn failed(&mut self, now: Instant) -> (Duration, Option<u64>) {
        (self.pause.next_wait(), self.log.note(now))
    }

    /// Accept worked: the next failure pauses briefly again.
    pub(super) fn succeeded(&mut self) {
        self.pause.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the descriptor limit accept fails at once, forever: a million
    /// failures over a minute of injected time pause ever longer up to the
    /// cap and log a handful of lines, which together count every failure.
    #[test]
    fn accept_failures_back_off_to_a_second_and_log_a_few_lines() {
        let mut backoff = AcceptBackoff::default();
        let t0 = Instant::now();
        let mut now = t0;
        let mut steps = Vec::new();
        let (mut logged, mut counted) = (0, 0);
        let mut failures = 0u64;
        while now < t0 + Duration::from_secs(60) {
            let (pause, log) = backoff.failed(now);
            failures += 1;
            if let Some(left_out) = log {
                logged += 1;
                counted += left_out + 1;
            }
            steps.push(pause);
            now += pause;
        }
        // 10, 20, 40, ... ms, each drawn from the upper half of its step.
        for (i, pause) in steps.iter().take(7).enumerate() {
            let step = ACCEPT_BACKOFF_FIRST * 2u32.pow(i as u32);
            assert!(*pause >= step / 2 && *pause <= step, "{i}: {pause:?}");
        }
        assert!(steps.iter().all(|p| *p <= ACCEPT_BACKOFF_MAX));
        assert!(failures < 200, "{failures} attempts in a minute");
        assert!((6..=7).contains(&logged), "{logged} lines in a minute");
        // The failures after the last logged line are yet to be counted.
        assert!(counted <= failures && failures - counted < 25);

        // A success starts the pauses over.
        backoff.succeeded();
        let (pause, _) = backoff.failed(now);
        assert!(pause <= ACCEPT_BACKOFF_FIRST, "{pause:?}");
    }

    #[test]
    fn logged_strings_are_capped_on_a_character_boundary() {
        assert_eq!(capped("/healthz"), "/healthz");
        let long = "é".repeat(10_000);
        let cut = capped(&long);
        assert!(cut.len() <= MAX_LOGGED + '…'.len_utf8(), "{}", cut.len());
        assert!(cut.ends_with('…'));
    }
}
