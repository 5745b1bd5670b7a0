//! Lane routing for `by_key`: which lane a partition key goes to.
//!
//! `lane = fnv1a_64(partition key as UTF-8 bytes) mod lanes`, with the
//! standard 64-bit FNV-1a parameters (offset basis `0xcbf29ce484222325`,
//! prime `0x100000001b3`). The hash is part of the product's contract: the
//! same key goes to the same lane in every process and every version, so a
//! key's records never spread over two lanes and Kinesis's per-key order is
//! kept. FNV-1a is tiny, has no seed (unlike std's `RandomState`), and
//! spreads short keys well enough for lane counts in the tens.
//!
//! # Canary slice
//! A canary sends a stable slice of partition keys to a candidate plugin
//! version ([`KeySlice`]): a key is in the slice when
//! `splitmix64(fnv1a_64(key)) mod 1,000,000` is below the fraction in parts
//! per million. The extra mixing makes the slice independent of the lane a
//! key hashes to (otherwise a fraction could pick whole lanes), and the
//! slice for a fraction contains the slice of every smaller fraction, so
//! raising the fraction only moves more keys to the candidate.

use crate::ids::PartitionKey;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    })
}

/// The lane (0-based) for `key` among `lanes` lanes.
///
/// # Panics
/// When `lanes` is 0 (config validation refuses `workers = 0`).
pub fn lane_for(key: &PartitionKey, lanes: usize) -> usize {
    assert!(lanes > 0, "at least one lane");
    (fnv1a_64(key.as_str().as_bytes()) % lanes as u64) as usize
}

/// Parts per million: the resolution of a [`KeySlice`].
const SLICE_RESOLUTION: u64 = 1_000_000;

/// The splitmix64 finalizer: a bijective mix of all 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable slice of partition keys: the canary's share (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySlice {
    per_million: u32,
}

impl KeySlice {
    /// The slice holding about `fraction` of all keys; `None` unless
    /// `fraction` is in (0, 1] and at least one part per million.
    pub fn new(fraction: f64) -> Option<Self> {
        if !(fraction.is_finite() && fraction > 0.0 && fraction <= 1.0) {
            return None;
        }
        let per_million = (fraction * SLICE_RESOLUTION as f64).round() as u32;
        (per_million > 0).then_some(Self { per_million })
    }

    /// The fraction of keys in the slice.
    pub fn fraction(self) -> f64 {
        f64::from(self.per_million) / SLICE_RESOLUTION as f64
    }

    /// Whether `key` is in the slice.
    pub fn contains(self, key: &PartitionKey) -> bool {
        mix(fnv1a_64(key.as_str().as_bytes())) % SLICE_RESOLUTION < u64::from(self.per_million)
    }
}

impl std::fmt::Display for KeySlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.fraction())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_published_fnv1a_vectors() {
        // From the FNV reference test suite.
        assert_eq!(fnv1a_64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x85944171f73967e8);
    }

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

    #[test]
    fn key_slices_hold_their_fraction_and_nest() {
        let keys: Vec<PartitionKey> = (0..20_000)
            .map(|i| PartitionKey::new(format!("key-{i}")))
            .collect();
        let tenth = KeySlice::new(0.1).unwrap();
        let quarter = KeySlice::new(0.25).unwrap();
        let in_tenth = keys.iter().filter(|k| tenth.contains(k)).count();
        assert!((1_800..2_200).contains(&in_tenth), "{in_tenth}");
        // Nested: raising the fraction only adds keys.
        assert!(
            keys.iter()
                .filter(|k| tenth.contains(k))
                .all(|k| quarter.contains(k))
        );
        assert!(keys.iter().all(|k| KeySlice::new(1.0).unwrap().contains(k)));
        // Independent of the lane: every lane has keys in the slice.
        let mut lanes = [0usize; 4];
        for k in keys.iter().filter(|k| tenth.contains(k)) {
            lanes[lane_for(k, 4)] += 1;
        }
        assert!(lanes.iter().all(|&n| n > 400), "{lanes:?}");
    }

    #[test]
    fn key_slice_fractions_out_of_range_are_refused() {
        for bad in [0.0, -0.1, 1.5, f64::NAN, f64::INFINITY, 1e-9] {
            assert_eq!(KeySlice::new(bad), None, "{bad}");
        }
        assert_eq!(KeySlice::new(0.1).unwrap().fraction(), 0.1);
    }
}
