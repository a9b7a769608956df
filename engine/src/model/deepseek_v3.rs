//! DeepSeek-V3 and the Kimi K2 family: multi-head latent attention (with or
//! without a low-rank query), interleaved rope with YaRN, dense first layers,
//! shared experts, and sigmoid group-limited routing whose correction bias
//! steers the choice but not the weights.

use std::sync::Arc;

use super::config::{ConfigError, RawConfig};
use super::layers::Mlp;
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{ExpertProvider, ExpertSetup, ExpertShape, PROJ_NAMES};
use super::layers::mla::{LatentAttention, MlaShape};
use super::layers::moe::{MoeBlock, SigmoidGroupedMoe};
use super::layers::rope::{Rope, RopeParams};
use super::{CommonConfig, ModelError, assemble};
use crate::weights::Weights;

const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_RMS_EPS: f64 = 1e-6;
/// Defaults of transformers' `DeepseekV3Config` for fields a config may omit.
const DEFAULT_FIRST_K_DENSE: usize = 3;
const DEFAULT_N_GROUP: usize = 8;
const DEFAULT_TOPK_GROUP: usize = 4;
const DEFAULT_ROUTED_SCALING: f64 = 2.5;
const DEFAULT_SHARED_EXPERTS: usize = 1;

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
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
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
        let n_group = raw.usize_any(&["n_group"])?.unwrap_or(DEFAULT_N_GROUP);
        let topk_group = raw
            .usize_any(&["topk_group"])?
            .unwrap_or(DEFAULT_TOPK_GROUP);
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
                .unwrap_or(DEFAULT_FIRST_K_DENSE),
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
    let h = c.common.hidden_size;
    let rope = Rope::new(&c.rope, c.qk_rope_head_dim, c.rope_interleave);
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let attention = Attention::Latent(load_attention(c, &lw.pp("self_attn"), &rope)?);
        let mw = lw.pp("mlp");
        let ffn = if i >= c.first_k_dense_replace {
            let shape = ExpertShape {
                count: c.n_routed_experts,
                hidden: h,
                intermediate: c.moe_intermediate_size,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
            FeedForward::Sparse(load_moe(c, &mw, i)?)
        } else {
            FeedForward::Dense(Mlp::load(&mw, h, c.intermediate_size)?)
        };
        layers.push(DecoderLayer::load(
            &lw,
            h,
            c.common.rms_norm_eps,
            attention,
            ffn,
        )?);
    }
    assemble(&c.common, w, layers, rope, experts)
}
