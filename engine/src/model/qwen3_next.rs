//! Qwen3-Next and Qwen3.5-MoE (text): Gated DeltaNet on three layers of
//! four, gated full attention (the query projection doubled for a per-head
//! output gate, q/k norms, partial rotary) on the fourth, zero-centred
//! RMSNorms (`1 + weight`), and MoE layers with softmax routing and a shared
//! expert scaled by a sigmoid gate.
//!
//! Qwen3-Next stores Gated DeltaNet's input projections interleaved per key
//! head (`in_proj_qkvz`, `in_proj_ba`); they are regrouped into queries,
//! keys, values and gates once, at load. Qwen3.5 stores them apart. The
//! multimodal Qwen3.5 release nests the text model under
//! `model.language_model.`; its interleaved MRoPE gives text positions the
//! same angle on all three sections, which is plain rotary.

use std::sync::Arc;

use super::config::{ConfigError, RawConfig};
use super::family::{Family, Parsed, family_config};
use super::layers::attention::{GqaShape, GroupedQueryAttention};
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{ExpertProvider, ExpertSetup, ExpertShape, PROJ_NAMES};
use super::layers::linear::{Decay, DeltaShape, LinearAttention, OutputGate, load_conv, load_flat};
use super::layers::moe::MoeBlock;
use super::layers::rope::{Rope, RopeParams};
use super::layers::router::Scoring;
use super::layers::{Linear, Mlp, RmsNorm, Stacked};
use super::state::{SlotKind, StateLayout};
use super::{CommonConfig, ModelError};
use crate::kernels::Matrix;
use crate::weights::Weights;

const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_RMS_EPS: f64 = 1e-6;
const DEFAULT_PARTIAL_ROTARY: f64 = 0.25;
const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;
const DEFAULT_CONV_KERNEL: usize = 4;
/// Zero-centred norms scale by `1 + weight`.
const CENTRED: f32 = 1.0;

