//! Reading checkpoint weights: validated before use, converted to f32.
//!
//! Model code asks for tensors by name and expected shape through [`Weights`];
//! it never touches files. A missing tensor or a shape that contradicts the
//! config is reported with the tensor's name and the file it came from.

mod checkpoint;
pub mod fp4;
pub mod fp8;
pub mod gguf;
pub mod int4;
pub mod mxfp4;
pub mod rows;
pub mod safetensors;
#[cfg(test)]
mod test_source;

use std::path::PathBuf;

use candle_core::{Device, Tensor};

pub use checkpoint::SafetensorsCheckpoint;
pub use rows::{FileRows, RowsError};

use crate::kernels::{Format, Matrix};
use safetensors::UnsupportedDtype;
pub use safetensors::{Dtype, RowOrder, SafetensorsFile, TensorInfo};

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    InvalidFile { path: PathBuf, reason: String },
    #[error(
        "{dir}: no weights found (expected model.safetensors, or shards listed in model.safetensors.index.json)"
    )]
    NoWeights { dir: PathBuf },
    #[error("tensor `{name}` is missing from the checkpoint in {dir}")]
    Missing { name: String, dir: PathBuf },
    #[error("{path}: tensor `{name}` has shape {actual:?}, but config.json implies {expected:?}")]
    Shape {
        name: String,
        path: PathBuf,
        actual: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error(
        "{path}: tensor `{name}` is stored as {dtype:?}; supported weight dtypes are F32, F16, BF16, F8_E4M3 with block scales, INT4 packed by compressed-tensors, and MXFP4 blocks"
    )]
    UnsupportedDtype {
        name: String,
        path: PathBuf,
        dtype: Dtype,
    },
    #[error("{path}: quantised tensor `{name}` has no `{scale}` beside it; {needs}")]
    MissingScale {
        name: String,
        scale: String,
        path: PathBuf,
        /// What the format needs, e.g. FP8's 128x128 block scales.
        needs: &'static str,
    },
    #[error("tensor `{name}` appears in both {first} and {second}")]
    Duplicate {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("building tensor `{name}`: {source}")]
    Tensor {
        name: String,
        #[source]
        source: candle_core::Error,
    },
}

/// A tensor's bytes as stored.
#[derive(Debug)]
pub struct RawTensor {
    pub dtype: Dtype,
    pub bytes: Vec<u8>,
}

/// Anything that can hand out named tensors: a checkpoint folder, or the
/// resident file of a pack.
pub trait TensorSource: Send + Sync {
    /// The stored shape of `name`, if the source has it.
    fn shape(&self, name: &str) -> Option<&[usize]>;
    /// Reads `name` as an f32 tensor on the CPU.
    fn load(&self, name: &str) -> Result<Tensor, WeightsError>;
    /// Reads `name`'s bytes as stored.
    fn load_raw(&self, name: &str) -> Result<RawTensor, WeightsError>;
    /// Where `name` is stored, for error messages.
    fn location(&self, name: &str) -> PathBuf;
    /// The folder or file the source was opened from, for error messages.
    fn origin(&self) -> PathBuf;
}

/// A source whose tensor names spell some segments differently: transformers
/// 5.24 saves Kimi-K2.5's text layers as `model.blocks.N` where the released
/// files (and Longhaul's model code) say `model.layers.N`; Hunyuan calls its
/// q/k norms `query_layernorm` and `key_layernorm`.
pub struct Renamed<'a> {
    pub inner: &'a dyn TensorSource,
    /// The spelling the model code asks for and the one the files use, per
    /// segment; the first pair whose spelling a name holds applies.
    pub pairs: &'a [(&'a str, &'a str)],
}

impl<'a> Renamed<'a> {
    fn stored_name(&self, name: &str) -> String {
        respell(name, self.pairs)
    }

    /// `source` seen through `pairs`, when it holds tensor `probe` (a
    /// name only the other spelling has).
    pub fn where_present(
        source: &'a dyn TensorSource,
        probe: &str,
        pairs: &'a [(&'a str, &'a str)],
    ) -> Option<Box<dyn TensorSource + 'a>> {
        source.shape(probe).map(|_| {
            Box::new(Renamed {
                inner: source,
                pairs,
            }) as Box<dyn TensorSource + 'a>
        })
    }
}

/// `name` as a file spells it, given the `(asked, stored)` spellings of
/// [`Renamed::pairs`]: the first pair whose asked spelling `name` holds
/// replaces it once.
pub fn respell(name: &str, pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .find(|(asked, _)| name.contains(asked))
        .map_or_else(
            || name.to_string(),
            |(asked, stored)| name.replacen(asked, stored, 1),
        )
}

