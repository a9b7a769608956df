//! ERNIE 4.5 MoE (`ernie4_5_moe`): Llama's grouped-query attention with
//! rope on interleaved pairs, and a softmax router whose correction bias
//! (`moe_statics`) steers the choice only; the chosen probabilities are
//! divided by their sum (at least `moe_norm_min`). Shared experts sit
//! beside the routed ones; layers `moe_layer_start_index` to
//! `moe_layer_end_index`, every `moe_layer_interval`-th, are sparse and the
//! rest dense. Embeddings are tied unless the config says otherwise.
//!
//! transformers saves the bias as `mlp.gate.moe_statics.…`, the PT
//! releases as `mlp.moe_statics.…`; both are read. Their MTP blocks
//! (`mtp_*`) are not part of the decoder and are left alone. `use_bias`
//! (biases on every projection and the head) is in no MoE release and is
//! refused.

use std::sync::Arc;

use serde_json::json;

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
use crate::synth::{FLOAT_DTYPES, Moe, PROJ_MOE, QkNorm, RouterBias, Shape, SynthAttention};
use crate::weights::Weights;

/// `Ernie4_5_MoeConfig`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_ROPE_THETA: f64 = 500_000.0;
const DEFAULT_SHARED_EXPERTS: usize = 2;
const DEFAULT_START: usize = 1;
const DEFAULT_NORM_MIN: f64 = 1e-12;
/// Where the correction bias sits: as transformers saves it, as released.
const BIAS_NAMES: [&str; 2] = [
    "gate.moe_statics.e_score_correction_bias",
    "moe_statics.e_score_correction_bias",
];

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub experts: usize,
    pub top_k: usize,
    pub shared_experts: usize,
    /// Per layer, whether it is sparse.
    pub sparse: Vec<bool>,
    pub norm_min: f64,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let mut common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        common.tie_word_embeddings = raw.bool_or("tie_word_embeddings", true)?;
        let layers = common.num_layers;
        let heads = raw.positive("num_attention_heads")?;
        let kv_heads = raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads);
        check_heads(raw, heads, kv_heads)?;
        if raw.bool_or("use_bias", false)? {
            return Err(raw.unsupported("use_bias", true, "false"));
        }
        let experts = raw.positive_any(&["moe_num_experts", "num_experts"])?;
        let top_k = raw.positive_any(&["moe_k", "num_experts_per_tok"])?;
        if top_k > experts {
            return Err(raw.invalid(
                "moe_k",
                format!("{top_k} exceeds moe_num_experts {experts}"),
            ));
        }
        let start = raw
            .usize_any(&["moe_layer_start_index"])?
            .unwrap_or(DEFAULT_START);
        // -1 (and absence) means the last layer.
        let end = match raw.get("moe_layer_end_index").and_then(|v| v.as_i64()) {
            Some(e) if e >= 0 => e as usize,
            _ => layers - 1,
        };
        let interval = raw.usize_any(&["moe_layer_interval"])?.unwrap_or(1);
        if interval == 0 {
            return Err(raw.invalid("moe_layer_interval", "must be positive"));
        }
        Ok(Self {
            heads,
            kv_heads,
            head_dim: raw
                .usize_any(&["head_dim"])?
                .unwrap_or(common.hidden_size / heads),
            intermediate_size: raw.positive("intermediate_size")?,
            moe_intermediate_size: raw.positive("moe_intermediate_size")?,
            experts,
            top_k,
            shared_experts: raw
                .usize_any(&["moe_num_shared_experts"])?
                .unwrap_or(DEFAULT_SHARED_EXPERTS),
            sparse: (0..layers)
                .map(|i| (i + 1).is_multiple_of(interval) && start <= i && i <= end)
                .collect(),
            norm_min: raw.f64_or("moe_norm_min", DEFAULT_NORM_MIN)?,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }
}

