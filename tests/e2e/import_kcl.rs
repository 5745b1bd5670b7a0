//! `shardlane import-kcl` against dynalite: a KCL-shaped lease table (as
//! KCL 2.x writes it) with a plain record's checkpoint on one shard and a
//! checkpoint inside a KPL aggregate on the other; after the import the
//! host handles exactly what KCL had not, with the file store.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use shardlane_testkit::kpl::{UserRecord, aggregate};
use shardlane_testkit::{Dynalite, HostProcess, Kinesis, guests, unique_name};

use crate::common::{SHARD_HASH, config, echoed_data, guest_lines, shardlane_bin};

async fn kcl_table(dynalite: &Dynalite, table: &str, leases: &[(&str, &str, u64)]) {
    let client = dynalite.client();
    client
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("leaseKey")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("leaseKey")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    for _ in 0..100 {
        let status = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .unwrap();
        if status
            .table()
            .and_then(|t| t.table_status())
            .map(|s| s.as_str())
            == Some("ACTIVE")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (key, checkpoint, sub) in leases {
        let item: HashMap<String, AttributeValue> = [
            ("leaseKey", AttributeValue::S((*key).into())),
            ("checkpoint", AttributeValue::S((*checkpoint).into())),
            (
                "checkpointSubSequenceNumber",
                AttributeValue::N(sub.to_string()),
            ),
            ("leaseCounter", AttributeValue::N("42".into())),
            (
                "ownerSwitchesSinceCheckpoint",
                AttributeValue::N("0".into()),
            ),
            ("leaseOwner", AttributeValue::S("kcl-worker-1".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        client
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kcl_checkpoints_are_imported_and_reading_resumes_after_them() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let dynalite = Dynalite::start().await.unwrap();
    let stream = unique_name("from-kcl");
    kinesis.create_stream(&stream, 2).await.unwrap();

    // Shard 0: ten plain records. Shard 1: an aggregate of six user
    // records, then two plain ones.
    let mut shard0 = Vec::new();
    for i in 0..10 {
        let put = kinesis
            .put_record(
                &stream,
                "p",
                Some(SHARD_HASH[0]),
                format!("plain-{i}").as_bytes(),
            )
            .await
            .unwrap();
        shard0.push(put);
    }
    let users: Vec<UserRecord> = (0..6)
        .map(|i| UserRecord::new(format!("k{i}"), format!("user-{i}")))
        .collect();
    let agg = aggregate(&[users]).unwrap().remove(0);
    let (shard1, agg_seq) = kinesis
        .put_record(&stream, &agg.key, Some(SHARD_HASH[1]), &agg.data)
        .await
        .unwrap();
    for i in 0..2 {
        kinesis
            .put_record(
                &stream,
                "q",
                Some(SHARD_HASH[1]),
                format!("after-{i}").as_bytes(),
            )
            .await
            .unwrap();
    }
    // KCL handled plain-0..plain-4 and user-0..user-2.
    let table = unique_name("kcl-app");
    let (shard0_id, seq4) = shard0[4].clone();
    kcl_table(
        &dynalite,
        &table,
        &[(&shard0_id, &seq4, 0), (&shard1, &agg_seq, 2)],
    )
    .await;

    let state = tempfile::tempdir().unwrap();
    let cfg = config(
        "from-kcl",
        &stream,
        &guests.echo,
        "start = \"trim_horizon\"",
    )
    .replace(
        "store = \"memory\"",
        &format!("store = \"file\"\npath = \"{}\"", state.path().display()),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(&path, &cfg).unwrap();
    let out = Command::new(shardlane_bin())
        .args([
            "import-kcl",
            "--subscription",
            "from-kcl",
            "--table",
            &table,
            "--config",
        ])
        .arg(&path)
        .env("AWS_ENDPOINT_URL_DYNAMODB", dynalite.endpoint())
        .env("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("{shard0_id}: checkpoint {seq4}:0")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{shard1}: checkpoint {agg_seq}:2")),
        "{stdout}"
    );
    assert!(stdout.contains("imported 2 checkpoints"), "{stdout}");

    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("the rest", Duration::from_secs(60), |lines| {
        guest_lines(lines, "echo ").len() >= 10
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(host.terminate().await.unwrap().success());
    let lines = host.lines();
    let mut handled: Vec<String> = guest_lines(&lines, "echo ")
        .iter()
        .map(|l| echoed_data(l))
        .collect();
    handled.sort();
    let mut want: Vec<String> = (5..10)
        .map(|i| format!("plain-{i}"))
        .chain((3..6).map(|i| format!("user-{i}")))
        .chain((0..2).map(|i| format!("after-{i}")))
        .collect();
    want.sort();
    assert_eq!(handled, want, "exactly what KCL had not handled");
}
