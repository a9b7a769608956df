//! Reading expert records from drives.
//!
//! Each drive has its own worker threads (the queue depth), so reads to
//! different drives proceed in parallel and one slow drive does not hold up
//! the others. Reads are positional, into reused buffers aligned for direct
//! I/O (`O_DIRECT`), so the page cache neither helps nor hides anything; a
//! file system that refuses direct I/O gets buffered reads instead, and the
//! store says so once. No mmap: a drive that disappears mid-run becomes an
//! error naming the drive, the file and the offset, not a SIGBUS.
//!
//! The store sees only paths, offsets and bytes, never tensors.

pub mod probe;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use serde::Serialize;

/// Block size direct I/O lengths and buffer addresses are aligned to.
pub const DIRECT_IO_BLOCK: usize = 4096;

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Bypass the page cache when the file system allows it.
    pub direct_io: bool,
    /// Reads in flight per drive (one worker thread each).
    pub queue_depth: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            direct_io: true,
            queue_depth: 2,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("drive {drive} ({path}): folder is missing or unreadable: {reason}")]
    DriveMissing {
        drive: usize,
        path: PathBuf,
        reason: String,
    },
    #[error("drive {drive}: reading {path} at offset {offset}: {reason}")]
    Read {
        drive: usize,
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error(
        "drive {drive}: short read of {path} at offset {offset}: wanted {wanted} bytes, got {got}"
    )]
    ShortRead {
        drive: usize,
        path: PathBuf,
        offset: u64,
        wanted: u64,
        got: u64,
    },
    #[error("drive {drive}: its reader stopped")]
    WorkerGone { drive: usize },
}

/// One read: `len` bytes at `offset` of `file` in drive `drive`'s folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    pub drive: usize,
    pub file: String,
    pub offset: u64,
    pub len: u64,
}

/// Counters for one drive, updated by its workers.
#[derive(Debug, Default)]
pub struct DriveCounters {
    pub bytes: AtomicU64,
    pub reads: AtomicU64,
    pub errors: AtomicU64,
    /// Total time spent in reads, in microseconds.
    pub busy_micros: AtomicU64,
    /// Bytes queued or being read, for choosing between copies of a record.
    pub pending: AtomicU64,
    /// Read latencies: bucket `i` counts reads that took under 2^i µs.
    pub latency: [AtomicU64; LATENCY_BUCKETS],
}

/// Latency buckets: powers of two of microseconds, up to about 36 minutes.
pub const LATENCY_BUCKETS: usize = 32;

impl DriveCounters {
    pub fn record_latency(&self, micros: u64) {
        let bucket = (u64::BITS - micros.leading_zeros()) as usize;
        self.latency[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }
}

/// A copy of one drive's counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct DriveSnapshot {
    pub path: PathBuf,
    pub bytes: u64,
    pub reads: u64,
    pub errors: u64,
    pub busy_micros: u64,
    /// Bytes asked of the drive and not yet read.
    pub pending_bytes: u64,
    /// Reads per latency bucket (see [`DriveCounters::latency`]).
    pub latency_buckets: Vec<u64>,
}

impl DriveSnapshot {
    /// The read latency below which `q` (0–1) of reads completed, in
    /// milliseconds (the upper edge of its power-of-two bucket).
    pub fn latency_quantile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.latency_buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let target = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.latency_buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                return Some((1u64 << i) as f64 / 1000.0);
            }
        }
        None
    }
}

struct Job {
    path: PathBuf,
    offset: u64,
    len: u64,
    slot: usize,
    reply: mpsc::Sender<(usize, Result<Vec<u8>, StoreError>)>,
}

struct Drive {
    path: PathBuf,
    jobs: mpsc::Sender<Job>,
    counters: Arc<DriveCounters>,
    workers: Vec<JoinHandle<()>>,
}

/// Readers for every drive of a pack.
pub struct DriveStore {
    drives: Vec<Drive>,
}

impl DriveStore {
    /// Starts workers for each drive folder; a missing folder is an error naming it.
    pub fn open(paths: &[PathBuf], config: &StoreConfig) -> Result<Self, StoreError> {
        let warned = Arc::new(AtomicBool::new(false));
        let mut drives = Vec::with_capacity(paths.len());
        for (index, path) in paths.iter().enumerate() {
            std::fs::read_dir(path).map_err(|e| StoreError::DriveMissing {
                drive: index,
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            let counters = Arc::new(DriveCounters::default());
            let workers = (0..config.queue_depth.max(1))
                .map(|_| {
                    let ctx = worker::Context {
                        drive: index,
                        direct_io: config.direct_io,
                        jobs: Arc::clone(&rx),
                        counters: Arc::clone(&counters),
                        warned_buffered: Arc::clone(&warned),
                    };
                    std::thread::spawn(move || worker::run(ctx))
                })
                .collect();
            drives.push(Drive {
                path: path.clone(),
                jobs: tx,
                counters,
                workers,
            });
        }
        Ok(Self { drives })
    }

    /// Reads every request, in parallel across drives; results in request order.
    pub fn read_all(&self, requests: &[ReadRequest]) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); requests.len()];
        self.read_each(requests, |slot, bytes| {
            out[slot] = bytes;
            Ok(())
        })?;
        Ok(out)
    }

    /// Issues every request at once and hands each result to `done` as soon
    /// as it arrives (in completion order, with its index in `requests`), so
    /// the caller can work on early results while later reads are in flight.
    /// Stops at the first error, its own or the store's.
    pub fn read_each<E: From<StoreError>>(
        &self,
        requests: &[ReadRequest],
        mut done: impl FnMut(usize, Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let (tx, rx) = mpsc::channel();
        for (slot, r) in requests.iter().enumerate() {
            let drive = self
                .drives
                .get(r.drive)
                .ok_or(StoreError::WorkerGone { drive: r.drive })?;
            let job = Job {
                path: drive.path.join(&r.file),
                offset: r.offset,
                len: r.len,
                slot,
                reply: tx.clone(),
            };
            drive.counters.pending.fetch_add(r.len, Ordering::Relaxed);
            drive
                .jobs
                .send(job)
                .map_err(|_| StoreError::WorkerGone { drive: r.drive })?;
        }
        drop(tx);
        let mut received = 0;
        for (slot, result) in rx.iter() {
            done(slot, result?)?;
            received += 1;
        }
        if received < requests.len() {
            let drive = requests.first().map_or(0, |r| r.drive);
            return Err(StoreError::WorkerGone { drive }.into());
        }
        Ok(())
    }

    /// Bytes asked of each drive and not yet read.
    pub fn pending_bytes(&self) -> Vec<u64> {
        self.drives
            .iter()
            .map(|d| d.counters.pending.load(Ordering::Relaxed))
            .collect()
    }

    pub fn snapshot(&self) -> Vec<DriveSnapshot> {
        self.drives
            .iter()
            .map(|d| DriveSnapshot {
                path: d.path.clone(),
                bytes: d.counters.bytes.load(Ordering::Relaxed),
                reads: d.counters.reads.load(Ordering::Relaxed),
                errors: d.counters.errors.load(Ordering::Relaxed),
                busy_micros: d.counters.busy_micros.load(Ordering::Relaxed),
                pending_bytes: d.counters.pending.load(Ordering::Relaxed),
                latency_buckets: d
                    .counters
                    .latency
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect(),
            })
            .collect()
    }
}

impl Drop for DriveStore {
    fn drop(&mut self) {
        for drive in self.drives.drain(..) {
            drop(drive.jobs);
            for w in drive.workers {
                let _ = w.join();
            }
        }
    }
}
