//! Environment overrides of config keys: any key can be set (or replaced)
//! by a variable `SHARDLANE__<PATH>`, the key's path upper-cased with `__`
//! between its parts and subscriptions by index — `SHARDLANE__ADMIN__LISTEN`,
//! `SHARDLANE__LEASE__STORE`, `SHARDLANE__SUBSCRIPTION__0__POLL_IDLE`. The
//! value is read as a TOML value when it is one (`4`, `true`,
//! `["orders-dlq"]`, `"quoted text"`) and as a string otherwise
//! (`0.0.0.0:9090`, `250ms`). [`super::Config::parse_with_overrides`]
//! applies them to the file's contents before anything is checked, so they
//! meet the same checks; an override that names a subscription the file
//! does not have is an error. (This is hand-written because it is ~60 lines
//! over the `toml` crate's value tree; the layered-config crates bring
//! their own key and merge rules.)

/// Environment variables with this prefix override config keys.
pub(crate) const OVERRIDE_PREFIX: &str = "SHARDLANE__";

/// Sets the key `name` (`SHARDLANE__A__B__0__C`) names to `value` in
/// `table`, creating tables on the way; subscriptions by index.
pub(super) fn apply_override(
    table: &mut toml::Table,
    name: &str,
    value: &str,
) -> Result<(), String> {
    let path: Vec<String> = name[OVERRIDE_PREFIX.len()..]
        .split("__")
        .map(str::to_ascii_lowercase)
        .collect();
    if path.iter().any(String::is_empty) {
        return Err(
            "names no key: write SHARDLANE__SECTION__KEY, e.g. SHARDLANE__ADMIN__LISTEN".into(),
        );
    }
    // One TOML value, or else the text itself; a TOML date-time stays text
    // (no key takes one: `at_timestamp` is a string), and so does anything
    // that parses into more than the one key.
    let value = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .filter(|t| t.len() == 1)
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !v.is_datetime())
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let (last, parents) = path.split_last().expect("not empty");
    let mut here = table;
    let mut parts = parents.iter();
    while let Some(part) = parts.next() {
        let entry = here
            .entry(part.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = match entry {
            toml::Value::Table(t) => t,
            toml::Value::Array(items) => {
                let Some(index) = parts.next() else {
                    return Err(format!(
                        "`{part}` is a list: name an index, e.g. {OVERRIDE_PREFIX}{}__0__…",
                        part.to_ascii_uppercase()
                    ));
                };
                let i: usize = index
                    .parse()
                    .map_err(|_| format!("`{part}` is a list: {index:?} is not an index"))?;
                let len = items.len();
                match items.get_mut(i) {
                    Some(toml::Value::Table(t)) => t,
                    _ => {
                        return Err(format!("the config file has no {part}[{i}] (it has {len})"));
                    }
                }
            }
            _ => return Err(format!("`{part}` is not a table")),
        };
    }
    here.insert(last.clone(), value);
    Ok(())
}
