//! The read budget of a polled shard, through the whole host: an idle
//! shard is never read more often than `max_reads_per_second`, and after
//! throttling (injected by the fault proxy in front of kinesis-local, as
//! Kinesis answers it) the shard is read less often, winning its rate back
//! read by read.

use std::time::{Duration, Instant};

use shardlane_testkit::admin::metric_sum;
use shardlane_testkit::proxy::{FaultProxy, Faults, Injection};
use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{admin_addr, config, field, http, shardlane_bin, wait_positioned};

/// Successful GetRecords calls so far, over every shard.
fn reads(admin: &str) -> f64 {
    let (_, metrics) = http(admin, "GET", "/metrics", None, b"");
    metric_sum(&metrics, "shardlane_get_records_total", &[])
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_shards_are_read_within_the_budget() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("budget");
    kinesis.create_stream(&stream, 2).await.unwrap();
    // poll_idle alone would read each shard 20 times a second.
    let cfg = config("budget", &stream, &guests.echo, "max_reads_per_second = 2");
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    wait_positioned(&mut host, 2).await;
    let admin = admin_addr(&host);
    let before = reads(&admin);
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    let read = reads(&admin) - before;
    // 2 a second per shard: at most 4 / 0.5 + 1 reads each in the window.
    assert!(read <= 18.0, "{read} reads of 2 idle shards in {window:?}");
    assert!(read >= 4.0, "the shards are still read: {read}");

    // Records are still handled at once (within the budget's spacing).
    kinesis
        .put_records(&stream, &[("k".into(), b"after".to_vec())])
        .await
        .unwrap();
    host.wait_for("the record", Duration::from_secs(10), |lines| {
        lines
            .iter()
            .any(|l| field(l, "message").contains("data=\"after\""))
    })
    .await
    .unwrap();
    assert!(host.terminate().await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_lowers_a_shards_read_rate() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let proxy = FaultProxy::start(kinesis.endpoint()).await.unwrap();
    let stream = unique_name("throttled");
    kinesis.create_stream(&stream, 1).await.unwrap();
    // No idle ramp: the quiet shard keeps the 50 ms wait throughout, so
    // only throttling lowers its rate.
    let cfg = config(
        "throttled",
        &stream,
        &guests.echo,
        r#"poll_idle_max = "50ms""#,
    );
    let mut host = HostProcess::start_with(
        shardlane_bin(),
        &cfg,
        &[("AWS_ENDPOINT_URL_KINESIS", &proxy.endpoint())],
    )
    .unwrap();
    wait_positioned(&mut host, 1).await;
    let admin = admin_addr(&host);

    // Unthrottled: about 20 reads a second (poll_idle 50 ms, budget 20).
    let before = reads(&admin);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let unthrottled = reads(&admin) - before;
    assert!(
        unthrottled >= 10.0,
        "{unthrottled} reads in 2 s before throttling"
    );

    proxy.set(Faults {
        inject: Some(Injection::throttle("GetRecords")),
        ..Faults::default()
    });
    // Until the reader has seen six throttled reads (each one counted:
    // GetRecords is sent without SDK retries): its rate is then about
    // 0.75^6, a fifth, of the budget (4 a second; a little more, as what
    // is won back between refusals is cut too).
    let throttled = |admin: &str| {
        let (_, metrics) = http(admin, "GET", "/metrics", None, b"");
        metric_sum(
            &metrics,
            "shardlane_throttles_total",
            &["service=\"kinesis\""],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while throttled(&admin) < 6.0 {
        assert!(Instant::now() < deadline, "reads are throttled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.clear();
    // The first successful read after the throttled window, then 3 s.
    let cleared = reads(&admin);
    let deadline = Instant::now() + Duration::from_secs(30);
    while reads(&admin) == cleared {
        assert!(Instant::now() < deadline, "reads resume after throttling");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resumed = reads(&admin);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = reads(&admin) - resumed;
    eprintln!("throttling: {unthrottled} reads in 2 s before, {after} in the 3 s after");
    // At the rate before, 1.5 times `unthrottled` (30–45 on a quiet
    // machine); from about a fifth of the budget, winning back 0.5 % of
    // it (0.1/s) a second, faster the longer since the last refusal (the
    // error backoff before the first success is part of that time): about
    // 4.5–5 a second, 13–16 in 3 s. Paced, so a busy machine only lowers
    // it; but never down to the floor (one read per 5 s).
    assert!(
        (6.0..=26.0).contains(&after) && after < unthrottled,
        "{after} reads in the 3 s after throttling ({unthrottled} in 2 s before)"
    );
    assert!(host.terminate().await.unwrap().success());
}
