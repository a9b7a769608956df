//! Writing a pack: routed experts into aligned extent files spread over the
//! drives, everything else into one resident safetensors file, and the
//! manifest last.
//!
//! Every file is written under a `.partial` name, synced, then renamed; the
//! manifest is written the same way after all of them. An interrupted pack
//! therefore never has a manifest, and `Manifest::read` refuses it.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::PackError;
use super::compress;
use super::encoding::{ErrorSums, ExpertEncoding, Quantization, quantize_matrix, quantize_record};
use super::layout::ExpertTensors;
use super::manifest::{
    self, ExpertLayer, ExpertSection, FORMAT, LeftOut, MANIFEST_FILE, Manifest, QuantizationReport,
    Record, ResidentFile, Segment, SourceFile, SourceIdentity, VERSION, VERSION_COMPRESSED,
    hash_file,
};
use super::plan::LayerPlan;
use crate::import::ModelSource;
use crate::kernels::Format;
use crate::store::DIRECT_IO_BLOCK;
use crate::weights::safetensors::{TensorEntry, header_bytes};
use crate::weights::{Dtype, SafetensorsCheckpoint, SafetensorsFile, TensorInfo};

/// Record alignment when none is given: large enough for direct I/O on any
/// common device and file system.
pub const DEFAULT_ALIGNMENT: u64 = 64 * 1024;
/// Records of at least twice this size are split across drives, in segments
/// no smaller than it, so that one expert is read from several drives at once.
/// Half a megabyte keeps each read large enough to run at a drive's full rate.
pub const DEFAULT_SPLIT_THRESHOLD: u64 = 512 * 1024;
/// An extent file is closed and a new one started past this size.
pub const DEFAULT_EXTENT_FILE_BYTES: u64 = 4 * 1024 * 1024 * 1024;
const RESIDENT_FILE: &str = "resident.safetensors";
const PARTIAL_SUFFIX: &str = ".partial";

#[derive(Debug, Clone)]
pub struct PackOptions {
    pub source: PathBuf,
    pub out: PathBuf,
    pub drives: Vec<PathBuf>,
    /// Where the resident file goes; the first drive's pack folder by default.
    pub resident_dir: Option<PathBuf>,
    pub alignment: u64,
    pub split_threshold: u64,
    pub extent_file_bytes: u64,
    /// Extra copies written of each expert in `replicate`.
    pub replicas: usize,
    /// (layer, expert) pairs to copy, usually the hottest of earlier runs.
    pub replicate: std::collections::HashSet<(usize, usize)>,
    /// Store experts quantised instead of as the checkpoint holds them.
    pub quantization: Option<Quantization>,
    /// Store the resident matrices quantised (only Q8_0): a lossy spine
    /// for machines whose RAM cannot hold them at their stored width.
    pub resident_quantization: Option<Quantization>,
    /// Compress float records losslessly where that saves space (see
    /// [`super::compress`]).
    pub compress: bool,
    /// A failure point: expert writes past this many bytes in all fail as
    /// on a full drive, so the cleanup after a failed pack runs in tests.
    /// `None` for every user.
    pub fail_writes_after: Option<u64>,
}

impl PackOptions {
    pub fn new(source: PathBuf, out: PathBuf, drives: Vec<PathBuf>) -> Self {
        Self {
            source,
            out,
            drives,
            resident_dir: None,
            alignment: DEFAULT_ALIGNMENT,
            split_threshold: DEFAULT_SPLIT_THRESHOLD,
            extent_file_bytes: DEFAULT_EXTENT_FILE_BYTES,
            replicas: 0,
            replicate: std::collections::HashSet::new(),
            quantization: None,
            resident_quantization: None,
            compress: true,
            fail_writes_after: None,
        }
    }
}

/// Where packing has got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackProgress {
    pub phase: PackPhase,
    pub done_bytes: u64,
    pub total_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackPhase {
    HashingSource,
    WritingExperts,
    WritingResident,
}

