//! Longhaul's inference engine.
//!
//! It runs Mixture-of-Experts language models exactly as their reference
//! implementations do, with routed experts behind a narrow interface
//! (`model::ExpertProvider`) so that they can live in RAM or be streamed
//! from drives without the model code knowing. No UI, SQL or HTTP here.
//!
//! Its face is small: [`Engine`] (open a model, score, generate), [`Session`]
//! (one sequence's state, with snapshot, restore and truncate), the settings
//! they take, [`EngineStats`] for dashboards, and [`tools`] for what works on
//! model files rather than a loaded model (pack, verify, probe, synth, heat),
//! and [`private`] for files only their owner can read.
//! Everything else is internal, so the compiler keeps the service out of the
//! model, cache and store code. The `internals` feature opens the modules to
//! the engine's own tests.

// Modules public only with the `internals` feature. They are declared one by
// one (not by a macro) so that rustfmt, which does not look inside macro
// calls, formats them.
#[cfg(feature = "internals")]
pub mod aligned;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod aligned;
#[cfg(feature = "internals")]
pub mod cache;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod cache;
#[cfg(feature = "internals")]
pub mod generate;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod generate;
#[cfg(feature = "internals")]
pub mod import;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod import;
#[cfg(feature = "internals")]
pub mod kernels;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod kernels;
#[cfg(feature = "internals")]
pub mod metrics;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod metrics;
#[cfg(feature = "internals")]
pub mod model;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod model;
#[cfg(feature = "internals")]
pub mod pack;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod pack;
#[cfg(feature = "internals")]
pub mod pilot;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod pilot;
#[cfg(feature = "internals")]
pub mod prefix;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod prefix;
#[cfg(feature = "internals")]
pub mod store;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod store;
#[cfg(feature = "internals")]
pub mod synth;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod synth;
#[cfg(feature = "internals")]
pub mod tokenizer;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod tokenizer;
#[cfg(feature = "internals")]
pub mod weights;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod weights;

mod background;
mod engine;
mod locate;
pub mod memory;
mod platform;
pub mod private;
mod regular;
mod toolcall;
pub mod tools;

pub use cache::{
    DEFAULT_PINNED_FRACTION, EvictionPolicy, PolicyReport, PolicySetting, Replayed,
    StreamingOptions,
};
pub use engine::{ChatPrompt, Engine, EngineError, EngineOptions, LoadProgress, ModelInfo};
pub use generate::bridge::TextBridge;
pub use generate::channels::OutputFormat;
pub use generate::speculate::{DraftModel, Drafter, PromptLookup};
pub use generate::{
    FinishReason, Flow, Generation, GenerationSettings, GenerationStats, MAX_OPENAI_PENALTY,
    PROMPT_CHUNK, Phase, Piece, SamplingParams, Session, Speculation, SpeculationStats,
};
pub use memory::{MemoryPlan, MemorySettings};
pub use metrics::{DriveMetrics, EngineStats, MetricsSampler, MetricsSnapshot};
pub use model::lockstep::LockstepCounters;
pub use prefix::{
    DEFAULT_DISK_BYTES as DEFAULT_PREFIX_DISK_BYTES, DEFAULT_RAM_BYTES as DEFAULT_PREFIX_RAM_BYTES,
    PrefixCache, PrefixError, PrefixSettings, PrefixStats,
};
pub use tokenizer::{ChatMessage, ChatOptions, TextTokenizer};
pub use toolcall::{MalformedCall, ToolAnswer, ToolCall, ToolFormat};
