//! Lane routing for `by_key`: which lane a partition key goes to.
//!
//! `lane = fnv1a_64(partition key as UTF-8 bytes) mod lanes`, with the
//! standard 64-bit FNV-1a parameters (offset basis `0xcbf29ce484222325`,
//! prime `0x100000001b3`). The hash is part of the product's contract: the
//! same key goes to the same lane in every process and every version, so a
//! key's records never spread over two lanes and Kinesis's per-key order is
//! kept. FNV-1a is tiny, has no seed (unlike std's `RandomState`), and
//! spreads short keys well enough for lane counts in the tens (see
//! [`PartitionKey::fnv1a_64`]).

use crate::ids::PartitionKey;

/// The lane (0-based) for `key` among `lanes` lanes.
///
/// # Panics
/// When `lanes` is 0 (config validation refuses `workers = 0`).
pub fn lane_for(key: &PartitionKey, lanes: usize) -> usize {
    assert!(lanes > 0, "at least one lane");
    (key.fnv1a_64() % lanes as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_lanes_for_known_keys() {
        // Pinned: changing these breaks per-key order across a rolling
        // upgrade, so it must never happen silently.
        let lanes: Vec<usize> = ["customer-0", "customer-1", "customer-2", "order-42", ""]
            .iter()
            .map(|k| lane_for(&PartitionKey::from(*k), 4))
            .collect();
        assert_eq!(lanes, PINNED);
    }

    /// Computed independently (Python) from the FNV-1a definition.
    const PINNED: [usize; 5] = [0, 3, 2, 0, 1];

    #[test]
    fn spreads_many_keys_over_all_lanes() {
        let mut counts = [0usize; 8];
        for i in 0..10_000 {
            counts[lane_for(&PartitionKey::new(format!("key-{i}")), 8)] += 1;
        }
        for count in counts {
            assert!((1_000..1_500).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn one_lane_takes_everything() {
        assert_eq!(lane_for(&PartitionKey::from("anything"), 1), 0);
    }
}
