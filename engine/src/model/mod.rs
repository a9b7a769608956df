//! Model definitions: config parsing into typed specs, shared layers, and one
//! file per architecture. Adding an architecture means one file here plus one
//! line in [`ModelSpec::parse`]'s registry.

pub mod config;
pub mod deepseek_v3;
pub mod deepseek_v4;
pub mod extra;
pub mod glm_moe_dsa;
pub mod gpt_oss;
pub mod kimi_linear;
pub mod layers;
pub mod minimax_m2;
pub mod mixtral;
pub mod quantization;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod state;

use std::path::Path;
use std::sync::Arc;

pub use config::{ConfigError, RawConfig};
pub use extra::{DecoderNames, ExtraBlock};
pub use layers::decoder::{Decoder, LogitsFor};
pub use layers::experts::{Expert, ExpertError, ExpertProvider, ExpertStream};
pub use quantization::Quantization;
pub use state::SequenceState;

use crate::weights::{TensorSource, Weights, WeightsError};
use layers::{Linear, RmsNorm};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Experts(#[from] ExpertError),
    #[error("tensor computation failed: {0}")]
    Compute(#[from] candle_core::Error),
    #[error("kernel: {0}")]
    Kernel(#[from] crate::kernels::KernelError),
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error("no input tokens")]
    EmptyInput,
    #[error("saved sequence state does not fit this model: {0}")]
    StateMismatch(String),
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// `model_type` values Longhaul can run.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "qwen3_moe",
    "mixtral",
    "deepseek_v3",
    "kimi_k2",
    "kimi_k25",
    "gpt_oss",
    "kimi_linear",
    "qwen3_next",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "minimax_m2",
    "glm_moe_dsa",
    "deepseek_v4",
];

/// Settings every architecture has.
#[derive(Debug, Clone, PartialEq)]
pub struct CommonConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Untied, but a checkpoint without `lm_head.weight` uses the embedding:
    /// transformers 5.24 ties Kimi-K2.5's head in its wrapper class (whose
    /// `tie_word_embeddings` defaults to true) and saves no head, while the
    /// released files carry their own.
    pub tie_if_head_missing: bool,
    /// End-of-sequence ids named by config.json (generation_config.json may add more).
    pub eos_token_ids: Vec<u32>,
    /// Positions the model was trained for (`max_position_embeddings`), if stated.
    pub context_length: Option<usize>,
}

impl CommonConfig {
    pub fn parse(raw: &RawConfig, default_eps: f64) -> Result<Self, ConfigError> {
        raw.require_silu()?;
        let eos_token_ids = match raw.get("eos_token_id") {
            None => Vec::new(),
            Some(v) => parse_token_ids(v)
                .ok_or_else(|| raw.invalid("eos_token_id", "expected an id or a list of ids"))?,
        };
        Ok(Self {
            vocab_size: raw.positive("vocab_size")?,
            hidden_size: raw.positive("hidden_size")?,
            num_layers: raw.positive("num_hidden_layers")?,
            rms_norm_eps: raw.f64_or("rms_norm_eps", default_eps)?,
            tie_word_embeddings: raw.bool_or("tie_word_embeddings", false)?,
            tie_if_head_missing: false,
            eos_token_ids,
            context_length: raw.usize_any(&["max_position_embeddings", "model_max_length"])?,
        })
    }
}

/// An id or a list of ids, as `eos_token_id` fields hold them.
pub fn parse_token_ids(v: &serde_json::Value) -> Option<Vec<u32>> {
    let one = |v: &serde_json::Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match v {
        serde_json::Value::Array(items) => items.iter().map(one).collect(),
        other => one(other).map(|id| vec![id]),
    }
}

/// An architecture and its typed settings.
#[derive(Debug, Clone, PartialEq)]
pub enum Architecture {
    Qwen3Moe(qwen3_moe::Config),
    Mixtral(mixtral::Config),
    MinimaxM2(minimax_m2::Config),
    DeepseekV3(deepseek_v3::Config),
    DeepseekV4(Box<deepseek_v4::Config>),
    /// GLM-5: DeepSeek-V3 with sparse attention.
    GlmMoeDsa(glm_moe_dsa::Config),
    GptOss(gpt_oss::Config),
    KimiLinear(kimi_linear::Config),
    /// Qwen3-Next and Qwen3.5-MoE's text model.
    Qwen3Next(qwen3_next::Config),
}

