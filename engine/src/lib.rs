//! Longhaul's inference engine.
//!
//! It runs Mixture-of-Experts language models exactly as their reference
//! implementations do, with routed experts behind a narrow interface
//! ([`model::ExpertProvider`]) so that they can live in RAM or be streamed
//! from drives without the model code knowing. No UI, SQL or HTTP here.

pub mod aligned;
pub mod cache;
pub mod engine;
pub mod generate;
pub mod import;
pub mod kernels;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod pack;
pub mod pilot;
pub mod store;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use engine::{Engine, EngineError, EngineOptions, LoadProgress};
