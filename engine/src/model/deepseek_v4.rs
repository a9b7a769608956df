//! DeepSeek-V4: attention over a sliding window plus compressed entries
//! (heavily compressed, or sparse through a lightning indexer; see
//! `layers/compressed.rs`), residual streams widened by hyper-connections
//! (`layers/hyper.rs`), and routed experts chosen by `sqrt(softplus)` scores
//! with a correction bias, or, in the first layers, by a fixed table of the
//! token (`tid2eid`). A plain rope serves sliding layers and a second one
//! (its own base, YaRN when configured) the compressed layers.

use std::sync::Arc;

use super::config::{ConfigError, RawConfig};
use super::family::{Family, Parsed, family_config};
use super::layers::Mlp;
use super::layers::compressed::{CompressedAttention, CompressedShape, IndexShape, LayerKind};
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{Activation, ExpertProvider, ExpertSetup, ExpertShape, PROJ_NAMES};
use super::layers::hyper::{HyperConnection, HyperHead, HyperShape};
use super::layers::moe::MoeBlock;
use super::layers::rope::{Rope, RopeKind, RopeParams};
use super::layers::router::Scoring;
use super::state::{SlotKind, SlotRole, StateLayout};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::Shape;
use crate::weights::{RawTensor, TensorSource, Weights, WeightsError};

/// `DeepseekV4Config`'s defaults for fields a config may omit.
const DEFAULT_RMS_EPS: f64 = 1e-6;
const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_COMPRESS_ROPE_THETA: f64 = 160_000.0;
const DEFAULT_ROPE_DIM: usize = 64;
const DEFAULT_HEAD_DIM: usize = 512;
const DEFAULT_CSA_RATE: usize = 4;
const DEFAULT_HCA_RATE: usize = 128;
const DEFAULT_HASH_LAYERS: usize = 3;
const DEFAULT_SLIDING_WINDOW: usize = 128;
const DEFAULT_O_GROUPS: usize = 8;
const DEFAULT_O_LORA_RANK: usize = 1024;
const DEFAULT_INDEX_HEADS: usize = 64;
const DEFAULT_INDEX_HEAD_DIM: usize = 128;
const DEFAULT_INDEX_TOPK: usize = 512;
const DEFAULT_HC_MULT: usize = 4;
const DEFAULT_SINKHORN_ITERS: usize = 20;
const DEFAULT_HC_EPS: f64 = 1e-6;
const DEFAULT_SWIGLU_LIMIT: f64 = 10.0;
const DEFAULT_ROUTED_SCALING: f64 = 1.5;

