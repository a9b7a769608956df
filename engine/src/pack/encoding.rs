//! How a pack stores one routed expert's weights, and the conversions between
//! those bytes and an [`Expert`].
//!
//! By default a record holds the checkpoint's own bytes, so a pack computes
//! exactly what the checkpoint does. Quantised packs (`Q8_0`, `Q4K`: candle's
//! GGML block formats) are an explicit choice that trades accuracy for fewer
//! bytes per token read from the drives; the manifest labels them and records
//! how far the stored weights are from the originals.

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::kernels::{Format, KernelError, Matrix};
use crate::model::Expert;
use crate::weights::{Dtype, matrix_format, tensor_from_bytes};

/// Expert quantisations a pack can be written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// 8-bit weights in blocks of 32 with one f16 scale: ~8.5 bits per weight.
    Q8_0,
    /// 4-bit k-quant in super-blocks of 256: ~4.5 bits per weight.
    Q4K,
}

impl Quantization {
    /// The name used on the command line and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            Quantization::Q8_0 => "Q8_0",
            Quantization::Q4K => "Q4K",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_uppercase().as_str() {
            "Q8_0" => Some(Quantization::Q8_0),
            "Q4K" | "Q4_K" => Some(Quantization::Q4K),
            _ => None,
        }
    }

    fn ggml(self) -> GgmlDType {
        match self {
            Quantization::Q8_0 => GgmlDType::Q8_0,
            Quantization::Q4K => GgmlDType::Q4K,
        }
    }

    /// Weights per block; every matrix row must be a whole number of blocks.
    pub fn block(self) -> usize {
        self.ggml().block_size()
    }
}

/// How the expert records of one pack are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertEncoding {
    /// The checkpoint's own bytes.
    Plain(Dtype),
    Quantized(Quantization),
    /// The checkpoint's quantised blocks as published, rearranged so each
    /// row decodes on its own: FP8 with its 128×128 block scales
    /// ([`Format::Fp8Block`]), INT4 with its group scales ([`Format::Int4G32`]),
    /// MXFP4 with its block exponents ([`Format::Mxfp4`]).
    Published(Format),
}

/// The published block formats a pack holds as they are.
pub const PUBLISHED: [Format; 3] = [Format::Fp8Block, Format::Int4G32, Format::Mxfp4];

