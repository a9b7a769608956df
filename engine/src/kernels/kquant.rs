//! Products with GGML's k-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), blockwise.
//!
//! A k-quant weight is `D·q − M`: a small integer `q` under its sub-block's
//! scale `D` and minimum `M` (16 or 32 weights share them). Widening every
//! weight to f32 before the product costs a multiply and a subtraction per
//! weight on top of the fused multiply-add, and kept Q4_K at 11.7 G weights/s
//! on one AVX-512 core where F16 runs at 41. Blockwise, each sub-block is
//! `D·Σ q·x − M·Σ x`: the integers meet `x` directly, the scale is applied
//! once per sub-block and the minimum once per sub-block through sums of `x`
//! taken once per input row, not once per weight row.
//!
//! The order is fixed, and every path keeps it (the portable one at any
//! register width, the AVX-512 one, one input row or many):
//! - `X_s`, the sum of `x` over sub-block `s`: the sixteen lanes of its first
//!   chunk of sixteen, plus those of its second (32-wide sub-blocks), then
//!   added as the fixed tree of [`super::dot`];
//! - for each sub-block in row order, `p` = its chunks' products fused into
//!   sixteen lanes from zero, chunk by chunk; then `acc = fma(D_s, p, acc)`,
//!   lane by lane;
//! - `m[j] = fma(M_s, X_s, m[j])`, with `j` the sub-block's place in its
//!   super-block, in row order;
//! - the result is `tree(acc) − tree(m)`.
//!
//! `D` and `M` are the very products GGML's dequantiser forms, so only the
//! order of the sums differs from a product with the dequantised weights:
//! the two agree within 1e-6 relative to `Σ |w·x|`.
//!
//! The cost is in batches: a sub-block's partial sum takes one more
//! multiply-add per input row (1.5 per weight for Q4_K's 32-wide sub-blocks,
//! 2 for 16-wide ones) where widened weights took one, so a warm 64-token
//! prompt of a Q4_K_M Qwen3-MoE reads at 80 tok/s instead of 90, while its
//! decoding (one input row, where the widening was the cost) went from 29–35
//! to 90–98 tok/s. Rows here are unpacked four at a time and dotted with two
//! input rows at once.

use pulp::Simd;

use super::dot::{LANES, tree_sum};
use super::format::Format;
use super::ggml::{self, QK_K};

/// How a k-quant divides its super-blocks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// Weights per sub-block: 32 (Q4_K, Q5_K) or 16.
    pub sub: usize,
    /// Whether sub-blocks have minimums (Q2_K, Q4_K, Q5_K).
    pub mins: bool,
}

impl Layout {
    /// Sub-blocks per super-block.
    pub fn subs(self) -> usize {
        QK_K / self.sub
    }
}

/// The blockwise layout of `format`, or `None` when it is not a k-quant.
pub(super) fn layout(format: Format) -> Option<Layout> {
    match format {
        Format::Q4K | Format::Q5K => Some(Layout {
            sub: 32,
            mins: true,
        }),
        Format::Q2K => Some(Layout {
            sub: 16,
            mins: true,
        }),
        Format::Q3K | Format::Q6K => Some(Layout {
            sub: 16,
            mins: false,
        }),
        _ => None,
    }
}

/// `X_s` for every sub-block of every input row in `x` (rows whole
/// super-blocks long), one after another.
pub(super) fn x_sums(layout: Layout, x: &[f32]) -> Vec<f32> {
    x.chunks_exact(layout.sub)
        .map(|s| {
            let mut lanes = [0f32; LANES];
            lanes.copy_from_slice(&s[..LANES]);
            for chunk in s[LANES..].chunks_exact(LANES) {
                for (l, v) in lanes.iter_mut().zip(chunk) {
                    *l += v;
                }
            }
            tree_sum(lanes)
        })
        .collect()
}

/// One row unpacked: its integers as f32 in value order, and each
/// sub-block's scale and minimum (zero where the format has none).
pub(super) struct Unpacked {
    pub q: Vec<f32>,
    pub d: Vec<f32>,
    pub m: Vec<f32>,
}

impl Unpacked {
    pub fn new(layout: Layout, cols: usize) -> Self {
        let subs = cols / layout.sub;
        Self {
            q: vec![0.0; cols],
            d: vec![0.0; subs],
            m: vec![0.0; subs],
        }
    }

