//! DeepSeek-V3 and the Kimi K2 family: multi-head latent attention (with or
//! without a low-rank query), interleaved rope with YaRN, dense first layers,
//! shared experts, and sigmoid group-limited routing whose correction bias
//! steers the choice but not the weights.

use std::sync::Arc;

use super::config::{ConfigError, RawConfig};
use super::family::{Family, Parsed, family_config};
use super::layers::Mlp;
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{ExpertProvider, ExpertSetup, ExpertShape, PROJ_NAMES};
use super::layers::mla::{LatentAttention, MlaShape, SparseKeys};
use super::layers::moe::{MoeBlock, SigmoidGroupedMoe};
use super::layers::rope::{Rope, RopeParams};
use super::state::{SlotKind, StateLayout};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::{self, ALL_DTYPES, DEEPSEEK_MOE, Shape, SynthAttention};
use crate::weights::Weights;
use serde_json::json;

const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_ROUTED_SCALING: f64 = 2.5;
const DEFAULT_SHARED_EXPERTS: usize = 1;

/// Defaults of a transformers config class for fields a config may omit,
/// where the families built on this file differ.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub rms_eps: f64,
    pub first_k_dense: usize,
    pub n_group: usize,
    pub topk_group: usize,
}

/// `DeepseekV3Config`'s.
pub const DEEPSEEK_V3: Defaults = Defaults {
    rms_eps: 1e-6,
    first_k_dense: 3,
    n_group: 8,
    topk_group: 4,
};

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub attention_bias: bool,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    pub first_k_dense_replace: usize,
    pub rope_interleave: bool,
    pub rope: RopeParams,
}

impl Config {
    pub fn mla_shape(&self) -> MlaShape {
        MlaShape {
            hidden: self.common.hidden_size,
            heads: self.heads,
            q_lora_rank: self.q_lora_rank,
            kv_lora_rank: self.kv_lora_rank,
            nope: self.qk_nope_head_dim,
            rope: self.qk_rope_head_dim,
            v: self.v_head_dim,
            bias: self.attention_bias,
            eps: self.common.rms_norm_eps,
        }
    }

    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        Self::parse_with(raw, &DEEPSEEK_V3)
    }

    pub fn parse_with(raw: &RawConfig, defaults: &Defaults) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, defaults.rms_eps)?;
        if let Some(s) = raw.str_opt("scoring_func")?
            && s != "sigmoid"
        {
            return Err(raw.unsupported("scoring_func", s, "sigmoid"));
        }
        if let Some(m) = raw.str_opt("topk_method")?
            && m != "noaux_tc"
        {
            return Err(raw.unsupported("topk_method", m, "noaux_tc"));
        }
        if let Some(f) = raw.usize_any(&["moe_layer_freq"])?
            && f != 1
        {
            return Err(raw.unsupported("moe_layer_freq", f, "1"));
        }
        let n_routed_experts = raw.positive_any(&["n_routed_experts", "num_local_experts"])?;
        let top_k = raw.positive("num_experts_per_tok")?;
        let n_group = raw.usize_any(&["n_group"])?.unwrap_or(defaults.n_group);
        let topk_group = raw
            .usize_any(&["topk_group"])?
            .unwrap_or(defaults.topk_group);
        if n_group == 0 || !n_routed_experts.is_multiple_of(n_group) {
            return Err(raw.invalid(
                "n_group",
                format!("{n_group} does not divide n_routed_experts {n_routed_experts}"),
            ));
        }
        if topk_group == 0 || topk_group > n_group {
            return Err(raw.invalid(
                "topk_group",
                format!("{topk_group} must be between 1 and n_group {n_group}"),
            ));
        }
        if top_k > n_routed_experts / n_group * topk_group {
            return Err(raw.invalid(
                "num_experts_per_tok",
                format!("{top_k} exceeds the experts in the {topk_group} kept groups"),
            ));
        }
        Ok(Self {
            heads: raw.positive("num_attention_heads")?,
            q_lora_rank: raw.usize_any(&["q_lora_rank"])?,
            kv_lora_rank: raw.positive("kv_lora_rank")?,
            qk_nope_head_dim: raw.usize_req("qk_nope_head_dim")?,
            qk_rope_head_dim: raw.positive("qk_rope_head_dim")?,
            v_head_dim: raw.positive("v_head_dim")?,
            attention_bias: raw.bool_or("attention_bias", false)?,
            intermediate_size: raw.positive("intermediate_size")?,
            moe_intermediate_size: raw.positive("moe_intermediate_size")?,
            n_routed_experts,
            n_shared_experts: raw
                .usize_any(&["n_shared_experts"])?
                .unwrap_or(DEFAULT_SHARED_EXPERTS),
            top_k,
            n_group,
            topk_group,
            norm_topk_prob: raw.bool_or("norm_topk_prob", true)?,
            routed_scaling_factor: raw.f64_or("routed_scaling_factor", DEFAULT_ROUTED_SCALING)?,
            first_k_dense_replace: raw
                .usize_any(&["first_k_dense_replace"])?
                .unwrap_or(defaults.first_k_dense),
            rope_interleave: raw.bool_or("rope_interleave", true)?,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }
}

