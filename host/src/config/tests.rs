//! Parsing and validation, key by key: every error names its key.

use super::*;

mod overrides;

const MINIMAL: &str = r#"
[[subscription]]
name = "orders-audit"
stream = "orders"
plugin = "echo.wasm"
"#;

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(text, Path::new("test.toml")).map_err(|e| e.to_string())
}

#[test]
fn minimal_config_takes_defaults() {
    let config = parse(MINIMAL).unwrap();
    let sub = &config.subscriptions[0];
    assert_eq!(sub.name.as_str(), "orders-audit");
    assert_eq!(sub.start, StartPosition::Latest);
    assert_eq!(sub.poll_idle, defaults::POLL_IDLE);
    assert_eq!(sub.checkpoint_every, defaults::CHECKPOINT_EVERY);
    assert_eq!(
        config.lease.store,
        LeaseBackend::File {
            path: PathBuf::from("shardlane-state")
        },
        "the file store is the default"
    );
}

#[test]
fn full_example_parses() {
    let config = parse(
        r#"
[aws]
region = "us-east-1"
endpoint_url = "http://127.0.0.1:4568"

[lease]
store = "memory"

[[subscription]]
name = "a"
stream = "orders"
plugin = "a.wasm"
start = "trim_horizon"
poll_idle = "50ms"
checkpoint_every = "2s"

[[subscription]]
name = "b"
stream = "orders"
plugin = "b.wasm"
start = { at_timestamp = "2026-12-01T00:00:00Z" }
"#,
    )
    .unwrap();
    assert_eq!(config.subscriptions.len(), 2);
    assert_eq!(config.subscriptions[0].start, StartPosition::TrimHorizon);
    assert_eq!(config.subscriptions[0].poll_idle, Duration::from_millis(50));
    assert!(matches!(
        config.subscriptions[1].start,
        StartPosition::AtTimestamp(_)
    ));
}