/// What a finished pack holds.
#[derive(Debug, Clone)]
pub struct PackSummary {
    pub manifest: Manifest,
    /// Bytes of expert records on the drives.
    pub expert_bytes: u64,
    /// Bytes of the same records uncompressed.
    pub plain_expert_bytes: u64,
    pub resident_bytes: u64,
    pub records: usize,
}

pub fn write_pack(
    opts: &PackOptions,
    report: &dyn Fn(PackProgress),
) -> Result<PackSummary, PackError> {
    check_options(opts)?;
    // Refuse unsupported models before writing anything.
    let model = ModelSource::open(&opts.source).map_err(|e| PackError::Source(e.to_string()))?;
    let spec = model.spec().map_err(|e| PackError::Source(e.to_string()))?;
    let checkpoint = &model.checkpoint;
    let sorted = ExpertTensors::classify(checkpoint.names(), &spec.decoder_names())
        .map_err(|e| PackError::Source(e.to_string()))?;
    let (experts, resident_names) = (sorted.experts, sorted.resident);
    let left_out = left_out_blocks(checkpoint, sorted.left_out);
    if experts.layers.is_empty() {
        return Err(PackError::Source(format!(
            "{}: no routed-expert tensors found; nothing to stream",
            opts.source.display()
        )));
    }
    let plans = experts
        .layers
        .iter()
        .map(|(&layer, tensors)| LayerPlan::new(checkpoint, layer, tensors, &spec))
        .collect::<Result<Vec<_>, _>>()?;
    let encodings = Encodings::choose(&plans, opts)?;
    let drive_dirs = drive_folders(opts)?;
    crate::private::create_dir_all(&opts.out).map_err(|source| PackError::Io {
        path: opts.out.clone(),
        source,
    })?;

    let source = hash_source(&model, report)?;
    let written = write_experts(checkpoint, &plans, &encodings, &drive_dirs, opts, report)?;
    let mut partials = written.partials;

    let resident_path = resident_folder(opts, &drive_dirs)?.join(RESIDENT_FILE);
    let resident = write_resident(
        checkpoint,
        &resident_names,
        &resident_path,
        opts.resident_quantization,
        report,
    )?;
    partials.push((partial_path(&resident_path), resident_path.clone()));

    for (partial, done) in &partials {
        fs::rename(partial, done).map_err(|source| PackError::Io {
            path: done.clone(),
            source,
        })?;
    }
    model
        .write_aux(&opts.out)
        .map_err(|(path, source)| PackError::Io { path, source })?;
    let (version, experts) = expert_section(written.layers, &encodings, opts, &written.error);
    let manifest = Manifest {
        format: FORMAT.to_string(),
        version,
        model_type: spec.model_type.clone(),
        source,
        alignment: opts.alignment,
        drives: drive_dirs,
        resident,
        experts,
        left_out,
    };
    write_manifest(&opts.out, &manifest)?;
    Ok(PackSummary {
        expert_bytes: written.bytes,
        plain_expert_bytes: written.plain_bytes,
        resident_bytes: manifest.resident.size,
        records: manifest
            .experts
            .layers
            .iter()
            .map(|l| l.records.len())
            .sum(),
        manifest,
    })
}

/// Where the resident file goes: `--resident-dir`, made, or the first
/// drive's pack folder.
fn resident_folder(opts: &PackOptions, drive_dirs: &[PathBuf]) -> Result<PathBuf, PackError> {
    let Some(dir) = &opts.resident_dir else {
        return Ok(drive_dirs[0].clone());
    };
    let io = |source| PackError::Io {
        path: dir.clone(),
        source,
    };
    crate::private::create_dir_all(dir).map_err(io)?;
    fs::canonicalize(dir).map_err(io)
}