    /// Unpacks `row` (whole super-blocks of `format`). Inlined, so it is
    /// compiled for the caller's instruction set.
    #[inline(always)]
    pub fn fill(&mut self, format: Format, row: &[u8]) {
        let (layout, bytes) = match layout(format) {
            Some(l) => (l, format.block_bytes()),
            None => return,
        };
        let subs = layout.subs();
        let parts = row
            .chunks_exact(bytes)
            .zip(self.q.chunks_exact_mut(QK_K))
            .zip(
                self.d
                    .chunks_exact_mut(subs)
                    .zip(self.m.chunks_exact_mut(subs)),
            );
        for ((b, q), (d, m)) in parts {
            unpack(format, b, q, d, m);
        }
    }
}

/// One super-block's integers, scales and minimums. The integers are put
/// together eight at a time as words of bytes (see [`word`]), in loops of
/// fixed length over a block of fixed size (unrolled, with no bounds
/// checks), then widened in a loop of their own: byte by byte, the compiler
/// unrolled each loop into one scalar conversion per value, and Q2_K ran at
/// 2.7 G weights/s one row at a time; by words, at 7.4–9.0.
#[inline(always)]
fn unpack(format: Format, b: &[u8], q: &mut [f32], d: &mut [f32], m: &mut [f32]) {
    let mut v = [0u8; QK_K];
    match format {
        Format::Q4K | Format::Q5K => {
            for (dm, (d, m)) in ggml::q4_k_scales(b).into_iter().zip(d.iter_mut().zip(m)) {
                (*d, *m) = dm;
            }
            let zeros = [0u8; QK_K / 8];
            let (qh, qs) = match format {
                Format::Q4K => (Some(&zeros[..]), b.get(ggml::Q4_K_QS..)),
                _ => (b.get(ggml::Q5_K_QH..ggml::Q5_K_QS), b.get(ggml::Q5_K_QS..)),
            };
            let qh = qh.map(<&[u8; QK_K / 8]>::try_from);
            if let (Some(Ok(qh)), Some(Ok(qs))) = (qh, qs.map(<&[u8; QK_K / 2]>::try_from)) {
                nibbles(qs, qh, &mut v, q);
            }
        }
        Format::Q6K => {
            let Ok(b) = <&[u8; ggml::Q6_K_BYTES]>::try_from(b) else {
                return;
            };
            d.copy_from_slice(&ggml::q6_k_scales(b));
            m.fill(0.0);
            six_bits(b, &mut v, q);
        }
        Format::Q3K => {
            let Ok(b) = <&[u8; ggml::Q3_K_BYTES]>::try_from(b) else {
                return;
            };
            let scales = ggml::q3_k_scales(&b[ggml::Q3_K_SCALES..ggml::Q3_K_SCALES + 12]);
            let d_all = ggml::half(b, ggml::Q3_K_BYTES - 2);
            for (d, &s) in d.iter_mut().zip(&scales) {
                *d = d_all * f32::from(s - 32);
            }
            m.fill(0.0);
            three_bits(b, &mut v, q);
        }
        Format::Q2K => {
            let Ok(b) = <&[u8; ggml::Q2_K_BYTES]>::try_from(b) else {
                return;
            };
            let (dd, dmin) = (ggml::half(b, ggml::Q2_K_D), ggml::half(b, ggml::Q2_K_D + 2));
            for ((d, m), &sc) in d.iter_mut().zip(m).zip(&b[..ggml::Q2_K_QS]) {
                *d = dd * f32::from(sc & 0xF);
                *m = dmin * f32::from(sc >> 4);
            }
            two_bits(b, &mut v, q);
        }
        _ => {}
    }
}

/// Q4_K's and Q5_K's integers: group g (64 values) is the low nibbles of
/// its 32 bytes of `qs`, then the high nibbles, topped (Q5_K) with bits 2g
/// and 2g + 1 of byte l of `qh` (zeros for Q4_K).
#[inline(always)]
fn nibbles(qs: &[u8; QK_K / 2], qh: &[u8; QK_K / 8], v: &mut [u8; QK_K], q: &mut [f32]) {
    for g in 0..4 {
        for l in (0..32).step_by(8) {
            let w = word(qs, 32 * g + l);
            let h = word(qh, l) >> (2 * g);
            put(v, 64 * g + l, (w & NIBBLES) | ((h & ONES) << 4));
            put(
                v,
                64 * g + 32 + l,
                ((w >> 4) & NIBBLES) | (((h >> 1) & ONES) << 4),
            );
        }
    }
    widen(v, q, 0.0);
}

