//! A strict reader for the safetensors format.
//!
//! The header is parsed and validated in full before any tensor is read: a
//! truncated download, an overlapping or out-of-range offset, or a byte size
//! that does not match dtype × shape is reported against the file by name
//! instead of surfacing later as garbage logits or a panic. Tensor bytes are
//! read with explicit positional reads, never through mmap, so a file that
//! disappears becomes an error rather than a SIGBUS.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::WeightsError;
use crate::kernels::Format;

/// Headers larger than this are refused: real checkpoints stay far below it,
/// and a corrupt length field must not make us allocate gigabytes.
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// Size of the little-endian header-length prefix.
const HEADER_LEN_PREFIX: u64 = 8;

/// Element types a checkpoint may store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    /// FP8 e4m3fn: computed with only beside its `_scale_inv` block scales.
    F8E4M3,
    /// GGML blocks along the last dimension (Q8_0: 34 bytes per 32 values):
    /// held by a pack's resident file (`pack --resident q8_0`, or a GGUF's
    /// quantised tensors as published) and by GGUF files.
    Blocks(Format),
    /// A dtype the format allows but Longhaul cannot compute with; kept so the
    /// error can name it when (and only when) such a tensor is asked for.
    Unsupported(UnsupportedDtype),
}

/// Dtypes that are valid safetensors but not model weights Longhaul reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsupportedDtype {
    F64,
    I64,
    I32,
    I16,
    I8,
    U8,
    U16,
    U32,
    U64,
    Bool,
    F8E5M2,
    /// E8M0 exponents (`2^(b − 127)`): the block scales DeepSeek-V4 stores
    /// beside FP8 and FP4 weights, read only as those scales.
    F8E8M0,
}

impl Dtype {
    /// The safetensors name of a dtype Longhaul computes with.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Dtype::F32 => Some("F32"),
            Dtype::F16 => Some("F16"),
            Dtype::BF16 => Some("BF16"),
            Dtype::F8E4M3 => Some("F8_E4M3"),
            Dtype::Blocks(f) => f.row().stored,
            // Integer tables (DeepSeek-V4's token-to-expert routing) are
            // read by model code as they are stored, so packs carry them.
            Dtype::Unsupported(UnsupportedDtype::I64) => Some("I64"),
            Dtype::Unsupported(UnsupportedDtype::I32) => Some("I32"),
            // Block scales of resident FP8 weights.
            Dtype::Unsupported(UnsupportedDtype::F8E8M0) => Some("F8_E8M0"),
            Dtype::Unsupported(_) => None,
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        use UnsupportedDtype as U;
        if let Some(f) = Format::ggml_blocks().find(|f| f.row().stored == Some(name)) {
            return Some(Dtype::Blocks(f));
        }
        Some(match name {
            "F32" => Dtype::F32,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "F64" => Dtype::Unsupported(U::F64),
            "I64" => Dtype::Unsupported(U::I64),
            "I32" => Dtype::Unsupported(U::I32),
            "I16" => Dtype::Unsupported(U::I16),
            "I8" => Dtype::Unsupported(U::I8),
            "U8" => Dtype::Unsupported(U::U8),
            "U16" => Dtype::Unsupported(U::U16),
            "U32" => Dtype::Unsupported(U::U32),
            "U64" => Dtype::Unsupported(U::U64),
            "BOOL" => Dtype::Unsupported(U::Bool),
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E5M2" => Dtype::Unsupported(U::F8E5M2),
            "F8_E8M0" => Dtype::Unsupported(U::F8E8M0),
            _ => return None,
        })
    }

    /// Bytes per element (blocks' bytes per value are not whole: see
    /// [`Dtype::byte_len`]; 1 stands for them).
    pub fn size(self) -> u64 {
        use UnsupportedDtype as U;
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::F8E4M3 | Dtype::Blocks(_) => 1,
            Dtype::Unsupported(u) => match u {
                U::F64 | U::I64 | U::U64 => 8,
                U::I32 | U::U32 => 4,
                U::I16 | U::U16 => 2,
                U::I8 | U::U8 | U::Bool | U::F8E5M2 | U::F8E8M0 => 1,
            },
        }
    }
}

impl Dtype {
    /// Bytes of `elements` values; `None` on overflow or, for blocks, when
    /// they are not whole blocks.
    pub fn byte_len(self, elements: u64) -> Option<u64> {
        match self {
            Dtype::Blocks(f) => {
                let (block, bytes) = (f.block() as u64, f.block_bytes() as u64);
                elements
                    .is_multiple_of(block)
                    .then(|| elements / block * bytes)
            }
            d => elements.checked_mul(d.size()),
        }
    }
}

