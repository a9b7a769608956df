//! GLM-5.3-Flash (`glm5_next`, its text model `glm5_next_text`): no
//! positional encoding anywhere. Three layers in four are Kimi Delta
//! Attention (low-rank forget and output gates, the safe decay bounded by
//! `linear_lower_bound`); every fourth is latent attention without rotary
//! whose positions a k-pool lightning indexer picks: it scores pools of
//! `index_kpool` consecutive tokens and keeps `index_topk / index_kpool` of
//! them plus the query's own incomplete pool ([`Pools`]), so up to about
//! `index_topk` tokens of context it is dense causal attention. Around every
//! block, manifold-constrained hyper-connections keep `hc_mult` residual
//! streams (DeepSeek-V4's, with an unweighted mean before the final norm).
//! DeepSeek-V3 routing with a shared expert; every MLP, dense, shared and
//! routed, clamps gate and up at `swiglu_limit` before SiLU.
//!
//! The release wraps the text model in a vision-language config (text
//! under `model.language_model.`) and names the hyper-connections
//! `hc_attn_*`/`hc_ffn_*`, the forget gate's tensors in the attention, q/k/v
//! convolved by three kernels, its experts one by one, and an MTP layer
//! after the decoder; `save_pretrained` writes it back the same way.
//! transformers 5.24 lets a "shared" indexer layer reuse only the layer
//! just before it, and only if that one ran its own indexer; other
//! configs are refused.
//!
//! [`Pools`]: super::layers::indexer::Pools

use std::sync::Arc;

use serde_json::{Value, json};

use super::config::{ConfigError, MoeDefaults, RawConfig, parse_moe};
use super::family::{Family, FamilyConfig, Parsed, family_config};
use super::layers::Mlp;
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{Activation, ExpertProvider, ExpertSetup, ExpertShape, PROJ_NAMES};
use super::layers::hyper::{HyperConnection, HyperHead, HyperShape};
use super::layers::indexer::{Indexer, IndexerShape};
use super::layers::linear::DeltaShape;
use super::layers::linear::load_kda;
use super::layers::mla::{LatentAttention, MlaShape, SparseKeys};
use super::layers::moe::SigmoidGroupedMoe;
use super::layers::rope::{Rope, RopeKind, RopeParams};
use super::state::{SlotKind, SlotRole};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::{
    Add, DEEPSEEK_MOE, FLOAT_DTYPES, Fill, MlaDims, SYNTH_INDEX_TOPK, Shape, SynthAttention,
    SynthSpec,
};
use crate::weights::{Renamed, TensorSource, Weights};

/// `Glm5NextTextConfig`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_SWIGLU_LIMIT: f64 = 10.0;
const DEFAULT_INDEX_TOPK: usize = 2048;
const DEFAULT_INDEX_DIM: usize = 128;
const DEFAULT_INDEX_HEADS: usize = 32;
const DEFAULT_KPOOL: usize = 16;
const DEFAULT_LINEAR_DIM: usize = 128;
const DEFAULT_LINEAR_HEADS: usize = 64;
const DEFAULT_KERNEL: usize = 4;
const DEFAULT_LOWER_BOUND: f64 = -5.0;
const DEFAULT_HC_MULT: usize = 4;
const DEFAULT_HC_EPS: f64 = 1e-6;
const DEFAULT_SINKHORN: usize = 20;
/// Layers before this are dense when `mlp_layer_types` is absent.
const DEFAULT_DENSE: usize = 3;
const MOE: MoeDefaults = MoeDefaults {
    shared: Some(1),
    renormalize: true,
    scaling: 2.5,
};

