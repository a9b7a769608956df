//! The RAM expert cache and the expert provider that streams from a pack.
//!
//! The model asks [`StreamingExperts`] for (layer, ids) like any provider:
//! hits come from the cache, misses are read from every drive in parallel,
//! checked against their checksums and converted exactly as an in-memory
//! checkpoint would be — so logits do not depend on the budget.

mod budget;
pub mod heat;
mod streaming;

pub use budget::{CacheCounters, EvictionPolicy, ExpertCache};
pub use streaming::{DEFAULT_PINNED_FRACTION, Lookup, StreamingExperts, StreamingOptions};
