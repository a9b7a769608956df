//! Step-3.5-Flash and Step-3.7-Flash (`step3p5`, and `step3p7` wrapping it
//! with a vision tower whose text model sits under `model.language_model.`).
//!
//! Full-attention and sliding-window layers differ in more than the mask:
//! sliding layers have their own query-head count and each type its own
//! rope (the releases: a half of each head rotated at θ 5·10⁶ with Llama
//! 3.1's stretch on full layers, every lane at θ 10⁴ on sliding ones), so a
//! layer rotates by its own tables. Queries and keys get zero-centred
//! per-head norms before rope; a sigmoid gate per head from `g_proj` scales
//! the output; the softmax scale is `query_pre_attn_scalar^-½`. Every norm
//! scales by `1 + weight`. Routing is sigmoid with a correction bias for
//! the choice, renormalised, then scaled (`moe_router_scaling_factor`),
//! beside a shared expert of `share_expert_dim`; the first layers are
//! dense (`moe_layers_enum` or `mlp_layer_types`). Experts, shared and
//! dense MLPs clamp after the activation on the layers
//! `swiglu_limits`/`swiglu_limits_shared` name.
//!
//! The release spells this in legacy fields transformers reads in its
//! config's `__post_init__`, and so does this file: per-layer lists of
//! `rope_theta` and `partial_rotary_factors` (padded, like `layer_types`,
//! with the MTP layers after the decoder), `attention_other_setting` for
//! the sliding heads, `rope_scaling` for full layers only, `hidden_act`
//! `swigluoai` (computed as SiLU). Step-3.7's NVFP4 release is refused by
//! its quantisation format.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::config::{ConfigError, RawConfig, check_heads};
use super::family::{Family, Parsed, family_config, grouped_layout};
use super::layers::attention::{GqaShape, GroupedQueryAttention};
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{Activation, ExpertProvider, ExpertSetup, ExpertShape, PROJ_NAMES};
use super::layers::moe::MoeBlock;
use super::layers::rope::{Rope, RopeParams};
use super::layers::router::Scoring;
use super::layers::{Mlp, RmsNorm};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::{DEEPSEEK_MOE, FLOAT_DTYPES, QkNorm, Shape, SynthAttention};
use crate::weights::{Renamed, TensorSource, Weights};

/// How the release spells what the model code asks for (transformers'
/// names): the MoE block is `moe`, its experts three stacks.
const RELEASED_NAMES: &[(&str, &str)] = &[
    ("mlp.gate.e_score_correction_bias", "moe.router_bias"),
    ("mlp.gate.weight", "moe.gate.weight"),
    ("mlp.shared_experts.", "share_expert."),
    ("mlp.experts.", "moe."),
];

