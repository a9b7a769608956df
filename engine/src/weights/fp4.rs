//! FP4 weights as DeepSeek-V4 publishes its routed experts (`expert_dtype:
//! fp4`): a matrix `W` (`[rows, cols]`) is stored as `I8` `[rows, cols / 2]`
//! (two E2M1 values a byte, low nibble first) beside E8M0 scales
//! `[rows, cols / 32]` (`2^(s − 127)` per 32 weights of a row; `W.scale` in
//! the release, `W_scale_inv` as transformers names it). That is MXFP4 with
//! another spelling: rows are rearranged into [`Format::Mxfp4`] blocks, each
//! block's scale byte then its 16 bytes, the bytes themselves unchanged.

use super::fp8::scale_name;
use super::safetensors::UnsupportedDtype;
use super::{Dtype, TensorSource, WeightsError, read_part};
use crate::kernels::Format;
use crate::kernels::format::MXFP4_BLOCK;

/// The format, for messages.
const LAYOUT: &str = "DeepSeek-V4 FP4";
/// Bytes of one block's values.
const BLOCK_BYTES: usize = MXFP4_BLOCK / 2;

/// The stored shape of an FP4 matrix of logical `shape`.
fn packed_shape(shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(last) = s.last_mut() {
        *last /= 2;
    }
    s
}

/// Whether `source` holds `weight` (logically `shape`) as FP4 bytes.
pub fn is_packed(source: &dyn TensorSource, weight: &str, shape: &[usize]) -> bool {
    let cols = shape.last().copied().unwrap_or(0);
    cols > 0
        && cols.is_multiple_of(MXFP4_BLOCK)
        && source.shape(weight) == Some(packed_shape(shape).as_slice())
        && source.shape(&scale_name(source, weight)).is_some()
}

/// The logical shape of a stored FP4 matrix: twice the stored columns.
pub fn logical_shape(stored: &[usize]) -> Vec<usize> {
    let mut s = stored.to_vec();
    if let Some(last) = s.last_mut() {
        *last *= 2;
    }
    s
}

/// FP4 matrix `weight` (of logical `shape`, `[rows, cols]`) as
/// [`Format::Mxfp4`] rows; both parts' dtypes and shapes are checked.
pub fn load(
    source: &dyn TensorSource,
    weight: &str,
    shape: &[usize],
) -> Result<(Format, Vec<u8>), WeightsError> {
    let n = shape.len();
    let cols = shape.last().copied().unwrap_or(0);
    let mut scale_shape = shape.to_vec();
    if n > 0 {
        scale_shape[n - 1] = cols / MXFP4_BLOCK;
    }
    let i8s = Dtype::Unsupported(UnsupportedDtype::I8);
    let values = read_part(source, weight, &packed_shape(shape), i8s, LAYOUT)?;
    let scale = scale_name(source, weight);
    let e8m0 = Dtype::Unsupported(UnsupportedDtype::F8E8M0);
    let scales = read_part(source, &scale, &scale_shape, e8m0, LAYOUT)?;
    let mut out = Vec::with_capacity(values.len() + scales.len());
    for (block, s) in values.chunks_exact(BLOCK_BYTES).zip(&scales) {
        out.push(*s);
        out.extend_from_slice(block);
    }
    Ok((Format::Mxfp4, out))
}
