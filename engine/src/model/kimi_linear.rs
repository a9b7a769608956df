//! Kimi-Linear (and the Kimi K3 line's shape): Kimi Delta Attention on most
//! layers, multi-head latent attention without rotary on the rest (every
//! fourth by default), a dense first layer, then MoE layers with sigmoid
//! group-limited routing (DeepSeek-V3's) and shared experts.
//!
//! Names are read as the release spells them (`block_sparse_moe`, `w1/w2/w3`,
//! `q_conv1d`, the forget gate's tensors under `self_attn`) or as
//! transformers 5.24 holds them (`mlp`, `gate_up_proj`, `conv1d`,
//! `forget_gate.*`).

use std::sync::Arc;

use super::config::{ConfigError, RawConfig};
use super::family::{Family, Parsed, family_config, hybrid_layout};
use super::layers::Mlp;
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{
    ExpertNames, ExpertProvider, ExpertSetup, ExpertShape, MIXTRAL_NAMES, PROJ_NAMES,
};
use super::layers::linear::{DeltaShape, load_kda};
use super::layers::mla::{LatentAttention, MlaShape};
use super::layers::moe::{MoeBlock, SigmoidGroupedMoe};
use super::layers::rope::{Rope, RopeKind, RopeParams};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::Shape;
use crate::weights::Weights;

/// Defaults of transformers' `KimiLinearConfig` for fields a config may omit.
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_ROUTED_SCALING: f64 = 2.446;
const DEFAULT_FIRST_K_DENSE: usize = 1;
const DEFAULT_LINEAR_HEAD_DIM: usize = 128;
const DEFAULT_LINEAR_HEADS: usize = 32;
const DEFAULT_CONV_KERNEL: usize = 4;
/// Without `layer_types`, every fourth layer after the first is full attention.
const DEFAULT_FULL_ATTENTION_EVERY: usize = 4;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub mla: MlaShape,
    pub linear: DeltaShape,
    /// Per layer: linear attention (true) or MLA.
    pub linear_layers: Vec<bool>,
    /// Per layer: MoE (true) or a dense MLP.
    pub sparse_layers: Vec<bool>,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_experts: usize,
    pub shared_experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub renormalize: bool,
    pub routed_scaling_factor: f64,
}

/// `layer_types` given, or the release's 1-based `full_attn_layers` /
/// `kda_layers` lists, or the default pattern.
fn linear_layers(
    raw: &RawConfig,
    lin: Option<&RawConfig>,
    n: usize,
) -> Result<Vec<bool>, ConfigError> {
    if raw.get("layer_types").is_none()
        && let Some(lin) = lin
        && lin.get("full_attn_layers").is_some()
    {
        let full = lin.usize_list("full_attn_layers")?;
        let kda = lin.usize_list("kda_layers")?;
        let mut kinds = vec![None; n];
        for (list, linear) in [(&full, false), (&kda, true)] {
            for &l in list.iter() {
                let slot = l
                    .checked_sub(1)
                    .and_then(|i| kinds.get_mut(i))
                    .ok_or_else(|| lin.invalid("full_attn_layers", format!("layer {l} of {n}")))?;
                *slot = Some(linear);
            }
        }
        return kinds
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                k.ok_or_else(|| lin.invalid("kda_layers", format!("layer {} has no type", i + 1)))
            })
            .collect();
    }
    raw.linear_layers(n, |i| i == 0 || i % DEFAULT_FULL_ATTENTION_EVERY != 0)
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let lin = match raw.get("linear_attn_config") {
            Some(v) if !v.is_null() => Some(raw.sub_config("linear_attn_config")?),
            _ => None,
        };
        let from_lin = |key: &str, top: &str, default: usize| -> Result<usize, ConfigError> {
            if let Some(lin) = &lin
                && let Some(v) = lin.usize_any(&[key])?
            {
                return Ok(v);
            }
            Ok(raw.usize_any(&[top])?.unwrap_or(default))
        };
        let linear_heads = from_lin("num_heads", "linear_num_heads", DEFAULT_LINEAR_HEADS)?;
        let head_dim = from_lin("head_dim", "linear_head_dim", DEFAULT_LINEAR_HEAD_DIM)?;
        let kernel = from_lin(
            "short_conv_kernel_size",
            "linear_conv_kernel_dim",
            DEFAULT_CONV_KERNEL,
        )?;
        if linear_heads == 0 || head_dim == 0 || kernel == 0 {
            return Err(raw.invalid(
                "linear_attn_config",
                "heads, head size and kernel must be positive",
            ));
        }
        let n = common.num_layers;
        let num_experts =
            raw.positive_any(&["num_experts", "num_local_experts", "n_routed_experts"])?;
        let n_group = raw
            .usize_any(&["num_expert_group", "n_group"])?
            .unwrap_or(1);
        let topk_group = raw.usize_any(&["topk_group"])?.unwrap_or(1);
        let top_k = raw.positive_any(&["num_experts_per_token", "num_experts_per_tok"])?;
        if n_group == 0
            || !num_experts.is_multiple_of(n_group)
            || topk_group == 0
            || topk_group > n_group
        {
            return Err(raw.invalid(
                "num_expert_group",
                format!("{n_group} groups, {topk_group} kept, for {num_experts} experts"),
            ));
        }
        if top_k > num_experts / n_group * topk_group {
            return Err(raw.invalid(
                "num_experts_per_token",
                format!("{top_k} exceeds the experts in the kept groups"),
            ));
        }
        let renormalize = match raw.get("moe_renormalize") {
            Some(_) => raw.bool_or("moe_renormalize", true)?,
            None => raw.bool_or("norm_topk_prob", true)?,
        };
        Ok(Self {
            mla: MlaShape {
                hidden: common.hidden_size,
                heads: raw.positive("num_attention_heads")?,
                q_lora_rank: raw.usize_any(&["q_lora_rank"])?,
                kv_lora_rank: raw.positive("kv_lora_rank")?,
                nope: raw.usize_req("qk_nope_head_dim")?,
                rope: raw.usize_req("qk_rope_head_dim")?,
                v: raw.positive("v_head_dim")?,
                bias: raw.bool_or("attention_bias", false)?,
                eps: common.rms_norm_eps,
            },
            linear: DeltaShape {
                k_heads: linear_heads,
                v_heads: linear_heads,
                k_dim: head_dim,
                v_dim: head_dim,
                kernel,
            },
            linear_layers: linear_layers(raw, lin.as_ref(), n)?,
            sparse_layers: raw.sparse_layers(n, DEFAULT_FIRST_K_DENSE)?,
            intermediate_size: raw.positive("intermediate_size")?,
            moe_intermediate_size: raw.positive("moe_intermediate_size")?,
            num_experts,
            shared_experts: raw
                .usize_any(&["num_shared_experts", "n_shared_experts"])?
                .unwrap_or(1),
            top_k,
            n_group,
            topk_group,
            renormalize,
            routed_scaling_factor: raw.f64_or("routed_scaling_factor", DEFAULT_ROUTED_SCALING)?,
            common,
        })
    }
}

