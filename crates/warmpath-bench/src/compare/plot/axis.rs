//! Round axis ticks: steps of 1, 2, 2.5 or 5 × 10^k from 0 to the first tick
//! at or above the data's maximum, so a reader sees 0, 200, 400, 600 rather
//! than quarters of the maximum (0, 149, 299, 448, 597).

/// The ticks of one numeric axis, from 0 to [`Ticks::top`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ticks {
    /// The distance between two ticks, m × 10^k with m in {1, 2, 2.5, 5}.
    step: f64,
    /// Intervals between 0 and the top tick (2 to 4).
    intervals: u32,
    /// Decimals a label needs to show the step exactly.
    decimals: usize,
}

/// At most this many intervals.
const MAX_INTERVALS: f64 = 4.0;

impl Ticks {
    /// Ticks covering `0..=max`; a maximum that is not a positive finite
    /// number (an empty series) gets the axis `0..=1`.
    pub(crate) fn new(max: f64) -> Self {
        let max = if max.is_finite() && max > 0.0 {
            max
        } else {
            1.0
        };
        let raw = max / MAX_INTERVALS;
        let k = raw.log10().floor() as i32;
        let mag = 10f64.powi(k);
        // The smallest round step that needs at most four intervals; the
        // last candidate (10) always fits since raw / mag < 10.
        let m = [1.0, 2.0, 2.5, 5.0, 10.0]
            .into_iter()
            .find(|&m| m * mag >= raw * (1.0 - 1e-9))
            .unwrap_or(10.0);
        let (m, k) = if m == 10.0 { (1.0, k + 1) } else { (m, k) };
        let step = m * 10f64.powi(k);
        let intervals = ((max / step) - 1e-9).ceil().max(1.0) as u32;
        let decimals = usize::try_from(-k).unwrap_or(0) + usize::from(m == 2.5);
        Self {
            step,
            intervals,
            decimals,
        }
    }

    /// The highest tick: the axis' end, at or above the maximum.
    pub(crate) fn top(&self) -> f64 {
        self.step * f64::from(self.intervals)
    }

    /// Every tick as (fraction of the axis, label), from 0 to the top.
    pub(crate) fn marks(&self) -> impl Iterator<Item = (f64, String)> + '_ {
        (0..=self.intervals).map(move |i| {
            let v = self.step * f64::from(i);
            (f64::from(i) / f64::from(self.intervals), self.label(v))
        })
    }

    /// `v` with the step's decimals, trailing zeros dropped (0.5, not 0.50).
    fn label(&self, v: f64) -> String {
        let s = format!("{v:.*}", self.decimals);
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(max: f64) -> Vec<String> {
        Ticks::new(max).marks().map(|m| m.1).collect()
    }

    #[test]
    fn awkward_maxima_get_round_ticks() {
        assert_eq!(labels(597.0), ["0", "200", "400", "600"]);
        assert_eq!(labels(0.37), ["0", "0.1", "0.2", "0.3", "0.4"]);
        assert_eq!(labels(12345.0), ["0", "5000", "10000", "15000"]);
        assert_eq!(labels(1.0), ["0", "0.25", "0.5", "0.75", "1"]);
        assert_eq!(labels(100.0), ["0", "25", "50", "75", "100"]);
        assert_eq!(labels(0.0), labels(1.0));
        assert_eq!(labels(f64::NAN), labels(1.0));
    }

    /// Every tick of every maximum over nine decades is a multiple of a step
    /// 1, 2, 2.5 or 5 × 10^k, prints as that multiple, and the axis ends at
    /// or above the maximum with 2 to 4 intervals.
    #[test]
    fn every_tick_is_a_multiple_of_a_round_step() {
        let mut max = 0.00123;
        while max < 1e7 {
            let t = Ticks::new(max);
            let mant = t.step / 10f64.powf(t.step.log10().floor());
            assert!(
                [1.0, 2.0, 2.5, 5.0].iter().any(|m| (mant - m).abs() < 1e-9),
                "{max}: step {}",
                t.step
            );
            assert!((2..=4).contains(&t.intervals), "{max}: {t:?}");
            assert!(t.top() >= max * (1.0 - 1e-12), "{max}: {t:?}");
            for (i, (_, label)) in t.marks().enumerate() {
                let v: f64 = label.parse().unwrap_or(f64::NAN);
                let want = t.step * i as f64;
                assert!((v - want).abs() <= want * 1e-9, "{max}: {label} vs {want}");
                // Round: at most three significant digits (e.g. 0.375 is
                // not a tick; 12500 and 0.25 are).
                let digits = label
                    .trim_start_matches(['0', '.'])
                    .trim_end_matches(['0', '.']);
                assert!(digits.replace('.', "").len() <= 3, "{max}: {label}");
            }
            max *= 1.37;
        }
    }
}
