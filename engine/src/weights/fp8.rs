//! FP8 weights with 128×128 block scales, as DeepSeek-V3/R1 and Kimi K2
//! publish them: `W` (`F8_E4M3`, `[rows, cols]`) beside `W_scale_inv`
//! (`[ceil(rows/128), ceil(cols/128)]`), and `w[r, c] = fp8[r, c] ×
//! scale_inv[r / 128, c / 128]` with integer division — the fixed-block
//! rule, so edge blocks are partial (a 576-row projection is 4½ blocks).
//! compressed-tensors' `float-quantized` FP8 (GLM-4.5's FP8 releases,
//! llm-compressor's checkpoints) stores `W_scale` instead: one per output
//! row, one per tensor, or 128×128 blocks, the same multiplier.
//! Rows are rearranged for the kernels' [`Format::Fp8Block`]: each row's
//! 128-wide blocks led by their scale, so the weight stays 1 byte wide.

use super::safetensors::UnsupportedDtype;
use super::{Dtype, TensorSource, WeightsError};
use crate::kernels::format::e8m0_to_f32;
use crate::kernels::{FP8_BLOCK, Format};

/// How a matrix's scales cover it: each scale spans `rows × cols` weights
/// (a span wider than the matrix covers all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleGrid {
    pub rows: usize,
    pub cols: usize,
}

impl ScaleGrid {
    /// DeepSeek's and compressed-tensors' `block` strategy: 128×128.
    pub const BLOCK: Self = Self {
        rows: FP8_BLOCK,
        cols: FP8_BLOCK,
    };

    /// compressed-tensors' `channel` strategy: a scale per output row.
    fn channel(cols: usize) -> Self {
        Self { rows: 1, cols }
    }

    /// compressed-tensors' `tensor` strategy: one scale.
    fn tensor(rows: usize, cols: usize) -> Self {
        Self { rows, cols }
    }

    /// The scale tensor's shape over `shape` (`[..., rows, cols]`).
    pub fn shape(self, shape: &[usize]) -> Vec<usize> {
        let n = shape.len();
        let mut s = shape.to_vec();
        if n >= 2 {
            s[n - 2] = shape[n - 2].div_ceil(self.rows.max(1));
            s[n - 1] = shape[n - 1].div_ceil(self.cols.max(1));
        }
        s
    }

    /// Scales per `rows × cols` matrix.
    pub fn per_matrix(self, rows: usize, cols: usize) -> usize {
        rows.div_ceil(self.rows.max(1)) * cols.div_ceil(self.cols.max(1))
    }
}

/// The 128×128 block-scale tensor's shape for `shape` (`[..., rows, cols]`).
pub fn scale_shape(shape: &[usize]) -> Vec<usize> {
    ScaleGrid::BLOCK.shape(shape)
}

/// The name of quantised `weight`'s scales: `weight_scale_inv` as
/// transformers names them, or, in DeepSeek-V4's released files, `scale`
/// beside `weight` (`….wq_a.scale` for `….wq_a.weight`), or compressed-
/// tensors' `weight_scale`.
pub fn scale_name(source: &dyn TensorSource, weight: &str) -> String {
    let hf = format!("{weight}_scale_inv");
    if source.shape(&hf).is_some() {
        return hf;
    }
    let compressed = format!("{weight}_scale");
    if source.shape(&compressed).is_some() {
        return compressed;
    }
    match weight.strip_suffix(".weight") {
        Some(stem) if source.shape(&format!("{stem}.scale")).is_some() => format!("{stem}.scale"),
        _ => hf,
    }
}

/// Scales as f32: E8M0 exponents decoded (`2^(b − 127)`), floats as stored.
pub fn load_scale_values(source: &dyn TensorSource, scale: &str) -> Result<Vec<f32>, WeightsError> {
    let raw = source.load_raw(scale)?;
    if raw.dtype == Dtype::Unsupported(UnsupportedDtype::F8E8M0) {
        return Ok(raw.bytes.iter().map(|&b| e8m0_to_f32(b)).collect());
    }
    source
        .load(scale)?
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|source| WeightsError::Tensor {
            name: scale.to_string(),
            source,
        })
}

