//! GGML's grid-based "IQ" block types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
//! IQ2_S, IQ3_XXS, IQ3_S), decoded as GGML's `dequantize_row_iq*` do: an
//! index picks a row of a fixed grid, a sign byte flips its values, and a
//! block or sub-block scale multiplies them, in GGML's order of operations.
//!
//! Why support them: the community's low-bit quantisations of the largest
//! MoEs (unsloth's DeepSeek-R1/V3 and Kimi-K2 "dynamic" files) put their
//! experts in IQ1_S, IQ1_M and IQ2_XXS, and their smaller mixes in IQ2_XS,
//! IQ2_S, IQ3_XXS and IQ3_S (llama.cpp issues' tensor-type counts).

use std::sync::OnceLock;

use super::format::f16_to_f32;
use super::ggml::QK_K;
use super::iq_grids::{self, PackedGrid};

pub const IQ2_XXS_BYTES: usize = 2 + QK_K / 4;
pub const IQ2_XS_BYTES: usize = 2 + QK_K / 4 + QK_K / 32;
pub const IQ2_S_BYTES: usize = 2 + QK_K / 4 + QK_K / 16;
pub const IQ3_XXS_BYTES: usize = 2 + 3 * QK_K / 8;
pub const IQ3_S_BYTES: usize = 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64;
pub const IQ1_S_BYTES: usize = 2 + QK_K / 8 + QK_K / 16;
pub const IQ1_M_BYTES: usize = QK_K / 8 + QK_K / 16 + QK_K / 32;

/// IQ1's offset of every grid value, negated by the block's sign bit.
const IQ1_DELTA: f32 = 0.125;
/// Values per sub-block of 32 in the IQ types' loops.
const SUB: usize = 32;

/// A grid unpacked: `entries × values` small integers.
struct Grid {
    values: usize,
    cells: Vec<i8>,
}

impl Grid {
    fn unpack(g: &PackedGrid) -> Self {
        let hex = g.hex.as_bytes();
        let nibble = |c: u8| if c > b'@' { c + 9 } else { c } & 0x0F;
        // Values sit at equal strides in a byte: two of 3 bits at 0 and 4.
        let per_byte = 8 / g.bits as usize;
        let stride = 8 / per_byte as u32;
        let mask = (1u8 << g.bits) - 1;
        let mut cells = Vec::with_capacity(g.entries * g.values);
        for pair in hex.chunks_exact(2) {
            let byte = (nibble(pair[0]) << 4) | nibble(pair[1]);
            for k in 0..per_byte {
                let index = (byte >> (k as u32 * stride)) & mask;
                cells.push(g.map.get(usize::from(index)).copied().unwrap_or(0));
            }
        }
        cells.resize(g.entries * g.values, 0);
        Self {
            values: g.values,
            cells,
        }
    }

    #[inline(always)]
    fn row(&self, index: usize) -> &[i8] {
        &self.cells[index * self.values..(index + 1) * self.values]
    }
}

fn grid(which: &'static PackedGrid, cell: &'static OnceLock<Grid>) -> &'static Grid {
    cell.get_or_init(|| Grid::unpack(which))
}

macro_rules! grid_fn {
    ($name:ident, $packed:path) => {
        fn $name() -> &'static Grid {
            static CELL: OnceLock<Grid> = OnceLock::new();
            grid(&$packed, &CELL)
        }
    };
}
grid_fn!(iq2xxs_grid, iq_grids::IQ2_XXS);
grid_fn!(iq2xs_grid, iq_grids::IQ2_XS);
grid_fn!(iq2s_grid, iq_grids::IQ2_S);
grid_fn!(iq3xxs_grid, iq_grids::IQ3_XXS);
grid_fn!(iq3s_grid, iq_grids::IQ3_S);
grid_fn!(iq1s_grid, iq_grids::IQ1_S);

