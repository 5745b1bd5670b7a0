//! `shardlane test`, the plugin author's local loop: every example in
//! every language run over a file of records with no AWS and no
//! emulator, with the same journal (`--json`) in each: outcomes and
//! attempts, outputs, state writes and the state after the run, dead
//! letters, filtered records, and `--strict`'s exit code.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;
use shardlane_testkit::http_server::HttpServer;
use shardlane_testkit::{Language, build_examples};

use crate::common::shardlane_bin;

/// What one `shardlane test --json` printed.
struct Run {
    success: bool,
    code: Option<i32>,
    events: Vec<Json>,
    stderr: String,
}

impl Run {
    /// Every record entry of every call, in call order.
    fn calls(&self) -> Vec<&Json> {
        self.events
            .iter()
            .filter(|e| e["event"] == "call")
            .flat_map(|e| e["records"].as_array().unwrap())
            .collect()
    }

    fn of(&self, kind: &str) -> Vec<&Json> {
        self.events.iter().filter(|e| e["event"] == kind).collect()
    }

    /// The guest's log lines (stderr), their messages.
    fn guest_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter_map(|l| l.split_once(" guest: "))
            .map(|(_, rest)| rest)
            .collect()
    }

    /// Each record's outcomes, attempt by attempt, by `shard/sequence`
    /// (a record a run did not reach has none in that call).
    fn outcomes(&self) -> BTreeMap<String, Vec<(u64, Json)>> {
        let mut by_record: BTreeMap<String, Vec<(u64, Json)>> = BTreeMap::new();
        for call in self.calls().into_iter().filter(|c| !c["outcome"].is_null()) {
            by_record
                .entry(format!(
                    "{}/{}",
                    str(&call["shard"]),
                    str(&call["sequence"])
                ))
                .or_default()
                .push((call["attempt"].as_u64().unwrap(), call["outcome"].clone()));
        }
        by_record
    }
}

fn str(value: &Json) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
}

/// Runs `shardlane test --json` with `config` (its `plugin` set to
/// `plugin`) over `records`, with `args` added.
fn run(plugin: &Path, config: &str, records: &[String], args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("shardlane.toml");
    let records_path = dir.path().join("records.jsonl");
    std::fs::write(
        &config_path,
        format!(
            "[aws]\nregion = \"us-east-1\"\n\n[lease]\nstore = \"memory\"\n\n[[subscription]]\nname = \"t\"\nstream = \"local\"\nplugin = \"{}\"\n{config}\n",
            plugin.display()
        ),
    )
    .unwrap();
    std::fs::write(&records_path, records.join("\n")).unwrap();
    let out = std::process::Command::new(shardlane_bin())
        .arg("test")
        .arg("--config")
        .arg(&config_path)
        .arg("--records")
        .arg(&records_path)
        .arg("--json")
        .args(args)
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    Run {
        success: out.status.success(),
        code: out.status.code(),
        events: stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn line(key: &str, data: &str) -> String {
    serde_json::json!({"key": key, "data": data}).to_string()
}

/// `echo` over two shards with `workers = 4, by_key = true`: one call per
/// record, acked on its first attempt, one exact guest line each.
fn echo(lang: Language) {
    let plugin = build_examples(lang).unwrap().echo;
    let records: Vec<String> = (0..12)
        .map(|i| {
            serde_json::json!({
                "key": format!("user-{}", i % 4),
                "data": format!("event {i}"),
                "shard": format!("shardId-00000000000{}", i % 2),
            })
            .to_string()
        })
        .collect();
    let run = run(
        &plugin,
        "workers = 4\nby_key = true",
        &records,
        &["--strict"],
    );
    assert!(run.success, "{}", run.stderr);
    let outcomes = run.outcomes();
    assert_eq!(outcomes.len(), 12);
    for attempts in outcomes.values() {
        assert_eq!(attempts, &[(1, Json::from("ack"))]);
    }
    let mut lines = run.guest_lines();
    lines.retain(|l| l.starts_with("echo key="));
    assert_eq!(lines.len(), 12, "{}", run.stderr);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("echo key=user-3 seq=") && l.contains(" data=\"event 7\""))
    );
    let summary = &run.of("summary")[0];
    assert_eq!(summary["counts"]["ack"], 12, "{summary}");
}