/// `Step3p7TextConfig`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_HEAD_DIM: usize = 128;
const DEFAULT_KV_HEADS: usize = 8;
const DEFAULT_EXPERTS: usize = 288;
const DEFAULT_TOP_K: usize = 8;
const DEFAULT_MOE_INTERMEDIATE: usize = 1280;
/// Layers before this are dense when the config names no MoE layers.
const DEFAULT_FIRST_SPARSE: usize = 3;
/// Norms scale by `1 + weight`.
const CENTRED: f32 = 1.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub sliding_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub share_expert_dim: usize,
    pub experts: usize,
    pub top_k: usize,
    pub scaling: f64,
    pub sliding_window: Option<usize>,
    /// Per layer: sliding or full attention, sparse or dense.
    pub sliding: Vec<bool>,
    pub sparse: Vec<bool>,
    pub rope_full: RopeParams,
    pub rope_sliding: RopeParams,
    pub query_pre_attn_scalar: f64,
    /// Whether `g_proj` gates per head (else per lane).
    pub gate_per_head: bool,
    /// Per layer: the clamp of the routed experts, and of the shared and dense MLPs.
    pub limits: Vec<Option<f32>>,
    pub shared_limits: Vec<Option<f32>>,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        if let Some(act) = raw.str_opt("hidden_act")?
            && !["silu", "swish", "swigluoai"].contains(&act)
        {
            return Err(raw.unsupported("hidden_act", act, "silu, swigluoai"));
        }
        let common = CommonConfig::parse(&raw.without("hidden_act"), DEFAULT_RMS_EPS)?;
        let layers = common.num_layers;
        let mtp = raw
            .usize_any(&["num_nextn_predict_layers", "num_mtp_layers"])?
            .unwrap_or(0);
        if raw.bool_or("use_bidirectional_attention", false)? {
            return Err(raw.unsupported("use_bidirectional_attention", true, "false"));
        }
        // Biases transformers' Step-3.7 would add to the projections; no
        // release sets them, and read as absent they would be dropped.
        for field in ["attention_bias", "mlp_bias"] {
            if raw.bool_or(field, false)? {
                return Err(raw.unsupported(field, true, "false"));
            }
        }
        let heads = raw.positive("num_attention_heads")?;
        let sliding_heads = match raw.usize_any(&["num_sliding_attention_heads"])? {
            Some(n) => n,
            None => raw
                .get("attention_other_setting")
                .and_then(|o| o.get("num_attention_heads"))
                .and_then(Value::as_u64)
                .map_or(heads, |n| n as usize),
        };
        let kv_heads = raw
            .usize_any(&["num_key_value_heads", "num_attention_groups"])?
            .unwrap_or(DEFAULT_KV_HEADS);
        check_heads(raw, heads, kv_heads)?;
        check_heads(raw, sliding_heads, kv_heads)?;
        let head_dim = raw.usize_any(&["head_dim"])?.unwrap_or(DEFAULT_HEAD_DIM);
        let types = trimmed_strings(raw, "layer_types", layers, mtp)?;
        let sliding = match types {
            None => vec![false; layers],
            Some(t) => t
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(false),
                    "sliding_attention" => Ok(true),
                    other => Err(raw.unsupported(
                        "layer_types",
                        other,
                        "full_attention, sliding_attention",
                    )),
                })
                .collect::<Result<_, _>>()?,
        };
        let sliding_window = raw.usize_any(&["sliding_window"])?;
        if sliding.contains(&true) && sliding_window.is_none() {
            return Err(raw.missing("sliding_window"));
        }
        let (rope_full, rope_sliding) = ropes(raw, &sliding, mtp)?;
        let gating = raw.get("gating");
        Ok(Self {
            heads,
            sliding_heads,
            kv_heads,
            head_dim,
            intermediate_size: raw.positive("intermediate_size")?,
            moe_intermediate_size: raw
                .usize_any(&["moe_intermediate_size"])?
                .unwrap_or(DEFAULT_MOE_INTERMEDIATE),
            share_expert_dim: raw
                .usize_any(&["share_expert_dim", "share_expert_dims"])?
                .unwrap_or(DEFAULT_MOE_INTERMEDIATE),
            experts: raw
                .usize_any(&["n_routed_experts", "moe_num_experts", "num_local_experts"])?
                .unwrap_or(DEFAULT_EXPERTS),
            top_k: raw
                .usize_any(&["num_experts_per_tok", "moe_top_k"])?
                .unwrap_or(DEFAULT_TOP_K),
            scaling: raw.f64_or("moe_router_scaling_factor", 1.0)?,
            sliding_window,
            sparse: sparse_layers(raw, layers, mtp)?,
            sliding,
            rope_full,
            rope_sliding,
            query_pre_attn_scalar: raw.positive_f64_or("query_pre_attn_scalar", head_dim as f64)?,
            gate_per_head: gating.is_none_or(|g| g == &json!(true) || g == &json!("per-head")),
            limits: limits(raw, "swiglu_limits", layers, mtp)?,
            shared_limits: limits(raw, "swiglu_limits_shared", layers, mtp)?,
            common,
        })
    }
}

/// A per-layer list, without the MTP layers' entries the release pads it
/// with; `None` when absent.
fn trimmed<T>(
    raw: &RawConfig,
    field: &str,
    list: Vec<T>,
    layers: usize,
    mtp: usize,
) -> Result<Vec<T>, ConfigError> {
    match list.len() {
        n if n == layers => Ok(list),
        n if n == layers + mtp => Ok(list.into_iter().take(layers).collect()),
        n => Err(raw.invalid(field, format!("{n} entries for {layers} layers"))),
    }
}

fn trimmed_strings(
    raw: &RawConfig,
    field: &str,
    layers: usize,
    mtp: usize,
) -> Result<Option<Vec<String>>, ConfigError> {
    raw.str_list(field)?
        .map(|l| trimmed(raw, field, l, layers, mtp))
        .transpose()
}

