//! Reading checkpoint weights: validated before use, converted to f32.
//!
//! Model code asks for tensors by name and expected shape through [`Weights`];
//! it never touches files. A missing tensor or a shape that contradicts the
//! config is reported with the tensor's name and the file it came from.

mod checkpoint;
pub mod safetensors;

use std::path::PathBuf;

use candle_core::{Device, Tensor};

pub use checkpoint::SafetensorsCheckpoint;
pub use safetensors::{Dtype, SafetensorsFile, TensorInfo};

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
        "{path}: tensor `{name}` is stored as {dtype:?}; supported weight dtypes are F32, F16 and BF16"
    )]
    UnsupportedDtype {
        name: String,
        path: PathBuf,
        dtype: Dtype,
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

/// Anything that can hand out named f32 tensors: a checkpoint folder today,
/// the resident file of a pack later.
pub trait TensorSource: Send + Sync {
    /// The stored shape of `name`, if the source has it.
    fn shape(&self, name: &str) -> Option<&[usize]>;
    /// Reads `name` as an f32 tensor on the CPU.
    fn load(&self, name: &str) -> Result<Tensor, WeightsError>;
    /// Where `name` is stored, for error messages.
    fn location(&self, name: &str) -> PathBuf;
    /// The folder or file the source was opened from, for error messages.
    fn origin(&self) -> PathBuf;
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
        let full = self.full_name(name);
        let Some(actual) = self.source.shape(&full) else {
            return Err(WeightsError::Missing {
                name: full,
                dir: self.source.origin(),
            });
        };
        if actual != expected {
            return Err(WeightsError::Shape {
                path: self.source.location(&full),
                actual: actual.to_vec(),
                expected: expected.to_vec(),
                name: full,
            });
        }
        self.source.load(&full)
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
        Dtype::Unsupported(_) => {
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
