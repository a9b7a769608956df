//! Row-wise operations: RMS norm, SiLU and the attention core (whose softmax
//! is [`super::softmax`]).
//!
//! Each works on one row (one position, one head) at a time with a fixed
//! order of operations, so a row's result does not depend on the rows around
//! it. Attention visits keys in increasing position and sums values in that
//! order; masked keys are skipped (adding `exp(-inf) = 0` changes no sum).

use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use super::dot::{axpy, dot};
use super::math::{exp, sigmoid, silu};
use super::softmax::softmax;
use super::{Isa, dispatch};

/// Below this many multiply-adds attention runs on the calling thread.
/// Even a decode step's 16 heads over a few hundred positions gain from the
/// other compute thread: keeping up to 2^20 on one thread was 9% slower warm.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// `y = x / sqrt(mean(x²) + eps) · w` for each row of `x` (rows of `w.len()`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let dim = weight.len().max(1);
    let mut y = vec![0f32; x.len()];
    dispatch(
        Isa::Best,
        RmsNorm {
            x,
            weight,
            eps,
            dim,
            y: &mut y,
        },
    );
    y
}

struct RmsNorm<'a> {
    x: &'a [f32],
    weight: &'a [f32],
    eps: f32,
    dim: usize,
    y: &'a mut [f32],
}

impl WithSimd for RmsNorm<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        for (row, out) in self.x.chunks(self.dim).zip(self.y.chunks_mut(self.dim)) {
            let mean = dot(simd, row, row) / self.dim as f32;
            let scale = 1.0 / (mean + self.eps).sqrt();
            for ((o, &v), &w) in out.iter_mut().zip(row).zip(self.weight) {
                *o = (v * scale) * w;
            }
        }
    }
}

/// `y = (x − mean) / sqrt(var + eps) · w + b` for each row of `x` (rows of
/// `w.len()`, biased variance), as `nn.LayerNorm` computes it.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32) -> Vec<f32> {
    let dim = weight.len().max(1);
    let mut y = vec![0f32; x.len()];
    for (row, out) in x.chunks(dim).zip(y.chunks_mut(dim)) {
        let n = row.len() as f32;
        let mean = row.iter().sum::<f32>() / n;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        let rstd = 1.0 / (var + eps).sqrt();
        for (((o, &v), &w), &b) in out.iter_mut().zip(row).zip(weight).zip(bias) {
            *o = (v - mean) * rstd * w + b;
        }
    }
    y
}

/// Keys scored per task when index scores run on both compute threads.
const INDEX_KEYS_PER_TASK: usize = 256;

/// One query's sparse-attention index scores against `keys` (`[n][d]`):
/// `Σ_h w_h · relu(q_h·k · scale)`, over heads in order, for every key.
pub fn index_scores(q: &[f32], weights: &[f32], keys: &[f32], d: usize, scale: f32) -> Vec<f32> {
    let n = keys.len() / d.max(1);
    let mut out = vec![0f32; n];
    let one = |(chunk, o): (usize, &mut [f32])| {
        let first = chunk * INDEX_KEYS_PER_TASK;
        let keys = &keys[first * d..(first + o.len()) * d];
        dispatch(
            Isa::Best,
            IndexRow {
                q,
                weights,
                keys,
                d,
                scale,
                out: o,
            },
        );
    };
    if n * q.len() < PARALLEL_MIN_WORK {
        out.chunks_mut(INDEX_KEYS_PER_TASK)
            .enumerate()
            .for_each(one);
    } else {
        out.par_chunks_mut(INDEX_KEYS_PER_TASK)
            .enumerate()
            .for_each(one);
    }
    out
}

struct IndexRow<'a> {
    q: &'a [f32],
    weights: &'a [f32],
    keys: &'a [f32],
    d: usize,
    scale: f32,
    out: &'a mut [f32],
}

impl WithSimd for IndexRow<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let d = self.d.max(1);
        for (key, o) in self.keys.chunks_exact(d).zip(self.out.iter_mut()) {
            let mut total = 0f32;
            for (qh, &w) in self.q.chunks_exact(d).zip(self.weights) {
                total += w * (dot(simd, qh, key) * self.scale).max(0.0);
            }
            *o = total;
        }
    }
}

/// `silu(gate) · up`, elementwise.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter().zip(up).map(|(&g, &u)| silu(g) * u).collect()
}

/// gpt-oss's clamped SwiGLU, elementwise: the gate clamped above at
/// `limit`, up to ±`limit`, then `gate · σ(alpha · gate) · (up + 1)`.
pub fn clamped_swiglu(gate: &[f32], up: &[f32], alpha: f32, limit: f32) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            let glu = g * sigmoid(g * alpha);
            (u + 1.0) * glu
        })
        .collect()
}

