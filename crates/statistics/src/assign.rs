//! Variant assignment compatible with GrowthBook's SDKs: the same unit in the same experiment
//! gets the same variant here as in a GrowthBook client, so a team can move between the two.
//!
//! - `fnv1a32` hashes UTF-16 code units, as the JavaScript SDK's `charCodeAt` does.
//! - hash version 2: `fnv1a32(decimal(fnv1a32(seed + value))) % 10000 / 10000`;
//!   version 1: `fnv1a32(value + seed) % 1000 / 1000`.
//! - bucket ranges as `getBucketRanges` builds them; a unit outside every range is not in the
//!   experiment.

/// 32-bit FNV-1a over the string's UTF-16 code units.
pub fn fnv1a32(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for unit in s.encode_utf16() {
        h ^= unit as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// GrowthBook's `hash(seed, value, version)`: a number in [0, 1).
pub fn hash(seed: &str, value: &str, version: u8) -> Option<f64> {
    match version {
        2 => {
            let inner = fnv1a32(&format!("{seed}{value}"));
            Some((fnv1a32(&inner.to_string()) % 10000) as f64 / 10000.0)
        }
        1 => Some((fnv1a32(&format!("{value}{seed}")) % 1000) as f64 / 1000.0),
        _ => None,
    }
}

/// GrowthBook's `getBucketRanges(numVariations, coverage, weights)`.
pub fn bucket_ranges(n: usize, coverage: f64, weights: Option<&[f64]>) -> Vec<(f64, f64)> {
    let coverage = if coverage.is_nan() {
        1.0
    } else {
        coverage.clamp(0.0, 1.0)
    };
    let equal = vec![1.0 / n as f64; n];
    let mut w: Vec<f64> = weights.map(|w| w.to_vec()).unwrap_or_else(|| equal.clone());
    if w.len() != n {
        w = equal.clone();
    }
    let total: f64 = w.iter().sum();
    if !(0.99..=1.01).contains(&total) {
        w = equal;
    }
    let mut cumulative = 0.0;
    w.iter()
        .map(|&wi| {
            let start = cumulative;
            cumulative += wi;
            (start, start + coverage * wi)
        })
        .collect()
}

/// GrowthBook's `chooseVariation(n, ranges)`: the index whose range holds `n`, or None.
pub fn choose_variation(n: f64, ranges: &[(f64, f64)]) -> Option<usize> {
    ranges.iter().position(|&(a, b)| n >= a && n < b)
}

/// Assigns `unit` in an experiment: `Some(index)` of the variant, or `None` when the unit falls
/// outside coverage (it gets the control and no exposure is recorded).
pub fn assign(
    seed: &str,
    unit: &str,
    n: usize,
    coverage: f64,
    weights: &[f64],
    version: u8,
) -> Option<usize> {
    let h = hash(seed, unit, version)?;
    choose_variation(h, &bucket_ranges(n, coverage, Some(weights)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors computed by hand from the formula (FNV-1a 32 with offset 0x811c9dc5 and prime
    /// 0x01000193; the empty string hashes to the offset basis).
    #[test]
    fn fnv_vectors() {
        assert_eq!(fnv1a32(""), 0x811c9dc5);
        assert_eq!(fnv1a32("a"), 0xe40c292c);
        assert_eq!(fnv1a32("foobar"), 0xbf9cf968);
    }

    #[test]
    fn hash_v2_is_the_double_hash() {
        // empty seed: the inner hash is of the value alone
        let inner = fnv1a32("user-1");
        let want = (fnv1a32(&inner.to_string()) % 10000) as f64 / 10000.0;
        assert_eq!(hash("", "user-1", 2), Some(want));
        let v1 = (fnv1a32("user-1exp") % 1000) as f64 / 1000.0;
        assert_eq!(hash("exp", "user-1", 1), Some(v1));
        assert_eq!(hash("exp", "user-1", 3), None);
        for u in ["a", "ü", "日本", "🙂", ""] {
            let h = hash("seed", u, 2).unwrap();
            assert!((0.0..1.0).contains(&h));
        }
    }

    #[test]
    fn unicode_hashes_utf16_code_units() {
        // "🙂" is two UTF-16 code units (a surrogate pair): 0xD83D 0xDE42
        let mut h: u32 = 0x811c9dc5;
        for u in [0xD83Du32, 0xDE42] {
            h ^= u;
            h = h.wrapping_mul(0x01000193);
        }
        assert_eq!(fnv1a32("🙂"), h);
        // "é" is one code unit 0xE9 (not its two UTF-8 bytes)
        assert_eq!(
            fnv1a32("é"),
            (0x811c9dc5u32 ^ 0xE9).wrapping_mul(0x01000193)
        );
    }

    #[test]
    fn ranges_match_get_bucket_ranges() {
        assert_eq!(bucket_ranges(2, 1.0, None), vec![(0.0, 0.5), (0.5, 1.0)]);
        let r = bucket_ranges(3, 0.5, Some(&[0.2, 0.3, 0.5]));
        let want = [(0.0, 0.1), (0.2, 0.35), (0.5, 0.75)];
        for (a, b) in r.iter().zip(want) {
            assert!(
                (a.0 - b.0).abs() < 1e-12 && (a.1 - b.1).abs() < 1e-12,
                "{r:?}"
            );
        }
        // weights that do not sum to 1, or of the wrong count, fall back to equal
        assert_eq!(
            bucket_ranges(2, 1.0, Some(&[0.9, 0.9])),
            vec![(0.0, 0.5), (0.5, 1.0)]
        );
        assert_eq!(
            bucket_ranges(2, 1.0, Some(&[1.0])),
            vec![(0.0, 0.5), (0.5, 1.0)]
        );
        // coverage clamped
        assert_eq!(bucket_ranges(2, 7.0, None), vec![(0.0, 0.5), (0.5, 1.0)]);
        assert_eq!(bucket_ranges(2, -1.0, None), vec![(0.0, 0.0), (0.5, 0.5)]);
        assert_eq!(
            choose_variation(0.55, &bucket_ranges(2, 1.0, None)),
            Some(1)
        );
        assert_eq!(choose_variation(0.3, &bucket_ranges(2, 0.5, None)), None);
    }

    #[test]
    fn hundred_thousand_units_follow_uneven_weights() {
        let w = [0.2, 0.3, 0.5];
        let mut counts = [0usize; 3];
        for i in 0..100_000 {
            let v =
                assign("exp-weights", &format!("unit-{i}"), 3, 1.0, &w, 2).expect("full coverage");
            counts[v] += 1;
        }
        for (c, wi) in counts.iter().zip(w) {
            let share = *c as f64 / 100_000.0;
            assert!((share - wi).abs() < 0.01, "share {share} vs weight {wi}");
        }
    }

    #[test]
    fn reduced_coverage_excludes_the_rest() {
        let mut inside = 0;
        for i in 0..20_000 {
            if assign("cov", &format!("u{i}"), 2, 0.4, &[0.5, 0.5], 2).is_some() {
                inside += 1;
            }
        }
        let share = inside as f64 / 20_000.0;
        assert!((share - 0.4).abs() < 0.02, "{share}");
        // sticky: same unit, same answer
        assert_eq!(
            assign("s", "u", 2, 1.0, &[0.5, 0.5], 2),
            assign("s", "u", 2, 1.0, &[0.5, 0.5], 2)
        );
    }
}
