//! The two distributions the workloads need: exponential inter-arrival gaps
//! (Poisson arrivals) and Zipf popularity. Written out here (a few lines each)
//! so the sampled sequence is pinned by this crate, not by a dependency.

use rand::Rng;

/// One exponential sample with mean 1 (`-ln U`, U in (0, 1]).
pub fn unit_exp<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u: f64 = 1.0 - rng.random::<f64>();
    -u.ln()
}

/// Zipf over ranks `0..n`: P(k) proportional to 1 / (k + 1)^s.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Zipf over `n` ranks (at least 1) with exponent `s` (>= 0; 0 is uniform).
    pub fn new(n: usize, s: f64) -> Self {
        let n = n.max(1);
        let s = if s.is_finite() { s.max(0.0) } else { 0.0 };
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 0..n {
            acc += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// A rank in `0..n`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        let u: f64 = rng.random();
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn exp_has_mean_one() {
        let mut rng = SmallRng::seed_from_u64(1);
        let n = 20_000;
        let mean: f64 = (0..n).map(|_| unit_exp(&mut rng)).sum::<f64>() / n as f64;
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
    }

    #[test]
    fn zipf_prefers_low_ranks() {
        let z = Zipf::new(10, 1.0);
        let mut rng = SmallRng::seed_from_u64(2);
        let mut counts = [0u32; 10];
        for _ in 0..20_000 {
            counts[z.sample(&mut rng)] += 1;
        }
        // P(0) = 1 / H(10) ~ 0.341; P(9) ~ 0.034.
        assert!(counts[0] > 6_000 && counts[0] < 7_600, "{counts:?}");
        assert!(counts[0] > counts[4] && counts[4] > counts[9]);
        assert!(counts.iter().all(|&c| c > 0));
    }

    #[test]
    fn zipf_zero_is_uniform_and_degenerate_sizes_work() {
        let z = Zipf::new(0, f64::NAN);
        let mut rng = SmallRng::seed_from_u64(3);
        assert_eq!(z.sample(&mut rng), 0);
    }
}
