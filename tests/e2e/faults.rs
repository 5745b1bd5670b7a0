//! Faults between the host and AWS, through the test kit's fault proxy in
//! front of kinesis-local and dynalite: an outage long enough to lose every
//! lease (a lone instance takes them back, and `/readyz` says it is not
//! ready meanwhile), seconds of added latency (records keep flowing and no
//! lease is lost), and throttling (counted per shard, logged at most once
//! an interval). Each fault lasts a bounded time, on loopback only.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use shardlane_testkit::admin::metric_sum;
use shardlane_testkit::proxy::{FaultProxy, Faults, Injection};
use shardlane_testkit::{Dynalite, HostProcess, Kinesis, LogLine, guests, unique_name};

use crate::common::{admin_addr, field, http, shardlane_bin};
use crate::leases::{self, QUICK_LEASES, dynamodb_config};

/// The data of every handled record.
fn handled(lines: &[LogLine]) -> HashSet<String> {
    leases::handled(lines)
        .into_iter()
        .map(|(data, _, _)| data)
        .collect()
}

/// GET `path` from the admin server: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    http(addr, "GET", path, None, b"")
}

/// Polls `/readyz` until it answers `status`.
async fn wait_ready(addr: &str, status: u16, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if get(addr, "/readyz").0 == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {status} within {within:?}"
        );
        // Polling the readiness endpoint.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn put(kinesis: &Kinesis, stream: &str, prefix: &str, n: usize) -> Vec<String> {
    let records: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            (
                format!("key-{}", i % 16),
                format!("{prefix}-{i}").into_bytes(),
            )
        })
        .collect();
    kinesis.put_records(stream, &records).await.unwrap();
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

struct Rig {
    kinesis: Kinesis,
    _dynalite: Dynalite,
    kinesis_proxy: FaultProxy,
    dynamodb_proxy: FaultProxy,
    stream: String,
    host: HostProcess,
}

/// kinesis-local and dynalite, a fault proxy in front of each, a 4-shard
/// stream, and a lone host reaching both through the proxies.
async fn rig(lease: &str) -> Rig {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let kinesis_proxy = FaultProxy::start(kinesis.endpoint()).await.unwrap();
    let dynamodb_proxy = FaultProxy::start(dynalite.endpoint()).await.unwrap();
    let stream = unique_name("faults");
    kinesis.create_stream(&stream, 4).await.unwrap();
    let config = dynamodb_config(
        "lone",
        &unique_name("leases"),
        &stream,
        &guests.retry,
        lease,
        "",
    );
    let host = HostProcess::start_with(
        shardlane_bin(),
        &config,
        &[
            ("AWS_ENDPOINT_URL_KINESIS", &kinesis_proxy.endpoint()),
            ("AWS_ENDPOINT_URL_DYNAMODB", &dynamodb_proxy.endpoint()),
        ],
    )
    .unwrap();
    Rig {
        kinesis,
        _dynalite: dynalite,
        kinesis_proxy,
        dynamodb_proxy,
        stream,
        host,
    }
}

impl Rig {
    /// Applies `faults` to the way to Kinesis and the way to DynamoDB.
    fn fault_both(&self, faults: Faults) {
        self.kinesis_proxy.set(faults.clone());
        self.dynamodb_proxy.set(faults);
    }

    fn clear_both(&self) {
        self.kinesis_proxy.clear();
        self.dynamodb_proxy.clear();
    }

    /// Puts `n` records `<prefix>-<i>` and waits until all are handled.
    async fn put_and_wait(&mut self, prefix: &str, n: usize, what: &str) {
        let data = put(&self.kinesis, &self.stream, prefix, n).await;
        wait_handled(&mut self.host, what, &data, Duration::from_secs(60)).await;
    }
}

