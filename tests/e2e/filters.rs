//! Event filters through the whole host: records matching no pattern never
//! reach the guest, are counted, and the checkpoint passes them — even
//! when a shard's last records are all filtered out.

use std::time::Duration;

use shardlane_testkit::admin::metric_sum;
use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{
    admin_addr, config, echoed_data, field, guest_lines, http, shardlane_bin, wait_checkpoint,
};

#[tokio::test(flavor = "multi_thread")]
async fn records_matching_no_pattern_settle_without_a_call_and_are_counted() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("filtered");
    kinesis.create_stream(&stream, 1).await.unwrap();
    // 1 in 10 is an order over 100; key "vip-3" always passes; the last 40
    // records are views, filtered out, so only the filter moves the
    // checkpoint to the end. Some data is not JSON at all.
    let records: Vec<(String, Vec<u8>)> = (0..240)
        .map(|i| {
            let key = if i == 57 {
                "vip-3".to_owned()
            } else {
                format!("k-{}", i % 7)
            };
            let data = match i {
                i if i % 10 == 0 && i < 200 => {
                    format!(r#"{{"kind": "order", "amount": {}, "i": {i}}}"#, 150 + i)
                }
                i if i % 10 == 5 && i < 200 => {
                    format!(r#"{{"kind": "order", "amount": 99, "i": {i}}}"#)
                }
                i if i % 13 == 0 => format!("plain text {i}"),
                i => format!(r#"{{"kind": "view", "i": {i}}}"#),
            };
            (key, data.into_bytes())
        })
        .collect();
    let wanted: Vec<String> = records
        .iter()
        .filter(|(key, data)| {
            let text = String::from_utf8_lossy(data);
            key == "vip-3" || (text.contains("\"order\"") && !text.contains("\"amount\": 99,"))
        })
        .map(|(_, data)| String::from_utf8_lossy(data).into_owned())
        .collect();
    assert_eq!(wanted.len(), 21, "20 big orders and the vip record");
    let put = kinesis.put_records(&stream, &records).await.unwrap();
    let last = put.last().unwrap().1.clone();

    let cfg = config(
        "filtered",
        &stream,
        &guests.echo,
        "start = \"trim_horizon\"\nfilter = [\n  \
         '{\"data\": {\"kind\": [\"order\"], \"amount\": [{\"numeric\": [\">\", 100]}]}}',\n  \
         '{\"partitionKey\": [{\"prefix\": \"vip-\"}]}',\n]",
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    wait_checkpoint(
        &mut host,
        "the checkpoint at the last record",
        &last,
        Duration::from_secs(60),
    )
    .await;
    let admin = admin_addr(&host);
    let (_, metrics) = http(&admin, "GET", "/metrics", None, b"");
    let filtered = metric_sum(&metrics, "shardlane_records_filtered_total", &[]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(host.terminate().await.unwrap().success());

    let lines = host.lines();
    let echoed: Vec<String> = guest_lines(&lines, "echo ")
        .iter()
        .map(|l| echoed_data(l))
        .collect();
    assert_eq!(
        echoed, wanted,
        "exactly the records a pattern lets in, in order"
    );
    assert_eq!(filtered, 219.0, "every other record counted as filtered");
    let handled = metric_sum(&metrics, "shardlane_records_total", &[]);
    assert_eq!(handled, 21.0, "filtered records are not handled: {handled}");
    assert!(
        !lines.iter().any(|l| field(l, "message").contains("dead")),
        "nothing dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_pattern_stops_start_up_with_one_line_naming_it() {
    let guests = guests::build().unwrap();
    let cfg = config(
        "filtered",
        "any",
        &guests.echo,
        "filter = ['{\"data\": {\"kind\": [\"order\"]}}', '{\"data\": {\"amount\": [{\"numeric\": [\">\", \"100\"]}]}}']",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(&path, cfg).unwrap();
    let out = std::process::Command::new(shardlane_bin())
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "subscription[0].filter`: pattern 2: data.amount: numeric \"100\": not a number"
        ),
        "{stderr}"
    );
}