/// Where Gated DeltaNet's input projections come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projections {
    /// `in_proj_qkvz` and `in_proj_ba`, interleaved per key head (Qwen3-Next).
    Interleaved,
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` (Qwen3.5).
    Apart,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    pub linear: DeltaShape,
    pub projections: Projections,
    pub linear_layers: Vec<bool>,
    pub sparse_layers: Vec<bool>,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub shared_intermediate_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub rope: RopeParams,
}

impl Config {
    /// `qwen3_5` selects Qwen3.5-MoE's text model: projections apart, every
    /// layer sparse, weights always renormalised.
    pub fn parse(raw: &RawConfig, qwen3_5: bool) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let n = common.num_layers;
        let heads = raw.positive("num_attention_heads")?;
        let k_heads = raw.positive("linear_num_key_heads")?;
        let v_heads = raw.positive("linear_num_value_heads")?;
        if !v_heads.is_multiple_of(k_heads) {
            return Err(raw.invalid(
                "linear_num_value_heads",
                format!("{v_heads} is not a multiple of linear_num_key_heads {k_heads}"),
            ));
        }
        let interval = raw
            .usize_any(&["full_attention_interval"])?
            .unwrap_or(DEFAULT_FULL_ATTENTION_INTERVAL)
            .max(1);
        let linear_layers = raw.linear_layers(n, |i| !(i + 1).is_multiple_of(interval))?;
        let num_experts = raw.positive_any(&["num_experts", "num_local_experts"])?;
        let sparse_layers = if qwen3_5 {
            vec![true; n]
        } else {
            let only = raw.usize_list("mlp_only_layers")?;
            let step = raw.usize_any(&["decoder_sparse_step"])?.unwrap_or(1).max(1);
            (0..n)
                .map(|i| !only.contains(&i) && (i + 1).is_multiple_of(step))
                .collect()
        };
        let mut rope = raw.rope(DEFAULT_ROPE_THETA)?;
        if raw.get("partial_rotary_factor").is_none()
            && raw
                .get("rope_parameters")
                .and_then(|p| p.get("partial_rotary_factor"))
                .is_none()
        {
            rope.partial_rotary_factor = DEFAULT_PARTIAL_ROTARY;
        }
        Ok(Self {
            heads,
            kv_heads: raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads),
            head_dim: raw.positive("head_dim")?,
            attention_bias: raw.bool_or("attention_bias", false)?,
            linear: DeltaShape {
                k_heads,
                v_heads,
                k_dim: raw.positive("linear_key_head_dim")?,
                v_dim: raw.positive("linear_value_head_dim")?,
                kernel: raw
                    .usize_any(&["linear_conv_kernel_dim"])?
                    .unwrap_or(DEFAULT_CONV_KERNEL),
            },
            projections: if qwen3_5 {
                Projections::Apart
            } else {
                Projections::Interleaved
            },
            linear_layers,
            intermediate_size: if sparse_layers.iter().all(|s| *s) {
                0
            } else {
                raw.positive("intermediate_size")?
            },
            sparse_layers,
            moe_intermediate_size: raw.positive("moe_intermediate_size")?,
            shared_intermediate_size: raw.positive("shared_expert_intermediate_size")?,
            num_experts,
            top_k: raw.positive("num_experts_per_tok")?,
            norm_topk_prob: qwen3_5 || raw.bool_or("norm_topk_prob", true)?,
            rope,
            common,
        })
    }
}

/// Rows `[first, first + count)` of every `stride`-row group of `m`, one
/// group after another.
fn every_group(
    m: &Matrix,
    groups: usize,
    stride: usize,
    first: usize,
    count: usize,
) -> Result<Vec<Matrix>, ModelError> {
    (0..groups)
        .map(|g| Ok(m.row_range(g * stride + first, count)?))
        .collect()
}

/// `(q, k, v)`, `z`, `b`, `a` projections, regrouped from Qwen3-Next's
/// per-key-head interleaving when needed.
fn load_inputs(c: &Config, w: &Weights) -> Result<(Stacked, Linear, Linear, Linear), ModelError> {
    let s = c.linear;
    let h = c.common.hidden_size;
    let (kw, vw) = (s.k_heads * s.k_dim, s.v_heads * s.v_dim);
    if c.projections == Projections::Apart {
        return Ok((
            Stacked::One(Linear::load(w, "in_proj_qkv", h, 2 * kw + vw, false)?),
            Linear::load(w, "in_proj_z", h, vw, false)?,
            Linear::load(w, "in_proj_b", h, s.v_heads, false)?,
            Linear::load(w, "in_proj_a", h, s.v_heads, false)?,
        ));
    }
    let r = s.v_heads / s.k_heads;
    let qkvz = Linear::load(w, "in_proj_qkvz", h, 2 * kw + 2 * vw, false)?;
    let stride = 2 * s.k_dim + 2 * r * s.v_dim;
    let part = |first, count| every_group(qkvz.weight(), s.k_heads, stride, first, count);
    let q = part(0, s.k_dim)?;
    let k = part(s.k_dim, s.k_dim)?;
    let v = part(2 * s.k_dim, r * s.v_dim)?;
    let z = part(2 * s.k_dim + r * s.v_dim, r * s.v_dim)?;
    let qkv: Vec<&Matrix> = q.iter().chain(&k).chain(&v).collect();
    let ba = Linear::load(w, "in_proj_ba", h, 2 * s.v_heads, false)?;
    let b = every_group(ba.weight(), s.k_heads, 2 * r, 0, r)?;
    let a = every_group(ba.weight(), s.k_heads, 2 * r, r, r)?;
    let stack = |parts: &[Matrix]| -> Result<Linear, ModelError> {
        Ok(Linear::from_matrix(Matrix::stack(
            &parts.iter().collect::<Vec<_>>(),
        )?))
    };
    Ok((
        Stacked::One(Linear::from_matrix(Matrix::stack(&qkv)?)),
        stack(&z)?,
        stack(&b)?,
        stack(&a)?,
    ))
}

fn load_delta_net(c: &Config, w: &Weights) -> Result<LinearAttention, ModelError> {
    let s = c.linear;
    let (qkv, z, b, a) = load_inputs(c, w)?;
    Ok(LinearAttention {
        qkv,
        beta: b,
        decay: Decay::PerHead {
            a,
            a_log: load_flat(w, "A_log", s.v_heads)?,
            dt_bias: load_flat(w, "dt_bias", s.v_heads)?,
        },
        gate: OutputGate::Silu(z),
        conv: load_conv(w, &s)?,
        norm: RmsNorm::load(w, "norm", s.v_dim, c.common.rms_norm_eps)?,
        out: Linear::load(
            w,
            "out_proj",
            s.v_heads * s.v_dim,
            c.common.hidden_size,
            false,
        )?,
        shape: s,
    })
}

fn load_moe(c: &Config, w: &Weights, layer: usize) -> Result<MoeBlock, ModelError> {
    let h = c.common.hidden_size;
    let scoring = Scoring::Softmax {
        renormalize: c.norm_topk_prob,
    };
    let shared = Mlp::load(&w.pp("shared_expert"), h, c.shared_intermediate_size)?;
    let mut block = MoeBlock::load(w, layer, h, c.num_experts, c.top_k, scoring, Some(shared))?;
    block.shared_gate = Some(Box::new(Linear::load(
        w,
        "shared_expert_gate",
        h,
        1,
        false,
    )?));
    Ok(block)
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let eps = c.common.rms_norm_eps;
    let rope = Rope::new(&c.rope, c.head_dim, false);
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let attention = if c.linear_layers[i] {
            Attention::Linear(Box::new(load_delta_net(c, &lw.pp("linear_attn"))?))
        } else {
            let shape = GqaShape {
                bias: c.attention_bias,
                o_bias: c.attention_bias,
                qk_norm_eps: Some(eps),
                output_gate: true,
                centred_norms: true,
                ..GqaShape::new(h, c.heads, c.kv_heads, c.head_dim)
            };
            Attention::Grouped(GroupedQueryAttention::load(
                &lw.pp("self_attn"),
                shape,
                &rope,
            )?)
        };
        let mw = lw.pp("mlp");
        let ffn = if c.sparse_layers[i] {
            let shape = ExpertShape {
                count: c.num_experts,
                hidden: h,
                intermediate: c.moe_intermediate_size,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
            FeedForward::Sparse(load_moe(c, &mw, i)?)
        } else {
            FeedForward::Dense(Mlp::load(&mw, h, c.intermediate_size)?)
        };
        layers.push(DecoderLayer::load_offset(
            &lw, h, eps, CENTRED, attention, ffn,
        )?);
    }
    let mut decoder = super::assemble(&c.common, w, layers, rope, experts)?;
    decoder.norm = RmsNorm::load_offset(&w.pp("model"), "norm", h, eps, CENTRED)?;
    Ok(decoder)
}

/// Qwen3-Next and Qwen3.5-MoE's text model.
pub static FAMILY: Family = Family {
    types: &["qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"],
    parse: parse_family,
    gguf: &[],
    synth: None,
};

/// Reads a config of one of [`FAMILY`]'s types.
fn parse_family(raw: &RawConfig, model_type: &str) -> Result<Parsed, ConfigError> {
    match model_type {
        "qwen3_next" => Ok(Parsed::plain(Config::parse(raw, false)?)),
        "qwen3_5_moe_text" => Ok(Parsed::plain(Config::parse(raw, true)?)),
        // The vision tower is not used; text positions make MRoPE plain rotary.
        _ => {
            let text = raw.sub_config("text_config")?;
            Ok(Parsed {
                quantization: super::quantization::parse(&text)?,
                nested_language_model: true,
                ..Parsed::plain(Config::parse(&text, true)?)
            })
        }
    }
}

family_config! {
    /// Linear layers' fixed state; the gated attention layers' keys and values.
    layout: |c| {
        StateLayout::layers(c.linear_layers.iter().map(|&linear| {
            if linear {
                SlotKind::Fixed {
                    values: c.linear.state_values(),
                }
            } else {
                SlotKind::Appending {
                    per_position: 2 * c.kv_heads * c.head_dim,
                }
            }
        }))
    },
}