/// How the release names what the model code asks for.
const RELEASED_NAMES: &[(&str, &str)] = &[
    ("attn_hc.fn", "hc_attn_fn"),
    ("attn_hc.base", "hc_attn_base"),
    ("attn_hc.scale", "hc_attn_scale"),
    ("ffn_hc.fn", "hc_ffn_fn"),
    ("ffn_hc.base", "hc_ffn_base"),
    ("ffn_hc.scale", "hc_ffn_scale"),
];

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub mla: MlaShape,
    pub kda: DeltaShape,
    pub lower_bound: Option<f32>,
    pub index: IndexerShape,
    pub kpool: usize,
    pub tail: bool,
    /// Per layer: linear attention; for the others, whether they run their
    /// own indexer (else reuse the layer before's choice).
    pub linear: Vec<bool>,
    pub own_indexer: Vec<bool>,
    pub sparse: Vec<bool>,
    pub intermediate_size: usize,
    pub moe: SigmoidGroupedMoe,
    pub swiglu_limit: f32,
    pub hyper: HyperShape,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let n = common.num_layers;
        if raw.usize_any(&["qk_rope_head_dim"])?.unwrap_or(0) != 0 {
            return Err(raw.invalid("qk_rope_head_dim", "GLM-5.3 has no rotary lanes (0)"));
        }
        let heads = raw.positive("num_attention_heads")?;
        let lin = match raw.get("linear_attn_config") {
            Some(Value::Object(_)) => Some(raw.sub_config("linear_attn_config")?),
            _ => None,
        };
        let from_lin = |key: &str, top: &str, default: usize| -> Result<usize, ConfigError> {
            match lin
                .as_ref()
                .map(|l| l.usize_any(&[key]))
                .transpose()?
                .flatten()
            {
                Some(v) => Ok(v),
                None => Ok(raw.usize_any(&[top])?.unwrap_or(default)),
            }
        };
        let lower_bound = lower_bound(raw, lin.as_ref())?;
        let kpool = raw.usize_any(&["index_kpool"])?.unwrap_or(DEFAULT_KPOOL);
        if kpool == 0 {
            return Err(raw.invalid("index_kpool", "must be positive"));
        }
        let top_k = raw
            .usize_any(&["index_topk"])?
            .unwrap_or(DEFAULT_INDEX_TOPK);
        // The indexer keeps `index_topk / index_kpool` whole pools;
        // transformers refuses a remainder rather than round it.
        if !top_k.is_multiple_of(kpool) {
            return Err(raw.invalid(
                "index_topk",
                format!("{top_k} is not a whole number of index_kpool's {kpool}-token pools"),
            ));
        }
        let linear = layer_kinds(raw, n)?;
        let own_indexer = indexer_kinds(raw, &linear)?;
        let kda_dim = from_lin("head_dim", "linear_head_dim", DEFAULT_LINEAR_DIM)?;
        Ok(Self {
            mla: MlaShape {
                hidden: common.hidden_size,
                heads,
                q_lora_rank: Some(raw.positive("q_lora_rank")?),
                kv_lora_rank: raw.positive("kv_lora_rank")?,
                nope: raw.positive("qk_nope_head_dim")?,
                rope: 0,
                v: raw.positive("v_head_dim")?,
                bias: raw.bool_or("attention_bias", false)?,
                eps: common.rms_norm_eps,
            },
            kda: DeltaShape {
                k_heads: from_lin("num_heads", "linear_num_heads", DEFAULT_LINEAR_HEADS)?,
                v_heads: from_lin("num_heads", "linear_num_heads", DEFAULT_LINEAR_HEADS)?,
                k_dim: kda_dim,
                v_dim: kda_dim,
                kernel: from_lin(
                    "short_conv_kernel_size",
                    "linear_conv_kernel_dim",
                    DEFAULT_KERNEL,
                )?,
            },
            lower_bound,
            index: IndexerShape {
                hidden: common.hidden_size,
                q_lora_rank: raw.positive("q_lora_rank")?,
                heads: raw
                    .usize_any(&["index_n_heads"])?
                    .unwrap_or(DEFAULT_INDEX_HEADS),
                head_dim: raw
                    .usize_any(&["index_head_dim"])?
                    .unwrap_or(DEFAULT_INDEX_DIM),
                top_k,
            },
            kpool,
            tail: raw.bool_or("index_kpool_always_select_tail", true)?,
            linear,
            own_indexer,
            sparse: raw.sparse_layers(n, DEFAULT_DENSE)?,
            intermediate_size: raw.positive("intermediate_size")?,
            moe: parse_moe(raw, &MOE)?,
            swiglu_limit: raw.positive_f64_or("swiglu_limit", DEFAULT_SWIGLU_LIMIT)? as f32,
            hyper: HyperShape {
                streams: raw
                    .usize_any(&["hc_mult"])?
                    .unwrap_or(DEFAULT_HC_MULT)
                    .max(1),
                hidden: common.hidden_size,
                norm_eps: common.rms_norm_eps,
                eps: raw.f64_or("hc_eps", DEFAULT_HC_EPS)? as f32,
                sinkhorn_iters: raw
                    .usize_any(&["hc_sinkhorn_iters"])?
                    .unwrap_or(DEFAULT_SINKHORN),
            },
            common,
        })
    }
}

