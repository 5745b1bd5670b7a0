//! The packaging files verify with the tools that would install them.

use shardlane_testkit::repo_root;

use crate::common::shardlane_bin;

/// `packaging/systemd/shardlane.service` passes `systemd-analyze verify`
/// (with its ExecStart pointed at the built binary: verify checks that it
/// exists), and gives the ordered shutdown more time than the default
/// `shutdown_timeout`.
#[test]
fn the_systemd_unit_verifies() {
    let unit =
        std::fs::read_to_string(repo_root().join("packaging/systemd/shardlane.service")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/local/bin/shardlane",
            &shardlane_bin().display().to_string(),
        ),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("shardlane.service"),
        "no warnings about the unit: {stderr}"
    );
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.trim().parse().ok())
        .expect("TimeoutStopSec set in seconds");
    let shutdown = shardlane::config::defaults::SHUTDOWN_TIMEOUT.as_secs();
    assert!(
        stop > shutdown,
        "TimeoutStopSec {stop}s outlasts shutdown_timeout {shutdown}s"
    );
}

/// `--version`, shell completions and the manual page come from the binary.
#[test]
fn the_binary_prints_its_version_completions_and_manual() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(shardlane_bin())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(
        run(&["--version"]).trim(),
        format!("shardlane {}", env!("CARGO_PKG_VERSION"))
    );
    for shell in ["bash", "zsh", "fish"] {
        let script = run(&["completions", shell]);
        assert!(
            script.contains("validate") && script.contains("check"),
            "{shell}: {script}"
        );
    }
    let man = run(&["man"]);
    assert!(man.contains(".TH shardlane 1"), "{man}");
    assert!(man.contains("validate"), "{man}");
}
