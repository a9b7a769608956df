//! Weight storage formats and their exact conversion to f32.
//!
//! Every format turns into f32 the same way wherever it is used: a narrow
//! float widens exactly, and quantised blocks follow GGML's dequantisation
//! formulas operation by operation (a product, then a difference, never fused),
//! so a weight gives the same f32 values whether it was widened once when
//! loaded or at every use.

use half::f16;

use super::{ggml, iq};

/// How a matrix's elements are stored, row by row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    F16,
    BF16,
    /// GGML Q8_0: blocks of 32 signed bytes with one f16 scale.
    Q8_0,
    /// GGML Q4_K: super-blocks of 256 nibbles with 6-bit scales and minimums.
    Q4K,
    /// The other GGML block types, as GGUF files store them (see [`ggml`]).
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2K,
    Q3K,
    Q5K,
    Q6K,
    Iq4Nl,
    Iq4Xs,
    /// GGML's grid types (see [`super::iq`]).
    Iq2Xxs,
    Iq2Xs,
    Iq2S,
    Iq3Xxs,
    Iq3S,
    Iq1S,
    Iq1M,
    /// MXFP4 as GGUF stores it; the values of [`Format::Mxfp4`] in another
    /// nibble order.
    Mxfp4Ggml,
    /// FP8 E4M3 (`e4m3fn`: no infinities) in blocks of 128 along the row,
    /// each led by its f32 scale: DeepSeek/Kimi's `weight_scale_inv` of the
    /// row's 128×128 block, repeated per row so a row decodes on its own
    /// (4 bytes per 128 weights, 3 %). The last block of a row may be short.
    Fp8Block,
    /// Symmetric INT4 in groups of 32 along the row, as compressed-tensors'
    /// `pack-quantized` publishes it (Kimi K2-Thinking, K2.5): each group
    /// is its BF16 scale, then 16 bytes of nibbles, low nibble first,
    /// offset by 8. A weight is `bf16((q − 8) × scale)`: compressed-tensors
    /// multiplies in the scale's dtype, so the product is rounded to BF16.
    Int4G32,
    /// MXFP4 as gpt-oss publishes its experts: blocks of 32 along the row,
    /// each its E8M0 scale byte (`2^(s − 127)`), then 16 bytes of E2M1
    /// values, low nibble first. A weight is `e2m1 × 2^(s − 127)`, exact in
    /// f32 for every scale a real checkpoint holds (2^-126 … 2^127).
    Mxfp4,
}

/// Elements per FP8 scale block along a row (the published 128×128 blocks).
pub const FP8_BLOCK: usize = 128;
/// Bytes of an FP8 block's scale.
const FP8_SCALE_BYTES: usize = 4;
/// Elements per INT4 group.
pub const INT4_GROUP: usize = 32;
/// Bytes of an INT4 group's BF16 scale.
const INT4_SCALE_BYTES: usize = 2;
/// Bytes per INT4 group: the scale, then two weights a byte.
const INT4_BYTES: usize = INT4_SCALE_BYTES + INT4_GROUP / 2;
/// What a stored nibble is offset by: nibble 8 is the weight 0.
const INT4_OFFSET: i32 = 8;
/// Elements per MXFP4 block.
pub const MXFP4_BLOCK: usize = 32;
/// Bytes per MXFP4 block: the E8M0 scale, then two values a byte.
const MXFP4_BYTES: usize = 1 + MXFP4_BLOCK / 2;
/// The sixteen E2M1 values (sign, two exponent bits, one mantissa bit): the
/// reference the arithmetic decoding is checked against.
#[cfg(test)]
const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];
/// What moves an f16 exponent (bias 15) to an f32 one (bias 127).
const F16_TO_F32_BIAS: u32 = 127 - 15;
/// 2^-24, the value of an f16 subnormal's last mantissa bit.
const F16_SUBNORMAL_UNIT: f32 = f32::from_bits((127 - 24) << 23);