/// A parsed config.json: what to build and where its weights are named.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub model_type: String,
    pub architecture: Architecture,
    /// Prefix of the language model's tensors (multimodal checkpoints nest it).
    pub weight_prefix: String,
    /// Whether the text model's `model.` tensors are stored under
    /// `model.language_model.` (Qwen3.5's multimodal release).
    pub nested_language_model: bool,
    /// The published weight format, from `quantization_config`.
    pub quantization: Option<Quantization>,
}

impl ModelSpec {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(&RawConfig::read(path)?)
    }

    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let model_type = raw
            .str_opt("model_type")?
            .ok_or_else(|| raw.missing("model_type"))?
            .to_string();
        // Read first: a format Longhaul cannot compute with is refused before
        // anything else is looked at (multimodal releases keep it at the top).
        let mut quantization = quantization::parse(raw)?;
        let mut nested_language_model = false;
        let (architecture, weight_prefix) = match model_type.as_str() {
            "qwen3_next" => (
                Architecture::Qwen3Next(qwen3_next::Config::parse(raw, false)?),
                "",
            ),
            "qwen3_5_moe_text" => (
                Architecture::Qwen3Next(qwen3_next::Config::parse(raw, true)?),
                "",
            ),
            // The vision tower is not used; text positions make MRoPE plain rotary.
            "qwen3_5_moe" => {
                let text = raw.sub_config("text_config")?;
                quantization = quantization.or(quantization::parse(&text)?);
                nested_language_model = true;
                (
                    Architecture::Qwen3Next(qwen3_next::Config::parse(&text, true)?),
                    "",
                )
            }
            "qwen3_moe" => (Architecture::Qwen3Moe(qwen3_moe::Config::parse(raw)?), ""),
            "mixtral" => (Architecture::Mixtral(mixtral::Config::parse(raw)?), ""),
            "minimax_m2" => (
                Architecture::MinimaxM2(minimax_m2::Config::parse(raw)?),
                "",
            ),
            "gpt_oss" => (Architecture::GptOss(gpt_oss::Config::parse(raw)?), ""),
            "deepseek_v4" => (
                Architecture::DeepseekV4(Box::new(deepseek_v4::Config::parse(raw)?)),
                "",
            ),
            "glm_moe_dsa" => (
                Architecture::GlmMoeDsa(glm_moe_dsa::Config::parse(raw)?),
                "",
            ),
            "kimi_linear" => (
                Architecture::KimiLinear(kimi_linear::Config::parse(raw)?),
                "",
            ),
            "deepseek_v3" | "kimi_k2" => (
                Architecture::DeepseekV3(deepseek_v3::Config::parse(raw)?),
                "",
            ),
            // Kimi K2.5 wraps a Kimi K2 text model; the vision tower is not used.
            "kimi_k25" => {
                let text = raw.sub_config("text_config")?;
                quantization = quantization.or(quantization::parse(&text)?);
                let mut c = deepseek_v3::Config::parse(&text)?;
                // The wrapper's own setting decides; absent, the files do.
                match raw.get("tie_word_embeddings") {
                    Some(v) => {
                        c.common.tie_word_embeddings = v.as_bool().ok_or_else(|| {
                            raw.invalid("tie_word_embeddings", "expected true or false")
                        })?;
                    }
                    None => c.common.tie_if_head_missing = true,
                }
                (Architecture::DeepseekV3(c), "language_model.")
            }
            other => {
                return Err(ConfigError::UnknownModelType {
                    path: raw.path().to_path_buf(),
                    found: other.to_string(),
                    supported: SUPPORTED_MODEL_TYPES.to_vec(),
                });
            }
        };
        Ok(Self {
            model_type,
            architecture,
            weight_prefix: weight_prefix.to_string(),
            nested_language_model,
            quantization,
        })
    }

    /// Where the decoder's layers are named in the checkpoint, so that
    /// tensors of other blocks (MTP) are told apart from its own.
    pub fn decoder_names(&self) -> DecoderNames {
        let mut prefixes = vec![format!("{}model.", self.weight_prefix)];
        if self.nested_language_model {
            prefixes.push("model.language_model.".to_string());
        }
        // DeepSeek-V4's released names start at `layers.`.
        if matches!(self.architecture, Architecture::DeepseekV4(_)) {
            prefixes.push(String::new());
        }
        DecoderNames {
            prefixes,
            layers: self.common().num_layers,
        }
    }

    pub fn common(&self) -> &CommonConfig {
        match &self.architecture {
            Architecture::Qwen3Moe(c) => &c.common,
            Architecture::Mixtral(c) => &c.common,
            Architecture::MinimaxM2(c) => &c.common,
            Architecture::DeepseekV3(c) => &c.common,
            Architecture::GlmMoeDsa(c) => c.common(),
            Architecture::DeepseekV4(c) => &c.common,
            Architecture::GptOss(c) => &c.common,
            Architecture::KimiLinear(c) => &c.common,
            Architecture::Qwen3Next(c) => &c.common,
        }
    }

    /// What one sequence's state takes: the attention layers' rows per
    /// position, and the linear layers' fixed state and convolution window
    /// with the checkpoints kept of them (f32).
    pub fn state_bytes(&self) -> crate::memory::StateBytes {
        const F32: u64 = 4;
        let linear = match &self.architecture {
            Architecture::KimiLinear(c) => Some((&c.linear, &c.linear_layers)),
            Architecture::Qwen3Next(c) => Some((&c.linear, &c.linear_layers)),
            _ => None,
        };
        let fixed_values = match &self.architecture {
            Architecture::DeepseekV4(c) => c.state_values_fixed(),
            _ => linear.map_or(0, |(s, layers)| {
                layers.iter().filter(|l| **l).count() * s.state_values()
            }),
        };
        let fixed = fixed_values as u64 * F32 * (1 + state::MAX_CHECKPOINTS as u64);
        crate::memory::StateBytes {
            per_token: self.kv_bytes_per_token(),
            fixed,
        }
    }

    /// Bytes the attention cache holds per position (f32, every attention layer).
    fn kv_bytes_per_token(&self) -> u64 {
        const F32: u64 = 4;
        let (layers, per_layer) = match &self.architecture {
            Architecture::Qwen3Moe(c) => (c.common.num_layers, 2 * c.kv_heads * c.head_dim),
            Architecture::Mixtral(c) => (c.common.num_layers, 2 * c.kv_heads * c.head_dim),
            Architecture::MinimaxM2(c) => (c.common.num_layers, 2 * c.kv_heads * c.head_dim),
            Architecture::GptOss(c) => (c.common.num_layers, 2 * c.kv_heads * c.head_dim),
            Architecture::DeepseekV3(c) => {
                (c.common.num_layers, c.kv_lora_rank + c.qk_rope_head_dim)
            }
            Architecture::DeepseekV4(c) => return c.state_values_per_token() as u64 * F32,
            Architecture::GlmMoeDsa(c) => {
                let b = &c.base;
                let index = c.indexers() * c.index_head_dim;
                return (b.common.num_layers * (b.kv_lora_rank + b.qk_rope_head_dim) + index) as u64
                    * F32;
            }
            Architecture::KimiLinear(c) => (
                c.linear_layers.iter().filter(|l| !**l).count(),
                c.mla.kv_lora_rank + c.mla.rope,
            ),
            Architecture::Qwen3Next(c) => (
                c.linear_layers.iter().filter(|l| !**l).count(),
                2 * c.kv_heads * c.head_dim,
            ),
        };
        (layers * per_layer) as u64 * F32
    }

    /// Builds the model from `source`. With `experts` set, routed experts come
    /// from that provider; otherwise they are loaded from `source` into RAM.
    pub fn build(
        &self,
        source: &dyn TensorSource,
        experts: Option<Arc<dyn ExpertProvider>>,
    ) -> Result<Decoder, ModelError> {
        let probe = |layers: &str| {
            format!(
                "{}model.{layers}.0.input_layernorm.weight",
                self.weight_prefix
            )
        };
        let nested = crate::weights::Renamed {
            inner: source,
            asked: "model.",
            stored: "model.language_model.",
        };
        let source: &dyn TensorSource = if self.nested_language_model {
            &nested
        } else {
            source
        };
        let renamed = crate::weights::Renamed {
            inner: source,
            asked: "model.layers.",
            stored: "model.blocks.",
        };
        let source: &dyn TensorSource = if source.shape(&probe("layers")).is_none()
            && source.shape(&probe("blocks")).is_some()
        {
            &renamed
        } else {
            source
        };
        let released = deepseek_v4::ReleasedNames { inner: source };
        let source: &dyn TensorSource = if matches!(self.architecture, Architecture::DeepseekV4(_))
            && deepseek_v4::has_released_names(source)
        {
            &released
        } else {
            source
        };
        let root = Weights::root(source);
        let w = if self.weight_prefix.is_empty() {
            root
        } else {
            root.pp(self.weight_prefix.trim_end_matches('.'))
        };
        // Sizes the config states are checked against the files before they
        // size anything: a `num_hidden_layers` of 10^9 once asked for 944 GB.
        let c = self.common();
        let embed = "model.embed_tokens.weight";
        let want = [c.vocab_size, c.hidden_size];
        match w.shape(embed) {
            Some(shape) if shape != want => {
                return Err(WeightsError::Shape {
                    name: w.full_name(embed),
                    path: source.location(&w.full_name(embed)),
                    actual: shape.to_vec(),
                    expected: want.to_vec(),
                }
                .into());
            }
            _ => {}
        }
        let last = c.num_layers - 1;
        let probe = format!("model.layers.{last}.input_layernorm.weight");
        if !w.has(&probe) {
            return Err(ConfigError::Invalid {
                path: source.origin().join("config.json"),
                field: "num_hidden_layers".into(),
                reason: format!(
                    "{} layers, but the weights hold no `{}`",
                    last + 1,
                    w.full_name(&probe)
                ),
            }
            .into());
        }
        match &self.architecture {
            Architecture::Qwen3Moe(c) => qwen3_moe::build(c, &w, experts),
            Architecture::Mixtral(c) => mixtral::build(c, &w, experts),
            Architecture::MinimaxM2(c) => minimax_m2::build(c, &w, experts),
            Architecture::DeepseekV3(c) => deepseek_v3::build(c, &w, experts),
            Architecture::GlmMoeDsa(c) => glm_moe_dsa::build(c, &w, experts),
            Architecture::DeepseekV4(c) => deepseek_v4::build(c, &w, experts),
            Architecture::GptOss(c) => gpt_oss::build(c, &w, experts),
            Architecture::KimiLinear(c) => kimi_linear::build(c, &w, experts),
            Architecture::Qwen3Next(c) => qwen3_next::build(c, &w, experts),
        }
    }
}