/// The safe decay's bound: `linear_attn_config.gate_lower_bound`, else
/// `linear_lower_bound`; `null` turns the softplus decay back on unless the
/// linear config asks for the safe gate.
fn lower_bound(raw: &RawConfig, lin: Option<&RawConfig>) -> Result<Option<f32>, ConfigError> {
    let mut bound = if raw.has("linear_lower_bound") {
        raw.f64_opt("linear_lower_bound")?
    } else {
        Some(DEFAULT_LOWER_BOUND)
    };
    if let Some(lin) = lin {
        if lin.has("gate_lower_bound") {
            bound = lin.f64_opt("gate_lower_bound")?;
        }
        if lin.bool_or("safe_gate", true)? && bound.is_none() {
            bound = Some(DEFAULT_LOWER_BOUND);
        }
    }
    Ok(bound.map(|b| b as f32))
}

/// `layer_types` (`linear_attention`, or `indexed_attention`, which the
/// release spells `deepseek_sparse_attention` or `full_attention`), else
/// linear except every fourth layer.
fn layer_kinds(raw: &RawConfig, n: usize) -> Result<Vec<bool>, ConfigError> {
    let Some(types) = raw.str_list("layer_types")? else {
        return Ok((0..n).map(|i| i % 4 != 3).collect());
    };
    if types.len() != n {
        return Err(raw.invalid(
            "layer_types",
            format!("{} entries for {n} layers", types.len()),
        ));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "linear_attention" => Ok(true),
            "indexed_attention" | "deepseek_sparse_attention" | "full_attention" => Ok(false),
            other => {
                Err(raw.unsupported("layer_types", other, "linear_attention, indexed_attention"))
            }
        })
        .collect()
}

/// Per layer, whether it runs its own indexer: `indexer_types` (`full` or
/// `shared`), `index_topk_pattern` (`F`/`S`), or `index_topk_freq` from
/// `index_skip_topk_offset`. A shared layer must follow a layer with its
/// own indexer, as transformers requires.
fn indexer_kinds(raw: &RawConfig, linear: &[bool]) -> Result<Vec<bool>, ConfigError> {
    let n = linear.len();
    let kinds: Vec<bool> = if let Some(types) = raw.str_list("indexer_types")? {
        types.iter().map(|t| t != "shared").collect()
    } else if let Some(pattern) = raw.str_opt("index_topk_pattern")? {
        pattern.chars().map(|c| c != 'S').collect()
    } else {
        let freq = raw.usize_any(&["index_topk_freq"])?.unwrap_or(1).max(1);
        let offset = raw.usize_any(&["index_skip_topk_offset"])?.unwrap_or(2);
        (0..n)
            .map(|i| (i + 1).saturating_sub(offset).is_multiple_of(freq))
            .collect()
    };
    if kinds.len() != n {
        return Err(raw.invalid(
            "indexer_types",
            format!("{} entries for {n} layers", kinds.len()),
        ));
    }
    for i in (0..n).filter(|&i| !linear[i] && !kinds[i]) {
        if i == 0 || linear[i - 1] || !kinds[i - 1] {
            return Err(raw.invalid(
                "indexer_types",
                format!(
                    "layer {i} shares an indexer, but the layer before it runs none of its own"
                ),
            ));
        }
    }
    Ok(kinds)
}

