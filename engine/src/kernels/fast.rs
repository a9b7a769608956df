//! Instruction-set fast paths that compute exactly what the portable
//! kernels compute.
//!
//! The portable products widen a tile of F16 weights into an f32 buffer with
//! integer operations (nine per sixteen weights), then read it back. On
//! AVX-512 one instruction widens sixteen halves exactly, so a one-row
//! product can widen in registers and fuse straight away: the same sums, in
//! the same lanes, in the same order. Decoding the 5.1 GB Qwen3-MoE warm,
//! products are most of a token's time and their weights come from DRAM at
//! about 40 GB/s; the buffer round trip kept them below that.
//!
//! While a group of rows is computed (two for F16 and BF16, four for Q4_K
//! and Q6_K, eight for the others: `STREAMED_ROWS`, `BLOCKWISE_ROWS`,
//! `ROWS`), the next group is prefetched, one cache line per row
//! per 32 weights: the hardware prefetchers restart at every 4 KiB page and
//! follow only a few streams, and an expert's matrices are short (1–2 KiB
//! rows). A [32000×1024] product went from 1.43 ms to 1.07 ms (46 to 61
//! GB/s), and warm decoding of the 5.1 GB Qwen3-MoE from 37.6 to 48.3 tok/s
//! (200 tokens, three runs each, interleaved). Two F16 rows at a time
//! without the prefetches read a decode step's experts at 14–19 GB/s,
//! against 24–36 with them.
//!
//! GGML's Q8_0 blocks are widened the same way, one block's weights sixteen
//! to a register: a one-row [1024×1024] product went from 3.5 to 28.8 G
//! weights/s; F16 runs at 41. Q4_K and Q6_K are summed blockwise
//! ([`crate::kernels::kquant`]): integers into lanes (Q4_K's nibbles made
//! floats by a sixteen-entry lookup, Q6_K's bits put together 64 bytes at a
//! time), scales unpacked with byte shuffles, several rows' chains of
//! multiply-adds side by side. Widened per weight they ran at 11.4 (Q4_K)
//! and 5.7 (Q6_K) G weights/s; blockwise at 30 and 14.6. Block scales are
//! then widened from F16 by `vcvtph2ps`, as F16 weights are, rather than by
//! [`f16_to_f32`]'s integer work and multiply per block: Q8_0 went from 25
//! to 37, Q4_K to 37 and Q6_K to 25, and a warm Q4_K_M Qwen3-MoE decodes at
//! 90–98 tok/s where it decoded at 29–35.
//!
//! MXFP4 and INT4 rows (4-bit values in blocks of 32) are widened the same
//! way, nibbles in order into lanes, then scaled (and for INT4 rounded to
//! BF16 as compressed-tensors does) in registers: warm decoding of a 0.85 B
//! gpt-oss went from 59–86 to 98–151 tok/s (BF16: 110–124), and of a 0.75 B
//! DeepSeek-V3 in INT4 from 110–120 to 146–163 (BF16: 126–130).

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{fast_path, matvec, matvec_inputs};

#[cfg(target_arch = "aarch64")]
pub(super) use super::neon::{fast_path, matvec};

/// The instruction set `format`'s one-row products take on this machine;
/// `None` where they take the portable tiles.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) fn fast_path(_: crate::kernels::Format) -> Option<&'static str> {
    None
}

/// Most input rows a product with `format` takes through the fast paths
/// (see [`matvec_each`]); more go through the portable tiles, which decode a
/// weight once for four input rows. Through the tiles, two input rows of a
/// [1024×1024] F16 matrix took 0.25 ms on one AVX-512 core against 0.048
/// for one (Q8_0: 0.54 against 0.065; Q4_K: 0.29 against 0.065), so answers
/// decoded together and guesses verified at once paid several times a
/// token's products. Q8_0, Q4_K and Q6_K rows go through the one-row paths
/// one input after another: two took 0.14 ms, and eight 0.57 against the
/// tiles' 0.68 (Q4_K 0.52 against 0.67). F16 and BF16 rows widen each
/// weight register once for up to four inputs ([`matvec_inputs`]): on an
/// AMD EPYC (Zen 4), two inputs took 0.064–0.087 ms against 0.118–0.161
/// one after another, four 0.099–0.136 against the tiles' 0.161–0.32, eight
/// 0.19–0.25 against 0.29–0.63 and sixteen 0.41–0.45 against 0.47–0.73;
/// from 64 inputs on the two ran alike (1.7–2.3 ms), so prompts keep the
/// tiles. INT4 and MXFP4 tiles decode each weight once for four input
/// rows, where the one-row paths decode it again for each: eight answers of
/// a DeepSeek-V3-shaped INT4 pack decoded together at 35–40 tok/s one row
/// after another and at 61 through the tiles, so those formats keep the
/// tiles.
pub(super) fn each_max_inputs(format: crate::kernels::Format) -> usize {
    use crate::kernels::Format;
    match format {
        // Only x86-64 has the fused inputs path; elsewhere one-row passes
        // would read the weights once per input, where the tiles decode
        // them once for four.
        Format::F16 | Format::BF16 if cfg!(target_arch = "x86_64") => FUSED_MAX_INPUTS,
        Format::Q8_0 | Format::Q4K | Format::Q6K => 8,
        _ => 1,
    }
}

