//! Multi-head latent attention (DeepSeek-V3, Kimi K2).
//!
//! Keys and values are stored in the cache as one compressed latent per
//! position plus a single rotary key shared by all heads (the reason MLA
//! exists: a small cache). Attention always runs on the latents, with the
//! key and value up-projections folded into the queries and outputs ("weight
//! absorption"): expanding the cache into per-head keys costs
//! O(context × heads × head size × latent) for every new token, and one path
//! for every batch size keeps a row's result independent of the rows computed
//! with it (a prompt fed in one pass and token by token agree bitwise).

use candle_core::Tensor;

use super::attention::{AttentionPart, part_rows, project_output};
use super::indexer::Indexer;
use super::rope::Rope;
use super::{Linear, RmsNorm, values};
use crate::kernels::Matrix;
use crate::kernels::ops::{LatentShape, latent_attention};
use crate::model::ModelError;
use crate::weights::Weights;

/// The query path: one projection, or a low-rank pair with a norm between.
pub enum QueryProjection {
    Direct(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

/// One head's slices of `kv_b`: key up-projection `[nope, latent]` and value
/// up-projection `[v, latent]`, sharing `kv_b`'s storage.
pub struct HeadProjections {
    pub key: KeyProjection,
    pub value: Matrix,
}

/// One head's latent-to-key projection, as the weights store it.
pub enum KeyProjection {
    /// `[nope, latent]`, a slice of `kv_b_proj` (the reference's layout):
    /// a query is carried into the latent space by `q · W`.
    Rows(Matrix),
    /// `[latent, nope]`, as llama.cpp's converter stores it (`attn_k_b`):
    /// the same product, as `W · q`.
    Transposed(Matrix),
}

impl KeyProjection {
    /// `seq` queries (`[seq, nope]`) in the latent space (`[seq, latent]`).
    fn to_latent(&self, q: &[f32], seq: usize) -> Result<Vec<f32>, ModelError> {
        Ok(match self {
            KeyProjection::Rows(m) => m.vecmat(q, seq)?,
            KeyProjection::Transposed(m) => m.matmul(q, seq)?,
        })
    }
}

/// One sequence's rows of a pass's input and projections; its queries are
/// its own copy, which rope turns.
struct Projected<'a> {
    xs: &'a [f32],
    q_resid: Option<&'a [f32]>,
    q: Vec<f32>,
    compressed: &'a [f32],
}

/// Where a sparse-attention layer's choice of positions comes from.
pub enum SparseKeys {
    /// The layer's own indexer.
    Own(Box<Indexer>),
    /// The choice of the last layer before it with its own indexer, in the
    /// same pass (GLM-5's "shared" layers).
    Shared,
}

pub struct LatentAttention {
    pub q: QueryProjection,
    pub kv_a: Linear,
    pub kv_a_norm: RmsNorm,
    pub o_proj: Linear,
    pub heads: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_dim: usize,
    pub qk_rope_dim: usize,
    pub v_dim: usize,
    pub rope: Rope,
    pub scale: f64,
    /// `kv_b` split per head.
    pub absorbed: Vec<HeadProjections>,
    /// Sparse attention (DSA): each query reads only the positions chosen.
    pub sparse: Option<SparseKeys>,
    /// A sigmoid gate per head on the output, from `g_proj` (Ling 3).
    pub head_gate: Option<Linear>,
}

/// Sizes of a latent-attention layer, as read from a config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaShape {
    pub hidden: usize,
    pub heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    /// Per-head query/key width without rotary, with rotary, and value width.
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub bias: bool,
    pub eps: f64,
}

