//! Hostile files: what the host reads (plugins, the config, the lease file,
//! the compile cache) may be a device, a FIFO, an empty file or planted by
//! another user. Each is refused at once with one line naming it — or, for
//! a file swapped in while the host runs, refused while the host keeps
//! running and stays able to stop.
//!
//! The tests run as root; "another user" is uid 65534 (nobody), set with
//! `chown`.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shardlane_testkit::{HostProcess, Kinesis, guests, unique_name};

use crate::common::{config, field, guest_lines, shardlane_bin};

const NOBODY: u32 = 65534;

/// How a bounded run of the binary ended.
struct Ran {
    /// `None` when it was still running at the deadline (then killed).
    success: Option<bool>,
    took: Duration,
    stdout: String,
    stderr: String,
}

/// Runs `shardlane args…` with its output in files (so nothing blocks on a
/// full pipe), killing it if it has not exited within `within`.
fn run_bounded(args: &[&std::ffi::OsStr], env: &[(&str, &str)], within: Duration) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let started = Instant::now();
    let mut child = Command::new(shardlane_bin())
        .args(args)
        .envs(env.iter().copied())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start shardlane");
    let success = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status.success());
        }
        if started.elapsed() > within {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        // Polling for the exit.
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        success,
        took: started.elapsed(),
        stdout: std::fs::read_to_string(out).unwrap(),
        stderr: std::fs::read_to_string(err).unwrap(),
    }
}

/// Asserts the run failed on its own within its bound, with one line on
/// stderr naming `path` and `reason`.
fn assert_one_line_refusal(ran: &Ran, path: &Path, reason: &str) {
    assert_eq!(
        ran.success,
        Some(false),
        "not a quick failure (ran {:?}): {}{}",
        ran.took,
        ran.stdout,
        ran.stderr
    );
    let line = ran.stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "not one line: {:?}", ran.stderr);
    assert!(
        line.contains(&path.display().to_string()),
        "{} not named: {line}",
        path.display()
    );
    assert!(line.contains(reason), "reason {reason:?} missing: {line}");
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

fn chown_to_nobody(path: &Path) {
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY))
        .expect("chown to uid 65534 (these tests run as root)");
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn check_refuses_devices_fifos_and_oversized_plugins_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("zero.wasm");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let fifo = dir.path().join("fifo.wasm");
    mkfifo(&fifo);
    // Sparse: 256 MiB + 1 byte of nothing, over the limit.
    let huge = dir.path().join("huge.wasm");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(shardlane::MAX_PLUGIN_BYTES + 1)
        .unwrap();
    for (path, reason) in [
        (&zero, "not a regular file (it is a character device)"),
        (&fifo, "not a regular file (it is a FIFO)"),
        (&huge, "larger than the limit of 268435456 bytes"),
    ] {
        let ran = run_bounded(
            &["check".as_ref(), path.as_os_str()],
            &[],
            Duration::from_secs(10),
        );
        assert_one_line_refusal(&ran, path, reason);
    }
}

#[test]
fn a_config_that_is_a_device_or_fifo_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("shardlane.toml");
    mkfifo(&fifo);
    let zero = PathBuf::from("/dev/zero");
    for command in ["run", "validate"] {
        for path in [&zero, &fifo] {
            let ran = run_bounded(
                &[command.as_ref(), "--config".as_ref(), path.as_os_str()],
                &[],
                Duration::from_secs(5),
            );
            assert_one_line_refusal(&ran, path, "not a regular file");
        }
    }
}

/// Replaces `path` atomically with `bytes` (write beside, then rename), as
/// a deploy would.
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Replaces `path` atomically with a FIFO no one ever writes.
fn replace_with_fifo(path: &Path) {
    let tmp = path.with_extension("fifo");
    mkfifo(&tmp);
    std::fs::rename(&tmp, path).unwrap();
}

