//! The wall clock, in milliseconds since the Unix epoch: the one clock of
//! every value the host stores or shows with a time (dead-letter envelopes,
//! state TTLs, EMF documents, the status page).
//!
//! Timers and deadlines use `tokio::time::Instant` instead, which tests
//! can pause.
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 on a clock set before it.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