/// DeepSeek-V4's SwiGLU, elementwise: `silu(min(gate, limit)) · clamp(up, ±limit)`.
pub fn limited_swiglu(gate: &[f32], up: &[f32], limit: f32) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = g.min(limit);
            silu(g) * u.clamp(-limit, limit)
        })
        .collect()
}

/// Step's clamped SwiGLU, elementwise: `min(silu(gate), limit) ·
/// clamp(up, ±limit)` (the clamp after the activation, not before it).
pub fn silu_clamped(gate: &[f32], up: &[f32], limit: f32) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| silu(g).min(limit) * u.clamp(-limit, limit))
        .collect()
}

/// The keys one query of [`sink_attention`] reads: a run of the window's
/// rows, then listed rows of the compressed entries.
#[derive(Debug, Clone, Default)]
pub struct QueryKeys {
    pub window: std::ops::Range<usize>,
    pub entries: Vec<usize>,
}

/// Compressed entries as a DeepSeek-V4 layer keeps them: entry `w` spread
/// over the rows of the window after its own (`rows[(w + 1)·stride..]`),
/// but for the latest (`last`: its number and values), still being spread.
#[derive(Debug, Clone, Copy)]
pub struct EntryRows<'a> {
    pub rows: &'a [f32],
    pub stride: usize,
    pub last: (usize, &'a [f32]),
}

impl<'a> EntryRows<'a> {
    /// No entries (a sliding-window layer).
    pub const NONE: EntryRows<'static> = EntryRows {
        rows: &[],
        stride: 0,
        last: (usize::MAX, &[]),
    };

    /// Entry `w`'s `d` values.
    pub fn get(&self, w: usize, d: usize) -> &'a [f32] {
        if w == self.last.0 {
            &self.last.1[..d]
        } else {
            &self.rows[(w + 1) * self.stride..][..d]
        }
    }
}

/// Multi-query attention with one key/value head whose keys are its values
/// (DeepSeek-V4): `q` is `[seq][heads][d]`, `window` holds rows of `d`;
/// query `i` reads `keys[i]` (window rows, then entries), in that order, and
/// each head's softmax also weighs its sink logit (which adds no value).
/// Output `[seq][heads][d]`.
pub fn sink_attention(
    q: &[f32],
    heads: usize,
    window: &[f32],
    entries: EntryRows<'_>,
    keys: &[QueryKeys],
    sinks: &[f32],
    scale: f32,
) -> Vec<f32> {
    let d = if heads == 0 || keys.is_empty() {
        1
    } else {
        q.len() / (heads * keys.len())
    };
    let mut out = vec![0f32; q.len()];
    let one = |(row, o): (usize, &mut [f32])| {
        let (i, h) = (row / heads.max(1), row % heads.max(1));
        dispatch(
            Isa::Best,
            SinkRow {
                q: &q[row * d..(row + 1) * d],
                window,
                entries,
                keys: &keys[i],
                sink: sinks.get(h).copied().unwrap_or(f32::NEG_INFINITY),
                scale,
                out: o,
            },
        );
    };
    let per_query = keys.iter().map(|k| k.window.len() + k.entries.len()).max();
    let work = q.len() * per_query.unwrap_or(0) * 2;
    each_row(&mut out, d, work, one);
    out
}

struct SinkRow<'a> {
    q: &'a [f32],
    window: &'a [f32],
    entries: EntryRows<'a>,
    keys: &'a QueryKeys,
    sink: f32,
    scale: f32,
    out: &'a mut [f32],
}

impl SinkRow<'_> {
    fn rows(&self) -> impl Iterator<Item = &[f32]> + '_ {
        let d = self.q.len();
        let window = self
            .keys
            .window
            .clone()
            .map(move |t| &self.window[t * d..(t + 1) * d]);
        let entries = self
            .keys
            .entries
            .iter()
            .map(move |&e| self.entries.get(e, d));
        window.chain(entries)
    }
}

impl WithSimd for SinkRow<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let scores: Vec<f32> = self
            .rows()
            .map(|k| dot(simd, self.q, k) * self.scale)
            .collect();
        let max = scores.iter().copied().fold(self.sink, f32::max);
        let exps: Vec<f32> = scores.iter().map(|s| exp(s - max)).collect();
        let total = exps.iter().sum::<f32>() + exp(self.sink - max);
        let mut acc = vec![0f32; self.out.len()];
        for (e, v) in exps.iter().zip(self.rows()) {
            axpy(simd, &mut acc, e / total, v);
        }
        self.out.copy_from_slice(&acc);
    }
}

