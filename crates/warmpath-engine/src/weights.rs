//! Where a model's weights come from: safetensors files in a model folder, or
//! deterministic random values (`--tiny`, or any shape for GPU benchmarks).

use crate::config::{weight_shapes, LlamaConfig};
use crate::error::{read_json, EngineError};
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

/// The index of a sharded checkpoint: tensor name -> shard file.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Weight dtypes this engine reads (converted to the run's dtype on load).
const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Reads a model folder's weights (no memory mapping: the crate forbids
/// `unsafe`): the shards [`INDEX_FILE`] names, each holding what it lists, or
/// else every `*.safetensors` file. f32, f16 or bf16 tensors, each only once.
pub fn load_safetensors(
    dir: &Path,
    device: &Device,
) -> Result<HashMap<String, Tensor>, EngineError> {
    let index_path = dir.join(INDEX_FILE);
    let index = (index_path.is_file())
        .then(|| read_index(&index_path))
        .transpose()?;
    let files: Vec<PathBuf> = match &index {
        Some(map) => {
            let names: BTreeSet<&String> = map.values().collect();
            names.into_iter().map(|n| dir.join(n)).collect()
        }
        None => {
            let read = std::fs::read_dir(dir).map_err(|source| EngineError::Io {
                path: dir.to_owned(),
                source,
            })?;
            let mut files: Vec<_> = read
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            files.sort();
            files
        }
    };
    if files.is_empty() {
        return Err(EngineError::bad_model(dir, "no *.safetensors file"));
    }
    let mut all = HashMap::new();
    let mut origin: HashMap<String, PathBuf> = HashMap::new();
    for f in files {
        let bad = |reason: String| EngineError::bad_model(&f, reason);
        if !f.is_file() {
            return Err(bad("listed in the index but missing".into()));
        }
        let tensors = candle_core::safetensors::load(&f, device).map_err(|e| bad(e.to_string()))?;
        for (name, t) in tensors {
            if !FLOAT_DTYPES.contains(&t.dtype()) {
                return Err(bad(format!(
                    "tensor {name} has dtype {:?}; only f32, f16 and bf16 weights are supported",
                    t.dtype()
                )));
            }
            if let Some(first) = origin.insert(name.clone(), f.clone()) {
                return Err(bad(format!("tensor {name} is also in {}", first.display())));
            }
            all.insert(name, t);
        }
    }
    if let Some(map) = index {
        for (name, file) in &map {
            if origin.get(name) != Some(&dir.join(file)) {
                let reason = format!("tensor {name} is listed in {file} but not found there");
                return Err(EngineError::bad_model(&index_path, reason));
            }
        }
    }
    Ok(all)
}

/// Reads `weight_map` of a sharded checkpoint's index; shard names must be
/// plain file names (no path may leave the model folder).
fn read_index(path: &Path) -> Result<BTreeMap<String, String>, EngineError> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let index: Index = read_json(path)?;
    for file in index.weight_map.values() {
        let mut parts = Path::new(file).components();
        let plain = matches!(
            (parts.next(), parts.next()),
            (Some(Component::Normal(_)), None)
        );
        if !plain {
            let reason = format!("shard {file:?} is not a file name in the model folder");
            return Err(EngineError::bad_model(path, reason));
        }
    }
    Ok(index.weight_map)
}

/// `rows x cols` values uniform in `[-scale, scale)`: SplitMix64 seeded with
/// `seed` and the FNV-1a hash of `name`, so every tensor has its own stream.
fn uniform(
    seed: u64,
    name: &str,
    (rows, cols): (usize, usize),
    scale: f32,
    dtype: DType,
    device: &Device,
) -> Result<Tensor, EngineError> {
    let fnv1a = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut state = seed ^ fnv1a;
    let data: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0) * scale
        })
        .collect();
    Ok(Tensor::from_vec(data, (rows, cols), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?)
}

/// Random Llama weights for `cfg`, fully determined by `seed`: standard deviation
/// `1/sqrt(fan_in)` for linear layers, 1 for the embedding; norms 1.
pub fn random_weights(
    cfg: &LlamaConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>, EngineError> {
    let sqrt3 = 3f32.sqrt();
    let ones = Tensor::ones(cfg.hidden_size, dtype, device)?;
    let mut w = HashMap::new();
    for (name, dims) in weight_shapes(cfg) {
        let t = match dims.as_slice() {
            [_] => ones.clone(),
            // The embedding's stream is named "embed" (kept for reproducibility).
            [rows, cols] if name == "model.embed_tokens.weight" => {
                uniform(seed, "embed", (*rows, *cols), sqrt3, dtype, device)?
            }
            [rows, cols] => uniform(
                seed,
                &name,
                (*rows, *cols),
                sqrt3 / (*cols as f32).sqrt(),
                dtype,
                device,
            )?,
            _ => {
                return Err(EngineError::BadRequest(format!(
                    "unexpected weight shape {dims:?} for {name}"
                )))
            }
        };
        w.insert(name, t);
    }
    Ok(w)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn random_weights_are_reproducible_and_seed_dependent() {
        let cfg = LlamaConfig::tiny(32);
        let a = random_weights(&cfg, 7, DType::F32, &Device::Cpu).unwrap();
        let b = random_weights(&cfg, 7, DType::F32, &Device::Cpu).unwrap();
        let c = random_weights(&cfg, 8, DType::F32, &Device::Cpu).unwrap();
        let name = "model.layers.1.self_attn.k_proj.weight";
        let v =
            |m: &HashMap<String, Tensor>| m[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(v(&a), v(&b));
        assert_ne!(v(&a), v(&c));
        assert_eq!(a[name].dims(), &[128, 256]);
        // Scale: std close to 1/sqrt(256).
        let x = v(&a);
        let var = x.iter().map(|x| x * x).sum::<f32>() / x.len() as f32;
        assert!(
            (var.sqrt() - 1.0 / 16.0).abs() < 0.005,
            "std {}",
            var.sqrt()
        );
    }

    #[test]
    fn shapes_match_the_random_weights() {
        let mut tied = LlamaConfig::tiny(40);
        tied.tie_word_embeddings = true;
        for cfg in [LlamaConfig::tiny(40), tied, LlamaConfig::preset_1b(1024)] {
            let shapes = weight_shapes(&cfg);
            assert_eq!(
                shapes.iter().any(|(n, _)| n == "lm_head.weight"),
                !cfg.tie_word_embeddings
            );
        }
        let big = weight_shapes(&LlamaConfig::preset_1b(1024));
        assert_eq!(big.len(), 1 + 16 * 9 + 2);
        let k = big
            .iter()
            .find(|(n, _)| n == "model.layers.15.self_attn.k_proj.weight")
            .unwrap();
        assert_eq!(k.1, vec![512, 2048]);
        let cfg = LlamaConfig::tiny(40);
        let w = random_weights(&cfg, 1, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(w.len(), weight_shapes(&cfg).len());
        for (name, dims) in weight_shapes(&cfg) {
            assert_eq!(w[&name].dims(), dims.as_slice(), "{name}");
        }
    }

    #[test]
    fn missing_folder_is_a_clear_error() {
        let err = load_safetensors(Path::new("/nonexistent/warmpath"), &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/warmpath"));
    }
}
