//! A ready model and tokenizer from a model folder (no hub access) or random weights.

use crate::config::LlamaConfig;
use crate::error::{read_json, EngineError};
use crate::model::Llama;
use crate::weights::{load_safetensors, random_weights};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use std::path::{Path, PathBuf};
use warmpath_core::tokenize::{tiny, CacheConfig, ChatTokenizer, TokenizerFiles};

/// Where the model comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSource {
    /// A folder with config.json, *.safetensors, tokenizer.json and its chat template.
    Dir(PathBuf),
    /// Random weights (determined by `seed`) of a preset shape over the tiny
    /// tokenizer: `--tiny`, or e.g. about 1B parameters for GPU measurements.
    Random { size: SizePreset, seed: u64 },
    /// Random weights of the shape in `config` (a config.json; `vocab_size` is
    /// replaced by the tiny tokenizer's): large-model speed without weights.
    RandomShape { config: PathBuf, seed: u64 },
}

/// Shapes of random-weight models (`--random-size`), all over the tiny tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SizePreset {
    /// [`LlamaConfig::tiny`]: 4 layers, width 256 (what `--tiny` runs).
    Tiny,
    /// [`LlamaConfig::preset_1b`]: about 1B parameters, Llama 3.2 1B's shape.
    #[value(name = "1b")]
    OneB,
}

impl SizePreset {
    /// The shape, over the tiny tokenizer's vocabulary.
    pub fn config(self) -> LlamaConfig {
        match self {
            SizePreset::Tiny => LlamaConfig::tiny(tiny::VOCAB_SIZE),
            SizePreset::OneB => LlamaConfig::preset_1b(tiny::VOCAB_SIZE),
        }
    }
}

/// A loaded model, its tokenizer and what the API reports.
#[derive(Debug)]
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: ChatTokenizer,
    /// Ids that end generation (EOS and end-of-turn tokens).
    pub stop_ids: Vec<u32>,
}

fn tok_err(e: warmpath_core::tokenize::TokenizeError) -> EngineError {
    EngineError::Tokenizer(e.to_string())
}

/// Loads `source` onto `device` in `dtype` (other float weights are converted).
/// Start-up only; a bad model folder is an error naming the file, never a panic.
pub fn load(
    source: &ModelSource,
    device: &Device,
    dtype: DType,
) -> Result<LoadedModel, EngineError> {
    if device.is_cpu() && dtype == DType::BF16 {
        return Err(EngineError::Unsupported(
            "bf16 on the CPU (candle's CPU backend has no bf16 matmul); use f32 or f16 \
             there, bf16 on CUDA (bf16 weight files load fine in f32)"
                .into(),
        ));
    }
    let random = |cfg: LlamaConfig, seed: u64| -> Result<_, EngineError> {
        let w = random_weights(&cfg, seed, dtype, device)?;
        Ok((cfg, w, tiny::files().map_err(tok_err)?))
    };
    let (cfg, weights, files) = match source {
        ModelSource::Random { size, seed } => random(size.config(), *seed)?,
        ModelSource::RandomShape { config, seed } => {
            let mut cfg: LlamaConfig = read_json(config)?;
            cfg.vocab_size = tiny::VOCAB_SIZE;
            cfg.validate()
                .map_err(|e| EngineError::bad_model(config, e))?;
            random(cfg, *seed)?
        }
        ModelSource::Dir(dir) => {
            if !dir.is_dir() {
                return Err(EngineError::bad_model(dir, "not a folder"));
            }
            let cfg = LlamaConfig::from_model_dir(dir)?;
            let w = load_safetensors(dir, device)?;
            (cfg, w, TokenizerFiles::load(dir).map_err(tok_err)?)
        }
    };
    let origin = match source {
        ModelSource::Dir(d) => d.as_path(),
        _ => Path::new("<random weights>"),
    };
    let vb = VarBuilder::from_tensors(weights, dtype, device);
    let model = Llama::load(vb, &cfg).map_err(|e| EngineError::bad_model(origin, e))?;
    let tokenizer = ChatTokenizer::new(&files, CacheConfig::default()).map_err(tok_err)?;
    let tok_vocab = tokenizer.tokenizer().get_vocab_size(true);
    if tok_vocab > cfg.vocab_size {
        let reason = format!(
            "the tokenizer has {tok_vocab} ids but the model's vocab_size is {}",
            cfg.vocab_size
        );
        return Err(EngineError::bad_model(
            &origin.join("tokenizer.json"),
            reason,
        ));
    }
    let eos = files.special_tokens.eos.as_deref();
    let mut stop_ids: Vec<u32> = [eos, Some(tiny::EOT_ID), Some(tiny::END_OF_TEXT)]
        .into_iter()
        .flatten()
        .filter_map(|name| tokenizer.tokenizer().token_to_id(name))
        .collect();
    if let ModelSource::Dir(dir) = source {
        stop_ids.extend(eos_ids(&dir.join("config.json"))?);
        stop_ids.extend(eos_ids(&dir.join("generation_config.json"))?);
    }
    stop_ids.retain(|&id| (id as usize) < cfg.vocab_size);
    stop_ids.sort_unstable();
    stop_ids.dedup();
    Ok(LoadedModel {
        model,
        tokenizer,
        stop_ids,
    })
}

/// `eos_token_id` (one id or a list, as in Llama 3.1 instruct) of a
/// `config.json` or `generation_config.json`; none when the file is absent.
fn eos_ids(path: &Path) -> Result<Vec<u32>, EngineError> {
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let v: serde_json::Value = read_json(path)?;
    let one = |x: &serde_json::Value| {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                EngineError::bad_model(path, format!("eos_token_id {x} is not a token id"))
            })
    };
    match v.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(list)) => list.iter().map(one).collect(),
        Some(x) => Ok(vec![one(x)?]),
    }
}
