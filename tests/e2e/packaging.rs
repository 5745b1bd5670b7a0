//! The packaging files verify with the tools that would install them.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use shardlane_testkit::{HostProcess, Kinesis, Language, build_examples, repo_root, unique_name};

use crate::common::{admin_addr, config, field, http, shardlane_bin};

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
    let shutdown = shardlane::defaults::SHUTDOWN_TIMEOUT.as_secs();
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

/// `packaging/iam-policy.json` grants exactly the Kinesis, DynamoDB and S3
/// actions the host's code calls, no more, no fewer. The calls are found in
/// `host/src`: every `.operation()` of a file that uses an SDK whose name
/// is one of that SDK's operations — the operation names read from the
/// SDK crates' own `src/operation/` folders, located with `cargo metadata`.
/// A new call without its grant (or a grant left behind) fails here.
#[test]
fn the_iam_policy_grants_exactly_the_calls_the_code_makes() {
    let root = repo_root();
    // Only this platform's packages: the others (e.g. Android's, under
    // reqwest's TLS) are never downloaded by a build here, and offline
    // cargo cannot read what it has not downloaded.
    let rustc = std::process::Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host");
    let metadata = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
        ])
        .arg(&host)
        .current_dir(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        metadata.status.success(),
        "{}",
        String::from_utf8_lossy(&metadata.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout).unwrap();
    let services = [
        ("kinesis", "aws_sdk_kinesis"),
        ("dynamodb", "aws_sdk_dynamodb"),
        ("s3", "aws_sdk_s3"),
    ];
    let operations: Vec<(&str, &str, BTreeSet<String>)> = services
        .iter()
        .map(|(service, krate)| {
            let package = krate.replace('_', "-");
            let manifest = metadata["packages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == package.as_str())
                .and_then(|p| p["manifest_path"].as_str())
                .unwrap_or_else(|| panic!("{package} in cargo metadata"));
            let dir = Path::new(manifest).parent().unwrap().join("src/operation");
            let ops = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .filter_map(|e| {
                    let e = e.ok()?;
                    e.file_type()
                        .ok()?
                        .is_dir()
                        .then(|| e.file_name().into_string().ok())?
                })
                .collect::<BTreeSet<_>>();
            assert!(
                ops.contains("get_item")
                    || ops.contains("get_records")
                    || ops.contains("get_object")
            );
            (*service, *krate, ops)
        })
        .collect();
    let mut called = BTreeSet::new();
    for file in rust_files(&root.join("host/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let uses: Vec<_> = operations
            .iter()
            .filter(|(_, krate, _)| text.contains(krate))
            .collect();
        for name in method_calls_without_arguments(&text) {
            let matching: Vec<_> = uses
                .iter()
                .filter(|(_, _, ops)| ops.contains(&name))
                .collect();
            assert!(
                matching.len() <= 1,
                "{}: .{name}() is an operation of more than one SDK the file uses",
                file.display()
            );
            if let Some((service, _, _)) = matching.first() {
                called.insert(format!("{service}:{}", pascal(&name)));
            }
        }
    }
    let policy: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("packaging/iam-policy.json")).unwrap(),
    )
    .expect("the policy is JSON");
    let granted: BTreeSet<String> = policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["Action"].as_array().unwrap().iter())
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    assert!(called.len() >= 10, "found the calls: {called:?}");
    assert_eq!(
        granted, called,
        "packaging/iam-policy.json vs the code's calls"
    );
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// Every `name` written as `.name()` in `text`.
fn method_calls_without_arguments(text: &str) -> Vec<String> {
    text.split('.')
        .skip(1)
        .filter_map(|after_dot| {
            let name: String = after_dot
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            (!name.is_empty() && after_dot[name.len()..].starts_with("()")).then_some(name)
        })
        .collect()
}