fn unreadable_changes(lines: &[shardlane_testkit::LogLine]) -> usize {
    lines
        .iter()
        .filter(|l| {
            field(l, "message")
                == "plugin file changed but cannot be read; waiting for the next change"
                && field(l, "error").contains("not a regular file (it is a FIFO)")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_file_replaced_by_a_fifo_blocks_neither_swaps_nor_shutdown() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("fifo");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("handler.wasm");
    std::fs::copy(&guests.echo, &plugin).unwrap();
    let cfg = config("fifo", &stream, &plugin, "start = \"trim_horizon\"");
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    kinesis
        .put_records(&stream, &[("k".to_owned(), b"one".to_vec())])
        .await
        .unwrap();
    host.wait_for("v1 at work", Duration::from_secs(60), |lines| {
        !guest_lines(lines, "echo ").is_empty()
    })
    .await
    .unwrap();

    replace_with_fifo(&plugin);
    host.wait_for("the FIFO refused", Duration::from_secs(30), |lines| {
        unreadable_changes(lines) == 1
    })
    .await
    .unwrap();

    // A later valid version still goes live, and handles records.
    replace(&plugin, &std::fs::read(&guests.retry).unwrap());
    host.wait_for("the swap live", Duration::from_secs(30), |lines| {
        lines
            .iter()
            .any(|l| field(l, "message") == "plugin file change is live")
    })
    .await
    .unwrap();
    kinesis
        .put_records(&stream, &[("k".to_owned(), b"two".to_vec())])
        .await
        .unwrap();
    host.wait_for("v2 at work", Duration::from_secs(30), |lines| {
        !guest_lines(lines, "handled data=").is_empty()
    })
    .await
    .unwrap();

    // With a FIFO in place again, SIGTERM still stops the host promptly.
    replace_with_fifo(&plugin);
    host.wait_for("the FIFO refused again", Duration::from_secs(30), |lines| {
        unreadable_changes(lines) == 2
    })
    .await
    .unwrap();
    let started = Instant::now();
    let status = host.terminate().await.unwrap();
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?} to stop",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_lease_file_stops_start_up_naming_it() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("empty-leases");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let leases = state.path().join("leases.redb");
    std::fs::write(&leases, b"").unwrap();
    let cfg = config("empty-leases", &stream, &guests.echo, "").replace(
        "store = \"memory\"",
        &format!("store = \"file\"\npath = \"{}\"", state.path().display()),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("shardlane.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let ran = run_bounded(
        &["run".as_ref(), "--config".as_ref(), cfg_path.as_os_str()],
        &[("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint())],
        Duration::from_secs(30),
    );
    // Logs go to stdout; the error is the one line on stderr.
    assert_one_line_refusal(&ran, &leases, "the file is empty (0 bytes)");
    assert_eq!(
        std::fs::metadata(&leases).unwrap().len(),
        0,
        "left as it was"
    );
}

/// Runs `shardlane validate` on a one-subscription config for `plugin`
/// using `cache` as the compile cache; returns (success, stdout + stderr).
fn validate(plugin: &Path, cache: &Path, extra: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    let cfg = format!(
        "[engine]\ncache_dir = \"{}\"\n{}",
        cache.display(),
        config("cached", "s", plugin, extra)
    );
    std::fs::write(&path, cfg).unwrap();
    let out = Command::new(shardlane_bin())
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    found.sort();
    found
}

#[test]
fn a_cache_folder_another_user_can_write_is_not_used() {
    let guests = guests::build().unwrap();
    let base = tempfile::tempdir().unwrap();
    // Owned by another uid, or writable by everyone: refused, so nothing is
    // read from it or written to it; the plugin is compiled and works.
    let foreign = base.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    chmod(&foreign, 0o700);
    chown_to_nobody(&foreign);
    let open = base.path().join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    for cache in [&foreign, &open] {
        let (ok, out) = validate(&guests.echo, cache, "");
        assert!(ok, "{out}");
        assert!(
            entries(cache).is_empty(),
            "{} used: {:?}",
            cache.display(),
            entries(cache)
        );
    }
    // The control: a folder of our own, created by the host, is used.
    let own = base.path().join("own");
    let (ok, out) = validate(&guests.echo, &own, "");
    assert!(ok, "{out}");
    assert_eq!(entries(&own).len(), 1);
    let mode = std::fs::metadata(&own).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "created {mode:o}");
}

#[test]
fn a_planted_cache_entry_of_another_user_is_not_run() {
    let guests = guests::build().unwrap();
    let base = tempfile::tempdir().unwrap();
    let cache = base.path().join("cache");
    // The victim's entry (the echo guest, record-handler)...
    let (ok, out) = validate(&guests.echo, &cache, "");
    assert!(ok && out.contains("record-handler"), "{out}");
    let [victim] = entries(&cache).try_into().unwrap();
    // ...and another component's (the batch guest), standing in for the
    // attacker's code: compiled by the same engine, so wasmtime would take
    // it.
    let (ok, out) = validate(&guests.batch, &cache, "batch_size = 10");
    assert!(ok, "{out}");
    let planted = entries(&cache)
        .into_iter()
        .find(|e| *e != victim)
        .expect("a second entry");

    // Another uid places its code under the victim's entry name.
    std::fs::rename(&planted, &victim).unwrap();
    chmod(&victim, 0o644);
    chown_to_nobody(&victim);
    let (ok, out) = validate(&guests.echo, &cache, "");
    assert!(
        ok && out.contains("record-handler"),
        "the planted entry was run: {out}"
    );
    // Compiled afresh, and the planted entry replaced by the host's own.
    let meta = std::fs::symlink_metadata(&victim).unwrap();
    assert_ne!(std::os::unix::fs::MetadataExt::uid(&meta), NOBODY);
}
