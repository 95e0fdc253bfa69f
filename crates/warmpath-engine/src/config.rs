//! The model's shape: read from a Hugging Face `config.json`, or the fixed
//! shape of the `--tiny` random-weight model.

use crate::error::EngineError;
use serde::Deserialize;
use std::path::Path;

/// Llama hyper-parameters (the subset of `config.json` this engine uses).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct LlamaConfig {
    /// Vocabulary size (rows of the embedding and of the LM head).
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Longest sequence the RoPE tables cover.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Whether the LM head reuses the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama 3 style RoPE scaling, if any.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
}

/// `rope_scaling` of Llama 3.x configs (`rope_type: "llama3"`); other kinds are refused.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RopeScaling {
    /// Only `"llama3"` is supported.
    #[serde(alias = "type")]
    pub rope_type: String,
    /// Overall scaling factor.
    pub factor: f64,
    /// Low-frequency factor.
    #[serde(default = "one")]
    pub low_freq_factor: f64,
    /// High-frequency factor.
    #[serde(default = "four")]
    pub high_freq_factor: f64,
    /// Context length the model was pre-trained with.
    #[serde(default = "default_orig")]
    pub original_max_position_embeddings: usize,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_max_pos() -> usize {
    8192
}
fn one() -> f64 {
    1.0
}
fn four() -> f64 {
    4.0
}
fn default_orig() -> usize {
    8192
}

impl LlamaConfig {
    /// The `--tiny` shape: 4 layers, width 256, 4 query / 2 KV heads, 16k positions.
    pub fn tiny(vocab_size: usize) -> Self {
        LlamaConfig {
            vocab_size,
            hidden_size: 256,
            intermediate_size: 512,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            num_key_value_heads: Some(2),
            head_dim: None,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            max_position_embeddings: 16_384,
            tie_word_embeddings: false,
            rope_scaling: None,
        }
    }

    /// Reads and checks `dir/config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Self, EngineError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| EngineError::Io {
            path: path.clone(),
            source,
        })?;
        let cfg: LlamaConfig = serde_json::from_str(&text).map_err(|e| EngineError::BadModel {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        cfg.validate()
            .map_err(|reason| EngineError::BadModel { path, reason })?;
        Ok(cfg)
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Checks the shape is one this engine can run; the reason otherwise.
    pub fn validate(&self) -> Result<(), String> {
        let zero = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        if self.num_attention_heads % self.kv_heads() != 0 {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.kv_heads()
            ));
        }
        let hd = self.head_dim();
        if hd == 0 || hd % 2 != 0 {
            return Err(format!("head_dim ({hd}) must be even and positive"));
        }
        if let Some(rs) = &self.rope_scaling {
            if rs.rope_type != "llama3" {
                return Err(format!(
                    "rope_scaling type {:?} is not supported (only \"llama3\")",
                    rs.rope_type
                ));
            }
        }
        Ok(())
    }

    /// Inverse RoPE frequencies (`head_dim / 2` of them), with Llama 3 scaling applied.
    pub fn inv_freq(&self) -> Vec<f32> {
        let hd = self.head_dim();
        let base: Vec<f64> = (0..hd / 2)
            .map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / hd as f64))
            .collect();
        let Some(rs) = &self.rope_scaling else {
            return base.into_iter().map(|f| f as f32).collect();
        };
        let orig = rs.original_max_position_embeddings as f64;
        let low_wavelen = orig / rs.low_freq_factor;
        let high_wavelen = orig / rs.high_freq_factor;
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                let scaled = if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / rs.factor
                } else {
                    let smooth = (orig / wavelen - rs.low_freq_factor)
                        / (rs.high_freq_factor - rs.low_freq_factor);
                    (1.0 - smooth) * f / rs.factor + smooth * f
                };
                scaled as f32
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama3_config_with_defaults() {
        let cfg: LlamaConfig = serde_json::from_str(
            r#"{"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                "rope_theta": 500000.0, "tie_word_embeddings": true, "model_type": "llama",
                "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}}"#,
        )
        .unwrap();
        assert_eq!((cfg.kv_heads(), cfg.head_dim()), (8, 64));
        assert!(cfg.validate().is_ok());
        let f = cfg.inv_freq();
        assert_eq!(f.len(), 32);
        // Highest frequency untouched, lowest divided by the factor.
        assert_eq!(f[0], 1.0);
        let unscaled = 1.0 / 500000f64.powf(62.0 / 64.0);
        assert!((f[31] as f64 - unscaled / 32.0).abs() < 1e-12);
    }

    #[test]
    fn refuses_bad_shapes() {
        let mut cfg = LlamaConfig::tiny(100);
        assert!(cfg.validate().is_ok());
        cfg.num_key_value_heads = Some(3);
        assert!(cfg.validate().unwrap_err().contains("multiple"));
        cfg = LlamaConfig::tiny(0);
        assert!(cfg.validate().unwrap_err().contains("vocab_size"));
    }
}
