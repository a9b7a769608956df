//! Attention over a prompt pass, in tiles of query positions.
//!
//! Row by row, every query head reads every key and value it sees: on a
//! 12,000-token prompt of a synthetic Qwen3-MoE (16 heads over 4 key/value
//! heads) that read ~50 GB per layer and pass and held prefill to 29 tok/s,
//! against llama.cpp's 110. Tiles of [`TILE_POSITIONS`] positions read each
//! key and value once for all the tile's rows that see it.
//!
//! The scores are the canonical dot product's ([`super::dot`]) computed
//! sixteen keys at a time: the keys are laid out dimension by dimension in
//! blocks of [`KEY_BLOCK`] (one key per vector lane), so running sum `l` of
//! sixteen keys is one vector and the fixed tree that ends a dot product is
//! fifteen vector adds, where a call to `dot` per key spent more on its
//! horizontal tree than on its four multiply-adds at head size 64. Each
//! row's values are summed in registers, four rows sharing each load, over
//! runs of keys that stay in cache, in increasing position, as the row
//! kernel's `axpy` does in memory. Every row's result is bitwise the row
//! kernel's (a test checks it). On that model a 15,478-token prompt went
//! from 360 s to 108 s (attention of 512 queries over 14,000 keys: 16 to 59
//! GFLOP/s on two cores).
//!
//! The layout is a copy of one layer's keys, held while the layer attends:
//! at most 1/(2 · layers) of the attention cache the memory plan counts.

use pulp::{Simd, WithSimd};

use super::dot::{LANES, dot};
use super::ops::{AttentionShape, each_row};
use super::softmax::softmax;
use super::{Isa, dispatch};

/// Queries from which attention runs in tiles (below it, in decode steps,
/// laying the keys out by dimension would cost more than the scores).
pub(super) const TILED_MIN_SEQ: usize = 8;
/// Query positions per tile: 16 positions of a group of 4 heads share each
/// key read (and the tiles keep both compute threads busy on a 512-token
/// pass).
pub(super) const TILE_POSITIONS: usize = 16;
/// Keys per block of the dimension-major layout: one per running sum of the
/// canonical dot product, so a block is one 512-bit vector per dimension.
const KEY_BLOCK: usize = LANES;
/// Value vectors each row keeps in registers while summing (4 × 16 floats
/// on AVX-512: a head of 64 in one run).
const VALUE_CHUNK: usize = 4;
/// Rows summed together, sharing each value load (4 rows × 4 vectors fill
/// half of AVX-512's registers).
const VALUE_ROWS: usize = 4;
/// Values summed over by every row of a tile before the next run of keys:
/// they stay in the first-level cache. Each group of rows reading all of a
/// 14,000-token head's values (3.6 MB) in turn made the sums 60% of the
/// tile's time.
const VALUE_BLOCK_BYTES: usize = 32 << 10;

/// [`super::ops::attention_with_sinks`] in tiles of [`TILE_POSITIONS`]
/// queries, bitwise the row-by-row kernel's.
pub(super) fn attention_tiled(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: &AttentionShape,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    attention_tiled_on(Isa::Best, q, k, v, s, scale, sinks)
}

fn attention_tiled_on(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: &AttentionShape,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let mut out = vec![0f32; s.seq * s.heads * s.value_dim];
    let keys = keys_by_dimension(k, s);
    let per_position = (s.heads * s.value_dim).max(1);
    let q_per_position = s.heads * s.dim;
    let one = |(tile, o): (usize, &mut [f32])| {
        let first = tile * TILE_POSITIONS;
        let positions = o.len() / per_position;
        dispatch(
            isa,
            AttendTile {
                q: &q[first * q_per_position..(first + positions) * q_per_position],
                keys: &keys,
                values: v,
                shape: s,
                first,
                scale,
                sinks,
                out: o,
            },
        );
    };
    let work = s.heads * s.seq * s.total * (s.dim + s.value_dim);
    each_row(&mut out, TILE_POSITIONS * per_position, work, one);
    out
}

/// Every key/value head's keys, dimension-major in blocks of [`KEY_BLOCK`]
/// keys: `[kv_head][block][dim][KEY_BLOCK]`, the last block padded with
/// zeros (their scores are computed and never used).
fn keys_by_dimension(k: &[f32], s: &AttentionShape) -> Vec<f32> {
    let d = s.dim;
    let blocks = s.total.div_ceil(KEY_BLOCK);
    let mut out = vec![0f32; s.kv_heads * blocks * d * KEY_BLOCK];
    for (t, key) in k
        .chunks_exact(d.max(1))
        .take(s.total * s.kv_heads)
        .enumerate()
    {
        let (position, kv) = (t / s.kv_heads.max(1), t % s.kv_heads.max(1));
        let (block, lane) = (position / KEY_BLOCK, position % KEY_BLOCK);
        let base = (kv * blocks + block) * d * KEY_BLOCK + lane;
        for (j, x) in key.iter().enumerate() {
            out[base + j * KEY_BLOCK] = *x;
        }
    }
    out
}