/// The manifest's expert section for `layers`, and the pack format version
/// it needs (compressed records need the newer).
fn expert_section(
    layers: Vec<ExpertLayer>,
    encodings: &Encodings,
    opts: &PackOptions,
    error: &ErrorSums,
) -> (u32, ExpertSection) {
    let compressed = layers
        .iter()
        .flat_map(|l| &l.records)
        .any(|r| r.stored_len.is_some());
    let dtype_name = encodings.encoding.name();
    let section = ExpertSection {
        dtype: encodings
            .quantized
            .map_or(dtype_name.clone(), ExpertEncoding::name),
        quantization: encodings.quantized.map(|e| QuantizationReport {
            from: dtype_name.clone(),
            requested: opts
                .quantization
                .map(|q| q.name().to_string())
                .filter(|q| *q != e.name()),
            relative_rms_error: error.relative_rms(),
        }),
        compression: compressed.then(|| compress::COMPRESSION_NAME.to_string()),
        layers,
    };
    let version = if compressed {
        VERSION_COMPRESSED
    } else {
        VERSION
    };
    (version, section)
}

/// Refuses options no pack can be written with, before anything is read.
fn check_options(opts: &PackOptions) -> Result<(), PackError> {
    if opts.drives.is_empty() {
        return Err(PackError::Options(
            "give at least one drive folder".to_string(),
        ));
    }
    if !opts.alignment.is_power_of_two() || opts.alignment < 512 {
        return Err(PackError::Options(format!(
            "alignment {} must be a power of two of at least 512",
            opts.alignment
        )));
    }
    if let Some(q) = opts
        .resident_quantization
        .filter(|q| *q != Quantization::Q8_0)
    {
        return Err(PackError::Options(format!(
            "--resident {}: resident matrices are quantised to q8_0 only",
            q.name()
        )));
    }
    if opts.out.join(MANIFEST_FILE).exists() {
        return Err(PackError::Options(format!(
            "{} already holds a pack; remove it or choose another --out",
            opts.out.display()
        )));
    }
    if opts.replicas > 0 && opts.replicate.is_empty() {
        return Err(PackError::Options(
            "--replicas needs a heat histogram naming the experts to copy (--heat-from)"
                .to_string(),
        ));
    }
    Ok(())
}

/// The release's blocks a pack leaves out (MTP layers and the like), with
/// their sizes, for the manifest.
fn left_out_blocks(
    checkpoint: &SafetensorsCheckpoint,
    blocks: std::collections::BTreeMap<crate::model::ExtraBlock, Vec<String>>,
) -> Vec<LeftOut> {
    blocks
        .into_iter()
        .map(|(block, names)| LeftOut {
            block,
            tensors: names.len(),
            bytes: names
                .iter()
                .filter_map(|n| checkpoint.info(n))
                .map(|(_, i)| i.len)
                .sum(),
            first: names.first().cloned().unwrap_or_default(),
        })
        .collect()
}

/// How the pack's experts are stored: the encoding it names, the float type
/// of plain experts, and the quantised encoding they are written in when
/// `--experts` asks for one.
struct Encodings {
    encoding: ExpertEncoding,
    plain: Option<Dtype>,
    quantized: Option<ExpertEncoding>,
    /// The element size plain float records are compressed by (losslessly),
    /// where they are compressed.
    compress_elements: Option<usize>,
}

