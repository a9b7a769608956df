//! NEON fast paths (aarch64: Apple Silicon) that compute exactly what the
//! portable kernels compute, for every format with an x86-64 fast path:
//! F16, BF16, Q8_0, Q4_K, Q6_K, INT4 and MXFP4.
//!
//! The canonical order's sixteen running sums ([`crate::kernels::dot`])
//! are four 128-bit registers here: weight `k` is fused into lane
//! `k mod 16` with one rounding (`FMLA`), and the lanes are added as the
//! same fixed tree. Each format's weights are widened in registers the way
//! the AVX-512 paths widen them (`kernels::fast`), so each value and each
//! rounding is the portable path's:
//! - F16 with `FCVTL` (base ARMv8, no FP16 arithmetic needed), BF16 by a
//!   shift into the top of each lane, as `bf16_to_f32` does;
//! - Q8_0's signed bytes and the 4-bit formats' nibbles widened to 32-bit
//!   lanes in order (`SXTL`/`UXTL`, nibbles interleaved with `ZIP1`/`ZIP2`),
//!   made floats, then scaled: a product, never fused into the sum;
//! - Q4_K and Q6_K blockwise, in [`crate::kernels::kquant`]'s order: each
//!   sub-block's products summed, times its scale, into the sums, with
//!   Q4_K's minimums against the input's sub-block sums.
//!
//! Integer dot products (`SDOT`) would sum a block's integers before
//! scaling, another order than the portable path's float sums, so they are
//! not used. Checked bit for bit against the portable path by the matrix
//! tests (random shapes, every format), and every fixture's logits against
//! x86-64's, under qemu in CI; their speed has not been measured (no
//! aarch64 machine where Longhaul is built).

use core::arch::aarch64 as a;
use core::arch::aarch64::{float32x4_t, int8x16_t, uint8x16_t, uint16x4_t, uint32x4_t};

use crate::kernels::dot::{LANES, finish, tree_sum};
use crate::kernels::format::{E2M1_EXPONENT_SHIFT, bf16_to_f32, e8m0_to_f32, f16_to_f32};
use crate::kernels::{Format, ggml};

/// 128-bit registers holding the sixteen running sums.
const QUARTERS: usize = LANES / 4;
/// Bytes of sixteen F16 or BF16 weights.
const BLOCK_BYTES: usize = 2 * LANES;
/// Bytes of the 4-bit values of an MXFP4 or INT4 block of 32.
const NIBBLE_BYTES: usize = 16;
/// Sixteen-value chunks in a k-quant super-block of 256.
const SUPER_CHUNKS: usize = ggml::QK_K / LANES;

/// Sixteen floats, four lanes to a register, in the canonical lanes.
type Sixteen = [float32x4_t; QUARTERS];

/// `neon` for the formats [`matvec`] computes.
pub(in crate::kernels) fn fast_path(format: Format) -> Option<&'static str> {
    has_path(format).then_some("neon")
}

fn has_path(format: Format) -> bool {
    matches!(
        format,
        Format::F16
            | Format::BF16
            | Format::Q8_0
            | Format::Q4K
            | Format::Q6K
            | Format::Int4G32
            | Format::Mxfp4
    )
}

/// `out[r] = Σ_k W[r][k] · x[k]` for `rows` rows of `row_bytes` bytes in
/// `bytes`, in the canonical order (Q4_K and Q6_K blockwise, with `sums`
/// the sub-block sums of `x`); `false` (and nothing written) for formats
/// without a NEON path.
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
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        let w = &bytes[r * row_bytes..(r + 1) * row_bytes];
        *o = match format {
            Format::BF16 => halves::<true>(w, x),
            Format::Q8_0 => q8_0(w, x),
            Format::Q4K => q4_k(w, x, sums),
            Format::Q6K => q6_k(w, x),
            Format::Int4G32 => nibbles::<2>(w, x, int4_scale, int4_weights),
            Format::Mxfp4 => nibbles::<1>(w, x, |s| e8m0_to_f32(s[0]), mxfp4_weights),
            Format::F16 => halves::<false>(w, x),
            _ => return false,
        };
    }
    true
}

#[inline(always)]
fn splat(v: f32) -> Sixteen {
    // SAFETY: NEON is part of every aarch64 target; the intrinsics in this
    // module's register helpers only move, convert and compute register
    // contents.
    [unsafe { a::vdupq_n_f32(v) }; QUARTERS]
}

/// Sixteen inputs, in order.
#[inline(always)]
fn load(x: &[f32; LANES]) -> Sixteen {
    // SAFETY: each load reads four floats inside `x` (sixteen long).
    std::array::from_fn(|q| unsafe { a::vld1q_f32(x.as_ptr().add(4 * q)) })
}