/// A record's bytes could not be turned into an expert (or back).
#[derive(Debug, thiserror::Error)]
pub enum EncodingError {
    #[error("{0}")]
    Shape(String),
    #[error("{what}: {source}")]
    Tensor {
        what: String,
        #[source]
        source: candle_core::Error,
    },
    #[error("{0}")]
    Weights(#[from] crate::weights::WeightsError),
    #[error("{what}: {source}")]
    Kernel {
        what: String,
        #[source]
        source: KernelError,
    },
}

impl ExpertEncoding {
    /// Reads the manifest's `dtype` field.
    pub fn parse(name: &str) -> Option<Self> {
        Dtype::parse(name)
            .filter(|&d| crate::weights::matrix_format(d).is_some())
            .map(ExpertEncoding::Plain)
            .or_else(|| Quantization::parse(name).map(ExpertEncoding::Quantized))
            .or_else(|| {
                PUBLISHED
                    .into_iter()
                    .find(|f| f.name() == name)
                    .map(ExpertEncoding::Published)
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            ExpertEncoding::Plain(d) => d.name().unwrap_or("unsupported"),
            ExpertEncoding::Quantized(q) => q.name(),
            ExpertEncoding::Published(f) => f.name(),
        }
    }

    /// Stored bytes of a `[rows, cols]` matrix.
    fn matrix_bytes(self, rows: usize, cols: usize) -> u64 {
        match self {
            ExpertEncoding::Plain(d) => (rows * cols) as u64 * d.size(),
            ExpertEncoding::Quantized(q) => {
                let g = q.ggml();
                ((rows * cols / g.block_size()) * g.type_size()) as u64
            }
            ExpertEncoding::Published(f) => (rows * f.row_bytes(cols).unwrap_or(0)) as u64,
        }
    }

    /// Bytes of one record: gate and up rows (`[2I, H]`), then down (`[H, I]`).
    pub fn record_len(self, hidden: usize, intermediate: usize) -> u64 {
        self.matrix_bytes(2 * intermediate, hidden) + self.matrix_bytes(hidden, intermediate)
    }

    /// Refuses expert shapes whose rows are not whole blocks.
    pub fn check_shape(self, hidden: usize, intermediate: usize) -> Result<(), EncodingError> {
        let ExpertEncoding::Quantized(q) = self else {
            return Ok(());
        };
        let block = q.block();
        if !hidden.is_multiple_of(block) || !intermediate.is_multiple_of(block) {
            return Err(EncodingError::Shape(format!(
                "{} packs rows in blocks of {block} weights, but experts have hidden size {hidden} \
                 and intermediate size {intermediate}{}",
                q.name(),
                if block > Quantization::Q8_0.block() {
                    "; Q8_0 (blocks of 32) may fit"
                } else {
                    ""
                }
            )));
        }
        Ok(())
    }

    /// Bytes per element of a plain float record; `None` for quantised blocks.
    pub fn element_bytes(self) -> Option<usize> {
        match self {
            ExpertEncoding::Plain(d) => Some(d.size() as usize),
            ExpertEncoding::Quantized(_) | ExpertEncoding::Published(_) => None,
        }
    }

    /// The kernel format the records are stored in.
    pub fn format(self) -> Option<Format> {
        match self {
            ExpertEncoding::Plain(d) => matrix_format(d),
            ExpertEncoding::Quantized(Quantization::Q8_0) => Some(Format::Q8_0),
            ExpertEncoding::Quantized(Quantization::Q4K) => Some(Format::Q4K),
            ExpertEncoding::Published(f) => Some(f),
        }
    }

    /// Turns one record into an expert. With `keep_stored` its matrices are
    /// views of the record's own bytes (narrow float or quantised blocks,
    /// computed from as they are); otherwise they are widened to f32 now.
    /// Both give the same numbers.
    pub fn decode(
        self,
        record: Arc<dyn AsRef<[u8]> + Send + Sync>,
        hidden: usize,
        intermediate: usize,
        keep_stored: bool,
        name: &str,
    ) -> Result<Expert, EncodingError> {
        let (h, i) = (hidden, intermediate);
        let want = self.record_len(h, i);
        let len = (*record).as_ref().len();
        if len as u64 != want {
            return Err(EncodingError::Shape(format!(
                "{name}: record holds {len} bytes, expected {want}"
            )));
        }
        let format = self.format().ok_or_else(|| {
            EncodingError::Shape(format!(
                "{name}: records are stored in an unsupported dtype"
            ))
        })?;
        let kernel = |e| EncodingError::Kernel {
            what: name.to_string(),
            source: e,
        };
        let split = self.matrix_bytes(2 * i, h) as usize;
        let gate_up = Matrix::shared(2 * i, h, format, Arc::clone(&record), 0).map_err(kernel)?;
        let down = Matrix::shared(h, i, format, record, split).map_err(kernel)?;
        let (gate_up, down) = if keep_stored {
            (gate_up, down)
        } else {
            let widen = |m: &Matrix| Matrix::from_f32(m.rows(), m.cols(), &m.to_f32());
            (
                widen(&gate_up).map_err(kernel)?,
                widen(&down).map_err(kernel)?,
            )
        };
        Expert::new(gate_up, down).map_err(|e| EncodingError::Shape(format!("{name}: {e}")))
    }
}

/// Squared error and squared magnitude of a quantised matrix, summed, for a
/// relative RMS error over the whole pack.
#[derive(Debug, Default, Clone, Copy)]
pub struct ErrorSums {
    pub squared_error: f64,
    pub squared_norm: f64,
}

impl ErrorSums {
    pub fn add(&mut self, other: ErrorSums) {
        self.squared_error += other.squared_error;
        self.squared_norm += other.squared_norm;
    }