struct AttendTile<'a> {
    /// The tile's queries, `[positions][heads][dim]`.
    q: &'a [f32],
    /// From [`keys_by_dimension`].
    keys: &'a [f32],
    values: &'a [f32],
    shape: &'a AttentionShape,
    /// Index of the tile's first query.
    first: usize,
    scale: f32,
    sinks: Option<&'a [f32]>,
    /// `[positions][heads][value_dim]`.
    out: &'a mut [f32],
}

/// One query row of a tile: its query, the keys it sees, its output.
struct TileRow {
    /// Offset of the row's query in the tile's `q` and output in `out`
    /// (in units of `dim` and `value_dim`).
    row: usize,
    head: usize,
    visible: std::ops::Range<usize>,
}

impl WithSimd for AttendTile<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let s = self.shape;
        let group = (s.heads / s.kv_heads.max(1)).max(1);
        let positions = self.out.len() / (s.heads * s.value_dim).max(1);
        let blocks = s.total.div_ceil(KEY_BLOCK);
        for kv in 0..s.kv_heads {
            let rows: Vec<TileRow> = (0..positions)
                .flat_map(|i| {
                    (kv * group..(kv + 1) * group).map(move |h| TileRow {
                        row: i * s.heads + h,
                        head: h,
                        visible: s.visible(self.first + i),
                    })
                })
                .collect();
            let lo = rows.iter().map(|r| r.visible.start).min().unwrap_or(0) / KEY_BLOCK;
            let hi = rows
                .iter()
                .map(|r| r.visible.end)
                .max()
                .unwrap_or(0)
                .div_ceil(KEY_BLOCK);
            let width = (hi - lo) * KEY_BLOCK;
            let mut probs = vec![0f32; rows.len() * width];
            let head_keys = &self.keys[kv * blocks * s.dim * KEY_BLOCK..];
            for block in lo..hi {
                let keys = &head_keys[block * s.dim * KEY_BLOCK..][..s.dim * KEY_BLOCK];
                let first_key = block * KEY_BLOCK;
                for (r, row) in rows.iter().enumerate() {
                    if row.visible.start >= first_key + KEY_BLOCK || row.visible.end <= first_key {
                        continue;
                    }
                    let q = &self.q[row.row * s.dim..(row.row + 1) * s.dim];
                    let at = r * width + first_key - lo * KEY_BLOCK;
                    block_scores(simd, q, keys, self.scale, &mut probs[at..at + KEY_BLOCK]);
                }
            }
            for (r, row) in rows.iter().enumerate() {
                let at = r * width + row.visible.start - lo * KEY_BLOCK;
                let seen = &mut probs[at..at + row.visible.len()];
                softmax(
                    simd,
                    seen,
                    self.sinks.and_then(|v| v.get(row.head).copied()),
                );
            }
            let sums = ValueSums {
                values: self.values,
                shape: s,
                kv,
                probs: &probs,
                width,
                first_key: lo * KEY_BLOCK,
            };
            sums.add(simd, &rows, self.out);
        }
    }
}

/// `dot(q, key) · scale` for the [`KEY_BLOCK`] keys of one block (`keys`:
/// `[dim][KEY_BLOCK]`): running sum `l` of every key at once, each fused in
/// increasing dimension, then the canonical tree, so each score has `dot`'s
/// bits.
#[inline(always)]
fn block_scores<S: Simd>(simd: S, q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
    let per = KEY_BLOCK / S::F32_LANES;
    if per == 0 || !KEY_BLOCK.is_multiple_of(S::F32_LANES) {
        for (lane, o) in out.iter_mut().enumerate() {
            let key: Vec<f32> = keys.iter().skip(lane).step_by(KEY_BLOCK).copied().collect();
            *o = dot(simd, q, &key) * scale;
        }
        return;
    }
    let (kv, _) = S::as_simd_f32s(keys);
    let (ov, _) = S::as_mut_simd_f32s(out);
    let full = q.len() / LANES * LANES;
    for (sub, o) in ov.iter_mut().enumerate().take(per) {
        let mut acc = [simd.splat_f32s(0.0); LANES];
        for (qs, ks) in q[..full]
            .chunks_exact(LANES)
            .zip(kv.chunks_exact(LANES * per))
        {
            for l in 0..LANES {
                acc[l] = simd.mul_add_f32s(simd.splat_f32s(qs[l]), ks[l * per + sub], acc[l]);
            }
        }
        let tail = &kv[full * per..];
        for (l, x) in q[full..].iter().enumerate() {
            acc[l] = simd.mul_add_f32s(simd.splat_f32s(*x), tail[l * per + sub], acc[l]);
        }
        let mut width = LANES / 2;
        while width > 0 {
            for l in 0..width {
                acc[l] = simd.add_f32s(acc[l], acc[l + width]);
            }
            width /= 2;
        }
        *o = simd.mul_f32s(acc[0], simd.splat_f32s(scale));
    }
}