/// Shapes of one attention call. Everything is position-major: queries
/// `[seq][heads][dim]`, keys `[total][kv_heads][dim]`, values
/// `[total][kv_heads][value_dim]` (the attention cache's own layout), with
/// each key/value head shared by `heads / kv_heads` consecutive query heads.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub seq: usize,
    pub total: usize,
    pub dim: usize,
    pub value_dim: usize,
    /// Position of the first query; query `i` sees keys `..= start + i`.
    pub start: usize,
    /// A query sees at most this many most recent keys, itself included.
    pub window: Option<usize>,
    /// A query sees only keys of its own chunk: positions `c·chunk ..`
    /// for the `c` its own position falls in (Llama 4).
    pub chunk: Option<usize>,
}

impl AttentionShape {
    /// Keys visible to query `i`: a range of positions.
    pub fn visible(&self, i: usize) -> std::ops::Range<usize> {
        let pos = self.start + i;
        let hi = (pos + 1).min(self.total);
        let lo = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let lo = self.chunk.map_or(lo, |c| lo.max(pos / c.max(1) * c.max(1)));
        lo.min(hi)..hi
    }
}

/// `softmax(q·kᵀ·scale)·v` for every query and head; output `[seq][heads][value_dim]`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], s: &AttentionShape, scale: f32) -> Vec<f32> {
    attention_with_sinks(q, k, v, s, scale, None)
}

/// [`attention`] where each query head's softmax also weighs a learnt sink
/// logit (`sinks[head]`) that attends to nothing.
pub fn attention_with_sinks(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: &AttentionShape,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    if s.seq >= super::tiled::TILED_MIN_SEQ {
        return super::tiled::attention_tiled(q, k, v, s, scale, sinks);
    }
    let mut out = vec![0f32; s.seq * s.heads * s.value_dim];
    let group = (s.heads / s.kv_heads.max(1)).max(1);
    let one = |(row, o): (usize, &mut [f32])| {
        let (i, h) = (row / s.heads.max(1), row % s.heads.max(1));
        dispatch(
            Isa::Best,
            AttendRow {
                q: &q[row * s.dim..(row + 1) * s.dim],
                keys: k,
                values: v,
                kv: h / group,
                shape: s,
                visible: s.visible(i),
                scale,
                sink: sinks.and_then(|v| v.get(h).copied()),
                out: o,
            },
        );
    };
    let work = s.heads * s.seq * s.total * (s.dim + s.value_dim);
    each_row(&mut out, s.value_dim, work, one);
    out
}

/// Calls `one` with every `width`-wide row of `out` and its index: on the
/// compute threads when there are `work` multiply-adds enough to share.
pub(super) fn each_row(
    out: &mut [f32],
    width: usize,
    work: usize,
    one: impl Fn((usize, &mut [f32])) + Sync + Send,
) {
    if work < PARALLEL_MIN_WORK {
        out.chunks_mut(width.max(1)).enumerate().for_each(one);
    } else {
        out.par_chunks_mut(width.max(1)).enumerate().for_each(one);
    }
}

struct AttendRow<'a> {
    q: &'a [f32],
    keys: &'a [f32],
    values: &'a [f32],
    /// The key/value head this query head reads.
    kv: usize,
    shape: &'a AttentionShape,
    visible: std::ops::Range<usize>,
    scale: f32,
    sink: Option<f32>,
    out: &'a mut [f32],
}

impl WithSimd for AttendRow<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let s = self.shape;
        let (d, vd) = (s.dim, s.value_dim);
        let mut scores = Vec::with_capacity(self.visible.len());
        for t in self.visible.clone() {
            let at = (t * s.kv_heads + self.kv) * d;
            scores.push(dot(simd, self.q, &self.keys[at..at + d]) * self.scale);
        }
        softmax(simd, &mut scores, self.sink);
        for (p, t) in scores.iter().zip(self.visible.clone()) {
            let at = (t * s.kv_heads + self.kv) * vd;
            axpy(simd, self.out, *p, &self.values[at..at + vd]);
        }
    }
}

/// Shapes of multi-head latent attention on compressed keys: per head,
/// queries `[seq, latent]` (already through the key up-projection) and
/// `[seq, rope]`; keys are the shared `[total, latent]` latents and
/// `[total, rope]` rotary keys. Query `i` sees keys `..= start + i`.
#[derive(Debug, Clone, Copy)]
pub struct LatentShape {
    pub heads: usize,
    pub seq: usize,
    pub total: usize,
    pub latent: usize,
    pub rope: usize,
    pub start: usize,
}