/// `batch-sum` in batches of up to 10: the invalid records rejected and
/// dead-lettered (never put), the rest summed; `--strict` fails the run.
fn batch_sum(lang: Language) {
    let plugin = build_examples(lang).unwrap().batch_sum;
    let mut records: Vec<String> = (1..=20)
        .map(|i: i64| {
            line(
                &format!("acct-{}", i % 3),
                &format!("{{\"amount\": {}}}", i * 3 - 25),
            )
        })
        .collect();
    let invalid = ["not json", "{\"amt\": 3}", "{\"amount\": 1.5}"];
    for (i, bad) in invalid.iter().enumerate() {
        records.insert(i * 7, line("acct-bad", bad));
    }
    let config = "batch_size = 10\nbatch_window = \"100ms\"\non_failure = \"dead_letter\"\ndead_letter_stream = \"sums-dlq\"";
    let run = run(&plugin, config, &records, &[]);
    assert!(run.success, "{}", run.stderr);
    let sum: i64 = run
        .guest_lines()
        .iter()
        .filter_map(|l| l.strip_prefix("batch-sum "))
        .map(|l| {
            let sum = l.split(' ').find_map(|w| w.strip_prefix("sum=")).unwrap();
            sum.parse::<i64>().unwrap()
        })
        .sum();
    assert_eq!(sum, (1..=20).map(|i: i64| i * 3 - 25).sum::<i64>());
    let dead = run.of("dead_letter");
    assert_eq!(dead.len(), invalid.len(), "{}", run.stderr);
    for d in dead {
        assert_eq!(d["stream"], "sums-dlq");
        assert_eq!(d["reason"], "rejected: expected {\"amount\": <integer>}");
    }
    assert!(run.calls().len() >= records.len());
    let strict = self::run(&plugin, config, &records, &["--strict"]);
    assert_eq!(
        strict.code,
        Some(1),
        "--strict with rejects: {}",
        strict.stderr
    );
    assert!(
        strict.stderr.contains("--strict: 3 records rejected"),
        "{}",
        strict.stderr
    );
}

/// `poison` behind a filter: retried records get attempts 1..3, `bad` is
/// rejected and dead-lettered, the filtered key never reaches the guest.
fn poison(lang: Language) {
    let plugin = build_examples(lang).unwrap().poison;
    let data = ["ok-1", "retry", "bad", "ok-2", "retry", "ok-3"];
    let mut records: Vec<String> = data
        .iter()
        .enumerate()
        .map(|(i, d)| line(&format!("order-{i}"), d))
        .collect();
    // Would trap were it delivered: its key is filtered out.
    records.push(line("skip-me", "retry"));
    let config = "retry_backoff = { initial = \"10ms\", max = \"20ms\" }\non_failure = \"dead_letter\"\ndead_letter_stream = \"dlq\"\nfilter = ['{\"partitionKey\": [{\"prefix\": \"order-\"}]}']";
    let run = run(&plugin, config, &records, &[]);
    assert!(run.success, "{}", run.stderr);
    let outcomes = run.outcomes();
    let at = |i: usize| outcomes[&format!("shardId-000000000000/{}", i + 1)].clone();
    let retry = |n: u64| (n, serde_json::json!({"retry": format!("attempt {n} of 3")}));
    for (i, d) in data.iter().enumerate() {
        let want = match *d {
            "retry" => vec![retry(1), retry(2), (3, Json::from("ack"))],
            "bad" => vec![(1, serde_json::json!({"reject": "bad record"}))],
            _ => vec![(1, Json::from("ack"))],
        };
        assert_eq!(at(i), want, "{d}");
    }
    assert!(!outcomes.contains_key("shardId-000000000000/7"));
    let filtered = run.of("filtered");
    assert_eq!(filtered.len(), 1);
    assert_eq!(filtered[0]["key"], "skip-me");
    assert_eq!(run.of("dead_letter").len(), 1);
    let summary = &run.of("summary")[0];
    assert_eq!(summary["counts"]["filtered"], 1, "{summary}");
}

