//! Per-key state around a lane's calls (see [`crate::state`]): the view a
//! call starts from, the acks a batch's state forbids, and the writes the
//! acked records stage.
//!
//! # Acks a batch's state forbids
//! Inputs of one key in a batch share the key's state in input order: a
//! later record sees the writes of an earlier one. When a record that
//! wrote does not ack, its writes are discarded, so every later record of
//! its key in the call that acked did so on state that will not exist:
//! its ack becomes a retry (the attempt counted), and it is handled again,
//! after the failed record, on the state without those writes.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Item, sleep};
use crate::backoff::Backoff;
use crate::dispatch::Outcome;
use crate::ids::{LaneId, PartitionKey, SessionId, ShardId, SubscriptionName};
use crate::state::{CallState, StateStage};

/// The retry reason of an ack [`forbid_dependent_acks`] turned back.
pub(super) const DEPENDENT: &str =
    "state: an earlier record of this key in the batch wrote state and did not ack";

/// The view for a call whose inputs are `keys` (each with its shard and
/// reader session: a group's records, or a window close's keys), waiting
/// out a store that cannot be read (no attempt counted: nothing reached
/// the guest). None when `stop` fired first.
pub(super) async fn prepare<'k, K>(
    stage: &Arc<StateStage>,
    keys: K,
    backoff: &mut Backoff,
    stop: &CancellationToken,
    subscription: &SubscriptionName,
    lane: LaneId,
) -> Option<CallState>
where
    K: Iterator<Item = (&'k PartitionKey, &'k ShardId, SessionId)> + Clone,
{
    loop {
        match stage.prepare_keys(keys.clone()).await {
            Ok(state) => return Some(state),
            Err(e) => {
                tracing::warn!(subscription = %subscription, lane = lane.0, error = %e, "cannot read state for the next call; trying again");
                if !sleep(backoff.next_wait(), stop).await {
                    return None;
                }
            }
        }
    }
}

/// The keys of `group`'s records, as [`prepare`] takes them.
pub(super) fn keys_of(
    group: &[Item],
) -> impl Iterator<Item = (&PartitionKey, &ShardId, SessionId)> + Clone {
    group
        .iter()
        .map(|i| (&i.record.partition_key, &i.ticket.shard, i.ticket.session))
}

/// Turns into retries the acks that `state` forbids (module docs).
pub(super) fn forbid_dependent_acks(outcomes: &mut [Outcome], state: &CallState) {
    let mut discarded: Vec<usize> = Vec::new();
    for (input, outcome) in outcomes.iter_mut().enumerate() {
        let Some(key) = state.key_of(input) else {
            continue;
        };
        match outcome {
            Outcome::Ack if discarded.contains(&key) => {
                *outcome = Outcome::Retry(DEPENDENT.to_owned());
            }
            Outcome::Ack => {}
            Outcome::Retry(_) | Outcome::Reject(_) => {
                if state.wrote(input) && !discarded.contains(&key) {
                    discarded.push(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::Record;
    use crate::config::StateConfig;
    use crate::ids::{PartitionKey, SequenceNumber, SessionId, ShardId, StreamName};
    use crate::lease::memory::MemoryLeaseStore;
    use crate::progress::Ticket;
    use crate::state::StateMetrics;
    use crate::telemetry::Telemetry;

    /// A call over records of `keys` in which the inputs in `writers`
    /// wrote.
    async fn call(keys: &[&str], writers: &[u32]) -> CallState {
        let stage = StateStage::new(
            "app".into(),
            Arc::new(StateConfig::default()),
            Arc::new(MemoryLeaseStore::new()),
            StateMetrics::new(&Telemetry::new(), "app"),
        );
        let items: Vec<(Record, Ticket)> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                (
                    Record {
                        window: None,
                        stream: StreamName::from("s"),
                        shard: ShardId::from("shard"),
                        partition_key: PartitionKey::from(*key),
                        sequence: SequenceNumber::parse(&(i + 1).to_string()).unwrap(),
                        sub_sequence: None,
                        arrival_ms: 0,
                        data: Vec::new(),
                    },
                    Ticket {
                        shard: ShardId::from("shard"),
                        session: SessionId(1),
                        offset: i as u64,
                    },
                )
            })
            .collect();
        let mut state = stage
            .prepare_keys(
                items
                    .iter()
                    .map(|(r, t)| (&r.partition_key, &t.shard, t.session)),
            )
            .await
            .unwrap();
        for &input in writers {
            state.set(input, "n", b"1".to_vec()).unwrap();
        }
        state
    }

    fn retry() -> Outcome {
        Outcome::Retry("later".into())
    }

    #[tokio::test]
    async fn a_key_s_acks_after_a_failed_writer_are_retried_and_no_others() {
        let state = call(&["a", "b", "a", "a", "b"], &[0]).await;
        let mut outcomes = vec![
            retry(),
            Outcome::Ack,
            Outcome::Ack,
            Outcome::Ack,
            Outcome::Ack,
        ];
        forbid_dependent_acks(&mut outcomes, &state);
        let dependent = Outcome::Retry(DEPENDENT.into());
        assert_eq!(
            outcomes,
            [
                retry(),
                Outcome::Ack,
                dependent.clone(),
                dependent,
                Outcome::Ack
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_record_that_wrote_nothing_forbids_nothing() {
        let state = call(&["a", "a", "a"], &[1]).await;
        let reject = Outcome::Reject("bad".into());
        let mut outcomes = vec![reject.clone(), Outcome::Ack, Outcome::Ack];
        forbid_dependent_acks(&mut outcomes, &state);
        assert_eq!(outcomes, [reject, Outcome::Ack, Outcome::Ack]);
    }
}
