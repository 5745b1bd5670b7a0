//! The epoch ticker: the thread that advances the engine's epoch every
//! [`EPOCH_TICK`](super::EPOCH_TICK) while guest code runs, so a running
//! guest yields to the async runtime at each tick (and `handler_timeout`
//! can cancel it) — and that sleeps while none runs. `engine` starts one
//! per `wasmtime::Engine`; every entry into guest code (instantiation, a
//! `handle` or `handle-batch` call, in `instance`) holds a [`Running`]
//! guard for its duration.
//!
//! Why: a ticker that ticks regardless wakes 100 times a second on an idle
//! host, about a third of the CPU an idle 8-shard subscription spent once
//! its shards were read once a second (BENCHMARKS.md, "Read budget").
//!
//! # Protocol, and why no running guest is left without ticks
//! Two atomics, `state` (the guards held, `running`, in its low half; in
//! its high half a count of guards ever taken, `entries`) and `parked`
//! (the ticker is, or is about to be, asleep), and a mutex + condvar to
//! sleep on.
//! - At each tick the ticker reads `state`. A guard held, or `entries`
//!   moved since the last tick (calls ran in between: a busy host's calls
//!   are far shorter than a tick), counts as busy. After [`PARK_AFTER`]
//!   idle ticks in a row it parks: under the mutex it stores
//!   `parked = true`, **then** loads `state`, and waits on the condvar only
//!   if that load saw `running == 0`. The wait is timed (once a second
//!   the ticker ticks, notices whether the engine is gone, and parks again
//!   if still idle), and any wake-up is followed by the same checks.
//! - A guard increments `running` (and `entries`, in the same add),
//!   **then** loads `parked`; when it saw `true` it takes the mutex and
//!   notifies. Dropping it decrements `running`.
//!
//! All four accesses are `SeqCst`, so they fall in one total order. If the
//! guard's increment comes before the ticker's load of `state`, the
//! ticker sees the guard and does not wait. Otherwise the ticker's store of
//! `parked` came before that load, which came before the increment, which
//! came before the guard's load of `parked`: the guard sees `true` and
//! notifies. Its notify cannot be lost, because the ticker holds the mutex
//! from its store through the start of its wait (the wait releases it
//! atomically), and the guard must take the mutex to notify. A busy host
//! never parks (every tick sees a guard held or `entries` moved, which
//! resets the count), so a call pays two atomic operations and nothing
//! else.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Ticks in a row without a running guest before the ticker parks: half a
/// second at 10 ms.
pub(crate) const PARK_AFTER: u32 = 50;

/// How long a parked ticker sleeps before it checks the engine still lives.
const PARKED_CHECK: Duration = Duration::from_secs(1);

/// One guard taken, in `state`'s high half.
const ONE_ENTRY: u64 = 1 << 32;

/// The guards held, from `state`.
fn running(state: u64) -> u32 {
    state as u32
}

#[derive(Debug, Default)]
struct Shared {
    /// `running` in the low 32 bits, `entries` (wrapping) in the high 32.
    state: AtomicU64,
    parked: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The handle guest entries take [`Running`] guards from (cheap to clone).
#[derive(Debug, Clone, Default)]
pub(crate) struct Ticker {
    shared: Arc<Shared>,
}

/// Held while guest code runs: the ticker ticks until the last is dropped.
#[derive(Debug)]
pub(crate) struct Running {
    shared: Arc<Shared>,
}

impl Ticker {
    /// Starts the ticker thread. `tick` advances the epoch and returns
    /// `false` once there is nothing to tick (the engine is gone), which
    /// ends the thread.
    ///
    /// # Errors
    /// When the OS cannot start a thread.
    pub(crate) fn spawn(
        every: Duration,
        mut tick: impl FnMut() -> bool + Send + 'static,
    ) -> std::io::Result<Self> {
        let ticker = Self::default();
        let shared = ticker.shared.clone();
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                let mut idle = 0u32;
                let mut entries_seen = 0;
                loop {
                    if !tick() {
                        return;
                    }
                    let state = shared.state.load(SeqCst);
                    let entries = state >> 32;
                    if running(state) > 0 || entries != entries_seen {
                        idle = 0;
                        entries_seen = entries;
                    } else {
                        // Still idle after a timed wake-up: parks again.
                        idle = idle.saturating_add(1);
                        if idle >= PARK_AFTER {
                            shared.park();
                        }
                    }
                    std::thread::sleep(every);
                }
            })?;
        Ok(ticker)
    }

    /// Guest code is about to run: ticks until the guard is dropped.
    pub(crate) fn running(&self) -> Running {
        let shared = &self.shared;
        shared.state.fetch_add(ONE_ENTRY | 1, SeqCst);
        if shared.parked.load(SeqCst) {
            let _held = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_one();
        }
        Running {
            shared: shared.clone(),
        }
    }
}

