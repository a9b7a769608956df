//! NEON fast paths (aarch64: Apple Silicon) that compute exactly what the
//! portable kernels compute.
//!
//! The canonical order's sixteen running sums ([`crate::kernels::dot`])
//! are four 128-bit registers here: weight `k` is fused into lane
//! `k mod 16` with one rounding (`FMLA`), and the lanes are added as the
//! same fixed tree. F16 weights widen exactly with `FCVTL` (base ARMv8,
//! no FP16 arithmetic needed), BF16 ones by a shift into the top of each
//! lane, as `bf16_to_f32` does; the portable path widens them with integer
//! work into a buffer first. Every other format takes the portable tiles
//! on aarch64 for now.
//!
//! Checked bit for bit against the portable path by the matrix tests, and
//! every fixture's logits against x86-64's, under qemu in CI; their speed
//! has not been measured (no aarch64 machine where Longhaul is built).

use core::arch::aarch64::{
    float32x4_t, uint16x4_t, vcvt_f32_f16, vdupq_n_f32, vfmaq_f32, vget_high_u16, vget_low_u16,
    vld1q_f32, vld1q_u16, vreinterpret_f16_u16, vreinterpretq_f32_u32, vshll_n_u16, vst1q_f32,
};

use crate::kernels::Format;
use crate::kernels::dot::{LANES, finish};
use crate::kernels::format::{bf16_to_f32, f16_to_f32};

/// 128-bit registers holding the sixteen running sums.
const QUARTERS: usize = LANES / 4;
/// Bytes of sixteen F16 or BF16 weights.
const BLOCK_BYTES: usize = 2 * LANES;

/// `neon` for the formats [`matvec`] computes.
pub(in crate::kernels) fn fast_path(format: Format) -> Option<&'static str> {
    matches!(format, Format::F16 | Format::BF16).then_some("neon")
}

/// `out[r] = Σ_k W[r][k] · x[k]` for `rows` F16 or BF16 rows of
/// `row_bytes` bytes in `bytes`, in the canonical order; `false` (and
/// nothing written) for other formats.
pub(in crate::kernels) fn matvec(
    format: Format,
    bytes: &[u8],
    row_bytes: usize,
    rows: usize,
    x: &[f32],
    _sums: &[f32],
    out: &mut [f32],
) -> bool {
    let bf = match format {
        Format::F16 => false,
        Format::BF16 => true,
        _ => return false,
    };
    for (r, o) in out.iter_mut().enumerate().take(rows) {
        let w = &bytes[r * row_bytes..(r + 1) * row_bytes];
        *o = if bf {
            row::<true>(w, x)
        } else {
            row::<false>(w, x)
        };
    }
    true
}

/// Sixteen F16 weights (BF16 ones when `BF`) widened exactly, four lanes
/// to a register.
#[inline(always)]
fn widen<const BF: bool>(halves: &[u8; BLOCK_BYTES]) -> [float32x4_t; QUARTERS] {
    let quarter = |h: uint16x4_t| {
        // SAFETY: NEON is part of every aarch64 target; these only move
        // and convert register contents.
        unsafe {
            if BF {
                vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
            } else {
                vcvt_f32_f16(vreinterpret_f16_u16(h))
            }
        }
    };
    // SAFETY: each load reads 16 bytes inside `halves` (32 bytes long).
    let (lo, hi) = unsafe {
        (
            vld1q_u16(halves.as_ptr().cast()),
            vld1q_u16(halves.as_ptr().add(LANES).cast()),
        )
    };
    // SAFETY: register moves (see above).
    let parts = unsafe {
        [
            vget_low_u16(lo),
            vget_high_u16(lo),
            vget_low_u16(hi),
            vget_high_u16(hi),
        ]
    };
    parts.map(quarter)
}

/// One F16 (BF16 when `BF`) row dotted with `x` in the canonical order.
#[inline(always)]
fn row<const BF: bool>(w: &[u8], x: &[f32]) -> f32 {
    let (xs, x_tail) = x.as_chunks::<LANES>();
    let (ws, _) = w.as_chunks::<BLOCK_BYTES>();
    // SAFETY: a register set to zero.
    let mut acc = [unsafe { vdupq_n_f32(0.0) }; QUARTERS];
    for (xb, wb) in xs.iter().zip(ws) {
        let wv = widen::<BF>(wb);
        for (q, a) in acc.iter_mut().enumerate() {
            // SAFETY: the load reads four floats inside `xb` (sixteen long);
            // the multiply-add works on registers.
            unsafe {
                let xv = vld1q_f32(xb.as_ptr().add(4 * q));
                *a = vfmaq_f32(*a, wv[q], xv);
            }
        }
    }
    let mut lanes = [0f32; LANES];
    for (q, a) in acc.iter().enumerate() {
        // SAFETY: the store writes four floats inside `lanes`.
        unsafe { vst1q_f32(lanes.as_mut_ptr().add(4 * q), *a) };
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
    finish(lanes, &tail, x_tail)
}