impl TensorSource for Renamed<'_> {
    fn shape(&self, name: &str) -> Option<&[usize]> {
        self.inner.shape(&self.stored_name(name))
    }
    fn load(&self, name: &str) -> Result<Tensor, WeightsError> {
        self.inner.load(&self.stored_name(name))
    }
    fn load_raw(&self, name: &str) -> Result<RawTensor, WeightsError> {
        self.inner.load_raw(&self.stored_name(name))
    }
    fn location(&self, name: &str) -> PathBuf {
        self.inner.location(&self.stored_name(name))
    }
    fn origin(&self) -> PathBuf {
        self.inner.origin()
    }
}

/// A prefixed view of a [`TensorSource`], in the spirit of candle's VarBuilder.
#[derive(Clone)]
pub struct Weights<'a> {
    source: &'a dyn TensorSource,
    prefix: String,
}

impl<'a> Weights<'a> {
    pub fn root(source: &'a dyn TensorSource) -> Self {
        Self {
            source,
            prefix: String::new(),
        }
    }

    /// A view one level deeper: `w.pp("layers.3").get("q_proj.weight", ..)`.
    /// Where the tensors come from, for loaders that read several at once.
    pub fn source(&self) -> &'a dyn TensorSource {
        self.source
    }

    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        Self {
            source: self.source,
            prefix: self.full_name(&name.to_string()),
        }
    }

    pub fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.source.shape(&self.full_name(name)).is_some()
    }

    pub fn shape(&self, name: &str) -> Option<&'a [usize]> {
        self.source.shape(&self.full_name(name))
    }

    /// Loads `name`, checking that its shape is `expected`.
    pub fn get(&self, name: &str, expected: &[usize]) -> Result<Tensor, WeightsError> {
        let full = self.check_shape(name, expected)?;
        self.source.load(&full)
    }

    /// Loads integer tensor `name` (`I64` or `I32`, of shape `expected`):
    /// tables such as DeepSeek-V4's token-to-expert routing.
    pub fn integers(&self, name: &str, expected: &[usize]) -> Result<Vec<i64>, WeightsError> {
        let full = self.check_shape(name, expected)?;
        let raw = self.source.load_raw(&full)?;
        let bad = |reason: String| WeightsError::InvalidFile {
            path: self.source.location(&full),
            reason: format!("tensor `{full}`: {reason}"),
        };
        let values: Vec<i64> = match raw.dtype {
            Dtype::Unsupported(UnsupportedDtype::I64) => raw
                .bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect(),
            Dtype::Unsupported(UnsupportedDtype::I32) => raw
                .bytes
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
            other => return Err(bad(format!("stored as {other:?}, expected integers"))),
        };
        if values.len() != expected.iter().product::<usize>() {
            return Err(bad("byte length does not match its shape".into()));
        }
        Ok(values)
    }

    /// Loads `name` (shape `[rows, cols]`) at its stored width.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, WeightsError> {
        Ok(self.matrices(name, &[rows, cols], 1)?.remove(0))
    }

    /// Loads `name` (shape `[count, rows, cols]`) at its stored width as
    /// `count` matrices.
    pub fn matrix_stack(
        &self,
        name: &str,
        count: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Matrix>, WeightsError> {
        self.matrices(name, &[count, rows, cols], count)
    }

    fn matrices(
        &self,
        name: &str,
        shape: &[usize],
        count: usize,
    ) -> Result<Vec<Matrix>, WeightsError> {
        let [rows, cols] = [shape[shape.len() - 2], shape[shape.len() - 1]];
        let full = self.full_name(name);
        if !int4::is_packed(self.source, &full)
            && !mxfp4::is_blocked(self.source, &full)
            && !fp4::is_packed(self.source, &full, shape)
        {
            self.check_shape(name, shape)?;
        }
        let (format, bytes) = stored_rows(self.source, &full, shape, count)?;
        self.split(&full, bytes, rows, cols, format, count)
    }

    /// `bytes` of tensor `full` as `count` matrices one after another.
    fn split(
        &self,
        full: &str,
        bytes: Vec<u8>,
        rows: usize,
        cols: usize,
        format: Format,
        count: usize,
    ) -> Result<Vec<Matrix>, WeightsError> {
        let path = self.source.location(full);
        let each = bytes.len() / count.max(1);
        bytes
            .chunks(each.max(1))
            .take(count)
            .map(|bytes| {
                Matrix::from_bytes(rows, cols, format, bytes).map_err(|e| {
                    WeightsError::InvalidFile {
                        path: path.clone(),
                        reason: format!("tensor `{full}`: {e}"),
                    }
                })
            })
            .collect()
    }

    /// Checks that `name` exists with shape `expected`; returns its full name.
    fn check_shape(&self, name: &str, expected: &[usize]) -> Result<String, WeightsError> {
        let full = self.full_name(name);
        expect_shape(self.source, &full, expected)?;
        Ok(full)
    }
}

