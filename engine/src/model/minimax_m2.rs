//! MiniMax-M2: grouped-query attention whose q/k RMSNorm spans the whole
//! projection (all heads at once, before the split into heads), partial
//! rotary (`rotary_dim` of each head's lanes, split halves), and a sigmoid
//! router whose per-expert bias steers the choice only, the chosen weights
//! always renormalised; every layer is MoE, with no shared expert.
//!
//! As transformers 5.24 computes it: the released config's `use_qk_norm`,
//! `qk_norm_type`, `scoring_func`, `use_routing_bias` and `attn_type_list`
//! are not read there (each layer always behaves as above), so values that
//! would ask for something else are refused rather than ignored.

use std::sync::Arc;

use serde_json::Value;

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
use crate::synth::{ALL_DTYPES, MIXTRAL_MOE, Moe, QkNorm, RouterBias, Shape, SynthAttention};
use crate::weights::Weights;
use serde_json::json;

const DEFAULT_ROPE_THETA: f64 = 5_000_000.0;
const DEFAULT_RMS_EPS: f64 = 1e-6;
/// transformers' default: not `hidden_size / heads` (the release's queries
/// are 6,144 wide over a hidden size of 3,072).
const DEFAULT_HEAD_DIM: usize = 128;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Each routed expert's width.
    pub intermediate_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let heads = raw.positive("num_attention_heads")?;
        let kv_heads = raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads);
        check_heads(raw, heads, kv_heads)?;
        let head_dim = raw.usize_any(&["head_dim"])?.unwrap_or(DEFAULT_HEAD_DIM);
        let num_experts = raw.positive_any(&["num_local_experts", "num_experts"])?;
        let top_k = raw.positive("num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(raw.invalid(
                "num_experts_per_tok",
                format!("{top_k} exceeds num_local_experts {num_experts}"),
            ));
        }
        refuse_other_variants(raw)?;
        let mut rope = raw.rope(DEFAULT_ROPE_THETA)?;
        // The legacy field, read when no factor is given anywhere.
        if let (false, Some(dim)) = (raw.gives_rotary_factor(), raw.usize_any(&["rotary_dim"])?) {
            rope.partial_rotary_factor = dim as f64 / head_dim as f64;
        }
        let rotated = (head_dim as f64 * rope.partial_rotary_factor) as usize;
        if rotated == 0 || rotated > head_dim || !rotated.is_multiple_of(2) {
            return Err(raw.invalid(
                "rotary_dim",
                format!("rotates {rotated} of {head_dim} lanes: must be even, 2 to head_dim"),
            ));
        }
        Ok(Self {
            heads,
            kv_heads,
            head_dim,
            intermediate_size: raw.positive("intermediate_size")?,
            num_experts,
            top_k,
            rope,
            common,
        })
    }
}

/// Settings of the released config that transformers does not read: a value
/// asking for another behaviour than the one computed is refused.
fn refuse_other_variants(raw: &RawConfig) -> Result<(), ConfigError> {
    let expect: [(&str, Value); 4] = [
        ("use_qk_norm", Value::Bool(true)),
        ("qk_norm_type", Value::from("per_layer")),
        ("scoring_func", Value::from("sigmoid")),
        ("use_routing_bias", Value::Bool(true)),
    ];
    for (key, want) in expect {
        if let Some(got) = raw.get(key).filter(|v| !v.is_null() && **v != want) {
            return Err(raw.unsupported(key, got, &want.to_string()));
        }
    }
    if let Some(n) = raw
        .usize_any(&["shared_intermediate_size"])?
        .filter(|&n| n > 0)
    {
        return Err(raw.unsupported("shared_intermediate_size", n, "0 (no shared expert)"));
    }
    if let Some(Value::Array(types)) = raw.get("attn_type_list")
        && types.iter().any(|t| t.as_u64() != Some(1))
    {
        return Err(raw.unsupported(
            "attn_type_list",
            Value::Array(types.clone()),
            "1 (full attention) for every layer",
        ));
    }
    Ok(())
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
        qk_norm_eps: Some(eps),
        qk_norm_full_width: true,
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
            // The bias sits under the block itself, not under its `gate`.
            let correction_bias: Vec<f32> = mw
                .get("e_score_correction_bias", &[c.num_experts])?
                .to_vec1()?;
            // One group: the choice is a plain top-k of the biased scores.
            let scoring = Scoring::SigmoidGrouped {
                correction_bias,
                n_group: 1,
                topk_group: 1,
                renormalize: true,
                scaling: 1.0,
            };
            let moe = MoeBlock::load(&mw, i, h, c.num_experts, c.top_k, scoring, None)?;
            Ok(FeedForward::Sparse(moe))
        },
    )
}

/// MiniMax-M2.
pub static FAMILY: Family = Family {
    types: &["minimax_m2"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch minimax_m2`: the bias under the block, as released.
static SYNTH: Shape = Shape {
    name: "minimax_m2",
    attention: SynthAttention::Grouped {
        qk_norm: QkNorm::FullWidth,
        bias: false,
    },
    moe: Some(Moe {
        bias: RouterBias::UnderBlock,
        ..MIXTRAL_MOE
    }),
    dense_prefix: 0,
    dtypes: ALL_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "minimax_m2",
            "head_dim": s.hidden / s.heads, "rotary_dim": s.hidden / s.heads / 2,
            "intermediate_size": s.moe_intermediate, "num_local_experts": s.experts,
            "rope_theta": 5_000_000.0,
        })
    },
    head: None,
};

family_config! {
    layout: |c| grouped_layout(c.common.num_layers, c.kv_heads, c.head_dim),
}
