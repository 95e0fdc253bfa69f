//! The model's shape: read from a Hugging Face `config.json`, or the fixed
//! shape of the `--tiny` random-weight model.

use crate::error::{read_text, EngineError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Llama hyper-parameters (the subset of `config.json` this engine uses, with
/// Hugging Face's names).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Grouped-query attention; defaults to `num_attention_heads`.
    pub num_key_value_heads: Option<usize>,
    /// Defaults to `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Longest sequence the RoPE tables cover.
    #[serde(default = "default_positions")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    pub rope_scaling: Option<RopeScaling>,
}

/// `rope_scaling` of Llama 3.x configs; only `rope_type: "llama3"` is accepted.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct RopeScaling {
    #[serde(alias = "type")]
    pub rope_type: String,
    pub factor: f64,
    #[serde(default = "one")]
    pub low_freq_factor: f64,
    #[serde(default = "four")]
    pub high_freq_factor: f64,
    /// Context length the model was pre-trained with.
    #[serde(default = "default_positions")]
    pub original_max_position_embeddings: usize,
}

/// The parts of a Hugging Face `config.json` that say whether this engine can
/// run the model at all (not part of the shape).
#[derive(Debug, Deserialize)]
struct HfFields {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    /// `torch_dtype`, called `dtype` by newer transformers.
    #[serde(default, alias = "dtype")]
    torch_dtype: Option<String>,
    hidden_act: Option<String>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    quantization_config: Option<serde_json::Value>,
}

/// `torch_dtype` values whose weights this engine reads.
const SUPPORTED_TORCH_DTYPES: [&str; 3] = ["float32", "bfloat16", "float16"];

fn unsupported(field: &str, value: &dyn std::fmt::Debug, supported: &str) -> String {
    format!("{field} {value:?} is not supported ({supported})")
}

impl HfFields {
    /// Why this engine cannot run the model, if it cannot.
    fn check(&self) -> Result<(), String> {
        if let Some(archs) = &self.architectures {
            if !archs.iter().any(|a| a == "LlamaForCausalLM") {
                return Err(unsupported("architectures", archs, "only LlamaForCausalLM"));
            }
        }
        if let Some(t) = self.model_type.as_ref().filter(|t| *t != "llama") {
            return Err(unsupported("model_type", t, "only \"llama\""));
        }
        if self.architectures.is_none() && self.model_type.is_none() {
            return Err("neither architectures nor model_type is given; expected \
                        LlamaForCausalLM / \"llama\""
                .into());
        }
        if let Some(d) = &self.torch_dtype {
            if !SUPPORTED_TORCH_DTYPES.contains(&d.as_str()) {
                let supported = format!("one of {SUPPORTED_TORCH_DTYPES:?}");
                return Err(unsupported("torch_dtype", d, &supported));
            }
        }
        if let Some(act) = self.hidden_act.as_ref().filter(|a| *a != "silu") {
            return Err(unsupported("hidden_act", act, "only \"silu\""));
        }
        if self.attention_bias || self.mlp_bias {
            return Err("attention_bias / mlp_bias are not supported".into());
        }
        if self.quantization_config.is_some() {
            return Err("quantized checkpoints (quantization_config) are not supported".into());
        }
        Ok(())
    }
}

