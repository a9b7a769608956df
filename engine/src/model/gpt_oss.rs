//! gpt-oss: grouped-query attention with biases and learnt attention sinks,
//! alternating sliding-window and full layers (`layer_types`), YaRN rope on
//! rotate-half pairs, a router with a bias whose softmax runs over the top-k
//! logits only, and experts with biases and a clamped SwiGLU.
//!
//! Experts are published two ways: MXFP4 (`gate_up_proj_blocks`/`_scales`,
//! output rows along the reduction) and, as `save_pretrained` writes them,
//! plain floats transposed (`gate_up_proj` `[E, H, 2I]`, `x · W`). Either
//! way gate and up interleave (gate on even rows, up on odd). Longhaul holds
//! an expert as its other families do — gate rows, then up rows, then down
//! rows — so the same kernels, packs and streaming serve it; the biases,
//! a few KiB per expert, stay resident.

use std::sync::Arc;

use super::config::{ConfigError, RawConfig, check_heads};
use super::family::{Family, Parsed, family_config, grouped_layout};
use super::layers::attention::{GqaShape, GroupedQueryAttention};
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{Activation, ExpertProvider, ExpertSetup};
use super::layers::moe::{ExpertBiases, ExpertExtras, MoeBlock};
use super::layers::rope::{Rope, RopeParams};
use super::layers::router::{Router, Scoring};
use super::layers::stacked::{self, GateUp, StackedExperts};
use super::layers::{Linear, values};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::Shape;
use crate::weights::Weights;

const DEFAULT_ROPE_THETA: f64 = 150_000.0;
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_SWIGLU_ALPHA: f64 = 1.702;
const DEFAULT_SWIGLU_LIMIT: f64 = 7.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    /// Each expert's intermediate size.
    pub intermediate_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub sliding_window: Option<usize>,
    /// Per layer: whether it attends through the sliding window.
    pub sliding: Vec<bool>,
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
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
        // As gpt-oss's config fills `layer_types` in: even layers slide.
        let sliding = raw.sliding_layers(common.num_layers, |i| i % 2 == 0)?;
        let sliding_window = raw.usize_any(&["sliding_window"])?;
        if sliding.iter().any(|&s| s) && sliding_window.is_none() {
            return Err(raw.missing("sliding_window"));
        }
        Ok(Self {
            heads,
            kv_heads,
            head_dim: raw
                .usize_any(&["head_dim"])?
                .unwrap_or(common.hidden_size / heads),
            attention_bias: raw.bool_or("attention_bias", true)?,
            intermediate_size: raw.positive("intermediate_size")?,
            num_experts,
            top_k,
            sliding_window,
            sliding,
            swiglu_alpha: raw.f64_or("swiglu_alpha", DEFAULT_SWIGLU_ALPHA)? as f32,
            swiglu_limit: raw.f64_or("swiglu_limit", DEFAULT_SWIGLU_LIMIT)? as f32,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }
}

impl Config {
    /// The experts' stacked layout: gate and up interleaved.
    fn stacked(&self) -> StackedExperts {
        StackedExperts {
            count: self.num_experts,
            hidden: self.common.hidden_size,
            intermediate: self.intermediate_size,
            gate_up: GateUp::Interleaved,
        }
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
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let shape = GqaShape {
            bias: c.attention_bias,
            o_bias: c.attention_bias,
            window: c.sliding_window.filter(|_| c.sliding[i]),
            sinks: true,
            ..GqaShape::new(h, c.heads, c.kv_heads, c.head_dim)
        };
        let attention = GroupedQueryAttention::load(&lw.pp("self_attn"), shape, &rope)?;
        let mw = lw.pp("mlp");
        let ew = mw.pp("experts");
        stacked::add_layer(&mut experts, &ew, i, c.stacked())?;
        let router = Linear::load(&mw, "router", h, c.num_experts, true)?;
        let moe = MoeBlock {
            layer: i,
            router: Router::new(router, c.num_experts, c.top_k, Scoring::TopKSoftmax),
            shared: None,
            shared_gate: None,
            extras: ExpertExtras {
                activation: Activation::ClampedSwiglu {
                    alpha: c.swiglu_alpha,
                    limit: c.swiglu_limit,
                },
                biases: Some(Box::new(biases(
                    &ew,
                    c.num_experts,
                    h,
                    c.intermediate_size,
                )?)),
                ..ExpertExtras::default()
            },
        };
        layers.push(DecoderLayer::load(
            &lw,
            h,
            eps,
            Attention::Grouped(attention),
            FeedForward::Sparse(moe),
        )?);
    }
    assemble(&c.common, w, layers, rope, experts)
}

/// The experts' biases with gate and up de-interleaved as their rows are.
fn biases(
    ew: &Weights,
    count: usize,
    hidden: usize,
    inter: usize,
) -> Result<ExpertBiases, ModelError> {
    if !ew.has("gate_up_proj_bias") && ew.has("0.gate_proj.bias") {
        // Per expert, gate and up apart, as a GGUF stores them.
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for e in 0..count {
            let ee = ew.pp(e);
            gate_up.extend(values(&ee.get("gate_proj.bias", &[inter])?)?);
            gate_up.extend(values(&ee.get("up_proj.bias", &[inter])?)?);
            down.extend(values(&ee.get("down_proj.bias", &[hidden])?)?);
        }
        return Ok(ExpertBiases { gate_up, down });
    }
    let gate_up = values(&ew.get("gate_up_proj_bias", &[count, 2 * inter])?)?;
    let down = values(&ew.get("down_proj_bias", &[count, hidden])?)?;
    let gate_up = gate_up
        .chunks_exact(2 * inter)
        .flat_map(|b| {
            b.iter()
                .step_by(2)
                .chain(b.iter().skip(1).step_by(2))
                .copied()
        })
        .collect();
    Ok(ExpertBiases { gate_up, down })
}

/// gpt-oss.
pub static FAMILY: Family = Family {
    types: &["gpt_oss"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &["gpt-oss"],
    synth: Some(SYNTH),
};

/// `synth --arch gpt_oss`.
static SYNTH: &Shape = &crate::synth::gpt_oss::SHAPE;

family_config! {
    layout: |c| grouped_layout(c.common.num_layers, c.kv_heads, c.head_dim),

    fn stacked_experts(&self) -> Option<StackedExperts> {
        Some(self.stacked())
    }
}
