//! `[metrics] emf`: the host writes its metrics as CloudWatch embedded
//! metric format documents, periodically and once more at shutdown, and
//! the counters' growths add up to what was handled.

use std::time::Duration;

use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{config, guest_lines, shardlane_bin};

#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_written_as_cloudwatch_emf_and_counters_add_up() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("emf");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("emf.log");
    let cfg = format!(
        "[metrics]\nemf = \"{}\"\nemf_every = \"500ms\"\nemf_namespace = \"Orders/Audit\"\n{}",
        file.display(),
        config("emf", &stream, &guests.echo, "start = \"trim_horizon\"")
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    // Records in two rounds, so the growth spreads over several documents.
    for round in 0..2 {
        let records: Vec<(String, Vec<u8>)> = (0..15)
            .map(|i| (format!("k{i}"), format!("r{round}-{i}").into_bytes()))
            .collect();
        kinesis.put_records(&stream, &records).await.unwrap();
        host.wait_for("the round handled", Duration::from_secs(60), |lines| {
            guest_lines(lines, "echo ").len() >= 15 * (round + 1)
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    assert!(host.terminate().await.unwrap().success());

    let text = std::fs::read_to_string(&file).unwrap();
    let documents: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let mut acked = 0.0;
    let mut growths = 0;
    let mut stamps = std::collections::BTreeSet::new();
    for doc in &documents {
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "Orders/Audit", "{doc}");
        stamps.insert(doc["_aws"]["Timestamp"].as_u64().unwrap());
        // Every declared metric has its value, every dimension its label.
        for metric in directive["Metrics"].as_array().unwrap() {
            let name = metric["Name"].as_str().unwrap();
            assert!(doc[name].is_number(), "{name} in {doc}");
        }
        for dimension in directive["Dimensions"][0].as_array().unwrap() {
            assert!(doc[dimension.as_str().unwrap()].is_string(), "{doc}");
        }
        if doc["subscription"] == "emf" && doc["outcome"] == "ack" {
            let growth = doc["shardlane_records_total"].as_f64().unwrap();
            acked += growth;
            growths += usize::from(growth > 0.0);
        }
    }
    assert_eq!(acked, 30.0, "the acks' growths add up to what was handled");
    assert!(
        growths >= 2,
        "both rounds counted in documents of their own"
    );
    assert!(stamps.len() >= 3, "written every 500 ms: {stamps:?}");
    assert!(
        documents
            .iter()
            .any(|d| d["process_cpu_seconds_total"].is_number()
                && d["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == serde_json::json!([[]])),
        "process metrics without dimensions"
    );
}
