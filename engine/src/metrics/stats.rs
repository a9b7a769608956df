//! Every counter the engine keeps, read at one moment: what dashboards,
//! `run` and `bench` report. One plain value, so that nothing outside the
//! engine reaches into the cache, the store or the pilot for its figures.

use std::time::Duration;

use crate::cache::{CacheCounters, EvictionPolicy, PolicyReport};
use crate::pilot::PilotCounters;
use crate::store::DriveSnapshot;

#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub cache: CacheCounters,
    /// How well next-layer predictions matched what layers asked for.
    pub pilot: PilotCounters,
    pub drives: Vec<DriveSnapshot>,
    /// Demand lookups that found their expert already on its way.
    pub joined_flights: u64,
    /// Records read from the drives, prefetches included.
    pub records_read: u64,
    /// Wall time during which any drive was reading.
    pub drives_busy: Duration,
    /// Bytes of record buffers allocated, and the most held at once.
    pub buffer_bytes: u64,
    pub peak_buffer_bytes: u64,
    /// Record buffers allocated fresh (the kernel zeroes each page on first
    /// touch) and reused from the pool.
    pub buffers_allocated: u64,
    pub buffers_reused: u64,
    /// Time spent restoring compressed records: by the readers as records
    /// land, and by the model's thread for hits the cache keeps packed.
    pub decompress_seconds: f64,
    /// The model's thread's share of it.
    pub restore_seconds: f64,
    /// Time spent waiting for expert reads.
    pub stall_seconds: f64,
    /// Bytes of one expert as held in the cache, and of the largest record.
    pub resident_expert_bytes: u64,
    pub largest_record_bytes: u64,
    /// The eviction policy in use, and the latest replays of the pack's
    /// routing trace against every candidate.
    pub policy: EvictionPolicy,
    pub policy_report: Option<PolicyReport>,
}

impl EngineStats {
    /// Bytes read from all drives.
    pub fn drive_bytes(&self) -> u64 {
        self.drives.iter().map(|d| d.bytes).sum()
    }
}
