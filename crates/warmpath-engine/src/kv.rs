//! K/V state: every layer's keys and values for a run of consecutive positions.
//! A request's past is assembled from cached blocks, grown by prefill chunks and
//! decode steps, and cut back into blocks for the prefix cache.

use candle_core::{Result, Tensor};

/// One layer's keys and values, each `[1, kv_heads, len, head_dim]` (K after RoPE).
#[derive(Clone, Debug)]
pub struct LayerKv {
    pub k: Tensor,
    pub v: Tensor,
}

/// K/V of every layer for `len` consecutive positions (empty: no layers, len 0).
#[derive(Clone, Debug, Default)]
pub struct KvState {
    layers: Vec<LayerKv>,
    len: usize,
}

impl KvState {
    pub fn from_layers(layers: Vec<LayerKv>, len: usize) -> Self {
        KvState { layers, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Layer `i`'s K/V, `None` when empty.
    pub fn layer(&self, i: usize) -> Option<&LayerKv> {
        self.layers.get(i)
    }

    /// `parts` one after the other (positions add up).
    pub fn concat(parts: &[&KvState]) -> Result<KvState> {
        let parts: Vec<&KvState> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
        match parts.as_slice() {
            [] => return Ok(KvState::default()),
            [one] => return Ok((*one).clone()),
            _ => {}
        }
        let n_layers = parts[0].layers.len();
        let mut layers = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            let ks: Vec<&Tensor> = parts.iter().map(|p| &p.layers[i].k).collect();
            let vs: Vec<&Tensor> = parts.iter().map(|p| &p.layers[i].v).collect();
            layers.push(LayerKv {
                k: Tensor::cat(&ks, 2)?,
                v: Tensor::cat(&vs, 2)?,
            });
        }
        Ok(KvState {
            layers,
            len: parts.iter().map(|p| p.len).sum(),
        })
    }

    /// Positions `start..start + len` as an independent copy (a cached block
    /// must not keep a whole request's tensors alive).
    pub fn slice_copy(&self, start: usize, len: usize) -> Result<KvState> {
        if start + len > self.len {
            candle_core::bail!("slice {start}+{len} beyond {} positions", self.len);
        }
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(LayerKv {
                    k: l.k.narrow(2, start, len)?.copy()?,
                    v: l.v.narrow(2, start, len)?.copy()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvState { layers, len })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn state(start: f32, len: usize) -> KvState {
        let mk = |off: f32| {
            let data: Vec<f32> = (0..len * 2).map(|i| start + off + i as f32).collect();
            Tensor::from_vec(data, (1, 1, len, 2), &Device::Cpu).unwrap()
        };
        KvState::from_layers(
            vec![LayerKv {
                k: mk(0.0),
                v: mk(1000.0),
            }],
            len,
        )
    }

    #[test]
    fn concat_then_slice_round_trips() {
        let a = state(0.0, 3);
        let b = state(100.0, 2);
        let ab = KvState::concat(&[&a, &KvState::default(), &b]).unwrap();
        assert_eq!(ab.len(), 5);
        let back = ab.slice_copy(3, 2).unwrap();
        let l = back.layer(0).unwrap();
        assert_eq!(
            l.k.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![100.0, 101.0, 102.0, 103.0]
        );
        assert_eq!(back.len(), 2);
        assert!(ab.slice_copy(4, 2).is_err());
        assert!(KvState::concat(&[]).unwrap().is_empty());
    }
}