impl Config {
    fn limited(&self, mut mlp: Mlp) -> Mlp {
        mlp.activation = Activation::LimitedSwiglu {
            limit: self.swiglu_limit,
        };
        mlp
    }

    fn feed_forward(
        &self,
        lw: &Weights,
        i: usize,
        experts: &mut ExpertSetup,
    ) -> Result<FeedForward, ModelError> {
        let (h, mw) = (self.common.hidden_size, lw.pp("mlp"));
        if !self.sparse[i] {
            return Ok(FeedForward::Dense(self.limited(Mlp::load(
                &mw,
                h,
                self.intermediate_size,
            )?)));
        }
        let shape = ExpertShape {
            count: self.moe.experts,
            hidden: h,
            intermediate: self.moe.intermediate,
        };
        experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
        let mut moe = self.moe.load(&mw, i, h)?;
        moe.shared = moe.shared.take().map(|s| self.limited(s));
        moe.extras.activation = Activation::LimitedSwiglu {
            limit: self.swiglu_limit,
        };
        Ok(FeedForward::Sparse(moe))
    }
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let eps = c.common.rms_norm_eps;
    // No rotary anywhere: a rope of no lanes.
    let none = RopeParams {
        theta: 1.0,
        partial_rotary_factor: 0.0,
        kind: RopeKind::Default,
    };
    let rope = Rope::new(&none, 0, false);
    let scale = 1.0 / (c.mla.nope as f64).sqrt();
    let layout = c.state_layout();
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let aw = lw.pp("self_attn");
        let attention = if c.linear[i] {
            Attention::Linear(Box::new(load_kda(&aw, h, c.kda, eps, c.lower_bound)?))
        } else {
            let mut mla = LatentAttention::load(&aw, &c.mla, &rope, scale)?;
            mla.sparse = Some(if c.own_indexer[i] {
                let slot = layout.slot(SlotRole::IndexKeys(i))?;
                let indexer = Indexer::load_pooled(
                    &aw.pp("indexer"),
                    &c.index,
                    &rope,
                    slot,
                    c.kpool,
                    c.tail,
                )?;
                SparseKeys::Own(Box::new(indexer))
            } else {
                SparseKeys::Shared
            });
            Attention::Latent(mla)
        };
        let ffn = c.feed_forward(&lw, i, &mut experts)?;
        let mut layer = DecoderLayer::load(&lw, h, eps, attention, ffn)?;
        layer.hyper = Some(Box::new([
            HyperConnection::load(&lw, "attn_hc", &c.hyper)?,
            HyperConnection::load(&lw, "ffn_hc", &c.hyper)?,
        ]));
        layers.push(layer);
    }
    let mut decoder = assemble(&c.common, w, layers, rope, experts)?;
    decoder.streams = c.hyper.streams;
    decoder.hyper_head = Some(HyperHead::Mean(c.hyper));
    decoder.state_slots = layout.len();
    Ok(decoder)
}

/// GLM-5.3-Flash.
pub static FAMILY: Family = Family {
    types: &["glm5_next", "glm5_next_text"],
    parse: parse_config,
    gguf: &[],
    synth: Some(&SYNTH),
};

/// Layers in a group of four that are KDA before a sparse-attention one.
const SYNTH_GROUP: usize = 4;

/// `synth --arch glm5_next`: GLM-5.3-Flash's kind as its text config
/// (three KDA layers, then sparse attention with a k-pool indexer, four
/// hyper-connected streams, three dense layers first).
static SYNTH: Shape = Shape {
    name: "glm5_next",
    attention: SynthAttention::Own(synth_layer),
    moe: Some(DEEPSEEK_MOE),
    dense_prefix: DEFAULT_DENSE,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config: |s| {
        let m = MlaDims::of(s);
        json!({
            "model_type": "glm5_next_text", "q_lora_rank": m.q_lora, "kv_lora_rank": m.kv_lora,
            "qk_nope_head_dim": m.nope, "qk_rope_head_dim": 0, "v_head_dim": m.v,
            "num_key_value_heads": s.heads, "intermediate_size": s.dense_intermediate,
            "moe_intermediate_size": s.moe_intermediate, "n_routed_experts": s.experts,
            "index_topk": SYNTH_INDEX_TOPK, "index_n_heads": m.index_heads, "index_head_dim": m.index_dim,
            "index_kpool": DEFAULT_KPOOL, "linear_head_dim": s.hidden / s.heads, "linear_num_heads": s.heads,
            "hc_mult": DEFAULT_HC_MULT,
        })
    },
    head: None,
};