/// The sign byte of a 7-bit index: bit 7 makes the count of set bits even.
#[inline(always)]
fn ksigns(i: u32) -> u8 {
    let i = (i & 0x7F) as u8;
    i | (((i.count_ones() & 1) as u8) << 7)
}

#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `scale × grid × ±1` for one row of the grid into `out`.
#[inline(always)]
fn signed(out: &mut [f32], scale: f32, row: &[i8], signs: u8) {
    for (j, (o, &g)) in out.iter_mut().zip(row).enumerate() {
        let sign = if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
        *o = scale * f32::from(g) * sign;
    }
}

pub fn iq2_xxs(b: &[u8; IQ2_XXS_BYTES], out: &mut [f32; QK_K]) {
    let (d, g) = (half(b, 0), iq2xxs_grid());
    for ib in 0..QK_K / SUB {
        let (a0, a1) = (word(b, 2 + 8 * ib), word(b, 6 + 8 * ib));
        let db = d * (0.5 + (a1 >> 28) as f32) * 0.25;
        for l in 0..4 {
            let row = g.row(((a0 >> (8 * l)) & 0xFF) as usize);
            let at = ib * SUB + 8 * l;
            signed(&mut out[at..at + 8], db, row, ksigns(a1 >> (7 * l)));
        }
    }
}

pub fn iq2_xs(b: &[u8; IQ2_XS_BYTES], out: &mut [f32; QK_K]) {
    let (d, g) = (half(b, 0), iq2xs_grid());
    let scales = &b[2 + QK_K / 4..];
    for ib in 0..QK_K / SUB {
        let s = scales[ib];
        let db = [
            d * (0.5 + f32::from(s & 0xF)) * 0.25,
            d * (0.5 + f32::from(s >> 4)) * 0.25,
        ];
        for l in 0..4 {
            let q = u32::from(u16::from_le_bytes([
                b[2 + 8 * ib + 2 * l],
                b[3 + 8 * ib + 2 * l],
            ]));
            let at = ib * SUB + 8 * l;
            signed(
                &mut out[at..at + 8],
                db[l / 2],
                g.row((q & 511) as usize),
                ksigns(q >> 9),
            );
        }
    }
}

pub fn iq2_s(b: &[u8; IQ2_S_BYTES], out: &mut [f32; QK_K]) {
    let (d, g) = (half(b, 0), iq2s_grid());
    let qs = &b[2..2 + QK_K / 8];
    let signs = &b[2 + QK_K / 8..2 + QK_K / 4];
    let qh = &b[2 + QK_K / 4..2 + QK_K / 4 + QK_K / 32];
    let scales = &b[2 + QK_K / 4 + QK_K / 32..];
    for ib in 0..QK_K / SUB {
        let s = scales[ib];
        let db = [
            d * (0.5 + f32::from(s & 0xF)) * 0.25,
            d * (0.5 + f32::from(s >> 4)) * 0.25,
        ];
        for l in 0..4 {
            let high = (usize::from(qh[ib]) << (8 - 2 * l)) & 0x300;
            let row = g.row(usize::from(qs[4 * ib + l]) | high);
            let at = ib * SUB + 8 * l;
            signed(&mut out[at..at + 8], db[l / 2], row, signs[4 * ib + l]);
        }
    }
}

pub fn iq3_xxs(b: &[u8; IQ3_XXS_BYTES], out: &mut [f32; QK_K]) {
    let (d, g) = (half(b, 0), iq3xxs_grid());
    let qs = &b[2..2 + QK_K / 4];
    for ib in 0..QK_K / SUB {
        let aux = word(b, 2 + QK_K / 4 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = ksigns(aux >> (7 * l));
            let at = ib * SUB + 8 * l;
            let (first, second) = (
                g.row(usize::from(qs[8 * ib + 2 * l])),
                g.row(usize::from(qs[8 * ib + 2 * l + 1])),
            );
            signed(&mut out[at..at + 4], db, first, signs);
            signed(&mut out[at + 4..at + 8], db, second, signs >> 4);
        }
    }
}

