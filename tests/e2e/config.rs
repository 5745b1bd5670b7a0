//! Bad config stops `shardlane run` before anything starts, with one line
//! naming the key.

use std::process::Command;

use crate::common::shardlane_bin;

fn run_with(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(shardlane_bin())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .expect("run shardlane");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unknown_key_stops_start_up_naming_it() {
    let (ok, stderr) = run_with(
        r#"
[[subscription]]
name = "a"
stream = "s"
plugin = "p.wasm"
pol_idle = "1s"
"#,
    );
    assert!(!ok);
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "{stderr:?}");
    assert!(line.contains("pol_idle"), "{line}");
    assert!(line.contains("subscription[0]"), "{line}");
    assert!(line.contains("shardlane.toml"), "{line}");
}

#[test]
fn bad_duration_stops_start_up_naming_key() {
    let (ok, stderr) = run_with(
        r#"
[[subscription]]
name = "a"
stream = "s"
plugin = "p.wasm"
checkpoint_every = "often"
"#,
    );
    assert!(!ok);
    assert!(
        stderr.contains("subscription[0].checkpoint_every"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
}

#[test]
fn missing_plugin_stops_start_up_naming_file() {
    let (ok, stderr) = run_with(
        r#"
[[subscription]]
name = "a"
stream = "s"
plugin = "/nonexistent/plugin.wasm"
"#,
    );
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/plugin.wasm"), "{stderr}");
    assert!(stderr.contains("subscription[0] (a)"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
}

#[test]
fn plugin_world_must_fit_the_batch_config() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let (ok, stderr) = run_with(&format!(
        "[[subscription]]\nname = \"b\"\nstream = \"s\"\nplugin = \"{}\"\n",
        guests.batch.display()
    ));
    assert!(!ok);
    assert!(stderr.contains("implements batch-handler"), "{stderr}");
    assert!(stderr.contains("set `batch_size`"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");

    let (ok, stderr) = run_with(&format!(
        "[[subscription]]\nname = \"r\"\nstream = \"s\"\nplugin = \"{}\"\nbatch_size = 10\n",
        guests.echo.display()
    ));
    assert!(!ok);
    assert!(
        stderr.contains("`batch_size` needs a batch-handler plugin"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
}

/// Runs the host against a live emulator with `extra` in its one
/// subscription; returns (success, stderr).
pub(crate) async fn start_against(
    kinesis_endpoint: &str,
    stream: &str,
    extra: &str,
) -> (bool, String) {
    let guests = shardlane_testkit::guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(
        &path,
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n[lease]\nstore = \"memory\"\n[[subscription]]\nname = \"a\"\nstream = \"{stream}\"\nplugin = \"{}\"\n{extra}\n",
            guests.echo.display()
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(shardlane_bin())
        .args(["run", "--config"])
        .arg(&path)
        .env("AWS_ENDPOINT_URL_KINESIS", kinesis_endpoint)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .await
        .expect("run shardlane");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_that_do_not_exist_stop_start_up() {
    let kinesis = shardlane_testkit::Kinesis::start().await.unwrap();
    let (ok, stderr) = start_against(kinesis.endpoint(), "no-such-stream", "").await;
    assert!(!ok);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.contains("subscription[0] (a): stream \"no-such-stream\" does not exist"),
        "{stderr}"
    );

    let stream = shardlane_testkit::unique_name("exists");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let (ok, stderr) = start_against(
        kinesis.endpoint(),
        &stream,
        "on_failure = \"dead_letter\"\ndead_letter_stream = \"no-such-dlq\"",
    )
    .await;
    assert!(!ok);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.contains("dead_letter_stream \"no-such-dlq\" does not exist"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_endpoint_is_retried_then_named() {
    // Nothing listens on a port just freed.
    let endpoint = format!("http://127.0.0.1:{}", shardlane_testkit::free_port());
    let started = std::time::Instant::now();
    let (ok, stderr) = start_against(&endpoint, "orders", "").await;
    assert!(!ok);
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(25),
        "retried for a while first"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.contains("cannot reach Kinesis to check stream \"orders\""),
        "{stderr}"
    );
}

#[test]
fn an_import_the_host_does_not_provide_stops_start_up_naming_it() {
    let guests = shardlane_testkit::guests::build().unwrap();
    let (ok, stderr) = run_with(&format!(
        "[[subscription]]\nname = \"i\"\nstream = \"s\"\nplugin = \"{}\"\n",
        guests.importer.display()
    ));
    assert!(!ok);
    assert!(
        stderr.contains("imports `test:importer/extra`, which the host does not provide"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
}

#[test]
fn the_environment_names_the_config_file_and_overrides_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(
        &path,
        r#"
[[subscription]]
name = "a"
stream = "s"
plugin = "p.wasm"
"#,
    )
    .unwrap();
    let validate = |vars: &[(&str, &str)]| {
        let out = Command::new(shardlane_bin())
            .arg("validate")
            .env("SHARDLANE_CONFIG", &path)
            .envs(vars.iter().copied())
            .output()
            .expect("run shardlane");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The file is found through SHARDLANE_CONFIG (its plugin is missing).
    let (ok, stderr) = validate(&[]);
    assert!(!ok);
    assert!(stderr.contains("p.wasm"), "{stderr}");
    // An override is checked like the file's own keys, and named.
    let (ok, stderr) = validate(&[("SHARDLANE__SUBSCRIPTION__0__POLL_IDLE", "soon")]);
    assert!(!ok);
    assert!(stderr.contains("subscription[0].poll_idle"), "{stderr}");
    let (ok, stderr) = validate(&[("SHARDLANE__SUBSCRIPTION__2__WORKERS", "4")]);
    assert!(!ok);
    assert!(
        stderr.contains("SHARDLANE__SUBSCRIPTION__2__WORKERS"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    // An override can fix what the file gets wrong: here the plugin path.
    let plugin = dir.path().join("p.wasm");
    std::fs::write(&plugin, b"not a component").unwrap();
    let (ok, stderr) = validate(&[(
        "SHARDLANE__SUBSCRIPTION__0__PLUGIN",
        plugin.to_str().unwrap(),
    )]);
    assert!(!ok);
    assert!(
        stderr.contains(plugin.to_str().unwrap()),
        "the overridden path is the one used: {stderr}"
    );
}
