//! The packed cache: keeping compressed expert records as the pack stores
//! them and restoring them at each use, so that a budget holds more experts.

use crate::pack::Manifest;
use crate::pack::manifest::Record;
use crate::store::DIRECT_IO_BLOCK;

use super::streaming::StreamingOptions;

/// Packed records are held in buffers rounded up to a 64th of their plain
/// size (in whole direct-I/O blocks), so that a layer's records, each
/// compressed to its own length, share a few buffer sizes (the pool reuses
/// buffers by size) at a cost of under 1 % of their bytes on average.
const PACKED_CLASSES: u64 = 64;

/// The buffer size a packed record of `stored` bytes (`plain` restored) is held in.
pub(super) fn packed_class(stored: u64, plain: u64) -> u64 {
    let step = (plain / PACKED_CLASSES).next_multiple_of(DIRECT_IO_BLOCK as u64);
    stored.next_multiple_of(step.max(DIRECT_IO_BLOCK as u64))
}

/// Whether `record` is kept packed by a cache that keeps records packed:
/// compressed, and smaller so.
pub(super) fn keeps_packed(record: &Record) -> bool {
    record.stored_len.is_some()
        && packed_class(record.stored(), record.len)
            < record.len.next_multiple_of(DIRECT_IO_BLOCK as u64)
}

/// Whether the cache should keep compressed records packed and restore them
/// at each use: when they are kept at their stored width (restoring gives
/// back exactly those bytes) and the budget cannot hold every expert's
/// weights. On the peers' F16 Qwen3-MoE a packed record is 0.84 of the
/// weights, so a budget holds 1.19 times the experts, and each hit costs a
/// restore at about 5 GB/s of one core, off the drives' critical path.
pub(super) fn packs_records(manifest: &Manifest, options: &StreamingOptions) -> bool {
    let all_plain: u64 = manifest
        .experts
        .layers
        .iter()
        .flat_map(|l| &l.records)
        .map(|r| r.len)
        .sum();
    options.keep_stored_dtype
        && options.pack_cache
        && manifest.experts.layers.iter().flat_map(|l| &l.records).any(keeps_packed)
        && options.budget_bytes < all_plain
}

