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

    fn format(self) -> Format {
        match self {
            Quantization::Q8_0 => Format::Q8_0,
            Quantization::Q4K => Format::Q4K,
        }
    }

    /// What `self` stores rows of `cols` weights as: itself where they are
    /// whole blocks, else Q8_0 (blocks of 32), as llama.cpp's quantiser
    /// falls back for k-quants; `None` when not even that fits.
    fn for_rows(self, cols: usize) -> Option<Self> {
        [self, Quantization::Q8_0]
            .into_iter()
            .find(|q| cols.is_multiple_of(q.block()))
    }
}

/// How the expert records of one pack are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertEncoding {
    /// The checkpoint's own bytes.
    Plain(Dtype),
    /// Quantised blocks, chosen per matrix: gate/up rows hold `hidden`
    /// weights and down rows `intermediate`, and a type whose blocks do not
    /// divide a row falls back to one that does (named `Q4K/Q8_0`).
    Quantized {
        gate_up: Quantization,
        down: Quantization,
    },
    /// The checkpoint's quantised blocks as published, rearranged so each
    /// row decodes on its own: FP8 with its 128×128 block scales
    /// ([`Format::Fp8Block`]), INT4 with its group scales ([`Format::Int4G32`]),
    /// MXFP4 with its block exponents ([`Format::Mxfp4`]).
    Published(Format),
    /// A GGUF file's blocks as they are: gate and up rows in one GGML type,
    /// down rows in one (Q4_K_M files give down more bits, e.g. Q6_K).
    Gguf { gate_up: Format, down: Format },
}

