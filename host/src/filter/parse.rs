//! Patterns' text into their tree ([`super::Object`]), each rule checked
//! with one line naming the field and the fault.

use serde_json::Value;

use super::{AnythingBut, Case, Field, MAX_DEPTH, Matcher, Object, Op, Wildcard};

/// The pattern (or the level of one) at `at`, `depth` levels down.
pub(super) fn object(value: &Value, at: &str, depth: usize) -> Result<Object, String> {
    let Value::Object(map) = value else {
        return Err(format!("{}: must be a JSON object", place(at)));
    };
    if depth > MAX_DEPTH {
        return Err(format!("{}: nested deeper than {MAX_DEPTH}", place(at)));
    }
    if map.is_empty() {
        return Err(format!("{}: an empty object matches nothing", place(at)));
    }
    let mut out = Object {
        fields: Vec::new(),
        ors: Vec::new(),
    };
    for (name, sub) in map {
        let path = if at.is_empty() {
            name.clone()
        } else {
            format!("{at}.{name}")
        };
        if name == "$or" {
            out.ors.push(alternatives(sub, at, depth)?);
            continue;
        }
        let field = match sub {
            Value::Object(_) => Field::Nested(object(sub, &path, depth + 1)?),
            Value::Array(items) if !items.is_empty() => Field::Leaf(
                items
                    .iter()
                    .map(|m| matcher(m, &path))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Array(_) => return Err(format!("{path}: an empty list matches nothing")),
            _ => {
                return Err(format!(
                    "{path}: must be a list of matchers (e.g. [\"value\"]) or an object"
                ));
            }
        };
        out.fields.push((name.clone(), field));
    }
    Ok(out)
}

fn alternatives(value: &Value, at: &str, depth: usize) -> Result<Vec<Object>, String> {
    match value {
        Value::Array(items) if items.len() >= 2 => items
            .iter()
            .map(|item| object(item, at, depth + 1))
            .collect(),
        _ => Err(format!(
            "{}: \"$or\" takes a list of two or more patterns",
            place(at)
        )),
    }
}

fn place(at: &str) -> String {
    if at.is_empty() {
        "the pattern".to_owned()
    } else {
        at.to_owned()
    }
}

fn matcher(value: &Value, path: &str) -> Result<Matcher, String> {
    let Value::Object(map) = value else {
        return match value {
            Value::Array(_) => Err(format!("{path}: a list inside a list of matchers")),
            v => Ok(Matcher::Exact(v.clone())),
        };
    };
    let mut entries = map.iter();
    let (Some((op, arg)), None) = (entries.next(), entries.next()) else {
        return Err(format!("{path}: a matcher object has exactly one operator"));
    };
    let bad = |what: &str| format!("{path}: \"{op}\" takes {what}");
    Ok(match op.as_str() {
        "prefix" => string_or_ignore_case(arg)
            .map(|(s, c)| Matcher::Prefix(s, c))
            .ok_or_else(|| bad("a string or {\"equals-ignore-case\": string}"))?,
        "suffix" => string_or_ignore_case(arg)
            .map(|(s, c)| Matcher::Suffix(s, c))
            .ok_or_else(|| bad("a string or {\"equals-ignore-case\": string}"))?,
        "equals-ignore-case" => {
            Matcher::EqualsIgnoreCase(arg.as_str().ok_or_else(|| bad("a string"))?.to_lowercase())
        }
        "wildcard" => Matcher::Wildcard(
            Wildcard::parse(arg.as_str().ok_or_else(|| bad("a string"))?)
                .map_err(|e| format!("{path}: {e}"))?,
        ),
        "numeric" => Matcher::Numeric(numeric(arg).map_err(|e| format!("{path}: numeric {e}"))?),
        "exists" => Matcher::Exists(arg.as_bool().ok_or_else(|| bad("true or false"))?),
        "anything-but" => Matcher::AnythingBut(
            anything_but(arg).map_err(|e| format!("{path}: anything-but {e}"))?,
        ),
        other => {
            return Err(format!(
                "{path}: unknown operator \"{other}\" (prefix, suffix, equals-ignore-case, wildcard, numeric, exists, anything-but)"
            ));
        }
    })
}

fn string_or_ignore_case(arg: &Value) -> Option<(String, Case)> {
    match arg {
        Value::String(s) => Some((s.clone(), Case::Exact)),
        Value::Object(m) if m.len() == 1 => m
            .get("equals-ignore-case")
            .and_then(Value::as_str)
            .map(|s| (s.to_lowercase(), Case::Ignore)),
        _ => None,
    }
}

fn numeric(arg: &Value) -> Result<Vec<(Op, f64)>, String> {
    let items = arg
        .as_array()
        .ok_or("takes a list such as [\">\", 0, \"<=\", 5]")?;
    if items.is_empty() || items.len() > 4 || items.len() % 2 != 0 {
        return Err(
            "takes one or two comparisons: [op, number] or [op, number, op, number]".into(),
        );
    }
    let mut bounds = Vec::new();
    for pair in items.chunks(2) {
        let op = match pair[0].as_str() {
            Some("<") => Op::Lt,
            Some("<=") => Op::Le,
            Some("=") => Op::Eq,
            Some(">") => Op::Gt,
            Some(">=") => Op::Ge,
            _ => return Err(format!("{}: not one of <, <=, =, >, >=", pair[0])),
        };
        let n = pair[1]
            .as_f64()
            .ok_or_else(|| format!("{}: not a number", pair[1]))?;
        bounds.push((op, n));
    }
    if let [(lo, a), (hi, b)] = bounds.as_slice() {
        let lower = matches!(lo, Op::Gt | Op::Ge);
        let upper = matches!(hi, Op::Lt | Op::Le);
        if !lower || !upper || a > b {
            return Err(
                "a range is a lower bound (> or >=) then a higher upper bound (< or <=)".into(),
            );
        }
    }
    Ok(bounds)
}

fn anything_but(arg: &Value) -> Result<AnythingBut, String> {
    let strings = |v: &Value| -> Option<Vec<String>> {
        match v {
            Value::String(s) => Some(vec![s.clone()]),
            Value::Array(items) if !items.is_empty() => items
                .iter()
                .map(|i| i.as_str().map(str::to_owned))
                .collect(),
            _ => None,
        }
    };
    match arg {
        Value::String(_) | Value::Number(_) => Ok(AnythingBut::Values(vec![arg.clone()])),
        Value::Array(items) if !items.is_empty() => {
            let all_strings = items.iter().all(Value::is_string);
            let all_numbers = items.iter().all(Value::is_number);
            if all_strings || all_numbers {
                Ok(AnythingBut::Values(items.clone()))
            } else {
                Err("takes a list of strings or a list of numbers".into())
            }
        }
        Value::Object(m) if m.len() == 1 => {
            let (op, v) = m.iter().next().unwrap_or_else(|| unreachable!());
            match (op.as_str(), v) {
                ("prefix", Value::String(s)) => Ok(AnythingBut::Prefix(s.clone())),
                ("suffix", Value::String(s)) => Ok(AnythingBut::Suffix(s.clone())),
                ("equals-ignore-case", v) => strings(v)
                    .map(|s| AnythingBut::IgnoreCase(s.iter().map(|s| s.to_lowercase()).collect()))
                    .ok_or_else(|| "equals-ignore-case takes a string or a list of strings".into()),
                ("wildcard", v) => strings(v)
                    .ok_or_else(|| "wildcard takes a string or a list of strings".to_owned())?
                    .iter()
                    .map(|s| Wildcard::parse(s))
                    .collect::<Result<_, _>>()
                    .map(AnythingBut::Wildcard),
                (op, _) => Err(format!(
                    "cannot take \"{op}\" (prefix, suffix, equals-ignore-case, wildcard)"
                )),
            }
        }
        _ => Err(
            "takes a value, a list of values, or {prefix|suffix|equals-ignore-case|wildcard: …}"
                .into(),
        ),
    }
}