/// Layer `p`'s attention and hyper-connections under transformers' names.
fn synth_layer(s: &SynthSpec, p: &str, l: usize, t: &mut Add) {
    let (h, m, n) = (s.hidden, MlaDims::of(s), DEFAULT_HC_MULT);
    let std = |fan_in: usize| Fill::Uniform(1.0 / (fan_in as f32).sqrt());
    for hc in ["attn_hc", "ffn_hc"] {
        t(format!("{p}.{hc}.fn"), vec![(2 + n) * n, n * h], std(n * h));
        t(format!("{p}.{hc}.base"), vec![(2 + n) * n], Fill::Zeros);
        t(format!("{p}.{hc}.scale"), vec![3], Fill::NearOne);
    }
    let a = format!("{p}.self_attn");
    if (l + 1).is_multiple_of(SYNTH_GROUP) {
        t(format!("{a}.q_a_proj.weight"), vec![m.q_lora, h], std(h));
        t(
            format!("{a}.q_a_layernorm.weight"),
            vec![m.q_lora],
            Fill::NearOne,
        );
        t(
            format!("{a}.q_b_proj.weight"),
            vec![s.heads * m.nope, m.q_lora],
            std(m.q_lora),
        );
        crate::synth::latent_kv(s, &a, m.kv_lora, t);
        let (x, d) = (format!("{a}.indexer"), m.index_dim);
        t(
            format!("{x}.wq_b.weight"),
            vec![m.index_heads * d, m.q_lora],
            std(m.q_lora),
        );
        t(format!("{x}.wk.weight"), vec![d, h], std(h));
        t(format!("{x}.k_norm.weight"), vec![d], Fill::NearOne);
        t(format!("{x}.k_norm.bias"), vec![d], Fill::Zeros);
        t(
            format!("{x}.weights_proj.weight"),
            vec![m.index_heads, h],
            std(h),
        );
        t(
            format!("{x}.index_kpool_compress_ape"),
            vec![DEFAULT_KPOOL, d],
            Fill::Zeros,
        );
        t(format!("{x}.index_kpool_compress_gate"), vec![d, h], std(h));
        return;
    }
    let (heads, d) = (s.heads, h / s.heads);
    let width = heads * d;
    for name in ["q_proj", "k_proj", "v_proj"] {
        t(format!("{a}.{name}.weight"), vec![width, h], std(h));
    }
    t(
        format!("{a}.conv1d.weight"),
        vec![3 * width, 1, DEFAULT_KERNEL],
        std(DEFAULT_KERNEL),
    );
    t(
        format!("{a}.forget_gate.f_a_proj.weight"),
        vec![d, h],
        std(h),
    );
    t(
        format!("{a}.forget_gate.f_b_proj.weight"),
        vec![width, d],
        std(d),
    );
    t(format!("{a}.forget_gate.A_log"), vec![heads], Fill::Zeros);
    t(format!("{a}.forget_gate.dt_bias"), vec![width], Fill::Zeros);
    t(format!("{a}.b_proj.weight"), vec![heads, h], std(h));
    t(format!("{a}.g_a_proj.weight"), vec![d, h], std(h));
    t(format!("{a}.g_b_proj.weight"), vec![width, d], std(d));
    t(format!("{a}.o_norm.weight"), vec![d], Fill::NearOne);
    t(format!("{a}.o_proj.weight"), vec![h, width], std(width));
}