/// Sums of values weighted by one key/value head's probabilities for a tile.
struct ValueSums<'a> {
    values: &'a [f32],
    shape: &'a AttentionShape,
    kv: usize,
    /// `[row][width]`, from key `first_key`.
    probs: &'a [f32],
    width: usize,
    first_key: usize,
}

impl ValueSums<'_> {
    /// Adds `Σ_t p[row][t] · v[t]` to each row's output, `t` increasing:
    /// in runs of keys whose values stay in cache ([`VALUE_BLOCK_BYTES`]),
    /// for groups of [`VALUE_ROWS`] rows sharing each load, with
    /// [`VALUE_CHUNK`] vectors of each row's sum held in registers.
    #[inline(always)]
    fn add<S: Simd>(&self, simd: S, rows: &[TileRow], out: &mut [f32]) {
        let vd = self.shape.value_dim;
        let lanes = S::F32_LANES;
        let vectors = vd / lanes;
        let lo = rows.iter().map(|r| r.visible.start).min().unwrap_or(0);
        let hi = rows.iter().map(|r| r.visible.end).max().unwrap_or(0);
        let run = (VALUE_BLOCK_BYTES / (vd * size_of::<f32>()).max(1)).max(1);
        for from in (lo..hi).step_by(run) {
            let keys = from..(from + run).min(hi);
            for (g, group) in rows.chunks(VALUE_ROWS).enumerate() {
                let index = g * VALUE_ROWS;
                let mut c = 0;
                while c + VALUE_CHUNK <= vectors {
                    self.chunk::<S, VALUE_CHUNK>(simd, group, index, &keys, c * lanes, out);
                    c += VALUE_CHUNK;
                }
                while c < vectors {
                    self.chunk::<S, 1>(simd, group, index, &keys, c * lanes, out);
                    c += 1;
                }
            }
        }
        for col in vectors * lanes..vd {
            for (r, row) in rows.iter().enumerate() {
                let o = &mut out[row.row * vd + col];
                for t in row.visible.clone() {
                    let p = self.probs[r * self.width + t - self.first_key];
                    *o = p.mul_add(self.value(t)[col], *o);
                }
            }
        }
    }

    fn value(&self, t: usize) -> &[f32] {
        let vd = self.shape.value_dim;
        &self.values[(t * self.shape.kv_heads + self.kv) * vd..][..vd]
    }

    /// Columns `col..col + C·lanes` of up to [`VALUE_ROWS`] rows, over
    /// `keys`. The rows are a fixed number (absent ones see no keys), so the
    /// sums stay in registers; keys every row sees run without checks.
    #[inline(always)]
    fn chunk<S: Simd, const C: usize>(
        &self,
        simd: S,
        rows: &[TileRow],
        index: usize,
        keys: &std::ops::Range<usize>,
        col: usize,
        out: &mut [f32],
    ) {
        let lanes = S::F32_LANES;
        let vd = self.shape.value_dim;
        let mut seen: [std::ops::Range<usize>; VALUE_ROWS] = std::array::from_fn(|_| 0..0);
        for (s, row) in seen.iter_mut().zip(rows) {
            *s = row.visible.start.max(keys.start)..row.visible.end.min(keys.end);
        }
        let lo = seen
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| s.start)
            .min()
            .unwrap_or(0);
        let hi = seen.iter().map(|s| s.end).max().unwrap_or(0);
        if lo >= hi {
            return;
        }
        let all_lo = seen
            .iter()
            .take(rows.len())
            .map(|s| s.start)
            .max()
            .unwrap_or(lo);
        let all_hi = seen
            .iter()
            .take(rows.len())
            .map(|s| s.end)
            .min()
            .unwrap_or(lo)
            .max(all_lo);
        let prob = |r: usize, t: usize| self.probs[(index + r) * self.width + t - self.first_key];
        let mut acc = [[simd.splat_f32s(0.0); C]; VALUE_ROWS];
        for (a, row) in acc.iter_mut().zip(rows) {
            let (o, _) = S::as_simd_f32s(&out[row.row * vd + col..][..C * lanes]);
            a.copy_from_slice(&o[..C]);
        }
        let checked = |t: usize, acc: &mut [[S::f32s; C]; VALUE_ROWS]| {
            let (v, _) = S::as_simd_f32s(&self.value(t)[col..col + C * lanes]);
            for (r, (acc, seen)) in acc.iter_mut().zip(&seen).enumerate() {
                if seen.contains(&t) {
                    let p = simd.splat_f32s(prob(r, t));
                    for (a, x) in acc.iter_mut().zip(v) {
                        *a = simd.mul_add_f32s(p, *x, *a);
                    }
                }
            }
        };
        for t in lo..all_lo.min(hi) {
            checked(t, &mut acc);
        }
        if rows.len() == VALUE_ROWS {
            for t in all_lo..all_hi {
                let (v, _) = S::as_simd_f32s(&self.value(t)[col..col + C * lanes]);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let p = simd.splat_f32s(prob(r, t));
                    for (a, x) in acc.iter_mut().zip(v) {
                        *a = simd.mul_add_f32s(p, *x, *a);
                    }
                }
            }
        } else {
            for t in all_lo..all_hi {
                checked(t, &mut acc);
            }
        }
        for t in all_hi.max(lo)..hi {
            checked(t, &mut acc);
        }
        for (a, row) in acc.iter().zip(rows) {
            let (o, _) = S::as_mut_simd_f32s(&mut out[row.row * vd + col..][..C * lanes]);
            o[..C].copy_from_slice(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ops::attention_with_sinks;
    use super::*;

    /// A prompt pass runs in tiles; every row is bitwise the row-by-row
    /// kernel's (and so a single query's), on the best instruction set and
    /// the scalar path, with a window, sinks, a ragged last tile, a pass
    /// that starts past earlier keys, head sizes that leave a partial block
    /// of sixteen, values narrower than keys and one head per key.
    #[test]
    fn tiled_attention_gives_the_row_kernels_bits() {
        let total = 70;
        let val = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i * 7 + seed) * 37 % 101) as f32) / 50.0 - 1.0)
                .collect()
        };
        for (heads, kv_heads, dim, value_dim) in [
            (8, 2, 16, 16),
            (16, 4, 64, 64),
            (4, 1, 72, 40),
            (3, 3, 24, 8),
        ] {
            let k = val(total * kv_heads * dim, 1);
            let v = val(total * kv_heads * value_dim, 2);
            let sinks = val(heads, 4);
            for (start, window, chunk) in [
                (0, None, None),
                (0, Some(9), None),
                (33, None, None),
                (20, Some(30), None),
                (20, None, Some(16)),
            ] {
                let seq = total - start;
                assert!(seq >= TILED_MIN_SEQ && seq % TILE_POSITIONS != 0);
                let q = val(seq * heads * dim, 3);
                let shape = AttentionShape {
                    heads,
                    kv_heads,
                    seq,
                    total,
                    dim,
                    value_dim,
                    start,
                    window,
                    chunk,
                };
                for sink in [None, Some(&sinks[..])] {
                    let row = heads * value_dim;
                    let rows: Vec<f32> = (0..seq)
                        .flat_map(|i| {
                            let one = AttentionShape {
                                seq: 1,
                                start: start + i,
                                ..shape
                            };
                            attention_with_sinks(
                                &q[i * heads * dim..(i + 1) * heads * dim],
                                &k,
                                &v,
                                &one,
                                0.25,
                                sink,
                            )
                        })
                        .collect();
                    for isa in [Isa::Best, Isa::Scalar] {
                        let tiled = attention_tiled_on(isa, &q, &k, &v, &shape, 0.25, sink);
                        for i in 0..seq {
                            let same = tiled[i * row..(i + 1) * row]
                                .iter()
                                .zip(&rows[i * row..(i + 1) * row])
                                .all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(
                                same,
                                "{heads}/{kv_heads} heads of {dim}/{value_dim}, start {start}, window {window:?}, chunk {chunk:?}, {isa:?}, position {i}"
                            );
                        }
                    }
                }
            }
        }
    }
}
