//! INT4 weights as compressed-tensors' `pack-quantized` format publishes
//! them (Kimi K2-Thinking, K2.5): a matrix `W` is stored as
//! `W_packed` (`I32`, `[rows, cols / 8]`, eight nibbles a word, low first,
//! each offset by 8), `W_scale` (`BF16`, `[rows, cols / 32]`: symmetric,
//! one scale per group of 32 along the row) and `W_shape` (`[rows, cols]`).
//! Rows are rearranged for the kernels' [`Format::Int4G32`]: each group's
//! scale, then its 16 bytes, so the weight stays half a byte wide.

use super::safetensors::UnsupportedDtype;
use super::{Dtype, TensorSource, WeightsError, read_part};
use crate::kernels::Format;
use crate::kernels::format::INT4_GROUP;

/// The format, for messages.
const LAYOUT: &str = "compressed-tensors INT4";
/// Weights per packed 32-bit word.
pub const PER_WORD: usize = 8;

/// The names compressed-tensors stores matrix `weight` (`….weight`) under:
/// packed nibbles, group scales, original shape.
pub fn parts(weight: &str) -> [String; 3] {
    ["packed", "scale", "shape"].map(|p| format!("{weight}_{p}"))
}

/// Whether `source` holds `weight` packed as INT4 rather than under its name.
pub fn is_packed(source: &dyn TensorSource, weight: &str) -> bool {
    source.shape(weight).is_none() && source.shape(&parts(weight)[0]).is_some()
}

/// `count` INT4 matrices `weight` of `shape` (`[..., rows, cols]`) as
/// [`Format::Int4G32`] rows, one matrix after another. Every part's dtype
/// and shape is checked against `shape` first.
pub fn load(
    source: &dyn TensorSource,
    weight: &str,
    shape: &[usize],
    count: usize,
) -> Result<Vec<u8>, WeightsError> {
    let [packed, scale, original] = parts(weight);
    let path = source.location(&packed);
    let n = shape.len();
    let (rows, cols) = (shape[n - 2], shape[n - 1]);
    if !cols.is_multiple_of(INT4_GROUP) {
        return Err(WeightsError::InvalidFile {
            path,
            reason: format!(
                "INT4 tensor `{packed}` has rows of {cols} weights; Longhaul reads whole groups of {INT4_GROUP}"
            ),
        });
    }
    let mut packed_shape = shape.to_vec();
    packed_shape[n - 1] = cols / PER_WORD;
    let mut scale_shape = shape.to_vec();
    scale_shape[n - 1] = cols / INT4_GROUP;
    let i32s = Dtype::Unsupported(UnsupportedDtype::I32);
    let words = read_part(source, &packed, &packed_shape, i32s, LAYOUT)?;
    let scales =
        read_part(source, &scale, &scale_shape, Dtype::BF16, LAYOUT).map_err(|e| match e {
            WeightsError::Missing { .. } => WeightsError::MissingScale {
                name: weight.to_string(),
                scale: scale.clone(),
                path: path.clone(),
                needs: "INT4 weights need their group scales (compressed-tensors pack-quantized)",
            },
            other => other,
        })?;
    check_original(source, &original, rows, cols)?;
    Ok(words
        .chunks((rows * cols / 2).max(1))
        .zip(scales.chunks((rows * cols / INT4_GROUP * 2).max(1)))
        .take(count)
        .flat_map(|(w, s)| group_rows(w, s, rows, cols))
        .collect())
}

