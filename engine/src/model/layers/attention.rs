//! Grouped-query attention (Qwen3-MoE, Mixtral) and the scaled-dot-product
//! core shared with multi-head latent attention.

use candle_core::{D, Device, Tensor};

use super::{Linear, RmsNorm, rope::Rope, values};
use crate::kernels::ops::{self, AttentionShape};
use crate::model::{ModelError, kv_cache::KvCache};
use crate::weights::Weights;

/// Softmax(q·kᵀ·scale + causal mask)·v over `[heads, seq, dim]` queries and
/// `[kv_heads, total, _]` keys and values. Keys and values with fewer heads
/// than the queries are shared by consecutive query heads (grouped-query
/// attention). Each query row is computed on its own (see [`ops::attention`]).
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    start: usize,
    window: Option<usize>,
) -> Result<Tensor, ModelError> {
    let (heads, seq, dim) = q.dims3()?;
    let (kv_heads, total, _) = k.dims3()?;
    let value_dim = v.dim(2)?;
    let shape = AttentionShape {
        heads,
        kv_heads,
        seq,
        total,
        dim,
        value_dim,
        start,
        window,
    };
    let out = ops::attention(&values(q)?, &values(k)?, &values(v)?, &shape, scale as f32);
    Ok(Tensor::from_vec(
        out,
        (heads, seq, value_dim),
        &Device::Cpu,
    )?)
}

/// Multi-head attention with fewer key/value heads than query heads.
pub struct GroupedQueryAttention {
    /// The query, key and value projections stacked into one product.
    pub qkv_proj: Linear,
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
            qkv_proj: Linear::stack(&[
                Linear::load(w, "q_proj", s.hidden, q_out, s.bias)?,
                Linear::load(w, "k_proj", s.hidden, kv_out, s.bias)?,
                Linear::load(w, "v_proj", s.hidden, kv_out, s.bias)?,
            ])?,
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
        let (q_out, kv_out) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let qkv = self.qkv_proj.forward(x)?;
        let mut q = split(qkv.narrow(1, 0, q_out)?, self.heads)?;
        let mut k = split(qkv.narrow(1, q_out, kv_out)?, self.kv_heads)?;
        let v = split(qkv.narrow(1, q_out + kv_out, kv_out)?, self.kv_heads)?;
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
