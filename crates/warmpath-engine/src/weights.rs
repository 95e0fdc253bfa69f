//! Where a model's weights come from: safetensors files in a model folder, or
//! deterministic random values (`--tiny`, or any shape for GPU benchmarks).

use crate::config::LlamaConfig;
use crate::error::EngineError;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// Reads every `*.safetensors` file of `dir` (no memory mapping: the crate
/// forbids `unsafe`) into one name -> tensor map.
pub fn load_safetensors(
    dir: &Path,
    device: &Device,
) -> Result<HashMap<String, Tensor>, EngineError> {
    let read = std::fs::read_dir(dir).map_err(|source| EngineError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<_> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(EngineError::BadModel {
            path: dir.to_owned(),
            reason: "no *.safetensors file".into(),
        });
    }
    let mut all = HashMap::new();
    for f in files {
        let tensors =
            candle_core::safetensors::load(&f, device).map_err(|e| EngineError::BadModel {
                path: f.clone(),
                reason: e.to_string(),
            })?;
        all.extend(tensors);
    }
    Ok(all)
}

/// SplitMix64: a tiny, well-mixed, reproducible generator.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

fn uniform(
    seed: u64,
    name: &str,
    shape: (usize, usize),
    scale: f32,
    dtype: DType,
    device: &Device,
) -> Result<Tensor, EngineError> {
    let mut rng = SplitMix(seed ^ fnv1a(name));
    let data: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.unit() * scale).collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?)
}

fn fnv1a(name: &str) -> u64 {
    // FNV-1a: enough to give every tensor its own stream.
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Random Llama weights for `cfg`, fully determined by `seed`: linear layers
/// uniform with standard deviation `1/sqrt(fan_in)`, embeddings with standard
/// deviation 1, norms 1. Names follow Hugging Face's Llama checkpoints.
pub fn random_weights(
    cfg: &LlamaConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>, EngineError> {
    let (h, hd, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.kv_heads());
    let sqrt3 = 3f32.sqrt();
    let mut w = HashMap::new();
    let lin = |w: &mut HashMap<String, Tensor>, name: String, out: usize, inp: usize| {
        let t = uniform(
            seed,
            &name,
            (out, inp),
            sqrt3 / (inp as f32).sqrt(),
            dtype,
            device,
        )?;
        w.insert(name, t);
        Ok::<_, EngineError>(())
    };
    let ones = Tensor::ones(h, dtype, device)?;
    w.insert(
        "model.embed_tokens.weight".into(),
        uniform(seed, "embed", (cfg.vocab_size, h), sqrt3, dtype, device)?,
    );
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        lin(&mut w, format!("{p}.self_attn.q_proj.weight"), nh * hd, h)?;
        lin(&mut w, format!("{p}.self_attn.k_proj.weight"), nkv * hd, h)?;
        lin(&mut w, format!("{p}.self_attn.v_proj.weight"), nkv * hd, h)?;
        lin(&mut w, format!("{p}.self_attn.o_proj.weight"), h, nh * hd)?;
        lin(&mut w, format!("{p}.mlp.gate_proj.weight"), i, h)?;
        lin(&mut w, format!("{p}.mlp.up_proj.weight"), i, h)?;
        lin(&mut w, format!("{p}.mlp.down_proj.weight"), h, i)?;
        w.insert(format!("{p}.input_layernorm.weight"), ones.clone());
        w.insert(format!("{p}.post_attention_layernorm.weight"), ones.clone());
    }
    w.insert("model.norm.weight".into(), ones);
    if !cfg.tie_word_embeddings {
        lin(&mut w, "lm_head.weight".into(), cfg.vocab_size, h)?;
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
    fn missing_folder_is_a_clear_error() {
        let err = load_safetensors(Path::new("/nonexistent/warmpath"), &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/warmpath"));
    }
}