fn default_eps() -> f64 {
    1e-5
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_positions() -> usize {
    8192
}
fn one() -> f64 {
    1.0
}
fn four() -> f64 {
    4.0
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

    /// Llama 3.2 1B's shape (about 1B parameters) over `vocab_size` ids: for
    /// speed measurements with random weights.
    pub fn preset_1b(vocab_size: usize) -> Self {
        LlamaConfig {
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 16,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            rope_theta: 500_000.0,
            ..Self::tiny(vocab_size)
        }
    }

    /// Reads and checks `dir/config.json` (see [`Self::from_json`]).
    pub fn from_model_dir(dir: &Path) -> Result<Self, EngineError> {
        let path = dir.join("config.json");
        Self::from_json(&read_text(&path)?, &path)
    }

    /// Parses and checks the text of a `config.json` read from `path`: a
    /// `LlamaForCausalLM` / `model_type: "llama"`, float weights, no biases,
    /// SiLU, not quantized. Fields this engine does not use are ignored.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, EngineError> {
        let bad = |reason: String| EngineError::bad_model(path, reason);
        let hf: HfFields = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        hf.check().map_err(bad)?;
        let cfg: LlamaConfig = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// Parameters of a model of this shape (embedding, layers, final norm, LM head).
    pub fn num_params(&self) -> usize {
        let shapes = weight_shapes(self);
        shapes
            .iter()
            .map(|(_, d)| d.iter().product::<usize>())
            .sum()
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Why this engine cannot run a model of this shape, if it cannot.
    pub fn validate(&self) -> Result<(), String> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        let (heads, kv, hd) = (self.num_attention_heads, self.kv_heads(), self.head_dim());
        if !heads.is_multiple_of(kv) {
            return Err(format!(
                "num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})"
            ));
        }
        if hd == 0 || !hd.is_multiple_of(2) {
            return Err(format!("head_dim ({hd}) must be even and positive"));
        }
        match &self.rope_scaling {
            Some(rs) if rs.rope_type != "llama3" => Err(unsupported(
                "rope_scaling type",
                &rs.rope_type,
                "only \"llama3\"",
            )),
            _ => Ok(()),
        }
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

/// Every tensor of a Hugging Face Llama checkpoint of shape `cfg`: name and
/// dimensions, in a fixed order (`lm_head.weight` only when not tied).
pub fn weight_shapes(cfg: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.kv_heads());
    let mut out = vec![(
        "model.embed_tokens.weight".to_owned(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        for (name, dims) in [
            ("self_attn.q_proj.weight", vec![nh * hd, h]),
            ("self_attn.k_proj.weight", vec![nkv * hd, h]),
            ("self_attn.v_proj.weight", vec![nkv * hd, h]),
            ("self_attn.o_proj.weight", vec![h, nh * hd]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            out.push((format!("{p}.{name}"), dims));
        }
    }
    out.push(("model.norm.weight".into(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama3_config_with_defaults() {
        let cfg: LlamaConfig = serde_json::from_value(serde_json::json!(
            {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                "rope_theta": 500000.0, "tie_word_embeddings": true, "model_type": "llama",
                "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
        ))
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

    fn hf(extra: &str) -> Result<LlamaConfig, EngineError> {
        let shape = r#""vocab_size": 64, "hidden_size": 32, "intermediate_size": 64"#;
        let text =
            format!("{{{shape}, \"num_hidden_layers\": 1, \"num_attention_heads\": 4 {extra}}}");
        LlamaConfig::from_json(&text, Path::new("m/config.json"))
    }

    #[test]
    fn checks_what_kind_of_model_the_config_describes() {
        let llama = r#", "architectures": ["LlamaForCausalLM"], "model_type": "llama""#;
        assert!(hf(llama).is_ok());
        assert!(hf(&format!(r#"{llama}, "torch_dtype": "bfloat16""#)).is_ok());
        assert!(hf(&format!(r#"{llama}, "dtype": "float16""#)).is_ok());
        for (extra, needle) in [
            ("", "neither architectures nor model_type"),
            (
                r#", "architectures": ["MistralForCausalLM"]"#,
                "MistralForCausalLM",
            ),
            (r#", "model_type": "gpt2""#, "gpt2"),
            (r#", "model_type": "llama", "torch_dtype": "int8""#, "int8"),
            (r#", "model_type": "llama", "hidden_act": "gelu""#, "gelu"),
            (r#", "model_type": "llama", "attention_bias": true"#, "bias"),
            (
                r#", "model_type": "llama", "quantization_config": {}"#,
                "quantized",
            ),
            (
                r#", "model_type": "llama", "num_key_value_heads": 3"#,
                "multiple",
            ),
        ] {
            let err = hf(extra).unwrap_err().to_string();
            assert!(err.contains(needle), "{extra}: {err}");
            assert!(err.contains("m/config.json"), "{err}");
        }
        let err = LlamaConfig::from_json("{", Path::new("c.json")).unwrap_err();
        assert!(matches!(err, EngineError::BadModel { .. }), "{err}");
    }

    #[test]
    fn the_1b_preset_has_about_a_billion_parameters() {
        let cfg = LlamaConfig::preset_1b(1024);
        assert!(cfg.validate().is_ok());
        assert_eq!((cfg.kv_heads(), cfg.head_dim()), (8, 64));
        // 16 * (2*2048*2048 + 2*2048*512 + 3*2048*8192 + 2*2048) + 2*1024*2048 + 2048.
        assert_eq!(cfg.num_params(), 977_340_416);
        let tied = LlamaConfig {
            tie_word_embeddings: true,
            ..cfg
        };
        assert_eq!(tied.num_params(), 977_340_416 - 1024 * 2048);
    }

    #[test]
    fn refuses_bad_shapes() {
        let mut cfg = LlamaConfig::tiny(100);
        assert!(cfg.validate().is_ok());
        cfg.num_key_value_heads = Some(3);
        assert!(cfg.validate().unwrap_err().to_string().contains("multiple"));
        cfg = LlamaConfig::tiny(0);
        assert!(cfg
            .validate()
            .unwrap_err()
            .to_string()
            .contains("vocab_size"));
    }
}
