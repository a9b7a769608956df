//! Multi-head latent attention (DeepSeek-V3, Kimi K2).
//!
//! Keys and values are stored in the cache as one compressed latent per
//! position plus a single rotary key shared by all heads, and expanded per
//! head at attention time, as in the reference. That keeps the cache small
//! (the reason MLA exists) at the cost of re-expanding it every step.

use candle_core::Tensor;

use super::attention::{attend, split_last};
use super::{Linear, RmsNorm, rope::Rope};
use crate::model::{ModelError, kv_cache::KvCache};

/// The query path: one projection, or a low-rank pair with a norm between.
pub enum QueryProjection {
    Direct(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

pub struct LatentAttention {
    pub q: QueryProjection,
    pub kv_a: Linear,
    pub kv_a_norm: RmsNorm,
    pub kv_b: Linear,
    pub o_proj: Linear,
    pub heads: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_dim: usize,
    pub qk_rope_dim: usize,
    pub v_dim: usize,
    pub rope: Rope,
    pub scale: f64,
}

impl LatentAttention {
    pub fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        cache: &mut KvCache,
        tables: &(Tensor, Tensor),
    ) -> Result<Tensor, ModelError> {
        let seq = x.dim(0)?;
        let start = cache.len();
        let q = match &self.q {
            QueryProjection::Direct(p) => p.forward(x)?,
            QueryProjection::LowRank { a, norm, b } => b.forward(&norm.forward(&a.forward(x)?)?)?,
        };
        let q = q
            .reshape((seq, self.heads, self.qk_nope_dim + self.qk_rope_dim))?
            .transpose(0, 1)?;
        let [q_pass, q_rot] = take2(split_last(&q, &[self.qk_nope_dim, self.qk_rope_dim])?)?;

        let compressed = self.kv_a.forward(x)?;
        let [latent, k_rot] = take2(split_last(
            &compressed,
            &[self.kv_lora_rank, self.qk_rope_dim],
        )?)?;
        let latent = self.kv_a_norm.forward(&latent)?.unsqueeze(0)?;
        let k_rot = k_rot.unsqueeze(0)?;

        let q_rot = self.rope.apply(&q_rot, &tables.0, &tables.1)?;
        let k_rot = self.rope.apply(&k_rot, &tables.0, &tables.1)?;
        let (latent, k_rot) = cache.append(layer, &latent, &k_rot)?;
        let total = latent.dim(1)?;

        let kv = self
            .kv_b
            .forward(&latent.squeeze(0)?)?
            .reshape((total, self.heads, self.qk_nope_dim + self.v_dim))?
            .transpose(0, 1)?;
        let [k_nope, v] = take2(split_last(&kv, &[self.qk_nope_dim, self.v_dim])?)?;
        let k_rot = k_rot.broadcast_as((self.heads, total, self.qk_rope_dim))?;
        let k = Tensor::cat(&[&k_nope, &k_rot], 2)?;
        let q = Tensor::cat(&[&q_pass, &q_rot], 2)?;

        let out = attend(&q, &k, &v, self.scale, start, None)?;
        let out = out
            .transpose(0, 1)?
            .reshape((seq, self.heads * self.v_dim))?;
        self.o_proj.forward(&out)
    }
}

fn take2(parts: Vec<Tensor>) -> Result<[Tensor; 2], ModelError> {
    parts
        .try_into()
        .map_err(|_| ModelError::Internal("expected two parts"))
}
