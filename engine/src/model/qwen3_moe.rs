//! Qwen3-MoE: grouped-query attention with per-head q/k RMSNorm, softmax
//! routing, optional dense layers (`mlp_only_layers`, `decoder_sparse_step`).

use std::sync::Arc;

use super::config::{ConfigError, RawConfig, check_heads};
use super::family::{Family, Parsed, family_config, grouped_layout};
use super::layers::Mlp;
use super::layers::attention::GqaShape;
use super::layers::decoder::{Decoder, FeedForward};
use super::layers::experts::{ExpertProvider, ExpertShape, PROJ_NAMES};
use super::layers::moe::MoeBlock;
use super::layers::rope::{Rope, RopeParams};
use super::layers::router::Scoring;
use super::{CommonConfig, ModelError, grouped_decoder};
use crate::synth::{ALL_DTYPES, PROJ_MOE, QkNorm, Shape, SynthAttention};
use crate::weights::Weights;
use serde_json::json;

const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_RMS_EPS: f64 = 1e-6;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    pub sliding_window: Option<usize>,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let heads = raw.positive("num_attention_heads")?;
        let kv_heads = raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads);
        check_heads(raw, heads, kv_heads)?;
        let head_dim = raw
            .usize_any(&["head_dim"])?
            .unwrap_or(common.hidden_size / heads);
        let num_experts = raw
            .usize_any(&["num_experts", "num_local_experts"])?
            .unwrap_or(0);
        let top_k = raw.positive("num_experts_per_tok")?;
        if num_experts > 0 && top_k > num_experts {
            return Err(raw.invalid(
                "num_experts_per_tok",
                format!("{top_k} exceeds num_experts {num_experts}"),
            ));
        }
        let sliding_window = if raw.bool_or("use_sliding_window", false)? {
            Some(raw.positive("sliding_window")?)
        } else {
            None
        };
        Ok(Self {
            heads,
            kv_heads,
            head_dim,
            attention_bias: raw.bool_or("attention_bias", false)?,
            intermediate_size: raw.positive("intermediate_size")?,
            moe_intermediate_size: raw.positive("moe_intermediate_size")?,
            num_experts,
            top_k,
            norm_topk_prob: raw.bool_or("norm_topk_prob", false)?,
            decoder_sparse_step: raw.usize_any(&["decoder_sparse_step"])?.unwrap_or(1).max(1),
            mlp_only_layers: raw.usize_list("mlp_only_layers")?,
            sliding_window,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }

    /// Whether decoder layer `layer` has routed experts.
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let eps = c.common.rms_norm_eps;
    let rope = Rope::new(&c.rope, c.head_dim, false);
    let shape = |_| GqaShape {
        bias: c.attention_bias,
        o_bias: c.attention_bias,
        qk_norm_eps: Some(eps),
        window: c.sliding_window,
        ..GqaShape::new(h, c.heads, c.kv_heads, c.head_dim)
    };
    grouped_decoder(
        &c.common,
        c.common.num_layers,
        w,
        rope,
        experts,
        shape,
        |i, lw, experts| {
            let mw = lw.pp("mlp");
            if !c.is_sparse(i) {
                return Ok(FeedForward::Dense(Mlp::load(&mw, h, c.intermediate_size)?));
            }
            let shape = ExpertShape {
                count: c.num_experts,
                hidden: h,
                intermediate: c.moe_intermediate_size,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
            let scoring = Scoring::Softmax {
                renormalize: c.norm_topk_prob,
            };
            let moe = MoeBlock::load(&mw, i, h, c.num_experts, c.top_k, scoring, None)?;
            Ok(FeedForward::Sparse(moe))
        },
    )
}

/// Qwen3-MoE.
pub static FAMILY: Family = Family {
    types: &["qwen3_moe"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &["qwen3moe"],
    synth: Some(&SYNTH),
};

/// `synth --arch qwen3_moe`.
static SYNTH: Shape = Shape {
    name: "qwen3_moe",
    attention: SynthAttention::Grouped {
        qk_norm: QkNorm::PerHead,
        bias: false,
    },
    moe: Some(PROJ_MOE),
    dense_prefix: 0,
    dtypes: ALL_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "qwen3_moe",
            "head_dim": s.hidden / s.heads,
            "intermediate_size": s.dense_intermediate, "moe_intermediate_size": s.moe_intermediate,
            "num_experts": s.experts, "norm_topk_prob": true, "decoder_sparse_step": 1,
        })
    },
    head: None,
};

family_config! {
    layout: |c| grouped_layout(c.common.num_layers, c.kv_heads, c.head_dim),
}