fn load_attention(c: &Config, w: &Weights, rope: &Rope) -> Result<LatentAttention, ModelError> {
    let base_scale = 1.0 / ((c.qk_nope_head_dim + c.qk_rope_head_dim) as f64).sqrt();
    LatentAttention::load(
        w,
        &c.mla_shape(),
        rope,
        c.rope.mla_softmax_scale(base_scale),
    )
}

fn load_moe(c: &Config, w: &Weights, layer: usize) -> Result<MoeBlock, ModelError> {
    let moe = SigmoidGroupedMoe {
        experts: c.n_routed_experts,
        top_k: c.top_k,
        n_group: c.n_group,
        topk_group: c.topk_group,
        renormalize: c.norm_topk_prob,
        scaling: c.routed_scaling_factor,
        intermediate: c.moe_intermediate_size,
        shared: c.n_shared_experts,
    };
    moe.load(w, layer, c.common.hidden_size)
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    build_with(
        c,
        w,
        experts,
        |i| i < c.first_k_dense_replace,
        |_, _, _| Ok(None),
    )
}

/// The decoder of this family, with the layers `dense` names using a dense
/// MLP, and each attention's sparse selection from `sparse` (given the
/// layer, its attention's weights and the rope).
pub fn build_with(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
    dense: impl Fn(usize) -> bool,
    mut sparse: impl FnMut(usize, &Weights, &Rope) -> Result<Option<SparseKeys>, ModelError>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let rope = Rope::new(&c.rope, c.qk_rope_head_dim, c.rope_interleave);
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let aw = lw.pp("self_attn");
        let mut attention = load_attention(c, &aw, &rope)?;
        attention.sparse = sparse(i, &aw, &rope)?;
        let mw = lw.pp("mlp");
        let ffn = if dense(i) {
            FeedForward::Dense(Mlp::load(&mw, h, c.intermediate_size)?)
        } else {
            let shape = ExpertShape {
                count: c.n_routed_experts,
                hidden: h,
                intermediate: c.moe_intermediate_size,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
            FeedForward::Sparse(load_moe(c, &mw, i)?)
        };
        layers.push(DecoderLayer::load(
            &lw,
            h,
            c.common.rms_norm_eps,
            Attention::Latent(attention),
            ffn,
        )?);
    }
    assemble(&c.common, w, layers, rope, experts)
}

/// DeepSeek-V3 and Kimi K2 (K2.5 wraps a K2 text model; its vision tower
/// is not used).
pub static FAMILY: Family = Family {
    types: &["deepseek_v3", "kimi_k2", "kimi_k25"],
    parse: parse_family,
    gguf: &["deepseek2"],
    synth: Some(&SYNTH),
};

/// Reads a config of one of [`FAMILY`]'s types.
fn parse_family(raw: &RawConfig, model_type: &str) -> Result<Parsed, ConfigError> {
    if model_type != "kimi_k25" {
        return Ok(Parsed::plain(Config::parse(raw)?));
    }
    let text = raw.sub_config("text_config")?;
    let mut c = Config::parse(&text)?;
    // The wrapper's own setting decides; absent, the files do.
    match raw.get("tie_word_embeddings") {
        Some(v) => {
            c.common.tie_word_embeddings = v
                .as_bool()
                .ok_or_else(|| raw.invalid("tie_word_embeddings", "expected true or false"))?;
        }
        None => c.common.tie_if_head_missing = true,
    }
    Ok(Parsed {
        quantization: super::quantization::parse(&text)?,
        weight_prefix: "language_model.",
        ..Parsed::plain(c)
    })
}

impl Config {
    /// One appending slot per layer: the compressed latent and the shared
    /// rotary key a position.
    pub fn latent_layout(&self) -> StateLayout {
        StateLayout::layers((0..self.common.num_layers).map(|_| SlotKind::Appending {
            per_position: self.kv_latent_width(),
        }))
    }

    /// Values a position adds to an MLA layer's cache.
    pub fn kv_latent_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// `synth --arch deepseek_v3`: eight routing groups, four taken.
static SYNTH: Shape = Shape {
    name: "deepseek_v3",
    attention: SynthAttention::Latent { indexer: false },
    moe: Some(DEEPSEEK_MOE),
    dense_prefix: 1,
    dtypes: ALL_DTYPES,
    expert_groups: 8,
    config: |s| {
        synth::extended(
            synth::mla_config(s, "deepseek_v3", (8, 4)),
            json!({ "rope_interleave": true }),
        )
    },
    head: None,
};

family_config! {
    layout: |c| c.latent_layout(),
}