/// Q6_K's integers: values 128n + 32k + l are four bits of byte
/// 64n + 32(k mod 2) + l (the high nibble for k ≥ 2) and two of byte
/// 32n + l shifted by 2k, less 32.
#[inline(always)]
fn six_bits(b: &[u8; ggml::Q6_K_BYTES], v: &mut [u8; QK_K], q: &mut [f32]) {
    by_words(v, |n, k, l| {
        let low = word(b, 64 * n + 32 * (k % 2) + l) >> (4 * (k / 2));
        let high = word(b, ggml::Q6_K_QH + 32 * n + l) >> (2 * k);
        (low & NIBBLES) | ((high & TWO_BITS) << 4)
    });
    widen(v, q, -32.0);
}

/// Q3_K's integers: values 128h + 32k + l are two bits of byte 32h + l
/// shifted by 2k, less 4 where bit 4h + k of mask byte l is clear; here 4
/// more, taken off as the values widen.
#[inline(always)]
fn three_bits(b: &[u8; ggml::Q3_K_BYTES], v: &mut [u8; QK_K], q: &mut [f32]) {
    by_words(v, |h, k, l| {
        let low = word(b, ggml::Q3_K_QS + 32 * h + l) >> (2 * k);
        let mask = word(b, l) >> (4 * h + k);
        (low & TWO_BITS) | ((mask & ONES) << 2)
    });
    widen(v, q, -4.0);
}

/// Q2_K's integers: values 128h + 32k + l are two bits of byte 32h + l
/// shifted by 2k.
#[inline(always)]
fn two_bits(b: &[u8; ggml::Q2_K_BYTES], v: &mut [u8; QK_K], q: &mut [f32]) {
    by_words(v, |h, k, l| {
        (word(b, ggml::Q2_K_QS + 32 * h + l) >> (2 * k)) & TWO_BITS
    });
    widen(v, q, 0.0);
}

/// Fills `v` eight values at a time: values 128h + 32k + l .. + 8 are
/// `word_at(h, k, l)`, for the two halves `h`, four quarters `k` and
/// words `l` (0, 8, 16, 24) of a super-block laid out as Q2_K, Q3_K and
/// Q6_K lay theirs.
#[inline(always)]
fn by_words(v: &mut [u8; QK_K], word_at: impl Fn(usize, usize, usize) -> u64) {
    for h in 0..2 {
        for k in 0..4 {
            for l in (0..32).step_by(8) {
                put(v, 128 * h + 32 * k + l, word_at(h, k, l));
            }
        }
    }
}

/// Small integers plus `offset` as f32 (exact), in a loop of its own.
#[inline(always)]
fn widen(v: &[u8; QK_K], q: &mut [f32], offset: f32) {
    for (o, &v) in q.iter_mut().zip(v) {
        *o = f32::from(v) + offset;
    }
}

/// The low bit, two bits and four bits of each byte of a word.
const ONES: u64 = 0x0101_0101_0101_0101;
const TWO_BITS: u64 = 0x0303_0303_0303_0303;
const NIBBLES: u64 = 0x0F0F_0F0F_0F0F_0F0F;

/// Eight bytes of `b` from `at` as one little-endian word: shifts and masks
/// then act on eight values at once, with nothing carried between bytes.
#[inline(always)]
fn word<const N: usize>(b: &[u8; N], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A word's eight bytes into `v` from `at`.
#[inline(always)]
fn put(v: &mut [u8; QK_K], at: usize, w: u64) {
    v[at..at + 8].copy_from_slice(&w.to_le_bytes());
}

/// Blockwise products of `R` unpacked weight rows with `T` input rows (`x`,
/// with their sub-block sums `xs`), in the module's order: `out[r][t]`.
#[inline(always)]
pub(super) fn dot<S: Simd, const R: usize, const T: usize>(
    simd: S,
    layout: Layout,
    w: [&Unpacked; R],
    x: [&[f32]; T],
    xs: [&[f32]; T],
) -> [[f32; T]; R] {
    let width = S::F32_LANES.min(LANES);
    let mut lanes = [[[0f32; LANES]; T]; R];
    let subs = w[0].d.len();
    let mut j = 0;
    // Each lane's sums depend only on its own elements: a register's width
    // of lanes at a time, with `R × T` sums and as many partial sums held.
    while j < LANES {
        let mut acc = [[simd.splat_f32s(0.0); T]; R];
        for s in 0..subs {
            let mut p = [[simd.splat_f32s(0.0); T]; R];
            for c in (0..layout.sub).step_by(LANES) {
                let at = s * layout.sub + c + j;
                let mut xv = [simd.splat_f32s(0.0); T];
                for t in 0..T {
                    xv[t] = S::as_simd_f32s(&x[t][at..at + width]).0[0];
                }
                for r in 0..R {
                    let qv = S::as_simd_f32s(&w[r].q[at..at + width]).0[0];
                    for t in 0..T {
                        p[r][t] = simd.mul_add_f32s(qv, xv[t], p[r][t]);
                    }
                }
            }
            for r in 0..R {
                let d = simd.splat_f32s(w[r].d[s]);
                for t in 0..T {
                    acc[r][t] = simd.mul_add_f32s(d, p[r][t], acc[r][t]);
                }
            }
        }
        for r in 0..R {
            for t in 0..T {
                let (out, _) = S::as_mut_simd_f32s(&mut lanes[r][t][j..j + width]);
                out[0] = acc[r][t];
            }
        }
        j += width;
    }
    // Loops, not closures: a closure would be compiled without the caller's
    // instruction set, and each `mul_add` would be a library call.
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            let mut mins = [0f32; LANES];
            if layout.mins {
                let per = layout.subs();
                for (m, x) in w[r].m.chunks_exact(per).zip(xs[t].chunks_exact(per)) {
                    for ((acc, m), x) in mins.iter_mut().zip(m).zip(x) {
                        *acc = m.mul_add(*x, *acc);
                    }
                }
            }
            out[r][t] = tree_sum(lanes[r][t]) - tree_sum(mins);
        }
    }
    out
}

