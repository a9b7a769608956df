//! The pack manifest: what a pack holds and where every byte of it lives.
//!
//! It is written last, after every other file is complete and synced, so a
//! folder with a manifest is a finished pack and one without is not.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::PackError;
use crate::store::ReadRequest;

/// File name of the manifest inside a pack folder.
pub const MANIFEST_FILE: &str = "longhaul-pack.json";
/// Identifies the file as a Longhaul pack manifest.
pub const FORMAT: &str = "longhaul-pack";
/// Version of the layout this code writes for plain records (and reads).
pub const VERSION: u32 = 1;
/// Version written when records may be compressed, which older readers
/// must refuse rather than mistake for corrupt records.
pub const VERSION_COMPRESSED: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// `model_type` of the packed checkpoint (the config itself is copied beside the manifest).
    pub model_type: String,
    pub source: SourceIdentity,
    /// Byte alignment of every record, so records can be read with direct I/O.
    pub alignment: u64,
    /// Folder of this pack on each drive, in drive order.
    pub drives: Vec<PathBuf>,
    /// The non-expert weights, as a safetensors file.
    pub resident: ResidentFile,
    pub experts: ExpertSection,
    /// Blocks of the checkpoint the decoder does not run (MTP), left out of
    /// the resident file and the expert records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
}

/// One block of the checkpoint left out of the pack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeftOut {
    pub block: crate::model::ExtraBlock,
    pub tensors: usize,
    /// Bytes the checkpoint stores for them.
    pub bytes: u64,
    /// The first of its tensor names, for the report.
    pub first: String,
}

/// The checkpoint a pack was made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceIdentity {
    pub path: PathBuf,
    pub files: Vec<SourceFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceFile {
    pub name: String,
    pub size: u64,
    /// xxh3-128 of the whole file, as 32 hex digits.
    pub xxh3_128: String,
}

/// The resident (non-expert) weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResidentFile {
    pub path: PathBuf,
    pub size: u64,
    pub xxh3_128: String,
    /// Set when the resident matrices were quantised on request (`pack
    /// --resident q8_0`): a lossy spine, labelled as such.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<QuantizationReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertSection {
    /// How expert weights are stored: a safetensors dtype name (`F32`, `F16`,
    /// `BF16`) for the checkpoint's own bytes, or a quantisation (`Q8_0`, `Q4K`).
    pub dtype: String,
    /// Present when the experts were quantised while packing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<QuantizationReport>,
    /// How records with a `stored_len` are compressed (losslessly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    pub layers: Vec<ExpertLayer>,
}

/// What quantising the experts changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantizationReport {
    /// The checkpoint's expert dtype.
    pub from: String,
    /// What `--experts` asked for, where a matrix whose rows are not whole
    /// blocks of it fell back to another type (the pack's `dtype` says which).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<String>,
    /// `‖w − q(w)‖ / ‖w‖` over every expert weight of the pack.
    pub relative_rms_error: f64,
}

/// One decoder layer's routed experts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertLayer {
    pub layer: usize,
    pub hidden: usize,
    pub intermediate: usize,
    /// The layer's own encoding where it differs from the section's
    /// `dtype` (a GGUF's layers may store their experts in other types).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Records in expert id order.
    pub records: Vec<Record>,
}

/// One expert's bytes: gate rows, up rows (`[2I, H]`), then down (`[H, I]`),
/// stored as one or more segments whose concatenation is the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub len: u64,
    /// xxh3-128 of the record's bytes, as 32 hex digits.
    pub xxh3_128: String,
    /// Bytes on the drives when the record is stored compressed (see
    /// `ExpertSection::compression`); `len` and the checksum are the plain
    /// record's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_len: Option<u64>,
    pub segments: Vec<Segment>,
    /// Further copies of the record, each a full set of segments placed on
    /// other drives; a read goes to whichever copy should finish first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<Vec<Segment>>,
}

impl Record {
    /// Bytes the record takes on the drives.
    pub fn stored(&self) -> u64 {
        self.stored_len.unwrap_or(self.len)
    }

    /// Every placement of the record: the primary one, then the replicas.
    pub fn placements(&self) -> impl Iterator<Item = &[Segment]> {
        std::iter::once(self.segments.as_slice()).chain(self.replicas.iter().map(Vec::as_slice))
    }
}

/// A contiguous piece of a record on one drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub drive: usize,
    pub file: String,
    pub offset: u64,
    pub len: u64,
}

impl Segment {
    /// The store read that fetches this segment.
    pub fn request(&self) -> ReadRequest {
        ReadRequest {
            drive: self.drive,
            file: self.file.clone(),
            offset: self.offset,
            len: self.len,
        }
    }
}

