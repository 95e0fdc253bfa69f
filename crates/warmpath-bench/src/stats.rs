//! Small statistics helpers shared by `scale` and `compare`.

use serde::Serialize;

/// The `p`-th percentile (0..=100) of `sorted` (ascending), nearest rank;
/// 0 for an empty slice.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `a / b`, or 0 when `b` is not positive.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Sorts a copy of `values` (NaN last).
pub fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// P50 / P90 / P99 and the mean of a sample, in the sample's unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Summary {
    pub fn of(values: &[f64]) -> Self {
        let s = sorted(values);
        let mean = ratio(s.iter().sum(), s.len() as f64);
        Summary {
            p50: percentile(&s, 50.0),
            p90: percentile(&s, 90.0),
            p99: percentile(&s, 99.0),
            mean,
        }
    }
}

/// Per-instance share of requests: (min %, max %), 0 when nothing was served.
pub fn share_min_max(counts: &[u64]) -> (f64, f64) {
    let total: u64 = counts.iter().sum();
    if total == 0 || counts.is_empty() {
        return (0.0, 0.0);
    }
    let pct = |c: u64| 100.0 * c as f64 / total as f64;
    let min = counts.iter().copied().min().map_or(0.0, pct);
    let max = counts.iter().copied().max().map_or(0.0, pct);
    (min, max)
}

/// How many of `counts` are below `lo` times, and above `hi` times, an even
/// share of their sum (issue 20's balance target is 0.5x-1.5x).
pub fn outside_even(counts: &[u64], lo: f64, hi: f64) -> (usize, usize) {
    let total: u64 = counts.iter().sum();
    if total == 0 || counts.is_empty() {
        return (0, 0);
    }
    let even = total as f64 / counts.len() as f64;
    let below = counts.iter().filter(|&&c| (c as f64) < lo * even).count();
    let above = counts.iter().filter(|&&c| (c as f64) > hi * even).count();
    (below, above)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_even_counts_both_sides_and_not_the_bounds() {
        // Even share 10: 4 is below 0.5x, 5 and 15 sit on the bounds, 16 is above.
        assert_eq!(outside_even(&[4, 5, 10, 15, 16, 10], 0.5, 1.5), (1, 1));
        assert_eq!(outside_even(&[10, 10], 0.5, 1.5), (0, 0));
        assert_eq!(outside_even(&[], 0.5, 1.5), (0, 0));
        assert_eq!(outside_even(&[0, 0], 0.5, 1.5), (0, 0));
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 90.0), 90.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!(s.p50, 2.0);
        assert_eq!(s.mean, 2.0);
    }

    #[test]
    fn shares() {
        assert_eq!(share_min_max(&[1, 1, 2]), (25.0, 50.0));
        assert_eq!(share_min_max(&[0, 0]), (0.0, 0.0));
    }
}