impl Encodings {
    fn choose(plans: &[LayerPlan], opts: &PackOptions) -> Result<Self, PackError> {
        // A GGUF's layers may store experts in other block types (llama.cpp's
        // Q4_K_M gives some layers' down rows Q6_K): each layer keeps its own,
        // and the pack names the most common.
        let gguf = |e: ExpertEncoding| matches!(e, ExpertEncoding::Gguf { .. });
        let encoding = if plans.iter().all(|p| gguf(p.encoding)) {
            most_common(plans.iter().map(|p| p.encoding))
        } else {
            plans[0].encoding
        };
        if let Some(p) = plans
            .iter()
            .find(|p| p.encoding != encoding && !gguf(p.encoding))
        {
            return Err(PackError::Source(format!(
                "layer {} stores experts as {} but layer {} as {}; one expert dtype per pack",
                p.layer,
                p.encoding.name(),
                plans[0].layer,
                encoding.name()
            )));
        }
        let plain = match encoding {
            ExpertEncoding::Plain(d) if crate::weights::matrix_format(d).is_some() => Some(d),
            ExpertEncoding::Plain(d) => {
                return Err(PackError::Source(format!(
                    "experts are stored as {d:?}, which Longhaul cannot pack: packs hold F32, F16, BF16, FP8 (with block scales) or INT4 (compressed-tensors) experts"
                )));
            }
            _ => None,
        };
        if plain.is_none() && opts.quantization.is_some() {
            return Err(PackError::Options(format!(
                "--experts: the experts are {} already; they are packed as published",
                encoding.name()
            )));
        }
        let quantized = match opts.quantization {
            None => None,
            Some(q) => Some(one_quantized_encoding(plans, q)?),
        };
        let compress_elements = plain
            .filter(|_| opts.compress && opts.quantization.is_none())
            .map(|d| d.size() as usize);
        Ok(Self {
            encoding,
            plain,
            quantized,
            compress_elements,
        })
    }
}

/// One quantised encoding for the pack, each matrix's type chosen to fit its
/// rows.
fn one_quantized_encoding(
    plans: &[LayerPlan],
    q: Quantization,
) -> Result<ExpertEncoding, PackError> {
    let mut chosen: Option<ExpertEncoding> = None;
    for p in plans {
        let e = ExpertEncoding::quantized(q, p.hidden, p.intermediate)
            .map_err(|e| PackError::Options(format!("--experts: layer {}: {e}", p.layer)))?;
        if let Some(c) = chosen.filter(|c| *c != e) {
            return Err(PackError::Options(format!(
                "--experts: layer {} needs {} where earlier layers use {}; one expert encoding per pack",
                p.layer,
                e.name(),
                c.name()
            )));
        }
        chosen = Some(e);
    }
    chosen.ok_or(PackError::Internal("no expert layers to quantise"))
}

/// The pack's folder on each drive, made, as canonical paths.
fn drive_folders(opts: &PackOptions) -> Result<Vec<PathBuf>, PackError> {
    let pack_name = opts
        .out
        .file_name()
        .ok_or_else(|| {
            PackError::Options(format!("--out {} has no folder name", opts.out.display()))
        })?
        .to_os_string();
    opts.drives
        .iter()
        .map(|d| {
            if !d.is_dir() {
                return Err(PackError::Options(format!(
                    "drive folder {} does not exist",
                    d.display()
                )));
            }
            let dir = d.join(&pack_name);
            crate::private::create_dir_all(&dir).map_err(|source| PackError::Io {
                path: dir.clone(),
                source,
            })?;
            fs::canonicalize(&dir).map_err(|source| PackError::Io { path: dir, source })
        })
        .collect()
}

/// The expert records as written: each layer's records, the bytes on the
/// drives (and uncompressed), the quantisation error, and the extent files
/// still under their `.partial` names with the names they take.
struct WrittenExperts {
    layers: Vec<ExpertLayer>,
    bytes: u64,
    plain_bytes: u64,
    error: ErrorSums,
    partials: Vec<(PathBuf, PathBuf)>,
}