const SLIDING: &str = "sliding_attention";
const CSA: &str = "compressed_sparse_attention";
const HCA: &str = "heavily_compressed_attention";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub attention: CompressedShape,
    pub index: IndexShape,
    pub layer_kinds: Vec<LayerKind>,
    /// Per layer: experts from the token's row of `tid2eid`.
    pub hash_layers: Vec<bool>,
    pub experts: usize,
    pub top_k: usize,
    pub moe_intermediate_size: usize,
    pub routed_scaling_factor: f64,
    pub swiglu_limit: f64,
    pub hyper: HyperShape,
    pub main_rope: RopeParams,
    pub compress_rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let n = common.num_layers;
        if let Some(s) = raw.str_opt("scoring_func")?
            && s != "sqrtsoftplus"
        {
            return Err(raw.unsupported("scoring_func", s, "sqrtsoftplus"));
        }
        if raw.bool_or("mlp_bias", false)? {
            return Err(raw.unsupported("mlp_bias", true, "false"));
        }
        let or = |field: &str, default: usize| -> Result<usize, ConfigError> {
            match raw.usize_any(&[field])?.unwrap_or(default) {
                0 => Err(raw.invalid(field, "must be positive")),
                v => Ok(v),
            }
        };
        let heads = or("num_attention_heads", 64)?;
        let head_dim = or("head_dim", DEFAULT_HEAD_DIM)?;
        let (main_rope, compress_rope) = ropes(raw, head_dim)?;
        let rope_dim = (head_dim as f64 * main_rope.partial_rotary_factor) as usize;
        let o_groups = or("o_groups", DEFAULT_O_GROUPS)?;
        if rope_dim == 0 || rope_dim % 2 == 1 || rope_dim > head_dim {
            return Err(raw.invalid(
                "partial_rotary_factor",
                format!("gives {rope_dim} rotated lanes of a {head_dim}-wide head"),
            ));
        }
        if !(heads * head_dim).is_multiple_of(o_groups) {
            return Err(raw.invalid("o_groups", format!("{o_groups} does not divide the heads")));
        }
        let index = IndexShape {
            heads: or("index_n_heads", DEFAULT_INDEX_HEADS)?,
            head_dim: or("index_head_dim", DEFAULT_INDEX_HEAD_DIM)?,
            top_k: or("index_topk", DEFAULT_INDEX_TOPK)?,
        };
        if index.head_dim < rope_dim {
            return Err(raw.invalid("index_head_dim", "narrower than the rotated lanes"));
        }
        let experts = raw.positive_any(&["n_routed_experts", "num_local_experts"])?;
        let top_k = raw.positive("num_experts_per_tok")?;
        if top_k > experts {
            return Err(raw.invalid("num_experts_per_tok", "more than the experts"));
        }
        let hc_eps = raw.f64_or("hc_eps", DEFAULT_HC_EPS)?;
        Ok(Self {
            attention: CompressedShape {
                hidden: common.hidden_size,
                heads,
                head_dim,
                rope_dim,
                q_lora_rank: or("q_lora_rank", 1024)?,
                o_groups,
                o_lora_rank: or("o_lora_rank", DEFAULT_O_LORA_RANK)?,
                sliding_window: or("sliding_window", DEFAULT_SLIDING_WINDOW)?,
                eps: common.rms_norm_eps,
            },
            index,
            layer_kinds: layer_kinds(raw, n)?,
            hash_layers: hash_layers(raw, n)?,
            experts,
            top_k,
            moe_intermediate_size: raw
                .positive_any(&["moe_intermediate_size", "intermediate_size"])?,
            routed_scaling_factor: raw.f64_or("routed_scaling_factor", DEFAULT_ROUTED_SCALING)?,
            swiglu_limit: raw.f64_or("swiglu_limit", DEFAULT_SWIGLU_LIMIT)?,
            hyper: HyperShape {
                streams: or("hc_mult", DEFAULT_HC_MULT)?,
                hidden: common.hidden_size,
                norm_eps: common.rms_norm_eps,
                eps: hc_eps as f32,
                sinkhorn_iters: or("hc_sinkhorn_iters", DEFAULT_SINKHORN_ITERS)?,
            },
            main_rope,
            compress_rope,
            common,
        })
    }

    /// Each layer's key/value row; then, for each compressed layer, its
    /// share of the entries a position and the fixed ring of its open
    /// windows' projections.
    pub fn layout(&self) -> StateLayout {
        let (hd, di) = (self.attention.head_dim, self.index.head_dim);
        let mut layout = StateLayout::layers(
            (0..self.layer_kinds.len()).map(|_| SlotKind::Appending { per_position: hd }),
        );
        for (i, kind) in self.layer_kinds.iter().enumerate() {
            let (entries, ring) = match *kind {
                LayerKind::Sliding => continue,
                LayerKind::Heavy { rate } => (hd.div_ceil(rate), rate * 2 * hd),
                LayerKind::Sparse { rate } => (
                    hd.div_ceil(rate) + di.div_ceil(rate),
                    2 * rate * (4 * hd + 4 * di),
                ),
            };
            layout.push(
                SlotRole::Entries(i),
                SlotKind::Appending {
                    per_position: entries,
                },
            );
            layout.push(SlotRole::Ring(i), SlotKind::Fixed { values: ring });
        }
        layout
    }
}

