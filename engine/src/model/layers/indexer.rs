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
use std::borrow::Cow;

use super::LayerNorm;
use crate::kernels::math::{exp, powf};
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
    /// GLM-5.3's k-pools: keys scored a pool at a time.
    pools: Option<Pools>,
}

/// GLM-5.3-Flash's k-pool compression: positions are grouped in
/// consecutive runs of `size` from the first; a complete pool's key is, per
/// channel, the softmax-weighted sum of its tokens' keys (weights from
/// `gate · x` plus a learnt per-place bias, `ape`). A query scores the
/// complete pools that end at or before it, keeps `top_k / size` of them,
/// and reads their tokens plus, with `tail`, the tokens of its own
/// incomplete pool. Each position keeps its key and gate row; the
/// position that completes a pool also keeps the pool's key, computed once
/// (rather than for every pool in every pass: at 100k tokens that was 12.8 M
/// exponentials a sparse layer per decoded token).
pub struct Pools {
    pub size: usize,
    /// `[size][dim]`.
    pub ape: Vec<f32>,
    /// `index_kpool_compress_gate`: `[dim, hidden]`.
    pub gate: Linear,
    pub tail: bool,
}

impl Pools {
    /// The key of one complete pool from its tokens' rows (`[size][key |
    /// gate]`, `2·dim` a position), in a fixed order.
    fn key(&self, pool: &[f32], dim: usize) -> Vec<f32> {
        (0..dim)
            .map(|c| {
                let logit = |t: usize| pool[t * 2 * dim + dim + c] + self.ape[t * dim + c];
                let max = (0..self.size).map(logit).fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = (0..self.size).map(|t| exp(logit(t) - max)).collect();
                let sum: f32 = weights.iter().sum();
                (0..self.size)
                    .map(|t| weights[t] / sum * pool[t * 2 * dim + c])
                    .sum()
            })
            .collect()
    }

