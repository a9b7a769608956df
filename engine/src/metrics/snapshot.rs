//! Metrics snapshots: what the service streams to dashboards once a second.
//!
//! Counters only ever grow; a [`MetricsSampler`] remembers the previous
//! sample so that rates (MB/s per drive) cover the time since then.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::EngineStats;
use crate::cache::{CacheCounters, EvictionPolicy, PolicyReport};
use crate::pilot::PilotCounters;
use crate::store::DriveSnapshot;

#[derive(Debug, Clone, Serialize, PartialEq, ts_rs::TS)]
pub struct DriveMetrics {
    pub path: PathBuf,
    pub bytes: u64,
    pub reads: u64,
    pub errors: u64,
    /// Read rate since the previous sample.
    pub mb_per_s: f64,
    /// Share of the time since the previous sample the drive was reading.
    pub busy_share: f64,
    /// Measured over the reads that finished since the previous sample;
    /// `None` when none did.
    pub latency_p50_ms: Option<f64>,
    pub latency_p90_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq, ts_rs::TS)]
pub struct MetricsSnapshot {
    /// Seconds covered by the rates (since the previous sample, or since the sampler began).
    pub interval_seconds: f64,
    pub drives: Vec<DriveMetrics>,
    pub cache: CacheCounters,
    /// Hits over lookups, since the model was opened.
    pub hit_rate: f64,
    /// Time the model spent waiting for expert reads, since it was opened.
    pub stall_seconds: f64,
    /// How well next-layer predictions matched, since the model was opened.
    pub pilot: PilotCounters,
    /// Share of asked-for experts that had been predicted.
    pub prefetch_recall: Option<f64>,
    /// The eviction policy in use, and the latest replays of the pack's
    /// routing trace that it was chosen from.
    #[ts(type = "string")]
    pub policy: EvictionPolicy,
    pub policy_report: Option<PolicyReport>,
}

/// Turns growing counters into per-interval rates.
pub struct MetricsSampler {
    last: (Instant, Vec<DriveSnapshot>),
}

impl MetricsSampler {
    pub fn new(stats: &EngineStats) -> Self {
        Self {
            last: (Instant::now(), stats.drives.clone()),
        }
    }

    pub fn sample(&mut self, stats: &EngineStats) -> MetricsSnapshot {
        let now = Instant::now();
        let drives = stats.drives.clone();
        let seconds = now.duration_since(self.last.0).as_secs_f64().max(1e-9);
        let metrics = drives
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let before = self.last.1.get(i).map_or(0, |p| p.bytes);
                let busy_before = self.last.1.get(i).map_or(0, |p| p.busy_micros);
                let reads_before = self.last.1.get(i).map_or(0, |p| p.latency.recorded);
                let q = d
                    .latency
                    .quantiles_ms_since(reads_before, &[0.5, 0.9, 0.99]);
                let at = |k: usize| q.as_ref().map(|v| v[k]);
                DriveMetrics {
                    path: d.path.clone(),
                    bytes: d.bytes,
                    reads: d.reads,
                    errors: d.errors,
                    mb_per_s: d.bytes.saturating_sub(before) as f64 / 1e6 / seconds,
                    busy_share: (d.busy_micros.saturating_sub(busy_before) as f64 / 1e6 / seconds)
                        .min(1.0),
                    latency_p50_ms: at(0),
                    latency_p90_ms: at(1),
                    latency_p99_ms: at(2),
                }
            })
            .collect();
        self.last = (now, drives);
        let (cache, pilot) = (stats.cache, stats.pilot);
        MetricsSnapshot {
            prefetch_recall: pilot.recall(),
            pilot,
            interval_seconds: seconds,
            drives: metrics,
            hit_rate: cache.hits as f64 / (cache.hits + cache.misses).max(1) as f64,
            cache,
            stall_seconds: stats.stall_seconds,
            policy: stats.policy,
            policy_report: stats.policy_report.clone(),
        }
    }
}