/// Per layer, a clamp bound: 0 and `null` mean none.
fn limits(
    raw: &RawConfig,
    field: &str,
    layers: usize,
    mtp: usize,
) -> Result<Vec<Option<f32>>, ConfigError> {
    let Some(list) = raw.numbers(field)? else {
        return Ok(vec![None; layers]);
    };
    Ok(trimmed(raw, field, list, layers, mtp)?
        .into_iter()
        .map(|l| l.filter(|&l| l != 0.0).map(|l| l as f32))
        .collect())
}

/// `mlp_layer_types`, else `moe_layers_enum` (a comma-separated string or
/// a list of MoE layers), else every layer from the fourth on.
fn sparse_layers(raw: &RawConfig, layers: usize, mtp: usize) -> Result<Vec<bool>, ConfigError> {
    if let Some(types) = trimmed_strings(raw, "mlp_layer_types", layers, mtp)? {
        return types
            .iter()
            .map(|t| match t.as_str() {
                "sparse" => Ok(true),
                "dense" => Ok(false),
                other => Err(raw.unsupported("mlp_layer_types", other, "sparse, dense")),
            })
            .collect();
    }
    let listed: Option<Vec<usize>> = match raw.get("moe_layers_enum") {
        None => None,
        Some(Value::String(s)) => Some(
            s.split(',')
                .filter(|p| !p.trim().is_empty())
                .map(|p| p.trim().parse::<usize>())
                .collect::<Result<_, _>>()
                .map_err(|_| raw.invalid("moe_layers_enum", "expected layer numbers"))?,
        ),
        Some(_) => Some(raw.usize_list("moe_layers_enum")?),
    };
    Ok((0..layers)
        .map(|i| {
            listed
                .as_ref()
                .map_or(i >= DEFAULT_FIRST_SPARSE, |l| l.contains(&i))
        })
        .collect())
}

/// The full and sliding layers' rope: `rope_parameters` per layer type, or
/// the release's `rope_theta` (one, or one per layer) and
/// `partial_rotary_factors`, from the first layer of each type, with
/// `rope_scaling` on full layers.
fn ropes(
    raw: &RawConfig,
    sliding: &[bool],
    mtp: usize,
) -> Result<(RopeParams, RopeParams), ConfigError> {
    let per_type = raw.get("rope_parameters").and_then(Value::as_object);
    let layers = sliding.len();
    // One `rope_theta` for every layer, or a list of one per layer.
    let thetas = match raw.get("rope_theta") {
        Some(Value::Array(_)) => raw
            .numbers("rope_theta")?
            .map(|list| trimmed(raw, "rope_theta", list, layers, mtp))
            .transpose()?,
        _ => None,
    };
    let factors = match raw.numbers("partial_rotary_factors")? {
        Some(list) => Some(trimmed(raw, "partial_rotary_factors", list, layers, mtp)?),
        None => None,
    };
    let rope_for = |kind: &str, is_sliding: bool| -> Result<RopeParams, ConfigError> {
        if let Some(p) = per_type
            .and_then(|m| m.get(kind))
            .and_then(Value::as_object)
        {
            return raw.rope_from(
                &format!("rope_parameters.{kind}"),
                p.clone(),
                DEFAULT_ROPE_THETA,
            );
        }
        let first = sliding.iter().position(|&s| s == is_sliding).unwrap_or(0);
        let mut params = Map::new();
        params.insert("rope_type".into(), json!("default"));
        let theta = match &thetas {
            Some(t) => t.get(first).copied().flatten(),
            None => raw.f64_opt("rope_theta")?,
        };
        params.insert(
            "rope_theta".into(),
            json!(theta.unwrap_or(DEFAULT_ROPE_THETA)),
        );
        if let Some(f) = factors
            .as_ref()
            .and_then(|f| f.get(first).copied().flatten())
        {
            params.insert("partial_rotary_factor".into(), json!(f));
        }
        if !is_sliding && let Some(Value::Object(scaling)) = raw.get("rope_scaling") {
            params.extend(scaling.clone());
            if let (false, Some(kind)) = (scaling.contains_key("rope_type"), scaling.get("type")) {
                params.insert("rope_type".into(), kind.clone());
            }
        }
        raw.rope_from("rope_scaling", params, DEFAULT_ROPE_THETA)
    };
    Ok((
        rope_for("full_attention", false)?,
        rope_for("sliding_attention", true)?,
    ))
}