/// The grid `actual` (a scale tensor's shape) lays over FP8 tensor `shape`:
/// 128×128 blocks; and for compressed-tensors' `weight_scale` also a scale
/// per output row (`[..., rows, 1]`) or one per matrix (`[1]`, `[]`).
fn grid_of(scale: &str, actual: &[usize], shape: &[usize]) -> Option<ScaleGrid> {
    if actual == scale_shape(shape) {
        return Some(ScaleGrid::BLOCK);
    }
    if !scale.ends_with(".weight_scale") || shape.len() < 2 {
        return None;
    }
    let [rows, cols] = [shape[shape.len() - 2], shape[shape.len() - 1]];
    let matrices: usize = shape[..shape.len() - 2].iter().product();
    if actual == ScaleGrid::channel(cols).shape(shape) {
        return Some(ScaleGrid::channel(cols));
    }
    (actual.iter().product::<usize>() == matrices).then_some(ScaleGrid::tensor(rows, cols))
}

/// The f32 scales of FP8 tensor `weight` (of `shape`, `[..., rows, cols]`)
/// and the grid they cover it in ([`scale_name`], [`grid_of`]).
pub fn load_scales(
    source: &dyn TensorSource,
    weight: &str,
    shape: &[usize],
) -> Result<(Vec<f32>, ScaleGrid), WeightsError> {
    let scale = scale_name(source, weight);
    let path = source.location(weight);
    let Some(actual) = source.shape(&scale) else {
        return Err(WeightsError::MissingScale {
            name: weight.to_string(),
            scale,
            path,
            needs: "FP8 weights need their scales (128x128 blocks for quantization_config fp8; \
                    per channel, tensor or block for compressed-tensors float-quantized)",
        });
    };
    let Some(grid) = grid_of(&scale, actual, shape) else {
        let cols = shape.last().copied().unwrap_or(0);
        let expected = if scale.ends_with(".weight_scale") {
            ScaleGrid::channel(cols).shape(shape)
        } else {
            scale_shape(shape)
        };
        return Err(WeightsError::Shape {
            name: scale,
            path,
            actual: actual.to_vec(),
            expected,
        });
    };
    Ok((load_scale_values(source, &scale)?, grid))
}