#[test]
fn unknown_key_is_named_on_one_line() {
    let err = parse(&format!("{MINIMAL}colour = \"blue\"\n")).unwrap_err();
    assert!(err.contains("subscription[0]"), "{err}");
    assert!(err.contains("colour"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn unknown_top_level_table_is_named() {
    let err = parse(&format!("[aws]\nregoin = \"x\"\n{MINIMAL}")).unwrap_err();
    assert!(err.contains("regoin"), "{err}");
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn bad_duration_names_key_and_value() {
    let err = parse(&format!("{MINIMAL}poll_idle = \"soon\"\n")).unwrap_err();
    assert!(err.contains("subscription[0].poll_idle"), "{err}");
    assert!(err.contains("\"soon\""), "{err}");
}

#[test]
fn bad_start_is_named() {
    let err = parse(&format!("{MINIMAL}start = \"beginning\"\n")).unwrap_err();
    assert!(err.contains("subscription[0].start"), "{err}");
    let err = parse(&format!(
        "{MINIMAL}start = {{ at_timestamp = \"yesterday\" }}\n"
    ))
    .unwrap_err();
    assert!(err.contains("start.at_timestamp"), "{err}");
}

#[test]
fn duplicate_names_and_empty_config_are_refused() {
    let err = parse(&format!("{MINIMAL}{MINIMAL}")).unwrap_err();
    assert!(err.contains("subscription[1].name"), "{err}");
    let err = parse("").unwrap_err();
    assert!(err.contains("no [[subscription]]"), "{err}");
}

#[test]
fn dispatch_modes_and_batches() {
    let sub = |extra: &str| parse(&format!("{MINIMAL}{extra}")).map(|c| c.subscriptions[0].clone());
    assert_eq!(sub("").unwrap().dispatch, DispatchMode::Sequential);
    assert_eq!(
        sub("workers = 4\n").unwrap().dispatch,
        DispatchMode::Workers(4)
    );
    assert_eq!(
        sub("workers = 4\nby_key = true\n").unwrap().dispatch,
        DispatchMode::ByKey(4)
    );
    let batch = sub("batch_size = 100\n").unwrap().batch.unwrap();
    assert_eq!(batch.size, 100);
    assert_eq!(batch.window, defaults::BATCH_WINDOW);
    let batch = sub("batch_size = 5\nbatch_window = \"2s\"\n")
        .unwrap()
        .batch
        .unwrap();
    assert_eq!(batch.window, Duration::from_secs(2));
    assert_eq!(batch.max_bytes, defaults::MAX_BATCH_BYTES);
    let batch = sub("batch_size = 5\nmax_batch_bytes = \"512KiB\"\n")
        .unwrap()
        .batch
        .unwrap();
    assert_eq!(batch.max_bytes, 512 << 10);
    for bad in [
        "max_batch_bytes = \"1MiB\"\n",
        "batch_size = 5\nmax_batch_bytes = \"1B\"\n",
        "batch_size = 5\nmax_batch_bytes = \"lots\"\n",
        "batch_size = 5\nmax_memory = \"4MiB\"\nmax_batch_bytes = \"8MiB\"\n",
    ] {
        let err = sub(bad).unwrap_err();
        assert!(
            err.contains("subscription[0].max_batch_bytes"),
            "{bad}: {err}"
        );
    }
    assert!(
        sub("by_key = true\n")
            .unwrap_err()
            .contains("subscription[0].by_key")
    );
    assert!(
        sub("workers = 0\n")
            .unwrap_err()
            .contains("subscription[0].workers")
    );
    assert!(
        sub("batch_size = 0\n")
            .unwrap_err()
            .contains("subscription[0].batch_size")
    );
    assert!(
        sub("batch_window = \"1s\"\n")
            .unwrap_err()
            .contains("subscription[0].batch_window")
    );
}

#[test]
fn canary() {
    let sub = |extra: &str| parse(&format!("{MINIMAL}{extra}")).map(|c| c.subscriptions[0].clone());
    assert!(sub("").unwrap().canary.is_none());
    let c = sub("canary = { plugin = \"next.wasm\", key_fraction = 0.1 }\n")
        .unwrap()
        .canary
        .unwrap();
    assert_eq!(c.plugin, PathBuf::from("next.wasm"));
    assert_eq!(c.slice.fraction(), 0.1);
    for bad in ["0", "1.5", "-0.2"] {
        let err = sub(&format!(
            "canary = {{ plugin = \"n.wasm\", key_fraction = {bad} }}\n"
        ))
        .unwrap_err();
        assert!(err.contains("subscription[0].canary.key_fraction"), "{err}");
    }
    let err = sub("canary = { plugin = \"n.wasm\" }\n").unwrap_err();
    assert!(err.contains("key_fraction"), "{err}");
    // Rules: none by default (a person decides); set, they are the rules.
    assert_eq!(c.rules.rollback_failure_rate, None);
    assert_eq!(c.rules.promote_after_ms, None);
    let ruled = sub("canary = { plugin = \"n.wasm\", key_fraction = 0.1, rollback_on = { failure_rate = 0.05, min_records = 500 }, promote_after = \"10m\" }\n")
        .unwrap()
        .canary
        .unwrap()
        .rules;
    assert_eq!(ruled.rollback_failure_rate, Some(0.05));
    assert_eq!(ruled.min_records, 500);
    assert_eq!(ruled.promote_after_ms, Some(600_000));
    let err = sub("canary = { plugin = \"n.wasm\", key_fraction = 0.1, rollback_on = { failure_rate = 1.5 } }\n").unwrap_err();
    assert!(
        err.contains("subscription[0].canary.rollback_on.failure_rate"),
        "{err}"
    );
    let err =
        sub("canary = { plugin = \"n.wasm\", key_fraction = 0.1, promote_after = \"soon\" }\n")
            .unwrap_err();
    assert!(
        err.contains("subscription[0].canary.promote_after"),
        "{err}"
    );
}

#[test]
fn metrics_listen_apart_from_admin() {
    let config = parse(MINIMAL).unwrap();
    assert_eq!(config.admin.metrics_listen, None, "one listener by default");
    let with = |text: &str| parse(&format!("{text}\n{MINIMAL}"));
    let config = with("[metrics]\nlisten = \"0.0.0.0:9100\"").unwrap();
    assert_eq!(
        config.admin.metrics_listen,
        Some("0.0.0.0:9100".parse().unwrap())
    );
    let err = with("[metrics]\nlisten = \"9100\"").unwrap_err();
    assert!(err.contains("metrics.listen"), "{err}");
    let err = with("[admin]\nlisten = \"127.0.0.1:9090\"\n[metrics]\nlisten = \"127.0.0.1:9090\"")
        .unwrap_err();
    assert!(
        err.contains("metrics.listen") && err.contains("admin.listen too"),
        "{err}"
    );
    assert_eq!(
        with("[metrics]\nlisten = \"off\"")
            .unwrap()
            .admin
            .metrics_listen,
        None
    );
}

#[test]
fn emf_output_takes_defaults_and_names_bad_keys() {
    assert_eq!(parse(MINIMAL).unwrap().emf, None, "off by default");
    let with = |text: &str| parse(&format!("[metrics]\n{text}\n{MINIMAL}"));
    assert_eq!(
        with("emf = \"stdout\"").unwrap().emf,
        Some(EmfConfig {
            to: EmfTarget::Stdout,
            every: defaults::EMF_EVERY,
            namespace: "shardlane".into(),
        })
    );
    let emf = with("emf = \"/var/log/shardlane/emf.log\"\nemf_every = \"10s\"\nemf_namespace = \"Orders/Audit\"")
        .unwrap()
        .emf
        .unwrap();
    assert_eq!(emf.to, EmfTarget::File("/var/log/shardlane/emf.log".into()));
    assert_eq!(emf.every, std::time::Duration::from_secs(10));
    assert_eq!(emf.namespace, "Orders/Audit");
    for (text, key) in [
        ("emf_every = \"10s\"", "metrics.emf_every"),
        (
            "emf = \"stdout\"\nemf_every = \"soon\"",
            "metrics.emf_every",
        ),
        (
            "emf = \"stdout\"\nemf_namespace = \"a:b\"",
            "metrics.emf_namespace",
        ),
        ("emf = \" \"", "metrics.emf"),
    ] {
        let err = with(text).unwrap_err();
        assert!(err.contains(key) && !err.contains('\n'), "{text}: {err}");
    }
}

#[test]
fn engine_pool_size() {
    assert_eq!(
        parse(MINIMAL).unwrap().max_core_instances,
        defaults::MAX_CORE_INSTANCES
    );
    let with = |n: &str| parse(&format!("[engine]\nmax_core_instances = {n}\n{MINIMAL}"));
    assert_eq!(with("200").unwrap().max_core_instances, 200);
    for bad in ["0", "-3", "100000"] {
        let err = with(bad).unwrap_err();
        assert!(err.contains("engine.max_core_instances"), "{err}");
        assert!(err.contains("out of range"), "{err}");
    }
}

#[test]
fn max_leases_per_instance() {
    assert_eq!(parse(MINIMAL).unwrap().lease.max_leases_per_instance, None);
    let with = |n: &str| {
        parse(&format!(
            "[lease]\nmax_leases_per_instance = {n}\n{MINIMAL}"
        ))
    };
    assert_eq!(with("64").unwrap().lease.max_leases_per_instance, Some(64));
    for bad in ["0", "-1"] {
        let err = with(bad).unwrap_err();
        assert!(err.contains("lease.max_leases_per_instance"), "{err}");
        assert!(err.contains("out of range"), "{err}");
    }
}

#[test]
fn quarantine_needs_its_stream_and_bounds_what_it_holds() {
    let sub = |extra: &str| parse(&format!("{MINIMAL}{extra}")).map(|c| c.subscriptions[0].clone());
    let q = sub("on_failure = \"quarantine\"\ndead_letter_stream = \"dlq\"\n").unwrap();
    assert_eq!(q.failure.on_failure, OnFailure::Quarantine("dlq".into()));
    assert_eq!(
        q.failure.on_failure.dead_letter_stream(),
        Some(&"dlq".into())
    );
    assert_eq!(q.failure.quarantine.max_keys, defaults::QUARANTINE_MAX_KEYS);
    assert_eq!(
        q.failure.quarantine.max_records,
        defaults::QUARANTINE_MAX_RECORDS
    );
    let bounded = sub("on_failure = \"quarantine\"\ndead_letter_stream = \"dlq\"\nquarantine = { max_keys = 5, max_records = 7 }\n").unwrap();
    assert_eq!(
        (
            bounded.failure.quarantine.max_keys,
            bounded.failure.quarantine.max_records
        ),
        (5, 7)
    );
    let err = |extra: &str| sub(extra).unwrap_err();
    assert!(
        err("on_failure = \"quarantine\"\n").contains(
            "subscription[0].dead_letter_stream`: on_failure = \"quarantine\" needs the stream"
        ),
        "{}",
        err("on_failure = \"quarantine\"\n")
    );
    assert!(
        err("quarantine = { max_keys = 5 }\n")
            .contains("subscription[0].quarantine`: only applies with on_failure = \"quarantine\"")
    );
    assert!(err("on_failure = \"quarantine\"\ndead_letter_stream = \"dlq\"\nquarantine = { max_keys = 0 }\n").contains("subscription[0].quarantine.max_keys`: 0 is out of range"));
    assert!(err("on_failure = \"quarantine\"\ndead_letter_stream = \"dlq\"\nquarantine = { max_records = -1 }\n").contains("quarantine.max_records`: -1 is out of range"));
    assert!(
        err(
            "on_failure = \"quarantine\"\ndead_letter_stream = \"dlq\"\nquarantine = { keys = 1 }\n"
        )
        .contains("keys")
    );
}

#[test]
fn failure_policy_and_sandbox() {
    let sub = |extra: &str| parse(&format!("{MINIMAL}{extra}")).map(|c| c.subscriptions[0].clone());
    let d = sub("").unwrap();
    assert_eq!(d.failure.on_failure, OnFailure::Block);
    assert_eq!(d.failure.max_attempts, None);
    assert_eq!(d.sandbox.max_memory, defaults::MAX_MEMORY);
    let s = sub("on_failure = \"dead_letter\"\ndead_letter_stream = \"dlq\"\nmax_attempts = 3\nmax_record_age = \"1h\"\nmax_memory = \"64MiB\"\nfuel = 1000000\n").unwrap();
    assert_eq!(s.failure.on_failure, OnFailure::DeadLetter("dlq".into()));
    assert_eq!(s.failure.max_attempts, Some(3));
    assert_eq!(s.failure.max_record_age, Some(Duration::from_secs(3600)));
    assert_eq!(s.sandbox.max_memory, 64 << 20);
    assert_eq!(s.sandbox.fuel, Some(1_000_000));
    assert_eq!(
        sub("max_attempts = -1\n").unwrap().failure.max_attempts,
        None
    );
    assert!(
        sub("on_failure = \"dead_letter\"\n")
            .unwrap_err()
            .contains("subscription[0].dead_letter_stream")
    );
    assert!(
        sub("dead_letter_stream = \"x\"\n")
            .unwrap_err()
            .contains("subscription[0].dead_letter_stream")
    );
    assert!(
        sub("on_failure = \"explode\"\n")
            .unwrap_err()
            .contains("on_failure")
    );
    assert!(
        sub("max_memory = \"lots\"\n")
            .unwrap_err()
            .contains("subscription[0].max_memory")
    );
    assert!(
        sub("max_attempts = 0\n")
            .unwrap_err()
            .contains("subscription[0].max_attempts")
    );
    assert!(
        sub("bisect_on_error = true\n")
            .unwrap_err()
            .contains("subscription[0].bisect_on_error")
    );
    assert!(
        sub("env = [\"SHARDLANE_SURELY_UNSET_VARIABLE\"]\n")
            .unwrap_err()
            .contains("subscription[0].env")
    );
    assert!(
        sub("preopen = { host = \"/nonexistent-dir\", guest = \"/data\" }\n")
            .unwrap_err()
            .contains("subscription[0].preopen.host")
    );
}

#[test]
fn sizes() {
    assert_eq!(parse_size("64MiB"), Some(64 << 20));
    assert_eq!(parse_size("1GiB"), Some(1 << 30));
    assert_eq!(parse_size("512KiB"), Some(512 << 10));
    assert_eq!(parse_size("100MB"), Some(100_000_000));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("1.5 GiB"), Some(3 << 29));
    assert_eq!(parse_size("MiB"), None);
    assert_eq!(parse_size("12 parsecs"), None);
}

#[test]
fn lease_stores() {
    let lease = |text: &str| parse(&format!("[lease]\n{text}\n{MINIMAL}")).map(|c| c.lease.store);
    assert_eq!(lease("store = \"memory\"").unwrap(), LeaseBackend::Memory);
    assert_eq!(
        lease("store = \"file\"\npath = \"/var/lib/x\"").unwrap(),
        LeaseBackend::File {
            path: "/var/lib/x".into()
        }
    );
    assert_eq!(
        lease("store = \"dynamodb\"\ntable = \"leases\"\ncreate_table = true").unwrap(),
        LeaseBackend::DynamoDb {
            table: "leases".into(),
            create_table: true
        }
    );
    assert!(
        lease("store = \"dynamodb\"")
            .unwrap_err()
            .contains("lease.table")
    );
    assert!(
        lease("store = \"memory\"\ntable = \"t\"")
            .unwrap_err()
            .contains("lease.table")
    );
    assert!(
        lease("store = \"dynamodb\"\ntable = \"t\"\npath = \"p\"")
            .unwrap_err()
            .contains("lease.path")
    );
}

#[test]
fn unknown_lease_store_is_named() {
    let err = parse(&format!("[lease]\nstore = \"etcd\"\n{MINIMAL}")).unwrap_err();
    assert!(err.contains("lease.store"), "{err}");
    assert!(err.contains("etcd"), "{err}");
}

#[test]
fn grants_outputs_config_and_http() {
    let config = parse(&format!(
        "{MINIMAL}outputs = [\"enriched\", \"audit\"]\nconfig = {{ lookup_url = \"http://127.0.0.1:8080/customers\", mode = \"fast\" }}\nhttp = {{ allow = [\"127.0.0.1:8080\", \"API.example.com:443\", \"[::1]:9000\"], timeout = \"2s\", max_response = \"64KiB\" }}\n"
    ))
    .unwrap();
    let grants = &config.subscriptions[0].sandbox.grants;
    assert_eq!(
        grants
            .outputs
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>(),
        ["audit", "enriched"]
    );
    assert_eq!(grants.config["mode"], "fast");
    let http = grants.http.as_ref().unwrap();
    assert_eq!(
        http.allow
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["127.0.0.1:8080", "api.example.com:443", "::1:9000"]
    );
    assert_eq!(http.timeout, Duration::from_secs(2));
    assert_eq!(http.max_response, 64 << 10);
    let none = parse(MINIMAL).unwrap();
    assert_eq!(
        *none.subscriptions[0].sandbox.grants,
        Grants::default(),
        "nothing by default"
    );
}

#[test]
fn bad_grants_are_named_on_one_line() {
    for (extra, key, why) in [
        (
            "config = { retries = 3 }",
            "subscription[0].config.retries",
            "3 (integer) is not a string",
        ),
        (
            "config = { nested = { a = \"b\" } }",
            "subscription[0].config.nested",
            "not a string",
        ),
        (
            "http = { allow = [\"api.example.com\"] }",
            "subscription[0].http.allow[0]",
            "the port is required",
        ),
        (
            "http = { allow = [\"host:99999\"] }",
            "subscription[0].http.allow[0]",
            "no valid port",
        ),
        (
            "http = { allow = [\"http://host:80\"] }",
            "subscription[0].http.allow[0]",
            "is not host:port",
        ),
        (
            "http = { allow = [\"h:80\"], max_response = \"lots\" }",
            "subscription[0].http.max_response",
            "is not a size",
        ),
        (
            "outputs = [\"a\", \"a\"]",
            "subscription[0].outputs[1]",
            "listed twice",
        ),
        (
            "outputs = [\"\"]",
            "subscription[0].outputs[0]",
            "must not be empty",
        ),
    ] {
        let err = parse(&format!("{MINIMAL}{extra}\n")).unwrap_err();
        assert!(err.contains(&format!("key `{key}`")), "{extra}: {err}");
        assert!(err.contains(why), "{extra}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn read_mode_and_budget_take_defaults_and_name_bad_keys() {
    let sub = &parse(MINIMAL).unwrap().subscriptions[0];
    assert_eq!(sub.read, ReadMode::Polling);
    assert_eq!(sub.max_reads_per_second, defaults::MAX_READS_PER_SECOND);
    assert_eq!(sub.poll_idle_max, defaults::POLL_IDLE_MAX);

    let fan_out = parse(&format!("{MINIMAL}read = \"fan_out\"\n")).unwrap();
    assert_eq!(
        fan_out.subscriptions[0].read,
        ReadMode::FanOut {
            consumer: "orders-audit".into()
        },
        "the consumer is named after the subscription by default"
    );
    let named = parse(&format!(
        "{MINIMAL}read = \"fan_out\"\nconsumer_name = \"app.v2\"\n"
    ))
    .unwrap();
    assert_eq!(
        named.subscriptions[0].read,
        ReadMode::FanOut {
            consumer: "app.v2".into()
        }
    );
    // A poll_idle above the default cap raises the cap with it.
    let slow = parse(&format!("{MINIMAL}poll_idle = \"2s\"\n")).unwrap();
    assert_eq!(slow.subscriptions[0].poll_idle_max, Duration::from_secs(2));
    let fractional = parse(&format!("{MINIMAL}max_reads_per_second = 0.5\n")).unwrap();
    assert_eq!(fractional.subscriptions[0].max_reads_per_second, 0.5);

    for (line, key) in [
        ("read = \"push\"", "subscription[0].read"),
        ("consumer_name = \"x\"", "subscription[0].consumer_name"),
        (
            "read = \"fan_out\"\nconsumer_name = \"has space\"",
            "subscription[0].consumer_name",
        ),
        (
            "max_reads_per_second = 0",
            "subscription[0].max_reads_per_second",
        ),
        (
            "max_reads_per_second = -1",
            "subscription[0].max_reads_per_second",
        ),
        (
            "poll_idle = \"2s\"\npoll_idle_max = \"1s\"",
            "subscription[0].poll_idle_max",
        ),
    ] {
        let err = parse(&format!("{MINIMAL}{line}\n")).unwrap_err();
        assert!(err.contains(key), "{line}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[test]
fn streams_may_be_named_by_arn_in_the_configured_region() {
    let arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders";
    let text = format!(
        "[aws]\nregion = \"eu-west-1\"\n[[subscription]]\nname = \"a\"\nstream = \"{arn}\"\nplugin = \"p.wasm\"\noutputs = [\"arn:aws:kinesis:eu-west-1:210987654321:stream/out\"]\n"
    );
    let config = parse(&text).unwrap();
    assert_eq!(config.subscriptions[0].stream.as_str(), arn);
    let elsewhere = text.replace("region = \"eu-west-1\"", "region = \"us-east-1\"");
    let err = parse(&elsewhere).unwrap_err();
    assert!(
        err.contains("subscription[0].stream") && err.contains("eu-west-1"),
        "{err}"
    );
    let bad = text.replace(":stream/orders", ":orders");
    let err = parse(&bad).unwrap_err();
    assert!(err.contains("not a Kinesis stream ARN"), "{err}");
}

#[test]
fn aws_profile_and_role_are_checked() {
    let aws = |lines: &str| parse(&format!("[aws]\n{lines}\n{MINIMAL}"));
    let config = aws("profile = \"prod\"\nrole_arn = \"arn:aws:iam::123456789012:role/reader\"\nexternal_id = \"x\"").unwrap();
    assert_eq!(config.aws.profile.as_deref(), Some("prod"));
    assert_eq!(
        config.aws.role,
        Some(AssumeRole {
            arn: "arn:aws:iam::123456789012:role/reader".into(),
            external_id: Some("x".into())
        })
    );
    for (lines, key) in [
        ("profile = \" \"", "aws.profile"),
        ("external_id = \"x\"", "aws.external_id"),
        ("role_arn = \"reader\"", "aws.role_arn"),
        (
            "role_arn = \"arn:aws:iam::123456789012:user/bob\"",
            "aws.role_arn",
        ),
    ] {
        let err = aws(lines).unwrap_err();
        assert!(err.contains(key), "{lines}: {err}");
    }
}

#[test]
fn state_takes_defaults_and_its_limits() {
    let config = parse(&format!(
        "{MINIMAL}state = {{ ttl = \"7d\", max_value = \"1KiB\" }}\n"
    ))
    .unwrap();
    let state = config.subscriptions[0]
        .sandbox
        .grants
        .state
        .clone()
        .unwrap();
    assert_eq!(state.ttl, Some(Duration::from_secs(7 * 86_400)));
    assert_eq!(state.max_value, 1 << 10);
    assert_eq!(state.max_per_key, defaults::STATE_MAX_PER_KEY);
    assert!(
        parse(MINIMAL).unwrap().subscriptions[0]
            .sandbox
            .grants
            .state
            .is_none()
    );
    // by_key lanes keep a key's order: state is allowed.
    parse(&format!(
        "{MINIMAL}workers = 4\nby_key = true\nstate = {{}}\n"
    ))
    .unwrap();
}

#[test]
fn bad_state_settings_are_named_on_one_line() {
    let dynamodb = "[lease]\nstore = \"dynamodb\"\ntable = \"leases\"\n";
    for (head, extra, key, why) in [
        (
            "",
            "state = { ttl = \"soon\" }",
            "subscription[0].state.ttl",
            "is not a duration",
        ),
        (
            "",
            "state = { ttl = \"0s\" }",
            "subscription[0].state.ttl",
            "longer than zero",
        ),
        (
            "",
            "state = { max_value = \"big\" }",
            "subscription[0].state.max_value",
            "is not a size",
        ),
        (
            "",
            "state = { max_value = \"64KiB\", max_per_key = \"1KiB\" }",
            "subscription[0].state.max_per_key",
            "less than state.max_value",
        ),
        (
            "",
            "workers = 4\nstate = {}",
            "subscription[0].state",
            "needs ordered dispatch",
        ),
        (
            "",
            "state = { size = 1 }",
            "subscription[0]",
            "unknown field",
        ),
        (
            dynamodb,
            "state = { max_per_key = \"1MiB\" }",
            "subscription[0].state.max_per_key",
            "more than the dynamodb store holds per key",
        ),
    ] {
        let err = parse(&format!("{head}{MINIMAL}{extra}\n")).unwrap_err();
        assert!(err.contains(key) && err.contains(why), "{extra}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn windows_take_their_defaults_and_refuse_what_cannot_keep_their_order() {
    use crate::windows::{WindowBy, WindowSpec};
    let sub = |extra: &str| parse(&format!("{MINIMAL}{extra}")).map(|c| c.subscriptions[0].clone());
    assert_eq!(sub("").unwrap().window, None);
    assert!(
        sub("window = { size = \"1m\" }\nbatch_size = 10\n")
            .unwrap()
            .window
            .is_some()
    );
    assert_eq!(
        sub("window = { size = \"60s\" }\n").unwrap().window,
        Some(WindowSpec {
            size: Duration::from_secs(60),
            by: WindowBy::Shard,
            grace: defaults::WINDOW_GRACE,
        })
    );
    let keyed = sub(
        "window = { size = \"5m\", by = \"key\", grace = \"10s\" }\nworkers = 4\nby_key = true\n",
    )
    .unwrap()
    .window
    .unwrap();
    assert_eq!(
        (keyed.by, keyed.grace),
        (WindowBy::Key, Duration::from_secs(10))
    );
    for (extra, error) in [
        (
            "window = { size = \"500ms\" }\n",
            "subscription[0].window.size`: 500ms is out of range",
        ),
        (
            "window = { size = \"16m\" }\n",
            "subscription[0].window.size`: 16m is out of range",
        ),
        (
            "window = { size = \"1m\", by = \"lane\" }\n",
            "subscription[0].window.by`: \"lane\" is not a choice",
        ),
        (
            "window = { size = \"1m\", grace = \"2m\" }\n",
            "subscription[0].window.grace`: must not be longer",
        ),
        (
            "window = { size = \"1m\" }\nworkers = 2\nby_key = true\n",
            "by = \"shard\" needs sequential dispatch",
        ),
        (
            "window = { size = \"1m\", by = \"key\" }\nworkers = 2\n",
            "by = \"key\" needs ordered dispatch",
        ),
        ("window = { by = \"key\" }\n", "size"),
    ] {
        let got = sub(extra).unwrap_err();
        assert!(got.contains(error), "{extra}: {got}");
        assert!(!got.contains('\n'), "one line: {got}");
    }
}
