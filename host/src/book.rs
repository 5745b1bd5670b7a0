//! The book's reference pages (`docs/src/reference/`) checked against the
//! code, so they cannot drift from it:
//!
//! - `cli.md` is generated from the `clap` command tree: the test renders
//!   every command's `--help` and compares; `SHARDLANE_BLESS=1 cargo test
//!   -p shardlane book::` writes it anew after a change to the commands.
//! - `config.md`'s annotated TOML names exactly the keys the parser takes:
//!   its lines (commented or not) are read as TOML and their key paths
//!   compared both ways with the config's JSON Schema, which is derived
//!   from the parser's own types ([`crate::Config::schema`]); every file
//!   in `examples/` validates against that schema.
//! - `metrics.md` lists exactly the metrics the code registers (every
//!   `"shardlane_…"` name given to a counter, gauge or histogram with its
//!   help, found in the sources).
//! - `architecture.md` shows lib.rs's diagram and floors, word for word.
//!
//! Test-only, like `layers`: on no floor.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory as _;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the host crate sits in the workspace")
        .to_owned()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Compares `page` with `wanted`, or writes it when `SHARDLANE_BLESS` is set.
fn check_generated(page: &Path, wanted: &str) {
    if std::env::var_os("SHARDLANE_BLESS").is_some() {
        std::fs::write(page, wanted).unwrap();
        return;
    }
    let have = read(page);
    if have != wanted {
        let first = have
            .lines()
            .zip(wanted.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(have.lines().count().min(wanted.lines().count()));
        panic!(
            "{} differs from what the code generates (first at line {}); \
             run `SHARDLANE_BLESS=1 cargo test -p shardlane book::` and review the diff",
            page.display(),
            first + 1
        );
    }
}

// ---- the command line ----

/// The CLI reference: every command's long help, depth first.
fn cli_reference() -> String {
    let mut cli = crate::Cli::command();
    cli.build();
    let mut out = String::from(
        "# Command line\n\n\
         Every command's `--help`, as the binary prints it (`shardlane man` has \
         the same as a manual page; `shardlane completions <shell>` completes \
         them). Generated from the code: the suite fails when this page and \
         the commands differ.\n",
    );
    render_command(&mut cli, 2, &mut out);
    out
}

fn render_command(cmd: &mut clap::Command, depth: usize, out: &mut String) {
    let name = cmd
        .get_bin_name()
        .map_or_else(|| cmd.get_name().to_owned(), str::to_owned);
    let help = cmd.render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    let level = "#".repeat(depth.min(4));
    out.push_str(&format!(
        "\n{level} `{name}`\n\n```text\n{}\n```\n",
        help.join("\n").trim_end()
    ));
    for sub in cmd.get_subcommands_mut() {
        if sub.get_name() != "help" {
            render_command(sub, depth + 1, out);
        }
    }
}

#[test]
fn the_cli_reference_is_what_the_commands_print() {
    let page = root().join("docs/src/reference/cli.md");
    check_generated(&page, &cli_reference());
}

// ---- the config ----

/// Every key path the schema allows (`lease.table`,
/// `subscription.canary.rollback_on.failure_rate`), and the paths under
/// which any key goes (free-form tables such as `subscription.config`).
fn schema_paths(schema: &serde_json::Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut paths = BTreeSet::new();
    let mut free = BTreeSet::new();
    walk(schema, schema, "", &mut paths, &mut free);
    (paths, free)
}

fn walk(
    root: &serde_json::Value,
    node: &serde_json::Value,
    at: &str,
    paths: &mut BTreeSet<String>,
    free: &mut BTreeSet<String>,
) {
    let node = resolve(root, node);
    for key in ["anyOf", "oneOf", "allOf"] {
        for branch in node
            .get(key)
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            walk(root, branch, at, paths, free);
        }
    }
    if let Some(items) = node.get("items") {
        walk(root, items, at, paths, free);
    }
    if let Some(props) = node.get("properties").and_then(|p| p.as_object()) {
        for (name, sub) in props {
            let path = if at.is_empty() {
                name.clone()
            } else {
                format!("{at}.{name}")
            };
            paths.insert(path.clone());
            walk(root, sub, &path, paths, free);
        }
    } else if is_object(node)
        && node.get("additionalProperties") != Some(&serde_json::Value::Bool(false))
    {
        free.insert(at.to_owned());
    }
}

