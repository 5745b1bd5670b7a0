//! `[traces] otlp_endpoint`: handler-call and GetRecords spans reach an
//! OpenTelemetry collector over OTLP/HTTP, with the messaging conventions'
//! attributes and the configured `service.name`, though the log keeps them
//! off; and a bad endpoint stops start-up with one line.

use std::time::Duration;

use shardlane_testkit::otlp::OtlpReceiver;
use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{config, guest_lines, shardlane_bin};

#[tokio::test(flavor = "multi_thread")]
async fn spans_are_exported_over_otlp_to_a_collector() {
    let guests = guests::build().unwrap();
    let receiver = OtlpReceiver::start().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("traces");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| (format!("k{i}"), format!("r{i}").into_bytes()))
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let cfg = format!(
        "[traces]\notlp_endpoint = \"{}\"\nservice_name = \"orders-audit\"\n{}",
        receiver.endpoint(),
        config("traced", &stream, &guests.echo, "start = \"trim_horizon\"")
    );
    // The binary's own log filter: spans off in the log.
    let mut host = HostProcess::start_as_deployed(
        shardlane_bin(),
        &cfg,
        &[("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())],
    )
    .unwrap();
    host.wait_for("20 records", Duration::from_secs(60), |lines| {
        guest_lines(lines, "echo ").len() >= 20
    })
    .await
    .unwrap();
    // Stopping exports what is still queued.
    assert!(host.terminate().await.unwrap().success());
    let spans = receiver.spans();
    let process: Vec<_> = spans
        .iter()
        .filter(|s| s.attribute("messaging.operation.type") == Some("process"))
        .collect();
    assert_eq!(process.len(), 20, "one process span per record: {spans:?}");
    for span in &process {
        assert_eq!(span.name, format!("process {stream}"));
        assert_eq!(span.kind, 5, "consumer");
        assert_eq!(span.attribute("messaging.system"), Some("aws_kinesis"));
        assert_eq!(
            span.attribute("messaging.consumer.group.name"),
            Some("traced")
        );
        assert_eq!(
            span.attribute("messaging.destination.name"),
            Some(stream.as_str())
        );
        assert!(span.attribute("messaging.message.id").is_some());
        assert_eq!(
            span.resource_attribute("service.name"),
            Some("orders-audit")
        );
    }
    assert!(
        spans.iter().any(|s| s.name == format!("receive {stream}")
            && s.attribute("messaging.operation.name") == Some("GetRecords")),
        "GetRecords spans too"
    );
    // The log keeps spans off by default: no line lists them.
    assert!(
        host.lines().iter().all(|l| l.get("spans").is_none()),
        "spans stay out of the log"
    );
}

#[test]
fn a_bad_otlp_endpoint_stops_start_up_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(
        &path,
        "[traces]\notlp_endpoint = \"collector:4318\"\n[[subscription]]\nname = \"a\"\nstream = \"s\"\nplugin = \"p.wasm\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(shardlane_bin())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("traces.otlp_endpoint")
            && stderr.contains("not an http:// or https:// URL"),
        "{stderr}"
    );
}