fn load_moe(c: &Config, w: &Weights, layer: usize) -> Result<MoeBlock, ModelError> {
    let moe = SigmoidGroupedMoe {
        experts: c.num_experts,
        top_k: c.top_k,
        n_group: c.n_group,
        topk_group: c.topk_group,
        renormalize: c.renormalize,
        scaling: c.routed_scaling_factor,
        intermediate: c.moe_intermediate_size,
        shared: c.shared_experts,
    };
    moe.load(w, layer, c.common.hidden_size)
}

/// The MoE's folder and expert names: the release's or transformers'.
fn moe_names<'a>(lw: &Weights<'a>) -> (Weights<'a>, ExpertNames) {
    if lw.pp("block_sparse_moe").has("gate.weight") {
        (lw.pp("block_sparse_moe"), MIXTRAL_NAMES)
    } else {
        (lw.pp("mlp"), PROJ_NAMES)
    }
}

/// A dense layer's folder: `mlp`, or `block_sparse_moe` as transformers'
/// `save_pretrained` writes every MLP of this family back (its conversion
/// renames `.block_sparse_moe.` to `.mlp.` on load and back on save).
fn dense_names<'a>(lw: &Weights<'a>) -> Weights<'a> {
    if !lw.pp("mlp").has("gate_proj.weight") && lw.pp("block_sparse_moe").has("gate_proj.weight") {
        lw.pp("block_sparse_moe")
    } else {
        lw.pp("mlp")
    }
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    // MLA without rotary: the shared key part is used as it is.
    let no_rope = RopeParams {
        theta: 1.0,
        partial_rotary_factor: 0.0,
        kind: RopeKind::Default,
    };
    let rope = Rope::new(&no_rope, c.mla.rope, false);
    let scale = 1.0 / ((c.mla.nope + c.mla.rope) as f64).sqrt();
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let aw = lw.pp("self_attn");
        let attention = if c.linear_layers[i] {
            Attention::Linear(Box::new(load_kda(
                &aw,
                h,
                c.linear,
                c.common.rms_norm_eps,
                None,
            )?))
        } else {
            Attention::Latent(LatentAttention::load(&aw, &c.mla, &rope, scale)?)
        };
        let ffn = if c.sparse_layers[i] {
            let (mw, names) = moe_names(&lw);
            let shape = ExpertShape {
                count: c.num_experts,
                hidden: h,
                intermediate: c.moe_intermediate_size,
            };
            experts.add_layer(&mw, names, i, shape)?;
            FeedForward::Sparse(load_moe(c, &mw, i)?)
        } else {
            FeedForward::Dense(Mlp::load(&dense_names(&lw), h, c.intermediate_size)?)
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

/// Kimi-Linear (the Kimi K3 line's kind).
pub static FAMILY: Family = Family {
    types: &["kimi_linear"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(SYNTH),
};

/// `synth --arch kimi_linear`.
static SYNTH: &Shape = &crate::synth::kimi_linear::SHAPE;

family_config! {
    /// Linear layers' fixed state; the others' latents.
    layout: |c| {
        hybrid_layout(
            &c.linear_layers,
            c.linear.state_values(),
            c.mla.kv_lora_rank + c.mla.rope,
        )
    },
}
