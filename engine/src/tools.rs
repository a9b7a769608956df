//! What works on model files rather than on a loaded model: packing and
//! verifying packs, probing drives, writing synthetic checkpoints, heat
//! histograms, routing traces and logit comparisons.

pub use crate::cache::choose::{SWITCH_MARGIN, Shape, candidates, choose, choose_counting, replay};
pub use crate::cache::heat::HeatMap;
pub use crate::cache::{CacheCounters, Routed};
pub use crate::engine::{REFERENCE_DEFAULT_TOP_K, SamplingDefaults, sampling_defaults};
pub use crate::generate::sampling::argmax;
pub use crate::import::is_gguf;
pub use crate::kernels::{instruction_set, product_paths};
pub use crate::locate::{LocateError, Located, ModelPlaces, locate};
pub use crate::metrics::replay::{
    RoutingStats, belady_hit_rate, lfu_hit_rate, lru_hit_rate, oracle_pin_hit_rate, routing_stats,
};
pub use crate::metrics::{QualityReport, compare_logits, trace};
pub use crate::model::family::synth_names;
pub use crate::pack::details::{DriveShare, PackDetails, describe as describe_pack};
pub use crate::pack::encoding::Quantization;
pub use crate::pack::verify::verify_pack;
pub use crate::pack::{
    DEFAULT_ALIGNMENT, DEFAULT_SPLIT_THRESHOLD, Discarded, MANIFEST_FILE, Manifest, PackError,
    PackOptions, PackPhase, PackProgress, PackSummary, discard_pack, discard_unfinished, is_pack,
    pack_matches_source, write_pack,
};
pub use crate::pilot::PilotCounters;
pub use crate::store::probe::{ProbeReport, probe};
pub use crate::store::{DEFAULT_QUEUE_DEPTH, DriveSnapshot, StoreConfig, StoreError, StoreFaults};
pub use crate::synth::{SynthDtype, SynthError, SynthSpec, SynthSummary, write_synthetic};
pub use crate::tokenizer::TextTokenizer;

/// The default shape of the family `synth --arch name` writes.
pub fn synth_spec(name: &str) -> Result<SynthSpec, SynthError> {
    crate::model::family::synth_family(name)
        .map(SynthSpec::new)
        .ok_or_else(|| {
            SynthError::Invalid(format!(
                "--arch {name} is not supported; use {}",
                synth_names().join(", ")
            ))
        })
}

/// The context length a model folder, pack or GGUF file states
/// (`max_position_embeddings`), read without loading the model; `None` when
/// it states none or cannot be read.
pub fn context_length(path: &std::path::Path) -> Option<usize> {
    let spec = if crate::import::is_gguf(path) {
        crate::import::ModelSource::open(path).ok()?.spec().ok()?
    } else {
        crate::model::ModelSpec::read(&path.join("config.json")).ok()?
    };
    spec.common().context_length
}

/// The attention state a model folder or pack keeps per token of context
/// (and its fixed part), read without loading the model.
pub fn state_bytes(path: &std::path::Path) -> Option<crate::memory::StateBytes> {
    let spec = if crate::import::is_gguf(path) {
        crate::import::ModelSource::open(path).ok()?.spec().ok()?
    } else {
        crate::model::ModelSpec::read(&path.join("config.json")).ok()?
    };
    Some(spec.state_bytes())
}
