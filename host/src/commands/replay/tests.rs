//! The replay command's pure parts: parsing and checking a range, names,
//! the recorded range.

use super::*;

const NOW: u64 = 1_765_015_200_000; // 2025-12-06T10:00:00Z

fn shards(n: u32) -> Vec<ShardInfo> {
    (0..n)
        .map(|i| ShardInfo {
            id: ShardId::new(format!("shardId-{i:012}")),
            parent: None,
            adjacent_parent: None,
            closed: false,
            hash_keys: None,
        })
        .collect()
}

fn check(from: &str, to: &str) -> anyhow::Result<()> {
    let from = parse_edge("--from", from, NOW)?;
    let to = parse_edge("--to", to, NOW)?;
    check_range(
        &from,
        &to,
        NOW,
        Duration::from_secs(24 * 3_600),
        &shards(2),
        &StreamName::new("orders"),
    )
}

fn error(from: &str, to: &str) -> String {
    check(from, to).unwrap_err().to_string()
}

#[test]
fn times_are_rfc_3339_relative_or_now() {
    assert_eq!(parse_edge("--to", "now", NOW).unwrap(), Edge::Time(NOW));
    assert_eq!(
        parse_edge("--from", "-2h", NOW).unwrap(),
        Edge::Time(NOW - 7_200_000)
    );
    assert_eq!(
        parse_edge("--from", "2025-12-06T09:00:00.250Z", NOW).unwrap(),
        Edge::Time(NOW - 3_600_000 + 250)
    );
    let e = parse_edge("--from", "yesterday", NOW)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--from \"yesterday\": not a time"), "{e}");
}

#[test]
fn sequence_numbers_are_named_per_shard() {
    let seq = "49590338271490256608559692538361571095921575989136588898";
    let edge = parse_edge("--from", &format!("shardId-000000000001={seq}"), NOW).unwrap();
    let Edge::Sequences(map) = edge else { panic!() };
    assert_eq!(map[&ShardId::new("shardId-000000000001")].as_str(), seq);
    let e = parse_edge("--from", "shardId-000000000001=abc", NOW)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--from \"shardId-000000000001=abc\""), "{e}");
    let twice = format!("shardId-000000000001={seq},shardId-000000000001={seq}");
    assert_eq!(
        parse_edge("--from", &twice, NOW).unwrap_err().to_string(),
        "--from names shard shardId-000000000001 twice"
    );
}

#[test]
fn bad_ranges_are_one_line_each() {
    assert!(check("-2h", "-1h").is_ok());
    assert_eq!(
        error("-1h", "-2h"),
        "--to 2025-12-06T08:00:00.000Z is before --from 2025-12-06T09:00:00.000Z"
    );
    assert_eq!(
        error("-25h", "now"),
        "--from 2025-12-05T09:00:00.000Z: older than stream \"orders\" keeps records (24 h): they are gone"
    );
    assert_eq!(
        error("-1h", "2025-12-06T11:00:00Z"),
        "--to 2025-12-06T11:00:00.000Z: in the future; a replay covers records already in the stream"
    );
    let seq = "49590338271490256608559692538361571095921575989136588898";
    let lower = "49590338271490256608559692538361571095921575989136588890";
    assert_eq!(
        error(&format!("shardId-000000000007={seq}"), "now"),
        "--from names shard shardId-000000000007, which stream \"orders\" does not have"
    );
    assert_eq!(
        error(
            &format!("shardId-000000000001={seq}"),
            &format!("shardId-000000000001={lower}")
        ),
        format!("--to {lower} of shard shardId-000000000001 is before its --from {seq}")
    );
    assert_eq!(
        error(
            &format!("shardId-000000000001={seq}"),
            &format!("shardId-000000000000={seq}")
        ),
        "--to names shard shardId-000000000000, which --from does not"
    );
    assert!(
        check(
            &format!("shardId-000000000001={lower}"),
            &format!("shardId-000000000001={seq}")
        )
        .is_ok()
    );
}

#[test]
fn names_are_checked_and_made_from_the_range() {
    assert!(check_name("fix-1.b_2").is_ok());
    assert_eq!(
        check_name("a b").unwrap_err().to_string(),
        "--name \"a b\": use 1 to 64 letters, digits, '.', '_' or '-'"
    );
    assert!(check_name(&"x".repeat(65)).is_err());
    let digest = PluginDigest::of(b"v1");
    let a = default_name(&Edge::Time(1), &Edge::Time(2), &digest, false);
    assert_eq!(
        a,
        default_name(&Edge::Time(1), &Edge::Time(2), &digest, false)
    );
    assert_ne!(
        a,
        default_name(&Edge::Time(1), &Edge::Time(3), &digest, false)
    );
    assert_ne!(
        a,
        default_name(&Edge::Time(1), &Edge::Time(2), &digest, true)
    );
    assert!(a.starts_with("r-") && a.len() == 10, "{a}");
}

#[test]
fn a_recorded_range_reads_back_as_it_was() {
    let seqs = Edge::Sequences(BTreeMap::from([(
        ShardId::new("shardId-000000000001"),
        SequenceNumber::parse("49590338271490256608559692538361571095921575989136588898").unwrap(),
    )]));
    for edge in [Edge::Time(42), seqs] {
        let json = serde_json::to_string(&RecordedEdge::of(&edge)).unwrap();
        let back: RecordedEdge = serde_json::from_str(&json).unwrap();
        assert_eq!(back.edge().unwrap(), edge);
    }
}
