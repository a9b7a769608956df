//! `longhaul pack --verify`: re-read every record and the resident file and
//! check them against the manifest's checksums.

use std::path::Path;

use serde::Serialize;

use super::PackError;
use super::compress;
use super::encoding::ExpertEncoding;
use super::manifest::{Manifest, Record, Segment, hash_file, hash_hex};
use crate::store::{DriveStore, StoreConfig};

#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Record copies checked (a replicated record counts once per copy).
    pub records: usize,
    pub record_bytes: u64,
    pub resident_bytes: u64,
    /// One line per problem found; empty when the pack is intact.
    pub problems: Vec<String>,
}

/// A record's plain bytes: as read, or restored when stored compressed.
fn restore(stored: &[u8], record: &Record, element: Option<usize>) -> Result<Vec<u8>, String> {
    if record.stored_len.is_none() {
        return Ok(stored.to_vec());
    }
    let size = element.ok_or("a compressed record in a quantised pack")?;
    let len = usize::try_from(record.len).map_err(|_| "record too large".to_string())?;
    let mut plain = vec![0u8; len];
    compress::decompress(stored, size, &mut plain)
        .map_err(|e| format!("cannot restore the compressed record: {e}"))?;
    Ok(plain)
}

/// Checks every record and the resident file; `report` gets (done, total) bytes.
pub fn verify_pack(pack: &Path, report: &dyn Fn(u64, u64)) -> Result<VerifyReport, PackError> {
    let manifest = Manifest::read(pack)?;
    let store = DriveStore::open(&manifest.drives, &StoreConfig::default())
        .map_err(|e| PackError::Options(e.to_string()))?;
    let total: u64 = manifest
        .experts
        .layers
        .iter()
        .flat_map(|l| &l.records)
        .map(|r| r.stored() * r.placements().count() as u64)
        .sum::<u64>()
        + manifest.resident.size;
    let element = ExpertEncoding::parse(&manifest.experts.dtype).and_then(|e| e.element_bytes());
    let mut out = VerifyReport::default();
    let mut done = 0;
    for layer in &manifest.experts.layers {
        for (id, record) in layer.records.iter().enumerate() {
            for (copy, segments) in record.placements().enumerate() {
                let requests: Vec<_> = segments.iter().map(Segment::request).collect();
                let which = if copy == 0 {
                    String::new()
                } else {
                    format!(" (copy {copy})")
                };
                match store.read_all(&requests) {
                    Ok(parts) => {
                        let stored: Vec<u8> = parts.into_iter().flatten().collect();
                        let bytes = match restore(&stored, record, element) {
                            Ok(bytes) => bytes,
                            Err(e) => {
                                out.problems
                                    .push(format!("layer {} expert {id}{which}: {e}", layer.layer));
                                Vec::new()
                            }
                        };
                        if !bytes.is_empty() && hash_hex(&bytes) != record.xxh3_128 {
                            let at = segments
                                .first()
                                .map(|s| {
                                    format!("drive {} {} at offset {}", s.drive, s.file, s.offset)
                                })
                                .unwrap_or_default();
                            out.problems.push(format!(
                                "layer {} expert {id}{which}: checksum mismatch ({at})",
                                layer.layer
                            ));
                        }
                    }
                    Err(e) => out
                        .problems
                        .push(format!("layer {} expert {id}{which}: {e}", layer.layer)),
                }
                out.records += 1;
                out.record_bytes += record.len;
                done += record.stored();
                report(done, total);
            }
        }
    }
    match hash_file(&manifest.resident.path, |n| {
        done += n;
        report(done, total);
    }) {
        Ok((size, hash))
            if size == manifest.resident.size && hash == manifest.resident.xxh3_128 => {}
        Ok(_) => out.problems.push(format!(
            "{}: checksum or size mismatch",
            manifest.resident.path.display()
        )),
        Err(e) => out
            .problems
            .push(format!("{}: {e}", manifest.resident.path.display())),
    }
    out.resident_bytes = manifest.resident.size;
    out.problems.extend(missing_records(&manifest));
    Ok(out)
}

/// Layers and experts the resident weights' routers choose from but the
/// manifest does not list (a manifest with layers or records removed reads
/// fine record by record; the routers say what must be there).
fn missing_records(manifest: &Manifest) -> Vec<String> {
    let resident = match crate::weights::SafetensorsCheckpoint::open_files(
        manifest.resident.path.parent().unwrap_or(Path::new(".")),
        vec![manifest.resident.path.clone()],
    ) {
        Ok(r) => r,
        Err(e) => return vec![format!("{}: {e}", manifest.resident.path.display())],
    };
    let Ok(router) =
        regex::Regex::new(r"(?:^|\.)(?:layers|blocks)\.(\d+)\.[A-Za-z_]+\.gate\.weight$")
    else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    for name in resident.names() {
        let Some(layer) = router
            .captures(name)
            .and_then(|c| c[1].parse::<usize>().ok())
        else {
            continue;
        };
        let Some(&experts) =
            crate::weights::TensorSource::shape(&resident, name).and_then(|s| s.first())
        else {
            continue;
        };
        match manifest.experts.layers.iter().find(|l| l.layer == layer) {
            None => problems.push(format!(
                "layer {layer}: its router ({name}) chooses among {experts} experts, but the manifest lists no records for the layer"
            )),
            Some(l) if l.records.len() != experts => problems.push(format!(
                "layer {layer}: its router ({name}) chooses among {experts} experts, but the manifest lists {} records",
                l.records.len()
            )),
            Some(_) => {}
        }
    }
    problems
}

/// Checks the resident file against the manifest's size and checksum, as
/// loading does before any of it is used; `progress` gets bytes as read.
pub fn check_resident(manifest: &Manifest, progress: impl FnMut(u64)) -> Result<(), PackError> {
    let r = &manifest.resident;
    let (found_size, found) = hash_file(&r.path, progress).map_err(|source| PackError::Io {
        path: r.path.clone(),
        source,
    })?;
    if found_size == r.size && found == r.xxh3_128 {
        return Ok(());
    }
    Err(PackError::ResidentCorrupt {
        path: r.path.clone(),
        size: r.size,
        expected: r.xxh3_128.clone(),
        found_size,
        found,
    })
}