    /// `‖w − q(w)‖ / ‖w‖`.
    pub fn relative_rms(&self) -> f64 {
        if self.squared_norm > 0.0 {
            (self.squared_error / self.squared_norm).sqrt()
        } else {
            0.0
        }
    }
}

/// Quantises a record held in the checkpoint's `dtype` into `q`, returning
/// the new record and how far its weights are from the originals.
pub fn quantize_record(
    raw: &[u8],
    dtype: Dtype,
    hidden: usize,
    intermediate: usize,
    q: Quantization,
    name: &str,
) -> Result<(Vec<u8>, ErrorSums), EncodingError> {
    let (h, i) = (hidden, intermediate);
    ExpertEncoding::Quantized(q).check_shape(h, i)?;
    let plain = ExpertEncoding::Plain(dtype);
    if raw.len() as u64 != plain.record_len(h, i) {
        return Err(EncodingError::Shape(format!(
            "{name}: record holds {} bytes, expected {}",
            raw.len(),
            plain.record_len(h, i)
        )));
    }
    let split = plain.matrix_bytes(2 * i, h) as usize;
    let tensor_err = |source| EncodingError::Tensor {
        what: name.to_string(),
        source,
    };
    let mut out = Vec::with_capacity(ExpertEncoding::Quantized(q).record_len(h, i) as usize);
    let mut sums = ErrorSums::default();
    for (bytes, shape) in [(&raw[..split], [2 * i, h]), (&raw[split..], [h, i])] {
        let w = tensor_from_bytes(name, bytes, dtype, &shape, Path::new(""))?;
        let qt = QTensor::quantize(&w, q.ggml()).map_err(tensor_err)?;
        let back = qt.dequantize(&Device::Cpu).map_err(tensor_err)?;
        let sq = |t: &Tensor| -> Result<f64, EncodingError> {
            let s = t
                .sqr()
                .and_then(|t| t.sum_all())
                .and_then(|t| t.to_scalar::<f32>());
            Ok(f64::from(s.map_err(tensor_err)?))
        };
        let diff = (&w - &back).map_err(tensor_err)?;
        sums.add(ErrorSums {
            squared_error: sq(&diff)?,
            squared_norm: sq(&w)?,
        });
        out.extend_from_slice(&qt.data().map_err(tensor_err)?);
    }
    Ok((out, sums))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_record(h: usize, i: usize) -> Vec<u8> {
        let mut state = 12345u64;
        (0..3 * h * i)
            .flat_map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                let v = ((state >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 0.2;
                v.to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn quantised_records_round_trip_with_small_error() {
        let (h, i) = (256, 256);
        let raw = random_record(h, i);
        for (q, bound) in [(Quantization::Q8_0, 0.01), (Quantization::Q4K, 0.12)] {
            let (bytes, err) = quantize_record(&raw, Dtype::F32, h, i, q, "test").unwrap();
            let enc = ExpertEncoding::Quantized(q);
            assert_eq!(bytes.len() as u64, enc.record_len(h, i));
            assert!(
                err.relative_rms() > 0.0 && err.relative_rms() < bound,
                "{q:?}: relative error {}",
                err.relative_rms()
            );
            // Held quantised or widened now, an expert computes the same.
            let x: Vec<f32> = (0..2 * h).map(|k| (k as f32 * 0.01).sin()).collect();
            let record: Arc<Vec<u8>> = Arc::new(bytes);
            let wide = enc.decode(record.clone(), h, i, false, "e").unwrap();
            let kept = enc.decode(record, h, i, true, "e").unwrap();
            let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(wide.forward(&x, 2).unwrap()),
                bits(kept.forward(&x, 2).unwrap())
            );
            assert!(kept.ram_bytes() < wide.ram_bytes() / 3);
        }
    }

    #[test]
    fn rows_that_are_not_whole_blocks_are_refused() {
        let err = ExpertEncoding::Quantized(Quantization::Q4K)
            .check_shape(64, 256)
            .unwrap_err();
        assert!(err.to_string().contains("blocks of 256"), "{err}");
        assert!(err.to_string().contains("Q8_0"), "{err}");
        assert!(
            ExpertEncoding::Quantized(Quantization::Q8_0)
                .check_shape(64, 96)
                .is_ok()
        );
    }

    #[test]
    fn a_short_record_is_an_error() {
        let enc = ExpertEncoding::Quantized(Quantization::Q8_0);
        let err = enc.decode(Arc::new(vec![0u8; 10]), 32, 32, false, "layer 1 expert 2");
        assert!(err.unwrap_err().to_string().contains("layer 1 expert 2"));
    }
}
