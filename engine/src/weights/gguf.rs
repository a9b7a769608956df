//! GGUF files as llama.cpp writes them (versions 2 and 3): the header,
//! the metadata key/values and the tensor table, read and checked before
//! anything is allocated from them.
//!
//! Every count and length in a GGUF header is a 64-bit number a damaged or
//! hostile file can set to anything, so each is checked against the bytes
//! the file still has before it sizes an allocation: a string of 2^40 bytes
//! or an array of 2^60 entries is an error naming the key, never an
//! attempt to allocate it. Tensor data is located, not read: the store
//! reads blocks where they lie.

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// `GGUF` in the file's first four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Versions read: 2 (64-bit counts) and 3 (adds big-endian files, which
/// are refused by their magic).
const VERSIONS: [u32; 2] = [2, 3];
/// Alignment of the data section when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Dimensions a GGML tensor has at most.
const MAX_DIMS: u32 = 4;
/// Nesting of arrays inside arrays accepted in metadata.
const MAX_ARRAY_DEPTH: u32 = 2;
/// Longest metadata array read: a vocabulary's tokens or merges run to a few
/// hundred thousand; each item becomes a value tens of bytes wide, so a
/// count checked only against the bytes left could still ask for tens of GB.
const MAX_ARRAY_LEN: u64 = 1 << 24;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file ({reason})")]
    NotGguf { path: PathBuf, reason: String },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, where it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// A GGML tensor type, by its number in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// Name, values per block and bytes per block, for the types Longhaul
    /// knows the layout of (the formats' table).
    fn known(self) -> Option<(&'static str, u64, u64)> {
        let format = crate::kernels::Format::of_ggml(self.0)?;
        let row = format.row();
        let (_, name) = row.ggml?;
        Some((name, row.block as u64, row.block_bytes as u64))
    }

    /// Names of the types GGML defines whose layout Longhaul does not read.
    const OTHERS: [(u32, &'static str); 7] = [
        (24, "I8"),
        (25, "I16"),
        (26, "I32"),
        (27, "I64"),
        (28, "F64"),
        (34, "TQ1_0"),
        (35, "TQ2_0"),
    ];

    /// The type's name, or `type N` for one GGML does not define.
    pub fn name(self) -> String {
        self.known()
            .map(|k| k.0)
            .or_else(|| Self::OTHERS.iter().find(|o| o.0 == self.0).map(|o| o.1))
            .map_or_else(|| format!("type {}", self.0), str::to_string)
    }

    /// Bytes of a tensor of `elements` values whose rows hold `row` values;
    /// `None` for an unknown type or rows that are not whole blocks.
    pub fn byte_len(self, row: u64, elements: u64) -> Option<u64> {
        let (_, block, bytes) = self.known()?;
        if block == 0 || !row.is_multiple_of(block) {
            return None;
        }
        (elements / block).checked_mul(bytes)
    }
}

/// One tensor's entry in the table.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    /// Row-major shape (GGML stores it innermost first; this is reversed).
    pub shape: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute offset of the tensor's data in the file.
    pub offset: u64,
    /// Bytes of data, where the type is known.
    pub len: Option<u64>,
}

/// A parsed GGUF file: metadata and where each tensor lies.
#[derive(Debug, Clone)]
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensor>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