/// `enrich` (outputs, config, HTTP to a local server): one output per
/// record with what the lookup returned; a `flaky` key is retried once.
fn enrich(lang: Language) {
    let plugin = build_examples(lang).unwrap().enrich;
    let server = HttpServer::start().unwrap();
    let records: Vec<String> = ["c1", "c2", "flaky1", "c1"]
        .iter()
        .enumerate()
        .map(|(i, k)| line(k, &format!("{{\"amount\":{i}}}")))
        .collect();
    let config = format!(
        "outputs = [\"enriched\"]\nconfig = {{ lookup_url = \"{}\", output_stream = \"enriched\" }}\nhttp = {{ allow = [\"{}\"] }}",
        server.url("/customers"),
        server.authority()
    );
    let run = run(&plugin, &config, &records, &["--strict"]);
    assert!(run.success, "{}", run.stderr);
    let kept: Vec<&Json> = run
        .calls()
        .into_iter()
        .filter(|c| c["kept"] == true)
        .collect();
    assert_eq!(kept.len(), 4);
    for call in kept {
        let outputs = call["outputs"].as_array().unwrap();
        assert_eq!(outputs.len(), 1, "{call}");
        assert_eq!(outputs[0]["stream"], "enriched");
        let out: Json = serde_json::from_str(str(&outputs[0]["data"])).unwrap();
        let key = str(&call["key"]);
        assert_eq!(out["customer"]["name"], format!("customer {key}"));
        assert_eq!(
            out["id"],
            format!("{}/{}", str(&call["shard"]), str(&call["sequence"]))
        );
    }
    let retried: Vec<&Json> = run
        .calls()
        .into_iter()
        .filter(|c| c["kept"] == false)
        .collect();
    assert_eq!(retried.len(), 1, "one 503 for the flaky key");
    assert_eq!(retried[0]["key"], "flaky1");
}

/// `running-total` (per-key state) from a seeded state: each call's write,
/// its output, and the committed totals after the run; a record without
/// an integer amount is rejected and writes nothing.
fn running_total(lang: Language) {
    let plugin = build_examples(lang).unwrap().running_total;
    let mut records: Vec<String> = (0..12)
        .map(|i| {
            line(
                &format!("k{}", i % 3),
                &format!("{{\"amount\": {}}}", i * 5 - 20),
            )
        })
        .collect();
    records.insert(4, line("k1", "not json"));
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, r#"{"k0": {"total": "1000"}}"#).unwrap();
    let config = "workers = 2\nby_key = true\nstate = {}\noutputs = [\"totals\"]\nconfig = { output_stream = \"totals\" }";
    let run = run(
        &plugin,
        config,
        &records,
        &["--state", seed.to_str().unwrap()],
    );
    assert!(run.success, "{}", run.stderr);
    let mut want: BTreeMap<String, i64> = BTreeMap::from([("k0".to_owned(), 1000)]);
    for i in 0..12 {
        *want.entry(format!("k{}", i % 3)).or_default() += i * 5 - 20;
    }
    let summary = &run.of("summary")[0];
    for (key, total) in &want {
        assert_eq!(
            summary["state"][key]["total"],
            total.to_string(),
            "{summary}"
        );
    }
    for call in run.calls().into_iter().filter(|c| c["kept"] == true) {
        let written = &call["state"][0];
        assert_eq!(written["name"], "total", "{call}");
        let out: Json = serde_json::from_str(str(&call["outputs"][0]["data"])).unwrap();
        assert_eq!(out["total"].to_string(), str(&written["value"]), "{call}");
    }
    let rejected: Vec<&Json> = run
        .calls()
        .into_iter()
        .filter(|c| c["kept"] == false)
        .collect();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0]["state"], serde_json::json!([]));
}

