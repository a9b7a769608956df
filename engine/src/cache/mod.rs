//! The RAM expert cache and the expert provider that streams from a pack.
//!
//! The model asks [`StreamingExperts`] for (layer, ids) like any provider:
//! hits come from the cache, misses are read from every drive in parallel
//! straight into the memory that becomes the expert, checked against their
//! checksums and handed over as they land — computed exactly as an in-memory
//! checkpoint would be, so logits do not depend on the budget, the drives,
//! prefetching or the order reads complete in.

mod autopolicy;
mod budget;
pub mod choose;
mod fetch;
pub mod heat;
mod packed;
pub mod policy;
mod pool;
mod reads;
mod streaming;

pub use budget::{CacheCounters, ExpertCache};
pub use choose::{PolicyReport, Replayed};
pub use heat::Routed;
pub use policy::{EvictionPolicy, PolicySetting, Rule};
pub use streaming::{
    DEFAULT_PINNED_FRACTION, DEFAULT_WINDOW_BYTES, StreamingExperts, StreamingOptions,
    WINDOW_RECORDS, window_for,
};
