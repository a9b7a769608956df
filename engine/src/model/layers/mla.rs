//! Multi-head latent attention (DeepSeek-V3, Kimi K2).
//!
//! Keys and values are stored in the cache as one compressed latent per
//! position plus a single rotary key shared by all heads, and expanded per
//! head at attention time, as in the reference. That keeps the cache small
//! (the reason MLA exists). Expanding the whole cache for every new token
//! would cost O(context × heads × head size × latent) per layer, so when few
//! queries meet a long cache (decoding) the up-projections are folded into the
//! queries and outputs instead ("weight absorption") and attention runs on the
//! latents directly. Both paths compute the same function; they differ only
//! in rounding.

use candle_core::Tensor;

use super::attention::{attend, masked_softmax, split_last};
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
    /// `kv_b` split per head: keys `[heads, nope, latent]`, values `[heads, v, latent]`.
    pub absorbed: (Tensor, Tensor),
}

/// `kv_b`'s weight split into per-head key and value up-projections.
pub fn split_kv_b(
    kv_b: &Linear,
    heads: usize,
    nope: usize,
    v: usize,
) -> Result<(Tensor, Tensor), ModelError> {
    let w = kv_b.weight();
    let latent = w.dim(1)?;
    let w = w.reshape((heads, nope + v, latent))?;
    Ok((
        w.narrow(1, 0, nope)?.contiguous()?,
        w.narrow(1, nope, v)?.contiguous()?,
    ))
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
        let out = if self.absorption_pays(seq, total) {
            self.attend_absorbed(&q_pass, &q_rot, &latent, &k_rot, start)?
        } else {
            self.attend_expanded(&q_pass, &q_rot, &latent, &k_rot, start)?
        };
        let out = out
            .transpose(0, 1)?
            .reshape((seq, self.heads * self.v_dim))?;
        self.o_proj.forward(&out)
    }

    /// Whether attending on latents costs fewer multiply-adds than expanding
    /// every cached position into per-head keys and values.
    fn absorption_pays(&self, seq: usize, total: usize) -> bool {
        let (l, n, r, v) = (
            self.kv_lora_rank,
            self.qk_nope_dim,
            self.qk_rope_dim,
            self.v_dim,
        );
        let expanded = total * (n + v) * l + seq * total * (n + r + v);
        let absorbed = seq * (n * l + v * l + total * (2 * l + r));
        absorbed < expanded
    }

    fn attend_absorbed(
        &self,
        q_pass: &Tensor,
        q_rot: &Tensor,
        latent: &Tensor,
        k_rot: &Tensor,
        start: usize,
    ) -> Result<Tensor, ModelError> {
        let (w_uk, w_uv) = &self.absorbed;
        let (seq, total) = (q_pass.dim(1)?, latent.dim(1)?);
        let latent = latent.squeeze(0)?;
        let q_latent = q_pass.contiguous()?.matmul(w_uk)?;
        let scores = (q_latent.broadcast_matmul(&latent.t()?)?
            + q_rot
                .contiguous()?
                .broadcast_matmul(&k_rot.squeeze(0)?.t()?)?)?;
        let probs = masked_softmax(&(scores * self.scale)?, seq, start, total, None)?;
        let out_latent = probs.broadcast_matmul(&latent)?;
        Ok(out_latent.matmul(&w_uv.transpose(1, 2)?)?)
    }

    fn attend_expanded(
        &self,
        q_pass: &Tensor,
        q_rot: &Tensor,
        latent: &Tensor,
        k_rot: &Tensor,
        start: usize,
    ) -> Result<Tensor, ModelError> {
        let total = latent.dim(1)?;

        let kv = self
            .kv_b
            .forward(&latent.squeeze(0)?)?
            .reshape((total, self.heads, self.qk_nope_dim + self.v_dim))?
            .transpose(0, 1)?;
        let [k_nope, v] = take2(split_last(&kv, &[self.qk_nope_dim, self.v_dim])?)?;
        let k_rot = k_rot.broadcast_as((self.heads, total, self.qk_rope_dim))?;
        let k = Tensor::cat(&[&k_nope, &k_rot], 2)?;
        let q = Tensor::cat(&[q_pass, q_rot], 2)?;
        attend(&q, &k, &v, self.scale, start, None)
    }
}

fn take2(parts: Vec<Tensor>) -> Result<[Tensor; 2], ModelError> {
    parts
        .try_into()
        .map_err(|_| ModelError::Internal("expected two parts"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::rope::{RopeKind, RopeParams};
    use candle_core::{DType, Device};

    fn random(shape: &[usize], seed: u64) -> Tensor {
        // A small deterministic generator keeps the test free of global RNG state.
        let n: usize = shape.iter().product();
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let values: Vec<f32> = (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn absorbed_and_expanded_attention_agree() {
        let (heads, latent_dim, nope, rope_dim, v) = (3, 10, 6, 4, 5);
        let kv_b = Linear::from_weight(random(&[heads * (nope + v), latent_dim], 1));
        let params = RopeParams {
            theta: 10000.0,
            partial_rotary_factor: 1.0,
            kind: RopeKind::Default,
        };
        let attention = LatentAttention {
            q: QueryProjection::Direct(Linear::from_weight(random(
                &[heads * (nope + rope_dim), 8],
                2,
            ))),
            kv_a: Linear::from_weight(random(&[latent_dim + rope_dim, 8], 3)),
            kv_a_norm: RmsNorm::from_weight(
                Tensor::ones(latent_dim, DType::F32, &Device::Cpu).unwrap(),
                1e-6,
            ),
            absorbed: split_kv_b(&kv_b, heads, nope, v).unwrap(),
            kv_b,
            o_proj: Linear::from_weight(random(&[8, heads * v], 4)),
            heads,
            kv_lora_rank: latent_dim,
            qk_nope_dim: nope,
            qk_rope_dim: rope_dim,
            v_dim: v,
            rope: Rope::new(&params, rope_dim, true),
            scale: 0.3,
        };
        let (seq, total, start) = (3, 7, 4);
        let q_pass = random(&[heads, seq, nope], 5);
        let q_rot = random(&[heads, seq, rope_dim], 6);
        let latent = random(&[1, total, latent_dim], 7);
        let k_rot = random(&[1, total, rope_dim], 8);
        let a = attention
            .attend_absorbed(&q_pass, &q_rot, &latent, &k_rot, start)
            .unwrap();
        let b = attention
            .attend_expanded(&q_pass, &q_rot, &latent, &k_rot, start)
            .unwrap();
        let diff: f32 = (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(diff < 1e-5, "paths differ by {diff}");
        assert!(attention.absorption_pays(1, 4096));
        assert!(!attention.absorption_pays(4096, 4096));
    }
}
