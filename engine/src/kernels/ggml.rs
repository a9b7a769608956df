//! GGML's quantised block types, decoded to f32 exactly as GGML defines
//! them (`dequantize_row_*` in ggml-quants.c, and the `gguf` package's numpy
//! port of it): the same products and differences in the same order, never
//! fused, so a block widens to the same bits wherever it is used.
//!
//! Blocks are read from bytes as they lie in a GGUF file; nothing is
//! reordered, so a pack and its cache hold a file's blocks as they are.

use super::format::f16_to_f32;

/// Values per block of the legacy types (Q4_0 … Q8_0).
pub const QK: usize = 32;
/// Values per super-block of the k-quants.
pub const QK_K: usize = 256;
/// Bytes of a k-quant's packed 6-bit scales and minimums (Q4_K, Q5_K).
const K_SCALE_BYTES: usize = 12;

/// Bytes per block, by type.
pub const Q4_0_BYTES: usize = 2 + QK / 2;
pub const Q4_1_BYTES: usize = 2 + 2 + QK / 2;
pub const Q5_0_BYTES: usize = 2 + 4 + QK / 2;
pub const Q5_1_BYTES: usize = 2 + 2 + 4 + QK / 2;
pub const Q8_0_BYTES: usize = 2 + QK;
pub const Q2_K_BYTES: usize = QK_K / 16 + QK_K / 4 + 2 + 2;
pub const Q3_K_BYTES: usize = QK_K / 8 + QK_K / 4 + 12 + 2;
pub const Q4_K_BYTES: usize = 2 + 2 + K_SCALE_BYTES + QK_K / 2;
pub const Q5_K_BYTES: usize = 2 + 2 + K_SCALE_BYTES + QK_K / 8 + QK_K / 2;
pub const Q6_K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
pub const IQ4_NL_BYTES: usize = 2 + QK / 2;
pub const IQ4_XS_BYTES: usize = 2 + 2 + QK_K / 64 + QK_K / 2;
pub const MXFP4_BYTES: usize = 1 + QK / 2;

/// The sixteen values of IQ4_NL and IQ4_XS's non-linear 4-bit grid.
const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// MXFP4's E2M1 values doubled, as GGML keeps them (its scale is halved).
const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