/// `windowed-totals` over records with arrival times in two minutes (and
/// one late record, one that is not JSON): one close per key per window,
/// each publishing the window's sum, and no `sum` left in state.
fn windowed_totals(lang: Language) {
    let plugin = build_examples(lang).unwrap().windowed_totals;
    let at = |key: &str, amount: i64, second: u32| {
        let arrival = format!("2026-12-07T10:{:02}:{:02}Z", second / 60, second % 60);
        serde_json::json!({"key": key, "data": {"amount": amount}, "arrival": arrival}).to_string()
    };
    let records = [
        at("a", 4_000_000_000_000_000, 1),
        at("b", -7, 10),
        at("a", 5, 59),
        serde_json::json!({"key": "b", "data": "not json", "arrival": "2026-12-07T10:00:59Z"})
            .to_string(),
        at("b", 3, 61),
        at("a", 1, 62),
        at("b", 100, 30), // late: its minute closed
    ];
    let config = "workers = 2\nby_key = true\nstate = {}\noutputs = [\"sums\"]\nconfig = { output_stream = \"sums\" }\nwindow = { size = \"60s\", by = \"key\" }";
    let ran = run(&plugin, config, &records, &[]);
    assert!(ran.success, "{}", ran.stderr);
    let minute = 1_796_637_600_000_u64;
    let mut published: Vec<(String, u64, String)> = Vec::new();
    for close in ran.of("close") {
        assert_eq!(close["outcome"], "ack", "{close}");
        let out: Json = serde_json::from_str(str(&close["outputs"][0]["data"])).unwrap();
        let key = str(&close["keys"][0]).to_owned();
        assert_eq!(out["key"], key.as_str(), "{close}");
        let start = out["start"].as_u64().unwrap();
        assert_eq!(out["end"].as_u64().unwrap(), start + 60_000, "{close}");
        assert_eq!(
            str(&out["id"]),
            format!("shardId-000000000000/{start}/{key}"),
            "{close}"
        );
        assert_eq!(close["state"][0]["name"], "sum", "{close}");
        assert!(close["state"][0]["value"].is_null(), "deleted: {close}");
        published.push((key, start - minute, out["sum"].to_string()));
    }
    published.sort();
    assert_eq!(
        published,
        [
            ("a".to_owned(), 0, "4000000000000005".to_owned()),
            ("a".to_owned(), 60_000, "1".to_owned()),
            ("b".to_owned(), 0, "-7".to_owned()),
            ("b".to_owned(), 60_000, "3".to_owned()),
        ]
    );
    let rejected: Vec<&Json> = ran
        .calls()
        .into_iter()
        .filter(|c| c["kept"] == false)
        .collect();
    assert_eq!(rejected.len(), 1, "the record that is not JSON");
    assert!(
        ran.guest_lines()
            .iter()
            .any(|l| l.starts_with("late key=b amount=100")),
        "{}",
        ran.stderr
    );
    let summary = &ran.of("summary")[0];
    for key in ["a", "b"] {
        assert!(summary["state"][key]["sum"].is_null(), "{summary}");
    }
}

/// Every example of `lang`.
fn every_example(lang: Language) {
    echo(lang);
    batch_sum(lang);
    poison(lang);
    enrich(lang);
    running_total(lang);
    windowed_totals(lang);
}

#[test]
fn rust_examples() {
    every_example(Language::Rust);
}

#[test]
fn python_examples() {
    every_example(Language::Python);
}

#[test]
fn javascript_examples() {
    every_example(Language::JavaScript);
}

#[test]
fn c_examples() {
    every_example(Language::C);
}

/// Catches: bad input taking a run half-way, or an error that does not
/// say which line and why.
#[test]
fn a_bad_record_line_is_one_line_naming_it() {
    let plugin = build_examples(Language::Rust).unwrap().echo;
    let run = run(
        &plugin,
        "",
        &[line("a", "fine"), "{\"key\": \"b\"}".to_owned()],
        &[],
    );
    assert_eq!(run.code, Some(1));
    assert!(run.events.is_empty(), "nothing ran");
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("records.jsonl, line 2: no data"),
        "{}",
        run.stderr
    );
}

/// Catches: a 0.3.0 plugin (`handle-run`) not run, or its run's outcomes
/// not settling as a record's: the retried record comes back with its
/// attempt counted, the rejected one is given up, and a trap is retried
/// on a fresh instance (here until `--max-time`, which ends the run with
/// exit 1 and says why).
#[test]
fn a_contract_0_3_0_plugin_runs_records_through_handle_run() {
    let plugin = shardlane_testkit::guests::build().unwrap().runner;
    let config = "retry_backoff = { initial = \"10ms\", max = \"20ms\" }";
    let records = [line("a", "one"), line("b", "retry"), line("c", "bad")];
    let ran = run(&plugin, config, &records, &[]);
    assert!(ran.success, "{}", ran.stderr);
    let outcomes = ran.outcomes();
    let at = |seq: u32| outcomes[&format!("shardId-000000000000/{seq}")].clone();
    assert_eq!(at(1), [(1, Json::from("ack"))]);
    assert_eq!(
        at(2),
        [
            (
                1,
                serde_json::json!({"retry": "retry wants a second attempt"})
            ),
            (2, Json::from("ack"))
        ]
    );
    assert_eq!(at(3), [(1, serde_json::json!({"reject": "bad is bad"}))]);
    let lines = ran.guest_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("run stream=local shard=shardId-000000000000 key=b seq=2 attempt=2 data=retry window=none")),
        "{}",
        ran.stderr
    );

    let trapped = run(&plugin, config, &[line("d", "trap")], &["--max-time", "2s"]);
    assert_eq!(trapped.code, Some(1));
    assert!(
        trapped
            .stderr
            .contains("not every record settled within --max-time 2s"),
        "{}",
        trapped.stderr
    );
    let calls = trapped.calls();
    assert!(
        calls.len() >= 2,
        "retried on fresh instances: {}",
        calls.len()
    );
    assert!(
        str(&calls[0]["outcome"]["failed"]).starts_with("guest trapped"),
        "{}",
        calls[0]
    );
}