impl Shared {
    /// Sleeps until a guest runs, waking every [`PARKED_CHECK`] to return
    /// (so the caller can tick, and notice the engine is gone).
    fn park(&self) {
        let held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.parked.store(true, SeqCst);
        if running(self.state.load(SeqCst)) == 0 {
            // One timed wait: on a wake-up (a guard, or spurious) or the
            // timeout, the caller ticks and parks again if still idle.
            let _ = self
                .wake
                .wait_timeout(held, PARKED_CHECK)
                .unwrap_or_else(|e| e.into_inner());
        }
        self.parked.store(false, SeqCst);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shared.state.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    const EVERY: Duration = Duration::from_millis(2);

    fn counting() -> (Ticker, Arc<AtomicU64>, Arc<AtomicBool>) {
        let ticks = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (ticks.clone(), stop.clone());
        let ticker = Ticker::spawn(EVERY, move || {
            t.fetch_add(1, SeqCst);
            !s.load(SeqCst)
        })
        .unwrap();
        (ticker, ticks, stop)
    }

    /// Waits until `ticks` has moved `by` from now on, or `within` passes.
    fn advances(ticks: &AtomicU64, by: u64, within: Duration) -> bool {
        let from = ticks.load(SeqCst);
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if ticks.load(SeqCst) >= from + by {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    fn parked(ticker: &Ticker) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if ticker.shared.parked.load(SeqCst) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn parks_when_idle_and_ticks_again_at_once_when_a_guest_runs() {
        let (ticker, ticks, stop) = counting();
        assert!(parked(&ticker), "parks after {PARK_AFTER} idle ticks");
        // Parked: no tick for a good while (the check is once a second).
        assert!(!advances(&ticks, 2, Duration::from_millis(300)));
        let running = ticker.running();
        assert!(
            advances(&ticks, 10, Duration::from_millis(500)),
            "a guard wakes it at once"
        );
        // Held past PARK_AFTER ticks: it keeps ticking.
        std::thread::sleep(EVERY * (PARK_AFTER + 10));
        assert!(advances(&ticks, 10, Duration::from_millis(500)));
        drop(running);
        assert!(parked(&ticker), "parks again once the guard is gone");
        stop.store(true, SeqCst);
    }

    #[test]
    fn a_guard_taken_as_the_ticker_parks_is_never_left_without_ticks() {
        let (ticker, ticks, stop) = counting();
        // Each round waits until the ticker has parked (or is parking:
        // `parked` is set just before it checks for guards), then takes a
        // guard a varying moment later: it must see ticks within far less
        // than the parked check (1 s).
        for round in 0..20u32 {
            assert!(parked(&ticker), "round {round}: parks when idle");
            std::thread::sleep(Duration::from_micros(37 * u64::from(round)));
            let held = ticker.running();
            assert!(
                advances(&ticks, 2, Duration::from_millis(300)),
                "round {round}: a held guard got no ticks"
            );
            drop(held);
        }
        stop.store(true, SeqCst);
    }

    #[test]
    fn short_calls_between_ticks_keep_it_from_parking() {
        let (ticker, _ticks, stop) = counting();
        // Calls far shorter than a tick, one every millisecond, for four
        // times as long as it takes to park: no tick sees a guard held,
        // but each sees that calls ran.
        let until = Instant::now() + EVERY * PARK_AFTER * 4;
        let mut parked_seen = false;
        while Instant::now() < until {
            drop(ticker.running());
            parked_seen |= ticker.shared.parked.load(SeqCst);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!parked_seen, "a host that keeps calling never parks");
        assert!(parked(&ticker), "and parks once the calls stop");
        stop.store(true, SeqCst);
    }

    #[test]
    fn the_thread_ends_when_there_is_nothing_to_tick() {
        let (_ticker, ticks, stop) = counting();
        stop.store(true, SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!advances(&ticks, 1, Duration::from_millis(100)));
    }
}