/// Writes every layer's expert records over the drives' extent files.
fn write_experts(
    checkpoint: &SafetensorsCheckpoint,
    plans: &[LayerPlan],
    encodings: &Encodings,
    drive_dirs: &[PathBuf],
    opts: &PackOptions,
    report: &dyn Fn(PackProgress),
) -> Result<WrittenExperts, PackError> {
    let expert_total: u64 = plans.iter().map(|p| p.record_len * p.count as u64).sum();
    let room = opts
        .fail_writes_after
        .map(|bytes| std::rc::Rc::new(std::cell::Cell::new(bytes)));
    let mut writers: Vec<ExtentWriter> = drive_dirs
        .iter()
        .enumerate()
        .map(|(drive, dir)| {
            ExtentWriter::new(drive, dir.clone(), opts.alignment, opts.extent_file_bytes)
                .with_room(room.clone())
        })
        .collect();
    let mut out = WrittenExperts {
        layers: Vec::with_capacity(plans.len()),
        bytes: 0,
        plain_bytes: 0,
        error: ErrorSums::default(),
        partials: Vec::new(),
    };
    let mut done = 0u64;
    for plan in plans {
        let mut records = Vec::with_capacity(plan.count);
        let mut prepared = plan.layer_records(checkpoint)?;
        for expert in 0..plan.count {
            let raw = match prepared.as_mut().and_then(|r| r.get_mut(expert)) {
                Some(record) => std::mem::take(record),
                None => plan.record_bytes(checkpoint, expert)?,
            };
            done += raw.len() as u64;
            let bytes = encode_record(raw, plan, expert, encodings, &mut out.error)?;
            records.push(place_record(
                bytes,
                plan.layer,
                expert,
                &mut writers,
                opts,
                encodings,
                &mut out,
            )?);
            report(PackProgress {
                phase: PackPhase::WritingExperts,
                done_bytes: done,
                total_bytes: expert_total,
            });
        }
        out.layers.push(ExpertLayer {
            layer: plan.layer,
            hidden: plan.hidden,
            intermediate: plan.intermediate,
            dtype: (plan.encoding != encodings.encoding).then(|| plan.encoding.name()),
            records,
        });
    }
    for w in writers {
        out.partials.extend(w.finish()?);
    }
    Ok(out)
}

/// One expert's record as the pack stores it: as the checkpoint holds it,
/// or quantised when `--experts` asks.
fn encode_record(
    raw: Vec<u8>,
    plan: &LayerPlan,
    expert: usize,
    encodings: &Encodings,
    error: &mut ErrorSums,
) -> Result<Vec<u8>, PackError> {
    let Some(q) = encodings.quantized else {
        return Ok(raw);
    };
    let name = format!("layer {} expert {expert}", plan.layer);
    let dtype = encodings
        .plain
        .ok_or_else(|| PackError::Options("--experts: only float experts are quantised".into()))?;
    let (bytes, e) = quantize_record(&raw, dtype, plan.hidden, plan.intermediate, q, &name)
        .map_err(|e| PackError::Source(e.to_string()))?;
    error.add(e);
    Ok(bytes)
}

/// Compresses a record where that pays, splits it over the drives (and its
/// copies, for the hottest experts) and writes it: its manifest entry.
fn place_record(
    bytes: Vec<u8>,
    layer: usize,
    expert: usize,
    writers: &mut [ExtentWriter],
    opts: &PackOptions,
    encodings: &Encodings,
    out: &mut WrittenExperts,
) -> Result<Record, PackError> {
    let plain_len = bytes.len() as u64;
    let hash = manifest::hash_hex(&bytes);
    let compressed = match encodings.compress_elements {
        Some(size) => {
            compress::compress(&bytes, size).map_err(|e| PackError::Source(e.to_string()))?
        }
        None => None,
    };
    let stored_len = compressed.as_ref().map(|c| c.len() as u64);
    let bytes = compressed.unwrap_or(bytes);
    out.bytes += bytes.len() as u64;
    out.plain_bytes += plain_len;
    let drives = writers.len();
    let parts = split_count(bytes.len() as u64, opts.split_threshold, drives);
    // Rotate by layer and expert so any k experts of a layer land on every drive.
    let first_drive = (layer + expert) % drives;
    let mut place = |first: usize| -> Result<Vec<Segment>, PackError> {
        chunks(&bytes, parts)
            .enumerate()
            .map(|(j, chunk)| writers[(first + j) % drives].write(chunk))
            .collect()
    };
    let segments = place(first_drive)?;
    let copies = if opts.replicate.contains(&(layer, expert)) {
        opts.replicas
    } else {
        0
    };
    // Copies start on drives spread evenly away from the primary.
    let stride = (drives / (copies + 1)).max(1);
    let replicas = (1..=copies)
        .map(|r| place(first_drive + r * stride))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Record {
        len: plain_len,
        xxh3_128: hash,
        stored_len,
        segments,
        replicas,
    })
}

