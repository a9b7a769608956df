//! LongCat-Flash (`longcat_flash`): each of its `num_layers` layers is two
//! sublayers of multi-head latent attention and a dense MLP, plus one MoE
//! block that reads the first sublayer's MLP input and whose output is
//! added after the second sublayer (the "shortcut"); the decoder runs them
//! as `2 · num_layers` sublayers with the MoE held between, so its expert
//! reads overlap the second sublayer's work.
//!
//! The router scores `n_routed_experts + zero_expert_num` experts with a
//! softmax, picks the top-k of scores plus a correction bias, and scales
//! the picked scores by `routed_scaling_factor` without renormalising.
//! Experts past `n_routed_experts` are identities (`w · x`): nothing is
//! read for them, from RAM or a drive. MLA always has a low-rank query;
//! its latent norms keep their class default epsilon (1e-6), and the
//! query and key latents are scaled by `sqrt(hidden / q_lora_rank)` and
//! `sqrt(hidden / kv_lora_rank)`, folded here into those norms' weights
//! (as vLLM does). Rope turns interleaved pairs. The release's MTP block
//! (`model.mtp.*`) is left out.

use std::sync::Arc;

use serde_json::json;

use super::config::{ConfigError, RawConfig};
use super::family::{Family, Parsed, family_config};
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{ExpertProvider, ExpertSetup, ExpertShape, PROJ_NAMES};
use super::layers::mla::{LatentAttention, MlaShape, QueryProjection};
use super::layers::moe::{ExpertExtras, MoeBlock};
use super::layers::rope::{Rope, RopeParams};
use super::layers::router::{Router, Scoring};
use super::layers::{Linear, Mlp, RmsNorm};
use super::state::{SlotKind, StateLayout};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::{
    Add, FLOAT_DTYPES, Fill, MlaDims, Shape, SynthAttention, SynthSpec, popularity,
};
use crate::weights::Weights;

/// `LongcatFlashConfig`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_ROPE_THETA: f64 = 10_000_000.0;
const DEFAULT_Q_LORA: usize = 1536;
const DEFAULT_KV_LORA: usize = 512;
const DEFAULT_NOPE: usize = 128;
const DEFAULT_ROPE: usize = 64;
const DEFAULT_V: usize = 128;
const DEFAULT_TOP_K: usize = 12;
const DEFAULT_EXPERTS: usize = 512;
const DEFAULT_ZERO_EXPERTS: usize = 256;
const DEFAULT_SCALING: f64 = 6.0;
/// MLA's latent norms are built without an epsilon argument.
const LATENT_NORM_EPS: f64 = 1e-6;
/// Sublayers per layer.
const SUBLAYERS: usize = 2;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub mla: MlaShape,
    pub ffn_hidden_size: usize,
    pub expert_ffn_hidden_size: usize,
    pub experts: usize,
    pub zero_experts: usize,
    pub top_k: usize,
    pub scaling: f64,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let layers = match raw.usize_any(&["num_layers"])? {
            Some(n) => n,
            None => raw.positive("num_hidden_layers")? / SUBLAYERS,
        };
        // The common fields count layers, not sublayers.
        let common = CommonConfig::parse(
            &raw.with("num_hidden_layers", json!(layers)),
            DEFAULT_RMS_EPS,
        )?;
        if common.num_layers == 0 {
            return Err(raw.invalid("num_layers", "must be positive"));
        }
        if let Some(kind) = raw.str_opt("zero_expert_type")?
            && kind != "identity"
        {
            return Err(raw.unsupported("zero_expert_type", kind, "identity"));
        }
        let heads = raw.positive("num_attention_heads")?;
        let experts = raw
            .usize_any(&["n_routed_experts", "num_local_experts"])?
            .unwrap_or(DEFAULT_EXPERTS);
        let zero_experts = match raw.get("zero_expert_num") {
            Some(_) => raw.usize_req("zero_expert_num")?,
            None if raw.has("zero_expert_num") => 0,
            None => DEFAULT_ZERO_EXPERTS,
        };
        let top_k = raw
            .usize_any(&["moe_topk", "num_experts_per_tok"])?
            .unwrap_or(DEFAULT_TOP_K);
        if top_k == 0 || top_k > experts + zero_experts {
            return Err(raw.invalid(
                "moe_topk",
                format!("{top_k} of {} experts", experts + zero_experts),
            ));
        }
        Ok(Self {
            mla: MlaShape {
                hidden: common.hidden_size,
                heads,
                q_lora_rank: Some(raw.usize_any(&["q_lora_rank"])?.unwrap_or(DEFAULT_Q_LORA)),
                kv_lora_rank: raw.usize_any(&["kv_lora_rank"])?.unwrap_or(DEFAULT_KV_LORA),
                nope: raw
                    .usize_any(&["qk_nope_head_dim"])?
                    .unwrap_or(DEFAULT_NOPE),
                rope: raw
                    .usize_any(&["qk_rope_head_dim"])?
                    .unwrap_or(DEFAULT_ROPE),
                v: raw.usize_any(&["v_head_dim"])?.unwrap_or(DEFAULT_V),
                bias: raw.bool_or("attention_bias", false)?,
                eps: LATENT_NORM_EPS,
            },
            ffn_hidden_size: raw.positive_any(&["ffn_hidden_size", "intermediate_size"])?,
            expert_ffn_hidden_size: raw
                .positive_any(&["expert_ffn_hidden_size", "moe_intermediate_size"])?,
            experts,
            zero_experts,
            top_k,
            scaling: raw.f64_or("routed_scaling_factor", DEFAULT_SCALING)?,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }
}

