//! Measuring a pack's drives with reads of its own extent files, the same
//! kind of reads decoding makes (direct I/O, 4 MiB — about one expert record
//! of a frontier model). The report is kept beside the pack, and dashboards
//! draw it as each drive's ceiling.

use std::path::{Path, PathBuf};

use longhaul_engine::tools::{Manifest, PackError, ProbeReport, StoreConfig, StoreError, probe};

/// Probe reads are this large.
pub const PROBE_CHUNK: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Pack(#[from] PackError),
    #[error("drive {drive}: cannot read {path}: {source}")]
    Extent {
        drive: usize,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Reads up to `limit` bytes from each drive of the pack at `pack` and
/// keeps the report beside it.
pub fn probe_pack(pack: &Path, limit: u64, queue_depth: usize) -> Result<ProbeReport, ProbeError> {
    let manifest = Manifest::read(pack)?;
    let mut files: Vec<Vec<(String, u64)>> = vec![Vec::new(); manifest.drives.len()];
    for (drive, dir) in manifest.drives.iter().enumerate() {
        let mut names: Vec<String> = manifest
            .experts
            .layers
            .iter()
            .flat_map(|l| &l.records)
            .flat_map(|r| &r.segments)
            .filter(|s| s.drive == drive)
            .map(|s| s.file.clone())
            .collect();
        names.sort();
        names.dedup();
        for name in names {
            let path = dir.join(&name);
            let size = std::fs::metadata(&path)
                .map_err(|source| ProbeError::Extent {
                    drive,
                    path: path.clone(),
                    source,
                })?
                .len();
            files[drive].push((name, size));
        }
    }
    let config = StoreConfig {
        direct_io: true,
        queue_depth,
        faults: None,
    };
    let report = probe(&manifest.drives, &files, PROBE_CHUNK, limit, &config)?;
    if let Err(e) = report.save(pack) {
        tracing::warn!("cannot keep the probe in {}: {e}", pack.display());
    }
    Ok(report)
}
