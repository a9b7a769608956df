//! Ling 3.0 (`bailing_hybrid`, `BailingMoeV3ForCausalLM`): five layers in
//! six are Kimi Delta Attention, every sixth (`layer_group_size`) multi-head
//! latent attention; DeepSeek-V3's MoE after the first dense layers.
//!
//! What differs from Kimi-Linear: KDA's forget gate and output gate are
//! full-rank projections (`f_proj`, `g_proj`), not low-rank pairs, and its
//! decay is the "safe" gate `lower_bound · sigmoid(exp(A_log) · (f + dt_bias))`
//! (`kda_safe_gate`, `kda_lower_bound`); MLA rotates its 64 rotary lanes as
//! interleaved pairs and gates each head's output by `sigmoid(g_proj(x))`;
//! its latent norms keep their class default epsilon (1e-6) whatever
//! `rms_norm_eps` says. KDA's head size is `linear_head_dim`, else
//! `head_dim` (a release's; transformers then overwrites `head_dim` with
//! the rotary width and saves `linear_head_dim` beside it). The head is
//! never tied. Sparse layers may clamp SwiGLU after the activation, per
//! layer (`expert_swiglu_limit_list`, `share_expert_swiglu_limit_list`),
//! as Step-3.7 does; dense layers never do.
//!
//! Releases name the model as Ling's own code does: `word_embeddings`,
//! `attention` (its output `dense`), the forget gate's tensors in the
//! attention, q/k/v convolved by three kernels, `gate.expert_bias`; those
//! names are read as they are.

use std::sync::Arc;

use serde_json::json;

use super::config::{ConfigError, MoeDefaults, RawConfig, parse_moe};
use super::family::{Family, Parsed, family_config, hybrid_layout};
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{Activation, ExpertProvider, ExpertSetup, ExpertShape, PROJ_NAMES};
use super::layers::linear::DeltaShape;
use super::layers::linear::load_kda;
use super::layers::mla::{LatentAttention, MlaShape};
use super::layers::moe::SigmoidGroupedMoe;
use super::layers::rope::{Rope, RopeParams};
use super::layers::{Linear, Mlp};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::{
    Add, DEEPSEEK_MOE, FLOAT_DTYPES, Fill, MlaDims, Shape, SynthAttention, SynthSpec,
};
use crate::weights::{Renamed, TensorSource, Weights};

/// `BailingHybridConfig`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-6;
const DEFAULT_ROPE_THETA: f64 = 6_000_000.0;
const DEFAULT_HEAD_DIM: usize = 128;
const DEFAULT_KERNEL: usize = 4;
const DEFAULT_GROUP: usize = 6;
const DEFAULT_FIRST_DENSE: usize = 2;
const DEFAULT_LOWER_BOUND: f64 = -5.0;
const DEFAULT_KV_LORA: usize = 512;
const DEFAULT_NOPE: usize = 128;
const DEFAULT_ROPE: usize = 64;
const DEFAULT_V: usize = 128;
/// MLA's latent norms are built without an epsilon argument.
const LATENT_NORM_EPS: f64 = 1e-6;
const MOE: MoeDefaults = MoeDefaults {
    shared: Some(1),
    renormalize: true,
    scaling: 2.5,
};

/// How Ling's own code names what the model code asks for.
const RELEASED_NAMES: &[(&str, &str)] = &[
    ("model.embed_tokens.", "model.word_embeddings."),
    ("self_attn.forget_gate.", "attention."),
    ("self_attn.o_proj.", "attention.dense."),
    ("self_attn.", "attention."),
    ("mlp.gate.e_score_correction_bias", "mlp.gate.expert_bias"),
];

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub mla: MlaShape,
    pub kda: DeltaShape,
    /// The safe gate's bound, when `kda_safe_gate` is on.
    pub lower_bound: Option<f32>,
    pub linear: Vec<bool>,
    pub sparse: Vec<bool>,
    pub intermediate_size: usize,
    pub moe: SigmoidGroupedMoe,
    pub rope: RopeParams,
    /// Per layer, the routed experts' SwiGLU clamp, and the shared expert's.
    pub limits: Vec<Option<f32>>,
    pub shared_limits: Vec<Option<f32>>,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let mut common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        common.tie_word_embeddings = false;
        let n = common.num_layers;
        let heads = raw.positive("num_attention_heads")?;
        let linear_heads = raw.usize_any(&["linear_num_heads"])?.unwrap_or(heads);
        let head_dim = raw
            .usize_any(&["linear_head_dim", "head_dim"])?
            .unwrap_or(DEFAULT_HEAD_DIM);
        let kernel = raw
            .usize_any(&["linear_conv_kernel_dim", "short_conv_kernel_size"])?
            .unwrap_or(DEFAULT_KERNEL);
        let group = raw
            .usize_any(&["layer_group_size"])?
            .unwrap_or(DEFAULT_GROUP)
            .max(1);
        if head_dim == 0 || kernel == 0 {
            return Err(raw.invalid("head_dim", "KDA's head size and kernel must be positive"));
        }
        let lower_bound = raw
            .bool_or("kda_safe_gate", true)?
            .then(|| raw.f64_or("kda_lower_bound", DEFAULT_LOWER_BOUND))
            .transpose()?
            .map(|b| b as f32);
        Ok(Self {
            mla: MlaShape {
                hidden: common.hidden_size,
                heads,
                q_lora_rank: raw.usize_any(&["q_lora_rank"])?,
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
            kda: DeltaShape {
                k_heads: linear_heads,
                v_heads: linear_heads,
                k_dim: head_dim,
                v_dim: head_dim,
                kernel,
            },
            lower_bound,
            linear: raw.linear_layers(n, |i| !(i + 1).is_multiple_of(group))?,
            sparse: raw.sparse_layers(n, DEFAULT_FIRST_DENSE)?,
            intermediate_size: raw.positive("intermediate_size")?,
            moe: parse_moe(raw, &MOE)?,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            limits: swiglu_limits(raw, ["expert_swiglu_limit_list", "swiglu_limits"], n)?,
            shared_limits: swiglu_limits(
                raw,
                ["share_expert_swiglu_limit_list", "swiglu_limits_shared"],
                n,
            )?,
            common,
        })
    }
}

