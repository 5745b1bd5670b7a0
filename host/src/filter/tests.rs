//! The matcher against Lambda's and EventBridge's documented semantics,
//! one case a line: a pattern, a record's data (and key), and whether it
//! is let in.

use super::{Filter, RecordView, criteria_patterns};

/// `pattern` against a record with `data` (bytes as given), key `pk-7`,
/// arriving at 1,545,084,650,987 ms.
fn admits(pattern: &str, data: &str) -> bool {
    let filter = Filter::parse(&[pattern]).unwrap_or_else(|e| panic!("{pattern}: {e}"));
    filter.admits(&RecordView {
        partition_key: "pk-7",
        sequence_number: "49590338271490256608559692538361571095921575989136588898",
        approximate_arrival_ms: 1_545_084_650_987,
        data: data.as_bytes(),
    })
}

/// (pattern, data, let in)
type Case = (&'static str, &'static str, bool);

fn run(cases: &[Case]) {
    let wrong: Vec<String> = cases
        .iter()
        .filter(|(p, d, want)| admits(p, d) != *want)
        .map(|(p, d, want)| format!("{p} on {d}: expected {want}"))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn exact_values_by_json_type() {
    run(&[
        (
            r#"{"data": {"kind": ["order"]}}"#,
            r#"{"kind": "order"}"#,
            true,
        ),
        (
            r#"{"data": {"kind": ["order"]}}"#,
            r#"{"kind": "Order"}"#,
            false,
        ),
        (
            r#"{"data": {"kind": ["order", "refund"]}}"#,
            r#"{"kind": "refund"}"#,
            true,
        ),
        (r#"{"data": {"n": [5]}}"#, r#"{"n": 5}"#, true),
        (r#"{"data": {"n": [5]}}"#, r#"{"n": 5.0}"#, true),
        // Numbers as strings are strings: neither matches the other.
        (r#"{"data": {"n": [5]}}"#, r#"{"n": "5"}"#, false),
        (r#"{"data": {"n": ["5"]}}"#, r#"{"n": 5}"#, false),
        (r#"{"data": {"ok": [true]}}"#, r#"{"ok": true}"#, true),
        (r#"{"data": {"ok": [true]}}"#, r#"{"ok": "true"}"#, false),
        // null matches null, not a missing field; "" matches the empty string.
        (r#"{"data": {"x": [null]}}"#, r#"{"x": null}"#, true),
        (r#"{"data": {"x": [null]}}"#, r#"{}"#, false),
        (r#"{"data": {"x": [""]}}"#, r#"{"x": ""}"#, true),
        (r#"{"data": {"x": [""]}}"#, r#"{"x": null}"#, false),
        // Fields are anded; nested objects descend.
        (
            r#"{"data": {"a": ["1"], "b": {"c": ["2"]}}}"#,
            r#"{"a": "1", "b": {"c": "2"}}"#,
            true,
        ),
        (
            r#"{"data": {"a": ["1"], "b": {"c": ["2"]}}}"#,
            r#"{"a": "1", "b": {"c": "3"}}"#,
            false,
        ),
        (
            r#"{"data": {"a": ["1"]}}"#,
            r#"{"a": "1", "other": 9}"#,
            true,
        ),
    ]);
}

#[test]
fn arrays_match_when_any_element_does() {
    run(&[
        (
            r#"{"data": {"tags": ["red"]}}"#,
            r#"{"tags": ["blue", "red"]}"#,
            true,
        ),
        (
            r#"{"data": {"tags": ["red"]}}"#,
            r#"{"tags": ["blue"]}"#,
            false,
        ),
        (r#"{"data": {"tags": ["red"]}}"#, r#"{"tags": []}"#, false),
        (
            r#"{"data": {"items": {"sku": ["A1"]}}}"#,
            r#"{"items": [{"sku": "B2"}, {"sku": "A1"}]}"#,
            true,
        ),
        (
            r#"{"data": {"items": {"sku": ["A1"]}}}"#,
            r#"{"items": [{"sku": "B2"}]}"#,
            false,
        ),
        (
            r#"{"data": {"n": [{"numeric": [">", 10]}]}}"#,
            r#"{"n": [1, 20]}"#,
            true,
        ),
    ]);
}

#[test]
fn prefix_suffix_and_ignore_case() {
    run(&[
        (
            r#"{"data": {"r": [{"prefix": "us-"}]}}"#,
            r#"{"r": "us-east-1"}"#,
            true,
        ),
        (
            r#"{"data": {"r": [{"prefix": "us-"}]}}"#,
            r#"{"r": "eu-west-1"}"#,
            false,
        ),
        (
            r#"{"data": {"r": [{"prefix": "us-"}]}}"#,
            r#"{"r": "US-east-1"}"#,
            false,
        ),
        (
            r#"{"data": {"r": [{"prefix": {"equals-ignore-case": "us-"}}]}}"#,
            r#"{"r": "US-east-1"}"#,
            true,
        ),
        (
            r#"{"data": {"f": [{"suffix": ".png"}]}}"#,
            r#"{"f": "cat.png"}"#,
            true,
        ),
        (
            r#"{"data": {"f": [{"suffix": ".png"}]}}"#,
            r#"{"f": "cat.PNG"}"#,
            false,
        ),
        (
            r#"{"data": {"f": [{"suffix": {"equals-ignore-case": ".png"}}]}}"#,
            r#"{"f": "cat.PNG"}"#,
            true,
        ),
        (
            r#"{"data": {"n": [{"equals-ignore-case": "alice"}]}}"#,
            r#"{"n": "ALICE"}"#,
            true,
        ),
        (
            r#"{"data": {"n": [{"equals-ignore-case": "alice"}]}}"#,
            r#"{"n": "alicia"}"#,
            false,
        ),
        // String matchers match strings only.
        (
            r#"{"data": {"n": [{"prefix": "1"}]}}"#,
            r#"{"n": 123}"#,
            false,
        ),
    ]);
}

#[test]
fn wildcards() {
    run(&[
        (
            r#"{"data": {"p": [{"wildcard": "*/lib/*"}]}}"#,
            r#"{"p": "/usr/lib/x"}"#,
            true,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "*/lib/*"}]}}"#,
            r#"{"p": "/usr/bin/x"}"#,
            false,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "*.png"}]}}"#,
            r#"{"p": "a.png"}"#,
            true,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "*.png"}]}}"#,
            r#"{"p": "a.png.gz"}"#,
            false,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "a*a"}]}}"#,
            r#"{"p": "a"}"#,
            false,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "a*a"}]}}"#,
            r#"{"p": "aa"}"#,
            true,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "exact"}]}}"#,
            r#"{"p": "exact"}"#,
            true,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "exact"}]}}"#,
            r#"{"p": "exactly"}"#,
            false,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "a\\*b"}]}}"#,
            r#"{"p": "a*b"}"#,
            true,
        ),
        (
            r#"{"data": {"p": [{"wildcard": "a\\*b"}]}}"#,
            r#"{"p": "axxb"}"#,
            false,
        ),
    ]);
}

