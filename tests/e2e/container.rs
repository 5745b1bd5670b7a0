//! The container image. No registry is reachable where the suite runs, so
//! the Containerfile's base images cannot be pulled: the image is built
//! from scratch with `packaging/container/build-scratch.sh` from the binary
//! under test, checked to declare what the Containerfile's runtime stage
//! declares, and the demo runs in it under podman (Debian's podman, buildah
//! and runc, which the test command installs).
//!
//! Two settings of the `podman run` are this machine's, not the image's:
//! `--runtime runc` (crun refuses the machine's hybrid cgroup layout) and
//! ulimits below the machine's (its root lacks CAP_SYS_RESOURCE, so
//! podman's default raise is refused); and the image's healthcheck is not
//! scheduled (`--health-cmd none`: podman schedules it with systemd timers,
//! and no systemd runs here) but its command is run inside the container.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use shardlane_testkit::{HostProcess, Kinesis, free_port, guests, repo_root, unique_name};

use crate::common::{field, guest_lines, shardlane_bin};

/// Removes the test's container and image however the test ends.
struct Image(String, String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.1])
            .output();
        let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
    }
}

/// The runtime stage's directives (after the Containerfile's last `FROM`):
/// directive → its text.
fn runtime_directives() -> BTreeMap<String, String> {
    let text =
        std::fs::read_to_string(repo_root().join("packaging/container/Containerfile")).unwrap();
    let runtime = text.rsplit("\nFROM ").next().unwrap();
    runtime
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

fn json_array(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: not a JSON array ({e})"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_declares_what_the_containerfile_does_and_runs_the_demo() {
    let name = unique_name("shardlane").to_lowercase();
    let image = Image(format!("localhost/{name}:test"), name.clone());
    let built = Command::new("bash")
        .arg(repo_root().join("packaging/container/build-scratch.sh"))
        .arg(shardlane_bin())
        .arg(&image.0)
        .output()
        .expect("bash runs");
    assert!(
        built.status.success(),
        "build-scratch.sh: {}",
        String::from_utf8_lossy(&built.stderr)
    );

    // What the image declares is what the Containerfile declares.
    let inspect = Command::new("buildah")
        .args(["inspect", "--type", "image", &image.0])
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let inspect: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let config = &inspect["Docker"]["config"];
    let want = runtime_directives();
    assert_eq!(config["User"], want["USER"].as_str());
    assert_eq!(config["WorkingDir"], want["WORKDIR"].as_str());
    assert!(
        config["Env"]
            .as_array()
            .unwrap()
            .contains(&serde_json::Value::from(want["ENV"].as_str())),
        "{}",
        config["Env"]
    );
    let volumes: Vec<&str> = config["Volumes"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut declared: Vec<String> = serde_json::from_value(json_array(&want["VOLUME"])).unwrap();
    declared.sort();
    assert_eq!(volumes, declared);
    assert!(
        config["ExposedPorts"]
            .as_object()
            .unwrap()
            .keys()
            .any(|p| p.trim_end_matches("/tcp") == want["EXPOSE"]),
        "{}",
        config["ExposedPorts"]
    );
    assert_eq!(config["StopSignal"], want["STOPSIGNAL"].as_str());
    assert_eq!(config["Entrypoint"], json_array(&want["ENTRYPOINT"]));
    assert_eq!(config["Cmd"], json_array(&want["CMD"]));
    let healthcheck = &want["HEALTHCHECK"];
    let (options, command) = healthcheck.split_once(" CMD ").unwrap();
    let mut test = vec![serde_json::Value::from("CMD")];
    test.extend(json_array(command).as_array().unwrap().iter().cloned());
    assert_eq!(config["Healthcheck"]["Test"], serde_json::Value::from(test));
    for (option, key) in [
        ("--interval=", "Interval"),
        ("--timeout=", "Timeout"),
        ("--start-period=", "StartPeriod"),
    ] {
        let seconds: u64 = options
            .split_whitespace()
            .find_map(|o| o.strip_prefix(option))
            .and_then(|v| v.strip_suffix('s'))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("HEALTHCHECK {option}"));
        assert_eq!(config["Healthcheck"][key], seconds * 1_000_000_000, "{key}");
    }

    // The demo, in the container: records handled, healthy from inside,
    // and SIGTERM (what `podman stop` sends) ends it in order.
    let plugin = guests::build().unwrap().echo;
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("container");
    kinesis.create_stream(&stream, 2).await.unwrap();
    let records: Vec<(String, Vec<u8>)> = (0..10)
        .map(|i| {
            (
                format!("key-{i}"),
                format!("in a container {i}").into_bytes(),
            )
        })
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();
    let metrics_port = free_port();
    // The file store (its default path) lands in the image's state volume:
    // writable by the image's user, or start-up fails.
    let cfg = format!(
        r#"
[aws]
region = "us-east-1"

[metrics]
listen = "127.0.0.1:{metrics_port}"

[admin]
listen = "off"

[[subscription]]
name = "container-demo"
stream = "{stream}"
plugin = "{plugin}"
start = "trim_horizon"
poll_idle = "50ms"
max_reads_per_second = 20
"#,
        plugin = plugin.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let launcher = dir.path().join("podman-shardlane");
    // HostProcess runs `<launcher> run --log-format json --config <file>`:
    // the launcher runs that in the image, with the config's folder and
    // the plugin mounted read-only at the same paths.
    std::fs::write(
        &launcher,
        format!(
            r#"#!/bin/sh
for arg; do config="$arg"; done
exec podman --runtime runc run --rm --name {name} --network host --health-cmd none \
    --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
    -v "$(dirname "$config"):$(dirname "$config"):ro" \
    -v "{plugin}:{plugin}:ro" \
    -e AWS_ENDPOINT_URL_KINESIS -e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY -e AWS_REGION -e RUST_LOG \
    {image} "$@"
"#,
            plugin = plugin.display(),
            image = image.0,
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&launcher)
        .status()
        .unwrap();
    let mut host = HostProcess::start(&launcher, &cfg, kinesis.endpoint()).unwrap();
    host.wait_for(
        "every record echoed in the container",
        Duration::from_secs(120),
        |lines| guest_lines(lines, "echo ").len() >= records.len(),
    )
    .await
    .unwrap();
    let health = Command::new("podman")
        .args([
            "exec",
            &name,
            "/usr/local/bin/shardlane",
            "healthcheck",
            "--addr",
        ])
        .arg(format!("127.0.0.1:{metrics_port}"))
        .args(["--path", "/readyz"])
        .output()
        .unwrap();
    assert!(
        health.status.success(),
        "the healthcheck from inside: {}{}",
        String::from_utf8_lossy(&health.stdout),
        String::from_utf8_lossy(&health.stderr)
    );
    let status = host.terminate().await.unwrap();
    assert!(
        status.success(),
        "SIGTERM ends the container cleanly: {status}"
    );
    let lines = host.lines();
    assert_eq!(
        guest_lines(&lines, "echo ").len(),
        records.len(),
        "each record once"
    );
    assert!(
        lines
            .iter()
            .any(|l| field(l, "message") == "shardlane stopped"),
        "the ordered shutdown ran to its end"
    );
}
