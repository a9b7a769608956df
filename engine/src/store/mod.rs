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

pub use faults::StoreFaults;
pub mod faults;
pub mod latency;
pub mod probe;
mod queue;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::aligned::AlignedBytes;
use queue::DriveQueue;

/// Block size direct I/O lengths and buffer addresses are aligned to.
pub const DIRECT_IO_BLOCK: usize = 4096;

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Bypass the page cache when the file system allows it.
    pub direct_io: bool,
    /// Reads in flight per drive (one reader thread each).
    pub queue_depth: usize,
    /// Injected failures, for tests; `None` in normal use.
    pub faults: Option<Arc<StoreFaults>>,
}

/// Reads in flight per drive. Two left emulated drives capped at 200 MB/s
/// idle between bursts (55–70 MB/s each while a token waited); four keep a
/// read queued behind each one being served.
pub const DEFAULT_QUEUE_DEPTH: usize = 4;

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            direct_io: true,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            faults: None,
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
    #[error("cannot allocate a read buffer: {0}")]
    Alloc(String),
}

/// One read: `len` bytes at `offset` of `file` in drive `drive`'s folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    pub drive: usize,
    pub file: String,
    pub offset: u64,
    pub len: u64,
}

/// Which queue a read joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// The model is waiting for it.
    Demand,
    /// A guess about what comes next; served when no demand read waits.
    Prefetch,
}

/// Where a segment lands and who hears about it: the buffer of a record
/// being assembled, and the code that checks it once all segments are in.
pub trait ReadTarget: Send + Sync {
    /// The buffer segments are read into.
    fn buffer(&self) -> &AlignedBytes;
    /// Called on the reader thread when a segment has landed or failed.
    fn segment_done(&self, result: Result<(), StoreError>);
}

/// A read of one segment straight into its place in a target's buffer.
pub struct SegmentRead {
    pub request: ReadRequest,
    /// Offset of the segment in the target's buffer.
    pub at: usize,
    /// Bytes of the buffer from `at` this read may write (at least `len`):
    /// a direct read in whole blocks may spill past `len` into them. Segments
    /// of one buffer never share bytes, so several readers fill one buffer.
    pub room: usize,
    /// Groups the segments of one record, for promotion.
    pub ticket: u64,
    pub target: Arc<dyn ReadTarget>,
}

/// Time during which at least one read was in progress.
#[derive(Debug, Default)]
struct Activity {
    active: u32,
    since: Option<Instant>,
    busy: Duration,
}

impl Activity {
    fn start(&mut self) {
        if self.active == 0 {
            self.since = Some(Instant::now());
        }
        self.active += 1;
    }

    fn stop(&mut self) {
        self.active = self.active.saturating_sub(1);
        if self.active == 0
            && let Some(t) = self.since.take()
        {
            self.busy += t.elapsed();
        }
    }

