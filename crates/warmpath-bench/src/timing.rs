//! The time model of a simulated engine, shared by [`crate::sim`] and
//! [`crate::scale`]: one FIFO prefill queue, not chunked, `prefill_base_ms +
//! prefill_ms_per_token × uncached tokens`; then one token per
//! `decode_step_ms`, up to `max_batch` decoding at once, not slowing prefill.

use crate::error::{ensure, BenchError};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimeModel {
    /// Constant cost of every prefill (scheduling, the first decode step), ms.
    pub prefill_base_ms: f64,
    /// Cost per uncached prompt token, ms.
    pub prefill_ms_per_token: f64,
    /// Time per output token while decoding, ms.
    pub decode_step_ms: f64,
    /// Requests decoding at once.
    pub max_batch: u32,
}

impl Default for TimeModel {
    fn default() -> Self {
        // 13.5 + 0.0232 * 8050 = 200 ms; 13.5 + 0.0232 * 66 = 15 ms.
        TimeModel {
            prefill_base_ms: 13.5,
            prefill_ms_per_token: 0.0232,
            decode_step_ms: 10.0,
            max_batch: 64,
        }
    }
}

impl TimeModel {
    /// Prefill time of a prompt with `uncached_tokens` left to compute, ms.
    pub fn prefill_ms(&self, uncached_tokens: usize) -> f64 {
        self.prefill_base_ms + self.prefill_ms_per_token * uncached_tokens as f64
    }

    /// Decode time of `tokens` output tokens once running, ms. The first
    /// token comes out of prefill, so `tokens - 1` steps follow.
    pub fn decode_ms(&self, tokens: u32) -> f64 {
        self.decode_step_ms * f64::from(tokens.saturating_sub(1))
    }

    /// Checks the ranges (all finite and >= 0, `max_batch` >= 1).
    pub fn validate(&self) -> Result<(), BenchError> {
        let times = [
            self.prefill_base_ms,
            self.prefill_ms_per_token,
            self.decode_step_ms,
        ];
        let why = "times must be finite numbers >= 0, max_batch at least 1";
        let ok = times.iter().all(|v| v.is_finite() && *v >= 0.0) && self.max_batch > 0;
        ensure(ok, "time model", why)?;
        Ok(())
    }

    /// The same model `factor` times faster (for quick test runs).
    pub fn scaled(&self, factor: f64) -> TimeModel {
        let f = if factor.is_finite() && factor > 0.0 {
            factor
        } else {
            1.0
        };
        TimeModel {
            prefill_base_ms: self.prefill_base_ms / f,
            prefill_ms_per_token: self.prefill_ms_per_token / f,
            decode_step_ms: self.decode_step_ms / f,
            max_batch: self.max_batch,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_study_ratio() {
        let m = TimeModel::default();
        let cold = m.prefill_ms(8050);
        let warm = m.prefill_ms(66);
        assert!((cold - 200.0).abs() < 3.0, "{cold}");
        assert!((warm - 15.0).abs() < 1.0, "{warm}");
        assert_eq!(m.decode_ms(1), 0.0);
        assert_eq!(m.decode_ms(11), 100.0);
        m.validate().unwrap();
    }

    #[test]
    fn bad_models_are_refused() {
        let bad = TimeModel {
            decode_step_ms: f64::NAN,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let bad = TimeModel {
            max_batch: 0,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        assert_eq!(TimeModel::default().scaled(0.0), TimeModel::default());
    }
}