#[inline(always)]
pub(super) fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Q4_0 and Q4_1 put value `j` in the low nibble of byte `j` and value
/// `j + 16` in the high one: decoded as two passes over the bytes, each
/// writing its half in order. Written as one pass, the compiler scattered
/// the two halves' stores, and one-row products ran at 1.8–2.4 G weights/s
/// (6–7 now). Q5_0 and Q5_1 keep one pass, which ran at 8–12 against 3
/// split.
#[inline(always)]
pub fn q4_0(b: &[u8; Q4_0_BYTES], out: &mut [f32; QK]) {
    let d = half(b, 0);
    let (lo, hi) = out.split_at_mut(QK / 2);
    for (o, &q) in lo.iter_mut().zip(&b[2..]) {
        *o = (i32::from(q & 0xF) - 8) as f32 * d;
    }
    for (o, &q) in hi.iter_mut().zip(&b[2..]) {
        *o = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

#[inline(always)]
pub fn q4_1(b: &[u8; Q4_1_BYTES], out: &mut [f32; QK]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let (lo, hi) = out.split_at_mut(QK / 2);
    for (o, &q) in lo.iter_mut().zip(&b[4..]) {
        *o = f32::from(q & 0xF) * d + m;
    }
    for (o, &q) in hi.iter_mut().zip(&b[4..]) {
        *o = f32::from(q >> 4) * d + m;
    }
}

/// The fifth bits of a Q5 block: bit `j` belongs to value `j`.
#[inline(always)]
fn high_bits(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The 5-bit values `j` and `j + 16` of a Q5 block.
#[inline(always)]
fn q5_pair(qh: u32, q: u8, j: usize) -> (u8, u8) {
    let h0 = ((qh >> j) << 4) & 0x10;
    let h1 = (qh >> (j + 12)) & 0x10;
    ((q & 0xF) | h0 as u8, (q >> 4) | h1 as u8)
}

#[inline(always)]
pub fn q5_0(b: &[u8; Q5_0_BYTES], out: &mut [f32; QK]) {
    let (d, qh) = (half(b, 0), high_bits(b, 2));
    for (j, &q) in b[6..].iter().enumerate() {
        let (x0, x1) = q5_pair(qh, q, j);
        out[j] = (i32::from(x0) - 16) as f32 * d;
        out[j + QK / 2] = (i32::from(x1) - 16) as f32 * d;
    }
}

#[inline(always)]
pub fn q5_1(b: &[u8; Q5_1_BYTES], out: &mut [f32; QK]) {
    let (d, m, qh) = (half(b, 0), half(b, 2), high_bits(b, 4));
    for (j, &q) in b[8..].iter().enumerate() {
        let (x0, x1) = q5_pair(qh, q, j);
        out[j] = f32::from(x0) * d + m;
        out[j + QK / 2] = f32::from(x1) * d + m;
    }
}

#[inline(always)]
pub fn q8_0(b: &[u8; Q8_0_BYTES], out: &mut [f32; QK]) {
    let d = half(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Q2_K: 16 sub-blocks of 16, each with a 4-bit scale and a 4-bit minimum;
/// two bits per value, four values a byte.
#[inline(always)]
pub fn q2_k(b: &[u8; Q2_K_BYTES], out: &mut [f32; QK_K]) {
    let scales = &b[..QK_K / 16];
    let qs = &b[QK_K / 16..QK_K / 16 + QK_K / 4];
    let (d, dmin) = (
        half(b, QK_K / 16 + QK_K / 4),
        half(b, QK_K / 16 + QK_K / 4 + 2),
    );
    let mut y = 0;
    let mut is = 0;
    for q in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for half_q in [&q[..16], &q[16..]] {
                let sc = scales[is];
                is += 1;
                let dl = d * f32::from(sc & 0xF);
                let ml = dmin * f32::from(sc >> 4);
                for &byte in half_q {
                    out[y] = dl * f32::from((byte >> shift) & 3) - ml;
                    y += 1;
                }
            }
        }
    }
}

/// Q3_K's sixteen 6-bit scales, unpacked from 12 bytes as GGML does.
#[inline(always)]
pub(super) fn q3_k_scales(packed: &[u8]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let word =
        |i: usize| u32::from_le_bytes([packed[i], packed[i + 1], packed[i + 2], packed[i + 3]]);
    let (a0, a1, tmp) = (word(0), word(4), word(8));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, byte) in out.iter_mut().zip(aux.iter().flat_map(|w| w.to_le_bytes())) {
        *o = byte as i8;
    }
    out
}

/// Q3_K: 16 sub-blocks of 16 with 6-bit scales (offset by 32); two low bits
/// per value and a high bit that, when clear, subtracts 4.
#[inline(always)]
pub fn q3_k(b: &[u8; Q3_K_BYTES], out: &mut [f32; QK_K]) {
    let hmask = &b[..QK_K / 8];
    let qs = &b[QK_K / 8..QK_K / 8 + QK_K / 4];
    let scales = q3_k_scales(&b[QK_K / 8 + QK_K / 4..QK_K / 8 + QK_K / 4 + 12]);
    let d_all = half(b, Q3_K_BYTES - 2);
    let mut y = 0;
    let mut is = 0;
    let mut m = 1u8;
    for q in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for start in [0, 16] {
                let dl = d_all * f32::from(scales[is] - 32);
                is += 1;
                for l in start..start + 16 {
                    let low = i32::from((q[l] >> shift) & 3);
                    let high = if hmask[l] & m != 0 { 0 } else { 4 };
                    out[y] = dl * (low - high) as f32;
                    y += 1;
                }
            }
            m <<= 1;
        }
    }
}