async fn wait_handled(host: &mut HostProcess, what: &str, data: &[String], within: Duration) {
    let want: HashSet<String> = data.iter().cloned().collect();
    host.wait_for(what, within, |lines| want.is_subset(&handled(lines)))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lone_instance_takes_back_every_lease_an_outage_made_it_lose() {
    let mut rig = rig(QUICK_LEASES).await;
    rig.put_and_wait("before", 200, "records put before the outage")
        .await;
    let admin = admin_addr(&rig.host);
    wait_ready(&admin, 200, Duration::from_secs(10)).await;

    // Both services unreachable for longer than a lease duration: every
    // renewal fails, so every lease is lost; and no sync succeeds.
    let outage = Faults {
        refuse: true,
        ..Faults::default()
    };
    rig.fault_both(outage);
    rig.host
        .wait_for("every lease lost", Duration::from_secs(20), |lines| {
            lines
                .iter()
                .filter(|l| field(l, "message").starts_with("lease lost"))
                .count()
                >= 4
        })
        .await
        .unwrap();
    // Not ready while nothing is read (lease duration + two syncs).
    wait_ready(&admin, 503, Duration::from_secs(15)).await;
    rig.clear_both();

    // The table still names this instance; nobody else will take them.
    rig.put_and_wait(
        "after",
        200,
        "records put after the outage (the leases taken back)",
    )
    .await;
    wait_ready(&admin, 200, Duration::from_secs(15)).await;
    let (_, metrics) = get(&admin, "/metrics");
    assert_eq!(
        metric_sum(
            &metrics,
            "shardlane_shards_unread",
            &["subscription=\"fleet\""]
        ),
        0.0,
        "{metrics}"
    );
    assert!(rig.host.terminate().await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn seconds_of_added_latency_slow_the_host_down_but_lose_no_lease() {
    // The default lease settings and AWS deadlines: what must survive a
    // slow network.
    let mut rig = rig(r#"shard_sync_every = "2s""#).await;
    rig.put_and_wait("before", 100, "records put before the latency")
        .await;

    // 2 s added to every call to Kinesis and DynamoDB, for 12 s: longer
    // than a lease duration, so renewals must land through it.
    let slow = Faults {
        delay: Duration::from_secs(2),
        ..Faults::default()
    };
    rig.fault_both(slow);
    let slow_since = Instant::now();
    let during = put(&rig.kinesis, &rig.stream, "during", 100).await;
    let handled_while_slow = rig
        .host
        .wait_for(
            "records handled while the network is slow",
            Duration::from_secs(12),
            |lines| {
                let seen = handled(lines);
                during.iter().all(|d| seen.contains(d))
            },
        )
        .await;
    let slow_for = slow_since.elapsed();
    // Keep it slow for the full window before checking the leases.
    if let Some(rest) = Duration::from_secs(12).checked_sub(slow_for) {
        // The rest of the latency window.
        tokio::time::sleep(rest).await;
    }
    rig.clear_both();
    handled_while_slow.expect("GetRecords completes at 2 s of added latency");
    let lost: Vec<String> = rig
        .host
        .messages("lease lost")
        .iter()
        .map(|l| l.to_string())
        .collect();
    assert!(lost.is_empty(), "no lease is lost to latency: {lost:?}");
    assert!(
        rig.host.messages("lease renewal failed").is_empty(),
        "renewals land through 2 s of latency"
    );
    eprintln!("latency: 100 records put at 2 s of added latency handled within {slow_for:?}");
    rig.put_and_wait("after", 100, "records put after the latency")
        .await;
    assert!(rig.host.terminate().await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_counted_per_shard_and_logged_at_most_once_an_interval() {
    let mut rig = rig(r#"lease_duration = "10s"
renew_every = "1s"
shard_sync_every = "1s""#)
    .await;
    rig.put_and_wait("before", 40, "records put before throttling")
        .await;
    let admin = admin_addr(&rig.host);

    // Every GetRecords throttled, and every lease renewal (UpdateItem),
    // for 4 s: shorter than a lease duration, so no lease is lost.
    rig.kinesis_proxy.set(Faults {
        inject: Some(Injection::throttle("GetRecords")),
        ..Faults::default()
    });
    rig.dynamodb_proxy.set(Faults {
        inject: Some(Injection::throttle("UpdateItem")),
        ..Faults::default()
    });
    // The throttled window.
    tokio::time::sleep(Duration::from_secs(4)).await;
    rig.clear_both();
    assert!(rig.kinesis_proxy.injected() > 0 && rig.dynamodb_proxy.injected() > 0);

    rig.put_and_wait("after", 40, "records put after throttling")
        .await;
    let (_, metrics) = get(&admin, "/metrics");
    let kinesis = metric_sum(
        &metrics,
        "shardlane_throttles_total",
        &["service=\"kinesis\""],
    );
    let dynamodb = metric_sum(
        &metrics,
        "shardlane_throttles_total",
        &["service=\"dynamodb\""],
    );
    assert!(
        kinesis >= 4.0,
        "every shard's reads were throttled:\n{metrics}"
    );
    assert!(dynamodb >= 1.0, "lease renewals were throttled:\n{metrics}");
    let per_shard: HashSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("shardlane_throttles_total") && l.contains("service=\"kinesis\""))
        .filter_map(|l| l.split("shard_id=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(per_shard.len(), 4, "counted per shard:\n{metrics}");

    // At WARN, at most once per 10 s per shard (plus the keeper's once per
    // 10 s): a 4 s window gives one line each, however many throttles.
    let warned = rig
        .host
        .lines()
        .iter()
        .filter(|l| {
            field(l, "level") == "WARN"
                && (field(l, "message").starts_with("read throttled")
                    || field(l, "message").starts_with("lease store calls throttled"))
        })
        .count();
    assert!(warned >= 4, "throttling is visible at WARN");
    assert!(
        warned <= 4 * 2 + 2,
        "{warned} WARN lines for {kinesis} + {dynamodb} throttles"
    );
    eprintln!(
        "throttling: {kinesis} Kinesis and {dynamodb} DynamoDB throttles counted, {warned} WARN lines"
    );

    // Reads that fail otherwise (GetRecords is sent once: each failure
    // reaches the reader) are logged as sparingly: 4 s of reset
    // connections to Kinesis, many failed reads per shard, at most one
    // line per shard (the gate opens at most once in 10 s).
    rig.kinesis_proxy.set(Faults {
        reset: true,
        ..Faults::default()
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    rig.clear_both();
    rig.put_and_wait("reset", 40, "records put after the resets")
        .await;
    let failed = rig.host.messages("GetRecords failed").len();
    assert!(
        (1..=4).contains(&failed),
        "{failed} WARN lines for failed reads over 4 s on 4 shards"
    );
    assert!(rig.host.terminate().await.unwrap().success());
}

/// Lease-store requests and WARN lines while the DynamoDB proxy applies
/// `faults` for 10 s to a lone host on 4 idle shards with the default
/// lease settings (idle: nothing but renewals to write, where a failed
/// renewal was tried again at once); then checks that records put after
/// it are handled. `count` reads the proxy's count of the requests it
/// refused.
async fn store_failing_for_10s(
    faults: Faults,
    count: fn(&FaultProxy) -> u64,
) -> (u64, Vec<String>) {
    // The default lease settings: what production runs.
    let mut rig = rig("").await;
    rig.put_and_wait("before", 100, "records put before the outage")
        .await;
    // Their checkpoints written (`checkpoint_every` is 200 ms here).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let warned_before = rig
        .host
        .lines()
        .iter()
        .filter(|l| field(l, "level") == "WARN")
        .count();
    rig.dynamodb_proxy.set(faults);
    // The failing window.
    tokio::time::sleep(Duration::from_secs(10)).await;
    rig.dynamodb_proxy.clear();
    let sent = count(&rig.dynamodb_proxy);
    let warned: Vec<String> = rig
        .host
        .lines()
        .iter()
        .filter(|l| field(l, "level") == "WARN")
        .skip(warned_before)
        .map(|l| field(l, "message").to_owned())
        .collect();
    rig.put_and_wait("after", 100, "records put after the outage")
        .await;
    assert!(rig.host.terminate().await.unwrap().success());
    (sent, warned)
}

/// Healthy, 4 leases renew every 3 s: ~14 writes in 10 s. Backed off (at
/// most one write per lease per `renew_every` once the backoff is capped,
/// up to 3 SDK attempts each) plus the syncs, a 10 s failure stays well
/// under this; retried at once in a loop, it was thousands a second.
const MOST_REQUESTS: u64 = 300;
/// Each failing kind once per 10 s, and a line per lease lost.
const MOST_WARNINGS: usize = 16;

#[tokio::test(flavor = "multi_thread")]
async fn a_store_outage_is_retried_with_backoff_not_in_a_loop() {
    // DynamoDB resets every connection for 10 s: every renewal,
    // checkpoint and listing fails. Each reset is a request the host sent.
    let outage = Faults {
        reset: true,
        ..Faults::default()
    };
    let (sent, warned) = store_failing_for_10s(outage, FaultProxy::reset_count).await;
    eprintln!(
        "store outage: {sent} DynamoDB requests in 10 s on 4 leases, {} WARN lines",
        warned.len()
    );
    assert!(sent > 0, "the outage was met");
    assert!(sent <= MOST_REQUESTS, "{sent} requests in a 10 s outage");
    assert!(
        warned.len() <= MOST_WARNINGS,
        "{} WARN lines in a 10 s outage: {warned:#?}",
        warned.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_failing_at_once_are_retried_with_backoff_not_in_a_loop() {
    // Every lease write (UpdateItem) refused at once for 10 s with an
    // error the SDK does not retry — as every error is once its retry
    // quota is spent: the keeper's own backoff is all that spaces them.
    let refused = Faults {
        inject: Some(Injection {
            operation: "UpdateItem".to_owned(),
            error: "AccessDeniedException".to_owned(),
            status: 400,
            body: None,
        }),
        ..Faults::default()
    };
    let (sent, warned) = store_failing_for_10s(refused, FaultProxy::injected).await;
    eprintln!(
        "writes refused: {sent} UpdateItem requests in 10 s on 4 leases, {} WARN lines",
        warned.len()
    );
    assert!(sent > 0, "the refusals were met");
    assert!(sent <= MOST_REQUESTS, "{sent} writes in 10 s of refusals");
    assert!(
        warned.len() <= MOST_WARNINGS,
        "{} WARN lines in 10 s of refusals: {warned:#?}",
        warned.len()
    );
}