impl LatentAttention {
    /// Loads `q_proj` (or `q_a_proj`, `q_a_layernorm`, `q_b_proj`),
    /// `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj` (or its GGUF
    /// halves) and `o_proj` under `w`.
    pub fn load(w: &Weights, s: &MlaShape, rope: &Rope, scale: f64) -> Result<Self, ModelError> {
        let h = s.hidden;
        let qk_head = s.nope + s.rope;
        let q = match s.q_lora_rank {
            None => {
                QueryProjection::Direct(Linear::load(w, "q_proj", h, s.heads * qk_head, false)?)
            }
            Some(rank) => QueryProjection::LowRank {
                a: Linear::load(w, "q_a_proj", h, rank, s.bias)?,
                norm: RmsNorm::load(w, "q_a_layernorm", rank, s.eps)?,
                b: Linear::load(w, "q_b_proj", rank, s.heads * qk_head, false)?,
            },
        };
        Ok(LatentAttention {
            absorbed: load_kv_b(s, w)?,
            q,
            kv_a: Linear::load(w, "kv_a_proj_with_mqa", h, s.kv_lora_rank + s.rope, s.bias)?,
            kv_a_norm: RmsNorm::load(w, "kv_a_layernorm", s.kv_lora_rank, s.eps)?,
            o_proj: Linear::load(w, "o_proj", s.heads * s.v, h, s.bias)?,
            heads: s.heads,
            kv_lora_rank: s.kv_lora_rank,
            qk_nope_dim: s.nope,
            qk_rope_dim: s.rope,
            v_dim: s.v,
            rope: rope.clone(),
            scale,
            sparse: None,
            head_gate: None,
        })
    }
}

/// Each head's key and value projections out of the latent: `kv_b_proj` as
/// the reference stores it, or its two halves as a GGUF does (`k_b_proj`
/// per head `[latent, nope]`, `v_b_proj` per head `[v, latent]`).
fn load_kv_b(s: &MlaShape, w: &Weights) -> Result<Vec<HeadProjections>, ModelError> {
    let (nope, v, lat) = (s.nope, s.v, s.kv_lora_rank);
    if !w.has("kv_b_proj.weight") && w.has("k_b_proj.weight") {
        let keys = w.matrix_stack("k_b_proj.weight", s.heads, lat, nope)?;
        let values = w.matrix_stack("v_b_proj.weight", s.heads, v, lat)?;
        return Ok(keys
            .into_iter()
            .zip(values)
            .map(|(k, value)| HeadProjections {
                key: KeyProjection::Transposed(k),
                value,
            })
            .collect());
    }
    let kv_b = Linear::load(w, "kv_b_proj", lat, s.heads * (nope + v), false)?;
    split_kv_b(&kv_b, s.heads, nope, v)
}

/// `kv_b`'s weight (`[heads × (nope + v), latent]`) split per head.
pub fn split_kv_b(
    kv_b: &Linear,
    heads: usize,
    nope: usize,
    v: usize,
) -> Result<Vec<HeadProjections>, ModelError> {
    let w = kv_b.weight();
    (0..heads)
        .map(|h| {
            Ok(HeadProjections {
                key: KeyProjection::Rows(w.row_range(h * (nope + v), nope)?),
                value: w.row_range(h * (nope + v) + nope, v)?,
            })
        })
        .collect()
}

impl LatentAttention {
    /// Attention of every part's rows after what its cache holds, the parts'
    /// rows one after another in `x`. The projections run once over all the
    /// rows (each weight read once for every sequence of a pass, and the
    /// kernels give a row the same bits whatever rows run with it); the
    /// attention itself runs part by part on its own cache.
    pub fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        parts: &mut [AttentionPart<'_>],
    ) -> Result<Tensor, ModelError> {
        let seq = x.dim(0)?;
        let xs = values(x)?;
        let (q_resid, q) = match &self.q {
            QueryProjection::Direct(p) => (None, p.forward_values(&xs, seq)?),
            QueryProjection::LowRank { a, norm, b } => {
                let resid = norm.forward_values(&a.forward_values(&xs, seq)?);
                let q = b.forward_values(&resid, seq)?;
                (Some(resid), q)
            }
        };
        let compressed = self.kv_a.forward_values(&xs, seq)?;
        let mut out = Vec::with_capacity(seq * self.heads * self.v_dim);
        let mut at = 0;
        for part in parts.iter_mut() {
            let span = at..at + part.rows;
            let rows = |v| part_rows(v, seq, span.clone());
            let projected = Projected {
                xs: rows(&xs)?,
                q_resid: q_resid.as_deref().map(rows).transpose()?,
                q: rows(&q)?.to_vec(),
                compressed: rows(&compressed)?,
            };
            out.extend(self.attend_part(projected, part.rows, layer, part)?);
            at = span.end;
        }
        let width = self.heads * self.v_dim;
        project_output(out, width, self.head_gate.as_ref(), &self.o_proj, &xs, seq)
    }