/// Sublayer `j`'s latent attention under `aw` (`self_attn.j`), the LoRA
/// scales folded into its latent norms.
fn load_mla(
    c: &Config,
    aw: &Weights,
    rope: &Rope,
    scale: f64,
) -> Result<LatentAttention, ModelError> {
    let mut mla = LatentAttention::load(aw, &c.mla, rope, scale)?;
    let h = c.common.hidden_size as f64;
    if let QueryProjection::LowRank { norm, .. } = &mut mla.q {
        let rank = c.mla.q_lora_rank.unwrap_or(DEFAULT_Q_LORA) as f64;
        *norm = norm.clone().scaled((h / rank).sqrt() as f32);
    }
    mla.kv_a_norm = mla
        .kv_a_norm
        .clone()
        .scaled((h / c.mla.kv_lora_rank as f64).sqrt() as f32);
    Ok(mla)
}

/// Layer `i`'s MoE block under `mw` (`mlp`).
fn load_moe(c: &Config, mw: &Weights, i: usize) -> Result<MoeBlock, ModelError> {
    let h = c.common.hidden_size;
    let scored = c.experts + c.zero_experts;
    let rw = mw.pp("router");
    let bias = rw.get("e_score_correction_bias", &[scored])?.to_vec1()?;
    // transformers' router reads `classifier.weight` alone: a `router_bias`
    // checkpoint's `classifier.bias` is stored but never added.
    let classifier = Linear::load(&rw, "classifier", h, scored, false)?;
    let scoring = Scoring::SoftmaxBiased {
        correction_bias: bias,
        norm_min: None,
        scaling: c.scaling as f32,
    };
    Ok(MoeBlock {
        layer: i,
        router: Router::new(classifier, scored, c.top_k, scoring),
        shared: None,
        shared_gate: None,
        extras: ExpertExtras {
            identity_from: Some(c.experts),
            ..ExpertExtras::default()
        },
    })
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let eps = c.common.rms_norm_eps;
    let rope = Rope::new(&c.rope, c.mla.rope, true);
    let scale = c
        .rope
        .mla_softmax_scale(1.0 / ((c.mla.nope + c.mla.rope) as f64).sqrt());
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(SUBLAYERS * c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let shape = ExpertShape {
            count: c.experts,
            hidden: h,
            intermediate: c.expert_ffn_hidden_size,
        };
        experts.add_layer(&lw.pp("mlp"), PROJ_NAMES, i, shape)?;
        let mut moe = Some(load_moe(c, &lw.pp("mlp"), i)?);
        for j in 0..SUBLAYERS {
            let mlp = Mlp::load(&lw.pp(format_args!("mlps.{j}")), h, c.ffn_hidden_size)?;
            let ffn = match moe.take() {
                Some(moe) => FeedForward::Shortcut {
                    mlp,
                    moe: Box::new(moe),
                },
                None => FeedForward::AddShortcut(mlp),
            };
            let attention = load_mla(c, &lw.pp(format_args!("self_attn.{j}")), &rope, scale)?;
            layers.push(DecoderLayer {
                input_norm: RmsNorm::load(&lw.pp("input_layernorm"), &j.to_string(), h, eps)?,
                attention: Attention::Latent(attention),
                post_attention_norm: RmsNorm::load(
                    &lw.pp("post_attention_layernorm"),
                    &j.to_string(),
                    h,
                    eps,
                )?,
                ffn,
                hyper: None,
            });
        }
    }
    assemble(&c.common, w, layers, rope, experts)
}

