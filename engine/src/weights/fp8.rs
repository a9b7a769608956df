//! FP8 weights with 128×128 block scales, as DeepSeek-V3/R1 and Kimi K2
//! publish them: `W` (`F8_E4M3`, `[rows, cols]`) beside `W_scale_inv`
//! (`[ceil(rows/128), ceil(cols/128)]`), and `w[r, c] = fp8[r, c] ×
//! scale_inv[r / 128, c / 128]` with integer division — the fixed-block
//! rule, so edge blocks are partial (a 576-row projection is 4½ blocks).
//! Rows are rearranged for the kernels' [`Format::Fp8Block`]: each row's
//! 128-wide blocks led by their scale, so the weight stays 1 byte wide.

use super::safetensors::UnsupportedDtype;
use super::{Dtype, TensorSource, WeightsError};
use crate::kernels::format::e8m0_to_f32;
use crate::kernels::{FP8_BLOCK, Format};

/// The scale tensor's shape for `shape` (`[..., rows, cols]`).
pub fn scale_shape(shape: &[usize]) -> Vec<usize> {
    let n = shape.len();
    let mut s = shape.to_vec();
    if n >= 2 {
        s[n - 2] = shape[n - 2].div_ceil(FP8_BLOCK);
        s[n - 1] = shape[n - 1].div_ceil(FP8_BLOCK);
    }
    s
}

/// The name of quantised `weight`'s scales: `weight_scale_inv` as
/// transformers names them, or, in DeepSeek-V4's released files, `scale`
/// beside `weight` (`….wq_a.scale` for `….wq_a.weight`).
pub fn scale_name(source: &dyn TensorSource, weight: &str) -> String {
    let hf = format!("{weight}_scale_inv");
    match weight.strip_suffix(".weight") {
        Some(stem) if source.shape(&hf).is_none() => {
            let released = format!("{stem}.scale");
            if source.shape(&released).is_some() {
                return released;
            }
            hf
        }
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

/// The f32 block scales of FP8 tensor `weight` (of `shape`, `[..., rows,
/// cols]`): its scales ([`scale_name`]), which must have [`scale_shape`].
pub fn load_scales(
    source: &dyn TensorSource,
    weight: &str,
    shape: &[usize],
) -> Result<Vec<f32>, WeightsError> {
    let scale = scale_name(source, weight);
    let path = source.location(weight);
    let Some(actual) = source.shape(&scale) else {
        return Err(WeightsError::MissingScale {
            name: weight.to_string(),
            scale,
            path,
            needs: "FP8 weights need their 128x128 block scales (quantization_config fp8)",
        });
    };
    let expected = scale_shape(shape);
    if actual != expected {
        return Err(WeightsError::Shape {
            name: scale,
            path,
            actual: actual.to_vec(),
            expected,
        });
    }
    load_scale_values(source, &scale)
}

/// One matrix's FP8 bytes (`rows × cols`) and its block scales (row-major
/// `[ceil(rows/128), ceil(cols/128)]`) as [`Format::Fp8Block`] rows.
pub fn block_rows(fp8: &[u8], scales: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let blocks = cols.div_ceil(FP8_BLOCK);
    let row_bytes = Format::Fp8Block.row_bytes(cols).unwrap_or(0);
    let mut out = Vec::with_capacity(rows * row_bytes);
    for (r, row) in fp8.chunks_exact(cols).take(rows).enumerate() {
        let scale_row = &scales[(r / FP8_BLOCK) * blocks..][..blocks];
        for (block, scale) in row.chunks(FP8_BLOCK).zip(scale_row) {
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
            &block_rows(&fp8, &scales, rows, cols),
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
            err.contains("w.weight_scale_inv") && err.contains("block scales"),
            "{err}"
        );
    }
}