    /// One sequence's `seq` projected rows attended after what its cache
    /// holds: `[seq, heads × v]`.
    fn attend_part(
        &self,
        projected: Projected<'_>,
        seq: usize,
        layer: usize,
        part: &mut AttentionPart<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        let Projected {
            xs,
            q_resid,
            mut q,
            compressed,
        } = projected;
        let (cache, tables) = (&mut *part.cache, part.tables);
        let start = cache.len();
        let (nope, rope, lat) = (self.qk_nope_dim, self.qk_rope_dim, self.kv_lora_rank);
        let qk = nope + rope;
        let selection = match &self.sparse {
            None => None,
            Some(SparseKeys::Own(indexer)) => {
                let resid = q_resid.ok_or(ModelError::Internal(
                    "sparse attention needs a low-rank query",
                ))?;
                *part.chosen = Some(indexer.select(xs, resid, seq, cache, tables)?);
                part.chosen.as_ref()
            }
            Some(SparseKeys::Shared) => Some(part.chosen.as_ref().ok_or(ModelError::Internal(
                "a shared sparse-attention layer before any indexer",
            ))?),
        };
        // `[seq][heads][nope + rope]`: the rotary part of every head turns.
        self.rope.rotate(&mut q, self.heads, qk, nope, tables)?;
        let (mut latent, mut k_rot) = (
            Vec::with_capacity(seq * lat),
            Vec::with_capacity(seq * rope),
        );
        for row in compressed.chunks_exact(lat + rope) {
            latent.extend_from_slice(&row[..lat]);
            k_rot.extend_from_slice(&row[lat..]);
        }
        let latent = self.kv_a_norm.forward_values(&latent);
        self.rope.rotate(&mut k_rot, 1, rope, 0, tables)?;
        let (latents, k_rots) = cache.append(layer, &latent, lat, &k_rot, rope)?;
        let (mut q_pass, mut q_rot) = (
            vec![0f32; self.heads * seq * nope],
            vec![0f32; self.heads * seq * rope],
        );
        for (row, src) in q.chunks_exact(qk).enumerate() {
            let (i, h) = (row / self.heads, row % self.heads);
            let at = h * seq + i;
            q_pass[at * nope..(at + 1) * nope].copy_from_slice(&src[..nope]);
            q_rot[at * rope..(at + 1) * rope].copy_from_slice(&src[nope..]);
        }
        self.attend(
            &q_pass,
            &q_rot,
            latents,
            k_rots,
            start,
            selection.map(Vec::as_slice),
        )
    }

    /// Attention of `[heads, seq, nope]` / `[heads, seq, rope]` queries on
    /// `[total, latent]` latents and `[total, rope]` rotary keys; output
    /// `[seq, heads × v]`.
    fn attend(
        &self,
        q_pass: &[f32],
        q_rot: &[f32],
        latent: &[f32],
        k_rot: &[f32],
        start: usize,
        selected: Option<&[Vec<usize>]>,
    ) -> Result<Vec<f32>, ModelError> {
        let (nope, l, v) = (self.qk_nope_dim, self.kv_lora_rank, self.v_dim);
        let seq = q_pass.len() / (self.heads * nope).max(1);
        let mut q_latent = Vec::with_capacity(self.heads * seq * l);
        for (h, p) in self.absorbed.iter().enumerate() {
            q_latent.extend(
                p.key
                    .to_latent(&q_pass[h * seq * nope..(h + 1) * seq * nope], seq)?,
            );
        }
        let shape = LatentShape {
            heads: self.heads,
            seq,
            total: latent.len() / l.max(1),
            latent: l,
            rope: self.qk_rope_dim,
            start,
        };
        let out_latent = latent_attention(
            &q_latent,
            q_rot,
            latent,
            k_rot,
            &shape,
            self.scale as f32,
            selected,
        );
        let mut out = vec![0f32; seq * self.heads * v];
        for (h, p) in self.absorbed.iter().enumerate() {
            let y = p
                .value
                .matmul(&out_latent[h * seq * l..(h + 1) * seq * l], seq)?;
            for (i, row) in y.chunks_exact(v.max(1)).enumerate() {
                out[(i * self.heads + h) * v..(i * self.heads + h + 1) * v].copy_from_slice(row);
            }
        }
        Ok(out)
    }
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

