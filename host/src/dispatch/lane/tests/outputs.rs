//! Outputs: only an acking attempt's, each with its own input, through
//! the output stage.

use super::*;

fn output(input: u32, data: &str) -> Output {
    Output {
        input,
        stream: StreamName::from("out"),
        partition_key: PartitionKey::from("k"),
        data: data.as_bytes().to_vec(),
    }
}

/// Catches: a record with outputs settled before they are put (the
/// checkpoint would pass an input whose outputs may never appear).
#[tokio::test(start_paused = true)]
async fn an_acked_record_with_outputs_settles_through_the_output_stage() {
    let script = Script::new([Step::OneWith(
        Outcome::Ack,
        vec![output(0, "a"), output(0, "b")],
    )]);
    let run = run_lane(
        subscription(""),
        None,
        script,
        vec![record(0, 0), record(1, 0)],
        None,
    )
    .await;
    assert_eq!(
        run.published,
        vec![(0, vec!["a".to_owned(), "b".to_owned()])]
    );
    assert_eq!(
        run.settled,
        vec![1],
        "record 0 settles only once its outputs are put"
    );
}

/// Catches: outputs of a failed attempt published (a retried input would
/// publish once per attempt).
#[tokio::test(start_paused = true)]
async fn only_the_acking_attempt_publishes() {
    let script = Script::new([
        Step::OneWith(Outcome::Retry("later".into()), vec![output(0, "first")]),
        Step::OneWith(Outcome::Ack, vec![output(0, "second")]),
    ]);
    let run = run_lane(subscription(""), None, script, vec![record(0, 0)], None).await;
    assert_eq!(run.published, vec![(0, vec!["second".to_owned()])]);
}

/// Catches: a batch's outputs attached to the wrong input, or a rejected
/// input's outputs published.
#[tokio::test(start_paused = true)]
async fn a_batchs_outputs_go_with_their_own_inputs_and_only_if_acked() {
    let script = Script::new([Step::BatchWith(
        vec![Outcome::Ack, Outcome::Reject("no".into()), Outcome::Ack],
        vec![
            output(2, "two"),
            output(1, "one"),
            output(0, "zero"),
            output(2, "two-b"),
        ],
    )]);
    let run = run_lane(
        subscription("batch_size = 3\non_failure = \"skip\""),
        None,
        script,
        (0..3).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        run.published,
        vec![
            (0, vec!["zero".to_owned()]),
            (2, vec!["two".to_owned(), "two-b".to_owned()]),
        ]
    );
    assert_eq!(
        run.settled,
        vec![1],
        "the reject settles (skipped); 0 and 2 wait for their outputs"
    );
}

/// Catches: in a batch, a later record of a key publishing while an
/// earlier record of that key is retried — its outputs would overtake the
/// earlier record's, breaking per-key output order.
#[tokio::test(start_paused = true)]
async fn a_retried_record_keeps_its_outputs_ahead_of_later_ones_in_its_batch() {
    let script = Script::new([
        Step::BatchWith(
            vec![
                Outcome::Ack,
                Outcome::Retry("later".into()),
                Outcome::Ack,
                Outcome::Ack,
            ],
            vec![output(0, "zero"), output(2, "two"), output(3, "three")],
        ),
        Step::BatchWith(vec![Outcome::Ack], vec![output(0, "one")]),
    ]);
    let run = run_lane(
        subscription("batch_size = 4"),
        None,
        script,
        (0..4).map(|i| record(i, 0)).collect(),
        None,
    )
    .await;
    assert_eq!(
        run.published,
        vec![
            (0, vec!["zero".to_owned()]),
            (1, vec!["one".to_owned()]),
            (2, vec!["two".to_owned()]),
            (3, vec!["three".to_owned()]),
        ],
        "records after the retried one publish only once it acked, in order"
    );
}

/// Catches: publishes held back by one group leaking into the next, or a
/// group without retries holding anything back.
#[tokio::test(start_paused = true)]
async fn a_group_without_retries_publishes_as_it_acks() {
    let script = Script::new([
        Step::OneWith(Outcome::Retry("later".into()), vec![]),
        Step::OneWith(Outcome::Ack, vec![output(0, "a")]),
        Step::OneWith(Outcome::Ack, vec![output(0, "b")]),
    ]);
    let run = run_lane(
        subscription(""),
        None,
        script,
        vec![record(0, 0), record(1, 0)],
        None,
    )
    .await;
    assert_eq!(
        run.published,
        vec![(0, vec!["a".to_owned()]), (1, vec!["b".to_owned()])]
    );
}