pub fn iq3_s(b: &[u8; IQ3_S_BYTES], out: &mut [f32; QK_K]) {
    let (d, g) = (half(b, 0), iq3s_grid());
    let qs = &b[2..2 + QK_K / 4];
    let qh = &b[2 + QK_K / 4..2 + QK_K / 4 + QK_K / 32];
    let signs = &b[2 + QK_K / 4 + QK_K / 32..2 + QK_K / 4 + QK_K / 32 + QK_K / 8];
    let scales = &b[IQ3_S_BYTES - QK_K / 64..];
    for ib in 0..QK_K / SUB {
        let s = scales[ib / 2];
        let scale = if ib % 2 == 0 { s & 0xF } else { s >> 4 };
        let db = d * f32::from(1 + 2 * scale);
        for l in 0..4 {
            let k = 8 * ib + 2 * l;
            let high = |k: usize| (usize::from(qh[k / 8] >> (k % 8)) & 1) << 8;
            let (first, second) = (
                g.row(usize::from(qs[k]) | high(k)),
                g.row(usize::from(qs[k + 1]) | high(k + 1)),
            );
            let sign = signs[4 * ib + l];
            let at = ib * SUB + 8 * l;
            signed(&mut out[at..at + 4], db, first, sign);
            signed(&mut out[at + 4..at + 8], db, second, sign >> 4);
        }
    }
}

/// `scale × (grid + delta)` for one row of the IQ1 grid into `out`.
#[inline(always)]
fn shifted(out: &mut [f32], scale: f32, row: &[i8], delta: f32) {
    for (o, &g) in out.iter_mut().zip(row) {
        *o = scale * (f32::from(g) + delta);
    }
}

pub fn iq1_s(b: &[u8; IQ1_S_BYTES], out: &mut [f32; QK_K]) {
    let (d, g) = (half(b, 0), iq1s_grid());
    let qs = &b[2..2 + QK_K / 8];
    for ib in 0..QK_K / SUB {
        let at = 2 + QK_K / 8 + 2 * ib;
        let qh = u16::from_le_bytes([b[at], b[at + 1]]);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 {
            -IQ1_DELTA
        } else {
            IQ1_DELTA
        };
        for l in 0..4 {
            let index = usize::from(qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            let o = ib * SUB + 8 * l;
            shifted(&mut out[o..o + 8], dl, g.row(index), delta);
        }
    }
}

pub fn iq1_m(b: &[u8; IQ1_M_BYTES], out: &mut [f32; QK_K]) {
    let g = iq1s_grid();
    let qs = &b[..QK_K / 8];
    let qh = &b[QK_K / 8..QK_K / 8 + QK_K / 16];
    let sc_at = QK_K / 8 + QK_K / 16;
    let sc = |k: usize| u16::from_le_bytes([b[sc_at + 2 * k], b[sc_at + 2 * k + 1]]);
    // The super-block's f16 scale is spread over the top nibbles of the
    // four sub-block scale words.
    let bits = (sc(0) >> 12) | ((sc(1) >> 8) & 0x00F0) | ((sc(2) >> 4) & 0x0F00) | (sc(3) & 0xF000);
    let d = f16_to_f32(bits);
    for ib in 0..QK_K / SUB {
        let shift = 6 * (ib % 2);
        let dl = [
            d * f32::from(2 * ((sc(ib / 2) >> shift) & 7) + 1),
            d * f32::from(2 * ((sc(ib / 2) >> (shift + 3)) & 7) + 1),
        ];
        for l in 0..4 {
            let h = qh[2 * ib + l / 2] >> (4 * (l % 2));
            let index = usize::from(qs[4 * ib + l]) | (usize::from(h & 7) << 8);
            let delta = if h & 0x08 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
            let o = ib * SUB + 8 * l;
            shifted(&mut out[o..o + 8], dl[l / 2], g.row(index), delta);
        }
    }
}