impl GgufFile {
    /// Reads and checks `path`'s header and tensor table.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = crate::regular::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        Self::parse(path, BufReader::new(file), len)
    }

    /// Parses a GGUF file of `len` bytes from `reader`.
    pub fn parse(path: &Path, reader: impl Read, len: u64) -> Result<Self, GgufError> {
        let mut r = Reader {
            inner: reader,
            path,
            at: 0,
            len,
        };
        let magic: [u8; 4] = r.array("the magic")?;
        if magic != MAGIC {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                reason: format!("it starts with {magic:?}, not \"GGUF\""),
            });
        }
        let version = r.u32("the version")?;
        if !VERSIONS.contains(&version) {
            return Err(r.invalid(format!(
                "GGUF version {version} is not read; versions 2 and 3 are"
            )));
        }
        let tensor_count = r.u64("the tensor count")?;
        let kv_count = r.u64("the metadata count")?;
        // Every key/value takes at least 12 bytes and every tensor entry 28.
        r.fits(kv_count, 12, "metadata entries")?;
        r.fits(tensor_count, 28, "tensor entries")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = r.string("a metadata key")?;
            let kind = r.u32(&format!("the type of `{key}`"))?;
            let value = r.value(kind, &key, 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v.as_u64().filter(|a| a.is_power_of_two()).ok_or_else(|| {
                r.invalid(format!("general.alignment {v:?} is not a power of two"))
            })?,
        };
        let mut entries = Vec::with_capacity(tensor_count as usize);
        for _ in 0..tensor_count {
            entries.push(r.tensor_entry()?);
        }
        let data_offset = r.at.next_multiple_of(alignment);
        let mut tensors = Vec::with_capacity(entries.len());
        for (name, shape, ggml_type, relative) in entries {
            let what = |w: String| r.invalid(format!("tensor `{name}`: {w}"));
            if !relative.is_multiple_of(alignment) {
                return Err(what(format!(
                    "its data offset {relative} is not a multiple of the alignment {alignment}"
                )));
            }
            let elements = shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| what(format!("shape {shape:?} overflows")))?;
            let row = shape.last().copied().unwrap_or(1);
            let len = ggml_type.byte_len(row, elements);
            let offset = data_offset
                .checked_add(relative)
                .ok_or_else(|| what("its data offset overflows".to_string()))?;
            let end = offset.checked_add(len.unwrap_or(0));
            if end.is_none_or(|e| e > r.len) {
                return Err(what(format!(
                    "its data ({} bytes at offset {offset}) runs past the end of the {}-byte file",
                    len.unwrap_or(0),
                    r.len
                )));
            }
            tensors.push(GgufTensor {
                name,
                shape,
                ggml_type,
                offset,
                len,
            });
        }
        spans_agree(&tensors, alignment, r.len).map_err(|w| r.invalid(w))?;
        Ok(Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        })
    }

    /// Metadata value `key`, or an error naming it.
    pub fn require(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.metadata.get(key).ok_or_else(|| GgufError::Invalid {
            path: self.path.clone(),
            what: format!("metadata key `{key}` is missing"),
        })
    }
}

/// Reads little-endian values, counting bytes against the file's length.
struct Reader<'a, R> {
    inner: R,
    path: &'a Path,
    at: u64,
    len: u64,
}

impl<R: Read> Reader<'_, R> {
    fn invalid(&self, what: String) -> GgufError {
        GgufError::Invalid {
            path: self.path.to_path_buf(),
            what,
        }
    }

    /// Whether `count` items of at least `min_bytes` each fit in what is left.
    fn fits(&self, count: u64, min_bytes: u64, what: &str) -> Result<(), GgufError> {
        let left = self.len.saturating_sub(self.at);
        if count.checked_mul(min_bytes).is_none_or(|n| n > left) {
            return Err(self.invalid(format!(
                "{count} {what} cannot fit in the {left} bytes left of the file"
            )));
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, GgufError> {
        self.fits(n, 1, &format!("bytes of {what}"))?;
        let mut buf = vec![0u8; n as usize];
        self.inner.read_exact(&mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.invalid(format!("the file ends inside {what}"))
            } else {
                GgufError::Io {
                    path: self.path.to_path_buf(),
                    source: e,
                }
            }
        })?;
        self.at += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let bytes = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(&format!("the length of {what}"))?;
        let bytes = self.bytes(n, what)?;
        String::from_utf8(bytes).map_err(|_| self.invalid(format!("{what} is not UTF-8")))
    }

    /// A value of GGUF type `kind` for key `key`.
    fn value(&mut self, kind: u32, key: &str, depth: u32) -> Result<GgufValue, GgufError> {
        let what = format!("`{key}`");
        Ok(match kind {
            0 => GgufValue::U8(self.array::<1>(&what)?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(&what)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => GgufValue::U32(self.u32(&what)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => match self.array::<1>(&what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.invalid(format!("{what} is a bool of value {b}"))),
            },
            8 => GgufValue::Str(self.string(&what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.invalid(format!("{what} nests arrays too deeply")));
                }
                let item = self.u32(&format!("the item type of {what}"))?;
                let count = self.u64(&format!("the length of {what}"))?;
                if count > MAX_ARRAY_LEN {
                    return Err(self.invalid(format!(
                        "{what} has {count} items; arrays here hold at most {MAX_ARRAY_LEN}"
                    )));
                }
                // Every item takes at least one byte (strings eight).
                self.fits(
                    count,
                    if item == 8 { 8 } else { 1 },
                    &format!("items of {what}"),
                )?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(&what)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            other => return Err(self.invalid(format!("{what} has unknown value type {other}"))),
        })
    }

    /// One tensor table entry: name, row-major shape, type, relative offset.
    fn tensor_entry(&mut self) -> Result<(String, Vec<u64>, GgmlType, u64), GgufError> {
        let name = self.string("a tensor name")?;
        let dims = self.u32(&format!("the dimension count of `{name}`"))?;
        if dims == 0 || dims > MAX_DIMS {
            return Err(self.invalid(format!(
                "tensor `{name}` has {dims} dimensions; GGML tensors have 1 to {MAX_DIMS}"
            )));
        }
        let mut shape = Vec::with_capacity(dims as usize);
        for _ in 0..dims {
            let size = self.u64(&format!("the shape of `{name}`"))?;
            // A zero makes any other dimension free: `[10^9, 0, 64]` fits
            // in no bytes and would name 10^9 experts.
            if size == 0 {
                return Err(self.invalid(format!("tensor `{name}` has a dimension of 0")));
            }
            shape.push(size);
        }
        shape.reverse();
        let ggml_type = GgmlType(self.u32(&format!("the type of `{name}`"))?);
        let offset = self.u64(&format!("the data offset of `{name}`"))?;
        Ok((name, shape, ggml_type, offset))
    }
}

