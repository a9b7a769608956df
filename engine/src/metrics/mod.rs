//! Measurements the service streams to dashboards and benchmarks report:
//! snapshots of drive and cache counters, routing traces, and what a cache
//! could have achieved on them.

pub mod quality;
pub mod replay;
pub mod snapshot;
pub mod stats;
pub mod trace;

pub use quality::{QualityReport, compare_logits};
pub use replay::{
    RoutingStats, belady_hit_rate, lfu_hit_rate, lru_hit_rate, oracle_pin_hit_rate, routing_stats,
};
pub use snapshot::{DriveMetrics, MetricsSampler, MetricsSnapshot};
pub use stats::EngineStats;

/// One expert lookup: (decoder layer, expert id).
pub type Access = (usize, usize);