/// Weight rows of a k-quant (`bytes`, `row_bytes` each) times `n` input rows
/// `x` with their sub-block sums `xs`, into `out` laid out `[rows][n]`.
pub(super) struct Rows<'a> {
    pub format: Format,
    pub layout: Layout,
    pub bytes: &'a [u8],
    pub row_bytes: usize,
    pub cols: usize,
    pub x: &'a [f32],
    pub xs: &'a [f32],
    pub n: usize,
    pub out: &'a mut [f32],
}

/// Weight rows unpacked and computed together, and input rows dotted with
/// them at once: eight sums and eight partial sums, each a register on
/// AVX-512, and each weight and input load used two and four times.
const ROW_TILE: usize = 4;
const TOKEN_TILE: usize = 2;

impl pulp::WithSimd for Rows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Rows {
            format,
            layout,
            bytes,
            row_bytes,
            cols,
            x,
            xs,
            n,
            out,
        } = self;
        let subs = cols / layout.sub;
        let mut w: [Unpacked; ROW_TILE] = std::array::from_fn(|_| Unpacked::new(layout, cols));
        let xr = |t: usize| &x[t * cols..(t + 1) * cols];
        let sr = |t: usize| &xs[t * subs..(t + 1) * subs];
        let rows = bytes.len() / row_bytes.max(1);
        let mut r = 0;
        while r < rows {
            let tile = if rows - r >= ROW_TILE { ROW_TILE } else { 1 };
            for (i, w) in w.iter_mut().take(tile).enumerate() {
                w.fill(format, &bytes[(r + i) * row_bytes..(r + i + 1) * row_bytes]);
            }
            let mut t = 0;
            while t < n {
                let k = TOKEN_TILE.min(n - t);
                let mut put = |i: usize, sums: &[f32]| {
                    out[(r + i) * n + t..(r + i) * n + t + k].copy_from_slice(sums);
                };
                match (tile, k) {
                    (ROW_TILE, TOKEN_TILE) => {
                        let got = dot(
                            simd,
                            layout,
                            [&w[0], &w[1], &w[2], &w[3]],
                            [xr(t), xr(t + 1)],
                            [sr(t), sr(t + 1)],
                        );
                        for (i, sums) in got.iter().enumerate() {
                            put(i, sums);
                        }
                    }
                    (ROW_TILE, _) => {
                        let got = dot(simd, layout, [&w[0], &w[1], &w[2], &w[3]], [xr(t)], [sr(t)]);
                        for (i, sums) in got.iter().enumerate() {
                            put(i, sums);
                        }
                    }
                    (_, TOKEN_TILE) => put(
                        0,
                        &dot(
                            simd,
                            layout,
                            [&w[0]],
                            [xr(t), xr(t + 1)],
                            [sr(t), sr(t + 1)],
                        )[0],
                    ),
                    _ => put(0, &dot(simd, layout, [&w[0]], [xr(t)], [sr(t)])[0]),
                }
                t += k;
            }
            r += tile;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::format::decode_row;
    use crate::kernels::{Isa, Matrix};

    const FORMATS: [Format; 5] = [
        Format::Q2K,
        Format::Q3K,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
    ];

    /// Rows of arbitrary bytes with every super-block's f16 scales set to
    /// small finite values.
    fn rows_of(format: Format, rows: usize, cols: usize, seed: usize) -> Vec<u8> {
        let row_bytes = format.row_bytes(cols).unwrap();
        let block = format.block_bytes();
        let mut bytes: Vec<u8> = (0..rows * row_bytes)
            .map(|i| ((i + seed).wrapping_mul(2654435761) >> 9) as u8)
            .collect();
        let halves: &[usize] = match format {
            Format::Q4K | Format::Q5K => &[0, 2],
            Format::Q2K => &[block - 4, block - 2],
            _ => &[block - 2],
        };
        for b in bytes.chunks_exact_mut(block) {
            for &at in halves {
                // 2^-8 .. 2^-7, either sign.
                b[at + 1] = (b[at + 1] & 0x80) | 0x1C;
            }
        }
        bytes
    }

    fn xs(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i + seed) * 7919 % 1000) as f32 / 500.0 - 1.0) * 3.0)
            .collect()
    }

    /// The module's order written out element by element, as its doc says.
    fn by_the_doc(format: Format, row: &[u8], x: &[f32]) -> f32 {
        let layout = layout(format).unwrap();
        let mut w = Unpacked::new(layout, x.len());
        w.fill(format, row);
        let (mut acc, mut mins) = ([0f32; LANES], [0f32; LANES]);
        for s in 0..x.len() / layout.sub {
            let mut p = [0f32; LANES];
            let mut lanes = [0f32; LANES];
            for k in 0..layout.sub {
                let at = s * layout.sub + k;
                p[k % LANES] = w.q[at].mul_add(x[at], p[k % LANES]);
                if k < LANES {
                    lanes[k] = x[at];
                } else {
                    lanes[k % LANES] += x[at];
                }
            }
            for l in 0..LANES {
                acc[l] = w.d[s].mul_add(p[l], acc[l]);
            }
            let j = s % layout.subs();
            mins[j] = w.m[s].mul_add(tree_sum(lanes), mins[j]);
        }
        tree_sum(acc) - tree_sum(mins)
    }

    /// Unpacked, each weight is exactly the file's dequantised weight.
    #[test]
    fn unpacked_parts_make_the_dequantised_weights() {
        let cols = 512;
        for format in FORMATS {
            let layout = layout(format).unwrap();
            let row = rows_of(format, 1, cols, 3);
            let mut want = vec![0f32; cols];
            decode_row(format, &row, &mut want);
            let mut w = Unpacked::new(layout, cols);
            w.fill(format, &row);
            for (k, want) in want.iter().enumerate() {
                let s = k / layout.sub;
                let got = w.d[s] * w.q[k] - w.m[s];
                assert_eq!(got.to_bits(), want.to_bits(), "{format:?} value {k}");
            }
        }
    }

    /// Every path — scalar, the best SIMD one, one input row or five, any
    /// split among threads — gives the documented order's bits, within
    /// 1e-6 of the dequantised product relative to its magnitude.
    #[test]
    fn every_path_sums_in_the_documented_order() {
        // 19 rows: four groups of four in the fast path (Q4_K, Q6_K), then
        // three alone.
        let (rows, cols, n) = (19, 768, 5);
        for format in FORMATS {
            let bytes = rows_of(format, rows, cols, format.block_bytes());
            let m = Matrix::from_bytes(rows, cols, format, &bytes).unwrap();
            let row_bytes = format.row_bytes(cols).unwrap();
            let x = xs(n * cols, 11);
            let dense = m.to_f32();
            for k in [1, n] {
                let got = m.matmul(&x[..k * cols], k).unwrap();
                let scalar = m.matmul_on(&x[..k * cols], k, Isa::Scalar).unwrap();
                for t in 0..k {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let want =
                            by_the_doc(format, &bytes[r * row_bytes..(r + 1) * row_bytes], xt);
                        let (g, s) = (got[t * rows + r], scalar[t * rows + r]);
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{format:?} row {r}, {k} inputs: {g} vs {want}"
                        );
                        assert_eq!(s.to_bits(), want.to_bits(), "{format:?} row {r}, scalar");
                        let w = &dense[r * cols..(r + 1) * cols];
                        let exact: f64 = w
                            .iter()
                            .zip(xt)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum();
                        let size: f64 = w
                            .iter()
                            .zip(xt)
                            .map(|(a, b)| f64::from((a * b).abs()))
                            .sum();
                        assert!(
                            (f64::from(g) - exact).abs() <= 1e-6 * size,
                            "{format:?}: {g} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}