/// The rows of `count` matrices `name` (of `shape`, `[..., rows, cols]`,
/// already checked against the source unless INT4- or MXFP4-packed) as the kernels
/// read them, one matrix after another, at their stored width: plain floats
/// as they are, FP8 with its block scales, INT4 with its group scales.
pub fn stored_rows(
    source: &dyn TensorSource,
    name: &str,
    shape: &[usize],
    count: usize,
) -> Result<(Format, Vec<u8>), WeightsError> {
    if int4::is_packed(source, name) {
        return Ok((Format::Int4G32, int4::load(source, name, shape, count)?));
    }
    if mxfp4::is_blocked(source, name) {
        return Ok((Format::Mxfp4, mxfp4::load(source, name, shape)?));
    }
    if fp4::is_packed(source, name, shape) {
        return fp4::load(source, name, shape);
    }
    let raw = source.load_raw(name)?;
    if let Dtype::Blocks(format) = raw.dtype {
        return Ok((format, raw.bytes));
    }
    if raw.dtype == Dtype::F8E4M3 {
        let (scales, grid) = fp8::load_scales(source, name, shape)?;
        let [rows, cols] = [shape[shape.len() - 2], shape[shape.len() - 1]];
        let per_matrix = grid.per_matrix(rows, cols);
        let rows = raw
            .bytes
            .chunks((rows * cols).max(1))
            .zip(scales.chunks(per_matrix.max(1)))
            .take(count)
            .flat_map(|(m, s)| fp8::block_rows(m, s, rows, cols, grid))
            .collect();
        return Ok((Format::Fp8Block, rows));
    }
    let format = matrix_format(raw.dtype).ok_or_else(|| WeightsError::UnsupportedDtype {
        name: name.to_string(),
        path: source.location(name),
        dtype: raw.dtype,
    })?;
    Ok((format, raw.bytes))
}

/// Checks that tensor `name` of `source` exists with shape `expected`.
pub fn expect_shape(
    source: &dyn TensorSource,
    name: &str,
    expected: &[usize],
) -> Result<(), WeightsError> {
    let Some(actual) = source.shape(name) else {
        return Err(WeightsError::Missing {
            name: name.to_string(),
            dir: source.origin(),
        });
    };
    if actual != expected {
        return Err(WeightsError::Shape {
            name: name.to_string(),
            path: source.location(name),
            actual: actual.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

/// The bytes of `name`, one part of a quantised matrix, which must have
/// `shape` and be stored as `dtype`, as `layout` (for messages) stores it.
fn read_part(
    source: &dyn TensorSource,
    name: &str,
    shape: &[usize],
    dtype: Dtype,
    layout: &str,
) -> Result<Vec<u8>, WeightsError> {
    expect_shape(source, name, shape)?;
    let raw = source.load_raw(name)?;
    if raw.dtype != dtype {
        return Err(WeightsError::InvalidFile {
            path: source.location(name),
            reason: format!(
                "{layout} part `{name}` is stored as {:?}; {layout} stores it as {dtype:?}",
                raw.dtype
            ),
        });
    }
    Ok(raw.bytes)
}

/// The kernel format of a float dtype.
pub fn matrix_format(dtype: Dtype) -> Option<Format> {
    match dtype {
        Dtype::F32 => Some(Format::F32),
        Dtype::F16 => Some(Format::F16),
        Dtype::BF16 => Some(Format::BF16),
        Dtype::F8E4M3 | Dtype::Blocks(_) | Dtype::Unsupported(_) => None,
    }
}

/// Converts raw little-endian bytes of `dtype` into an f32 tensor.
pub fn tensor_from_bytes(
    name: &str,
    bytes: &[u8],
    dtype: Dtype,
    shape: &[usize],
    path: &std::path::Path,
) -> Result<Tensor, WeightsError> {
    let values: Vec<f32> = match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::Blocks(format) => {
            let cols = shape.last().copied().unwrap_or(0);
            let row_bytes = format.row_bytes(cols).filter(|&b| b > 0);
            let mut out = vec![0f32; shape.iter().product()];
            if let Some(row_bytes) = row_bytes {
                for (o, b) in out.chunks_mut(cols).zip(bytes.chunks_exact(row_bytes)) {
                    crate::kernels::format::decode_row(format, b, o);
                }
            }
            out
        }
        Dtype::F8E4M3 | Dtype::Unsupported(_) => {
            return Err(WeightsError::UnsupportedDtype {
                name: name.to_string(),
                path: path.to_path_buf(),
                dtype,
            });
        }
    };
    Tensor::from_vec(values, shape, &Device::Cpu).map_err(|source| WeightsError::Tensor {
        name: name.to_string(),
        source,
    })
}