/// Where one tensor lives inside a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// The order the rows are stored in.
    pub rows: RowOrder,
}

/// How a tensor's rows are ordered in the file relative to its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowOrder {
    #[default]
    Stored,
    /// llama.cpp's converter reorders each head's query/key rows for its
    /// interleaved RoPE (`[h, 2, d/2] → [h, d/2, 2]`); reading puts them back.
    /// Rows are whole blocks, so quantised rows move as they are.
    RopePairs { heads: usize },
}

impl RowOrder {
    /// Rows of `bytes` (`rows` of equal length) in reference order.
    fn restore(self, bytes: Vec<u8>, rows: usize) -> Vec<u8> {
        let RowOrder::RopePairs { heads } = self else {
            return bytes;
        };
        if rows == 0 || heads == 0 || !rows.is_multiple_of(2 * heads) {
            return bytes;
        }
        let row_len = bytes.len() / rows;
        let half = rows / heads / 2;
        let mut out = vec![0u8; bytes.len()];
        for r in 0..rows {
            // Reference row (h, j, i) is stored at (h, i, j).
            let (h, rest) = (r / (2 * half), r % (2 * half));
            let (j, i) = (rest / half, rest % half);
            let stored = h * 2 * half + i * 2 + j;
            out[r * row_len..(r + 1) * row_len]
                .copy_from_slice(&bytes[stored * row_len..(stored + 1) * row_len]);
        }
        out
    }
}

/// An opened, validated safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    tensors: BTreeMap<String, TensorInfo>,
}

