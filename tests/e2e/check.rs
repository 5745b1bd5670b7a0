//! `shardlane check`: accepts a real plugin, and refuses each kind of bad
//! input with one line naming the file and the reason.

use std::process::Command;

use shardlane_testkit::guests;

use crate::common::shardlane_bin;

fn check(path: &std::path::Path) -> (bool, String, String) {
    let out = Command::new(shardlane_bin())
        .arg("check")
        .arg(path)
        .output()
        .expect("run shardlane check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_refused(path: &std::path::Path, reason: &str) {
    let (ok, stdout, stderr) = check(path);
    assert!(!ok, "check accepted {}: {stdout}", path.display());
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "not one line: {stderr:?}");
    assert!(
        line.contains(&path.display().to_string()),
        "file not named: {line}"
    );
    assert!(line.contains(reason), "reason {reason:?} missing: {line}");
}

#[test]
fn accepts_the_echo_plugin() {
    let guests = guests::build().unwrap();
    let (ok, stdout, stderr) = check(&guests.echo);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("world: record-handler (shardlane:plugin@0.1.0)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("shardlane:plugin/log@0.1.0"),
        "imports listed: {stdout}"
    );
    assert!(stdout.contains("digest: sha256:"), "{stdout}");
}

#[test]
fn names_the_contract_version_a_plugin_targets() {
    let guests = guests::build().unwrap();
    let (ok, stdout, stderr) = check(&guests.publisher);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("world: record-handler (shardlane:plugin@0.2.0)"),
        "{stdout}"
    );
    for import in [
        "shardlane:plugin/outputs@0.2.0",
        "wasi:config/store@0.2.0-rc.1",
        "wasi:http/outgoing-handler@0.2.12",
    ] {
        assert!(stdout.contains(import), "{import} listed: {stdout}");
    }
}

#[test]
fn refuses_bad_inputs_with_one_line_each() {
    let guests = guests::build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.wasm");
    assert_refused(&missing, "cannot read it");

    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "this is not wasm\n").unwrap();
    assert_refused(&text, "not a WebAssembly file");

    // The smallest valid core module: magic, version 1, no sections.
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    assert_refused(&core, "core WebAssembly module, not a component");

    assert_refused(
        &guests.other_world,
        "exports neither `handle` (world record-handler) nor `handle-batch` (world batch-handler)",
    );

    assert_refused(
        &guests.importer,
        "imports `test:importer/extra`, which the host does not provide",
    );

    // A component header with garbage after it.
    let broken = dir.path().join("broken.wasm");
    std::fs::write(&broken, b"\0asm\x0d\0\x01\0\xff\xff\xff").unwrap();
    assert_refused(&broken, "cannot compile it");
}