/// The plain rope of sliding layers and the compressed layers' own, as
/// transformers derives them: `rope_parameters` nested as `main` and
/// `compress`, or one flat setting (`rope_parameters` or `rope_scaling`)
/// that is the compressed branches' with `compress_rope_theta` as its base.
fn ropes(raw: &RawConfig, head_dim: usize) -> Result<(RopeParams, RopeParams), ConfigError> {
    let factor = match (
        raw.f64_opt("partial_rotary_factor")?,
        raw.usize_any(&["qk_rope_head_dim"])?,
    ) {
        (Some(f), _) => f,
        (None, Some(dim)) => dim as f64 / head_dim as f64,
        (None, None) => DEFAULT_ROPE_DIM as f64 / DEFAULT_HEAD_DIM as f64,
    };
    let nested = raw
        .get("rope_parameters")
        .and_then(|v| v.as_object())
        .filter(|m| m.get("main").is_some_and(|v| v.is_object()));
    let (main, mut compress) = match nested {
        Some(_) => (
            raw.rope_at(&["rope_parameters", "main"], DEFAULT_ROPE_THETA)?,
            raw.rope_at(
                &["rope_parameters", "compress"],
                DEFAULT_COMPRESS_ROPE_THETA,
            )?,
        ),
        None => {
            let main = RopeParams {
                theta: raw.f64_or("rope_theta", DEFAULT_ROPE_THETA)?,
                partial_rotary_factor: factor,
                kind: RopeKind::Default,
            };
            let mut compress = raw.rope(DEFAULT_COMPRESS_ROPE_THETA)?;
            compress.theta = raw.f64_or("compress_rope_theta", DEFAULT_COMPRESS_ROPE_THETA)?;
            compress.partial_rotary_factor = factor;
            if let RopeKind::Yarn {
                attention_factor, ..
            } = &mut compress.kind
            {
                attention_factor.get_or_insert(1.0);
            }
            (main, compress)
        }
    };
    // transformers reads `truncate` from the top level, where it never is.
    if let RopeKind::Yarn { truncate, .. } = &mut compress.kind {
        *truncate = true;
    }
    Ok((main, compress))
}

/// Each layer's attention kind: `layer_types`, else the released
/// `compress_ratios` (0, 4 or 128 per layer), else transformers' default.
fn layer_kinds(raw: &RawConfig, layers: usize) -> Result<Vec<LayerKind>, ConfigError> {
    let rates = raw.get("compress_rates").and_then(|v| v.as_object());
    let rate = |kind: &str, legacy: &str, default: usize| -> Result<usize, ConfigError> {
        let from_map = rates.and_then(|m| m.get(kind)).and_then(|v| v.as_u64());
        let rate = match (raw.usize_any(&[legacy])?, from_map) {
            (Some(r), _) => r,
            (None, Some(r)) => r as usize,
            (None, None) => default,
        };
        if rate == 0 {
            return Err(raw.invalid("compress_rates", format!("{kind} pools 0 tokens")));
        }
        Ok(rate)
    };
    let csa = rate(CSA, "compress_rate_csa", DEFAULT_CSA_RATE)?;
    let hca = rate(HCA, "compress_rate_hca", DEFAULT_HCA_RATE)?;
    let names: Vec<String> = if let Some(types) = raw.str_list("layer_types")? {
        types
    } else if raw.get("compress_ratios").is_some_and(|v| !v.is_null()) {
        raw.usize_list("compress_ratios")?
            .into_iter()
            .map(|r| match r {
                0 => Ok(SLIDING.to_string()),
                4 => Ok(CSA.to_string()),
                128 => Ok(HCA.to_string()),
                other => Err(raw.invalid("compress_ratios", format!("{other} is not 0, 4 or 128"))),
            })
            .collect::<Result<_, _>>()?
    } else {
        (0..layers)
            .map(|i| if i >= 2 && i % 2 == 1 { CSA } else { HCA }.to_string())
            .collect()
    };
    if names.len() < layers {
        return Err(raw.invalid(
            "layer_types",
            format!("{} entries for {layers} layers", names.len()),
        ));
    }
    names
        .iter()
        .take(layers)
        .map(|k| match k.as_str() {
            SLIDING => Ok(LayerKind::Sliding),
            CSA => Ok(LayerKind::Sparse { rate: csa }),
            HCA => Ok(LayerKind::Heavy { rate: hca }),
            other => Err(raw.invalid(
                "layer_types",
                format!("`{other}` is not a DeepSeek-V4 layer"),
            )),
        })
        .collect()
}