/// Scale and minimum `j` (0..8) of a Q4_K or Q5_K super-block, 6 bits each.
#[inline(always)]
fn k4_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Where a Q4_K super-block's nibbles start.
pub const Q4_K_QS: usize = 4 + K_SCALE_BYTES;

/// A Q4_K (or Q5_K: the same head) super-block's eight
/// `(d × scale, dmin × min)` pairs.
///
/// Inlined, and a loop rather than `array::from_fn`, whose closure was
/// compiled apart from its caller's instruction set and took a tenth of a
/// blockwise Q5_K product.
#[inline(always)]
pub fn q4_k_scales(b: &[u8]) -> [(f32, f32); 8] {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..Q4_K_QS];
    let mut out = [(0.0, 0.0); 8];
    for (j, out) in out.iter_mut().enumerate() {
        let (sc, m) = k4_scale_min(j, scales);
        *out = (d * f32::from(sc), dmin * f32::from(m));
    }
    out
}

#[inline(always)]
pub fn q4_k(b: &[u8; Q4_K_BYTES], out: &mut [f32; QK_K]) {
    let s = q4_k_scales(b);
    let qs = &b[Q4_K_QS..];
    for group in 0..4 {
        let q = &qs[group * 32..group * 32 + 32];
        let ((d1, m1), (d2, m2)) = (s[2 * group], s[2 * group + 1]);
        let o = &mut out[group * 64..group * 64 + 64];
        for (i, &byte) in q.iter().enumerate() {
            o[i] = d1 * f32::from(byte & 0xF) - m1;
            o[32 + i] = d2 * f32::from(byte >> 4) - m2;
        }
    }
}

#[inline(always)]
pub fn q5_k(b: &[u8; Q5_K_BYTES], out: &mut [f32; QK_K]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..Q4_K_QS];
    let qh = &b[4 + K_SCALE_BYTES..4 + K_SCALE_BYTES + QK_K / 8];
    let qs = &b[4 + K_SCALE_BYTES + QK_K / 8..];
    for group in 0..4 {
        let ql = &qs[group * 32..group * 32 + 32];
        let (u1, u2) = (1u8 << (2 * group), 2u8 << (2 * group));
        let (sc, m) = k4_scale_min(2 * group, scales);
        let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
        let (sc, m) = k4_scale_min(2 * group + 1, scales);
        let (d2, m2) = (d * f32::from(sc), dmin * f32::from(m));
        let o = &mut out[group * 64..group * 64 + 64];
        for (l, &byte) in ql.iter().enumerate() {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            o[l] = d1 * f32::from((byte & 0xF) + h1) - m1;
            o[32 + l] = d2 * f32::from((byte >> 4) + h2) - m2;
        }
    }
}

/// Where a Q6_K super-block's high bits start.
pub const Q6_K_QH: usize = QK_K / 2;
/// Where its scales start.
pub const Q6_K_SCALES: usize = Q6_K_QH + QK_K / 4;
/// Where a Q3_K super-block's low bits and scales start.
pub const Q3_K_QS: usize = QK_K / 8;
pub const Q3_K_SCALES: usize = Q3_K_QS + QK_K / 4;
/// Where a Q5_K super-block's high bits and nibbles start.
pub const Q5_K_QH: usize = Q4_K_QS;
pub const Q5_K_QS: usize = Q5_K_QH + QK_K / 8;
/// Where a Q2_K super-block's values and its two scales start.
pub const Q2_K_QS: usize = QK_K / 16;
pub const Q2_K_D: usize = Q2_K_QS + QK_K / 4;

/// A Q6_K super-block's sixteen `d × scale` factors.
#[inline(always)]
pub fn q6_k_scales(b: &[u8]) -> [f32; 16] {
    let d = half(b, Q6_K_BYTES - 2);
    std::array::from_fn(|k| d * f32::from(b[Q6_K_SCALES + k] as i8))
}

/// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; four low bits and two
/// high bits per value, offset by 32. A value is `(d × scale) × q`.
#[inline(always)]
pub fn q6_k(b: &[u8; Q6_K_BYTES], out: &mut [f32; QK_K]) {
    let scales = q6_k_scales(b);
    for n in 0..2 {
        let (ql, qh) = (&b[64 * n..], &b[Q6_K_QH + 32 * n..]);
        let s = &scales[8 * n..];
        let y = &mut out[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            y[l] = s[is] * f32::from(q1);
            y[l + 32] = s[is + 2] * f32::from(q2);
            y[l + 64] = s[is + 4] * f32::from(q3);
            y[l + 96] = s[is + 6] * f32::from(q4);
        }
    }
}

/// IQ4_NL: each nibble (low ones first, then high) picks a grid value,
/// times the block's scale.
#[inline(always)]
pub fn iq4_nl(b: &[u8; IQ4_NL_BYTES], out: &mut [f32; QK]) {
    let d = half(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        out[j] = d * f32::from(IQ4_VALUES[usize::from(q & 0xF)]);
        out[j + QK / 2] = d * f32::from(IQ4_VALUES[usize::from(q >> 4)]);
    }
}

/// IQ4_XS: eight blocks of 32 as IQ4_NL, each with a 6-bit scale (offset
/// by 32) under the super-block's.
#[inline(always)]
pub fn iq4_xs(b: &[u8; IQ4_XS_BYTES], out: &mut [f32; QK_K]) {
    let d = half(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..4 + QK_K / 64];
    let qs = &b[4 + QK_K / 64..];
    for ib in 0..QK_K / QK {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * f32::from((low | (high << 4)) as i8 - 32);
        let y = &mut out[ib * QK..(ib + 1) * QK];
        for (j, &q) in qs[ib * QK / 2..(ib + 1) * QK / 2].iter().enumerate() {
            y[j] = dl * f32::from(IQ4_VALUES[usize::from(q & 0xF)]);
            y[j + QK / 2] = dl * f32::from(IQ4_VALUES[usize::from(q >> 4)]);
        }
    }
}

/// Half of `2^(e − 127)`, as GGML widens an E8M0 scale for its doubled values.
#[inline(always)]
fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((u32::from(e) - 1) << 23)
    }
}

/// MXFP4 as GGUF stores it (GGML type 39): the scale byte, then 16 bytes of
/// E2M1 values, low nibbles the first 16 values and high nibbles the last
/// (gpt-oss's own files interleave them; see [`super::Format::Mxfp4`]).
#[inline(always)]
pub fn mxfp4(b: &[u8; MXFP4_BYTES], out: &mut [f32; QK]) {
    let d = e8m0_half(b[0]);
    for (j, &q) in b[1..].iter().enumerate() {
        out[j] = f32::from(MXFP4_VALUES[usize::from(q & 0xF)]) * d;
        out[j + QK / 2] = f32::from(MXFP4_VALUES[usize::from(q >> 4)]) * d;
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::{Format, decode_row};
    use crate::weights::Dtype;

    /// Random blocks (any bit pattern, finite scales) decode to exactly the
    /// values of the `gguf` package's numpy dequantiser
    /// (`tools/reference/make_ggml_blocks.py`).
    #[test]
    fn blocks_decode_as_the_gguf_reference_does() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_blocks");
        for format in Format::ggml_blocks() {
            // Files are named as GGUF names the type.
            let name = match format {
                Format::Mxfp4Ggml => "MXFP4",
                f => Dtype::Blocks(f).name().unwrap_or_default(),
            };
            let file = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
            let len = u32::from_le_bytes(file[..4].try_into().unwrap()) as usize;
            let (bytes, values) = file[4..].split_at(len);
            let want: Vec<f32> = values
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let blocks = len / format.block_bytes();
            assert_eq!(want.len(), blocks * format.block(), "{name}");
            let mut got = vec![0f32; want.len()];
            decode_row(format, bytes, &mut got);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{name} value {k}: {g} vs {w}");
            }
        }
    }
}