/// `get_shard_iterator` → `GetShardIterator`.
fn pascal(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// `packaging/kubernetes/shardlane.yaml` validates against the Kubernetes
/// 1.32 schemas (`kubernetes-validate --strict`, offline: no cluster here),
/// its ConfigMap's config passes `shardlane validate` (plugin and cache
/// paths pointed at a built plugin and a temporary folder), the grace
/// period outlasts that config's `shutdown_timeout`, the probes hit
/// `/healthz` and `/readyz` on the metrics listener (the writes on the
/// pod's loopback), pods carry scrape
/// annotations and run as the service account that names the IAM role.
/// Not validated here: that a cluster admits it (no API server) and the
/// images (no registry).
#[test]
fn the_kubernetes_manifests_validate() {
    let root = repo_root();
    let manifest = root.join("packaging/kubernetes/shardlane.yaml");
    let python = shardlane_testkit::tools_python().unwrap();
    let validate = python.with_file_name("kubernetes-validate");
    let out = std::process::Command::new(&validate)
        .args(["--strict", "--kubernetes-version", "1.32.0"])
        .arg(&manifest)
        .output()
        .expect("kubernetes-validate runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("a {kind}"))
    };

    let config = find("ConfigMap")["data"]["shardlane.toml"]
        .as_str()
        .expect("the config file in the ConfigMap");
    let plugin = shardlane_testkit::guests::build().unwrap().echo;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlane.toml");
    std::fs::write(
        &path,
        config
            .replace("/plugins/handler.wasm", &plugin.display().to_string())
            .replace(
                "/var/cache/shardlane",
                &dir.path().join("cache").display().to_string(),
            ),
    )
    .unwrap();
    let out = std::process::Command::new(shardlane_bin())
        .args(["validate", "--config"])
        .arg(&path)
        .env_remove("SHARDLANE_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shutdown: u64 = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("shutdown_timeout = \""))
        .and_then(|v| v.split('"').next())
        .and_then(|v| v.strip_suffix('s'))
        .and_then(|v| v.parse().ok())
        .expect("the config sets shutdown_timeout in seconds");

    let pod = &find("Deployment")["spec"]["template"];
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(
        grace > shutdown,
        "grace period {grace}s > shutdown_timeout {shutdown}s"
    );
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["ports"][0]["containerPort"], 9090);
    let listen_of = |table: &str| {
        config
            .split(&format!("[{table}]\n"))
            .nth(1)
            .and_then(|rest| rest.lines().find_map(|l| l.strip_prefix("listen = ")))
            .unwrap_or_else(|| panic!("[{table}] listen in the config"))
            .trim_matches('"')
            .to_owned()
    };
    assert_eq!(
        listen_of("metrics"),
        "0.0.0.0:9090",
        "probes and scrapes on the metrics listener"
    );
    assert!(
        listen_of("admin").starts_with("127.0.0.1:"),
        "writes on the pod's loopback"
    );
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "9090");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let account = pod["spec"]["serviceAccountName"].as_str().unwrap();
    let sa = find("ServiceAccount");
    assert_eq!(sa["metadata"]["name"], account);
    assert!(
        sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
            .as_str()
            .is_some_and(|arn| arn.starts_with("arn:aws:iam::")),
        "credentials from the pod's IAM role"
    );
}

/// `packaging/grafana/shardlane-dashboard.json` queries only series a host
/// exports: a host running a subscription that uses every feature the
/// dashboard shows (state, outputs, a dead-letter stream, a canary, by_key
/// lanes) has, on `/metrics`, a sample of every metric the dashboard's
/// queries and variables name.
#[tokio::test(flavor = "multi_thread")]
async fn the_grafana_dashboard_queries_only_series_the_host_exports() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("packaging/grafana/shardlane-dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["definition"].as_str() {
            queries.push(query.to_owned());
        }
    }
    let mut names = BTreeSet::new();
    for query in &queries {
        for prefix in ["shardlane_", "process_"] {
            let mut rest = query.as_str();
            while let Some(at) = rest.find(prefix) {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                names.insert(name);
            }
        }
    }
    assert!(names.len() >= 20, "the dashboard queries {names:?}");

    let examples = build_examples(Language::Rust).unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let (input, output, dlq) = (
        unique_name("dash-in"),
        unique_name("dash-out"),
        unique_name("dash-dlq"),
    );
    for stream in [&input, &output, &dlq] {
        kinesis.create_stream(stream, 2).await.unwrap();
    }
    let mut records: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("k{i}"), format!("{{\"amount\": {i}}}").into_bytes()))
        .collect();
    records.push(("bad".into(), b"not an amount".to_vec()));
    kinesis.put_records(&input, &records).await.unwrap();
    let plugin = examples.running_total.display().to_string();
    let cfg = config(
        "dash",
        &input,
        &examples.running_total,
        &format!(
            "start = \"trim_horizon\"\nworkers = 2\nby_key = true\nstate = {{}}\noutputs = [\"{output}\"]\nconfig = {{ output_stream = \"{output}\" }}\non_failure = \"dead_letter\"\ndead_letter_stream = \"{dlq}\"\ncanary = {{ plugin = \"{plugin}\", key_fraction = 0.5 }}"
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("every record handled", Duration::from_secs(60), |lines| {
        lines
            .iter()
            .any(|l| field(l, "message") == "record dead-lettered")
            && lines
                .iter()
                .filter(|l| field(l, "message").starts_with("total key="))
                .count()
                >= 40
    })
    .await
    .unwrap();
    let addr = admin_addr(&host);
    // Some series appear with their first event (a checkpoint's age with
    // its first write): poll until every queried one is there, or 30 s.
    let missing_from = |metrics: &str| -> Vec<String> {
        names
            .iter()
            .filter(|name| {
                !metrics
                    .lines()
                    .any(|l| !l.starts_with('#') && l.starts_with(name.as_str()))
            })
            .cloned()
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let missing = loop {
        let (status, metrics) = http(&addr, "GET", "/metrics", None, b"");
        assert_eq!(status, 200);
        let missing = missing_from(&metrics);
        if missing.is_empty() || std::time::Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    host.terminate().await.unwrap();
    assert!(
        missing.is_empty(),
        "the dashboard queries series the host does not export: {missing:?}"
    );
}
