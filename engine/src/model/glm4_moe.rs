//! GLM-4.5, 4.5-Air, 4.6 and 4.7 (`glm4_moe`): grouped-query attention with
//! q/k/v biases (none on the output), an optional per-head q/k RMSNorm
//! (`use_qk_norm`, on for all but Air), partial rotary on the first half of
//! each head's lanes in split halves (`partial_rotary_factor`, 0.5 when the
//! config is silent, as transformers' `__post_init__` sets it), and
//! DeepSeek-V3's sigmoid-routed MoE: the correction bias steers the choice
//! only, group-limited top-k (GLM uses one group), renormalised and scaled,
//! a shared expert beside the routed ones, dense first layers.

use std::sync::Arc;

use serde_json::json;

use super::config::{ConfigError, MoeDefaults, RawConfig, check_heads, check_rotary, parse_moe};
use super::family::{Family, Parsed, family_config, grouped_layout};
use super::layers::Mlp;
use super::layers::attention::GqaShape;
use super::layers::decoder::{Decoder, FeedForward};
use super::layers::experts::{ExpertProvider, ExpertShape, PROJ_NAMES};
use super::layers::moe::SigmoidGroupedMoe;
use super::layers::rope::{Rope, RopeParams};
use super::{CommonConfig, ModelError, grouped_decoder};
use crate::synth::{ALL_DTYPES, DEEPSEEK_MOE, QkNorm, Shape, SynthAttention};
use crate::weights::Weights;

/// `Glm4MoeConfig`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_ROTARY_FACTOR: f64 = 0.5;
const DEFAULT_SHARED_EXPERTS: usize = 1;
const DEFAULT_ROUTED_SCALING: f64 = 1.0;
const DEFAULT_FIRST_DENSE: usize = 1;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    /// Whether the output projection has a bias too (dots.llm1).
    pub o_bias: bool,
    pub qk_norm: bool,
    pub intermediate_size: usize,
    pub moe: SigmoidGroupedMoe,
    pub first_k_dense_replace: usize,
    /// Per layer, the sliding window it attends through, if any.
    pub windows: Vec<Option<usize>>,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let heads = raw.positive("num_attention_heads")?;
        let kv_heads = raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads);
        check_heads(raw, heads, kv_heads)?;
        // The released configs state it: GLM-4.5's 96 heads of 128 lanes
        // are wider than its hidden size.
        let head_dim = raw
            .usize_any(&["head_dim"])?
            .unwrap_or(common.hidden_size / heads);
        let mut rope = raw.rope(DEFAULT_ROPE_THETA)?;
        if !raw.gives_rotary_factor() {
            rope.partial_rotary_factor = DEFAULT_ROTARY_FACTOR;
        }
        check_rotary(raw, head_dim, &rope)?;
        let moe = parse_moe(raw, &GLM_MOE)?;
        Ok(Self {
            heads,
            kv_heads,
            head_dim,
            attention_bias: raw.bool_or("attention_bias", false)?,
            qk_norm: raw.bool_or("use_qk_norm", false)?,
            intermediate_size: raw.positive("intermediate_size")?,
            o_bias: false,
            moe,
            first_k_dense_replace: raw
                .usize_any(&["first_k_dense_replace"])?
                .unwrap_or(DEFAULT_FIRST_DENSE),
            windows: vec![None; common.num_layers],
            rope,
            common,
        })
    }
}

const GLM_MOE: MoeDefaults = MoeDefaults {
    shared: Some(DEFAULT_SHARED_EXPERTS),
    renormalize: true,
    scaling: DEFAULT_ROUTED_SCALING,
};

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let eps = c.common.rms_norm_eps;
    let rope = Rope::new(&c.rope, c.head_dim, false);
    let shape = |i: usize| GqaShape {
        bias: c.attention_bias,
        o_bias: c.o_bias,
        qk_norm_eps: c.qk_norm.then_some(eps),
        window: c.windows.get(i).copied().flatten(),
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
            if i < c.first_k_dense_replace {
                return Ok(FeedForward::Dense(Mlp::load(&mw, h, c.intermediate_size)?));
            }
            let shape = ExpertShape {
                count: c.moe.experts,
                hidden: h,
                intermediate: c.moe.intermediate,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
            Ok(FeedForward::Sparse(c.moe.load(&mw, i, h)?))
        },
    )
}

/// GLM-4.5 to 4.7.
pub static FAMILY: Family = Family {
    types: &["glm4_moe"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch glm4_moe`: GLM-4.5's proportions (q/k norms, biases, a
/// shared expert, one dense layer first).
static SYNTH: Shape = Shape {
    name: "glm4_moe",
    attention: SynthAttention::Grouped {
        qk_norm: QkNorm::PerHead,
        bias: true,
    },
    moe: Some(DEEPSEEK_MOE),
    dense_prefix: 1,
    dtypes: ALL_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "glm4_moe",
            "head_dim": s.hidden / s.heads, "partial_rotary_factor": 0.5,
            "attention_bias": true, "use_qk_norm": true, "rope_theta": 1_000_000.0,
            "intermediate_size": s.dense_intermediate, "moe_intermediate_size": s.moe_intermediate,
            "n_routed_experts": s.experts, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
            "first_k_dense_replace": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
        })
    },
    head: None,
};

family_config! {
    layout: |c| grouped_layout(c.common.num_layers, c.kv_heads, c.head_dim),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_rotary_factor_defaults_to_a_half() {
        let raw = RawConfig::parse(
            Path::new("config.json"),
            r#"{"model_type": "glm4_moe", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
                "n_routed_experts": 4, "num_experts_per_tok": 2}"#,
        )
        .unwrap();
        let c = Config::parse(&raw).unwrap();
        assert_eq!(c.rope.partial_rotary_factor, 0.5);
        assert!(!c.attention_bias && !c.qk_norm);
        assert_eq!((c.first_k_dense_replace, c.moe.shared), (1, 1));
        assert_eq!(c.common.rms_norm_eps, 1e-5);
        assert_eq!(c.moe.scaling, 1.0);
    }
}