#[test]
fn numeric_comparisons_and_ranges() {
    run(&[
        (
            r#"{"data": {"t": [{"numeric": ["<", 32]}]}}"#,
            r#"{"t": 31.9}"#,
            true,
        ),
        (
            r#"{"data": {"t": [{"numeric": ["<", 32]}]}}"#,
            r#"{"t": 32}"#,
            false,
        ),
        (
            r#"{"data": {"t": [{"numeric": ["<=", 32]}]}}"#,
            r#"{"t": 32}"#,
            true,
        ),
        (
            r#"{"data": {"t": [{"numeric": ["=", 3.0e2]}]}}"#,
            r#"{"t": 300}"#,
            true,
        ),
        (
            r#"{"data": {"t": [{"numeric": [">", 0, "<=", 5]}]}}"#,
            r#"{"t": 5}"#,
            true,
        ),
        (
            r#"{"data": {"t": [{"numeric": [">", 0, "<=", 5]}]}}"#,
            r#"{"t": 0}"#,
            false,
        ),
        (
            r#"{"data": {"t": [{"numeric": [">=", -1.5]}]}}"#,
            r#"{"t": -1.5}"#,
            true,
        ),
        // Numbers only: a number in a string is not one.
        (
            r#"{"data": {"t": [{"numeric": [">", 0]}]}}"#,
            r#"{"t": "5"}"#,
            false,
        ),
        (
            r#"{"data": {"t": [{"numeric": [">", 0]}]}}"#,
            r#"{}"#,
            false,
        ),
    ]);
}