    fn busy_now(&self) -> Duration {
        self.busy + self.since.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

/// Counters for one drive, updated by its readers.
#[derive(Debug, Default)]
pub struct DriveCounters {
    pub bytes: AtomicU64,
    pub reads: AtomicU64,
    pub errors: AtomicU64,
    /// Bytes queued or being read, for choosing between copies of a record.
    pub pending: AtomicU64,
    /// Times of the last successful reads.
    pub latency: latency::LatencyWindow,
    /// Wall time with at least one read in progress on this drive.
    activity: Mutex<Activity>,
}

impl DriveCounters {
    fn busy(&self) -> Duration {
        self.activity
            .lock()
            .map(|a| a.busy_now())
            .unwrap_or_default()
    }
}

/// A copy of one drive's counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct DriveSnapshot {
    pub path: PathBuf,
    pub bytes: u64,
    pub reads: u64,
    pub errors: u64,
    /// Wall time with at least one read in progress, in microseconds.
    pub busy_micros: u64,
    /// Bytes asked of the drive and not yet read.
    pub pending_bytes: u64,
    /// The last successful reads' times (see [`latency`]).
    pub latency: latency::Latencies,
}

struct Drive {
    path: PathBuf,
    queue: Arc<DriveQueue>,
    counters: Arc<DriveCounters>,
    workers: Vec<JoinHandle<()>>,
}

/// Readers for every drive of a pack.
pub struct DriveStore {
    drives: Vec<Drive>,
    /// Wall time with a read in progress on any drive.
    any: Arc<Mutex<Activity>>,
}

impl DriveStore {
    /// Starts readers for each drive folder; a missing folder is an error naming it.
    pub fn open(paths: &[PathBuf], config: &StoreConfig) -> Result<Self, StoreError> {
        let warned = Arc::new(AtomicBool::new(false));
        let any = Arc::new(Mutex::new(Activity::default()));
        let mut drives = Vec::with_capacity(paths.len());
        for (index, path) in paths.iter().enumerate() {
            std::fs::read_dir(path).map_err(|e| StoreError::DriveMissing {
                drive: index,
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let queue = Arc::new(DriveQueue::default());
            let counters = Arc::new(DriveCounters::default());
            let workers = (0..config.queue_depth.max(1))
                .map(|_| {
                    let ctx = worker::Context {
                        drive: index,
                        dir: path.clone(),
                        direct_io: config.direct_io,
                        queue: Arc::clone(&queue),
                        counters: Arc::clone(&counters),
                        any: Arc::clone(&any),
                        warned_buffered: Arc::clone(&warned),
                        faults: config.faults.clone(),
                    };
                    std::thread::spawn(move || worker::run(ctx))
                })
                .collect();
            drives.push(Drive {
                path: path.clone(),
                queue,
                counters,
                workers,
            });
        }
        Ok(Self { drives, any })
    }

    /// Queues a segment read. Its target hears of the result on a reader thread.
    pub fn submit(&self, read: SegmentRead, priority: Priority) -> Result<(), StoreError> {
        let drive = read.request.drive;
        let d = self
            .drives
            .get(drive)
            .ok_or(StoreError::WorkerGone { drive })?;
        let len = read.request.len;
        d.counters.pending.fetch_add(len, Ordering::Relaxed);
        if !d.queue.push(read, priority) {
            d.counters.pending.fetch_sub(len, Ordering::Relaxed);
            return Err(StoreError::WorkerGone { drive });
        }
        Ok(())
    }

    /// Moves the queued prefetch segments of `ticket` ahead of other prefetches.
    pub fn promote(&self, ticket: u64) {
        for d in &self.drives {
            d.queue.promote(ticket);
        }
    }

    /// Reads every request, in parallel across drives; results in request order.
    pub fn read_all(&self, requests: &[ReadRequest]) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); requests.len()];
        self.read_each(requests, |slot, bytes| out[slot] = bytes.to_vec())?;
        Ok(out)
    }

