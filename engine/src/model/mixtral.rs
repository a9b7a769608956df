//! Mixtral: grouped-query attention (optionally with a sliding window) and a
//! softmax top-k router whose chosen weights always sum to one.

use std::sync::Arc;

use super::config::{ConfigError, RawConfig, check_heads};
use super::family::{Family, Parsed, family_config, grouped_layout};
use super::layers::attention::GqaShape;
use super::layers::decoder::{Decoder, FeedForward};
use super::layers::experts::{ExpertProvider, ExpertShape, MIXTRAL_NAMES};
use super::layers::moe::MoeBlock;
use super::layers::moe::moe_block;
use super::layers::rope::{Rope, RopeParams};
use super::layers::router::Scoring;
use super::{CommonConfig, ModelError, grouped_decoder};
use crate::synth::{ALL_DTYPES, MIXTRAL_MOE, QkNorm, Shape, SynthAttention};
use crate::weights::Weights;
use serde_json::json;

const DEFAULT_ROPE_THETA: f64 = 1_000_000.0;
const DEFAULT_RMS_EPS: f64 = 1e-5;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub sliding_window: Option<usize>,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let heads = raw.positive("num_attention_heads")?;
        let kv_heads = raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads);
        check_heads(raw, heads, kv_heads)?;
        let num_experts = raw.positive_any(&["num_local_experts", "num_experts"])?;
        let top_k = raw.positive("num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(raw.invalid(
                "num_experts_per_tok",
                format!("{top_k} exceeds num_local_experts {num_experts}"),
            ));
        }
        Ok(Self {
            heads,
            kv_heads,
            head_dim: raw
                .usize_any(&["head_dim"])?
                .unwrap_or(common.hidden_size / heads),
            intermediate_size: raw.positive("intermediate_size")?,
            num_experts,
            top_k,
            sliding_window: raw.usize_any(&["sliding_window"])?,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let rope = Rope::new(&c.rope, c.head_dim, false);
    let shape = |_| GqaShape {
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
            let mw = moe_block(lw);
            let shape = ExpertShape {
                count: c.num_experts,
                hidden: h,
                intermediate: c.intermediate_size,
            };
            experts.add_layer(&mw, MIXTRAL_NAMES, i, shape)?;
            let scoring = Scoring::Softmax { renormalize: true };
            let moe = MoeBlock::load(&mw, i, h, c.num_experts, c.top_k, scoring, None)?;
            Ok(FeedForward::Sparse(moe))
        },
    )
}

/// Mixtral, and GGUF `llama` files with experts.
pub static FAMILY: Family = Family {
    types: &["mixtral"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &["llama"],
    synth: Some(&SYNTH),
};

/// `synth --arch mixtral`.
static SYNTH: Shape = Shape {
    name: "mixtral",
    attention: SynthAttention::Grouped {
        qk_norm: QkNorm::None,
        bias: false,
    },
    moe: Some(MIXTRAL_MOE),
    dense_prefix: 0,
    dtypes: ALL_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "mixtral",
            "intermediate_size": s.moe_intermediate, "num_local_experts": s.experts,
        })
    },
    head: None,
};

family_config! {
    layout: |c| grouped_layout(c.common.num_layers, c.kv_heads, c.head_dim),
}