/// A per-layer SwiGLU clamp list under either of its names: 0 (or no
/// list) means none. transformers requires one entry per layer.
fn swiglu_limits(
    raw: &RawConfig,
    names: [&str; 2],
    layers: usize,
) -> Result<Vec<Option<f32>>, ConfigError> {
    let Some(name) = names
        .into_iter()
        .find(|n| raw.get(n).is_some_and(|v| !v.is_null()))
    else {
        return Ok(vec![None; layers]);
    };
    let list = raw.numbers(name)?.unwrap_or_default();
    if list.len() != layers {
        return Err(raw.invalid(
            name,
            format!(
                "has {} limits, but num_hidden_layers is {layers} (one per layer)",
                list.len()
            ),
        ));
    }
    Ok(list
        .into_iter()
        .map(|l| l.filter(|&l| l != 0.0).map(|l| l as f32))
        .collect())
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let rope = Rope::new(&c.rope, c.mla.rope, true);
    let scale = c
        .rope
        .mla_softmax_scale(1.0 / ((c.mla.nope + c.mla.rope) as f64).sqrt());
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let aw = lw.pp("self_attn");
        let attention = if c.linear[i] {
            let eps = c.common.rms_norm_eps;
            Attention::Linear(Box::new(load_kda(&aw, h, c.kda, eps, c.lower_bound)?))
        } else {
            let mut mla = LatentAttention::load(&aw, &c.mla, &rope, scale)?;
            mla.head_gate = Some(Linear::load(&aw, "g_proj", h, c.mla.heads, false)?);
            Attention::Latent(mla)
        };
        let mw = lw.pp("mlp");
        let ffn = if c.sparse[i] {
            let shape = ExpertShape {
                count: c.moe.experts,
                hidden: h,
                intermediate: c.moe.intermediate,
            };
            experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
            let mut moe = c.moe.load(&mw, i, h)?;
            if let Some(limit) = c.limits[i] {
                moe.extras.activation = Activation::SiluClamped { limit };
            }
            if let (Some(limit), Some(shared)) = (c.shared_limits[i], moe.shared.as_mut()) {
                shared.activation = Activation::SiluClamped { limit };
            }
            FeedForward::Sparse(moe)
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

/// Ling 3.0.
pub static FAMILY: Family = Family {
    types: &["bailing_hybrid"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch bailing_hybrid`: Ling-3.0-flash's kind (MLA every sixth
/// layer, KDA between, one dense layer first, a shared expert).
static SYNTH: Shape = Shape {
    name: "bailing_hybrid",
    attention: SynthAttention::Own(synth_attention),
    moe: Some(DEEPSEEK_MOE),
    dense_prefix: 1,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config: |s| {
        let m = MlaDims::of(s);
        json!({
            "model_type": "bailing_hybrid", "head_dim": s.hidden / s.heads,
            "kv_lora_rank": m.kv_lora, "q_lora_rank": null, "qk_nope_head_dim": m.nope,
            "qk_rope_head_dim": m.rope, "v_head_dim": m.v, "layer_group_size": 6,
            "intermediate_size": s.dense_intermediate, "moe_intermediate_size": s.moe_intermediate,
            "num_experts": s.experts, "num_experts_per_token": s.top_k, "num_expert_group": 1,
            "topk_group": 1, "first_k_dense_replace": 1, "rope_theta": DEFAULT_ROPE_THETA,
        })
    },
    head: None,
};

/// Layer `l`'s attention under transformers' names.
fn synth_attention(s: &SynthSpec, p: &str, l: usize, t: &mut Add) {
    let a = format!("{p}.self_attn");
    let h = s.hidden;
    let std = |fan_in: usize| Fill::Uniform(1.0 / (fan_in as f32).sqrt());
    if (l + 1).is_multiple_of(DEFAULT_GROUP) {
        let m = MlaDims::of(s);
        t(
            format!("{a}.q_proj.weight"),
            vec![s.heads * (m.nope + m.rope), h],
            std(h),
        );
        crate::synth::latent_kv(s, &a, m.kv_lora + m.rope, t);
        t(format!("{a}.g_proj.weight"), vec![s.heads, h], std(h));
        return;
    }
    let width = h;
    for name in ["q_proj", "k_proj", "v_proj", "g_proj", "forget_gate.f_proj"] {
        t(format!("{a}.{name}.weight"), vec![width, h], std(h));
    }
    t(
        format!("{a}.conv1d.weight"),
        vec![3 * width, 1, DEFAULT_KERNEL],
        std(DEFAULT_KERNEL),
    );
    t(format!("{a}.forget_gate.A_log"), vec![s.heads], Fill::Zeros);
    t(format!("{a}.forget_gate.dt_bias"), vec![width], Fill::Zeros);
    t(format!("{a}.b_proj.weight"), vec![s.heads, h], std(h));
    t(
        format!("{a}.o_norm.weight"),
        vec![width / s.heads],
        Fill::NearOne,
    );
    t(format!("{a}.o_proj.weight"), vec![h, width], std(width));
}

family_config! {
    /// KDA layers' fixed state; MLA layers' latents.
    layout: |c| {
        hybrid_layout(
            &c.linear,
            c.kda.state_values(),
            c.mla.kv_lora_rank + c.mla.rope,
        )
    },

    /// Ling's own names, where the files use them.
    fn released_names<'a>(
        &self,
        source: &'a dyn TensorSource,
    ) -> Option<Box<dyn TensorSource + 'a>> {
        Renamed::where_present(source, "model.word_embeddings.weight", RELEASED_NAMES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_release_config_reads() {
        let raw = RawConfig::parse(
            Path::new("config.json"),
            r#"{"model_type": "bailing_hybrid", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 7, "num_attention_heads": 4, "head_dim": 16,
                "intermediate_size": 64, "moe_intermediate_size": 16, "num_experts": 16,
                "num_experts_per_token": 4, "num_shared_experts": 1, "num_expert_group": 4,
                "topk_group": 2, "moe_renormalize": true, "routed_scaling_factor": 2.5,
                "q_lora_rank": null, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                "qk_rope_head_dim": 8, "v_head_dim": 16, "layer_group_size": 3,
                "first_k_dense_replace": 2, "kda_safe_gate": true, "kda_lower_bound": -5.0,
                "tie_word_embeddings": true, "rms_norm_eps": 1e-5}"#,
        )
        .unwrap();
        let c = Config::parse(&raw).unwrap();
        assert_eq!(c.linear, vec![true, true, false, true, true, false, true]);
        assert_eq!(c.sparse, vec![false, false, true, true, true, true, true]);
        assert_eq!(
            (c.moe.experts, c.moe.top_k, c.moe.n_group, c.moe.topk_group),
            (16, 4, 4, 2)
        );
        assert_eq!(
            (c.kda.k_dim, c.mla.eps, c.lower_bound),
            (16, 1e-6, Some(-5.0))
        );
        assert!(!c.common.tie_word_embeddings);
        assert_eq!(
            (c.limits.clone(), c.shared_limits.clone()),
            (vec![None; 7], vec![None; 7])
        );
    }

    /// A config as transformers 5.25 saves it: `head_dim` is the rotary
    /// width, KDA's size is `linear_head_dim`; per-layer SwiGLU clamps
    /// under either name, one per layer.
    #[test]
    fn the_saved_config_and_its_clamps_read() {
        let text = |extra: &str| {
            format!(
                r#"{{"model_type": "bailing_hybrid", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 3, "num_attention_heads": 4, "head_dim": 8,
                "linear_head_dim": 16, "linear_num_heads": 4, "linear_conv_kernel_dim": 3,
                "intermediate_size": 64, "moe_intermediate_size": 16, "num_experts": 4,
                "num_experts_per_token": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                "qk_rope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": 1 {extra}}}"#
            )
        };
        let parse = |extra: &str| {
            Config::parse(&RawConfig::parse(Path::new("config.json"), &text(extra)).unwrap())
        };
        let c = parse(
            r#", "expert_swiglu_limit_list": [0, 7.0, 0],
                 "swiglu_limits_shared": [0, 0, 16]"#,
        )
        .unwrap();
        assert_eq!((c.kda.k_dim, c.kda.v_dim, c.kda.kernel), (16, 16, 3));
        assert_eq!(c.limits, vec![None, Some(7.0), None]);
        assert_eq!(c.shared_limits, vec![None, None, Some(16.0)]);
        let err = parse(r#", "expert_swiglu_limit_list": [7.0]"#).unwrap_err();
        assert!(
            err.to_string().contains("expert_swiglu_limit_list"),
            "{err}"
        );
    }
}