    /// Reads every request, in parallel across drives, each into its own
    /// buffer, and shows each to `seen` (with its index) as it lands.
    pub fn read_each(
        &self,
        requests: &[ReadRequest],
        mut seen: impl FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        let (tx, rx) = mpsc::channel();
        for (slot, r) in requests.iter().enumerate() {
            let len = usize::try_from(r.len)
                .map_err(|_| StoreError::Alloc(format!("{} bytes", r.len)))?;
            let buffer = AlignedBytes::zeroed(len, DIRECT_IO_BLOCK)
                .map_err(|e| StoreError::Alloc(e.to_string()))?;
            let room = buffer.capacity();
            let target = Arc::new_cyclic(|this| Collect {
                buffer,
                slot,
                done: Mutex::new(Some(tx.clone())),
                this: this.clone(),
            });
            self.submit(
                SegmentRead {
                    request: r.clone(),
                    at: 0,
                    room,
                    ticket: 0,
                    target,
                },
                Priority::Demand,
            )?;
        }
        drop(tx);
        let mut received = 0;
        for (slot, target, result) in rx.iter() {
            result?;
            seen(slot, target.buffer.as_slice());
            received += 1;
        }
        if received < requests.len() {
            let drive = requests.first().map_or(0, |r| r.drive);
            return Err(StoreError::WorkerGone { drive });
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

    /// Wall time so far during which any drive was reading.
    pub fn busy_any(&self) -> Duration {
        self.any.lock().map(|a| a.busy_now()).unwrap_or_default()
    }

    pub fn snapshot(&self) -> Vec<DriveSnapshot> {
        self.drives
            .iter()
            .map(|d| DriveSnapshot {
                path: d.path.clone(),
                bytes: d.counters.bytes.load(Ordering::Relaxed),
                reads: d.counters.reads.load(Ordering::Relaxed),
                errors: d.counters.errors.load(Ordering::Relaxed),
                busy_micros: d.counters.busy().as_micros() as u64,
                pending_bytes: d.counters.pending.load(Ordering::Relaxed),
                latency: d.counters.latency.copy(),
            })
            .collect()
    }
}

/// A finished whole read: its index, its buffer and how it went.
type Collected = (usize, Arc<Collect>, Result<(), StoreError>);

/// A whole read into its own buffer, handed back through a channel.
struct Collect {
    buffer: AlignedBytes,
    slot: usize,
    done: Mutex<Option<mpsc::Sender<Collected>>>,
    this: std::sync::Weak<Collect>,
}

impl ReadTarget for Collect {
    fn buffer(&self) -> &AlignedBytes {
        &self.buffer
    }

    fn segment_done(&self, result: Result<(), StoreError>) {
        let this = self.this.upgrade();
        let tx = self.done.lock().ok().and_then(|mut d| d.take());
        if let (Some(this), Some(tx)) = (this, tx) {
            // The requester may have given up; nothing to do then.
            let _ = tx.send((self.slot, this, result));
        }
    }
}

impl Drop for DriveStore {
    fn drop(&mut self) {
        for d in &self.drives {
            d.queue.close();
        }
        for drive in self.drives.drain(..) {
            for w in drive.workers {
                let _ = w.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One buffer filled by several segments, each reporting on a channel.
    struct Record {
        buffer: AlignedBytes,
        done: Mutex<mpsc::Sender<Result<(), StoreError>>>,
    }

    impl ReadTarget for Record {
        fn buffer(&self) -> &AlignedBytes {
            &self.buffer
        }

        fn segment_done(&self, result: Result<(), StoreError>) {
            let _ = self.done.lock().unwrap().send(result);
        }
    }

    /// Lands segments of one file in one buffer the way records are
    /// assembled: block-aligned ones straight in, others through a bounce
    /// buffer, and with direct I/O off through the page cache.
    #[test]
    fn segments_land_in_their_place_however_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..5 * DIRECT_IO_BLOCK)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        // (file offset, length, place in the buffer)
        let cases = [
            (0, 2 * DIRECT_IO_BLOCK, 0),
            (DIRECT_IO_BLOCK, 100, 2 * DIRECT_IO_BLOCK),
            (17, 3000, 2 * DIRECT_IO_BLOCK + 100),
            (
                4 * DIRECT_IO_BLOCK,
                DIRECT_IO_BLOCK,
                3 * DIRECT_IO_BLOCK + 3100,
            ),
        ];
        for direct_io in [true, false] {
            let config = StoreConfig {
                direct_io,
                queue_depth: 2,
                faults: None,
            };
            let store = DriveStore::open(&[dir.path().to_path_buf()], &config).unwrap();
            let (tx, rx) = mpsc::channel();
            let target = Arc::new(Record {
                buffer: AlignedBytes::zeroed(5 * DIRECT_IO_BLOCK, DIRECT_IO_BLOCK).unwrap(),
                done: Mutex::new(tx),
            });
            for (i, &(offset, len, at)) in cases.iter().enumerate() {
                let room = cases
                    .get(i + 1)
                    .map_or(target.buffer.capacity() - at, |c| c.2 - at);
                let read = SegmentRead {
                    request: ReadRequest {
                        drive: 0,
                        file: "f".to_string(),
                        offset: offset as u64,
                        len: len as u64,
                    },
                    at,
                    room,
                    ticket: 0,
                    target: Arc::clone(&target) as Arc<dyn ReadTarget>,
                };
                store.submit(read, Priority::Prefetch).unwrap();
            }
            for _ in 0..cases.len() {
                rx.recv().unwrap().unwrap();
            }
            let whole = target.buffer.as_slice();
            for &(offset, len, at) in &cases {
                assert_eq!(
                    &whole[at..at + len],
                    &data[offset..offset + len],
                    "direct {direct_io}: {len} bytes from {offset} at {at}"
                );
            }
            let s = &store.snapshot()[0];
            assert_eq!(s.reads, cases.len() as u64);
            assert_eq!(s.pending_bytes, 0);
        }
    }

    #[test]
    fn reading_past_the_end_is_a_short_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), [1u8; 100]).unwrap();
        let store = DriveStore::open(&[dir.path().to_path_buf()], &StoreConfig::default()).unwrap();
        let err = store
            .read_all(&[ReadRequest {
                drive: 0,
                file: "f".to_string(),
                offset: 0,
                len: 200,
            }])
            .unwrap_err();
        assert!(
            matches!(err, StoreError::ShortRead { got: 100, .. }),
            "{err}"
        );
    }
}
