//! Hunyuan-A13B (`hunyuan_v1_moe`): grouped-query attention whose per-head
//! q/k RMSNorms (`query_layernorm`, `key_layernorm`) apply after rope, not
//! before as in Qwen3; a softmax router (`gate.wg`) whose top-k weights
//! are always renormalised, its top-k given per layer when `moe_topk` is a
//! list; one shared MLP (`shared_mlp`) beside the routed experts, every
//! layer sparse. The rope is split halves, stretched by a fixed NTK
//! `alpha` (the release labels it `"dynamic"`).
//!
//! transformers builds the routed experts and the shared MLP at
//! `intermediate_size` and always adds exactly one shared MLP, whatever
//! `moe_intermediate_size`, `num_shared_expert` and `use_mixed_mlp_moe`
//! say; configs where those disagree with what it builds are refused
//! rather than read into other shapes. Cross-layer attention (`use_cla`)
//! is not in transformers and is refused too.

use std::sync::Arc;

use serde_json::{Value, json};

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
use crate::synth::{
    Add, FLOAT_DTYPES, PROJ_MOE, QkNorm, Shape, SynthAttention, SynthSpec, experts, grouped,
};
use crate::weights::{Renamed, TensorSource, Weights, respell};

/// `HunYuanMoEV1Config`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_ROPE_THETA: f64 = 10_000.0;
/// The release's NTK stretch, for `synth`.
const RELEASED_ALPHA: f64 = 1000.0;

/// How Hunyuan spells what the model code asks for.
const NAMES: &[(&str, &str)] = &[
    ("self_attn.q_norm.", "self_attn.query_layernorm."),
    ("self_attn.k_norm.", "self_attn.key_layernorm."),
    ("mlp.gate.weight", "mlp.gate.wg.weight"),
    ("mlp.shared_experts.", "mlp.shared_mlp."),
];

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    /// The width of every expert and of the shared MLP.
    pub intermediate_size: usize,
    pub experts: usize,
    /// Experts each layer routes a token to.
    pub top_k: Vec<usize>,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let layers = common.num_layers;
        let heads = raw.positive("num_attention_heads")?;
        let kv_heads = raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads);
        check_heads(raw, heads, kv_heads)?;
        let head_dim = raw
            .usize_any(&["head_dim", "attention_head_dim"])?
            .unwrap_or(common.hidden_size / heads);
        if raw.bool_or("use_cla", false)? {
            return Err(raw.unsupported("use_cla", true, "false (no cross-layer attention)"));
        }
        if !raw.bool_or("use_mixed_mlp_moe", true)? {
            return Err(raw.unsupported("use_mixed_mlp_moe", false, "true (one shared MLP)"));
        }
        let intermediate_size = raw.positive("intermediate_size")?;
        for (field, want) in [
            ("moe_intermediate_size", intermediate_size),
            ("num_shared_expert", 1),
        ] {
            if let Some(v) = per_layer(raw, field, layers)?
                && let Some(&other) = v.iter().find(|&&x| x != want)
            {
                return Err(raw.invalid(
                    field,
                    format!("{other}: transformers builds {want} here, and so does Longhaul"),
                ));
            }
        }
        let experts = raw.positive_any(&["num_experts", "num_local_experts"])?;
        let top_k = per_layer(raw, "moe_topk", layers)?
            .or(raw
                .usize_any(&["num_experts_per_tok"])?
                .map(|k| vec![k; layers]))
            .unwrap_or_else(|| vec![1; layers]);
        if let Some(&k) = top_k.iter().find(|&&k| k == 0 || k > experts) {
            return Err(raw.invalid("moe_topk", format!("{k} is not within 1..={experts}")));
        }
        Ok(Self {
            heads,
            kv_heads,
            head_dim,
            attention_bias: raw.bool_or("attention_bias", false)?,
            intermediate_size,
            experts,
            top_k,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }
}

/// A field given as one number for every layer or as a list of one per
/// layer; `None` when absent.
fn per_layer(
    raw: &RawConfig,
    field: &str,
    layers: usize,
) -> Result<Option<Vec<usize>>, ConfigError> {
    match raw.get(field) {
        None => Ok(None),
        Some(Value::Array(_)) => {
            let list = raw.usize_list(field)?;
            if list.len() != layers {
                return Err(
                    raw.invalid(field, format!("{} entries for {layers} layers", list.len()))
                );
            }
            Ok(Some(list))
        }
        Some(_) => Ok(raw.usize_any(&[field])?.map(|v| vec![v; layers])),
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
        qk_norm_after_rope: true,
        ..GqaShape::new(h, c.heads, c.kv_heads, c.head_dim)
    };
    grouped_decoder(
        &c.common,
        c.top_k.len(),
        w,
        rope,
        experts,
        shape,
        |i, lw, experts| {
            let mw = lw.pp("mlp");
            let expert_shape = ExpertShape {
                count: c.experts,
                hidden: h,
                intermediate: c.intermediate_size,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, expert_shape)?;
            let shared = Mlp::load(&mw.pp("shared_experts"), h, c.intermediate_size)?;
            let scoring = Scoring::Softmax { renormalize: true };
            let moe = MoeBlock::load(&mw, i, h, c.experts, c.top_k[i], scoring, Some(shared))?;
            Ok(FeedForward::Sparse(moe))
        },
    )
}