/// The encoding most layers use (the first of equals).
fn most_common(encodings: impl Iterator<Item = ExpertEncoding>) -> ExpertEncoding {
    let all: Vec<ExpertEncoding> = encodings.collect();
    let count = |e: &ExpertEncoding| all.iter().filter(|x| *x == e).count();
    let mut best = all[0];
    for e in &all {
        if count(e) > count(&best) {
            best = *e;
        }
    }
    best
}

/// How many drives one record is split over.
/// Into how many segments (one per drive) a record is split: as many drives
/// as keep every segment at least `threshold` long.
fn split_count(len: u64, threshold: u64, drives: usize) -> usize {
    ((len / threshold.max(1)) as usize).clamp(1, drives.max(1))
}

/// At most `parts` nearly equal consecutive pieces of `bytes`, each but the
/// last a whole number of direct-I/O blocks: a reader then lands every piece
/// block-aligned in the record's buffer, with no copy.
fn chunks(bytes: &[u8], parts: usize) -> impl Iterator<Item = &[u8]> {
    let size = bytes
        .len()
        .div_ceil(parts.max(1))
        .next_multiple_of(DIRECT_IO_BLOCK);
    bytes.chunks(size.max(1))
}

/// Appends segments to a drive's extent files at aligned offsets.
struct ExtentWriter {
    drive: usize,
    dir: PathBuf,
    alignment: u64,
    max_bytes: u64,
    next_index: usize,
    current: Option<(String, BufWriter<File>, u64)>,
    finished: Vec<(PathBuf, PathBuf)>,
    /// Bytes left before writes fail ([`PackOptions::fail_writes_after`]),
    /// shared by every drive's writer.
    room: Option<std::rc::Rc<std::cell::Cell<u64>>>,
}

impl ExtentWriter {
    fn new(drive: usize, dir: PathBuf, alignment: u64, max_bytes: u64) -> Self {
        Self {
            drive,
            dir,
            alignment,
            max_bytes,
            next_index: 0,
            current: None,
            finished: Vec::new(),
            room: None,
        }
    }

    fn with_room(mut self, room: Option<std::rc::Rc<std::cell::Cell<u64>>>) -> Self {
        self.room = room;
        self
    }

    fn write(&mut self, bytes: &[u8]) -> Result<Segment, PackError> {
        let full = matches!(&self.current, Some((_, _, at)) if *at > 0 && at + bytes.len() as u64 > self.max_bytes);
        if full {
            self.close_current()?;
        }
        if self.current.is_none() {
            let name = format!("experts-{:02}-{:03}.bin", self.drive, self.next_index);
            self.next_index += 1;
            let path = partial_path(&self.dir.join(&name));
            let file =
                crate::private::create(&path).map_err(|source| PackError::Io { path, source })?;
            self.current = Some((name, BufWriter::new(file), 0));
        }
        let (name, file, at) = self
            .current
            .as_mut()
            .ok_or(PackError::Internal("no open extent file"))?;
        let path = self.dir.join(name.as_str());
        let io = |source| PackError::Io {
            path: path.clone(),
            source,
        };
        let offset = *at;
        let padded = (bytes.len() as u64).next_multiple_of(self.alignment);
        if let Some(room) = &self.room {
            claim(room, padded).map_err(io)?;
        }
        file.write_all(bytes).map_err(io)?;
        file.write_all(&vec![0u8; (padded - bytes.len() as u64) as usize])
            .map_err(io)?;
        *at += padded;
        Ok(Segment {
            drive: self.drive,
            file: name.clone(),
            offset,
            len: bytes.len() as u64,
        })
    }

