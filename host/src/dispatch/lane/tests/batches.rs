//! Batches: bisection, halving for memory, retried records alone, a
//! wrong-length answer.

use super::*;

/// Catches: a batch whose call failed retried whole forever instead of
/// bisected, or bisected halves that do not count the attempt.
#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_bisected_and_the_halves_count_an_attempt() {
    let script = Script::new([Step::Batch(Err(CallError::Timeout(Duration::from_secs(1))))]);
    let run = run_lane(
        subscription("batch_size = 4\nbisect_on_error = true"),
        None,
        script.clone(),
        (0..4).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1), (1, 1), (2, 1), (3, 1)], 0),
            calls(&[(0, 2), (1, 2)], 1),
            calls(&[(2, 2), (3, 2)], 1),
        ]
    );
    assert_eq!(run.settled, vec![0, 1, 2, 3]);
}

/// Catches: a batch too big for the guest retried whole forever, or the
/// split counted as an attempt (records would run out of attempts without
/// ever reaching the guest).
#[tokio::test(start_paused = true)]
async fn a_batch_too_big_for_memory_is_halved_without_counting_an_attempt() {
    let script = Script::new([Step::Batch(Err(CallError::OutOfMemory("grow".into())))]);
    let run = run_lane(
        subscription("batch_size = 4"),
        None,
        script.clone(),
        (0..4).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1), (1, 1), (2, 1), (3, 1)], 0),
            calls(&[(0, 1), (1, 1)], 1),
            calls(&[(2, 1), (3, 1)], 1),
        ]
    );
    assert_eq!(run.settled, vec![0, 1, 2, 3]);
}

/// Catches: a batch's retried record called again inside the next batch
/// (out of order), or acks of a batch held back by its retried record.
#[tokio::test(start_paused = true)]
async fn a_batchs_retried_records_are_called_again_alone_before_new_ones() {
    let script = Script::new([Step::Batch(Ok(vec![
        Outcome::Ack,
        Outcome::Retry("later".into()),
        Outcome::Ack,
    ]))]);
    let run = run_lane(
        subscription("batch_size = 3"),
        None,
        script.clone(),
        (0..6).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1), (1, 1), (2, 1)], 0),
            calls(&[(1, 2)], 0),
            calls(&[(3, 1), (4, 1), (5, 1)], 0),
        ]
    );
    assert_eq!(run.settled, vec![0, 2, 1, 3, 4, 5]);
}

/// Catches: an answer of the wrong length that loses records (neither
/// settled nor retried), or that needlessly recycles the instance.
#[tokio::test(start_paused = true)]
async fn a_wrong_number_of_outcomes_fails_the_whole_batch_and_keeps_the_instance() {
    let script = Script::new([Step::Batch(Ok(vec![Outcome::Ack]))]);
    let run = run_lane(
        subscription("batch_size = 2"),
        None,
        script.clone(),
        (0..2).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![calls(&[(0, 1), (1, 1)], 0), calls(&[(0, 2), (1, 2)], 0)]
    );
    assert_eq!(run.settled, vec![0, 1]);
    assert_eq!(
        run.metric("shardlane_call_failures_total{subscription=\"s\",kind=\"guest_error\"}"),
        1
    );
}