#[test]
fn exists_and_missing_fields() {
    run(&[
        (
            r#"{"data": {"x": [{"exists": true}]}}"#,
            r#"{"x": 1}"#,
            true,
        ),
        (
            r#"{"data": {"x": [{"exists": true}]}}"#,
            r#"{"x": null}"#,
            true,
        ),
        (
            r#"{"data": {"x": [{"exists": true}]}}"#,
            r#"{"y": 1}"#,
            false,
        ),
        // exists looks at leaves: an object is not one.
        (
            r#"{"data": {"x": [{"exists": true}]}}"#,
            r#"{"x": {"a": 1}}"#,
            false,
        ),
        (
            r#"{"data": {"x": [{"exists": false}]}}"#,
            r#"{"y": 1}"#,
            true,
        ),
        (
            r#"{"data": {"x": [{"exists": false}]}}"#,
            r#"{"x": 1}"#,
            false,
        ),
        // A missing parent: only exists false matches below it.
        (
            r#"{"data": {"a": {"b": [{"exists": false}]}}}"#,
            r#"{}"#,
            true,
        ),
        (r#"{"data": {"a": {"b": ["1"]}}}"#, r#"{}"#, false),
    ]);
}

#[test]
fn anything_but() {
    run(&[
        (
            r#"{"data": {"s": [{"anything-but": "init"}]}}"#,
            r#"{"s": "running"}"#,
            true,
        ),
        (
            r#"{"data": {"s": [{"anything-but": "init"}]}}"#,
            r#"{"s": "init"}"#,
            false,
        ),
        (
            r#"{"data": {"s": [{"anything-but": ["stopped", "overloaded"]}]}}"#,
            r#"{"s": "overloaded"}"#,
            false,
        ),
        (
            r#"{"data": {"s": [{"anything-but": ["stopped", "overloaded"]}]}}"#,
            r#"{"s": "ok"}"#,
            true,
        ),
        (
            r#"{"data": {"n": [{"anything-but": 123}]}}"#,
            r#"{"n": 123}"#,
            false,
        ),
        (
            r#"{"data": {"n": [{"anything-but": 123}]}}"#,
            r#"{"n": 124}"#,
            true,
        ),
        (
            r#"{"data": {"n": [{"anything-but": [1, 2]}]}}"#,
            r#"{"n": 3}"#,
            true,
        ),
        // Never a missing field.
        (
            r#"{"data": {"s": [{"anything-but": "init"}]}}"#,
            r#"{}"#,
            false,
        ),
        (
            r#"{"data": {"r": [{"anything-but": {"prefix": "us-"}}]}}"#,
            r#"{"r": "eu-west-1"}"#,
            true,
        ),
        (
            r#"{"data": {"r": [{"anything-but": {"prefix": "us-"}}]}}"#,
            r#"{"r": "us-east-1"}"#,
            false,
        ),
        (
            r#"{"data": {"f": [{"anything-but": {"suffix": ".png"}}]}}"#,
            r#"{"f": "a.jpg"}"#,
            true,
        ),
        (
            r#"{"data": {"f": [{"anything-but": {"suffix": ".png"}}]}}"#,
            r#"{"f": "a.png"}"#,
            false,
        ),
        (
            r#"{"data": {"s": [{"anything-but": {"equals-ignore-case": ["INIT", "Stop"]}}]}}"#,
            r#"{"s": "init"}"#,
            false,
        ),
        (
            r#"{"data": {"s": [{"anything-but": {"equals-ignore-case": "init"}}]}}"#,
            r#"{"s": "run"}"#,
            true,
        ),
        (
            r#"{"data": {"p": [{"anything-but": {"wildcard": "*/lib/*"}}]}}"#,
            r#"{"p": "/usr/lib/x"}"#,
            false,
        ),
        (
            r#"{"data": {"p": [{"anything-but": {"wildcard": "*/lib/*"}}]}}"#,
            r#"{"p": "/usr/bin/x"}"#,
            true,
        ),
        // A number is not any of the strings excluded.
        (
            r#"{"data": {"s": [{"anything-but": "init"}]}}"#,
            r#"{"s": 5}"#,
            true,
        ),
    ]);
}

#[test]
fn or_at_any_level() {
    let p = r#"{"data": {"$or": [{"a": ["1"]}, {"b": [{"numeric": [">", 5]}]}]}}"#;
    run(&[
        (p, r#"{"a": "1"}"#, true),
        (p, r#"{"b": 6}"#, true),
        (p, r#"{"a": "2", "b": 1}"#, false),
        (
            r#"{"$or": [{"partitionKey": ["pk-7"]}, {"data": {"a": ["1"]}}]}"#,
            r#"{"a": "2"}"#,
            true,
        ),
        (
            r#"{"$or": [{"partitionKey": ["pk-8"]}, {"data": {"a": ["1"]}}]}"#,
            r#"{"a": "1"}"#,
            true,
        ),
        (
            r#"{"$or": [{"partitionKey": ["pk-8"]}, {"data": {"a": ["1"]}}]}"#,
            r#"{"a": "2"}"#,
            false,
        ),
    ]);
}

#[test]
fn metadata_by_lambdas_names() {
    run(&[
        (r#"{"partitionKey": ["pk-7"]}"#, "not json at all", true),
        (r#"{"partitionKey": [{"prefix": "pk-"}]}"#, "{}", true),
        (r#"{"partitionKey": ["pk-8"]}"#, "{}", false),
        (
            r#"{"approximateArrivalTimestamp": [{"numeric": [">", 1545084650.9]}]}"#,
            "{}",
            true,
        ),
        (
            r#"{"approximateArrivalTimestamp": [{"numeric": [">", 1545084651]}]}"#,
            "{}",
            false,
        ),
        (r#"{"kinesisSchemaVersion": ["1.0"]}"#, "{}", true),
        (r#"{"sequenceNumber": [{"prefix": "4959"}]}"#, "{}", true),
        (r#"{"eventSource": [{"exists": false}]}"#, "{}", true),
    ]);
}

#[test]
fn data_that_is_not_json_fails_every_data_rule() {
    run(&[
        (
            r#"{"data": {"a": [{"exists": false}]}}"#,
            "plain text",
            false,
        ),
        (r#"{"data": ["x"]}"#, "plain text", false),
        (r#"{"data": ["x"]}"#, r#""x""#, true),
        (r#"{"data": [{"numeric": [">", 1]}]}"#, "2", true),
    ]);
}

#[test]
fn any_pattern_of_several_lets_a_record_in_and_none_lets_all() {
    let filter =
        Filter::parse(&[r#"{"data": {"a": ["1"]}}"#, r#"{"data": {"a": ["2"]}}"#]).unwrap();
    let view = |data: &'static str| RecordView {
        partition_key: "k",
        sequence_number: "1",
        approximate_arrival_ms: 0,
        data: data.as_bytes(),
    };
    assert!(filter.admits(&view(r#"{"a": "2"}"#)));
    assert!(!filter.admits(&view(r#"{"a": "3"}"#)));
    assert!(Filter::parse::<&str>(&[]).unwrap().admits(&view("x")));
}

/// Each `patterns` is refused with an error that starts so, on one line.
fn refused(cases: &[(&[&str], &str)]) {
    for (patterns, wanted) in cases {
        let error = Filter::parse(patterns).expect_err(wanted).to_string();
        assert!(error.starts_with(wanted), "{patterns:?}: {error}");
        assert!(!error.contains('\n'), "one line: {error}");
    }
}

#[test]
fn malformed_patterns_are_refused_naming_the_pattern_and_the_fault() {
    refused(&[
        (&["{"], "pattern 1: not JSON"),
        (
            &[r#"{"a": ["1"]}"#, "[1]"],
            "pattern 2: the pattern: must be a JSON object",
        ),
        (
            &["{}"],
            "pattern 1: the pattern: an empty object matches nothing",
        ),
        (
            &[r#"{"data": {"a": "x"}}"#],
            "pattern 1: data.a: must be a list of matchers",
        ),
        (
            &[r#"{"data": {"a": []}}"#],
            "pattern 1: data.a: an empty list matches nothing",
        ),
        (
            &[r#"{"$or": [{"a": ["1"]}]}"#],
            "pattern 1: the pattern: \"$or\" takes a list of two or more patterns",
        ),
        (&["{\"a\": [1]}"; 6], "6 patterns: at most 5"),
    ]);
    let long = format!(r#"{{"data": {{"a": ["{}"]}}}}"#, "x".repeat(5000));
    assert!(
        Filter::parse(&[long])
            .unwrap_err()
            .to_string()
            .contains("at most 4096")
    );
    let deep = format!("{}[1]{}", r#"{"a": "#.repeat(40), "}".repeat(40));
    assert!(
        Filter::parse(&[deep])
            .unwrap_err()
            .to_string()
            .contains("nested deeper than 32")
    );
}

#[test]
fn misused_operators_are_refused_naming_the_field_and_the_fault() {
    refused(&[
        (
            &[r#"{"data": {"a": [{"contains": "x"}]}}"#],
            "pattern 1: data.a: unknown operator \"contains\"",
        ),
        (
            &[r#"{"data": {"a": [{"prefix": 1}]}}"#],
            "pattern 1: data.a: \"prefix\" takes a string",
        ),
        (
            &[r#"{"data": {"a": [{"numeric": ["<", "5"]}]}}"#],
            "pattern 1: data.a: numeric \"5\": not a number",
        ),
        (
            &[r#"{"data": {"a": [{"numeric": ["<", 5, ">", 1]}]}}"#],
            "pattern 1: data.a: numeric a range is a lower bound",
        ),
        (
            &[r#"{"data": {"a": [{"numeric": [">", 9, "<", 1]}]}}"#],
            "pattern 1: data.a: numeric a range is a lower bound",
        ),
        (
            &[r#"{"data": {"a": [{"numeric": ["~", 5]}]}}"#],
            "pattern 1: data.a: numeric \"~\": not one of",
        ),
        (
            &[r#"{"data": {"a": [{"exists": "yes"}]}}"#],
            "pattern 1: data.a: \"exists\" takes true or false",
        ),
        (
            &[r#"{"data": {"a": [{"wildcard": "a**b"}]}}"#],
            "pattern 1: data.a: wildcard \"a**b\": consecutive `*`",
        ),
        (
            &[r#"{"data": {"a": [{"anything-but": ["x", 1]}]}}"#],
            "pattern 1: data.a: anything-but takes a list of strings or a list of numbers",
        ),
        (
            &[r#"{"data": {"a": [{"anything-but": {"numeric": [">", 1]}}]}}"#],
            "pattern 1: data.a: anything-but cannot take \"numeric\"",
        ),
        (
            &[r#"{"data": {"a": [{"prefix": "x", "suffix": "y"}]}}"#],
            "pattern 1: data.a: a matcher object has exactly one operator",
        ),
    ]);
}

/// Catches: one filter written two ways known as two versions (a deploy
/// of the same patterns would then count as a change), two filters known
/// as one, or a text that does not compile back to the same filter.
#[test]
fn a_filter_is_known_by_its_canonical_text() {
    let one = Filter::parse(&[r#"{"data": {"b": [1], "a": ["x"]}}"#]).unwrap();
    let same = Filter::parse(&["{ \"data\" : {\"a\":[\"x\"],\n \"b\":[1]} }"]).unwrap();
    let other = Filter::parse(&[r#"{"data": {"a": ["x"], "b": [2]}}"#]).unwrap();
    assert_eq!(one.digest(), same.digest());
    assert_eq!(one.text().patterns, [r#"{"data":{"a":["x"],"b":[1]}}"#]);
    assert_ne!(one.digest(), other.digest());
    assert_eq!(one.text().compile().unwrap(), one);
    // Two patterns in another order are another text (the same records
    // pass, but the list is what was written).
    let two = Filter::parse(&[r#"{"a": [1]}"#, r#"{"b": [1]}"#]).unwrap();
    let swapped = Filter::parse(&[r#"{"b": [1]}"#, r#"{"a": [1]}"#]).unwrap();
    assert_ne!(two.digest(), swapped.digest());
}

/// Catches: a FilterCriteria file or body read otherwise than `aws lambda`
/// writes it, or a wrong shape accepted.
#[test]
fn criteria_are_read_in_lambdas_shape_or_as_a_list() {
    let criteria = br#"{"Filters": [{"Pattern": "{\"a\": [1]}"}, {"Pattern": "{\"b\": [2]}"}]}"#;
    assert_eq!(
        criteria_patterns(criteria).unwrap(),
        [r#"{"a": [1]}"#, r#"{"b": [2]}"#]
    );
    assert_eq!(
        criteria_patterns(br#"[{"a": [1]}, "{\"b\": [2]}"]"#).unwrap(),
        [r#"{"a":[1]}"#, r#"{"b": [2]}"#]
    );
    assert!(criteria_patterns(b"[]").unwrap().is_empty());
    for bad in [
        &b"{"[..],
        b"{\"Filters\": 1}",
        b"[1]",
        br#"{"Filters": [{}]}"#,
        b"7",
    ] {
        assert!(
            criteria_patterns(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}
