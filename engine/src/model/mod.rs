//! Model definitions: config parsing into typed specs, shared layers, and one
//! file per architecture. Adding an architecture means one file here plus one
//! row in [`family::FAMILIES`].

pub mod bailing_hybrid;
pub mod config;
pub mod deepseek_v3;
pub mod deepseek_v32;
pub mod deepseek_v4;
pub mod dots1;
pub mod ernie4_5_moe;
pub mod extra;
pub mod family;
pub mod glm4_moe;
pub mod glm5_next;
pub mod glm_moe_dsa;
pub mod gpt_oss;
pub mod hunyuan_v1_moe;
pub mod kimi_linear;
pub mod layers;
pub mod llama4;
pub mod lockstep;
pub mod longcat_flash;
pub mod minimax_m2;
pub mod mixtral;
pub mod quantization;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod state;
pub mod step3p7;

use std::path::Path;
use std::sync::Arc;

pub use config::{ConfigError, RawConfig};
pub use extra::{DecoderNames, ExtraBlock};
pub use family::{FAMILIES, Family, FamilyConfig, Parsed};
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
    #[error(transparent)]
    Rows(#[from] crate::weights::RowsError),
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error("no input tokens")]
    EmptyInput,
    /// NaN or +∞ among the scores: broken weights or settings. Sampling
    /// them once answered id 0 over and over, with exit code 0.
    #[error(
        "the model's scores for answer token {position} are not numbers (NaN or +inf): its weights or settings are broken, so the answer stops here"
    )]
    NonFiniteLogits { position: usize },
    #[error("saved sequence state does not fit this model: {0}")]
    StateMismatch(String),
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// A pass run together with other sequences failed (see [`lockstep`]).
    #[error("the pass shared with other sequences failed: {0}")]
    Together(std::sync::Arc<ModelError>),
}

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
            rms_norm_eps: raw.positive_f64_or("rms_norm_eps", default_eps)?,
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

/// A parsed config.json: what to build and where its weights are named.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub model_type: String,
    /// The family's typed settings.
    pub config: Arc<dyn FamilyConfig>,
    /// Prefix of the language model's tensors (multimodal checkpoints nest it).
    pub weight_prefix: String,
    /// Whether the text model's `model.` tensors may be stored under
    /// `model.language_model.` (Qwen3.5's multimodal release, Step-3.7's
    /// index); flat names are read when the files have them.
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
        let quantization = quantization::parse(raw)?;
        let family =
            family::family_of(&model_type).ok_or_else(|| ConfigError::UnknownModelType {
                path: raw.path().to_path_buf(),
                found: model_type.clone(),
                supported: family::supported_model_types(),
            })?;
        let parsed = family.parse(raw, &model_type)?;
        Ok(Self {
            model_type,
            config: Arc::from(parsed.config),
            weight_prefix: parsed.weight_prefix.to_string(),
            nested_language_model: parsed.nested_language_model,
            quantization: quantization.or(parsed.quantization),
        })
    }

    pub fn common(&self) -> &CommonConfig {
        self.config.common()
    }

    /// The family's config as its own type, for code that knows the family.
    pub fn config_as<T: 'static>(&self) -> Option<&T> {
        self.config.as_any().downcast_ref::<T>()
    }

    /// Where the decoder's layers are named in the checkpoint, so that
    /// tensors of other blocks (MTP) are told apart from its own.
    pub fn decoder_names(&self) -> DecoderNames {
        let mut prefixes = vec![format!("{}model.", self.weight_prefix)];
        if self.nested_language_model {
            prefixes.push("model.language_model.".to_string());
        }
        prefixes.extend(
            self.config
                .extra_layer_prefixes()
                .iter()
                .map(|p| p.to_string()),
        );
        DecoderNames {
            prefixes,
            layers: self.common().num_layers,
        }
    }

    /// What one sequence's state takes: the attention layers' rows per
    /// position, and the linear layers' fixed state and convolution window
    /// with the checkpoints kept of them (f32).
    pub fn state_bytes(&self) -> crate::memory::StateBytes {
        self.config.state_layout().bytes()
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
            pairs: &[("model.", "model.language_model.")],
        };
        // Where the text model is nested, its tensors may still be stored
        // flat (transformers writes Step-3.7's back under `model.`).
        let source: &dyn TensorSource =
            if self.nested_language_model && source.shape(&probe("layers")).is_none() {
                &nested
            } else {
                source
            };
        let renamed = crate::weights::Renamed {
            inner: source,
            pairs: &[("model.layers.", "model.blocks.")],
        };
        let source: &dyn TensorSource = if source.shape(&probe("layers")).is_none()
            && source.shape(&probe("blocks")).is_some()
        {
            &renamed
        } else {
            source
        };
        let released = self.config.released_names(source);
        let source: &dyn TensorSource = released.as_deref().unwrap_or(source);
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
        let probe = self.config.last_layer_probe(last);
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
        let decoder = self.config.build(&w, experts)?;
        if decoder.state_slots != self.config.state_layout().len() {
            return Err(ModelError::Internal(
                "the decoder's state slots differ from its family's layout",
            ));
        }
        Ok(decoder)
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
        embed: layers::embedding::Embedding::Held(embed),
        lm_head,
        layers,
        rope,
        experts: experts.into_provider(),
        vocab_size: c.vocab_size,
        lockstep: Default::default(),
    })
}

/// A decoder of `count` layers under `model.layers.N`, each grouped-query
/// attention (`self_attn`, shaped for layer N by `shape`) and the
/// feed-forward `ffn` builds from the layer's weights, under the layer's two
/// norms: the loop of the families that differ only in those two (it was
/// written out in six files).
pub(crate) fn grouped_decoder(
    c: &CommonConfig,
    count: usize,
    w: &Weights,
    rope: layers::rope::Rope,
    experts: Option<Arc<dyn ExpertProvider>>,
    shape: impl Fn(usize) -> layers::attention::GqaShape,
    mut ffn: impl FnMut(
        usize,
        &Weights,
        &mut layers::experts::ExpertSetup,
    ) -> Result<layers::decoder::FeedForward, ModelError>,
) -> Result<Decoder, ModelError> {
    use layers::attention::GroupedQueryAttention;
    use layers::decoder::{Attention, DecoderLayer};
    let mut experts = layers::experts::ExpertSetup::new(experts);
    let mut built = Vec::with_capacity(count);
    for i in 0..count {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let attention = GroupedQueryAttention::load(&lw.pp("self_attn"), shape(i), &rope)?;
        let ffn = ffn(i, &lw, &mut experts)?;
        built.push(DecoderLayer::load(
            &lw,
            c.hidden_size,
            c.rms_norm_eps,
            Attention::Grouped(attention),
            ffn,
        )?);
    }
    assemble(c, w, built, rope, experts)
}

/// Opens a Hugging Face checkpoint folder and builds its model in RAM.
pub fn load_checkpoint(dir: &Path) -> Result<(ModelSpec, Decoder), ModelError> {
    let spec = ModelSpec::read(&dir.join("config.json"))?;
    let source = crate::weights::SafetensorsCheckpoint::open(dir)?;
    let decoder = spec.build(&source, None)?;
    Ok((spec, decoder))
}