/// An MLP with Step's clamp, where the layer has one.
fn clamped(mut mlp: Mlp, limit: Option<f32>) -> Mlp {
    if let Some(limit) = limit {
        mlp.activation = Activation::SiluClamped { limit };
    }
    mlp
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let eps = c.common.rms_norm_eps;
    let full_rope = Rope::new(&c.rope_full, c.head_dim, false);
    let sliding_rope = Rope::new(&c.rope_sliding, c.head_dim, false);
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let (heads, rope) = if c.sliding[i] {
            (c.sliding_heads, &sliding_rope)
        } else {
            (c.heads, &full_rope)
        };
        let shape = GqaShape {
            qk_norm_eps: Some(eps),
            centred_norms: true,
            window: c.sliding_window.filter(|_| c.sliding[i]),
            head_gate: Some(if c.gate_per_head {
                heads
            } else {
                heads * c.head_dim
            }),
            softmax_scale: Some(1.0 / c.query_pre_attn_scalar.sqrt()),
            own_rope: true,
            ..GqaShape::new(h, heads, c.kv_heads, c.head_dim)
        };
        let attention = GroupedQueryAttention::load(&lw.pp("self_attn"), shape, rope)?;
        let mw = lw.pp("mlp");
        let shared_limit = c.shared_limits[i];
        let ffn = if c.sparse[i] {
            let shape = ExpertShape {
                count: c.experts,
                hidden: h,
                intermediate: c.moe_intermediate_size,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
            let bias = mw
                .pp("gate")
                .get("e_score_correction_bias", &[c.experts])?
                .to_vec1()?;
            let scoring = Scoring::SigmoidGrouped {
                correction_bias: bias,
                n_group: 1,
                topk_group: 1,
                renormalize: true,
                scaling: c.scaling as f32,
            };
            let shared = Mlp::load(&mw.pp("shared_experts"), h, c.share_expert_dim)?;
            let mut moe = MoeBlock::load(
                &mw,
                i,
                h,
                c.experts,
                c.top_k,
                scoring,
                Some(clamped(shared, shared_limit)),
            )?;
            if let Some(limit) = c.limits[i] {
                moe.extras.activation = Activation::SiluClamped { limit };
            }
            FeedForward::Sparse(moe)
        } else {
            FeedForward::Dense(clamped(
                Mlp::load(&mw, h, c.intermediate_size)?,
                shared_limit,
            ))
        };
        let attention = Attention::Grouped(attention);
        layers.push(DecoderLayer::load_offset(
            &lw, h, eps, CENTRED, attention, ffn,
        )?);
    }
    let mut decoder = assemble(&c.common, w, layers, full_rope, experts)?;
    decoder.norm = RmsNorm::load_offset(&w.pp("model"), "norm", h, eps, CENTRED)?;
    Ok(decoder)
}

/// Step-3.5 and 3.7.
pub static FAMILY: Family = Family {
    types: &["step3p7", "step3p5"],
    parse: parse_config,
    gguf: &[],
    synth: Some(&SYNTH),
};

/// Reads a config of the family's `model_type` values.
fn parse_config(raw: &RawConfig, model_type: &str) -> Result<Parsed, ConfigError> {
    if model_type == "step3p5" {
        return Ok(Parsed::plain(Config::parse(raw)?));
    }
    let text = raw.sub_config("text_config")?;
    Ok(Parsed {
        quantization: super::quantization::parse(&text)?,
        nested_language_model: true,
        ..Parsed::plain(Config::parse(&text)?)
    })
}

/// `synth --arch step3p5`: Step-3.5-Flash's kind, as its flat text config
/// (every layer full attention, every layer sparse past the first).
static SYNTH: Shape = Shape {
    name: "step3p5",
    attention: SynthAttention::Own(synth_attention),
    moe: Some(DEEPSEEK_MOE),
    dense_prefix: 1,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "step3p5", "head_dim": s.hidden / s.heads,
            "intermediate_size": s.dense_intermediate, "moe_intermediate_size": s.moe_intermediate,
            "share_expert_dim": s.moe_intermediate, "n_routed_experts": s.experts,
            "moe_layers_enum": (1..s.layers).map(|l| l.to_string()).collect::<Vec<_>>().join(","),
            "moe_router_scaling_factor": 3.0, "rope_theta": 5_000_000.0, "partial_rotary_factors": vec![0.5; s.layers],
        })
    },
    head: None,
};