/// Layer `i`'s sparse block under `mw`.
fn load_moe(c: &Config, mw: &Weights, i: usize) -> Result<MoeBlock, ModelError> {
    let h = c.common.hidden_size;
    let bias_name = BIAS_NAMES
        .into_iter()
        .find(|n| mw.has(n))
        .unwrap_or(BIAS_NAMES[0]);
    let bias = mw
        .get(bias_name, &[1, c.experts])?
        .flatten_all()?
        .to_vec1()?;
    let shared = match c.shared_experts {
        0 => None,
        n => Some(Mlp::load(
            &mw.pp("shared_experts"),
            h,
            c.moe_intermediate_size * n,
        )?),
    };
    let scoring = Scoring::SoftmaxBiased {
        correction_bias: bias,
        norm_min: Some(c.norm_min as f32),
        scaling: 1.0,
    };
    MoeBlock::load(mw, i, h, c.experts, c.top_k, scoring, shared)
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let rope = Rope::new(&c.rope, c.head_dim, true);
    let shape = |_| GqaShape::new(h, c.heads, c.kv_heads, c.head_dim);
    grouped_decoder(
        &c.common,
        c.sparse.len(),
        w,
        rope,
        experts,
        shape,
        |i, lw, experts| {
            let mw = lw.pp("mlp");
            if !c.sparse[i] {
                return Ok(FeedForward::Dense(Mlp::load(&mw, h, c.intermediate_size)?));
            }
            let shape = ExpertShape {
                count: c.experts,
                hidden: h,
                intermediate: c.moe_intermediate_size,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
            Ok(FeedForward::Sparse(load_moe(c, &mw, i)?))
        },
    )
}

/// ERNIE 4.5 MoE.
pub static FAMILY: Family = Family {
    types: &["ernie4_5_moe"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch ernie4_5_moe`: ERNIE-4.5-21B-A3B's proportions (one dense
/// layer first, two shared experts, tied embeddings), with the router's
/// bias where the release keeps it.
static SYNTH: Shape = Shape {
    name: "ernie4_5_moe",
    attention: SynthAttention::Grouped {
        qk_norm: QkNorm::None,
        bias: false,
    },
    moe: Some(Moe {
        bias: RouterBias::MoeStatics,
        shared_experts: true,
        ..PROJ_MOE
    }),
    dense_prefix: 1,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "ernie4_5_moe", "rope_theta": DEFAULT_ROPE_THETA,
            "intermediate_size": s.dense_intermediate, "moe_intermediate_size": s.moe_intermediate,
            "moe_num_experts": s.experts, "moe_k": s.top_k, "moe_num_shared_experts": 1,
            "moe_layer_start_index": 1, "moe_layer_end_index": null, "moe_layer_interval": 1,
            "head_dim": null, "use_bias": false, "tie_word_embeddings": true,
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

    fn config(extra: &str) -> Result<Config, ConfigError> {
        let raw = RawConfig::parse(
            Path::new("config.json"),
            &format!(
                r#"{{"model_type": "ernie4_5_moe", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 64, "moe_intermediate_size": 16,
                "moe_num_experts": 4, "moe_k": 2 {extra}}}"#
            ),
        )
        .unwrap();
        Config::parse(&raw)
    }

    #[test]
    fn defaults_follow_ernie_config() {
        let c = config(r#", "head_dim": null, "moe_layer_end_index": null"#).unwrap();
        assert!(c.common.tie_word_embeddings);
        assert_eq!((c.head_dim, c.shared_experts), (16, 2));
        assert_eq!(c.sparse, vec![false, true, true, true, true]);
        assert_eq!(c.rope.theta, DEFAULT_ROPE_THETA);
        assert_eq!(c.norm_min, 1e-12);
    }

    #[test]
    fn sparse_layers_follow_start_end_and_interval() {
        let c = config(
            r#", "moe_layer_start_index": 0, "moe_layer_end_index": 3, "moe_layer_interval": 2"#,
        )
        .unwrap();
        assert_eq!(c.sparse, vec![false, true, false, true, false]);
        let err = config(r#", "use_bias": true"#).unwrap_err().to_string();
        assert!(err.contains("use_bias"), "{err}");
    }
}