/// Sixteen bytes of `b` from `at` (bounds checked).
#[inline(always)]
fn bytes16(b: &[u8], at: usize) -> uint8x16_t {
    let b = &b[at..at + 16];
    // SAFETY: the load reads the sixteen bytes of `b`.
    unsafe { a::vld1q_u8(b.as_ptr()) }
}

/// `acc + w · x` in every lane, rounded once.
#[inline(always)]
fn fma(acc: Sixteen, w: Sixteen, x: Sixteen) -> Sixteen {
    // SAFETY: register arithmetic (see `splat`).
    std::array::from_fn(|q| unsafe { a::vfmaq_f32(acc[q], w[q], x[q]) })
}

#[inline(always)]
fn mul(v: Sixteen, s: Sixteen) -> Sixteen {
    // SAFETY: register arithmetic (see `splat`).
    std::array::from_fn(|q| unsafe { a::vmulq_f32(v[q], s[q]) })
}

#[inline(always)]
fn lanes(v: Sixteen) -> [f32; LANES] {
    let mut out = [0f32; LANES];
    for (q, v) in v.iter().enumerate() {
        // SAFETY: the store writes four floats inside `out`.
        unsafe { a::vst1q_f32(out.as_mut_ptr().add(4 * q), *v) };
    }
    out
}

/// Sixteen unsigned bytes, each in its own 32-bit lane, in order.
#[inline(always)]
fn widen_u8(v: uint8x16_t) -> [uint32x4_t; QUARTERS] {
    // SAFETY: register moves (see `splat`).
    unsafe {
        let (lo, hi) = (
            a::vmovl_u8(a::vget_low_u8(v)),
            a::vmovl_u8(a::vget_high_u8(v)),
        );
        [
            a::vmovl_u16(a::vget_low_u16(lo)),
            a::vmovl_u16(a::vget_high_u16(lo)),
            a::vmovl_u16(a::vget_low_u16(hi)),
            a::vmovl_u16(a::vget_high_u16(hi)),
        ]
    }
}

/// Sixteen unsigned bytes as floats, in order.
#[inline(always)]
fn u8_floats(v: uint8x16_t) -> Sixteen {
    // SAFETY: register conversions (see `splat`).
    widen_u8(v).map(|q| unsafe { a::vcvtq_f32_u32(q) })
}

/// Sixteen signed bytes as floats, in order.
#[inline(always)]
fn i8_floats(v: int8x16_t) -> Sixteen {
    // SAFETY: register moves and conversions (see `splat`).
    unsafe {
        let (lo, hi) = (
            a::vmovl_s8(a::vget_low_s8(v)),
            a::vmovl_s8(a::vget_high_s8(v)),
        );
        [
            a::vget_low_s16(lo),
            a::vget_high_s16(lo),
            a::vget_low_s16(hi),
            a::vget_high_s16(hi),
        ]
        .map(|h| a::vcvtq_f32_s32(a::vmovl_s16(h)))
    }
}

/// Sixteen F16 weights (BF16 ones when `BF`) widened exactly.
#[inline(always)]
fn widen_halves<const BF: bool>(halves: &[u8; BLOCK_BYTES]) -> Sixteen {
    let quarter = |h: uint16x4_t| {
        // SAFETY: register moves and an exact conversion (see `splat`).
        unsafe {
            if BF {
                a::vreinterpretq_f32_u32(a::vshll_n_u16::<16>(h))
            } else {
                a::vcvt_f32_f16(a::vreinterpret_f16_u16(h))
            }
        }
    };
    // SAFETY: each load reads 16 bytes inside `halves` (32 bytes long);
    // the rest are register moves.
    let parts = unsafe {
        let lo = a::vld1q_u16(halves.as_ptr().cast());
        let hi = a::vld1q_u16(halves.as_ptr().add(LANES).cast());
        [
            a::vget_low_u16(lo),
            a::vget_high_u16(lo),
            a::vget_low_u16(hi),
            a::vget_high_u16(hi),
        ]
    };
    parts.map(quarter)
}

/// One F16 (BF16 when `BF`) row dotted with `x` in the canonical order.
#[inline(always)]
fn halves<const BF: bool>(w: &[u8], x: &[f32]) -> f32 {
    let (xs, x_tail) = x.as_chunks::<LANES>();
    let (ws, _) = w.as_chunks::<BLOCK_BYTES>();
    let mut acc = splat(0.0);
    for (xb, wb) in xs.iter().zip(ws) {
        acc = fma(acc, widen_halves::<BF>(wb), load(xb));
    }
    let tail: Vec<f32> = w[xs.len() * BLOCK_BYTES..]
        .as_chunks::<2>()
        .0
        .iter()
        .map(|h| match BF {
            true => bf16_to_f32(u16::from_le_bytes(*h)),
            false => f16_to_f32(u16::from_le_bytes(*h)),
        })
        .collect();
    finish(lanes(acc), &tail, x_tail)
}