/// One matrix's FP8 bytes (`rows × cols`) and its scales (row-major over
/// `grid`) as [`Format::Fp8Block`] rows: each 128-wide block led by the
/// scale that covers it. Every grid's column span is 128 or the whole row,
/// so one scale covers each block.
pub fn block_rows(
    fp8: &[u8],
    scales: &[f32],
    rows: usize,
    cols: usize,
    grid: ScaleGrid,
) -> Vec<u8> {
    let grid_cols = cols.div_ceil(grid.cols.max(1));
    let row_bytes = Format::Fp8Block.row_bytes(cols).unwrap_or(0);
    let mut out = Vec::with_capacity(rows * row_bytes);
    for (r, row) in fp8.chunks_exact(cols).take(rows).enumerate() {
        let scale_row = &scales[(r / grid.rows.max(1)) * grid_cols..][..grid_cols];
        for (b, block) in row.chunks(FP8_BLOCK).enumerate() {
            let scale = scale_row[(b * FP8_BLOCK) / grid.cols.max(1)];
            out.extend_from_slice(&scale.to_le_bytes());
            out.extend_from_slice(block);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Matrix, fp8_e4m3_to_f32};
    use crate::weights::test_source::Tensors;

    /// A 200 × 300 matrix: partial blocks on both edges, every weight
    /// decodes to fp8 × its fixed 128×128 block's scale.
    #[test]
    fn every_weight_takes_its_fixed_blocks_scale() {
        let (rows, cols) = (200, 300);
        let fp8: Vec<u8> = (0..rows * cols)
            .map(|i| (i * 37 % 251) as u8 & 0xF7)
            .collect();
        let shape = scale_shape(&[rows, cols]);
        assert_eq!(shape, vec![2, 3]);
        let scales: Vec<f32> = (0..6).map(|i| 0.25 * (i + 1) as f32).collect();
        let m = Matrix::from_bytes(
            rows,
            cols,
            Format::Fp8Block,
            &block_rows(&fp8, &scales, rows, cols, ScaleGrid::BLOCK),
        )
        .unwrap();
        let w = m.to_f32();
        for r in 0..rows {
            for c in 0..cols {
                let want = fp8_e4m3_to_f32(fp8[r * cols + c]) * scales[(r / 128) * 3 + c / 128];
                assert_eq!(w[r * cols + c].to_bits(), want.to_bits(), "({r}, {c})");
            }
        }
    }

    #[test]
    fn checkpoints_give_fp8_matrices_with_their_scales_or_say_what_is_missing() {
        use crate::weights::{Dtype, Weights, WeightsError};
        let (rows, cols) = (130, 64);
        let fp8: Vec<u8> = (0..rows * cols).map(|i| (i % 120) as u8).collect();
        let scales: Vec<f32> = vec![0.5, 4.0];
        let scale_bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let mut t = Tensors::default();
        t.insert("w.weight", Dtype::F8E4M3, &[rows, cols], fp8.clone());
        t.insert(
            "w.weight_scale_inv",
            Dtype::F32,
            &[2, 1],
            scale_bytes.clone(),
        );
        let m = Weights::root(&t).matrix("w.weight", rows, cols).unwrap();
        assert_eq!(m.format(), Format::Fp8Block);
        let w = m.to_f32();
        assert_eq!(w[0], fp8_e4m3_to_f32(fp8[0]) * 0.5);
        assert_eq!(
            w[129 * cols + 5],
            fp8_e4m3_to_f32(fp8[129 * cols + 5]) * 4.0
        );
        // A wrong scale shape is named; so is a missing scale.
        t.insert("w.weight_scale_inv", Dtype::F32, &[1, 2], scale_bytes);
        let err = Weights::root(&t)
            .matrix("w.weight", rows, cols)
            .unwrap_err();
        assert!(
            matches!(&err, WeightsError::Shape { name, expected, .. } if name == "w.weight_scale_inv" && *expected == vec![2, 1]),
            "{err}"
        );
        t.remove("w.weight_scale_inv");
        let err = Weights::root(&t)
            .matrix("w.weight", rows, cols)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("w.weight_scale_inv") && err.contains("128x128 blocks"),
            "{err}"
        );
    }

    /// compressed-tensors' `weight_scale`: per output row, per tensor, or
    /// 128×128 blocks, each weight decoding to fp8 × the scale covering it.
    #[test]
    fn compressed_tensors_scales_cover_rows_tensors_or_blocks() {
        use crate::weights::{Dtype, Weights, WeightsError};
        let (rows, cols) = (130, 300);
        let fp8: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 120) as u8).collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>();
        let per_row: Vec<f32> = (0..rows).map(|r| 0.5 + r as f32 / 64.0).collect();
        let per_block: Vec<f32> = (0..6).map(|i| 0.25 * (i + 1) as f32).collect();
        type ScaleAt = fn(&[f32], usize, usize) -> f32;
        let cases: [(&[usize], Vec<f32>, ScaleAt); 4] = [
            (&[rows, 1], per_row.clone(), |s, r, _| s[r]),
            (&[1], vec![3.0], |s, _, _| s[0]),
            (&[], vec![0.75], |s, _, _| s[0]),
            (&[2, 3], per_block, |s, r, c| s[(r / 128) * 3 + c / 128]),
        ];
        for (shape, scales, scale_at) in cases {
            let mut t = Tensors::default();
            t.insert("w.weight", Dtype::F8E4M3, &[rows, cols], fp8.clone());
            t.insert("w.weight_scale", Dtype::F32, shape, bytes(&scales));
            let w = Weights::root(&t)
                .matrix("w.weight", rows, cols)
                .unwrap()
                .to_f32();
            for (r, c) in [(0, 0), (1, 299), (127, 128), (128, 5), (129, 256)] {
                let want = fp8_e4m3_to_f32(fp8[r * cols + c]) * scale_at(&scales, r, c);
                assert_eq!(
                    w[r * cols + c].to_bits(),
                    want.to_bits(),
                    "{shape:?} ({r}, {c})"
                );
            }
        }
        // A scale that fits no grid is named with the per-row shape.
        let mut t = Tensors::default();
        t.insert("w.weight", Dtype::F8E4M3, &[rows, cols], fp8);
        t.insert(
            "w.weight_scale",
            Dtype::F32,
            &[1, cols],
            bytes(&vec![1.0; cols]),
        );
        let err = Weights::root(&t)
            .matrix("w.weight", rows, cols)
            .unwrap_err();
        assert!(
            matches!(&err, WeightsError::Shape { name, expected, .. } if name == "w.weight_scale" && *expected == vec![rows, 1]),
            "{err}"
        );
    }
}