/// `W_shape`, where present, must say `[rows, cols]`.
fn check_original(
    source: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<(), WeightsError> {
    if source.shape(name).is_none() {
        return Ok(());
    }
    let raw = source.load_raw(name)?;
    let values: Option<Vec<i64>> = match raw.dtype {
        Dtype::Unsupported(UnsupportedDtype::I32) => Some(
            raw.bytes
                .as_chunks::<4>()
                .0
                .iter()
                .map(|b| i64::from(i32::from_le_bytes(*b)))
                .collect(),
        ),
        Dtype::Unsupported(UnsupportedDtype::I64) => Some(
            raw.bytes
                .as_chunks::<8>()
                .0
                .iter()
                .map(|b| i64::from_le_bytes(*b))
                .collect(),
        ),
        _ => None,
    };
    let want = [rows as i64, cols as i64];
    if values.as_deref() != Some(&want[..]) {
        return Err(WeightsError::InvalidFile {
            path: source.location(name),
            reason: format!(
                "`{name}` gives the matrix shape {values:?}, but config.json implies {want:?}"
            ),
        });
    }
    Ok(())
}

/// One matrix's packed bytes (`rows × cols / 2`, as the little-endian words
/// hold them) and BF16 scales (`rows × cols / 32`) as [`Format::Int4G32`] rows.
pub fn group_rows(packed: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = Format::Int4G32.row_bytes(cols).unwrap_or(0);
    let mut out = Vec::with_capacity(rows * row_bytes);
    let (scales, _) = scales.as_chunks::<2>();
    for (group, scale) in packed.chunks_exact(INT4_GROUP / 2).zip(scales) {
        out.extend_from_slice(scale);
        out.extend_from_slice(group);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Matrix;
    use crate::weights::test_source::Tensors;

    fn words(q: &[u8]) -> Vec<u8> {
        q.chunks(8)
            .flat_map(|w| {
                let word = w
                    .iter()
                    .enumerate()
                    .fold(0u32, |acc, (i, &n)| acc | (u32::from(n) << (4 * i)));
                word.to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn packed_matrices_load_with_their_group_scales_or_say_what_is_wrong() {
        use crate::weights::Weights;
        let (rows, cols) = (3, 64);
        let q: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 16) as u8).collect();
        let scales: Vec<half::bf16> = (0..rows * 2)
            .map(|i| half::bf16::from_f32(0.5 + i as f32))
            .collect();
        let scale_bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let i32s = Dtype::Unsupported(UnsupportedDtype::I32);
        let mut t = Tensors::default();
        t.insert("w.weight_packed", i32s, &[rows, cols / 8], words(&q));
        t.insert(
            "w.weight_scale",
            Dtype::BF16,
            &[rows, 2],
            scale_bytes.clone(),
        );
        let shape_bytes: Vec<u8> = [rows as i32, cols as i32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        t.insert("w.weight_shape", i32s, &[2], shape_bytes);
        assert!(is_packed(&t, "w.weight"));
        let m: Matrix = Weights::root(&t).matrix("w.weight", rows, cols).unwrap();
        assert_eq!(m.format(), Format::Int4G32);
        let w = m.to_f32();
        for r in 0..rows {
            for c in 0..cols {
                let s = scales[r * 2 + c / 32];
                let want = (half::bf16::from_f32(f32::from(q[r * cols + c]) - 8.0) * s).to_f32();
                assert_eq!(w[r * cols + c], want, "({r}, {c})");
            }
        }
        // A scale of the wrong shape, a wrong recorded shape and a missing
        // scale are each named.
        t.insert(
            "w.weight_scale",
            Dtype::BF16,
            &[rows, 4],
            scale_bytes.clone(),
        );
        let err = Weights::root(&t)
            .matrix("w.weight", rows, cols)
            .unwrap_err();
        assert!(
            matches!(&err, WeightsError::Shape { name, .. } if name == "w.weight_scale"),
            "{err}"
        );
        t.insert("w.weight_scale", Dtype::BF16, &[rows, 2], scale_bytes);
        let bad_shape: Vec<u8> = [rows as i32, 32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        t.insert("w.weight_shape", i32s, &[2], bad_shape);
        let err = Weights::root(&t)
            .matrix("w.weight", rows, cols)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("w.weight_shape") && err.contains("[3, 64]"),
            "{err}"
        );
        t.remove("w.weight_shape");
        t.remove("w.weight_scale");
        let err = Weights::root(&t)
            .matrix("w.weight", rows, cols)
            .unwrap_err()
            .to_string();
        assert!(err.contains("w.weight_scale"), "{err}");
    }
}
