//! A window's close at its lane: after the records before it, retried
//! like a record (a fresh instance after a trap), its outputs settling the
//! span's hold once put, or given up by the policy.

use super::*;
use crate::ids::Position;
use crate::windows::Window;

/// A close of key `k0`'s window `[0, 1000)`, on the hold at `hold`.
pub(super) fn close(hold: u64) -> Work {
    Work::Close(Arc::new(WindowClose {
        stream: StreamName::from("orders"),
        shard: ShardId::from("shard-0"),
        session: SessionId(1),
        window: Window {
            start: 0,
            end: 1000,
        },
        keys: vec![PartitionKey::new("k0")],
        stage_at: Position::whole(SequenceNumber::parse("1001").unwrap()),
        hold: Ticket {
            shard: ShardId::from("shard-0"),
            session: SessionId(1),
            offset: hold,
        },
    }))
}

fn output(data: &str) -> Output {
    Output {
        input: 0,
        stream: StreamName::from("out"),
        partition_key: PartitionKey::new("k0"),
        data: data.as_bytes().to_vec(),
    }
}

/// Catches: a close run before the records ahead of it, a close whose
/// retry or trap is not tried again (or on a trapped instance), or a hold
/// settled before the close's outputs are put.
#[tokio::test(start_paused = true)]
async fn a_close_follows_its_records_is_retried_and_settles_its_hold_through_its_outputs() {
    let script = Script::new([
        Step::One(Ok(Outcome::Ack)),
        Step::One(Ok(Outcome::Ack)),
        Step::One(Ok(Outcome::Retry("not yet".into()))),
        Step::One(Err(CallError::Trap("boom".into()))),
        Step::OneWith(Outcome::Ack, vec![output("k0=6")]),
    ]);
    let work: Vec<Work> = vec![
        record(0, 0).into(),
        record(1, 0).into(),
        close(9),
        record(2, 0).into(),
    ];
    let run = run_lane(subscription(""), None, script.clone(), work, None).await;
    assert_eq!(
        script.calls(),
        vec![
            calls(&[(0, 1)], 0),
            calls(&[(1, 1)], 0),
            calls(&[(9, 1)], 0),
            calls(&[(9, 2)], 0),
            calls(&[(9, 3)], 1),
            calls(&[(2, 1)], 1),
        ]
    );
    assert_eq!(run.published, vec![(9, vec!["k0=6".to_owned()])]);
    let mut settled = run.settled.clone();
    settled.sort_unstable();
    assert_eq!(
        settled,
        vec![0, 1, 2],
        "the hold settles through its outputs"
    );
    assert_eq!(
        run.metric("shardlane_window_closes_total{subscription=\"s\",outcome=\"ack\"}"),
        1
    );
}

/// Catches: a close given up that leaves its hold standing (the shard's
/// checkpoint stuck for good), or one given up under `block`.
#[tokio::test(start_paused = true)]
async fn a_close_out_of_attempts_is_given_up_and_settles_its_hold() {
    let retry = || Step::One(Ok(Outcome::Retry("never".into())));
    let script = Script::new([retry(), retry()]);
    let sub = subscription("max_attempts = 2\non_failure = \"skip\"");
    let run = run_lane(sub, None, script.clone(), vec![close(5)], None).await;
    assert_eq!(
        script.calls(),
        vec![calls(&[(5, 1)], 0), calls(&[(5, 2)], 0)]
    );
    assert_eq!(run.settled, vec![5]);
    assert!(run.published.is_empty());
    assert_eq!(
        run.metric("shardlane_window_closes_total{subscription=\"s\",outcome=\"given_up\"}"),
        1
    );

    let script = Script::new([retry(), retry(), retry()]);
    let sub = subscription("max_attempts = 2");
    let run = run_lane(sub, None, script.clone(), vec![close(5)], None).await;
    assert_eq!(script.calls().len(), 4, "block: tried until it acks");
    assert_eq!(run.settled, vec![5]);

    let script = Script::new([Step::One(Ok(Outcome::Reject("no".into())))]);
    let run = run_lane(subscription(""), None, script.clone(), vec![close(5)], None).await;
    assert_eq!(run.settled, vec![5]);
    assert_eq!(
        run.metric("shardlane_window_closes_total{subscription=\"s\",outcome=\"reject\"}"),
        1
    );
}