/// Hunyuan-A13B.
pub static FAMILY: Family = Family {
    types: &["hunyuan_v1_moe"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch hunyuan_v1_moe`: the release's names and proportions
/// (every layer sparse, one shared MLP as wide as an expert, the NTK
/// stretch, tied embeddings).
static SYNTH: Shape = Shape {
    name: "hunyuan_v1_moe",
    attention: SynthAttention::Own(synth_layer),
    moe: None,
    dense_prefix: 0,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "hunyuan_v1_moe",
            "attention_head_dim": s.hidden / s.heads, "intermediate_size": s.moe_intermediate,
            "num_experts": s.experts, "moe_topk": vec![s.top_k; s.layers],
            "moe_intermediate_size": vec![s.moe_intermediate; s.layers],
            "num_shared_expert": vec![1; s.layers], "use_mixed_mlp_moe": true, "use_qk_norm": true,
            "use_cla": false, "tie_word_embeddings": true,
            "rope_scaling": {"alpha": RELEASED_ALPHA, "factor": 1.0, "type": "dynamic"},
        })
    },
    head: None,
};

/// Layer `l`'s attention and MoE block under Hunyuan's names.
fn synth_layer(s: &SynthSpec, p: &str, _l: usize, t: &mut Add) {
    let mut named = |name: String, shape: Vec<usize>, fill| t(respell(&name, NAMES), shape, fill);
    grouped(
        s,
        &format!("{p}.self_attn"),
        QkNorm::PerHead,
        false,
        &mut named,
    );
    let moe = crate::synth::Moe {
        shared_experts: true,
        ..PROJ_MOE
    };
    experts(s, p, &moe, &mut named);
}

family_config! {
    layout: |c| grouped_layout(c.common.num_layers, c.kv_heads, c.head_dim),

    fn released_names<'a>(
        &self,
        source: &'a dyn TensorSource,
    ) -> Option<Box<dyn TensorSource + 'a>> {
        Some(Box::new(Renamed {
            inner: source,
            pairs: NAMES,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::rope::RopeKind;
    use std::path::Path;

    fn config(extra: &str) -> Result<Config, ConfigError> {
        let raw = RawConfig::parse(
            Path::new("config.json"),
            &format!(
                r#"{{"model_type": "hunyuan_v1_moe", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 32, "num_experts": 4 {extra}}}"#
            ),
        )
        .unwrap();
        Config::parse(&raw)
    }

    #[test]
    fn the_release_spelling_reads() {
        let c = config(
            r#", "attention_head_dim": 8, "moe_topk": [2, 3], "moe_intermediate_size": [32, 32],
               "num_shared_expert": [1, 1], "use_cla": false, "use_mixed_mlp_moe": true,
               "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}"#,
        )
        .unwrap();
        assert_eq!((c.head_dim, c.top_k.clone()), (8, vec![2, 3]));
        assert_eq!(c.rope.kind, RopeKind::NtkAlpha { alpha: 1000.0 });
        assert_eq!(c.common.rms_norm_eps, 1e-5);
        assert_eq!(config(r#", "moe_topk": 2"#).unwrap().top_k, vec![2, 2]);
    }

    #[test]
    fn what_transformers_would_not_build_is_refused() {
        for (extra, field) in [
            (r#", "use_cla": true"#, "use_cla"),
            (r#", "use_mixed_mlp_moe": false"#, "use_mixed_mlp_moe"),
            (r#", "moe_intermediate_size": 16"#, "moe_intermediate_size"),
            (r#", "num_shared_expert": [1, 2]"#, "num_shared_expert"),
            (r#", "moe_topk": [2]"#, "moe_topk"),
            (r#", "moe_topk": 5"#, "moe_topk"),
            (
                r#", "rope_scaling": {"factor": 2.0, "type": "dynamic"}"#,
                "rope",
            ),
        ] {
            let err = config(extra).unwrap_err().to_string();
            assert!(err.contains(field), "{extra}: {err}");
        }
    }
}