impl SafetensorsFile {
    /// Opens `path` and validates its header against the file's size.
    pub fn open(path: &Path) -> Result<Self, WeightsError> {
        let file = crate::regular::open(path).map_err(|source| WeightsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let file_len = file
            .metadata()
            .map_err(|source| WeightsError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        let invalid = |reason: String| WeightsError::InvalidFile {
            path: path.to_path_buf(),
            reason,
        };
        if file_len < HEADER_LEN_PREFIX {
            return Err(invalid(format!(
                "file is {file_len} bytes, too short for the 8-byte header length"
            )));
        }
        let mut prefix = [0u8; HEADER_LEN_PREFIX as usize];
        read_exact_at(&file, path, &mut prefix, 0)?;
        let header_len = u64::from_le_bytes(prefix);
        if header_len > MAX_HEADER_BYTES {
            return Err(invalid(format!(
                "header length {header_len} bytes exceeds the {MAX_HEADER_BYTES}-byte limit"
            )));
        }
        let data_start = HEADER_LEN_PREFIX + header_len;
        if data_start > file_len {
            return Err(invalid(format!(
                "header length {header_len} bytes runs past the end of the {file_len}-byte file (truncated?)"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        read_exact_at(&file, path, &mut header, HEADER_LEN_PREFIX)?;
        let tensors = parse_header(&header, file_len - data_start)
            .map_err(invalid)?
            .into_iter()
            .map(|(name, mut info)| {
                info.offset += data_start;
                (name, info)
            })
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            file,
            tensors,
        })
    }

    /// A file whose tensors were located by another reader (a GGUF file's
    /// table under Hugging Face names); overlaps are refused as for a header.
    pub fn with_tensors(
        path: &Path,
        tensors: BTreeMap<String, TensorInfo>,
    ) -> Result<Self, WeightsError> {
        let file = crate::regular::open(path).map_err(|source| WeightsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        check_overlaps(&tensors).map_err(|reason| WeightsError::InvalidFile {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tensors(&self) -> &BTreeMap<String, TensorInfo> {
        &self.tensors
    }

    /// Reads `len` bytes starting `start` bytes into one tensor's data, as
    /// stored (rows are not reordered).
    pub fn read_range(
        &self,
        info: &TensorInfo,
        start: u64,
        len: u64,
    ) -> Result<Vec<u8>, WeightsError> {
        if start.checked_add(len).is_none_or(|end| end > info.len) {
            return Err(WeightsError::InvalidFile {
                path: self.path.clone(),
                reason: format!("range {start}+{len} is outside a {}-byte tensor", info.len),
            });
        }
        let mut buf = vec![0u8; len as usize];
        read_exact_at(&self.file, &self.path, &mut buf, info.offset + start)?;
        Ok(buf)
    }

    /// Reads the raw bytes of one tensor.
    pub fn read_bytes(&self, info: &TensorInfo) -> Result<Vec<u8>, WeightsError> {
        let len = usize::try_from(info.len).map_err(|_| WeightsError::InvalidFile {
            path: self.path.clone(),
            reason: format!("tensor of {} bytes does not fit in memory", info.len),
        })?;
        let mut buf = vec![0u8; len];
        read_exact_at(&self.file, &self.path, &mut buf, info.offset)?;
        let rows = info.shape.first().copied().unwrap_or(0);
        Ok(info.rows.restore(buf, rows))
    }
}

fn read_exact_at(
    file: &File,
    path: &Path,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), WeightsError> {
    file.read_exact_at(buf, offset)
        .map_err(|source| WeightsError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Parses and validates a header; offsets in the result are relative to the
/// start of the data section, whose length is `data_len`.
pub fn parse_header(header: &[u8], data_len: u64) -> Result<BTreeMap<String, TensorInfo>, String> {
    let value: Value =
        serde_json::from_slice(header).map_err(|e| format!("header is not valid JSON: {e}"))?;
    let Value::Object(entries) = value else {
        return Err("header is not a JSON object".to_string());
    };
    let mut tensors = BTreeMap::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        let info = parse_entry(&entry, data_len).map_err(|e| format!("tensor `{name}`: {e}"))?;
        tensors.insert(name, info);
    }
    check_overlaps(&tensors)?;
    Ok(tensors)
}

fn parse_entry(entry: &Value, data_len: u64) -> Result<TensorInfo, String> {
    let dtype_name = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or("missing string field `dtype`")?;
    let dtype = Dtype::parse(dtype_name).ok_or_else(|| format!("unknown dtype `{dtype_name}`"))?;
    let shape = entry
        .get("shape")
        .and_then(Value::as_array)
        .ok_or("missing array field `shape`")?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or("`shape` must hold non-negative integers")?;
    let offsets = entry
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or("missing array field `data_offsets`")?;
    let [start, end] = offsets.as_slice() else {
        return Err(format!(
            "`data_offsets` must hold 2 numbers, found {}",
            offsets.len()
        ));
    };
    let (Some(start), Some(end)) = (start.as_u64(), end.as_u64()) else {
        return Err("`data_offsets` must hold non-negative integers".to_string());
    };
    if start > end {
        return Err(format!("data_offsets [{start}, {end}] run backwards"));
    }
    if end > data_len {
        return Err(format!(
            "data_offsets [{start}, {end}] run past the end of the {data_len}-byte data section (truncated?)"
        ));
    }
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or("shape overflows")?;
    let expected = dtype
        .byte_len(elements)
        .ok_or("shape overflows or is not whole blocks")?;
    if expected != end - start {
        return Err(format!(
            "holds {} bytes but dtype {dtype_name} × shape {shape:?} needs {expected}",
            end - start
        ));
    }
    Ok(TensorInfo {
        dtype,
        shape,
        offset: start,
        len: end - start,
        rows: RowOrder::Stored,
    })
}

fn check_overlaps(tensors: &BTreeMap<String, TensorInfo>) -> Result<(), String> {
    let mut spans: Vec<(&str, u64, u64)> = tensors
        .iter()
        .filter(|(_, t)| t.len > 0)
        .map(|(n, t)| (n.as_str(), t.offset, t.offset + t.len))
        .collect();
    spans.sort_by_key(|&(_, start, _)| start);
    for pair in spans.windows(2) {
        let (a, _, a_end) = pair[0];
        let (b, b_start, _) = pair[1];
        if b_start < a_end {
            return Err(format!("tensors `{a}` and `{b}` overlap"));
        }
    }
    Ok(())
}

/// One tensor to be written by [`header_bytes`].
pub struct TensorEntry<'a> {
    pub name: &'a str,
    pub dtype: &'a str,
    pub shape: &'a [usize],
    pub len: u64,
}

/// The length prefix and JSON header of a safetensors file whose tensors
/// follow back to back in the given order. The header is padded with spaces
/// to a multiple of 8 bytes, as the format recommends.
pub fn header_bytes(entries: &[TensorEntry]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    let mut offset = 0u64;
    for e in entries {
        map.insert(
            e.name.to_string(),
            serde_json::json!({"dtype": e.dtype, "shape": e.shape, "data_offsets": [offset, offset + e.len]}),
        );
        offset += e.len;
    }
    let mut header = Value::Object(map).to_string().into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out
}
