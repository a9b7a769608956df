//! dots.llm1 (`dots1`): Qwen3's attention (per-head q/k RMSNorm before a
//! full split-half rotary, one bias flag for q/k/v and the output) with
//! DeepSeek-V3's sigmoid-routed MoE (correction bias for the choice only,
//! group-limited top-k, renormalised and scaled, shared experts, dense
//! first layers). It is GLM-4.5's decoder with other defaults, so it
//! parses into GLM-4.5's config and builds through it.
//!
//! Sliding windows follow transformers' `Dots1Config`: `layer_types` when
//! given, else layers from `max_window_layers` on slide while
//! `sliding_window` (4096 when absent) is not `null`. The release sets
//! `max_window_layers` to its 62 layers, so nothing slides there.

use serde_json::json;

use super::CommonConfig;
use super::config::{ConfigError, MoeDefaults, RawConfig, check_heads, check_rotary, parse_moe};
use super::family::{Family, Parsed};
use super::glm4_moe;
use crate::synth::{ALL_DTYPES, DEEPSEEK_MOE, QkNorm, Shape, SynthAttention};

/// `Dots1Config`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-6;
const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_SLIDING_WINDOW: usize = 4096;
const DEFAULT_MAX_WINDOW_LAYERS: usize = 62;
const DEFAULT_FIRST_DENSE: usize = 0;
const MOE: MoeDefaults = MoeDefaults {
    shared: None,
    renormalize: false,
    scaling: 1.0,
};

pub fn parse(raw: &RawConfig) -> Result<glm4_moe::Config, ConfigError> {
    let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
    let layers = common.num_layers;
    let heads = raw.positive("num_attention_heads")?;
    let kv_heads = raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads);
    check_heads(raw, heads, kv_heads)?;
    let head_dim = raw
        .usize_any(&["head_dim"])?
        .unwrap_or(common.hidden_size / heads);
    let rope = raw.rope(DEFAULT_ROPE_THETA)?;
    check_rotary(raw, head_dim, &rope)?;
    let window = if raw.has("sliding_window") {
        raw.usize_any(&["sliding_window"])?
    } else {
        Some(DEFAULT_SLIDING_WINDOW)
    };
    let from = raw
        .usize_any(&["max_window_layers"])?
        .unwrap_or(DEFAULT_MAX_WINDOW_LAYERS);
    let sliding = raw.sliding_layers(layers, |i| window.is_some() && i >= from)?;
    if sliding.iter().any(|&s| s) && window.is_none() {
        return Err(raw.missing("sliding_window"));
    }
    let bias = raw.bool_or("attention_bias", false)?;
    let first_dense = raw
        .usize_any(&["first_k_dense_replace"])?
        .unwrap_or(DEFAULT_FIRST_DENSE);
    Ok(glm4_moe::Config {
        heads,
        kv_heads,
        head_dim,
        attention_bias: bias,
        o_bias: bias,
        qk_norm: true,
        intermediate_size: raw.positive("intermediate_size")?,
        moe: parse_moe(raw, &MOE)?,
        first_k_dense_replace: first_dense,
        windows: sliding.iter().map(|&s| window.filter(|_| s)).collect(),
        rope,
        common,
    })
}

/// dots.llm1.
pub static FAMILY: Family = Family {
    types: &["dots1"],
    parse: |raw, _| Ok(Parsed::plain(parse(raw)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch dots1`: the release's proportions (q/k norms, no biases,
/// a shared expert, one dense layer first, nothing sliding).
static SYNTH: Shape = Shape {
    name: "dots1",
    attention: SynthAttention::Grouped {
        qk_norm: QkNorm::PerHead,
        bias: false,
    },
    moe: Some(DEEPSEEK_MOE),
    dense_prefix: 1,
    dtypes: ALL_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "dots1",
            "head_dim": s.hidden / s.heads, "rope_theta": 10_000_000.0,
            "intermediate_size": s.dense_intermediate, "moe_intermediate_size": s.moe_intermediate,
            "n_routed_experts": s.experts, "n_shared_experts": 1, "n_group": null, "topk_group": null,
            "first_k_dense_replace": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
            "sliding_window": null, "max_window_layers": s.layers,
        })
    },
    head: None,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(extra: &str) -> Result<glm4_moe::Config, ConfigError> {
        let raw = RawConfig::parse(
            Path::new("config.json"),
            &format!(
                r#"{{"model_type": "dots1", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 4, "num_attention_heads": 4,
                "intermediate_size": 64, "moe_intermediate_size": 16,
                "n_routed_experts": 4, "num_experts_per_tok": 2 {extra}}}"#
            ),
        )
        .unwrap();
        parse(&raw)
    }

    #[test]
    fn defaults_follow_dots1_config() {
        let c = config(r#", "n_shared_experts": 2, "n_group": null"#).unwrap();
        assert_eq!(
            (c.kv_heads, c.head_dim, c.first_k_dense_replace),
            (4, 16, 0)
        );
        assert!(c.qk_norm && !c.attention_bias && !c.moe.renormalize);
        assert_eq!((c.moe.n_group, c.moe.shared, c.moe.scaling), (1, 2, 1.0));
        assert_eq!(c.common.rms_norm_eps, 1e-6);
        assert_eq!(c.rope.partial_rotary_factor, 1.0);
        // 62 window layers by default: none of 4 slides.
        assert_eq!(c.windows, vec![None; 4]);
    }

    #[test]
    fn layers_past_max_window_layers_slide_unless_the_window_is_null() {
        let c = config(r#", "n_shared_experts": 1, "max_window_layers": 2"#).unwrap();
        let w = Some(DEFAULT_SLIDING_WINDOW);
        assert_eq!(c.windows, vec![None, None, w, w]);
        let c =
            config(r#", "n_shared_experts": 1, "max_window_layers": 2, "sliding_window": null"#)
                .unwrap();
        assert_eq!(c.windows, vec![None; 4]);
        let types =
            r#"["full_attention", "sliding_attention", "full_attention", "full_attention"]"#;
        let c = config(&format!(
            r#", "n_shared_experts": 1, "sliding_window": 5, "layer_types": {types}"#
        ))
        .unwrap();
        assert_eq!(c.windows, vec![None, Some(5), None, None]);
    }

    #[test]
    fn shared_experts_must_be_stated() {
        let err = config("").unwrap_err().to_string();
        assert!(err.contains("n_shared_experts"), "{err}");
    }
}