/// Most input rows F16 and BF16 products take through [`matvec_inputs`]
/// (see [`each_max_inputs`]).
const FUSED_MAX_INPUTS: usize = 16;

/// Bytes of weight rows computed for every input row before the next rows:
/// they stay in a core's L2 cache from the first input row to the last.
const EACH_CHUNK_BYTES: usize = 256 << 10;

/// `out[r·n + t] = Σ_k W[r][k] · x[t][k]` for the `n` input rows of `x`
/// (`sums` holds each row's sub-block sums in turn, for blockwise formats),
/// F16 and BF16 rows through [`matvec_inputs`], others through the one-row
/// fast path for each input: bitwise what `n` one-row products give. Weight
/// rows go a cache-sized chunk at a time.
/// `false` (and nothing written) where [`matvec`] has no fast path.
#[allow(clippy::too_many_arguments)]
pub(super) fn matvec_each(
    format: crate::kernels::Format,
    bytes: &[u8],
    row_bytes: usize,
    rows: usize,
    x: &[f32],
    n: usize,
    sums: &[f32],
    out: &mut [f32],
) -> bool {
    let (cols, per) = (x.len() / n.max(1), sums.len() / n.max(1));
    let chunk = (EACH_CHUNK_BYTES / row_bytes.max(1)).max(1);
    // One input's outputs, for formats without a fused path (allocated
    // only then).
    let mut part = Vec::new();
    for first in (0..rows).step_by(chunk) {
        let count = chunk.min(rows - first);
        let w = &bytes[first * row_bytes..(first + count) * row_bytes];
        if matvec_inputs(
            format,
            w,
            row_bytes,
            count,
            x,
            n,
            &mut out[first * n..(first + count) * n],
        ) {
            continue;
        }
        part.resize(chunk.min(rows), 0f32);
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            let st = &sums[t * per..(t + 1) * per];
            if !matvec(format, w, row_bytes, count, xt, st, &mut part[..count]) {
                return false;
            }
            for (r, v) in part[..count].iter().enumerate() {
                out[(first + r) * n + t] = *v;
            }
        }
    }
    true
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn matvec_inputs(
    _: crate::kernels::Format,
    _: &[u8],
    _: usize,
    _: usize,
    _: &[f32],
    _: usize,
    _: &mut [f32],
) -> bool {
    false
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) fn matvec(
    _: crate::kernels::Format,
    _: &[u8],
    _: usize,
    _: usize,
    _: &[f32],
    _: &[f32],
    _: &mut [f32],
) -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{__m128i, __m512, __m512i, _MM_HINT_T0, _mm_prefetch};

    use pulp::bytemuck::cast;
    use pulp::x86::V4;
    use pulp::{Simd, WithSimd};

    use crate::kernels::dot::{LANES, finish, tree_sum};
    use crate::kernels::format::{
        E2M1_EXPONENT_SHIFT, MXFP4_BLOCK, bf16_to_f32, e8m0_to_f32, f16_to_f32,
    };
    use crate::kernels::{Format, ggml};

    /// Rows fused together: eight accumulators, eight weight streams. A
    /// thread then keeps enough reads in flight to stream a matrix from DRAM:
    /// a decode step's 192 experts took 22 ms with four rows, 13.6 ms with
    /// eight (44 GB/s, the machine's read bandwidth) and 20 ms with sixteen.
    /// MXFP4, INT4 and Q8_0 rows go eight at a time; a warm Q8_0 GGUF of
    /// the Qwen3-MoE decoded no faster with four (39.8–50.3 tok/s against
    /// 46.3–52.8 with eight, runs taken in turn on an AMD EPYC).
    const ROWS: usize = 8;
    /// F16 and BF16 rows fused together. A warm decode step streams them
    /// from DRAM at one multiply-add per weight, and on an AMD EPYC (Zen 4)
    /// eight streams at once read slower than two: a decode step's 192
    /// experts took 24–35 ms with eight rows and 19–23 ms with two (26–31
    /// GB/s, the two cores' read bandwidth), in runs taken in turn. The
    /// formats that take more work per weight fuse more rows
    /// ([`BLOCKWISE_ROWS`], [`ROWS`]), whose chains hide the multiply-adds'
    /// latency.
    const STREAMED_ROWS: usize = 2;
    /// Q4_K and Q6_K rows fused together. From cache their blockwise sums
    /// run fastest as eight chains side by side (Q4_K: 18.1 G weights/s
    /// against 15.8 with two), but a warm decode streams them from DRAM,
    /// where eight streams read slower here too: a warm Q4_K_M Qwen3-MoE
    /// decoded at 37–49 tok/s (mean 43.6) with eight rows, 43–60 (mean
    /// 49.7) with two and 47–67 (mean 53.4) with four, in runs taken in turn.
    const BLOCKWISE_ROWS: usize = 4;
    /// Bytes of sixteen F16 weights.
    const BLOCK_BYTES: usize = 2 * LANES;
    const CACHE_LINE: usize = 64;

    /// `out[r] = Σ_k W[r][k] · x[k]` for `rows` rows of `row_bytes` bytes in
    /// `bytes`, on AVX-512, for F16, BF16, MXFP4, INT4 and Q8_0 rows, and Q4_K and
    /// Q6_K ones blockwise in the order of [`crate::kernels::kquant`] (with
    /// `sums`, the sub-block sums of `x`); `false` (and nothing written) for
    /// other formats or where the machine has no AVX-512. 4-bit values are widened in registers (nibbles in order,
    /// then put in place and scaled) and fused straight into the sums, the
    /// same values in the same lanes in the same order as the portable
    /// path; decoding into a buffer first made MXFP4 experts decode at half
    /// the speed of BF16 ones.
    pub(in crate::kernels) fn matvec(
        format: Format,
        bytes: &[u8],
        row_bytes: usize,
        rows: usize,
        x: &[f32],
        sums: &[f32],
        out: &mut [f32],
    ) -> bool {
        if !has_path(format) {
            return false;
        }
        let Some(simd) = V4::try_new() else {
            return false;
        };
        Simd::vectorize(
            simd,
            MatVec {
                format,
                simd,
                bytes,
                row_bytes,
                rows,
                x,
                sums,
                out,
            },
        );
        true
    }

    /// The formats with a one-row AVX-512 path.
    fn has_path(format: Format) -> bool {
        matches!(
            format,
            Format::F16
                | Format::BF16
                | Format::Mxfp4
                | Format::Int4G32
                | Format::Q8_0
                | Format::Q4K
                | Format::Q6K
        )
    }

    /// `avx512` for the formats [`matvec`] computes on this machine.
    pub(in crate::kernels) fn fast_path(format: Format) -> Option<&'static str> {
        (has_path(format) && V4::try_new().is_some()).then_some("avx512")
    }

    struct MatVec<'a> {
        format: Format,
        simd: V4,
        bytes: &'a [u8],
        row_bytes: usize,
        rows: usize,
        x: &'a [f32],
        /// The sub-block sums of `x`, for blockwise formats.
        sums: &'a [f32],
        out: &'a mut [f32],
    }

    impl WithSimd for MatVec<'_> {
        type Output = ();

        #[inline(always)]
        fn with_simd<S: Simd>(self, _: S) {
            let mut this = self;
            let r = match this.format {
                Format::F16 | Format::BF16 => this.groups::<STREAMED_ROWS>(0),
                Format::Q4K | Format::Q6K => this.groups::<BLOCKWISE_ROWS>(0),
                _ => this.groups::<ROWS>(0),
            };
            this.groups::<1>(r);
        }
    }

    impl MatVec<'_> {
        /// Rows from `first` on, `R` at a time while `R` are left, the next
        /// `R` prefetched meanwhile; returns the first row not computed.
        #[inline(always)]
        fn groups<const R: usize>(&mut self, first: usize) -> usize {
            let (simd, x, sums, bytes, row_bytes) =
                (self.simd, self.x, self.sums, self.bytes, self.row_bytes);
            let mut r = first;
            while r + R <= self.rows {
                let next = bytes.as_ptr().wrapping_add((r + R) * row_bytes);
                let w =
                    std::array::from_fn(|i| &bytes[(r + i) * row_bytes..(r + i + 1) * row_bytes]);
                let got = match self.format {
                    Format::Mxfp4 => block_mxfp4::<R>(simd, w, x, next),
                    Format::Int4G32 => block_int4::<R>(simd, w, x, next),
                    Format::Q8_0 => ggml_q8_0::<R>(simd, w, x, next),
                    Format::Q4K => blockwise_q4_k::<R>(simd, w, x, sums, next),
                    Format::Q6K => blockwise_q6_k::<R>(simd, w, x, next),
                    Format::BF16 => block::<R, true>(simd, w, x, next),
                    _ => block::<R, false>(simd, w, x, next),
                };
                self.out[r..r + R].copy_from_slice(&got);
                r += R;
            }
            r
        }
    }

    /// Input rows fused with each F16 or BF16 weight row: every weight
    /// register is widened once and multiplied into this many inputs' sums
    /// (through [`block`], one input after another, it is widened again for
    /// each). With four, a product from cache runs at about one 512-bit
    /// multiply-add per cycle, the core's rate on Zen 4: 39–46 G
    /// weight-inputs/s for four and eight inputs of a [1024×1024] matrix.
    /// One input keeps [`block`]: [`block_inputs`] with one input ran 10–15 %
    /// slower from cache.
    const FUSED_INPUTS: usize = 4;

    /// `out[r·n + t] = Σ_k W[r][k] · x[t][k]` for F16 and BF16 rows and the
    /// `n` input rows of `x`, up to [`FUSED_INPUTS`] inputs per pass over the
    /// weights, each sum the chain [`block`] forms for one input: bitwise
    /// the one-row products. `false` (and nothing written) for other formats
    /// or where the machine has no AVX-512.
    pub(in crate::kernels) fn matvec_inputs(
        format: Format,
        bytes: &[u8],
        row_bytes: usize,
        rows: usize,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> bool {
        if !matches!(format, Format::F16 | Format::BF16) || n == 0 {
            return false;
        }
        let Some(simd) = V4::try_new() else {
            return false;
        };
        let bf = format == Format::BF16;
        Simd::vectorize(
            simd,
            MatVecInputs {
                bf,
                simd,
                bytes,
                row_bytes,
                rows,
                x,
                n,
                out,
            },
        );
        true
    }

    struct MatVecInputs<'a> {
        bf: bool,
        simd: V4,
        bytes: &'a [u8],
        row_bytes: usize,
        rows: usize,
        x: &'a [f32],
        n: usize,
        out: &'a mut [f32],
    }

    impl WithSimd for MatVecInputs<'_> {
        type Output = ();

        #[inline(always)]
        fn with_simd<S: Simd>(self, _: S) {
            let mut this = self;
            let mut t = 0;
            while t < this.n {
                t += match (this.n - t).min(FUSED_INPUTS) {
                    1 => this.inputs::<1>(t),
                    2 => this.inputs::<2>(t),
                    3 => this.inputs::<3>(t),
                    _ => this.inputs::<FUSED_INPUTS>(t),
                };
            }
        }
    }

    impl MatVecInputs<'_> {
        /// Inputs `t0..t0 + N` against every row; returns `N`.
        #[inline(always)]
        fn inputs<const N: usize>(&mut self, t0: usize) -> usize {
            let r = self.groups::<STREAMED_ROWS, N>(t0, 0);
            self.groups::<1, N>(t0, r);
            N
        }

        /// Rows from `first` on, `R` at a time while `R` are left, against
        /// inputs `t0..t0 + N`; returns the first row not computed.
        #[inline(always)]
        fn groups<const R: usize, const N: usize>(&mut self, t0: usize, first: usize) -> usize {
            let (simd, bytes, row_bytes, n) = (self.simd, self.bytes, self.row_bytes, self.n);
            let cols = self.x.len() / n;
            let x: [&[f32]; N] =
                std::array::from_fn(|j| &self.x[(t0 + j) * cols..(t0 + j + 1) * cols]);
            let mut r = first;
            while r + R <= self.rows {
                let next = bytes.as_ptr().wrapping_add((r + R) * row_bytes);
                let w =
                    std::array::from_fn(|i| &bytes[(r + i) * row_bytes..(r + i + 1) * row_bytes]);
                let got = match self.bf {
                    true => block_inputs::<R, N, true>(simd, w, x, next),
                    false => block_inputs::<R, N, false>(simd, w, x, next),
                };
                for (i, got) in got.iter().enumerate() {
                    self.out[(r + i) * n + t0..(r + i) * n + t0 + N].copy_from_slice(got);
                }
                r += R;
            }
            r
        }
    }

    /// Prefetches the `R` rows at `next` while block `i` of sixteen halves
    /// is summed: one cache line per row every second block.
    #[inline(always)]
    fn prefetch_halves<const R: usize>(next: *const u8, i: usize) {
        if next.is_null() || !i.is_multiple_of(2) {
            return;
        }
        for l in 0..R {
            let p = next.wrapping_add((i / 2 * R + l) * CACHE_LINE);
            // SAFETY: SSE is part of x86-64, and a prefetch is a hint that
            // never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
        }
    }

    /// Sixteen F16 weights (BF16 ones when `BF`) widened exactly.
    #[inline(always)]
    fn widen_halves<const BF: bool>(simd: V4, halves: [u8; BLOCK_BYTES]) -> __m512 {
        let a = simd.avx512f;
        match BF {
            true => {
                let halves = a._mm512_cvtepu16_epi32(cast(halves));
                a._mm512_castsi512_ps(a._mm512_slli_epi32::<16>(halves))
            }
            false => a._mm512_cvtph_ps(cast(halves)),
        }
    }

    /// The halves of a row past its last whole block, widened.
    fn tail_halves<const BF: bool>(bytes: &[u8]) -> Vec<f32> {
        bytes
            .as_chunks::<2>()
            .0
            .iter()
            .map(|h| match BF {
                true => bf16_to_f32(u16::from_le_bytes(*h)),
                false => f16_to_f32(u16::from_le_bytes(*h)),
            })
            .collect()
    }

    /// [`block`] for `N` inputs at once: each weight register widened once
    /// and fused into every input's sums, each sum the same chain in the
    /// same lanes as one input's.
    #[inline(always)]
    fn block_inputs<const R: usize, const N: usize, const BF: bool>(
        simd: V4,
        w: [&[u8]; R],
        x: [&[f32]; N],
        next: *const u8,
    ) -> [[f32; N]; R] {
        let a = simd.avx512f;
        let blocks = x[0].len() / LANES;
        let mut acc = [[a._mm512_setzero_ps(); N]; R];
        for i in 0..blocks {
            prefetch_halves::<R>(next, i);
            let xv: [__m512; N] = std::array::from_fn(|t| {
                let (xs, _) = x[t].as_chunks::<LANES>();
                cast(xs[i])
            });
            for r in 0..R {
                let (wb, _) = w[r].as_chunks::<BLOCK_BYTES>();
                let wv = widen_halves::<BF>(simd, wb[i]);
                for t in 0..N {
                    acc[r][t] = a._mm512_fmadd_ps(wv, xv[t], acc[r][t]);
                }
            }
        }
        std::array::from_fn(|r| {
            let tail = tail_halves::<BF>(&w[r][blocks * BLOCK_BYTES..]);
            std::array::from_fn(|t| finish(cast(acc[r][t]), &tail, &x[t][blocks * LANES..]))
        })
    }

    /// `R` F16 rows (BF16 ones when `BF`) dotted with `x`, each in the
    /// canonical order. BF16 widens by shifting each half into the top of a
    /// lane: exact, as `bf16_to_f32` is. Through the portable path, BF16
    /// rows ran at 14.5–17 G weights/s one row at a time on AVX-512, F16
    /// rows here at 40–44.
    #[inline(always)]
    fn block<const R: usize, const BF: bool>(
        simd: V4,
        w: [&[u8]; R],
        x: &[f32],
        next: *const u8,
    ) -> [f32; R] {
        let a = simd.avx512f;
        let (xs, x_tail) = x.as_chunks::<LANES>();
        let blocks = xs.len();
        let mut acc = [a._mm512_setzero_ps(); R];
        for (i, xb) in xs.iter().enumerate() {
            prefetch_halves::<R>(next, i);
            let xv = cast(*xb);
            for r in 0..R {
                let (wb, _) = w[r].as_chunks::<BLOCK_BYTES>();
                let wv = widen_halves::<BF>(simd, wb[i]);
                acc[r] = a._mm512_fmadd_ps(wv, xv, acc[r]);
            }
        }
        let mut sums = [0f32; R];
        for r in 0..R {
            let lanes: [f32; LANES] = cast(acc[r]);
            let tail = tail_halves::<BF>(&w[r][blocks * BLOCK_BYTES..]);
            sums[r] = finish(lanes, &tail, x_tail);
        }
        sums
    }

    /// Bytes of the 4-bit values of a block of 32.
    const NIBBLE_BYTES: usize = MXFP4_BLOCK / 2;

    /// `R` MXFP4 rows dotted with `x`: E2M1 bits put in place in an f32 and
    /// rebased, times the block's power of two.
    #[inline(always)]
    fn block_mxfp4<const R: usize>(
        simd: V4,
        w: [&[u8]; R],
        x: &[f32],
        next: *const u8,
    ) -> [f32; R] {
        let a = simd.avx512f;
        let (seven, eight) = (a._mm512_set1_epi32(7), a._mm512_set1_epi32(8));
        let shift = a._mm512_set1_ps(E2M1_EXPONENT_SHIFT);
        let widen = |n: __m512i, scale: __m512| {
            let m = a._mm512_slli_epi32::<22>(a._mm512_and_si512(n, seven));
            let sign = a._mm512_slli_epi32::<28>(a._mm512_and_si512(n, eight));
            let v = a._mm512_mul_ps(a._mm512_castsi512_ps(a._mm512_or_si512(m, sign)), shift);
            a._mm512_mul_ps(v, scale)
        };
        block_nibbles::<R, 1>(simd, w, x, next, |s| e8m0_to_f32(s[0]), widen)
    }

    /// `R` INT4 rows dotted with `x`: each nibble less 8, times the BF16
    /// scale, the product rounded to BF16 (ties to even) in the lanes.
    #[inline(always)]
    fn block_int4<const R: usize>(simd: V4, w: [&[u8]; R], x: &[f32], next: *const u8) -> [f32; R] {
        let a = simd.avx512f;
        let (eight, one) = (a._mm512_set1_epi32(8), a._mm512_set1_epi32(1));
        let (half_ulp, high) = (a._mm512_set1_epi32(0x7FFF), a._mm512_set1_epi32(-65536));
        let widen = |n: __m512i, scale: __m512| {
            let q = a._mm512_cvtepi32_ps(a._mm512_sub_epi32(n, eight));
            let bits = a._mm512_castps_si512(a._mm512_mul_ps(q, scale));
            let lsb = a._mm512_and_si512(a._mm512_srli_epi32::<16>(bits), one);
            let up = a._mm512_add_epi32(bits, a._mm512_add_epi32(half_ulp, lsb));
            a._mm512_castsi512_ps(a._mm512_and_si512(up, high))
        };
        let scale = |s: &[u8]| bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
        block_nibbles::<R, 2>(simd, w, x, next, scale, widen)
    }

    /// `R` rows of 4-bit blocks of 32 — a `SCALE`-byte scale, then 16 bytes
    /// of values, low nibble first — dotted with `x` (a whole number of
    /// blocks long), each in the canonical order. `widen` turns sixteen
    /// nibbles (one per 32-bit lane, in order) and the block's scale into
    /// weights; the rows at `next` are prefetched as [`block`] does.
    #[inline(always)]
    fn block_nibbles<const R: usize, const SCALE: usize>(
        simd: V4,
        w: [&[u8]; R],
        x: &[f32],
        next: *const u8,
        scale_of: impl Fn(&[u8]) -> f32,
        widen: impl Fn(__m512i, __m512) -> __m512,
    ) -> [f32; R] {
        let block_bytes = SCALE + NIBBLE_BYTES;
        let (xs, _) = x.as_chunks::<LANES>();
        let a = simd.avx512f;
        let low = simd.sse2._mm_set1_epi8(0x0F);
        let mut acc = [a._mm512_setzero_ps(); R];
        let blocks = xs.len() / 2;
        for b in 0..blocks {
            if !next.is_null() {
                for l in 0..R {
                    let p = next.wrapping_add((b * R + l) * block_bytes);
                    // SAFETY: SSE is part of x86-64, and a prefetch is a
                    // hint that never faults, whatever the address.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
                }
            }
            let (x0, x1) = (cast(xs[2 * b]), cast(xs[2 * b + 1]));
            for r in 0..R {
                let blk = &w[r][b * block_bytes..(b + 1) * block_bytes];
                let scale = a._mm512_set1_ps(scale_of(&blk[..SCALE]));
                let mut packed = [0u8; NIBBLE_BYTES];
                packed.copy_from_slice(&blk[SCALE..]);
                let v = cast(packed);
                let lo = simd.sse2._mm_and_si128(v, low);
                let hi = simd
                    .sse2
                    ._mm_and_si128(simd.sse2._mm_srli_epi16::<4>(v), low);
                let first = a._mm512_cvtepu8_epi32(simd.sse2._mm_unpacklo_epi8(lo, hi));
                let second = a._mm512_cvtepu8_epi32(simd.sse2._mm_unpackhi_epi8(lo, hi));
                acc[r] = a._mm512_fmadd_ps(widen(first, scale), x0, acc[r]);
                acc[r] = a._mm512_fmadd_ps(widen(second, scale), x1, acc[r]);
            }
        }
        std::array::from_fn(|r| finish(cast(acc[r]), &[], &[]))
    }

    /// `R` rows of GGML blocks (`BYTES` bytes, `CHUNKS` × 16 values each)
    /// dotted with `x`: `widen` gives a block's weights sixteen to a
    /// register, exactly as [`crate::kernels::ggml`] decodes them (a product,
    /// then a difference, never fused), and each register is fused into the
    /// row's sums in order, as the portable path sums them.
    #[inline(always)]
    fn block_ggml<const R: usize, const BYTES: usize, const CHUNKS: usize>(
        simd: V4,
        w: [&[u8]; R],
        x: &[f32],
        next: *const u8,
        widen: impl Fn(&[u8; BYTES]) -> [__m512; CHUNKS],
    ) -> [f32; R] {
        let (xs, _) = x.as_chunks::<LANES>();
        let a = simd.avx512f;
        let mut acc = [a._mm512_setzero_ps(); R];
        for b in 0..xs.len() / CHUNKS {
            if !next.is_null() {
                for l in 0..R {
                    for line in (0..BYTES).step_by(CACHE_LINE) {
                        let p = next.wrapping_add((b * R + l) * BYTES + line);
                        // SAFETY: SSE is part of x86-64, and a prefetch is a
                        // hint that never faults, whatever the address.
                        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
                    }
                }
            }
            for r in 0..R {
                let (blocks, _) = w[r].as_chunks::<BYTES>();
                let v = widen(&blocks[b]);
                for (k, v) in v.into_iter().enumerate() {
                    acc[r] = a._mm512_fmadd_ps(v, cast(xs[b * CHUNKS + k]), acc[r]);
                }
            }
        }
        std::array::from_fn(|r| finish(cast(acc[r]), &[], &[]))
    }

    /// Sixteen bytes at `at` of `b`.
    #[inline(always)]
    fn sixteen(b: &[u8], at: usize) -> [u8; 16] {
        let mut v = [0u8; 16];
        v.copy_from_slice(&b[at..at + 16]);
        v
    }

    /// Q8_0: each signed byte times the block's scale.
    #[inline(always)]
    fn ggml_q8_0<const R: usize>(simd: V4, w: [&[u8]; R], x: &[f32], next: *const u8) -> [f32; R] {
        let a = simd.avx512f;
        block_ggml::<R, { ggml::Q8_0_BYTES }, 2>(
            simd,
            w,
            x,
            next,
            #[inline(always)]
            |b| {
                let d = a._mm512_cvtph_ps(cast([u16::from_le_bytes([b[0], b[1]]); LANES]));
                std::array::from_fn(|k| {
                    let q = a._mm512_cvtepi8_epi32(cast(sixteen(b, 2 + 16 * k)));
                    a._mm512_mul_ps(a._mm512_cvtepi32_ps(q), d)
                })
            },
        )
    }

    /// Prefetches block `b` of the `R` rows of `BYTES`-byte blocks at `next`.
    #[inline(always)]
    fn prefetch_blocks<const R: usize, const BYTES: usize>(next: *const u8, b: usize) {
        if next.is_null() {
            return;
        }
        for l in 0..R {
            for line in (0..BYTES).step_by(CACHE_LINE) {
                let p = next.wrapping_add((b * R + l) * BYTES + line);
                // SAFETY: SSE is part of x86-64, and a prefetch is a hint
                // that never faults, whatever the address.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
            }
        }
    }

    /// A Q4_K super-block's eight `d × scale` (lanes 0–7) and eight
    /// `dmin × min` (lanes 8–15), the products [`ggml::q4_k_scales`] forms,
    /// unpacked from their 12 bytes with byte shuffles.
    #[inline(always)]
    fn q4_k_scales(simd: V4, blk: &[u8]) -> __m512 {
        let (a, s2, s3) = (simd.avx512f, simd.sse2, simd.ssse3);
        let mut packed = [0u8; 16];
        packed[..12].copy_from_slice(&blk[4..ggml::Q4_K_QS]);
        let packed = cast(packed);
        // Scales 0–3 and minimums 0–3 are six bits of bytes 0–3 and 4–7;
        // scales 4–7 the low nibbles of bytes 8–11 and minimums 4–7 their
        // high nibbles, each topped with the two high bits of bytes 0–3
        // and 4–7.
        let z = -128i8;
        let base = s3._mm_shuffle_epi8(
            packed,
            cast([0i8, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11]),
        );
        let tops = s3._mm_shuffle_epi8(
            packed,
            cast([z, z, z, z, 0, 1, 2, 3, z, z, z, z, 4, 5, 6, 7]),
        );
        let shifted = s2._mm_srli_epi16::<4>(base);
        let upper_nibbles: __m128i = cast([0i8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1]);
        let low = s2._mm_or_si128(
            s2._mm_andnot_si128(upper_nibbles, base),
            s2._mm_and_si128(upper_nibbles, shifted),
        );
        let low = s2._mm_and_si128(
            low,
            cast([
                63i8, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15,
            ]),
        );
        let tops = s2._mm_and_si128(s2._mm_srli_epi16::<2>(tops), s2._mm_set1_epi8(0x30));
        let six = a._mm512_cvtepi32_ps(a._mm512_cvtepu8_epi32(s2._mm_or_si128(low, tops)));
        // `d` in lanes 0–7, `dmin` in 8–15, widened by the instruction that
        // widens F16 weights (exact, as `f16_to_f32`).
        let mut halves = [u16::from_le_bytes([blk[0], blk[1]]); LANES];
        halves[LANES / 2..].fill(u16::from_le_bytes([blk[2], blk[3]]));
        a._mm512_mul_ps(six, a._mm512_cvtph_ps(cast(halves)))
    }

    /// Q4_K, blockwise: in each group of 64, sixteen bytes at a time widened
    /// once to lanes, their low nibbles the first sub-block's integers and
    /// their high nibbles the second's, each made a float by a lookup in
    /// the sixteen values 0–15 (which reads only a lane's low four bits).
    #[inline(always)]
    fn blockwise_q4_k<const R: usize>(
        simd: V4,
        w: [&[u8]; R],
        x: &[f32],
        sums: &[f32],
        next: *const u8,
    ) -> [f32; R] {
        const SUBS: usize = 8;
        let a = simd.avx512f;
        let (xs, _) = x.as_chunks::<LANES>();
        let zero = a._mm512_setzero_ps();
        let values: __m512 = cast(std::array::from_fn::<f32, LANES, _>(|i| i as f32));
        let mut acc = [zero; R];
        let mut mins = [zero; R];
        for b in 0..xs.len() / 16 {
            prefetch_blocks::<R, { ggml::Q4_K_BYTES }>(next, b);
            let mut sub_sums = [0f32; LANES];
            sub_sums[..SUBS].copy_from_slice(&sums[SUBS * b..SUBS * (b + 1)]);
            let sub_sums: __m512 = cast(sub_sums);
            let x = |k: usize| -> __m512 { cast(xs[16 * b + k]) };
            // Rows inner: each row's sums are a chain of dependent
            // multiply-adds, and `R` chains side by side hide their latency.
            let blk = |r: usize| &w[r].as_chunks::<{ ggml::Q4_K_BYTES }>().0[b];
            let mut d = [[0f32; LANES]; R];
            for r in 0..R {
                let dm = q4_k_scales(simd, blk(r));
                // The minimums moved to lanes 0–7, where the sums are.
                let m = a._mm512_shuffle_f32x4::<0b11_10_11_10>(dm, dm);
                mins[r] = a._mm512_mask3_fmadd_ps(m, sub_sums, mins[r], 0x00FF);
                d[r] = cast(dm);
            }
            for g in 0..4 {
                let at = ggml::Q4_K_QS + 32 * g;
                let xg = [x(4 * g), x(4 * g + 1), x(4 * g + 2), x(4 * g + 3)];
                for r in 0..R {
                    let z0 = a._mm512_cvtepu8_epi32(cast(sixteen(blk(r), at)));
                    let z1 = a._mm512_cvtepu8_epi32(cast(sixteen(blk(r), at + 16)));
                    let lo = [
                        a._mm512_permutexvar_ps(z0, values),
                        a._mm512_permutexvar_ps(z1, values),
                    ];
                    let hi = [
                        a._mm512_permutexvar_ps(a._mm512_srli_epi32::<4>(z0), values),
                        a._mm512_permutexvar_ps(a._mm512_srli_epi32::<4>(z1), values),
                    ];
                    let p_lo = a._mm512_fmadd_ps(lo[0], xg[0], zero);
                    let p_lo = a._mm512_fmadd_ps(lo[1], xg[1], p_lo);
                    let p_hi = a._mm512_fmadd_ps(hi[0], xg[2], zero);
                    let p_hi = a._mm512_fmadd_ps(hi[1], xg[3], p_hi);
                    acc[r] = a._mm512_fmadd_ps(a._mm512_set1_ps(d[r][2 * g]), p_lo, acc[r]);
                    acc[r] = a._mm512_fmadd_ps(a._mm512_set1_ps(d[r][2 * g + 1]), p_hi, acc[r]);
                }
            }
        }
        std::array::from_fn(|r| tree_sum(cast(acc[r])) - tree_sum(cast(mins[r])))
    }

    /// Q6_K, blockwise: each half of a super-block (128 values) put together
    /// as signed bytes 64 at a time — low bits from 64 bytes, two high bits
    /// from 32 bytes seen twice, less 32 — then widened sixteen at a time.
    #[inline(always)]
    fn blockwise_q6_k<const R: usize>(
        simd: V4,
        w: [&[u8]; R],
        x: &[f32],
        next: *const u8,
    ) -> [f32; R] {
        let (a, bw) = (simd.avx512f, simd.avx512bw);
        let low = a._mm512_set1_epi8(0x0F);
        let (high, bias) = (a._mm512_set1_epi8(0x30), a._mm512_set1_epi8(32));
        // Values 32j + l of a half (l < 32) take their high bits from byte
        // l shifted by 2j: left by 4 and 2 for j = 0, 1, right by 0 and 2
        // for j = 2, 3, in 16-bit lanes and masked to bits 4–5.
        let left: __m512i = cast(std::array::from_fn::<u16, 32, _>(|i| {
            if i < 16 { 4 } else { 2 }
        }));
        let right: __m512i = cast(std::array::from_fn::<u16, 32, _>(|i| {
            if i < 16 { 0 } else { 2 }
        }));
        let (xs, _) = x.as_chunks::<LANES>();
        let zero = a._mm512_setzero_ps();
        let mut acc = [zero; R];
        for b in 0..xs.len() / 16 {
            prefetch_blocks::<R, { ggml::Q6_K_BYTES }>(next, b);
            // Rows inner, as in Q4_K: `R` chains of multiply-adds side by side.
            let blk = |r: usize| &w[r].as_chunks::<{ ggml::Q6_K_BYTES }>().0[b];
            let mut d = [[0f32; LANES]; R];
            for (r, d) in d.iter_mut().enumerate() {
                // `d × scale`, the products [`ggml::q6_k_scales`] forms.
                let blk = blk(r);
                let scales = a._mm512_cvtepi32_ps(
                    a._mm512_cvtepi8_epi32(cast(sixteen(blk, ggml::Q6_K_SCALES))),
                );
                let dd = u16::from_le_bytes([blk[ggml::Q6_K_BYTES - 2], blk[ggml::Q6_K_BYTES - 1]]);
                let dd = a._mm512_cvtph_ps(cast([dd; LANES]));
                *d = cast(a._mm512_mul_ps(dd, scales));
            }
            for n in 0..2 {
                let mut q = [[a._mm512_setzero_si512(); 2]; R];
                for (r, q) in q.iter_mut().enumerate() {
                    let blk = blk(r);
                    let mut ql = [0u8; 64];
                    ql.copy_from_slice(&blk[64 * n..64 * n + 64]);
                    let ql: __m512i = cast(ql);
                    let mut qh = [0u8; 64];
                    qh[..32]
                        .copy_from_slice(&blk[ggml::Q6_K_QH + 32 * n..ggml::Q6_K_QH + 32 * n + 32]);
                    qh.copy_within(..32, 32);
                    let qh: __m512i = cast(qh);
                    let lows = [
                        a._mm512_and_si512(ql, low),
                        a._mm512_and_si512(bw._mm512_srli_epi16::<4>(ql), low),
                    ];
                    let highs = [
                        bw._mm512_sllv_epi16(qh, left),
                        bw._mm512_srlv_epi16(qh, right),
                    ];
                    for (q, (lows, highs)) in q.iter_mut().zip(lows.into_iter().zip(highs)) {
                        let v = a._mm512_or_si512(lows, a._mm512_and_si512(highs, high));
                        *q = bw._mm512_sub_epi8(v, bias);
                    }
                }
                // Sub-blocks in order, each row's chain in turn.
                #[allow(clippy::needless_range_loop)]
                for k in 0..2 {
                    for c in 0..4 {
                        let sub = 8 * n + 4 * k + c;
                        let xv: __m512 = cast(xs[16 * b + sub]);
                        for r in 0..R {
                            let bytes: [__m128i; 4] = cast(q[r][k]);
                            let qf = a._mm512_cvtepi32_ps(a._mm512_cvtepi8_epi32(bytes[c]));
                            let p = a._mm512_fmadd_ps(qf, xv, zero);
                            acc[r] = a._mm512_fmadd_ps(a._mm512_set1_ps(d[r][sub]), p, acc[r]);
                        }
                    }
                }
            }
        }
        std::array::from_fn(|r| tree_sum(cast(acc[r])) - 0.0)
    }
}
