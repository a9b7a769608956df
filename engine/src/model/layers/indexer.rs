//! The lightning indexer of DeepSeek sparse attention (DSA; GLM-5,
//! DeepSeek-V3.2): a small multi-head scorer picks, for every query, the
//! `top_k` earlier positions that latent attention then reads. GLM-5 reads
//! 2,048 of up to 202,752 positions, so past ~2,000 tokens of context the
//! attention a token costs stops growing with the context; the indexer
//! itself still scores every position, at 1/16 of MLA's width per head.
//!
//! Exactness: which positions are kept is a discrete choice, and two equal
//! scores at the cut would let the choice differ between a prompt fed in one
//! pass and token by token. Scores of a query row are computed the same way
//! in every pass (a fixed order over heads and lanes), and ties are broken by
//! position, lowest first, as a stable sort does ([`top_k_lowest_first`]).
//! The reference's `torch.topk` leaves the order of ties unspecified (on CPU
//! it keeps position 1 before 0 among equal zeros), so the reference
//! fixtures are made without ties at the cut.

use super::rope::{Rope, RopeTables};
use super::{Linear, values};
use super::LayerNorm;
use crate::kernels::ops::index_scores;
use crate::model::{ModelError, state::SequenceState};
use crate::weights::Weights;

/// The indexer's layer norm on keys (`nn.LayerNorm`'s default epsilon in
/// transformers' indexer).
const KEY_NORM_EPS: f32 = 1e-6;

/// Sizes of an indexer, as read from a config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexerShape {
    pub hidden: usize,
    pub q_lora_rank: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub top_k: usize,
}

/// Per query row, the positions it attends to, ascending.
pub type Selection = Vec<Vec<usize>>;

pub struct Indexer {
    wq_b: Linear,
    wk: Linear,
    k_norm: LayerNorm,
    weights_proj: Linear,
    shape: IndexerShape,
    rope: Rope,
    /// The sequence-state slot holding this layer's index keys.
    slot: usize,
}

impl Indexer {
    /// Loads `wq_b`, `wk`, `k_norm` and `weights_proj` under `w`; index keys
    /// are kept in state slot `slot`.
    pub fn load(
        w: &Weights,
        s: &IndexerShape,
        rope: &Rope,
        slot: usize,
    ) -> Result<Self, ModelError> {
        let d = s.head_dim;
        Ok(Self {
            wq_b: Linear::load(w, "wq_b", s.q_lora_rank, s.heads * d, false)?,
            wk: Linear::load(w, "wk", s.hidden, d, false)?,
            k_norm: LayerNorm::new(
                values(&w.get("k_norm.weight", &[d])?)?,
                values(&w.get("k_norm.bias", &[d])?)?,
                KEY_NORM_EPS,
            ),
            weights_proj: Linear::load(w, "weights_proj", s.hidden, s.heads, false)?,
            shape: *s,
            rope: rope.clone(),
            slot,
        })
    }

    /// Chooses the positions each of the `seq` new rows attends to: `xs` is
    /// the layer's normed input, `q_resid` the normed low-rank query. Appends
    /// the new rows' index keys to the state.
    pub fn select(
        &self,
        xs: &[f32],
        q_resid: &[f32],
        seq: usize,
        cache: &mut SequenceState,
        tables: &RopeTables,
    ) -> Result<Selection, ModelError> {
        let s = &self.shape;
        let (d, heads) = (s.head_dim, s.heads);
        let start = cache.len();
        let mut q = self.wq_b.forward_values(q_resid, seq)?;
        self.rope.rotate(&mut q, heads, d, 0, tables)?;
        let mut k = self.k_norm.forward_values(&self.wk.forward_values(xs, seq)?);
        self.rope.rotate(&mut k, 1, d, 0, tables)?;
        let head_scale = (heads as f32).powf(-0.5);
        let weights: Vec<f32> = self
            .weights_proj
            .forward_values(xs, seq)?
            .into_iter()
            .map(|w| w * head_scale)
            .collect();
        let (keys, _) = cache.append(self.slot, &k, d, &[], 0)?;
        let softmax_scale = (d as f32).powf(-0.5);
        (0..seq)
            .map(|i| {
                let visible = start + i + 1;
                if visible <= s.top_k {
                    return Ok((0..visible).collect());
                }
                let scores = index_scores(
                    &q[i * heads * d..(i + 1) * heads * d],
                    &weights[i * heads..(i + 1) * heads],
                    &keys[..visible * d],
                    d,
                    softmax_scale,
                );
                Ok(top_k_lowest_first(&scores, s.top_k))
            })
            .collect()
    }
}

/// The positions of the `k` highest scores, ascending. Equal scores keep
/// the lower position (a stable sort by descending score), so a tie is
/// broken the same way whatever the pass.
pub fn top_k_lowest_first(scores: &[f32], k: usize) -> Vec<usize> {
    // −0 and +0 are one score; `total_cmp` alone would order them.
    let key = |i: usize| if scores[i] == 0.0 { 0.0 } else { scores[i] };
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
    order.truncate(k);
    order.sort_unstable();
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_at_the_cut_keep_the_lowest_positions() {
        let scores = [0.0, 1.0, 0.0, 0.0, 2.0, 0.0];
        assert_eq!(top_k_lowest_first(&scores, 3), vec![0, 1, 4]);
        assert_eq!(top_k_lowest_first(&scores, 4), vec![0, 1, 2, 4]);
        assert_eq!(top_k_lowest_first(&[5.0; 4], 2), vec![0, 1]);
        assert_eq!(top_k_lowest_first(&[1.0, 3.0], 5), vec![0, 1]);
        // A weight below zero times a score cut to zero is −0: still a tie.
        assert_eq!(top_k_lowest_first(&[-1.0, -0.0, 0.0, 0.5], 2), vec![1, 3]);
    }
}
