//! Metrics snapshots: what the service streams to dashboards once a second.
//!
//! Counters only ever grow; a [`MetricsSampler`] remembers the previous
//! sample so that rates (MB/s per drive) cover the time since then.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::EngineStats;
use crate::cache::CacheCounters;
use crate::pilot::PilotCounters;
use crate::store::DriveSnapshot;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DriveMetrics {
    pub path: PathBuf,
    pub bytes: u64,
    pub reads: u64,
    pub errors: u64,
    /// Read rate since the previous sample.
    pub mb_per_s: f64,
    /// Share of the time since the previous sample the drive was reading.
    pub busy_share: f64,
    pub latency_p50_ms: Option<f64>,
    pub latency_p90_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
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
                DriveMetrics {
                    path: d.path.clone(),
                    bytes: d.bytes,
                    reads: d.reads,
                    errors: d.errors,
                    mb_per_s: d.bytes.saturating_sub(before) as f64 / 1e6 / seconds,
                    busy_share: (d.busy_micros.saturating_sub(busy_before) as f64 / 1e6 / seconds)
                        .min(1.0),
                    latency_p50_ms: d.latency_quantile_ms(0.5),
                    latency_p90_ms: d.latency_quantile_ms(0.9),
                    latency_p99_ms: d.latency_quantile_ms(0.99),
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
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::store::DriveSnapshot;

    #[test]
    fn latency_quantiles_come_from_power_of_two_buckets() {
        let mut buckets = vec![0; 32];
        buckets[10] = 90; // under 1.024 ms
        buckets[14] = 10; // under 16.384 ms
        let d = DriveSnapshot {
            latency_buckets: buckets,
            ..Default::default()
        };
        assert_eq!(d.latency_quantile_ms(0.5), Some(1.024));
        assert_eq!(d.latency_quantile_ms(0.99), Some(16.384));
        assert_eq!(DriveSnapshot::default().latency_quantile_ms(0.5), None);
    }
}