/// How the manifest names [`ExpertEncoding::Gguf`]: `GGUF:Q4_K/Q6_K`.
const GGUF_PREFIX: &str = "GGUF:";

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
            .or_else(|| {
                let (gate_up, down) = name.split_once('/').unwrap_or((name, name));
                Some(ExpertEncoding::Quantized {
                    gate_up: Quantization::parse(gate_up)?,
                    down: Quantization::parse(down)?,
                })
            })
            .or_else(|| {
                PUBLISHED
                    .into_iter()
                    .find(|f| f.name() == name)
                    .map(ExpertEncoding::Published)
            })
            .or_else(|| {
                let (gate_up, down) = name.strip_prefix(GGUF_PREFIX)?.split_once('/')?;
                let block = |n: &str| match Dtype::parse(n)? {
                    Dtype::Blocks(f) => Some(f),
                    _ => None,
                };
                Some(ExpertEncoding::Gguf {
                    gate_up: block(gate_up)?,
                    down: block(down)?,
                })
            })
    }

    /// `q` for experts of these sizes, each matrix falling back to Q8_0
    /// where its rows are not whole blocks of `q`; refused when not even
    /// Q8_0's blocks of 32 divide them.
    pub fn quantized(
        q: Quantization,
        hidden: usize,
        intermediate: usize,
    ) -> Result<Self, EncodingError> {
        let pick = |cols: usize, what: &str| {
            q.for_rows(cols).ok_or_else(|| {
                EncodingError::Shape(format!(
                    "{} packs rows in blocks of {} weights (Q8_0 in blocks of 32), but the experts' {what} rows hold {cols}",
                    q.name(),
                    q.block()
                ))
            })
        };
        Ok(ExpertEncoding::Quantized {
            gate_up: pick(hidden, "gate/up")?,
            down: pick(intermediate, "down")?,
        })
    }

    pub fn name(self) -> String {
        match self {
            ExpertEncoding::Plain(d) => d.name().unwrap_or("unsupported").to_string(),
            ExpertEncoding::Quantized { gate_up, down } if gate_up == down => {
                gate_up.name().to_string()
            }
            ExpertEncoding::Quantized { gate_up, down } => {
                format!("{}/{}", gate_up.name(), down.name())
            }
            ExpertEncoding::Published(f) => f.name().to_string(),
            ExpertEncoding::Gguf { gate_up, down } => {
                let name = |f: Format| Dtype::Blocks(f).name().unwrap_or("?");
                format!("{GGUF_PREFIX}{}/{}", name(gate_up), name(down))
            }
        }
    }

    /// The formats of the gate/up and the down matrix.
    pub fn formats(self) -> Option<[Format; 2]> {
        match self {
            ExpertEncoding::Plain(d) => matrix_format(d).map(|f| [f, f]),
            ExpertEncoding::Quantized { gate_up, down } => Some([gate_up.format(), down.format()]),
            ExpertEncoding::Published(f) => Some([f, f]),
            ExpertEncoding::Gguf { gate_up, down } => Some([gate_up, down]),
        }
    }

    /// Stored bytes of a `[rows, cols]` matrix in `format`.
    fn matrix_bytes(format: Format, rows: usize, cols: usize) -> u64 {
        (rows * format.row_bytes(cols).unwrap_or(0)) as u64
    }

    /// Bytes of one record: gate and up rows (`[2I, H]`), then down (`[H, I]`).
    pub fn record_len(self, hidden: usize, intermediate: usize) -> u64 {
        let Some([gu, d]) = self.formats() else {
            return 0;
        };
        Self::matrix_bytes(gu, 2 * intermediate, hidden)
            + Self::matrix_bytes(d, hidden, intermediate)
    }

    /// Bytes one record takes in RAM as an expert: as stored, or with its
    /// matrices widened to f32 (blockwise ones stay as stored; see
    /// [`ExpertEncoding::decode`]).
    pub fn ram_len(self, hidden: usize, intermediate: usize, keep_stored: bool) -> u64 {
        let Some([gu, d]) = self.formats() else {
            return 0;
        };
        let bytes = |format: Format, rows: usize, cols: usize| {
            if keep_stored || format.is_blockwise() {
                Self::matrix_bytes(format, rows, cols)
            } else {
                (rows * cols * size_of::<f32>()) as u64
            }
        };
        bytes(gu, 2 * intermediate, hidden) + bytes(d, hidden, intermediate)
    }

    /// Bytes per element of a plain float record; `None` for quantised blocks.
    pub fn element_bytes(self) -> Option<usize> {
        match self {
            ExpertEncoding::Plain(d) => Some(d.size() as usize),
            ExpertEncoding::Quantized { .. }
            | ExpertEncoding::Published(_)
            | ExpertEncoding::Gguf { .. } => None,
        }
    }

    /// Turns one record into an expert. With `keep_stored` its matrices are
    /// views of the record's own bytes (narrow float or quantised blocks,
    /// computed from as they are); otherwise they are widened to f32 now,
    /// but for blockwise ones (k-quants), which a product sums per block and
    /// which therefore stay as stored. Both give the same numbers.
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
        let [gu_format, d_format] = self.formats().ok_or_else(|| {
            EncodingError::Shape(format!(
                "{name}: records are stored in an unsupported dtype"
            ))
        })?;
        let kernel = |e| EncodingError::Kernel {
            what: name.to_string(),
            source: e,
        };
        let split = Self::matrix_bytes(gu_format, 2 * i, h) as usize;
        let gate_up =
            Matrix::shared(2 * i, h, gu_format, Arc::clone(&record), 0).map_err(kernel)?;
        let down = Matrix::shared(h, i, d_format, record, split).map_err(kernel)?;
        let (gate_up, down) = if keep_stored {
            (gate_up, down)
        } else {
            let widen = |m: &Matrix| match m.format().is_blockwise() {
                true => Ok(m.clone()),
                false => Matrix::from_f32(m.rows(), m.cols(), &m.to_f32()),
            };
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

/// Quantises a record held in the checkpoint's `dtype` into `encoding` (a
/// [`ExpertEncoding::Quantized`]), returning the new record and how far its
/// weights are from the originals.
pub fn quantize_record(
    raw: &[u8],
    dtype: Dtype,
    hidden: usize,
    intermediate: usize,
    encoding: ExpertEncoding,
    name: &str,
) -> Result<(Vec<u8>, ErrorSums), EncodingError> {
    let (h, i) = (hidden, intermediate);
    let ExpertEncoding::Quantized { gate_up, down } = encoding else {
        return Err(EncodingError::Shape(format!(
            "{name}: {} is not a quantisation",
            encoding.name()
        )));
    };
    let plain = ExpertEncoding::Plain(dtype);
    if raw.len() as u64 != plain.record_len(h, i) {
        return Err(EncodingError::Shape(format!(
            "{name}: record holds {} bytes, expected {}",
            raw.len(),
            plain.record_len(h, i)
        )));
    }
    let split = (2 * i * h) * dtype.size() as usize;
    let mut out = Vec::with_capacity(encoding.record_len(h, i) as usize);
    let mut sums = ErrorSums::default();
    let parts = [
        (&raw[..split], [2 * i, h], gate_up),
        (&raw[split..], [h, i], down),
    ];
    for (bytes, shape, q) in parts {
        let (blocks, error) = quantize_matrix(bytes, dtype, &shape, q, name)?;
        sums.add(error);
        out.extend_from_slice(&blocks);
    }
    Ok((out, sums))
}

/// One matrix (`bytes` of `dtype`, `shape` `[rows, cols]`) as `q` blocks,
/// with how far they are from the original values.
pub fn quantize_matrix(
    bytes: &[u8],
    dtype: Dtype,
    shape: &[usize],
    q: Quantization,
    name: &str,
) -> Result<(Vec<u8>, ErrorSums), EncodingError> {
    let tensor_err = |source| EncodingError::Tensor {
        what: name.to_string(),
        source,
    };
    let w = tensor_from_bytes(name, bytes, dtype, shape, Path::new(""))?;
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
    let error = ErrorSums {
        squared_error: sq(&diff)?,
        squared_norm: sq(&w)?,
    };
    Ok((qt.data().map_err(tensor_err)?.to_vec(), error))
}

#[cfg(test)]
// Inputs and references for the tests, not answers: std's functions do.
#[allow(clippy::disallowed_methods)]
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
            let enc = ExpertEncoding::quantized(q, h, i).unwrap();
            assert_eq!(enc.name(), q.name());
            let (bytes, err) = quantize_record(&raw, Dtype::F32, h, i, enc, "test").unwrap();
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
            match q {
                // Blockwise k-quants are computed from as stored either way.
                Quantization::Q4K => assert_eq!(kept.ram_bytes(), wide.ram_bytes()),
                _ => assert!(kept.ram_bytes() < wide.ram_bytes() / 3),
            }
            assert_eq!(wide.ram_bytes(), enc.ram_len(h, i, false));
            assert_eq!(kept.ram_bytes(), enc.ram_len(h, i, true));
        }
    }

    /// Rows that are not whole Q4_K blocks fall back to Q8_0 matrix by
    /// matrix, labelled; rows not even whole Q8_0 blocks are refused.
    #[test]
    fn matrices_fall_back_to_blocks_that_divide_their_rows() {
        // The demo model: gate/up rows of 256, down rows of 96.
        let enc = ExpertEncoding::quantized(Quantization::Q4K, 256, 96).unwrap();
        assert_eq!(enc.name(), "Q4K/Q8_0");
        assert_eq!(ExpertEncoding::parse("Q4K/Q8_0"), Some(enc));
        assert_eq!(enc.formats(), Some([Format::Q4K, Format::Q8_0]));
        let raw = random_record(256, 96);
        let (bytes, err) = quantize_record(&raw, Dtype::F32, 256, 96, enc, "demo").unwrap();
        assert_eq!(bytes.len() as u64, enc.record_len(256, 96));
        assert!(err.relative_rms() < 0.12);
        let x: Vec<f32> = (0..256).map(|k| (k as f32 * 0.01).sin()).collect();
        let record: Arc<Vec<u8>> = Arc::new(bytes);
        let wide = enc.decode(record.clone(), 256, 96, false, "e").unwrap();
        let kept = enc.decode(record, 256, 96, true, "e").unwrap();
        assert_eq!(wide.forward(&x, 1).unwrap(), kept.forward(&x, 1).unwrap());
        let err = ExpertEncoding::quantized(Quantization::Q4K, 256, 40).unwrap_err();
        assert!(
            err.to_string().contains("blocks of 256") && err.to_string().contains("hold 40"),
            "{err}"
        );
    }

    #[test]
    fn a_short_record_is_an_error() {
        let enc = ExpertEncoding::quantized(Quantization::Q8_0, 32, 32).unwrap();
        let err = enc.decode(Arc::new(vec![0u8; 10]), 32, 32, false, "layer 1 expert 2");
        assert!(err.unwrap_err().to_string().contains("layer 1 expert 2"));
    }
}