    fn close_current(&mut self) -> Result<(), PackError> {
        if let Some((name, file, _)) = self.current.take() {
            let done = self.dir.join(&name);
            sync(file, &done)?;
            self.finished.push((partial_path(&done), done));
        }
        Ok(())
    }

    /// Closes and syncs every file; returns (partial, final) path pairs.
    fn finish(mut self) -> Result<Vec<(PathBuf, PathBuf)>, PackError> {
        self.close_current()?;
        Ok(self.finished)
    }
}

/// Takes `bytes` from the room left, or fails as a full drive does.
fn claim(room: &std::cell::Cell<u64>, bytes: u64) -> std::io::Result<()> {
    let left = room.get().checked_sub(bytes).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device")
    })?;
    room.set(left);
    Ok(())
}

fn sync(file: BufWriter<File>, path: &Path) -> Result<(), PackError> {
    let io = |source| PackError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = file.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)
}

fn partial_path(done: &Path) -> PathBuf {
    let mut name = done.as_os_str().to_os_string();
    name.push(PARTIAL_SUFFIX);
    PathBuf::from(name)
}

fn write_resident(
    ckpt: &SafetensorsCheckpoint,
    names: &[String],
    path: &Path,
    quantize: Option<Quantization>,
    report: &dyn Fn(PackProgress),
) -> Result<ResidentFile, PackError> {
    let infos: Vec<(&str, &SafetensorsFile, &TensorInfo)> = names
        .iter()
        .filter_map(|n| ckpt.info(n).map(|(f, i)| (n.as_str(), f, i)))
        .collect();
    let spine = |name: &str, info: &TensorInfo| quantize.is_some() && spine_matrix(name, info);
    let mut entries = Vec::with_capacity(infos.len());
    for (name, _, info) in &infos {
        let dtype = info.dtype.name().ok_or_else(|| {
            PackError::Source(format!("tensor `{name}` is stored as {:?}", info.dtype))
        })?;
        let (dtype, len) = if spine(name, info) {
            let elements = info.shape.iter().product::<usize>() as u64;
            let len = Dtype::Blocks(Format::Q8_0)
                .byte_len(elements)
                .ok_or(PackError::Internal(
                    "a spine matrix is not whole Q8_0 blocks",
                ))?;
            ("Q8_0", len)
        } else {
            (dtype, info.len)
        };
        entries.push(TensorEntry {
            name,
            dtype,
            shape: &info.shape,
            len,
        });
    }
    let partial = partial_path(path);
    let io = |source| PackError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut out = BufWriter::new(crate::private::create(&partial).map_err(io)?);
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let header = header_bytes(&entries);
    out.write_all(&header).map_err(io)?;
    hasher.update(&header);
    let total: u64 = infos.iter().map(|(_, _, i)| i.len).sum();
    let mut done = 0;
    let mut size = header.len() as u64;
    let mut error = ErrorSums::default();
    for (name, file, info) in &infos {
        let mut bytes = file
            .read_bytes(info)
            .map_err(|e| PackError::Source(e.to_string()))?;
        if spine(name, info) {
            let (q, e) = quantize_matrix(&bytes, info.dtype, &info.shape, Quantization::Q8_0, name)
                .map_err(|e| PackError::Source(e.to_string()))?;
            error.add(e);
            bytes = q;
        }
        out.write_all(&bytes).map_err(io)?;
        hasher.update(&bytes);
        done += info.len;
        size += bytes.len() as u64;
        report(PackProgress {
            phase: PackPhase::WritingResident,
            done_bytes: done,
            total_bytes: total,
        });
    }
    sync(out, path)?;
    Ok(ResidentFile {
        path: path.to_path_buf(),
        size,
        xxh3_128: format!("{:032x}", hasher.digest128()),
        quantization: quantize.map(|q| QuantizationReport {
            from: "stored width".to_string(),
            requested: Some(q.name().to_string()),
            relative_rms_error: error.relative_rms(),
        }),
    })
}

