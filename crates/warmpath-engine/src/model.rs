//! A Llama forward pass (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP)
//! that attends over K/V computed earlier, so that only the uncached suffix of
//! a prompt is prefilled and decoding reuses the same path one token at a time.
//! K is stored after RoPE, as vLLM does: a block's K/V depend only on the
//! tokens before and in it and on its absolute positions, which is exactly
//! what the chained block hash captures.

use crate::config::LlamaConfig;
use crate::kv::{KvState, LayerKv};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear, VarBuilder};

struct Block {
    attn_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    mlp_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

pub struct Llama {
    cfg: LlamaConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    device: Device,
    dtype: DType,
}

impl std::fmt::Debug for Llama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama")
            .field("cfg", &self.cfg)
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

impl Llama {
    /// Builds the model from Hugging Face tensor names under `vb`.
    pub fn load(vb: VarBuilder<'_>, cfg: &LlamaConfig) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (nh, nkv) = (cfg.num_attention_heads, cfg.kv_heads());
        let embed = candle_nn::embedding(cfg.vocab_size, h, vb.pp("model.embed_tokens"))?;
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = vb.pp(format!("model.layers.{i}"));
            let lin = |i: usize, o: usize, name: &str| candle_nn::linear_no_bias(i, o, l.pp(name));
            blocks.push(Block {
                attn_norm: l.pp("input_layernorm").get(h, "weight")?,
                q: lin(h, nh * hd, "self_attn.q_proj")?,
                k: lin(h, nkv * hd, "self_attn.k_proj")?,
                v: lin(h, nkv * hd, "self_attn.v_proj")?,
                o: lin(nh * hd, h, "self_attn.o_proj")?,
                mlp_norm: l.pp("post_attention_layernorm").get(h, "weight")?,
                gate: lin(h, cfg.intermediate_size, "mlp.gate_proj")?,
                up: lin(h, cfg.intermediate_size, "mlp.up_proj")?,
                down: lin(cfg.intermediate_size, h, "mlp.down_proj")?,
            });
        }
        let norm = vb.pp("model.norm").get(h, "weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(embed.embeddings().clone(), None)
        } else {
            candle_nn::linear_no_bias(h, cfg.vocab_size, vb.pp("lm_head"))?
        };
        let inv_freq = cfg.inv_freq();
        let half = inv_freq.len();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), vb.device())?;
        let pos = Tensor::arange(0u32, cfg.max_position_embeddings as u32, vb.device())?
            .to_dtype(DType::F32)?
            .reshape((cfg.max_position_embeddings, 1))?;
        let freqs = pos.matmul(&inv_freq)?;
        Ok(Llama {
            cfg: cfg.clone(),
            embed,
            blocks,
            norm,
            lm_head,
            cos: freqs.cos()?.to_dtype(vb.dtype())?,
            sin: freqs.sin()?.to_dtype(vb.dtype())?,
            device: vb.device().clone(),
            dtype: vb.dtype(),
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Runs `tokens` at positions `past.len()..` over `past` (the K/V of the
    /// positions before). Returns the last position's logits (f32, `[vocab]`)
    /// and the new tokens' K/V.
    pub fn forward(&self, tokens: &[u32], past: &KvState) -> Result<(Tensor, KvState)> {
        let t = tokens.len();
        if t == 0 {
            candle_core::bail!("forward needs at least one token");
        }
        let p0 = past.len();
        if p0 + t > self.cfg.max_position_embeddings {
            candle_core::bail!(
                "positions up to {} exceed max_position_embeddings {}",
                p0 + t,
                self.cfg.max_position_embeddings
            );
        }
        let ids = Tensor::new(tokens, &self.device)?.unsqueeze(0)?;
        let mut x = self.embed.forward(&ids)?;
        let cos = self.cos.narrow(0, p0, t)?;
        let sin = self.sin.narrow(0, p0, t)?;
        let mask = causal_mask(t, p0, &self.device, self.dtype)?;
        let eps = self.cfg.rms_norm_eps as f32;
        let mut new_layers = Vec::with_capacity(self.blocks.len());
        for (i, b) in self.blocks.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &b.attn_norm, eps)?;
            let (attn, kv) = self.attention(b, &h, past.layer(i), &cos, &sin, mask.as_ref())?;
            x = (x + attn)?;
            let h = candle_nn::ops::rms_norm(&x, &b.mlp_norm, eps)?;
            let mlp = (b.gate.forward(&h)?.silu()? * b.up.forward(&h)?)?;
            x = (x + b.down.forward(&mlp)?)?;
            new_layers.push(kv);
        }
        let last = x.narrow(1, t - 1, 1)?;
        let last = candle_nn::ops::rms_norm(&last, &self.norm, eps)?;
        let logits = self
            .lm_head
            .forward(&last)?
            .flatten_all()?
            .to_dtype(DType::F32)?;
        Ok((logits, KvState::from_layers(new_layers, t)))
    }

    fn attention(
        &self,
        b: &Block,
        x: &Tensor,
        past: Option<&LayerKv>,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<(Tensor, LayerKv)> {
        let (_, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.kv_heads(),
            self.cfg.head_dim(),
        );
        let heads = |y: Tensor, n: usize| -> Result<Tensor> {
            y.reshape((1, t, n, hd))?.transpose(1, 2)?.contiguous()
        };
        let q = heads(b.q.forward(x)?, nh)?;
        let k = heads(b.k.forward(x)?, nkv)?;
        let v = heads(b.v.forward(x)?, nkv)?;
        let q = candle_nn::rotary_emb::rope(&q, cos, sin)?;
        let k = candle_nn::rotary_emb::rope(&k, cos, sin)?;
        let (k_all, v_all) = match past {
            Some(p) => (Tensor::cat(&[&p.k, &k], 2)?, Tensor::cat(&[&p.v, &v], 2)?),
            None => (k.clone(), v.clone()),
        };
        let k_all = repeat_kv(k_all, nh / nkv)?;
        let v_all = repeat_kv(v_all, nh / nkv)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let att = (q.matmul(&k_all.t()?)? * scale)?;
        let att = match mask {
            Some(m) => att.broadcast_add(m)?,
            None => att,
        };
        let att =
            candle_nn::ops::softmax_last_dim(&att.to_dtype(DType::F32)?)?.to_dtype(self.dtype)?;
        let y = att.matmul(&v_all.contiguous()?)?;
        let y = y.transpose(1, 2)?.reshape((1, t, nh * hd))?;
        Ok((b.o.forward(&y)?, LayerKv { k, v }))
    }
}

/// `[t, p0 + t]`: 0 where query `i` (at position `p0 + i`) may see key `j`,
/// -inf after. Built on the model's device (no host loop or upload per chunk).
fn causal_mask(t: usize, p0: usize, device: &Device, dtype: DType) -> Result<Option<Tensor>> {
    if t == 1 {
        return Ok(None);
    }
    let s = p0 + t;
    let queries = Tensor::arange(p0 as u32, s as u32, device)?.reshape((t, 1))?;
    let keys = Tensor::arange(0u32, s as u32, device)?.reshape((1, s))?;
    let future = keys.broadcast_gt(&queries)?;
    let blocked = Tensor::full(f32::NEG_INFINITY, (t, s), device)?.to_dtype(dtype)?;
    let open = Tensor::zeros((t, s), dtype, device)?;
    Ok(Some(future.where_cond(&blocked, &open)?))
}

/// `[1, kv_heads, s, d]` -> `[1, kv_heads * rep, s, d]`, each KV head serving
/// `rep` consecutive query heads (as Hugging Face's `repeat_kv`).
fn repeat_kv(x: Tensor, rep: usize) -> Result<Tensor> {
    if rep == 1 {
        return Ok(x);
    }
    let (b, n, s, d) = x.dims4()?;
    x.unsqueeze(2)?
        .expand((b, n, rep, s, d))?
        .reshape((b, n * rep, s, d))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn causal_mask_hides_exactly_the_future() {
        assert!(causal_mask(1, 5, &Device::Cpu, DType::F32)
            .unwrap()
            .is_none());
        let m = causal_mask(3, 2, &Device::Cpu, DType::F32)
            .unwrap()
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(
            m,
            vec![
                vec![0.0, 0.0, 0.0, inf, inf],
                vec![0.0, 0.0, 0.0, 0.0, inf],
                vec![0.0, 0.0, 0.0, 0.0, 0.0],
            ]
        );
    }
}
