//! `SHARDLANE__…` environment overrides: any key, and bad ones named.

use super::*;

fn with_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, String> {
    Config::parse_with_overrides(
        text,
        Path::new("test.toml"),
        vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn environment_overrides_set_any_key() {
    let config = with_env(
        MINIMAL,
        &[
            ("SHARDLANE__ADMIN__LISTEN", "0.0.0.0:9191"),
            ("SHARDLANE__LEASE__STORE", "memory"),
            ("SHARDLANE__SUBSCRIPTION__0__WORKERS", "4"),
            ("SHARDLANE__SUBSCRIPTION__0__BY_KEY", "true"),
            ("SHARDLANE__SUBSCRIPTION__0__POLL_IDLE", "300ms"),
            ("SHARDLANE__SUBSCRIPTION__0__STREAM", "\"quoted\""),
            (
                "SHARDLANE__SUBSCRIPTION__0__START__AT_TIMESTAMP",
                "2026-12-01T00:00:00Z",
            ),
            (
                "SHARDLANE__SUBSCRIPTION__0__PLUGIN",
                "1\nread = \"fan_out\"",
            ),
            ("SHARDLANE_ADMIN_TOKEN", "not an override"),
            ("PATH", "/usr/bin"),
        ],
    )
    .unwrap();
    assert_eq!(config.admin.listen, Some("0.0.0.0:9191".parse().unwrap()));
    assert_eq!(config.lease.store, LeaseBackend::Memory);
    let sub = &config.subscriptions[0];
    assert_eq!(sub.dispatch, DispatchMode::ByKey(4));
    assert_eq!(sub.poll_idle, Duration::from_millis(300));
    assert_eq!(sub.stream.as_str(), "quoted");
    assert!(
        matches!(sub.start, StartPosition::AtTimestamp(_)),
        "a timestamp stays text"
    );
    assert_eq!(
        sub.read,
        ReadMode::Polling,
        "a value of several keys is text, not an injection"
    );
    assert_eq!(sub.plugin, PathBuf::from("1\nread = \"fan_out\""));
}

#[test]
fn bad_environment_overrides_name_the_variable() {
    let err = with_env(MINIMAL, &[("SHARDLANE__SUBSCRIPTION__1__WORKERS", "4")]).unwrap_err();
    assert!(err.contains("SHARDLANE__SUBSCRIPTION__1__WORKERS"), "{err}");
    assert!(err.contains("no subscription[1]"), "{err}");
    let err = with_env(MINIMAL, &[("SHARDLANE__SUBSCRIPTION__0__BOGUS", "1")]).unwrap_err();
    assert!(err.contains("SHARDLANE__SUBSCRIPTION__0__BOGUS"), "{err}");
    assert!(err.contains("bogus"), "{err}");
    let err = with_env(
        MINIMAL,
        &[("SHARDLANE__SUBSCRIPTION__0__POLL_IDLE", "soon")],
    )
    .unwrap_err();
    assert!(err.contains("subscription[0].poll_idle"), "{err}");
    let err = with_env(MINIMAL, &[("SHARDLANE__", "x")]).unwrap_err();
    assert!(err.contains("names no key"), "{err}");
    assert!(!err.contains('\n'), "one line: {err}");
}