/// Which layers route by the token: `mlp_layer_types`, else the first
/// `num_hash_layers`.
fn hash_layers(raw: &RawConfig, layers: usize) -> Result<Vec<bool>, ConfigError> {
    match raw.str_list("mlp_layer_types")? {
        Some(kinds) if kinds.len() >= layers => kinds
            .iter()
            .take(layers)
            .map(|k| match k.as_str() {
                "hash_moe" => Ok(true),
                "moe" => Ok(false),
                other => Err(raw.invalid(
                    "mlp_layer_types",
                    format!("`{other}` is neither hash_moe nor moe"),
                )),
            })
            .collect(),
        Some(kinds) => Err(raw.invalid(
            "mlp_layer_types",
            format!("{} entries for {layers} layers", kinds.len()),
        )),
        None => {
            let hashed = raw
                .usize_any(&["num_hash_layers"])?
                .unwrap_or(DEFAULT_HASH_LAYERS);
            Ok((0..layers).map(|i| i < hashed).collect())
        }
    }
}

/// `tid2eid` under `w`: `[vocab][top_k]` expert ids, stored as integers.
fn routing_table(w: &Weights, c: &Config) -> Result<Vec<u32>, ModelError> {
    let name = "tid2eid";
    w.integers(name, &[c.common.vocab_size, c.top_k])?
        .into_iter()
        .map(|id| match u32::try_from(id) {
            Ok(e) if (e as usize) < c.experts => Ok(e),
            _ => Err(WeightsError::InvalidFile {
                path: w.source().location(&w.full_name(name)),
                reason: format!(
                    "tensor `{}`: expert id {id} outside 0..{}",
                    w.full_name(name),
                    c.experts
                ),
            }
            .into()),
        })
        .collect()
}

fn load_moe(c: &Config, w: &Weights, layer: usize) -> Result<MoeBlock, ModelError> {
    let (h, limit) = (c.common.hidden_size, c.swiglu_limit as f32);
    let scaling = c.routed_scaling_factor as f32;
    let scoring = if c.hash_layers.get(layer).copied().unwrap_or(false) {
        Scoring::Hash {
            table: routing_table(&w.pp("gate"), c)?,
            scaling,
        }
    } else {
        Scoring::SqrtSoftplus {
            correction_bias: w
                .pp("gate")
                .get("e_score_correction_bias", &[c.experts])?
                .to_vec1()?,
            scaling,
        }
    };
    let mut shared = Mlp::load(&w.pp("shared_experts"), h, c.moe_intermediate_size)?;
    shared.activation = Activation::LimitedSwiglu { limit };
    let mut block = MoeBlock::load(w, layer, h, c.experts, c.top_k, scoring, Some(shared))?;
    block.extras.activation = Activation::LimitedSwiglu { limit };
    Ok(block)
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let hd = c.attention.head_dim;
    let main_rope = Rope::new(&c.main_rope, hd, false);
    let compress_rope = Rope::new(&c.compress_rope, hd, false);
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    // Compressed layers keep entries and a ring in slots of their own.
    let layout = c.layout();
    for (i, &kind) in c.layer_kinds.iter().enumerate() {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let (rope, slots) = match kind {
            LayerKind::Sliding => (&main_rope, (0, 0)),
            LayerKind::Heavy { .. } | LayerKind::Sparse { .. } => (
                &compress_rope,
                (
                    layout.slot(SlotRole::Entries(i))?,
                    layout.slot(SlotRole::Ring(i))?,
                ),
            ),
        };
        let attention = CompressedAttention::load(
            &lw.pp("self_attn"),
            &c.attention,
            kind,
            &c.index,
            rope,
            slots,
        )?;
        let mw = lw.pp("mlp");
        let shape = ExpertShape {
            count: c.experts,
            hidden: h,
            intermediate: c.moe_intermediate_size,
        };
        experts.add_layer(&mw, PROJ_NAMES, i, shape)?;
        let mut layer = DecoderLayer::load(
            &lw,
            h,
            c.common.rms_norm_eps,
            Attention::Compressed(Box::new(attention)),
            FeedForward::Sparse(load_moe(c, &mw, i)?),
        )?;
        layer.hyper = Some(Box::new([
            HyperConnection::load(&lw, "attn_hc", &c.hyper)?,
            HyperConnection::load(&lw, "ffn_hc", &c.hyper)?,
        ]));
        layers.push(layer);
    }
    let mut decoder = assemble(&c.common, w, layers, main_rope, experts)?;
    decoder.state_slots = layout.len();
    decoder.hyper_head = Some(HyperHead::load(&w.pp("model.hc_head"), &c.hyper)?);
    decoder.streams = c.hyper.streams;
    Ok(decoder)
}