/// One Q8_0 row: each signed byte times the block's scale (a product, then
/// fused into the sums), as [`ggml`] decodes it.
#[inline(always)]
fn q8_0(w: &[u8], x: &[f32]) -> f32 {
    let (xs, _) = x.as_chunks::<LANES>();
    let (blocks, _) = w.as_chunks::<{ ggml::Q8_0_BYTES }>();
    let mut acc = splat(0.0);
    for (b, blk) in blocks.iter().enumerate().take(xs.len() / 2) {
        let d = splat(f16_to_f32(u16::from_le_bytes([blk[0], blk[1]])));
        for k in 0..2 {
            // SAFETY: a reinterpretation of register contents.
            let q = unsafe { a::vreinterpretq_s8_u8(bytes16(blk, 2 + 16 * k)) };
            acc = fma(acc, mul(i8_floats(q), d), load(&xs[2 * b + k]));
        }
    }
    finish(lanes(acc), &[], &[])
}

/// One row of 4-bit blocks of 32 — a `SCALE`-byte scale, then 16 bytes of
/// values, low nibble first — dotted with `x` (whole blocks long): `weights`
/// turns sixteen nibbles (one per 32-bit lane, in order) and the block's
/// scale into weights, fused into the sums in order.
#[inline(always)]
fn nibbles<const SCALE: usize>(
    w: &[u8],
    x: &[f32],
    scale_of: impl Fn(&[u8]) -> f32,
    weights: impl Fn([uint32x4_t; QUARTERS], f32) -> Sixteen,
) -> f32 {
    let block_bytes = SCALE + NIBBLE_BYTES;
    let (xs, _) = x.as_chunks::<LANES>();
    let mut acc = splat(0.0);
    for (b, blk) in w.chunks_exact(block_bytes).enumerate().take(xs.len() / 2) {
        let scale = scale_of(&blk[..SCALE]);
        let v = bytes16(blk, SCALE);
        // SAFETY: register arithmetic and moves (see `splat`).
        let (first, second) = unsafe {
            let lo = a::vandq_u8(v, a::vdupq_n_u8(0x0F));
            let hi = a::vshrq_n_u8::<4>(v);
            (a::vzip1q_u8(lo, hi), a::vzip2q_u8(lo, hi))
        };
        acc = fma(acc, weights(widen_u8(first), scale), load(&xs[2 * b]));
        acc = fma(acc, weights(widen_u8(second), scale), load(&xs[2 * b + 1]));
    }
    finish(lanes(acc), &[], &[])
}

/// MXFP4: the E2M1 bits put in place in an f32 and rebased, times the
/// block's power of two.
#[inline(always)]
fn mxfp4_weights(n: [uint32x4_t; QUARTERS], scale: f32) -> Sixteen {
    // SAFETY: register arithmetic (see `splat`).
    n.map(|n| unsafe {
        let m = a::vshlq_n_u32::<22>(a::vandq_u32(n, a::vdupq_n_u32(7)));
        let sign = a::vshlq_n_u32::<28>(a::vandq_u32(n, a::vdupq_n_u32(8)));
        let v = a::vreinterpretq_f32_u32(a::vorrq_u32(m, sign));
        let v = a::vmulq_f32(v, a::vdupq_n_f32(E2M1_EXPONENT_SHIFT));
        a::vmulq_f32(v, a::vdupq_n_f32(scale))
    })
}

fn int4_scale(s: &[u8]) -> f32 {
    bf16_to_f32(u16::from_le_bytes([s[0], s[1]]))
}

/// INT4: each nibble less 8, times the BF16 scale, the product rounded to
/// BF16 (ties to even) in the lanes, as compressed-tensors does.
#[inline(always)]
fn int4_weights(n: [uint32x4_t; QUARTERS], scale: f32) -> Sixteen {
    // SAFETY: register arithmetic (see `splat`).
    n.map(|n| unsafe {
        let q = a::vcvtq_f32_s32(a::vsubq_s32(a::vreinterpretq_s32_u32(n), a::vdupq_n_s32(8)));
        let bits = a::vreinterpretq_u32_f32(a::vmulq_f32(q, a::vdupq_n_f32(scale)));
        let lsb = a::vandq_u32(a::vshrq_n_u32::<16>(bits), a::vdupq_n_u32(1));
        let up = a::vaddq_u32(bits, a::vaddq_u32(a::vdupq_n_u32(0x7FFF), lsb));
        a::vreinterpretq_f32_u32(a::vandq_u32(up, a::vdupq_n_u32(0xFFFF_0000)))
    })
}