/// Writers lay tensors out one after another, each padded to the
/// alignment, the last one up to the end of the file: a tensor whose type
/// says fewer bytes than its place holds by a whole alignment or more, or
/// more than it holds, has the wrong type (a Q4_K tensor retyped as IQ3_S
/// once loaded and computed garbage).
fn spans_agree(tensors: &[GgufTensor], alignment: u64, file_len: u64) -> Result<(), String> {
    let mut by_offset: Vec<&GgufTensor> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for (i, t) in by_offset.iter().enumerate() {
        let Some(len) = t.len else { continue };
        let (end, until) = match by_offset.get(i + 1) {
            Some(next) => (next.offset, format!("`{}`", next.name)),
            None => (file_len, "the end of the file".to_string()),
        };
        let span = end - t.offset;
        if len > span || span - len >= alignment {
            return Err(format!(
                "tensor `{}`: its type {} says {len} bytes, but its data spans {span} (to {until})",
                t.name,
                t.ggml_type.name()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a GGUF v3 file: metadata (key, type, encoded value) and
    /// tensors (name, innermost-first dims, type, data).
    fn gguf(meta: &[(&str, u32, Vec<u8>)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((meta.len() as u64).to_le_bytes());
        for (k, t, v) in meta {
            out.extend(str_value(k));
            out.extend(t.to_le_bytes());
            out.extend(v);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in tensors {
            out.extend(str_value(name));
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).next_multiple_of(32);
        }
        out.resize(out.len().next_multiple_of(32), 0);
        for (_, _, _, data) in tensors {
            let mut d = data.clone();
            d.resize(d.len().next_multiple_of(32), 0);
            out.extend(d);
        }
        out
    }

    fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        GgufFile::parse(Path::new("m.gguf"), bytes, bytes.len() as u64)
    }

    /// An array value of the two strings `a` and `bc`.
    fn token_array() -> Vec<u8> {
        let mut tokens = 8u32.to_le_bytes().to_vec();
        tokens.extend(2u64.to_le_bytes());
        tokens.extend(str_value("a"));
        tokens.extend(str_value("bc"));
        tokens
    }

    fn str_value(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend(s.as_bytes());
        v
    }

    #[test]
    fn metadata_and_tensors_are_read_in_row_major_order() {
        let tokens = token_array();
        let bytes = gguf(
            &[
                ("general.architecture", 8, str_value("qwen3moe")),
                ("qwen3moe.block_count", 4, 2u32.to_le_bytes().to_vec()),
                ("qwen3moe.rope.freq_base", 6, 1e6f32.to_le_bytes().to_vec()),
                ("tokenizer.ggml.tokens", 9, tokens),
            ],
            &[
                ("a.weight", vec![64, 3], 0, vec![1u8; 64 * 3 * 4]),
                ("b.weight", vec![32, 2], 8, vec![2u8; 2 * 34]),
            ],
        );
        let f = parse(&bytes).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(
            f.require("general.architecture").unwrap().as_str(),
            Some("qwen3moe")
        );
        assert_eq!(f.metadata["qwen3moe.block_count"].as_u64(), Some(2));
        assert_eq!(
            f.metadata["tokenizer.ggml.tokens"],
            GgufValue::Array(vec![
                GgufValue::Str("a".into()),
                GgufValue::Str("bc".into())
            ])
        );
        assert_eq!(f.tensors[0].shape, vec![3, 64]);
        assert_eq!(f.tensors[0].len, Some(64 * 3 * 4));
        assert_eq!(f.tensors[1].ggml_type.name(), "Q8_0");
        assert_eq!(f.tensors[1].len, Some(68));
        let at = f.tensors[1].offset as usize;
        assert_eq!(&bytes[at..at + 68], &[2u8; 68][..]);
        let err = f.require("qwen3moe.expert_count").unwrap_err().to_string();
        assert!(err.contains("qwen3moe.expert_count"), "{err}");
    }

    #[test]
    fn damaged_headers_are_typed_errors_that_allocate_nothing_large() {
        let good = gguf(
            &[("k", 8, str_value("v"))],
            &[("t", vec![32], 0, vec![0u8; 128])],
        );
        assert!(parse(&good).is_ok());
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                b"GGML".iter().chain(&good[4..]).copied().collect(),
                "not a GGUF",
            ),
            (
                {
                    let mut b = good.clone();
                    b[4] = 1;
                    b
                },
                "version 1",
            ),
            // A metadata count of 2^60.
            (
                {
                    let mut b = good.clone();
                    b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
                    b
                },
                "metadata entries",
            ),
            // The key's string length set to 2^40.
            (
                {
                    let mut b = good.clone();
                    b[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
                    b
                },
                "bytes of a metadata key",
            ),
            (good[..good.len() - 100].to_vec(), "runs past the end"),
            (good[..30].to_vec(), "cannot fit"),
        ];
        for (bytes, want) in cases {
            let err = parse(&bytes).unwrap_err().to_string();
            assert!(err.contains(want), "want `{want}`: {err}");
        }
        let unknown = gguf(&[], &[("t", vec![256], 99, vec![0u8; 64])]);
        let f = parse(&unknown).unwrap();
        assert_eq!(f.tensors[0].len, None);
        assert_eq!(f.tensors[0].ggml_type.name(), "type 99");
        let five_dims = gguf(&[], &[("t", vec![1, 1, 1, 1, 1], 0, vec![0u8; 4])]);
        assert!(
            parse(&five_dims)
                .unwrap_err()
                .to_string()
                .contains("5 dimensions")
        );
        let deep = {
            let mut v = 9u32.to_le_bytes().to_vec();
            v.extend(1u64.to_le_bytes());
            v.extend(9u32.to_le_bytes());
            v.extend(1u64.to_le_bytes());
            v.extend(9u32.to_le_bytes());
            v.extend(0u64.to_le_bytes());
            gguf(&[("nested", 9, v)], &[])
        };
        assert!(parse(&deep).unwrap_err().to_string().contains("too deeply"));
    }

    /// Seeded mutations of a valid file (flips, cuts, repeats, huge
    /// counts): each parses or is an error, never a panic, and anything
    /// accepted locates its tensors inside the file.
    #[test]
    fn mutated_files_parse_or_fail_cleanly() {
        let tokens = token_array();
        let seed = gguf(
            &[
                ("general.architecture", 8, str_value("llama")),
                ("tokenizer.ggml.tokens", 9, tokens),
            ],
            &[
                ("a", vec![64, 2], 12, vec![3u8; 0]),
                ("b", vec![32], 8, vec![1u8; 34]),
            ],
        );
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n.max(1) as u64) as usize
        };
        let (mut accepted, total) = (0, 3000);
        for _ in 0..total {
            let mut b = seed.clone();
            for _ in 0..1 + next(3) {
                if b.is_empty() {
                    b.push(0);
                }
                let at = next(b.len());
                match next(5) {
                    0 => b[at] ^= 1 << next(8),
                    1 => b.truncate(at),
                    2 => b[at] = 0xFF,
                    3 if at + 8 <= b.len() => {
                        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes())
                    }
                    _ => b.insert(at, next(256) as u8),
                }
            }
            if let Ok(f) = parse(&b) {
                accepted += 1;
                for t in &f.tensors {
                    assert!(t.offset + t.len.unwrap_or(0) <= b.len() as u64);
                }
            }
        }
        assert!(
            accepted > 0 && accepted < total,
            "{accepted} of {total} accepted"
        );
    }
}
