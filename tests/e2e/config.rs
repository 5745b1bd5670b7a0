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
