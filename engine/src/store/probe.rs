//! `longhaul drives probe`: the drives' raw read bandwidth, measured with
//! parallel direct reads of a pack's own extent files — the physical ceiling
//! a benchmark is compared against.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{DriveStore, ReadRequest, StoreConfig, StoreError};

/// Reads queued per worker in each wave of the probe.
const PROBE_WAVE_PER_WORKER: usize = 2;

/// Where a pack keeps its drives' last probe, for dashboards to draw as the ceiling.
pub const PROBE_FILE: &str = "longhaul-probe.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeDrive {
    pub path: PathBuf,
    pub bytes: u64,
    pub mb_per_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeReport {
    pub drives: Vec<ProbeDrive>,
    /// Bytes read from all drives at once, divided by the wall time.
    pub aggregate_mb_per_s: f64,
    pub chunk_bytes: u64,
    pub seconds: f64,
}

impl ProbeReport {
    /// Keeps the report next to the pack (a temporary file, then a rename).
    pub fn save(&self, pack: &Path) -> std::io::Result<()> {
        let path = pack.join(PROBE_FILE);
        let tmp = path.with_extension("json.partial");
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, path)
    }

    /// The pack's last probe, if it has one that reads.
    pub fn load(pack: &Path) -> Option<Self> {
        let text =
            crate::regular::read_text(&pack.join(PROBE_FILE), crate::regular::SETTINGS_LIMIT)
                .ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Seconds per byte at the aggregate rate measured, if this probe read
    /// exactly `drives` (a probe of other drives says nothing of these).
    pub fn seconds_per_byte(&self, drives: &[PathBuf]) -> Option<f64> {
        let same = self.drives.iter().map(|d| &d.path).eq(drives.iter());
        (same && self.aggregate_mb_per_s > 0.0).then(|| 1.0 / (self.aggregate_mb_per_s * 1e6))
    }
}

/// Reads up to `limit` bytes from each drive's `files` (name, size) in
/// `chunk`-sized aligned pieces, all drives at once.
pub fn probe(
    drives: &[PathBuf],
    files: &[Vec<(String, u64)>],
    chunk: u64,
    limit: u64,
    config: &StoreConfig,
) -> Result<ProbeReport, StoreError> {
    let store = DriveStore::open(drives, config)?;
    let mut per_drive = vec![0u64; drives.len()];
    let mut queues: Vec<Vec<ReadRequest>> = Vec::with_capacity(drives.len());
    for (drive, list) in files.iter().enumerate() {
        let mut queue = Vec::new();
        'files: for (file, size) in list {
            let mut offset = 0;
            while offset < *size {
                if per_drive[drive] >= limit {
                    break 'files;
                }
                let len = chunk.min(size - offset);
                queue.push(ReadRequest {
                    drive,
                    file: file.clone(),
                    offset,
                    len,
                });
                per_drive[drive] += len;
                offset += len;
            }
        }
        queues.push(queue);
    }
    // Round-robin over drives, so every wave keeps all of them busy.
    let longest = queues.iter().map(Vec::len).max().unwrap_or(0);
    let requests: Vec<ReadRequest> = (0..longest)
        .flat_map(|i| queues.iter().filter_map(move |q| q.get(i).cloned()))
        .collect();
    let started = Instant::now();
    // In waves, so memory stays at a few chunks per drive whatever the limit.
    let wave = (drives.len() * config.queue_depth.max(1) * PROBE_WAVE_PER_WORKER).max(1);
    for batch in requests.chunks(wave) {
        store.read_each(batch, |_, _| {})?;
    }
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    let total: u64 = per_drive.iter().sum();
    Ok(ProbeReport {
        drives: drives
            .iter()
            .zip(&per_drive)
            .map(|(path, &bytes)| ProbeDrive {
                path: path.clone(),
                bytes,
                mb_per_s: bytes as f64 / 1e6 / seconds,
            })
            .collect(),
        aggregate_mb_per_s: total as f64 / 1e6 / seconds,
        chunk_bytes: chunk,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_prices_bytes_only_on_the_drives_it_read() {
        let drive = |p: &str| ProbeDrive {
            path: PathBuf::from(p),
            bytes: 1 << 28,
            mb_per_s: 200.0,
        };
        let report = ProbeReport {
            drives: vec![drive("/a"), drive("/b")],
            aggregate_mb_per_s: 800.0,
            chunk_bytes: 4 << 20,
            seconds: 0.7,
        };
        let same = [PathBuf::from("/a"), PathBuf::from("/b")];
        assert_eq!(report.seconds_per_byte(&same), Some(1.0 / 800e6));
        assert_eq!(report.seconds_per_byte(&same[..1]), None);
        assert_eq!(
            report.seconds_per_byte(&[PathBuf::from("/b"), PathBuf::from("/a")]),
            None
        );
    }
}
