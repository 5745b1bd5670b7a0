//! Runs (a handler that takes several records of a shard per call): the
//! records a run did not answer go again after a retried one without an
//! attempt, and a run that failed whole goes again one record per call.

use super::*;

/// A script whose handler takes runs of up to `max_run` records.
fn runs_of(max_run: usize, steps: impl IntoIterator<Item = Step>) -> Arc<Script> {
    let script = Script::new(steps);
    script.max_run.store(max_run, Ordering::SeqCst);
    script
}

/// Catches: the records after a retried one in a run dropped, counted an
/// attempt, or handled before the retried record comes back.
#[tokio::test(start_paused = true)]
async fn after_a_retry_the_rest_of_the_run_waits_behind_it_without_an_attempt() {
    let script = runs_of(
        8,
        [
            Step::One(Ok(Outcome::Ack)),
            Step::Run(Ok(vec![Outcome::Ack, Outcome::Retry("later".into())])),
        ],
    );
    let run = run_lane(
        subscription(""),
        None,
        script.clone(),
        (0..5).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![
            // The first record comes before the instance says it takes runs.
            calls(&[(0, 1)], 0),
            calls(&[(1, 1), (2, 1), (3, 1), (4, 1)], 0),
            calls(&[(2, 2), (3, 1), (4, 1)], 0),
        ]
    );
    // Every record settled once (a lone ack is held: the order may differ).
    let mut settled = run.settled.clone();
    settled.sort_unstable();
    assert_eq!(settled, vec![0, 1, 2, 3, 4]);
}

/// Catches: a rejected record's successors in a run lost, or held back by
/// a backoff that no retry asked for.
#[tokio::test(start_paused = true)]
async fn after_a_reject_the_rest_of_the_run_goes_on_at_once() {
    let script = runs_of(
        8,
        [
            Step::One(Ok(Outcome::Ack)),
            Step::Run(Ok(vec![Outcome::Reject("bad".into())])),
        ],
    );
    let started = tokio::time::Instant::now();
    let run = run_lane(
        subscription(""),
        None,
        script.clone(),
        (0..4).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1)], 0),
            calls(&[(1, 1), (2, 1), (3, 1)], 0),
            calls(&[(2, 1), (3, 1)], 0),
        ]
    );
    let mut settled = run.settled.clone();
    settled.sort_unstable();
    assert_eq!(settled, vec![0, 1, 2, 3]);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no backoff without a retry"
    );
}

/// Catches: a run that trapped counted as a failed attempt of every record
/// in it, or retried whole (one bad record would fail its neighbours'
/// attempts until they are given up).
#[tokio::test(start_paused = true)]
async fn a_run_that_trapped_goes_again_one_record_per_call_without_an_attempt() {
    let script = runs_of(
        8,
        [
            Step::One(Ok(Outcome::Ack)),
            Step::Run(Err(CallError::Trap("boom".into()))),
            Step::One(Ok(Outcome::Ack)),
            Step::One(Err(CallError::Trap("boom".into()))),
        ],
    );
    let run = run_lane(
        subscription(""),
        None,
        script.clone(),
        (0..4).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1)], 0),
            calls(&[(1, 1), (2, 1), (3, 1)], 0),
            // Fresh instances after each trap; each record alone.
            calls(&[(1, 1)], 1),
            calls(&[(2, 1)], 1),
            calls(&[(2, 2)], 2),
            calls(&[(3, 1)], 2),
        ]
    );
    let mut settled = run.settled.clone();
    settled.sort_unstable();
    assert_eq!(settled, vec![0, 1, 2, 3]);
}
