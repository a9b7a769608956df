//! MXFP4 weights as gpt-oss publishes its experts (`quant_method: mxfp4`):
//! a matrix stack `W` is stored as `W_blocks` (`U8`, `[..., rows, cols / 32,
//! 16]`: two E2M1 values a byte, low nibble first) and `W_scales` (`U8`,
//! `[..., rows, cols / 32]`: E8M0 exponents, `2^(s − 127)`), blocks running
//! along the row (the reduction dimension). Rows are rearranged for the
//! kernels' [`Format::Mxfp4`]: each block's scale byte, then its 16 bytes.

use super::safetensors::UnsupportedDtype;
use super::{Dtype, TensorSource, WeightsError, read_part};
use crate::kernels::format::MXFP4_BLOCK;

/// The format, for messages.
const LAYOUT: &str = "gpt-oss MXFP4";
/// Bytes of one block's values.
const BLOCK_BYTES: usize = MXFP4_BLOCK / 2;

/// The names matrix stack `weight` is stored under: values, then scales.
pub fn parts(weight: &str) -> [String; 2] {
    [format!("{weight}_blocks"), format!("{weight}_scales")]
}

/// Whether `source` holds `weight` as MXFP4 blocks rather than under its name.
pub fn is_blocked(source: &dyn TensorSource, weight: &str) -> bool {
    source.shape(weight).is_none() && source.shape(&parts(weight)[0]).is_some()
}

/// The logical shape (`[..., rows, cols]`) of MXFP4 stack `weight`, from
/// its blocks' shape.
pub fn logical_shape(source: &dyn TensorSource, weight: &str) -> Option<Vec<usize>> {
    let blocks = source.shape(&parts(weight)[0])?;
    let n = blocks.len();
    (n >= 3 && blocks[n - 1] == BLOCK_BYTES).then(|| {
        let mut shape = blocks[..n - 1].to_vec();
        shape[n - 2] *= MXFP4_BLOCK;
        shape
    })
}

/// The matrices of MXFP4 stack `weight` (of `shape`, `[..., rows, cols]`)
/// as [`crate::kernels::Format::Mxfp4`] rows, one after another. Both parts'
/// dtypes and shapes are checked against `shape` first.
pub fn load(
    source: &dyn TensorSource,
    weight: &str,
    shape: &[usize],
) -> Result<Vec<u8>, WeightsError> {
    let [blocks_name, scales_name] = parts(weight);
    let n = shape.len();
    let cols = shape.last().copied().unwrap_or(0);
    if n < 2 || cols == 0 || !cols.is_multiple_of(MXFP4_BLOCK) {
        return Err(WeightsError::InvalidFile {
            path: source.location(&blocks_name),
            reason: format!(
                "MXFP4 tensor `{blocks_name}` has rows of {cols} weights; MXFP4 stores whole blocks of {MXFP4_BLOCK}"
            ),
        });
    }
    let mut scale_shape = shape.to_vec();
    scale_shape[n - 1] = cols / MXFP4_BLOCK;
    let mut block_shape = scale_shape.clone();
    block_shape.push(BLOCK_BYTES);
    let u8s = Dtype::Unsupported(UnsupportedDtype::U8);
    let values = read_part(source, &blocks_name, &block_shape, u8s, LAYOUT)?;
    let scales =
        read_part(source, &scales_name, &scale_shape, u8s, LAYOUT).map_err(|e| match e {
            WeightsError::Missing { .. } => WeightsError::MissingScale {
                name: weight.to_string(),
                scale: scales_name.clone(),
                path: source.location(&blocks_name),
                needs: "MXFP4 weights need their E8M0 block scales (quantization_config mxfp4)",
            },
            other => other,
        })?;
    let mut out = Vec::with_capacity(values.len() + scales.len());
    for (block, scale) in values.chunks_exact(BLOCK_BYTES).zip(&scales) {
        out.push(*scale);
        out.extend_from_slice(block);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Format, Matrix};
    use crate::weights::test_source::Tensors;

    #[test]
    fn blocks_load_with_their_scales_or_say_what_is_wrong() {
        let (count, rows, cols) = (2, 3, 64);
        let values: Vec<u8> = (0..count * rows * cols / 2)
            .map(|i| (i * 37 % 256) as u8)
            .collect();
        let scales: Vec<u8> = (0..count * rows * 2).map(|i| 120 + i as u8).collect();
        let u8s = Dtype::Unsupported(UnsupportedDtype::U8);
        let mut t = Tensors::default();
        t.insert("w_blocks", u8s, &[count, rows, 2, 16], values.clone());
        t.insert("w_scales", u8s, &[count, rows, 2], scales.clone());
        assert!(is_blocked(&t, "w"));
        assert_eq!(logical_shape(&t, "w"), Some(vec![count, rows, cols]));
        let bytes = load(&t, "w", &[count, rows, cols]).unwrap();
        let per = rows * Format::Mxfp4.row_bytes(cols).unwrap();
        let second = Matrix::from_bytes(rows, cols, Format::Mxfp4, &bytes[per..]).unwrap();
        let w = second.to_f32();
        let lut = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for r in 0..rows {
            for c in 0..cols {
                let flat = (rows + r) * cols + c;
                let byte = values[flat / 2];
                let nibble = usize::from(if flat % 2 == 0 { byte & 0xF } else { byte >> 4 });
                let sign = if nibble >= 8 { -1.0 } else { 1.0 };
                let scale = 2f32.powi(i32::from(scales[flat / 32]) - 127);
                assert_eq!(
                    w[r * cols + c],
                    sign * lut[nibble % 8] * scale,
                    "({r}, {c})"
                );
            }
        }
        t.insert("w_scales", u8s, &[count, rows, 4], scales);
        let err = load(&t, "w", &[count, rows, cols]).unwrap_err();
        assert!(
            matches!(&err, WeightsError::Shape { name, .. } if name == "w_scales"),
            "{err}"
        );
        t.remove("w_scales");
        let err = load(&t, "w", &[count, rows, cols]).unwrap_err().to_string();
        assert!(err.contains("w_scales") && err.contains("E8M0"), "{err}");
    }
}