/// Windows in the local loop: records fall in their windows by the
/// `arrival` each line gives, a record of a later window closes the open
/// one, the shard's end closes the last, and the journal shows each close
/// with its state writes; the state after the run is what the closes made.
#[test]
fn windows_close_in_the_local_loop_by_arrival_and_at_the_shard_s_end() {
    let plugin = shardlane_testkit::guests::build().unwrap().windowed;
    let config = "state = {}\nwindow = { size = \"1m\", by = \"key\" }";
    let at = |key: &str, amount: u32, arrival: &str| {
        serde_json::json!({"key": key, "data": {"amount": amount}, "arrival": arrival}).to_string()
    };
    let records = [
        at("a", 1, "2026-12-07T10:00:05Z"),
        at("b", 2, "2026-12-07T10:00:30Z"),
        at("a", 3, "2026-12-07T10:00:59Z"),
        at("a", 4, "2026-12-07T10:01:10Z"),
        // Older than the open window: late, in no window.
        at("b", 100, "2026-12-07T10:00:40Z"),
    ];
    let ran = run(&plugin, config, &records, &["--strict"]);
    assert!(ran.success, "{}", ran.stderr);
    let closes: Vec<(String, u64, Json)> = ran
        .of("close")
        .iter()
        .map(|c| {
            (
                str(&c["keys"][0]).to_owned(),
                c["window"]["start"].as_u64().unwrap(),
                c["outcome"].clone(),
            )
        })
        .collect();
    let minute = 1_796_637_600_000; // 2026-12-07T10:00:00Z
    assert_eq!(
        closes,
        [
            ("a".to_owned(), minute, Json::from("ack")),
            ("b".to_owned(), minute, Json::from("ack")),
            ("a".to_owned(), minute + 60_000, Json::from("ack")),
        ]
    );
    let lines = ran.guest_lines();
    for expected in [
        format!(
            "closed key=a window={minute}..{} sum=4 total=4",
            minute + 60_000
        ),
        format!(
            "closed key=b window={minute}..{} sum=2 total=2",
            minute + 60_000
        ),
        format!(
            "closed key=a window={}..{} sum=4 total=8",
            minute + 60_000,
            minute + 120_000
        ),
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(&expected)),
            "{expected}: {}",
            ran.stderr
        );
    }
    assert!(
        lines.iter().any(|l| l.starts_with("late key=b ")),
        "{}",
        ran.stderr
    );
}

/// Windows with a batch handler: a close flushes the batch collected
/// before it, so every record of a window is handled before its close.
#[test]
fn windows_close_after_the_batch_before_them() {
    let plugin = shardlane_testkit::guests::build().unwrap().windowed_batch;
    let config = "state = {}\nbatch_size = 10\nwindow = { size = \"1m\" }";
    let at = |key: &str, amount: u32, arrival: &str| {
        serde_json::json!({"key": key, "data": {"amount": amount}, "arrival": arrival}).to_string()
    };
    let records = [
        at("a", 1, "2026-12-07T10:00:05Z"),
        at("b", 2, "2026-12-07T10:00:30Z"),
        at("a", 3, "2026-12-07T10:00:59Z"),
        at("a", 4, "2026-12-07T10:01:10Z"),
        at("b", 5, "2026-12-07T10:01:11Z"),
    ];
    let ran = run(&plugin, config, &records, &["--strict"]);
    assert!(ran.success, "{}", ran.stderr);
    let closes: Vec<Vec<&str>> = ran
        .of("close")
        .iter()
        .map(|c| c["keys"].as_array().unwrap().iter().map(str).collect())
        .collect();
    assert_eq!(
        closes,
        [vec!["a", "b"], vec!["a", "b"]],
        "one close per window of the shard"
    );
    let lines = ran.guest_lines();
    for expected in [
        "closed key=a window=1796637600000..1796637660000 sum=4 total=4",
        "closed key=b window=1796637600000..1796637660000 sum=2 total=2",
        "closed key=a window=1796637660000..1796637720000 sum=4 total=8",
        "closed key=b window=1796637660000..1796637720000 sum=5 total=7",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(expected)),
            "{expected}: {}",
            ran.stderr
        );
    }
}
