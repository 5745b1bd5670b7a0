//! A window's close at its lane (the reader's `windowing` module holds the
//! protocol): the guest's `close-window`, its state writes staged under
//! the close's position, its outputs published, and the window's hold
//! settled — once, when the close is done.
//!
//! A close is retried like a record: a `retry`, a trap or a timeout counts
//! an attempt and goes again after the lane's backoff (a fresh instance
//! after a trap); past `max_attempts` — and on a `reject` — it is given
//! up: its writes and outputs are dropped, it is logged and counted
//! (`shardlane_window_closes_total{outcome}`), and the hold settles, so
//! the shard goes on. With `on_failure = "block"` (the default) a close is
//! never given up.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Lane, sleep};
use crate::channel::WindowClose;
use crate::config::OnFailure;
use crate::dispatch::{Handled, Handler, HandlerFactory, Outcome};
use crate::settlement::SettlementMsg;
use crate::state::CallState;

/// Why a close was given up.
enum GiveUp {
    /// The plugin rejected it.
    Rejected,
    /// Out of `max_attempts`, with an `on_failure` other than `block`.
    OutOfAttempts,
}

/// How one try of a close ended.
enum Tried {
    Done(Handled<Outcome>, CallState),
    Failed(String),
}

impl<F: HandlerFactory> Lane<F> {
    /// Closes `close`'s window until done or given up. False when
    /// `hard_stop` cut it off (the hold stays: the window is closed again
    /// by whoever reads the shard next).
    pub(super) async fn close_window(
        &mut self,
        close: &Arc<WindowClose>,
        hard_stop: &CancellationToken,
    ) -> bool {
        let mut backoff = self.backoff();
        let mut attempt = 1;
        loop {
            let Some(tried) = self
                .try_close(close, attempt, &mut backoff, hard_stop)
                .await
            else {
                return false;
            };
            let reason = match tried {
                Tried::Done(
                    Handled {
                        outcome: Outcome::Ack,
                        outputs,
                    },
                    mut state,
                ) => {
                    self.commit_close(close, &mut state, outputs).await;
                    return true;
                }
                Tried::Done(
                    Handled {
                        outcome: Outcome::Reject(reason),
                        ..
                    },
                    _,
                ) => {
                    let reason = format!("rejected: {reason}");
                    self.give_up_close(close, GiveUp::Rejected, &reason).await;
                    return true;
                }
                Tried::Done(
                    Handled {
                        outcome: Outcome::Retry(reason),
                        ..
                    },
                    _,
                ) => {
                    format!("retry: {reason}")
                }
                Tried::Failed(reason) => reason,
            };
            let policy = &self.subscription.failure;
            let out_of_attempts = policy.max_attempts.is_some_and(|max| attempt >= max);
            if out_of_attempts && policy.on_failure != OnFailure::Block {
                self.give_up_close(close, GiveUp::OutOfAttempts, &reason)
                    .await;
                return true;
            }
            tracing::warn!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %close.shard, window = %close.window, attempt, reason, "window close failed; trying again");
            attempt += 1;
            if !sleep(backoff.next_wait(), hard_stop).await {
                return false;
            }
        }
    }

    /// One call of `close-window`. None when `hard_stop` fired.
    async fn try_close(
        &mut self,
        close: &Arc<WindowClose>,
        attempt: u32,
        backoff: &mut crate::backoff::Backoff,
        hard_stop: &CancellationToken,
    ) -> Option<Tried> {
        let mut state = match &self.state {
            Some(stage) => {
                let keys = close.keys.iter().map(|k| (k, &close.shard, close.session));
                let (sub, lane) = (&self.subscription.name, self.id);
                super::state::prepare(stage, keys, backoff, hard_stop, sub, lane).await?
            }
            None => CallState::default(),
        };
        let handler = self.handler(backoff, hard_stop).await?;
        let started = std::time::Instant::now();
        let result = tokio::select! {
            _ = hard_stop.cancelled() => return None,
            r = handler.close_window(close, attempt, &mut state) => r,
        };
        self.metrics.duration.observe_duration(started.elapsed());
        self.metrics.calls.inc();
        Some(match result {
            Ok(handled) => Tried::Done(handled, state),
            Err(e) => {
                self.count_failure(&e);
                Tried::Failed(e.to_string())
            }
        })
    }

    /// An acked close: its writes staged, its outputs published (which
    /// settle the hold once put), or the hold settled.
    async fn commit_close(
        &mut self,
        close: &WindowClose,
        state: &mut CallState,
        outputs: Vec<crate::outputs::Output>,
    ) {
        if let Some(stage) = &self.state {
            for index in 0..close.keys.len() {
                if let Some((key, base, delta)) = state.take(index) {
                    let at = (&close.shard, close.session, close.stage_at.clone());
                    stage.stage_at(at, key, base, delta);
                }
            }
        }
        self.metrics.closes.acked.inc();
        if outputs.is_empty() {
            self.settle(SettlementMsg::Settle(close.hold.clone())).await;
        } else {
            self.publish(close.hold.clone(), outputs).await;
        }
    }

    /// A close given up: nothing of it is kept, and the hold settles.
    async fn give_up_close(&mut self, close: &WindowClose, how: GiveUp, reason: &str) {
        match how {
            GiveUp::Rejected => self.metrics.closes.rejected.inc(),
            GiveUp::OutOfAttempts => self.metrics.closes.given_up.inc(),
        }
        tracing::error!(subscription = %self.subscription.name, lane = self.id.0, shard_id = %close.shard, window = %close.window, keys = close.keys.len(), reason, "window close given up: its state writes and outputs are dropped");
        self.settle(SettlementMsg::Settle(close.hold.clone())).await;
    }
}