/// One Q4_K row, blockwise: in each group of 64, sixteen bytes at a time,
/// their low nibbles the first sub-block's integers and their high
/// nibbles the second's; each sub-block's products summed, then times its
/// `d × scale` into the sums, and the minimums against the input's
/// sub-block sums.
#[inline(always)]
fn q4_k(w: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    const SUBS: usize = 8;
    let (xs, _) = x.as_chunks::<LANES>();
    let (blocks, _) = w.as_chunks::<{ ggml::Q4_K_BYTES }>();
    let zero = splat(0.0);
    let mut acc = zero;
    let mut mins = [0f32; LANES];
    for (b, blk) in blocks.iter().enumerate().take(xs.len() / SUPER_CHUNKS) {
        let scales = ggml::q4_k_scales(blk);
        for (l, (_, m)) in scales.iter().enumerate() {
            mins[l] = m.mul_add(sums[SUBS * b + l], mins[l]);
        }
        let x = |k: usize| load(&xs[SUPER_CHUNKS * b + k]);
        for g in 0..4 {
            let at = ggml::Q4_K_QS + 32 * g;
            let (v0, v1) = (bytes16(blk, at), bytes16(blk, at + 16));
            // SAFETY: register arithmetic (see `splat`).
            let (lo, hi) = unsafe {
                let low = a::vdupq_n_u8(0x0F);
                (
                    [a::vandq_u8(v0, low), a::vandq_u8(v1, low)],
                    [a::vshrq_n_u8::<4>(v0), a::vshrq_n_u8::<4>(v1)],
                )
            };
            let p_lo = fma(zero, u8_floats(lo[0]), x(4 * g));
            let p_lo = fma(p_lo, u8_floats(lo[1]), x(4 * g + 1));
            let p_hi = fma(zero, u8_floats(hi[0]), x(4 * g + 2));
            let p_hi = fma(p_hi, u8_floats(hi[1]), x(4 * g + 3));
            acc = fma(acc, splat(scales[2 * g].0), p_lo);
            acc = fma(acc, splat(scales[2 * g + 1].0), p_hi);
        }
    }
    tree_sum(lanes(acc)) - tree_sum(mins)
}

/// One Q6_K row, blockwise: each sub-block's sixteen values at a time —
/// four low bits from `ql`, two high bits from `qh`, less 32 — their
/// products summed, then times the sub-block's `d × scale` into the sums.
#[inline(always)]
fn q6_k(w: &[u8], x: &[f32]) -> f32 {
    let (xs, _) = x.as_chunks::<LANES>();
    let (blocks, _) = w.as_chunks::<{ ggml::Q6_K_BYTES }>();
    let zero = splat(0.0);
    let mut acc = zero;
    for (b, blk) in blocks.iter().enumerate().take(xs.len() / SUPER_CHUNKS) {
        let dd = f16_to_f32(u16::from_le_bytes([
            blk[ggml::Q6_K_BYTES - 2],
            blk[ggml::Q6_K_BYTES - 1],
        ]));
        // Sub-blocks in order: half `n`, then the low (`k` 0) or high
        // nibbles of its 64 `ql` bytes, sixteen bytes (`c`) at a time.
        for sub in 0..SUPER_CHUNKS {
            let (n, k, c) = (sub / 8, sub / 4 % 2, sub % 4);
            let d = dd * f32::from(blk[ggml::Q6_K_SCALES + sub] as i8);
            let ql = bytes16(blk, 64 * n + 16 * c);
            let qh = bytes16(blk, ggml::Q6_K_QH + 32 * n + 16 * (c % 2));
            // The value's two high bits are bits 2j, 2j + 1 of its `qh` byte.
            let j = (2 * k + c / 2) as i8;
            // SAFETY: register arithmetic (see `splat`).
            let q = unsafe {
                let low = match k {
                    0 => a::vandq_u8(ql, a::vdupq_n_u8(0x0F)),
                    _ => a::vshrq_n_u8::<4>(ql),
                };
                let high = a::vshlq_u8(qh, a::vdupq_n_s8(4 - 2 * j));
                let high = a::vandq_u8(high, a::vdupq_n_u8(0x30));
                let v = a::vsubq_u8(a::vorrq_u8(low, high), a::vdupq_n_u8(32));
                a::vreinterpretq_s8_u8(v)
            };
            let p = fma(zero, i8_floats(q), load(&xs[SUPER_CHUNKS * b + sub]));
            acc = fma(acc, splat(d), p);
        }
    }
    tree_sum(lanes(acc)) - 0.0
}
