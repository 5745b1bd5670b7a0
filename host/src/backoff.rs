//! Jittered, capped exponential backoff, used wherever a call is retried
//! (AWS throttling and errors, handler retries).
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use std::time::Duration;

use rand::Rng;

/// Doubles from `initial` up to `max`; each wait is drawn uniformly from the
/// upper half of the current step ("equal jitter"), so many retriers spread
/// out while each still waits at least half the nominal time.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff starting at `initial`, never above `max`.
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            current: initial.min(max),
        }
    }

    /// The next wait, and doubles the step.
    pub(crate) fn next_wait(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = step / 2;
        half + rand::rng().random_range(Duration::ZERO..=half)
    }

    /// Back to `initial` after a success.
    pub(crate) fn reset(&mut self) {
        self.current = self.initial.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_jittered_and_capped() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let steps = [100u64, 200, 400, 400, 400];
        for step in steps {
            let wait = b.next_wait();
            assert!(
                wait >= Duration::from_millis(step / 2),
                "{wait:?} < half of {step}"
            );
            assert!(wait <= Duration::from_millis(step), "{wait:?} > {step}");
        }
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(100));
    }
}