/// LongCat-Flash.
pub static FAMILY: Family = Family {
    types: &["longcat_flash"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch longcat_flash`: LongCat-Flash's kind (half as many
/// identity experts as computed ones, top-k of their sum scaled by 6, two
/// MLA sublayers and dense MLPs a layer).
static SYNTH: Shape = Shape {
    name: "longcat_flash",
    attention: SynthAttention::Own(synth_layer),
    moe: None,
    dense_prefix: 0,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config: |s| {
        let m = MlaDims::of(s);
        json!({
            "model_type": "longcat_flash", "num_layers": s.layers,
            "q_lora_rank": m.q_lora, "kv_lora_rank": m.kv_lora, "qk_nope_head_dim": m.nope,
            "qk_rope_head_dim": m.rope, "head_dim": m.rope, "v_head_dim": m.v,
            "ffn_hidden_size": s.dense_intermediate, "expert_ffn_hidden_size": s.moe_intermediate,
            "n_routed_experts": s.experts, "zero_expert_num": s.experts / 2,
            "zero_expert_type": "identity", "moe_topk": s.top_k, "routed_scaling_factor": DEFAULT_SCALING,
        })
    },
    head: None,
};

/// Layer `p`'s sublayers and MoE block (the writer's own per-layer norms
/// are spares: LongCat's are per sublayer).
fn synth_layer(s: &SynthSpec, p: &str, _l: usize, t: &mut Add) {
    let (h, m) = (s.hidden, MlaDims::of(s));
    let std = |fan_in: usize| Fill::Uniform(1.0 / (fan_in as f32).sqrt());
    for j in 0..SUBLAYERS {
        let a = format!("{p}.self_attn.{j}");
        let qk = m.nope + m.rope;
        t(format!("{a}.q_a_proj.weight"), vec![m.q_lora, h], std(h));
        t(
            format!("{a}.q_a_layernorm.weight"),
            vec![m.q_lora],
            Fill::NearOne,
        );
        t(
            format!("{a}.q_b_proj.weight"),
            vec![s.heads * qk, m.q_lora],
            std(m.q_lora),
        );
        crate::synth::latent_kv(s, &a, m.kv_lora + m.rope, t);
        let i = s.dense_intermediate;
        for (name, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)] {
            t(
                format!("{p}.mlps.{j}.{name}.weight"),
                vec![rows, cols],
                std(cols),
            );
        }
        t(
            format!("{p}.input_layernorm.{j}.weight"),
            vec![h],
            Fill::NearOne,
        );
        t(
            format!("{p}.post_attention_layernorm.{j}.weight"),
            vec![h],
            Fill::NearOne,
        );
    }
    let scored = s.experts + s.experts / 2;
    let mut pop = popularity(s.experts, s.zipf);
    pop.resize(scored, 1.0);
    t(
        format!("{p}.mlp.router.classifier.weight"),
        vec![scored, h],
        Fill::Router {
            std: 1.0 / (h as f32).sqrt(),
            popularity: pop,
        },
    );
    t(
        format!("{p}.mlp.router.e_score_correction_bias"),
        vec![scored],
        Fill::Zeros,
    );
    let i = s.moe_intermediate;
    for e in 0..s.experts {
        let x = format!("{p}.mlp.experts.{e}");
        t(format!("{x}.gate_proj.weight"), vec![i, h], std(h));
        t(format!("{x}.up_proj.weight"), vec![i, h], std(h));
        t(format!("{x}.down_proj.weight"), vec![h, i], std(i));
    }
}

family_config! {
    /// Two latent caches a layer, one per sublayer.
    layout: |c| {
        StateLayout::layers((0..SUBLAYERS * c.common.num_layers).map(|_| SlotKind::Appending {
            per_position: c.mla.kv_lora_rank + c.mla.rope,
        }))
    },

    fn last_layer_probe(&self, last: usize) -> String {
        format!("model.layers.{last}.input_layernorm.1.weight")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::family::FamilyConfig;
    use std::path::Path;

    #[test]
    fn layers_count_pairs_of_sublayers() {
        let parse = |extra: &str| {
            let raw = RawConfig::parse(
                Path::new("config.json"),
                &format!(
                    r#"{{"model_type": "longcat_flash", "vocab_size": 8, "hidden_size": 64,
                    "num_attention_heads": 4, "ffn_hidden_size": 64, "expert_ffn_hidden_size": 16 {extra}}}"#
                ),
            )
            .unwrap();
            Config::parse(&raw)
        };
        let c = parse(r#", "num_layers": 3, "zero_expert_num": null"#).unwrap();
        assert_eq!(
            (c.common.num_layers, c.zero_experts, c.experts),
            (3, 0, 512)
        );
        assert_eq!(c.state_layout().len(), 6);
        let c = parse(r#", "num_hidden_layers": 4"#).unwrap();
        assert_eq!((c.common.num_layers, c.zero_experts, c.top_k), (2, 256, 12));
        assert_eq!((c.mla.eps, c.scaling), (LATENT_NORM_EPS, 6.0));
        let err = parse(r#", "num_layers": 2, "zero_expert_type": "zero""#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("zero_expert_type"), "{err}");
    }
}