/// Whether resident tensor `name` is quantised for a lossy spine: float
/// matrices of whole Q8_0 blocks. Routers stay exact — a router that picks
/// other experts changes more than its own rounding — and so do norms,
/// biases and anything already published narrow.
fn spine_matrix(name: &str, info: &TensorInfo) -> bool {
    let router = [".gate.weight", ".router.weight"]
        .iter()
        .any(|r| name.ends_with(r));
    info.shape.len() == 2
        && matches!(info.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16)
        && info.shape[1].is_multiple_of(Quantization::Q8_0.block())
        && name.ends_with(".weight")
        && !router
}

/// Whether the pack at `pack` was made from the checkpoint at `source` as
/// it is now: the same files with the same sizes and hashes. Lets a caller
/// reuse a pack instead of writing it again.
pub fn pack_matches_source(pack: &Path, source: &Path) -> Result<bool, PackError> {
    let manifest = Manifest::read(pack)?;
    let model = ModelSource::open(source).map_err(|e| PackError::Source(e.to_string()))?;
    let now = hash_source(&model, &|_| {})?;
    Ok(now.files == manifest.source.files)
}

fn hash_source(
    model: &ModelSource,
    report: &dyn Fn(PackProgress),
) -> Result<SourceIdentity, PackError> {
    let dir = &model.path;
    let paths = model.identity_files();
    let sizes: Vec<u64> = paths
        .iter()
        .map(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .collect();
    let total: u64 = sizes.iter().sum();
    let mut done = 0;
    let mut files = Vec::with_capacity(paths.len());
    for path in &paths {
        let (size, xxh3_128) = hash_file(path, |n| {
            done += n;
            report(PackProgress {
                phase: PackPhase::HashingSource,
                done_bytes: done,
                total_bytes: total,
            });
        })
        .map_err(|source| PackError::Io {
            path: path.clone(),
            source,
        })?;
        files.push(SourceFile {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            size,
            xxh3_128,
        });
    }
    Ok(SourceIdentity {
        path: fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()),
        files,
    })
}

fn write_manifest(out: &Path, manifest: &Manifest) -> Result<(), PackError> {
    let path = out.join(MANIFEST_FILE);
    let tmp = partial_path(&path);
    let io = |source| PackError::Io {
        path: path.clone(),
        source,
    };
    let text = serde_json::to_vec_pretty(manifest)
        .map_err(|_| PackError::Internal("the manifest could not be serialised"))?;
    let mut file = BufWriter::new(crate::private::create(&tmp).map_err(io)?);
    file.write_all(&text).map_err(io)?;
    sync(file, &path)?;
    fs::rename(&tmp, &path).map_err(io)?;
    // Make the rename itself durable.
    File::open(out).and_then(|d| d.sync_all()).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_whole_blocks_but_the_last() {
        let bytes = vec![0u8; 3 * DIRECT_IO_BLOCK + 100];
        let lens: Vec<usize> = chunks(&bytes, 4).map(<[u8]>::len).collect();
        assert_eq!(
            lens,
            vec![DIRECT_IO_BLOCK, DIRECT_IO_BLOCK, DIRECT_IO_BLOCK, 100]
        );
        let lens: Vec<usize> = chunks(&bytes, 2).map(<[u8]>::len).collect();
        assert_eq!(lens, vec![2 * DIRECT_IO_BLOCK, DIRECT_IO_BLOCK + 100]);
    }

    #[test]
    fn records_split_over_as_many_drives_as_segment_size_allows() {
        assert_eq!(split_count(3 << 20, 512 << 10, 4), 4);
        assert_eq!(split_count(1 << 20, 512 << 10, 4), 2);
        assert_eq!(split_count(100, 512 << 10, 4), 1);
        assert_eq!(split_count(3 << 20, 512 << 10, 1), 1);
    }
}