/// Everything about one format but its decoding, in one row.
#[derive(Debug, Clone, Copy)]
pub struct FormatRow {
    pub format: Format,
    /// Longhaul's name (pack manifests, `--experts`).
    pub name: &'static str,
    /// Elements decoded together; a row is a whole number of blocks.
    pub block: usize,
    /// Bytes of one block.
    pub block_bytes: usize,
    /// The dtype a safetensors file written by Longhaul stores a tensor of
    /// this format as (a pack's resident file, a GGUF's tensors as read).
    pub stored: Option<&'static str>,
    /// GGML's type number and name, for formats GGUF files store.
    pub ggml: Option<(u32, &'static str)>,
}

const fn row(
    format: Format,
    name: &'static str,
    block: usize,
    block_bytes: usize,
    stored: Option<&'static str>,
    ggml: Option<(u32, &'static str)>,
) -> FormatRow {
    FormatRow {
        format,
        name,
        block,
        block_bytes,
        stored,
        ggml,
    }
}

/// A GGML block type, stored under its GGML name.
const fn ggml_blocks(
    format: Format,
    name: &'static str,
    block: usize,
    bytes: usize,
    id: u32,
) -> FormatRow {
    row(format, name, block, bytes, Some(name), Some((id, name)))
}

/// One row per [`Format`], in its order: the only list of formats' names,
/// block sizes and GGML numbers. Decoding is [`decode_row`]'s match, so each
/// format's loop inlines into the matmul tiles rather than being called
/// through a pointer.
pub const FORMATS: [FormatRow; 26] = [
    row(Format::F32, "F32", 1, 4, None, Some((0, "F32"))),
    row(Format::F16, "F16", 1, 2, None, Some((1, "F16"))),
    row(Format::BF16, "BF16", 1, 2, None, Some((30, "BF16"))),
    ggml_blocks(Format::Q8_0, "Q8_0", ggml::QK, ggml::Q8_0_BYTES, 8),
    // Longhaul's `--experts q4k` names it without the underscore.
    row(
        Format::Q4K,
        "Q4K",
        ggml::QK_K,
        ggml::Q4_K_BYTES,
        Some("Q4_K"),
        Some((12, "Q4_K")),
    ),
    ggml_blocks(Format::Q4_0, "Q4_0", ggml::QK, ggml::Q4_0_BYTES, 2),
    ggml_blocks(Format::Q4_1, "Q4_1", ggml::QK, ggml::Q4_1_BYTES, 3),
    ggml_blocks(Format::Q5_0, "Q5_0", ggml::QK, ggml::Q5_0_BYTES, 6),
    ggml_blocks(Format::Q5_1, "Q5_1", ggml::QK, ggml::Q5_1_BYTES, 7),
    ggml_blocks(Format::Q2K, "Q2_K", ggml::QK_K, ggml::Q2_K_BYTES, 10),
    ggml_blocks(Format::Q3K, "Q3_K", ggml::QK_K, ggml::Q3_K_BYTES, 11),
    ggml_blocks(Format::Q5K, "Q5_K", ggml::QK_K, ggml::Q5_K_BYTES, 13),
    ggml_blocks(Format::Q6K, "Q6_K", ggml::QK_K, ggml::Q6_K_BYTES, 14),
    ggml_blocks(Format::Iq4Nl, "IQ4_NL", ggml::QK, ggml::IQ4_NL_BYTES, 20),
    ggml_blocks(Format::Iq4Xs, "IQ4_XS", ggml::QK_K, ggml::IQ4_XS_BYTES, 23),
    ggml_blocks(Format::Iq2Xxs, "IQ2_XXS", ggml::QK_K, iq::IQ2_XXS_BYTES, 16),
    ggml_blocks(Format::Iq2Xs, "IQ2_XS", ggml::QK_K, iq::IQ2_XS_BYTES, 17),
    ggml_blocks(Format::Iq2S, "IQ2_S", ggml::QK_K, iq::IQ2_S_BYTES, 22),
    ggml_blocks(Format::Iq3Xxs, "IQ3_XXS", ggml::QK_K, iq::IQ3_XXS_BYTES, 18),
    ggml_blocks(Format::Iq3S, "IQ3_S", ggml::QK_K, iq::IQ3_S_BYTES, 21),
    ggml_blocks(Format::Iq1S, "IQ1_S", ggml::QK_K, iq::IQ1_S_BYTES, 19),
    ggml_blocks(Format::Iq1M, "IQ1_M", ggml::QK_K, iq::IQ1_M_BYTES, 29),
    // Stored apart from gpt-oss's own MXFP4, whose nibbles are in another order.
    row(
        Format::Mxfp4Ggml,
        "GGML_MXFP4",
        ggml::QK,
        ggml::MXFP4_BYTES,
        Some("GGML_MXFP4"),
        Some((39, "MXFP4")),
    ),
    row(
        Format::Fp8Block,
        "FP8_E4M3_B128",
        FP8_BLOCK,
        FP8_SCALE_BYTES + FP8_BLOCK,
        None,
        None,
    ),
    row(
        Format::Int4G32,
        "INT4_G32",
        INT4_GROUP,
        INT4_BYTES,
        None,
        None,
    ),
    row(Format::Mxfp4, "MXFP4", MXFP4_BLOCK, MXFP4_BYTES, None, None),
];

impl Format {
    /// The format's row of [`FORMATS`].
    pub fn row(self) -> &'static FormatRow {
        &FORMATS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// Elements decoded together; a row is a whole number of blocks.
    pub fn block(self) -> usize {
        self.row().block
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        self.row().block_bytes
    }

    /// The GGML block formats a tensor may be stored in.
    pub fn ggml_blocks() -> impl Iterator<Item = Format> {
        FORMATS
            .iter()
            .filter(|r| r.ggml.is_some() && r.stored.is_some())
            .map(|r| r.format)
    }

    /// The format GGML type number `id` is read as.
    pub fn of_ggml(id: u32) -> Option<Format> {
        FORMATS
            .iter()
            .find(|r| r.ggml.is_some_and(|(n, _)| n == id))
            .map(|r| r.format)
    }

    /// Bytes of a row of `cols` elements, or `None` when `cols` is not a
    /// whole number of blocks (FP8 rows may end in a short block).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if self == Format::Fp8Block {
            return Some(cols.div_ceil(FP8_BLOCK) * FP8_SCALE_BYTES + cols);
        }
        cols.is_multiple_of(self.block())
            .then(|| cols / self.block() * self.block_bytes())
    }