/// Completes a decoder from its layers: loads the embedding, final norm and
/// LM head (named the same way by all three families) and picks the expert
/// provider — the one given, or the experts loaded into RAM while building.
pub(crate) fn assemble(
    c: &CommonConfig,
    w: &Weights,
    layers: Vec<layers::decoder::DecoderLayer>,
    rope: layers::rope::Rope,
    experts: layers::experts::ExpertSetup,
) -> Result<Decoder, ModelError> {
    let embed = w.matrix("model.embed_tokens.weight", c.vocab_size, c.hidden_size)?;
    // Tied means tied: as in the reference, a stray `lm_head.weight` is ignored.
    let tied = c.tie_word_embeddings || (c.tie_if_head_missing && !w.has("lm_head.weight"));
    let lm_head = if tied {
        Linear::from_matrix(embed.clone())
    } else {
        Linear::load(w, "lm_head", c.hidden_size, c.vocab_size, false)?
    };
    Ok(Decoder {
        state_slots: layers.len(),
        hyper_head: None,
        streams: 1,
        norm: RmsNorm::load(&w.pp("model"), "norm", c.hidden_size, c.rms_norm_eps)?,
        embed,
        lm_head,
        layers,
        rope,
        experts: experts.into_provider(),
        vocab_size: c.vocab_size,
    })
}

/// Opens a Hugging Face checkpoint folder and builds its model in RAM.
pub fn load_checkpoint(dir: &Path) -> Result<(ModelSpec, Decoder), ModelError> {
    let spec = ModelSpec::read(&dir.join("config.json"))?;
    let source = crate::weights::SafetensorsCheckpoint::open(dir)?;
    let decoder = spec.build(&source, None)?;
    Ok((spec, decoder))
}