fn synth_attention(s: &crate::synth::SynthSpec, p: &str, _l: usize, t: &mut crate::synth::Add) {
    let a = format!("{p}.self_attn");
    crate::synth::grouped(s, &a, QkNorm::PerHead, false, t);
    let std = 1.0 / (s.hidden as f32).sqrt();
    t(
        format!("{a}.g_proj.weight"),
        vec![s.heads, s.hidden],
        crate::synth::Fill::Uniform(std),
    );
}

family_config! {
    layout: |c| grouped_layout(c.common.num_layers, c.kv_heads, c.head_dim),

    /// The release's names, where its first sparse layer has them.
    fn released_names<'a>(
        &self,
        source: &'a dyn TensorSource,
    ) -> Option<Box<dyn TensorSource + 'a>> {
        let first = self.sparse.iter().position(|&s| s)?;
        let probe = format!("model.layers.{first}.moe.gate.weight");
        Renamed::where_present(source, &probe, RELEASED_NAMES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::rope::RopeKind;
    use std::path::Path;

    /// Step-3.7-Flash's legacy fields, scaled down: five layers plus one
    /// MTP layer padding every per-layer list.
    const RELEASED: &str = r#"{"model_type": "step3p5", "vocab_size": 8, "hidden_size": 64,
        "num_hidden_layers": 5, "num_nextn_predict_layers": 1, "num_attention_heads": 4,
        "num_attention_groups": 2, "head_dim": 16, "intermediate_size": 64,
        "hidden_act": "swigluoai", "moe_layers_enum": "2,3,4", "sliding_window": 8,
        "attention_other_setting": {"num_attention_heads": 6, "num_attention_groups": 2},
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention",
                        "sliding_attention", "full_attention", "full_attention"],
        "rope_theta": [5000000.0, 10000.0, 10000.0, 10000.0, 5000000.0, 5000000.0],
        "partial_rotary_factors": [0.5, 1.0, 1.0, 1.0, 0.5, 0.5],
        "rope_scaling": {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 32.0, "original_max_position_embeddings": 16},
        "swiglu_limits": [0, 0, 0, 7, 7, 0], "swiglu_limits_shared": [0, 0, 0, 0, 16, 0]}"#;

    #[test]
    fn the_release_legacy_fields_read_as_transformers_reads_them() {
        let c =
            Config::parse(&RawConfig::parse(Path::new("config.json"), RELEASED).unwrap()).unwrap();
        assert_eq!((c.heads, c.sliding_heads, c.kv_heads), (4, 6, 2));
        assert_eq!(c.sliding, vec![false, true, true, true, false]);
        assert_eq!(c.sparse, vec![false, false, true, true, true]);
        assert_eq!(
            (c.rope_full.theta, c.rope_full.partial_rotary_factor),
            (5e6, 0.5)
        );
        assert!(matches!(c.rope_full.kind, RopeKind::Llama3 { .. }));
        assert_eq!(
            (c.rope_sliding.theta, c.rope_sliding.kind.clone()),
            (1e4, RopeKind::Default)
        );
        assert_eq!(c.limits, vec![None, None, None, Some(7.0), Some(7.0)]);
        assert_eq!(c.shared_limits[4], Some(16.0));
        assert_eq!(c.query_pre_attn_scalar, 16.0);
        assert!(c.gate_per_head);
    }

    #[test]
    fn without_moe_layers_the_first_three_are_dense() {
        let raw = RawConfig::parse(
            Path::new("config.json"),
            r#"{"model_type": "step3p5", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 5, "num_attention_heads": 4, "intermediate_size": 64,
                "num_key_value_heads": 2}"#,
        )
        .unwrap();
        let c = Config::parse(&raw).unwrap();
        assert_eq!(c.sparse, vec![false, false, false, true, true]);
        assert_eq!(c.sliding, vec![false; 5]);
    }

    /// Biases the model would add are refused by name, never dropped.
    #[test]
    fn projection_biases_are_refused_by_name() {
        for field in ["attention_bias", "mlp_bias"] {
            let text = RELEASED.replacen('{', &format!(r#"{{"{field}": true, "#), 1);
            let raw = RawConfig::parse(Path::new("config.json"), &text).unwrap();
            let err = Config::parse(&raw).unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
    }
}