    /// Attention on latents equals attention with every cached position
    /// expanded into per-head keys and values, as the reference computes it.
    #[test]
    fn absorbed_attention_equals_the_expanded_form() {
        let (heads, latent_dim, nope, rope_dim, v) = (3, 10, 6, 4, 5);
        let kv_b_w = random(&[heads * (nope + v), latent_dim], 1);
        let kv_b = Linear::from_tensor(&kv_b_w).unwrap();
        let params = RopeParams {
            theta: 10000.0,
            partial_rotary_factor: 1.0,
            kind: RopeKind::Default,
        };
        let attention = LatentAttention {
            q: QueryProjection::Direct(
                Linear::from_tensor(&random(&[heads * (nope + rope_dim), 8], 2)).unwrap(),
            ),
            kv_a: Linear::from_tensor(&random(&[latent_dim + rope_dim, 8], 3)).unwrap(),
            kv_a_norm: RmsNorm::from_weight(
                Tensor::ones(latent_dim, DType::F32, &Device::Cpu).unwrap(),
                1e-6,
            )
            .unwrap(),
            absorbed: split_kv_b(&kv_b, heads, nope, v).unwrap(),
            o_proj: Linear::from_tensor(&random(&[8, heads * v], 4)).unwrap(),
            heads,
            kv_lora_rank: latent_dim,
            qk_nope_dim: nope,
            qk_rope_dim: rope_dim,
            v_dim: v,
            rope: Rope::new(&params, rope_dim, true),
            scale: 0.3,
            sparse: None,
            head_gate: None,
        };
        let (seq, total, start) = (3, 7, 4);
        let q_pass = random(&[heads, seq, nope], 5);
        let q_rot = random(&[heads, seq, rope_dim], 6);
        let latent = random(&[total, latent_dim], 7);
        let k_rot = random(&[total, rope_dim], 8);
        let absorbed = attention
            .attend(
                &values(&q_pass).unwrap(),
                &values(&q_rot).unwrap(),
                &values(&latent).unwrap(),
                &values(&k_rot).unwrap(),
                start,
                None,
            )
            .unwrap();

        let kv = latent
            .matmul(&kv_b_w.t().unwrap())
            .unwrap()
            .reshape((total, heads, nope + v))
            .unwrap();
        let k_nope = kv.narrow(2, 0, nope).unwrap();
        let values_t = kv.narrow(2, nope, v).unwrap().contiguous().unwrap();
        let k_rot_all = k_rot
            .unsqueeze(1)
            .unwrap()
            .broadcast_as((total, heads, rope_dim))
            .unwrap();
        let k = Tensor::cat(&[&k_nope, &k_rot_all], 2).unwrap();
        let q = Tensor::cat(&[&q_pass, &q_rot], 2)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        let shape = crate::kernels::ops::AttentionShape {
            heads,
            kv_heads: heads,
            seq,
            total,
            dim: nope + rope_dim,
            value_dim: v,
            start,
            window: None,
            chunk: None,
        };
        let expanded = crate::kernels::ops::attention(
            &values(&q).unwrap(),
            &values(&k).unwrap(),
            &values(&values_t).unwrap(),
            &shape,
            0.3,
        );
        let diff = absorbed
            .iter()
            .zip(&expanded)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "paths differ by {diff}");
    }
}
