//! A stable slice of partition keys: the share of keys a canary sends to
//! its candidate version.
//!
//! A key is in the slice when `splitmix64(fnv1a_64(key)) mod 1,000,000` is
//! below the fraction in parts per million. The extra mixing makes the
//! slice independent of the lane a key hashes to (otherwise a fraction
//! could pick whole lanes), and the slice for a fraction contains the slice
//! of every smaller fraction, so raising the fraction only moves more keys
//! to the candidate.
//!
//! The config names a slice (`canary.key_fraction`) and the plugin slot
//! ([`crate::slot`]) uses it.
//!
//! Floor 1 (ground values) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

use crate::ids::PartitionKey;

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
        mix(key.fnv1a_64()) % SLICE_RESOLUTION < u64::from(self.per_million)
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
    use crate::dispatch::routing::lane_for;

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