    /// Whether products with this format are summed blockwise (the
    /// k-quants, [`super::kquant`]): widened to f32 first, its rows would
    /// give other bits, so they are always computed from as stored.
    pub fn is_blockwise(self) -> bool {
        super::kquant::layout(self).is_some()
    }

    /// Whether the format is a plain float type (no blocks, no scales).
    pub fn is_float(self) -> bool {
        matches!(self, Format::F32 | Format::F16 | Format::BF16)
    }
}

/// An IEEE half as f32, exactly. Normal values are rebased by adding to
/// the exponent, in integers; subnormal ones are their mantissa (an integer,
/// exact in f32) times 2^-24, a multiplication of normal numbers. Rebasing
/// a subnormal half by multiplying its bits as an f32 subnormal cost a
/// microcode assist on x86 per scale: GGML's k-quant scales of small
/// weights are subnormal halves, and one-row Q5_K products ran at 3.9 G
/// weights/s for it, 6.8 without.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exponent = (h >> 10) & 0x1f;
    let mantissa = h & 0x3ff;
    let magnitude = match exponent {
        0 => (mantissa as f32 * F16_SUBNORMAL_UNIT).to_bits(),
        0x1f => 0x7f80_0000 | (mantissa << 13),
        _ => ((exponent + F16_TO_F32_BIAS) << 23) | (mantissa << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// Every FP8 E4M3 (`e4m3fn`) value as f32, from the format's definition:
/// the reference the fast conversion is checked against.
#[cfg(test)]
const fn fp8_e4m3_table() -> [f32; 256] {
    let mut table = [0f32; 256];
    let mut b = 0;
    while b < 256 {
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let exponent = (b >> 3) & 0xF;
        let mantissa = (b & 7) as u32;
        let magnitude = if exponent == 0xF && mantissa == 7 {
            f32::NAN
        } else if exponent == 0 {
            // Subnormal: mantissa × 2^-9.
            mantissa as f32 * f32::from_bits((127 - 9) << 23)
        } else {
            f32::from_bits(((exponent as u32 + 127 - 7) << 23) | (mantissa << 20))
        };
        table[b] = sign * magnitude;
        b += 1;
    }
    table
}

/// 2^120: moves an e4m3 exponent (bias 7) placed in an f32 (bias 127) home.
const FP8_EXPONENT_SHIFT: f32 = f32::from_bits((127 + 120) << 23);

/// An FP8 E4M3 byte as f32, exactly: its exponent and mantissa bits go to
/// the top of an f32 and one multiplication by 2^120 rebases normals and
/// subnormals alike (as for halves); 0x7F/0xFF are NaN. Branch-free, so a
/// row of them vectorises (a table lookup made FP8 decoding 2.3× slower
/// than BF16).
#[inline(always)]
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let b = u32::from(b);
    let magnitude = f32::from_bits((b & 0x7F) << 20) * FP8_EXPONENT_SHIFT;
    let value = f32::from_bits(magnitude.to_bits() | ((b & 0x80) << 24));
    if b & 0x7F == 0x7F { f32::NAN } else { value }
}

/// `v` rounded to the nearest bfloat16 (ties to even), as f32: what
/// PyTorch's conversion gives for every finite value.
#[inline(always)]
pub fn round_to_bf16(v: f32) -> f32 {
    let bits = v.to_bits();
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    f32::from_bits(bits.wrapping_add(rounding) & 0xFFFF_0000)
}

/// A bfloat16 as f32: its bits are the f32's upper half.
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

#[inline(always)]
fn le_u16(b: &[u8; 2]) -> u16 {
    u16::from_le_bytes(*b)
}

/// Decodes one row (`bytes` holds exactly the row) into `out` (`cols` long).
/// The caller checked that `bytes` is `format.row_bytes(out.len())` long.
#[inline(always)]
pub fn decode_row(format: Format, bytes: &[u8], out: &mut [f32]) {
    match format {
        Format::F32 => {
            let (words, _) = bytes.as_chunks::<4>();
            for (o, w) in out.iter_mut().zip(words) {
                *o = f32::from_le_bytes(*w);
            }
        }
        Format::F16 => {
            let (halves, _) = bytes.as_chunks::<2>();
            for (o, h) in out.iter_mut().zip(halves) {
                *o = f16_to_f32(le_u16(h));
            }
        }
        Format::BF16 => {
            let (halves, _) = bytes.as_chunks::<2>();
            for (o, h) in out.iter_mut().zip(halves) {
                *o = bf16_to_f32(le_u16(h));
            }
        }
        Format::Fp8Block => decode_fp8_row(bytes, out),
        Format::Mxfp4 => {
            let (blocks, _) = bytes.as_chunks::<MXFP4_BYTES>();
            let (outs, _) = out.as_chunks_mut::<MXFP4_BLOCK>();
            for (o, b) in outs.iter_mut().zip(blocks) {
                decode_mxfp4(b, o);
            }
        }
        Format::Int4G32 => {
            let (groups, _) = bytes.as_chunks::<INT4_BYTES>();
            let (outs, _) = out.as_chunks_mut::<INT4_GROUP>();
            for (o, g) in outs.iter_mut().zip(groups) {
                decode_int4(g, o);
            }
        }
        Format::Q8_0 => blocks::<{ ggml::Q8_0_BYTES }, { ggml::QK }>(bytes, out, ggml::q8_0),
        Format::Q4K => blocks::<{ ggml::Q4_K_BYTES }, { ggml::QK_K }>(bytes, out, ggml::q4_k),
        Format::Q4_0 => blocks::<{ ggml::Q4_0_BYTES }, { ggml::QK }>(bytes, out, ggml::q4_0),
        Format::Q4_1 => blocks::<{ ggml::Q4_1_BYTES }, { ggml::QK }>(bytes, out, ggml::q4_1),
        Format::Q5_0 => blocks::<{ ggml::Q5_0_BYTES }, { ggml::QK }>(bytes, out, ggml::q5_0),
        Format::Q5_1 => blocks::<{ ggml::Q5_1_BYTES }, { ggml::QK }>(bytes, out, ggml::q5_1),
        Format::Q2K => blocks::<{ ggml::Q2_K_BYTES }, { ggml::QK_K }>(bytes, out, ggml::q2_k),
        Format::Q3K => blocks::<{ ggml::Q3_K_BYTES }, { ggml::QK_K }>(bytes, out, ggml::q3_k),
        Format::Q5K => blocks::<{ ggml::Q5_K_BYTES }, { ggml::QK_K }>(bytes, out, ggml::q5_k),
        Format::Q6K => blocks::<{ ggml::Q6_K_BYTES }, { ggml::QK_K }>(bytes, out, ggml::q6_k),
        Format::Iq4Nl => blocks::<{ ggml::IQ4_NL_BYTES }, { ggml::QK }>(bytes, out, ggml::iq4_nl),
        Format::Iq4Xs => blocks::<{ ggml::IQ4_XS_BYTES }, { ggml::QK_K }>(bytes, out, ggml::iq4_xs),
        Format::Iq2Xxs => blocks::<{ iq::IQ2_XXS_BYTES }, { ggml::QK_K }>(bytes, out, iq::iq2_xxs),
        Format::Iq2Xs => blocks::<{ iq::IQ2_XS_BYTES }, { ggml::QK_K }>(bytes, out, iq::iq2_xs),
        Format::Iq2S => blocks::<{ iq::IQ2_S_BYTES }, { ggml::QK_K }>(bytes, out, iq::iq2_s),
        Format::Iq3Xxs => blocks::<{ iq::IQ3_XXS_BYTES }, { ggml::QK_K }>(bytes, out, iq::iq3_xxs),
        Format::Iq3S => blocks::<{ iq::IQ3_S_BYTES }, { ggml::QK_K }>(bytes, out, iq::iq3_s),
        Format::Iq1S => blocks::<{ iq::IQ1_S_BYTES }, { ggml::QK_K }>(bytes, out, iq::iq1_s),
        Format::Iq1M => blocks::<{ iq::IQ1_M_BYTES }, { ggml::QK_K }>(bytes, out, iq::iq1_m),
        Format::Mxfp4Ggml => blocks::<{ ggml::MXFP4_BYTES }, { ggml::QK }>(bytes, out, ggml::mxfp4),
    }
}

/// A row of `N`-byte blocks of `V` values, each decoded by `decode`.
#[inline(always)]
fn blocks<const N: usize, const V: usize>(
    bytes: &[u8],
    out: &mut [f32],
    decode: impl Fn(&[u8; N], &mut [f32; V]),
) {
    let (blocks, _) = bytes.as_chunks::<N>();
    let (outs, _) = out.as_chunks_mut::<V>();
    for (o, b) in outs.iter_mut().zip(blocks) {
        decode(b, o);
    }
}

/// A row of FP8 blocks: each value times its block's scale, as the format
/// defines (`w = fp8 × scale_inv`), rounded once to f32.
#[inline(always)]
fn decode_fp8_row(bytes: &[u8], out: &mut [f32]) {
    let mut at = 0;
    for o in out.chunks_mut(FP8_BLOCK) {
        let mut scale = [0u8; FP8_SCALE_BYTES];
        scale.copy_from_slice(&bytes[at..at + FP8_SCALE_BYTES]);
        let scale = f32::from_le_bytes(scale);
        at += FP8_SCALE_BYTES;
        let n = o.len();
        for (v, &q) in o.iter_mut().zip(&bytes[at..at + n]) {
            *v = fp8_e4m3_to_f32(q) * scale;
        }
        at += n;
    }
}

/// One INT4 group: each nibble less 8, times the scale, rounded to BF16.
/// The product is exact in f32 (4 bits by 8), so rounding it once gives
/// compressed-tensors' BF16 product.
#[inline(always)]
fn decode_int4(g: &[u8; INT4_BYTES], out: &mut [f32; INT4_GROUP]) {
    let scale = bf16_to_f32(le_u16(&[g[0], g[1]]));
    let (pairs, _) = out.as_chunks_mut::<2>();
    for (o, &byte) in pairs.iter_mut().zip(&g[INT4_SCALE_BYTES..]) {
        let lo = i32::from(byte & 0xF) - INT4_OFFSET;
        let hi = i32::from(byte >> 4) - INT4_OFFSET;
        o[0] = round_to_bf16(lo as f32 * scale);
        o[1] = round_to_bf16(hi as f32 * scale);
    }
}

/// An E8M0 scale byte as f32: `2^(s − 127)` (255 is NaN).
#[inline(always)]
pub fn e8m0_to_f32(s: u8) -> f32 {
    match s {
        0 => f32::from_bits(1 << 22),
        255 => f32::NAN,
        s => f32::from_bits(u32::from(s) << 23),
    }
}

/// 2^126: moves an E2M1 exponent (bias 1) placed in an f32 (bias 127) home.
pub(crate) const E2M1_EXPONENT_SHIFT: f32 = f32::from_bits((127 + 126) << 23);

/// An E2M1 nibble as f32, exactly: its exponent and mantissa bits go to the
/// top of an f32 and one multiplication by 2^126 rebases normals and the
/// subnormal 0.5 alike (as for halves and FP8). Branch-free, so a block
/// vectorises; a table lookup made MXFP4 decoding half as fast as BF16.
#[inline(always)]
fn e2m1_to_f32(n: u8) -> f32 {
    let n = u32::from(n);
    f32::from_bits(((n & 7) << 22) | ((n & 8) << 28)) * E2M1_EXPONENT_SHIFT
}

/// One MXFP4 block: each E2M1 value times the block's power of two.
#[inline(always)]
fn decode_mxfp4(b: &[u8; MXFP4_BYTES], out: &mut [f32; MXFP4_BLOCK]) {
    let scale = e8m0_to_f32(b[0]);
    // Nibbles in order first, then one straight widening loop: both
    // vectorise, where writing each byte's two values at once did not.
    let mut nibbles = [0u8; MXFP4_BLOCK];
    let (pairs, _) = nibbles.as_chunks_mut::<2>();
    for (n, &byte) in pairs.iter_mut().zip(&b[1..]) {
        *n = [byte & 0xF, byte >> 4];
    }
    for (o, &n) in out.iter_mut().zip(&nibbles) {
        *o = e2m1_to_f32(n) * scale;
    }
}

/// f32 values as little-endian F16 bytes (rounded to nearest), for tests and
/// synthetic weights.
pub fn f32_to_f16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| f16::from_f32(v).to_le_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_format_in_order() {
        for (i, r) in FORMATS.iter().enumerate() {
            assert_eq!(r.format as usize, i, "{}", r.name);
            assert!(r.block > 0 && r.block_bytes > 0);
        }
        let ids: std::collections::BTreeSet<u32> =
            FORMATS.iter().filter_map(|r| r.ggml).map(|g| g.0).collect();
        assert_eq!(
            ids.len(),
            FORMATS.iter().filter(|r| r.ggml.is_some()).count()
        );
    }
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    #[test]
    fn f16_widening_is_exact_for_every_half() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn bf16_widening_is_exact() {
        for b in [0u16, 0x3f80, 0xbf80, 0x0001, 0x7f80, 0x7fc0, 0xffff] {
            let want = half::bf16::from_bits(b).to_f32();
            assert!(bf16_to_f32(b).to_bits() == want.to_bits() || want.is_nan());
        }
    }

    /// Quantised rows decode to exactly the values candle's dequantisation gives.
    #[test]
    fn quantised_rows_decode_as_ggml_does() {
        let cols = 512;
        let values: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let t = Tensor::from_vec(values, (2, cols), &Device::Cpu).unwrap();
        for (dtype, format) in [
            (GgmlDType::Q8_0, Format::Q8_0),
            (GgmlDType::Q4K, Format::Q4K),
            (GgmlDType::Q4_0, Format::Q4_0),
            (GgmlDType::Q4_1, Format::Q4_1),
            (GgmlDType::Q5_0, Format::Q5_0),
            (GgmlDType::Q5_1, Format::Q5_1),
            (GgmlDType::Q2K, Format::Q2K),
            (GgmlDType::Q3K, Format::Q3K),
            (GgmlDType::Q5K, Format::Q5K),
            (GgmlDType::Q6K, Format::Q6K),
        ] {
            assert_eq!(format.block_bytes(), dtype.type_size(), "{format:?}");
            assert_eq!(format.block(), dtype.block_size(), "{format:?}");
            let q = QTensor::quantize(&t, dtype).unwrap();
            let bytes = q.data().unwrap();
            let want: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let row = format.row_bytes(cols).unwrap();
            let mut got = vec![0f32; 2 * cols];
            for r in 0..2 {
                decode_row(
                    format,
                    &bytes[r * row..(r + 1) * row],
                    &mut got[r * cols..(r + 1) * cols],
                );
            }
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{format:?} decodes differently from candle");
        }
    }

    #[test]
    fn rows_must_be_whole_blocks() {
        assert_eq!(Format::F16.row_bytes(3), Some(6));
        assert_eq!(Format::Q8_0.row_bytes(64), Some(68));
        assert_eq!(Format::Q8_0.row_bytes(48), None);
        assert_eq!(Format::Q4K.row_bytes(512), Some(288));
    }

    #[test]
    fn every_fp8_e4m3_byte_widens_exactly() {
        for b in 0..=255u8 {
            let want = float8::F8E4M3::from_bits(b).to_f32();
            let got = fp8_e4m3_to_f32(b);
            if want.is_nan() {
                assert!(got.is_nan(), "{b:#04x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{b:#04x}: {got} vs {want}");
            }
        }
        let table = fp8_e4m3_table();
        for b in 0..=255u8 {
            let (got, want) = (fp8_e4m3_to_f32(b), table[usize::from(b)]);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{b:#04x}"
            );
        }
        assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    /// INT4 groups decode as compressed-tensors does: nibbles low first,
    /// offset by 8, times the BF16 scale with the product rounded to BF16.
    #[test]
    fn int4_groups_decode_as_compressed_tensors_does() {
        // 1 + 2^-7: times 7 the exact product needs 11 bits, BF16 keeps 8.
        let scales = [
            half::bf16::from_f32(1.0078125),
            half::bf16::from_f32(-0.03125),
        ];
        let mut bytes = Vec::new();
        let mut want = Vec::new();
        for (g, scale) in scales.iter().enumerate() {
            bytes.extend_from_slice(&scale.to_le_bytes());
            let q: Vec<u8> = (0..INT4_GROUP)
                .map(|i| ((i * 5 + g * 3) % 16) as u8)
                .collect();
            for pair in q.chunks(2) {
                bytes.push(pair[0] | (pair[1] << 4));
            }
            for &n in &q {
                let product = half::bf16::from_f32((i32::from(n) - 8) as f32) * *scale;
                want.push(product.to_f32());
            }
        }
        let cols = 2 * INT4_GROUP;
        assert_eq!(Format::Int4G32.row_bytes(cols), Some(bytes.len()));
        assert_eq!(Format::Int4G32.row_bytes(48), None);
        let mut out = vec![0f32; cols];
        decode_row(Format::Int4G32, &bytes, &mut out);
        assert_eq!(out, want);
        // The rounding is real: weight 3 is 7 × (1 + 2^-7), not a BF16.
        assert_eq!(out[3], 7.0625);
        assert_ne!(out[3], 7.0 * 1.0078125);
    }

    /// MXFP4 blocks decode as transformers' `convert_moe_packed_tensors`:
    /// the low nibble first, each E2M1 value times `2^(scale − 127)`.
    #[test]
    fn mxfp4_blocks_decode_as_published() {
        let scales = [127u8, 120, 133];
        let mut bytes = Vec::new();
        let mut want = Vec::new();
        for (k, &s) in scales.iter().enumerate() {
            bytes.push(s);
            for i in 0..MXFP4_BLOCK / 2 {
                let (lo, hi) = ((i + k) % 16, (i * 3 + 7) % 16);
                bytes.push((lo | (hi << 4)) as u8);
                let pow = 2f32.powi(i32::from(s) - 127);
                want.push(E2M1[lo] * pow);
                want.push(E2M1[hi] * pow);
            }
        }
        let cols = 3 * MXFP4_BLOCK;
        assert_eq!(Format::Mxfp4.row_bytes(cols), Some(bytes.len()));
        let mut out = vec![0f32; cols];
        decode_row(Format::Mxfp4, &bytes, &mut out);
        assert_eq!(out, want);
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
        assert!(e8m0_to_f32(255).is_nan());
        for n in 0..16u8 {
            assert_eq!(
                e2m1_to_f32(n).to_bits(),
                E2M1[usize::from(n)].to_bits(),
                "{n}"
            );
        }
        assert_eq!(E2M1[7], 6.0);
        assert_eq!(E2M1[9], -0.5);
    }

    #[test]
    fn bf16_rounding_matches_half() {
        for v in [
            1.0f32, 7.0546875, -7.0546875, 1e-40, 3.4e38, 0.1, -0.0, 65504.5,
        ] {
            assert_eq!(
                round_to_bf16(v).to_bits(),
                half::bf16::from_f32(v).to_f32().to_bits(),
                "{v}"
            );
        }
    }

    /// Rows of FP8 blocks, the last one short, decode block by block with
    /// each block's own scale.
    #[test]
    fn fp8_rows_use_each_blocks_scale_and_may_end_short() {
        let cols = 300; // blocks of 128, 128 and 44
        let scales = [0.5f32, -2.0, 0.125];
        let mut bytes = Vec::new();
        let mut want = Vec::new();
        for (k, scale) in scales.iter().enumerate() {
            bytes.extend_from_slice(&scale.to_le_bytes());
            for i in 0..(cols - k * FP8_BLOCK).min(FP8_BLOCK) {
                let q = ((k * 131 + i * 7) % 126) as u8 | if i % 3 == 0 { 0x80 } else { 0 };
                bytes.push(q);
                want.push(float8::F8E4M3::from_bits(q).to_f32() * scale);
            }
        }
        assert_eq!(Format::Fp8Block.row_bytes(cols), Some(bytes.len()));
        let mut out = vec![0f32; cols];
        decode_row(Format::Fp8Block, &bytes, &mut out);
        assert_eq!(out, want);
    }
}
