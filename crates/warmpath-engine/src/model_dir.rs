//! Writing a model folder in Hugging Face's layout (config, safetensors or shards
//! with an index, the tiny tokenizer) with deterministic random weights: what
//! `--model-dir` is tested with, and `--write-model-dir` writes.

use crate::config::{weight_shapes, LlamaConfig};
use crate::error::EngineError;
use crate::weights::{random_weights, INDEX_FILE};
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::Path;
use warmpath_core::tokenize::tiny;

/// How to write a random-weight model folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelDirOptions {
    /// Weight seed (the same seed gives the same weights as `--tiny --seed`).
    pub seed: u64,
    /// Stored dtype (f32, bf16 or f16), also written as `torch_dtype`.
    pub dtype: DType,
    /// Number of safetensors files; above 1 an index file is written too.
    pub shards: usize,
}

impl Default for ModelDirOptions {
    fn default() -> Self {
        ModelDirOptions {
            seed: 0,
            dtype: DType::F32,
            shards: 1,
        }
    }
}

/// A Hugging Face `config.json` for a `LlamaForCausalLM` of shape `cfg` with
/// the tiny tokenizer's special token ids.
pub fn hf_config_json(cfg: &LlamaConfig, dtype: DType) -> Result<Value, EngineError> {
    let torch_dtype = match dtype {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        other => {
            let msg = format!("weights in {other:?} (use f32, bf16 or f16)");
            return Err(EngineError::Unsupported(msg));
        }
    };
    Ok(json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": tiny::BOS_ID,
        "eos_token_id": tiny::EOT_ID_ID,
        "head_dim": cfg.head_dim(),
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "mlp_bias": false,
        "num_attention_heads": cfg.num_attention_heads,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_key_value_heads": cfg.kv_heads(),
        "pretraining_tp": 1,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_scaling": cfg.rope_scaling,
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": torch_dtype,
        "use_cache": true,
        "vocab_size": cfg.vocab_size,
    }))
}

fn write(path: &Path, text: String) -> Result<(), EngineError> {
    std::fs::write(path, text).map_err(|source| EngineError::Io {
        path: path.to_owned(),
        source,
    })
}

fn save(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<(), EngineError> {
    candle_core::safetensors::save(tensors, path)
        .map_err(|e| EngineError::bad_model(path, format!("writing safetensors: {e}")))
}

/// Writes a model folder of shape `cfg` into `dir` (created if missing) with
/// the tiny tokenizer, so `cfg.vocab_size` must be at least [`tiny::VOCAB_SIZE`].
pub fn write_random_model_dir(
    dir: &Path,
    cfg: &LlamaConfig,
    options: &ModelDirOptions,
) -> Result<(), EngineError> {
    cfg.validate()
        .map_err(|e| EngineError::bad_model(&dir.join("config.json"), e))?;
    let config = hf_config_json(cfg, options.dtype)?;
    tiny::write_model_dir(dir).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
    let mut weights = random_weights(cfg, options.seed, options.dtype, &Device::Cpu)?;
    let shapes = weight_shapes(cfg);
    let shards = options.shards.clamp(1, shapes.len());
    if shards == 1 {
        save(&weights, &dir.join("model.safetensors"))?;
    } else {
        let per = shapes.len().div_ceil(shards);
        let mut map = Map::new();
        let mut total = 0usize;
        for (i, group) in shapes.chunks(per).enumerate() {
            let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards);
            let mut part = HashMap::new();
            for (name, _) in group {
                if let Some(t) = weights.remove(name) {
                    total += t.elem_count() * t.dtype().size_in_bytes();
                    part.insert(name.clone(), t);
                }
                map.insert(name.clone(), Value::String(file.clone()));
            }
            save(&part, &dir.join(&file))?;
        }
        let index = json!({"metadata": {"total_size": total}, "weight_map": map});
        write(&dir.join(INDEX_FILE), pretty(&index))?;
    }
    write(&dir.join("config.json"), pretty(&config))
}

/// Writes the `--tiny` model (the same weights for the same `seed`) in f32.
pub fn write_tiny_model_dir(dir: &Path, seed: u64) -> Result<(), EngineError> {
    let options = ModelDirOptions {
        seed,
        ..ModelDirOptions::default()
    };
    write_random_model_dir(dir, &LlamaConfig::tiny(tiny::VOCAB_SIZE), &options)
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn written_config_reads_back_as_the_same_shape() {
        let mut cfg = LlamaConfig::preset_1b(tiny::VOCAB_SIZE);
        cfg.tie_word_embeddings = true;
        let text = hf_config_json(&cfg, DType::BF16).unwrap().to_string();
        let back = LlamaConfig::from_json(&text, Path::new("config.json")).unwrap();
        // head_dim is written explicitly; everything else round-trips.
        assert_eq!(back.head_dim, Some(64));
        assert_eq!(
            LlamaConfig {
                head_dim: None,
                ..back
            },
            cfg
        );
        assert!(text.contains(r#""torch_dtype":"bfloat16""#));
        assert!(hf_config_json(&cfg, DType::U8).is_err());
    }
}
