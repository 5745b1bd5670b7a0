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

/// A lane over an inbox the test keeps feeding (see "Waking per fill"):
/// the inbox's sender, the lane's task and what it settles.
fn trickle_lane(
    sub: Arc<SubscriptionConfig>,
    script: Arc<Script>,
) -> (
    crate::channel::DeliverySender,
    tokio::task::JoinHandle<()>,
    mpsc::Receiver<SettlementMsg>,
) {
    let policy = Policy::new(&sub.failure, |_| unreachable!("no dead letters"));
    let harness = harness(sub, policy, script);
    let (tx, inbox) = crate::channel::bounded(64);
    let task = tokio::spawn(harness.lane.run(inbox, CancellationToken::new()));
    (tx, task, harness.settled)
}

/// Closes a trickled lane's inbox; the lane must end within a second.
async fn ends_with_its_inbox(
    tx: crate::channel::DeliverySender,
    task: tokio::task::JoinHandle<()>,
    why: &str,
) {
    drop(tx);
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect(why)
        .unwrap();
}

fn offsets(calls: &[Call]) -> Vec<Vec<u64>> {
    calls
        .iter()
        .map(|c| c.records.iter().map(|(o, _)| *o).collect())
        .collect()
}

/// Catches: a batch lane that waits for a fill sleeping past the record
/// that fills its batch (held to the window), or past the window's end.
#[tokio::test(start_paused = true)]
async fn a_trickled_batch_closes_when_full_or_at_its_windows_end() {
    let script = Script::new([]);
    let (tx, task, _settled) = trickle_lane(
        subscription("batch_size = 5\nbatch_window = \"10s\""),
        script.clone(),
    );
    for n in 0..5 {
        tx.send(record(n, 0)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Full by count 400 ms after its first record: not held to its 10 s.
    assert_eq!(offsets(&script.calls()), vec![vec![0, 1, 2, 3, 4]]);
    // Three more, then nothing: they go at the window's end, together.
    for n in 5..8 {
        tx.send(record(n, 0)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(9_600)).await;
    assert_eq!(script.calls().len(), 1, "before the window's end");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        offsets(&script.calls()),
        vec![vec![0, 1, 2, 3, 4], vec![5, 6, 7]]
    );
    ends_with_its_inbox(tx, task, "the lane ends with its inbox").await;
}

/// Catches: a batch full by bytes held to its window because the lane
/// waits for a count, or an open batch left waiting out its window (or
/// lost) when the inbox closes.
#[tokio::test(start_paused = true)]
async fn a_batch_full_by_bytes_or_cut_by_the_close_goes_at_once() {
    let script = Script::new([]);
    // Records of 400 data bytes, about 420 lowered: two fit in 1 KiB.
    let big = |n| {
        let mut d = record(n, 0);
        Arc::get_mut(&mut d.record).unwrap().data = vec![7; 400];
        d
    };
    let (tx, task, mut settled) = trickle_lane(
        subscription("batch_size = 100\nbatch_window = \"10s\"\nmax_batch_bytes = \"1KiB\""),
        script.clone(),
    );
    for n in 0..3 {
        tx.send(big(n)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        offsets(&script.calls()),
        vec![vec![0, 1]],
        "full by bytes when the third came"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    ends_with_its_inbox(tx, task, "the close ends the open batch's wait").await;
    assert_eq!(offsets(&script.calls()), vec![vec![0, 1], vec![2]]);
    let (mut acked, _) = settled_offsets(&mut settled);
    acked.sort_unstable();
    assert_eq!(acked, vec![0, 1, 2]);
}

/// Catches: a window's close that waits behind an open batch for its fill
/// or its window's end (the close's hold would keep the checkpoint back
/// meanwhile), instead of ending the batch at once, as before fills.
#[tokio::test(start_paused = true)]
async fn a_close_ends_the_open_batch_at_once() {
    let script = Script::new([]);
    let (tx, task, _settled) = trickle_lane(
        subscription("batch_size = 100\nbatch_window = \"10s\""),
        script.clone(),
    );
    for n in 0..2 {
        tx.send(record(n, 0)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tx.send(super::windows::close(99)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        offsets(&script.calls()),
        vec![vec![0, 1], vec![99]],
        "the batch before the close, then the close, 100 ms after it came"
    );
    ends_with_its_inbox(tx, task, "the lane ends with its inbox").await;
}