/// DeepSeek's own tensor names, as the released files spell them, for the
/// names transformers (and Longhaul's model code) use: `embed.weight`,
/// `layers.N.attn.wq_a.weight`, `layers.N.ffn.experts.E.w1.weight`, a
/// weight's FP8 scale as `….scale`. The inverse of transformers'
/// conversion mapping for `deepseek_v4`.
pub struct ReleasedNames<'a> {
    pub inner: &'a dyn TensorSource,
}

/// Whether `source` spells its layers' tensors as DeepSeek's release does:
/// as released (`layers.0.attn_norm.weight`), or as transformers'
/// `save_pretrained` writes them back (`model.layers.0.attn_norm.weight`).
pub fn has_released_names(source: &dyn TensorSource) -> bool {
    source
        .shape("model.layers.0.input_layernorm.weight")
        .is_none()
        && (source.shape("layers.0.attn_norm.weight").is_some()
            || source.shape("model.layers.0.attn_norm.weight").is_some())
}

/// Within a layer: transformers' prefix, the release's.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("input_layernorm.", "attn_norm."),
    ("post_attention_layernorm.", "ffn_norm."),
    ("attn_hc.", "hc_attn_"),
    ("ffn_hc.", "hc_ffn_"),
    (
        "self_attn.compressor.indexer.q_b_proj.",
        "attn.indexer.wq_b.",
    ),
    (
        "self_attn.compressor.indexer.scorer.weights_proj.",
        "attn.indexer.weights_proj.",
    ),
    ("self_attn.compressor.indexer.", "attn.indexer.compressor."),
    ("self_attn.sinks", "attn.attn_sink"),
    ("self_attn.", "attn."),
    ("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
    ("mlp.", "ffn."),
];

/// Module names inside the attention and the experts.
const MODULE_NAMES: &[(&str, &str)] = &[
    ("q_a_proj", "wq_a"),
    ("q_a_norm", "q_norm"),
    ("q_b_proj", "wq_b"),
    ("kv_proj", "wkv"),
    ("gate_proj", "wgate"),
    ("position_bias", "ape"),
    ("o_a_proj", "wo_a"),
    ("o_b_proj", "wo_b"),
];

const EXPERT_NAMES: &[(&str, &str)] =
    &[("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")];