/// The text config: `text_config`, or the fields at the top level (a
/// text-only checkpoint).
fn parse_config(raw: &RawConfig, _model_type: &str) -> Result<Parsed, ConfigError> {
    let nested;
    let text = match raw.get("text_config") {
        Some(Value::Object(_)) => {
            nested = raw.sub_config("text_config")?;
            &nested
        }
        _ => raw,
    };
    Ok(Parsed {
        quantization: super::quantization::parse(text)?,
        nested_language_model: true,
        ..Parsed::plain(Config::parse(text)?)
    })
}

family_config! {
    /// KDA layers' fixed state, latent layers' rows, then each indexer's
    /// key and gate rows and its completed pools' keys.
    layout: |c| {
        let mut layout = super::family::hybrid_layout(
            &c.linear,
            c.kda.state_values(),
            c.mla.kv_lora_rank,
        );
        for i in (0..c.linear.len()).filter(|&i| !c.linear[i] && c.own_indexer[i]) {
            layout.push(
                SlotRole::IndexKeys(i),
                SlotKind::Appending {
                    per_position: 3 * c.index.head_dim,
                },
            );
        }
        layout
    },

    /// The release's (and `save_pretrained`'s) hyper-connection names.
    fn released_names<'a>(
        &self,
        source: &'a dyn TensorSource,
    ) -> Option<Box<dyn TensorSource + 'a>> {
        Renamed::where_present(source, "model.layers.0.hc_attn_fn", RELEASED_NAMES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(extra: &str) -> Result<Config, ConfigError> {
        let raw = RawConfig::parse(
            Path::new("config.json"),
            &format!(
                r#"{{"model_type": "glm5_next_text", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 5, "num_attention_heads": 4, "q_lora_rank": 16,
                "kv_lora_rank": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
                "intermediate_size": 64, "moe_intermediate_size": 16, "n_routed_experts": 4,
                "num_experts_per_tok": 2 {extra}}}"#
            ),
        )
        .unwrap();
        Config::parse(&raw)
    }

    #[test]
    fn the_release_fields_read() {
        let c = config(
            r#", "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                "deepseek_sparse_attention", "linear_attention"],
               "linear_attn_config": {"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
                                      "gate_lower_bound": -5.0, "kda_layers": [1, 2, 3, 5]},
               "index_kpool": 4"#,
        )
        .unwrap();
        assert_eq!(c.linear, vec![true, true, true, false, true]);
        assert_eq!(
            (c.kda.k_heads, c.kda.k_dim, c.lower_bound),
            (4, 16, Some(-5.0))
        );
        assert_eq!(c.sparse, vec![false, false, false, true, true]);
        assert_eq!((c.kpool, c.tail, c.hyper.streams), (4, true, 4));
        // The safe gate stays on through a null bound when the linear config asks for it.
        let c =
            config(r#", "linear_lower_bound": null, "linear_attn_config": {"safe_gate": true}"#)
                .unwrap();
        assert_eq!(c.lower_bound, Some(-5.0));
        assert_eq!(
            config(r#", "linear_lower_bound": null"#)
                .unwrap()
                .lower_bound,
            None
        );
    }

    #[test]
    fn a_shared_indexer_needs_one_right_before_it() {
        let types = r#", "layer_types": ["linear_attention", "indexed_attention",
            "indexed_attention", "linear_attention", "indexed_attention"]"#;
        let ok = config(&format!(r#"{types}, "index_topk_pattern": "FFSFF""#)).unwrap();
        assert_eq!(ok.own_indexer[1..3], [true, false]);
        let err = config(&format!(r#"{types}, "index_topk_pattern": "FFFFS""#)).unwrap_err();
        assert!(err.to_string().contains("indexer_types"), "{err}");
        let err = config(r#", "qk_rope_head_dim": 64"#).unwrap_err();
        assert!(err.to_string().contains("qk_rope_head_dim"), "{err}");
    }

    #[test]
    fn a_top_k_that_is_not_whole_pools_is_refused_by_name() {
        let err = config(r#", "index_kpool": 4, "index_topk": 6"#).unwrap_err();
        assert!(err.to_string().contains("index_topk"), "{err}");
        assert!(config(r#", "index_kpool": 4, "index_topk": 8"#).is_ok());
    }
}