    /// For the `seq` new positions from `start` (their rows `new`, after
    /// `open`, the rows of the pool they continue): the key of each pool a
    /// position completes, at that position; zeros at the others.
    fn completed(
        &self,
        open: &[f32],
        new: &[f32],
        start: usize,
        seq: usize,
        dim: usize,
    ) -> Vec<f32> {
        let mut rows = open.to_vec();
        let mut out = vec![0f32; seq * dim];
        for (i, row) in new.chunks_exact(2 * dim).enumerate() {
            rows.extend_from_slice(row);
            if (start + i + 1).is_multiple_of(self.size) {
                out[i * dim..(i + 1) * dim].copy_from_slice(&self.key(&rows, dim));
                rows.clear();
            }
        }
        out
    }
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
            pools: None,
        })
    }

    /// An indexer that scores pools of positions ([`Pools`]); it keeps a
    /// key and a gate row a position in its slot.
    pub fn load_pooled(
        w: &Weights,
        s: &IndexerShape,
        rope: &Rope,
        slot: usize,
        size: usize,
        tail: bool,
    ) -> Result<Self, ModelError> {
        let d = s.head_dim;
        let pools = Pools {
            size,
            ape: values(&w.get("index_kpool_compress_ape", &[size, d])?)?,
            gate: Linear::from_matrix(w.matrix("index_kpool_compress_gate", d, s.hidden)?),
            tail,
        };
        Ok(Self {
            pools: Some(pools),
            ..Self::load(w, s, rope, slot)?
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
        let mut k = self
            .k_norm
            .forward_values(&self.wk.forward_values(xs, seq)?);
        self.rope.rotate(&mut k, 1, d, 0, tables)?;
        let weights = head_weights(&self.weights_proj, xs, seq, heads)?;
        if let Some(pools) = &self.pools {
            let rows = interleave(&k, &pools.gate.forward_values(xs, seq)?, d);
            let open_from = start - start % pools.size.max(1);
            let open = &cache.rows(self.slot)?.0[open_from * 2 * d..start * 2 * d];
            let completed = pools.completed(open, &rows, start, seq, d);
            let (_, ends) = cache.append(self.slot, &rows, 2 * d, &completed, d)?;
            return Ok(pooled_selection(pools, &q, &weights, ends, start, seq, s));
        }
        let (keys, _) = cache.append(self.slot, &k, d, &[], 0)?;
        let visible = (0..seq).map(|i| start + i + 1);
        let shape = (heads, d, s.top_k);
        Ok(choose(&q, &weights, shape, visible, |n| {
            Cow::Borrowed(&keys[..n * d])
        }))
    }
}

/// Rows of `a` then `b` per position, `d` values each.
fn interleave(a: &[f32], b: &[f32], d: usize) -> Vec<f32> {
    a.chunks_exact(d.max(1))
        .zip(b.chunks_exact(d.max(1)))
        .flat_map(|(x, y)| x.iter().chain(y).copied())
        .collect()
}

/// For each of the `seq` new rows (position `start + i`): the tokens of
/// the pools it keeps, then its own incomplete pool's (the tail). `ends`
/// holds each position's completed pool key.
fn pooled_selection(
    pools: &Pools,
    q: &[f32],
    weights: &[f32],
    ends: &[f32],
    start: usize,
    seq: usize,
    s: &IndexerShape,
) -> Selection {
    let (d, size) = (s.head_dim, pools.size.max(1));
    let keys: Vec<f32> = ends
        .chunks_exact(d.max(1))
        .skip(size - 1)
        .step_by(size)
        .flatten()
        .copied()
        .collect();
    let shape = (s.heads, d, s.top_k / size);
    let candidates = (0..seq).map(|i| (start + i + 1) / size);
    let chosen = choose(q, weights, shape, candidates, |n| {
        Cow::Borrowed(&keys[..n * d])
    });
    chosen
        .into_iter()
        .enumerate()
        .map(|(i, kept)| {
            let seen = start + i + 1;
            let mut tokens: Vec<usize> = kept
                .iter()
                .flat_map(|&p| p * size..(p + 1) * size)
                .collect();
            if pools.tail {
                tokens.extend(seen / size * size..seen);
            }
            tokens
        })
        .collect()
}

/// The indexer's weight of each head for the `seq` rows of `xs`:
/// `weights_proj(x) / √heads`.
pub fn head_weights(
    weights_proj: &Linear,
    xs: &[f32],
    seq: usize,
    heads: usize,
) -> Result<Vec<f32>, ModelError> {
    let scale = powf(heads as f32, -0.5);
    let mut weights = weights_proj.forward_values(xs, seq)?;
    weights.iter_mut().for_each(|w| *w *= scale);
    Ok(weights)
}

/// What each query row reads among its candidates (`candidates` gives
/// their number per row; `keys(n)` the first `n` keys, `[n][dim]`): all of
/// them while they number at most `top_k`, else the `top_k` with the best
/// `Σ_h w_h · relu(q_h·k / √dim)`, ties to the lowest ([`top_k_lowest_first`]).
/// `q` is `[rows][heads][dim]`, `weights` `[rows][heads]`.
pub fn choose<'k>(
    q: &[f32],
    weights: &[f32],
    (heads, dim, top_k): (usize, usize, usize),
    candidates: impl Iterator<Item = usize>,
    keys: impl Fn(usize) -> Cow<'k, [f32]>,
) -> Selection {
    let scale = powf(dim as f32, -0.5);
    candidates
        .enumerate()
        .map(|(i, n)| {
            if n <= top_k {
                return (0..n).collect();
            }
            let scores = index_scores(
                &q[i * heads * dim..(i + 1) * heads * dim],
                &weights[i * heads..(i + 1) * heads],
                &keys(n),
                dim,
                scale,
            );
            top_k_lowest_first(&scores, top_k)
        })
        .collect()
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

#[cfg(test)]
mod tied {
    use std::path::{Path, PathBuf};

    use crate::model::{Decoder, LogitsFor, ModelSpec};
    use crate::weights::{RawTensor, SafetensorsCheckpoint, TensorSource, WeightsError};

    /// GLM-5's `indexer.weights_proj` and DeepSeek-V4's
    /// `indexer.scorer.weights_proj`.
    const HEAD_WEIGHTS: &str = "weights_proj.weight";

    /// A checkpoint whose indexers weigh every head by zero: every index
    /// score is 0, so every choice is decided by the tie-break alone.
    struct Tied(SafetensorsCheckpoint);

    impl TensorSource for Tied {
        fn shape(&self, name: &str) -> Option<&[usize]> {
            self.0.shape(name)
        }

        fn load(&self, name: &str) -> Result<candle_core::Tensor, WeightsError> {
            let t = self.0.load(name)?;
            if name.ends_with(HEAD_WEIGHTS) {
                return t.zeros_like().map_err(|source| WeightsError::Tensor {
                    name: name.to_string(),
                    source,
                });
            }
            Ok(t)
        }

        fn load_raw(&self, name: &str) -> Result<RawTensor, WeightsError> {
            let mut raw = self.0.load_raw(name)?;
            if name.ends_with(HEAD_WEIGHTS) {
                raw.bytes.fill(0);
            }
            Ok(raw)
        }

        fn location(&self, name: &str) -> PathBuf {
            self.0.location(name)
        }

        fn origin(&self) -> PathBuf {
            self.0.origin()
        }
    }

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    /// With every score tied, each query with more than `index_topk`
    /// candidates reads the lowest, and a prompt fed in one pass, in chunks
    /// or token by token gives bitwise the same logits: GLM-5 choosing
    /// positions, DeepSeek-V4 choosing compressed entries.
    #[test]
    fn tied_index_scores_choose_the_same_positions_in_prefill_and_decode() {
        for name in [
            "glm_moe_dsa_recent",
            "glm_moe_dsa_released",
            "deepseek_v4_recent",
        ] {
            let dir = fixture(name);
            let spec = ModelSpec::read(&dir.join("config.json")).unwrap();
            let source = Tied(SafetensorsCheckpoint::open(&dir).unwrap());
            let model = spec.build(&source, None).unwrap();
            let honest = spec
                .build(&SafetensorsCheckpoint::open(&dir).unwrap(), None)
                .unwrap();
            let ids: Vec<u32> = (0..24).map(|i| (i * 7 % 40 + 3) as u32).collect();
            let run = |m: &Decoder, chunk: usize| -> Vec<Vec<f32>> {
                let mut state = m.new_state();
                let mut rows = Vec::new();
                for part in ids.chunks(chunk) {
                    let out = m.forward(part, &mut state, LogitsFor::All).unwrap();
                    rows.extend(out.to_vec2::<f32>().unwrap());
                }
                rows
            };
            let whole = run(&model, ids.len());
            for chunk in [1, 5] {
                assert!(run(&model, chunk) == whole, "{name}: chunks of {chunk}");
            }
            // The tie-break decided something: the untied model reads other positions.
            assert!(
                run(&honest, ids.len()) != whole,
                "{name}: the tie changed nothing"
            );
        }
    }
}
