//! Grouped-query attention (Qwen3-MoE, Mixtral) and the scaled-dot-product
//! core shared with multi-head latent attention.

use candle_core::{D, Device, Tensor};

use super::{Linear, RmsNorm, rope::Rope};
use crate::model::{ModelError, kv_cache::KvCache};
use crate::weights::Weights;

/// Softmax(q·kᵀ·scale + mask)·v over `[heads, seq, dim]` tensors. Keys and
/// values with fewer heads than the queries are shared by consecutive query
/// heads (grouped-query attention).
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    start: usize,
    window: Option<usize>,
) -> Result<Tensor, ModelError> {
    let (heads, seq, _) = q.dims3()?;
    let kv_heads = k.dim(0)?;
    let total = k.dim(1)?;
    let (k, v) = if kv_heads == heads {
        (k.clone(), v.clone())
    } else {
        (
            repeat_heads(k, heads / kv_heads)?,
            repeat_heads(v, heads / kv_heads)?,
        )
    };
    let scores = (q.contiguous()?.matmul(&k.t()?.contiguous()?)? * scale)?;
    let probs = masked_softmax(&scores, seq, start, total, window)?;
    Ok(probs.matmul(&v.contiguous()?)?)
}

/// Causal (and optionally windowed) softmax over scores `[heads, seq, total]`.
pub fn masked_softmax(
    scores: &Tensor,
    seq: usize,
    start: usize,
    total: usize,
    window: Option<usize>,
) -> Result<Tensor, ModelError> {
    let scores = match causal_mask(seq, start, total, window)? {
        Some(mask) => scores.broadcast_add(&mask)?,
        None => scores.clone(),
    };
    Ok(candle_nn::ops::softmax_last_dim(&scores)?)
}

fn repeat_heads(x: &Tensor, times: usize) -> Result<Tensor, ModelError> {
    let (h, t, d) = x.dims3()?;
    Ok(x.unsqueeze(1)?
        .expand((h, times, t, d))?
        .reshape((h * times, t, d))?)
}

/// Additive mask `[seq, total]` for queries at positions `start..start+seq`
/// over keys `0..total`; `None` when nothing is masked. A window of `w` lets a
/// query see the `w` most recent positions, itself included.
fn causal_mask(
    seq: usize,
    start: usize,
    total: usize,
    window: Option<usize>,
) -> Result<Option<Tensor>, ModelError> {
    let visible = |q: usize, k: usize| k <= q && window.is_none_or(|w| k + w > q);
    let all_visible = (start..start + seq).all(|q| (0..total).all(|k| visible(q, k)));
    if all_visible {
        return Ok(None);
    }
    let mut mask = Vec::with_capacity(seq * total);
    for q in start..start + seq {
        mask.extend((0..total).map(|k| {
            if visible(q, k) {
                0.0f32
            } else {
                f32::NEG_INFINITY
            }
        }));
    }
    Ok(Some(Tensor::from_vec(mask, (seq, total), &Device::Cpu)?))
}

/// Multi-head attention with fewer key/value heads than query heads.
pub struct GroupedQueryAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    /// Per-head RMSNorm on queries and keys before rope (Qwen3).
    pub qk_norm: Option<(RmsNorm, RmsNorm)>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope: Rope,
    pub window: Option<usize>,
}

/// Shape of a grouped-query attention layer, as read from a config.
#[derive(Debug, Clone, Copy)]
pub struct GqaShape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub bias: bool,
    /// Epsilon of the per-head q/k norms, for architectures that have them.
    pub qk_norm_eps: Option<f64>,
    pub window: Option<usize>,
}

impl GroupedQueryAttention {
    /// Loads `{q,k,v,o}_proj` (and `{q,k}_norm`) under `w`.
    pub fn load(w: &Weights, s: GqaShape, rope: &Rope) -> Result<Self, ModelError> {
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let qk_norm = match s.qk_norm_eps {
            Some(eps) => Some((
                RmsNorm::load(w, "q_norm", s.head_dim, eps)?,
                RmsNorm::load(w, "k_norm", s.head_dim, eps)?,
            )),
            None => None,
        };
        Ok(Self {
            q_proj: Linear::load(w, "q_proj", s.hidden, q_out, s.bias)?,
            k_proj: Linear::load(w, "k_proj", s.hidden, kv_out, s.bias)?,
            v_proj: Linear::load(w, "v_proj", s.hidden, kv_out, s.bias)?,
            o_proj: Linear::load(w, "o_proj", q_out, s.hidden, s.bias)?,
            qk_norm,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            rope: rope.clone(),
            window: s.window,
        })
    }

    pub fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        cache: &mut KvCache,
        tables: &(Tensor, Tensor),
    ) -> Result<Tensor, ModelError> {
        let seq = x.dim(0)?;
        let start = cache.len();
        let split = |t: Tensor, heads: usize| t.reshape((seq, heads, self.head_dim));
        let mut q = split(self.q_proj.forward(x)?, self.heads)?;
        let mut k = split(self.k_proj.forward(x)?, self.kv_heads)?;
        let v = split(self.v_proj.forward(x)?, self.kv_heads)?;
        if let Some((qn, kn)) = &self.qk_norm {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let q = self.rope.apply(&q.transpose(0, 1)?, &tables.0, &tables.1)?;
        let k = self.rope.apply(&k.transpose(0, 1)?, &tables.0, &tables.1)?;
        let v = v.transpose(0, 1)?.contiguous()?;
        let (k, v) = cache.append(layer, &k, &v)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let out = attend(&q, &k, &v, scale, start, self.window)?;
        let out = out
            .transpose(0, 1)?
            .reshape((seq, self.heads * self.head_dim))?;
        self.o_proj.forward(&out)
    }
}

/// Splits the last dimension of `x` into consecutive parts of the given sizes.
pub fn split_last(x: &Tensor, sizes: &[usize]) -> Result<Vec<Tensor>, ModelError> {
    let mut parts = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for &s in sizes {
        parts.push(x.narrow(D::Minus1, at, s)?);
        at += s;
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_is_skipped_for_a_single_decode_step() {
        assert!(causal_mask(1, 5, 6, None).unwrap().is_none());
    }

    #[test]
    fn sliding_window_hides_old_positions() {
        let m = causal_mask(1, 5, 6, Some(2)).unwrap().unwrap();
        let row: Vec<f32> = m.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(row[..4], [f32::NEG_INFINITY; 4]);
        assert_eq!(row[4..], [0.0, 0.0]);
    }
}