/// The released name of transformers' tensor `name`.
pub fn released_name(name: &str) -> String {
    let name = match name.strip_suffix(".weight_scale_inv") {
        Some(weight) => return format!("{}.scale", released_name(&format!("{weight}.weight"))),
        None => name,
    };
    let top = [
        ("model.embed_tokens.weight", "embed.weight"),
        ("lm_head.weight", "head.weight"),
        ("model.norm.weight", "norm.weight"),
        ("model.hc_head.hc_fn", "hc_head_fn"),
        ("model.hc_head.hc_base", "hc_head_base"),
        ("model.hc_head.hc_scale", "hc_head_scale"),
    ];
    if let Some((_, released)) = top.iter().find(|(hf, _)| *hf == name) {
        return released.to_string();
    }
    let Some((layer, tail)) = name
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'))
    else {
        return name.to_string();
    };
    let Some((from, to)) = LAYER_NAMES.iter().find(|(hf, _)| tail.starts_with(hf)) else {
        return name.to_string();
    };
    let rest = &tail[from.len()..];
    let mut parts: Vec<String> = rest.split('.').map(str::to_string).collect();
    let experts = tail.starts_with("mlp.experts.") || tail.starts_with("mlp.shared_experts.");
    let table = if experts { EXPERT_NAMES } else { MODULE_NAMES };
    for part in parts.iter_mut() {
        if let Some((_, released)) = table.iter().find(|(hf, _)| hf == part) {
            *part = released.to_string();
            break;
        }
    }
    // The compressors' norms are `norm`; the attention's stays `kv_norm`.
    if tail.starts_with("self_attn.compressor.") {
        parts
            .iter_mut()
            .filter(|p| *p == "kv_norm")
            .for_each(|p| *p = "norm".into());
    }
    format!("layers.{layer}.{to}{}", parts.join("."))
}

impl ReleasedNames<'_> {
    /// The name `name` is stored under: the released one; as transformers'
    /// `save_pretrained` writes it (the released name under `model.`, the
    /// attention's `kv_norm` as `norm`, but the embedding, final norm and
    /// `hc_head` under their own names); or `name` itself.
    fn stored(&self, name: &str) -> String {
        let released = released_name(name);
        let mut candidates = vec![released.clone()];
        if released.starts_with("layers.") {
            let saved = format!("model.{released}");
            candidates.push(saved.replace(".attn.kv_norm.", ".attn.norm."));
            candidates.push(saved);
        }
        candidates.push(name.to_string());
        candidates
            .into_iter()
            .find(|c| self.inner.shape(c).is_some())
            .unwrap_or(released)
    }
}

impl TensorSource for ReleasedNames<'_> {
    fn shape(&self, name: &str) -> Option<&[usize]> {
        self.inner.shape(&self.stored(name))
    }

    fn load(&self, name: &str) -> Result<candle_core::Tensor, WeightsError> {
        self.inner.load(&self.stored(name))
    }

    fn load_raw(&self, name: &str) -> Result<RawTensor, WeightsError> {
        self.inner.load_raw(&self.stored(name))
    }

    fn location(&self, name: &str) -> std::path::PathBuf {
        self.inner.location(&self.stored(name))
    }

    fn origin(&self) -> std::path::PathBuf {
        self.inner.origin()
    }
}

/// DeepSeek-V4.
pub static FAMILY: Family = Family {
    types: &["deepseek_v4"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(SYNTH),
};

/// `synth --arch deepseek_v4`.
static SYNTH: &Shape = &crate::synth::deepseek_v4::SHAPE;

family_config! {
    layout: |c| c.layout(),

    fn released_names<'a>(
        &self,
        source: &'a dyn TensorSource,
    ) -> Option<Box<dyn TensorSource + 'a>> {
        has_released_names(source)
            .then(|| Box::new(ReleasedNames { inner: source }) as Box<dyn TensorSource + 'a>)
    }

    /// The release's names start at `layers.`.
    fn extra_layer_prefixes(&self) -> &'static [&'static str] {
        &[""]
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::model::{LogitsFor, load_checkpoint};

    /// What a sequence keeps grows by the per-token figure the memory plan
    /// uses, and no more: entries take their share of rows, and the open
    /// windows' projections stay in a ring of fixed size.
    #[test]
    fn state_grows_by_the_planned_bytes_per_token() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/deepseek_v4_recent");
        let (spec, model) = load_checkpoint(&dir).unwrap();
        let mut state = model.new_state();
        let ids: Vec<u32> = (0..40).map(|i| (i * 11 % 300 + 5) as u32).collect();
        model
            .forward(&ids[..16], &mut state, LogitsFor::Last)
            .unwrap();
        let before = state.bytes();
        model
            .forward(&ids[16..], &mut state, LogitsFor::Last)
            .unwrap();
        let grown = (state.bytes() - before) as u64;
        assert_eq!(grown, 24 * spec.state_bytes().per_token);
    }
}