/// Whether a schema node's type is (or may be) an object.
fn is_object(node: &serde_json::Value) -> bool {
    match node.get("type") {
        Some(serde_json::Value::String(t)) => t == "object",
        Some(serde_json::Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => false,
    }
}

fn resolve<'a>(root: &'a serde_json::Value, node: &'a serde_json::Value) -> &'a serde_json::Value {
    match node.get("$ref").and_then(|r| r.as_str()) {
        Some(reference) => {
            let pointer = reference.trim_start_matches('#');
            resolve(
                root,
                root.pointer(pointer)
                    .unwrap_or_else(|| panic!("{reference}")),
            )
        }
        None => node,
    }
}

/// The key paths the config reference's TOML block names: each line that
/// is a table header or a `key = value` (with or without a leading `# `)
/// is read as TOML; other comment lines are prose.
fn documented_paths(page: &str) -> BTreeSet<String> {
    let block = page
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the config reference has a ```toml block");
    let mut table = String::new();
    let mut paths = BTreeSet::new();
    for line in block.lines() {
        let line = line.strip_prefix("# ").unwrap_or(line);
        let key = line.trim_start_matches(|c: char| c.is_ascii_lowercase() || c == '_');
        let is_key = key.len() < line.len() && key.trim_start().starts_with('=');
        if !is_key && !line.starts_with('[') {
            continue; // prose
        }
        if let Some(header) = line.strip_prefix('[') {
            table = header
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap()
                .to_owned();
            paths.insert(table.clone());
            continue;
        }
        let value: toml::Table = line
            .parse()
            .unwrap_or_else(|e| panic!("config reference line `{line}` is not TOML: {e}"));
        keys(&toml::Value::Table(value), &table, &mut paths);
    }
    paths
}

fn keys(value: &toml::Value, at: &str, paths: &mut BTreeSet<String>) {
    if let toml::Value::Table(table) = value {
        for (name, sub) in table {
            let path = if at.is_empty() {
                name.clone()
            } else {
                format!("{at}.{name}")
            };
            keys(sub, &path, paths);
            paths.insert(path);
        }
    }
}

#[test]
fn the_config_reference_names_every_key_the_parser_takes_and_no_other() {
    let (schema, free) = schema_paths(&crate::Config::schema());
    let documented = documented_paths(&read(&root().join("docs/src/reference/config.md")));
    let under_free = |p: &String| free.iter().any(|f| p.starts_with(&format!("{f}.")));
    let undocumented: Vec<_> = schema.difference(&documented).collect();
    let unknown: Vec<_> = documented
        .difference(&schema)
        .filter(|p| !under_free(p))
        .collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "config reference: keys the parser takes but the page does not name: {undocumented:?}; \
         keys the page names but the parser refuses: {unknown:?}"
    );
    // The check itself sees both kinds of drift.
    assert!(schema.contains("subscription.canary.rollback_on.min_records"));
    assert!(free.contains("subscription.config"));
    let drifted = documented_paths("```toml\n[lease]\n# tabel = \"x\"\n```\n");
    assert!(drifted.difference(&schema).any(|p| p == "lease.tabel"));
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&crate::Config::schema()).expect("the config schema is a schema")
}

/// The errors of `text` (TOML) against the schema.
fn schema_errors(validator: &jsonschema::Validator, text: &str) -> Vec<String> {
    let table: toml::Table = text.parse().unwrap();
    let json = serde_json::to_value(table).unwrap();
    validator
        .iter_errors(&json)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[test]
fn every_example_config_fits_the_schema_and_a_wrong_one_does_not() {
    let validator = validator();
    let mut seen = 0;
    for entry in std::fs::read_dir(root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let errors = schema_errors(&validator, &read(&path));
            assert!(errors.is_empty(), "{}: {errors:?}", path.display());
            seen += 1;
        }
    }
    assert!(
        seen >= 4,
        "examples/ holds the example configs ({seen} found)"
    );
    let wrong = "[lease]\nstore = \"sqlite\"\n\n[[subscription]]\nname = \"a\"\nstream = \"s\"\n\
                 plugin = \"p.wasm\"\nworkers = \"four\"\npoll_idel = \"1s\"\n";
    let errors = schema_errors(&validator, wrong);
    assert_eq!(errors.len(), 3, "{errors:?}");
}

// ---- metrics ----

/// The metric names the code registers: a `"shardlane_…"` literal followed
/// by its help text, in a source file that is not a test.
fn registered_metrics() -> BTreeSet<String> {
    let mut files = Vec::new();
    crate::layers::sources(&root().join("host/src"), &mut files);
    let mut names = BTreeSet::new();
    for file in files.iter().filter(|f| !f.ends_with("book.rs")) {
        // Without comments and `#[cfg(test)]` items, as the layer check reads it.
        let text = crate::layers::code(&read(file));
        for (i, _) in text.match_indices("\"shardlane_") {
            let rest = &text[i + 1..];
            let end = rest.find('"').unwrap();
            let after = rest[end + 1..].trim_start();
            if after.starts_with(",") && after[1..].trim_start().starts_with('"') {
                names.insert(rest[..end].to_owned());
            }
        }
    }
    names
}

#[test]
fn the_metrics_reference_lists_every_metric_the_code_registers() {
    let registered = registered_metrics();
    assert!(registered.contains("shardlane_records_total"));
    assert!(registered.contains("shardlane_checkpoint_age_seconds"));
    let page = read(&root().join("docs/src/reference/metrics.md"));
    let listed: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    let unlisted: Vec<_> = registered.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&registered).collect();
    assert!(
        unlisted.is_empty() && unknown.is_empty(),
        "metrics reference: registered but not listed: {unlisted:?}; listed but not registered: {unknown:?}"
    );
}

// ---- the architecture ----

/// lib.rs's `# Layout` diagram and `# Layers` floors, as plain text.
fn lib_rs_figures() -> (String, String) {
    let lib = read(&root().join("host/src/lib.rs"));
    let docs: Vec<&str> = lib
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let diagram = docs
        .split(|l| l.starts_with("```"))
        .nth(1)
        .expect("lib.rs's Layout has a diagram")
        .join("\n");
    let floors = docs
        .iter()
        .filter(|l| {
            l.split_once(". ")
                .is_some_and(|(n, _)| n.parse::<u32>().is_ok())
        })
        .copied()
        .collect::<Vec<_>>()
        .join("\n");
    (diagram, floors)
}

#[test]
fn the_architecture_page_shows_lib_rs_diagram_and_floors() {
    let (diagram, floors) = lib_rs_figures();
    assert!(floors.starts_with("1. ground values"), "{floors}");
    let page = read(&root().join("docs/src/reference/architecture.md"));
    assert!(
        page.contains(&diagram),
        "architecture.md does not show lib.rs's diagram as it is:\n{diagram}"
    );
    assert!(
        page.contains(&floors),
        "architecture.md does not list lib.rs's floors as they are:\n{floors}"
    );
}