/// Softmax((q_latent·latentᵀ + q_rot·k_rotᵀ)·scale)·latent for every head
/// and query; output `[heads, seq, latent]`. Query `i` sees positions up to
/// `start + i`, or, with `selected`, only the positions `selected[i]` lists
/// (ascending; sparse attention's choice, the same for every head).
pub fn latent_attention(
    q_latent: &[f32],
    q_rot: &[f32],
    latent: &[f32],
    k_rot: &[f32],
    s: &LatentShape,
    scale: f32,
    selected: Option<&[Vec<usize>]>,
) -> Vec<f32> {
    let mut out = vec![0f32; s.heads * s.seq * s.latent];
    let one = |(row, o): (usize, &mut [f32])| {
        let i = row % s.seq;
        let visible = match selected {
            Some(rows) => Keys::Listed(rows.get(i).map_or(&[][..], Vec::as_slice)),
            None => Keys::Causal(0..(s.start + i + 1).min(s.total)),
        };
        dispatch(
            Isa::Best,
            LatentRow {
                q_latent: &q_latent[row * s.latent..(row + 1) * s.latent],
                q_rot: &q_rot[row * s.rope..(row + 1) * s.rope],
                latent,
                k_rot,
                shape: s,
                visible,
                scale,
                out: o,
            },
        );
    };
    let keys = selected.map_or(s.total, |rows| rows.iter().map(Vec::len).max().unwrap_or(0));
    let work = s.heads * s.seq * keys * (2 * s.latent + s.rope);
    each_row(&mut out, s.latent, work, one);
    out
}

/// The positions one query attends to, in increasing order.
#[derive(Clone)]
enum Keys<'a> {
    Causal(std::ops::Range<usize>),
    Listed(&'a [usize]),
}

impl Keys<'_> {
    fn len(&self) -> usize {
        match self {
            Keys::Causal(r) => r.len(),
            Keys::Listed(l) => l.len(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let (range, list) = match self {
            Keys::Causal(r) => (r.clone(), &[][..]),
            Keys::Listed(l) => (0..0, *l),
        };
        range.chain(list.iter().copied())
    }
}

struct LatentRow<'a> {
    q_latent: &'a [f32],
    q_rot: &'a [f32],
    latent: &'a [f32],
    k_rot: &'a [f32],
    shape: &'a LatentShape,
    visible: Keys<'a>,
    scale: f32,
    out: &'a mut [f32],
}

impl WithSimd for LatentRow<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let (l, r) = (self.shape.latent, self.shape.rope);
        let total = self.latent.len() / l.max(1);
        let keys = || self.visible.iter().filter(|&t| t < total);
        let mut scores = Vec::with_capacity(self.visible.len());
        for t in keys() {
            let nope = dot(simd, self.q_latent, &self.latent[t * l..(t + 1) * l]);
            let rope = dot(simd, self.q_rot, &self.k_rot[t * r..(t + 1) * r]);
            scores.push((nope + rope) * self.scale);
        }
        softmax(simd, &mut scores, None);
        for (p, t) in scores.iter().zip(keys()) {
            axpy(simd, self.out, *p, &self.latent[t * l..(t + 1) * l]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_its_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5, 0.0, 4.0];
        let w = [1.0f32, 0.5, 2.0];
        let y = rms_norm(&x, &w, 1e-6);
        for (row, out) in x.chunks(3).zip(y.chunks(3)) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 3.0;
            for i in 0..3 {
                let want = row[i] / (ms + 1e-6).sqrt() * w[i];
                assert!((out[i] - want).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn attention_rows_do_not_depend_on_the_batch() {
        let (heads, kv_heads, dim, total) = (4, 2, 8, 6);
        let val = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i + seed) * 37 % 101) as f32) / 50.0 - 1.0)
                .collect()
        };
        let k = val(total * kv_heads * dim, 1);
        let v = val(total * kv_heads * dim, 2);
        let q_all = val(total * heads * dim, 3);
        let all = AttentionShape {
            heads,
            kv_heads,
            seq: total,
            total,
            dim,
            value_dim: dim,
            start: 0,
            window: Some(4),
            chunk: None,
        };
        let batched = attention(&q_all, &k, &v, &all, 0.3);
        let row = heads * dim;
        for i in 0..total {
            let one = AttentionShape {
                seq: 1,
                start: i,
                ..all
            };
            let single = attention(&q_all[i * row..(i + 1) * row], &k, &v, &one, 0.3);
            let same = batched[i * row..(i + 1) * row]
                .iter()
                .zip(&single)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "position {i}");
        }
        assert_eq!(all.visible(5), 2..6);
        assert_eq!(all.visible(1), 0..2);
        let chunked = AttentionShape {
            window: None,
            chunk: Some(4),
            ..all
        };
        assert_eq!(chunked.visible(3), 0..4);
        assert_eq!(chunked.visible(4), 4..5);
        assert_eq!(chunked.visible(5), 4..6);
    }
}