impl Manifest {
    /// Every expert record, layer by layer.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.experts.layers.iter().flat_map(|l| &l.records)
    }

    /// Bytes of the largest expert record as restored (a read's buffer).
    pub fn largest_record_bytes(&self) -> u64 {
        self.records().map(|r| r.len).max().unwrap_or(0)
    }

    /// Bytes of every expert record as restored.
    pub fn plain_expert_bytes(&self) -> u64 {
        self.records().map(|r| r.len).sum()
    }

    pub fn read(pack: &Path) -> Result<Self, PackError> {
        let path = pack.join(MANIFEST_FILE);
        let text =
            crate::regular::read_text(&path, crate::regular::LARGE_LIMIT).map_err(|source| {
                PackError::Io {
                    path: path.clone(),
                    source,
                }
            })?;
        Self::parse(&path, &text)
    }

    /// Parses and checks manifest `text`; `path` names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, PackError> {
        let manifest: Manifest = serde_json::from_str(text).map_err(|e| PackError::Manifest {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        manifest.validate(path)?;
        Ok(manifest)
    }

    /// Checks what the types cannot: version, drive indices, segment sums.
    fn validate(&self, path: &Path) -> Result<(), PackError> {
        let bad = |reason: String| PackError::Manifest {
            path: path.to_path_buf(),
            reason,
        };
        if self.format != FORMAT {
            return Err(bad(format!(
                "format is `{}`, expected `{FORMAT}`",
                self.format
            )));
        }
        if self.version != VERSION && self.version != VERSION_COMPRESSED {
            return Err(bad(format!(
                "pack version {} is not supported (this Longhaul reads versions {VERSION} and {VERSION_COMPRESSED}); repack the model",
                self.version
            )));
        }
        let compressed = self
            .experts
            .layers
            .iter()
            .flat_map(|l| &l.records)
            .any(|r| r.stored_len.is_some());
        match self.experts.compression.as_deref() {
            _ if !compressed => {}
            Some(super::compress::COMPRESSION_NAME) => {}
            other => {
                return Err(bad(format!(
                    "records are stored compressed as `{}`, which this Longhaul cannot read (it reads `{}`)",
                    other.unwrap_or("(unnamed)"),
                    super::compress::COMPRESSION_NAME
                )));
            }
        }
        if self.drives.is_empty() {
            return Err(bad("no drives".to_string()));
        }
        // Record sizes size buffers: each must be what its layer's expert
        // shape needs (a segment of 2^40 bytes once aborted the process).
        for layer in &self.experts.layers {
            let dtype = layer.dtype.as_deref().unwrap_or(&self.experts.dtype);
            let encoding = super::encoding::ExpertEncoding::parse(dtype);
            let limit = crate::model::config::MAX_CONFIG_SIZE;
            if layer.hidden > limit || layer.intermediate > limit {
                return Err(bad(format!(
                    "layer {}: expert shape {}x{} is larger than any model's",
                    layer.layer, layer.hidden, layer.intermediate
                )));
            }
            let want = encoding.map(|e| e.record_len(layer.hidden, layer.intermediate));
            for (id, record) in layer.records.iter().enumerate() {
                let where_ = || format!("layer {} expert {id}", layer.layer);
                if let Some(want) = want.filter(|&w| w != record.len) {
                    return Err(bad(format!(
                        "{}: record of {} bytes, but a {}x{} {} expert is {want}",
                        where_(),
                        record.len,
                        layer.hidden,
                        layer.intermediate,
                        dtype
                    )));
                }
                if record.stored() > record.len {
                    return Err(bad(format!(
                        "{}: {} bytes stored for a record of {}",
                        where_(),
                        record.stored(),
                        record.len
                    )));
                }
                if record.stored() == 0 {
                    return Err(bad(format!("{}: an empty record", where_())));
                }
                for segments in record.placements() {
                    // A read of nothing never completes: a record with no
                    // segments once left its reader waiting for good.
                    if segments.is_empty() || segments.iter().any(|s| s.len == 0) {
                        return Err(bad(format!(
                            "{}: a placement with no bytes in a segment",
                            where_()
                        )));
                    }
                    if segments
                        .iter()
                        .any(|s| s.offset.checked_add(s.len).is_none())
                    {
                        return Err(bad(format!("{}: a segment's end overflows", where_())));
                    }
                    if segments.iter().map(|s| s.len).sum::<u64>() != record.stored() {
                        return Err(bad(format!(
                            "{}: segments do not add up to the record length",
                            where_()
                        )));
                    }
                    if let Some(s) = segments.iter().find(|s| s.drive >= self.drives.len()) {
                        return Err(bad(format!(
                            "{}: segment on drive {} of {}",
                            where_(),
                            s.drive,
                            self.drives.len()
                        )));
                    }
                }
            }
        }
        self.no_shared_bytes().map_err(bad)
    }

    /// Refuses two records whose placements share bytes. A record's
    /// checksum covers its bytes, not which expert it is: a manifest
    /// pointing expert 1 at expert 0's record passed `pack --verify` and
    /// computed with the wrong weights.
    fn no_shared_bytes(&self) -> Result<(), String> {
        let mut pieces: Vec<(usize, &str, u64, u64, usize, usize)> = Vec::new();
        for layer in &self.experts.layers {
            for (id, record) in layer.records.iter().enumerate() {
                for s in record.placements().flatten() {
                    pieces.push((
                        s.drive,
                        &s.file,
                        s.offset,
                        s.offset + s.len,
                        layer.layer,
                        id,
                    ));
                }
            }
        }
        pieces.sort_unstable();
        for pair in pieces.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if (a.0, a.1) == (b.0, b.1) && a.3 > b.2 {
                return Err(format!(
                    "layer {} expert {} and layer {} expert {} share bytes of {} on drive {}",
                    a.4, a.5, b.4, b.5, a.1, a.0
                ));
            }
        }
        Ok(())
    }
}

/// Read size when hashing whole files.
const HASH_CHUNK: usize = 8 * 1024 * 1024;

/// Size and xxh3-128 (32 hex digits) of a whole file, read in chunks;
/// `progress` gets the bytes of each chunk.
pub fn hash_file(path: &Path, mut progress: impl FnMut(u64)) -> std::io::Result<(u64, String)> {
    let mut file = crate::regular::open(path)?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; HASH_CHUNK];
    let mut size = 0;
    loop {
        let n = std::io::Read::read(&mut file, &mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
        progress(n as u64);
    }
    Ok((size, format!("{:032x}", hasher.digest128())))
}

/// xxh3-128 as 32 lowercase hex digits.
pub fn hash_hex(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}
