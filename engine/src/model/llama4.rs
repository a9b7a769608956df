//! Llama 4 Scout and Maverick (`llama4`, its text model `llama4_text`).
//!
//! Three layers in four rotate queries and keys (pairs interleaved, Llama
//! 3.1's frequency stretch in the releases), L2-normalise them after rope
//! without a learnt scale (`use_qk_norm`) and attend within chunks of
//! `attention_chunk_size` positions; every fourth (`no_rope_layers` 0)
//! skips rope and its norm, sees the whole context and scales its queries
//! by a temperature growing with the position (`attn_temperature_tuning`).
//! The router picks the top-k logits and weighs each by its sigmoid, and
//! the weight scales the expert's *input*; a shared expert runs beside
//! them. Experts are stacked `x · W` (`gate_up_proj` `[E, H, 2I]`, gate
//! columns before up), in the release as transformers writes them.
//! `moe_layers` (or every `interleave_moe_layer_step`-th layer) are sparse,
//! the others a dense MLP of `intermediate_size_mlp`.
//!
//! The release nests the text config under `text_config` and its tensors
//! under `language_model.`, beside a vision tower that is not read.

use std::sync::Arc;

use serde_json::{Value, json};

use super::config::{ConfigError, RawConfig, check_heads};
use super::family::{Family, Parsed, family_config, grouped_layout};
use super::layers::attention::{GqaShape, GroupedQueryAttention, Temperature};
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{ExpertProvider, ExpertSetup};
use super::layers::moe::{ExpertExtras, MoeBlock};
use super::layers::rope::{Rope, RopeParams};
use super::layers::router::{Router, Scoring};
use super::layers::stacked::{self, GateUp, StackedExperts};
use super::layers::{Linear, Mlp};
use super::{CommonConfig, ModelError, assemble};
use crate::synth::{Add, FLOAT_DTYPES, Fill, Shape, SynthAttention, SynthSpec, grouped};
use crate::weights::Weights;

/// `Llama4TextConfig`'s defaults.
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_ROPE_THETA: f64 = 500_000.0;
const DEFAULT_HEAD_DIM: usize = 128;
const DEFAULT_KV_HEADS: usize = 8;
const DEFAULT_INTERMEDIATE: usize = 8192;
const DEFAULT_INTERMEDIATE_MLP: usize = 16384;
const DEFAULT_EXPERTS: usize = 16;
const DEFAULT_NO_ROPE_INTERVAL: usize = 4;
const DEFAULT_CHUNK: usize = 8192;
const DEFAULT_FLOOR_SCALE: f64 = 8192.0;
const DEFAULT_ATTN_SCALE: f64 = 0.1;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    /// Width of each routed expert and of the shared one.
    pub intermediate_size: usize,
    /// Width of the dense layers' MLP.
    pub intermediate_size_mlp: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Per layer: sparse, uses rope, attends within chunks.
    pub sparse: Vec<bool>,
    pub rope_layers: Vec<bool>,
    pub chunked: Vec<bool>,
    pub chunk: Option<usize>,
    pub qk_norm: bool,
    pub temperature: Option<Temperature>,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let layers = common.num_layers;
        let heads = raw.positive("num_attention_heads")?;
        let kv_heads =
            raw.usize_any(&["num_key_value_heads"])?
                .unwrap_or(if raw.has("num_key_value_heads") {
                    heads
                } else {
                    DEFAULT_KV_HEADS
                });
        check_heads(raw, heads, kv_heads)?;
        let head_dim = match raw.usize_any(&["head_dim"])? {
            Some(d) => d,
            None if raw.has("head_dim") => common.hidden_size / heads,
            None => DEFAULT_HEAD_DIM,
        };
        let experts = raw
            .usize_any(&["num_local_experts"])?
            .unwrap_or(DEFAULT_EXPERTS);
        let top_k = raw.usize_any(&["num_experts_per_tok"])?.unwrap_or(1);
        if top_k == 0 || top_k > experts {
            return Err(raw.invalid(
                "num_experts_per_tok",
                format!("{top_k} is not within 1..={experts}"),
            ));
        }
        let sparse = moe_layers(raw, layers)?;
        let rope_layers: Vec<bool> = match raw.usize_list("no_rope_layers")? {
            list if list.is_empty() => {
                let interval = raw
                    .usize_any(&["no_rope_layer_interval"])?
                    .unwrap_or(DEFAULT_NO_ROPE_INTERVAL)
                    .max(1);
                (0..layers)
                    .map(|i| !(i + 1).is_multiple_of(interval))
                    .collect()
            }
            list if list.len() >= layers => list[..layers].iter().map(|&r| r != 0).collect(),
            list => {
                return Err(raw.invalid(
                    "no_rope_layers",
                    format!("{} entries for {layers} layers", list.len()),
                ));
            }
        };
        let chunk = if raw.has("attention_chunk_size") {
            raw.usize_any(&["attention_chunk_size"])?
        } else {
            Some(DEFAULT_CHUNK)
        };
        let chunked = chunked_layers(raw, &rope_layers, chunk)?;
        let tuning = match raw.get("attn_temperature_tuning") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => v.as_f64().is_some_and(|n| n != 0.0),
        };
        let temperature = tuning.then(|| -> Result<Temperature, ConfigError> {
            Ok(Temperature {
                floor_scale: raw.positive_f64_or("floor_scale", DEFAULT_FLOOR_SCALE)? as f32,
                attn_scale: raw.f64_or("attn_scale", DEFAULT_ATTN_SCALE)? as f32,
            })
        });
        Ok(Self {
            heads,
            kv_heads,
            head_dim,
            attention_bias: raw.bool_or("attention_bias", false)?,
            intermediate_size: raw
                .usize_any(&["intermediate_size"])?
                .unwrap_or(DEFAULT_INTERMEDIATE),
            intermediate_size_mlp: raw
                .usize_any(&["intermediate_size_mlp"])?
                .unwrap_or(DEFAULT_INTERMEDIATE_MLP),
            experts,
            top_k,
            sparse,
            rope_layers,
            chunked,
            chunk,
            qk_norm: raw.bool_or("use_qk_norm", true)?,
            temperature: temperature.transpose()?,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }

    fn stacked(&self) -> StackedExperts {
        StackedExperts {
            count: self.experts,
            hidden: self.common.hidden_size,
            intermediate: self.intermediate_size,
            gate_up: GateUp::Halves,
        }
    }
}

/// `moe_layers`, or every `interleave_moe_layer_step`-th layer ending each
/// step (`range(step - 1, L, step)`).
fn moe_layers(raw: &RawConfig, layers: usize) -> Result<Vec<bool>, ConfigError> {
    if raw.get("moe_layers").is_some() {
        let listed = raw.usize_list("moe_layers")?;
        if let Some(&bad) = listed.iter().find(|&&l| l >= layers) {
            return Err(raw.invalid("moe_layers", format!("layer {bad} of {layers}")));
        }
        return Ok((0..layers).map(|i| listed.contains(&i)).collect());
    }
    let step = raw.usize_any(&["interleave_moe_layer_step"])?.unwrap_or(1);
    if step == 0 {
        return Err(raw.invalid("interleave_moe_layer_step", "must be positive"));
    }
    Ok((0..layers).map(|i| (i + 1).is_multiple_of(step)).collect())
}

/// `layer_types` (`chunked_attention` or `full_attention`), else chunked
/// where rope is used and a chunk size is set.
fn chunked_layers(
    raw: &RawConfig,
    rope_layers: &[bool],
    chunk: Option<usize>,
) -> Result<Vec<bool>, ConfigError> {
    let Some(types) = raw.str_list("layer_types")? else {
        return Ok(rope_layers.iter().map(|&r| r && chunk.is_some()).collect());
    };
    if types.len() != rope_layers.len() {
        return Err(raw.invalid(
            "layer_types",
            format!("{} entries for {} layers", types.len(), rope_layers.len()),
        ));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "full_attention" => Ok(false),
            "chunked_attention" if chunk.is_some() => Ok(true),
            "chunked_attention" => Err(raw.missing("attention_chunk_size")),
            other => {
                Err(raw.unsupported("layer_types", other, "chunked_attention, full_attention"))
            }
        })
        .collect()
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let eps = c.common.rms_norm_eps;
    let rope = Rope::new(&c.rope, c.head_dim, true);
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let uses_rope = c.rope_layers[i];
        let shape = GqaShape {
            bias: c.attention_bias,
            o_bias: c.attention_bias,
            qk_norm_eps: (c.qk_norm && uses_rope).then_some(eps),
            qk_norm_after_rope: true,
            qk_norm_unweighted: true,
            no_rope: !uses_rope,
            chunk: c.chunk.filter(|_| c.chunked[i]),
            temperature: c.temperature.filter(|_| !uses_rope),
            ..GqaShape::new(h, c.heads, c.kv_heads, c.head_dim)
        };
        let attention = GroupedQueryAttention::load(&lw.pp("self_attn"), shape, &rope)?;
        let fw = lw.pp("feed_forward");
        let ffn = if c.sparse[i] {
            stacked::add_layer(&mut experts, &fw.pp("experts"), i, c.stacked())?;
            let router = Linear::load(&fw, "router", h, c.experts, false)?;
            FeedForward::Sparse(MoeBlock {
                layer: i,
                router: Router::new(router, c.experts, c.top_k, Scoring::TopKSigmoid),
                shared: Some(Mlp::load(&fw.pp("shared_expert"), h, c.intermediate_size)?),
                shared_gate: None,
                extras: ExpertExtras {
                    weight_input: true,
                    ..ExpertExtras::default()
                },
            })
        } else {
            FeedForward::Dense(Mlp::load(&fw, h, c.intermediate_size_mlp)?)
        };
        layers.push(DecoderLayer::load(
            &lw,
            h,
            eps,
            Attention::Grouped(attention),
            ffn,
        )?);
    }
    assemble(&c.common, w, layers, rope, experts)
}

/// Llama 4.
pub static FAMILY: Family = Family {
    types: &["llama4", "llama4_text"],
    parse: parse_config,
    gguf: &[],
    synth: Some(&SYNTH),
};

/// Reads a config of the family's `model_type` values.
fn parse_config(raw: &RawConfig, model_type: &str) -> Result<Parsed, ConfigError> {
    if model_type == "llama4_text" {
        return Ok(Parsed::plain(Config::parse(raw)?));
    }
    let text = raw.sub_config("text_config")?;
    Ok(Parsed {
        quantization: super::quantization::parse(&text)?,
        weight_prefix: "language_model.",
        ..Parsed::plain(Config::parse(&text)?)
    })
}

/// `synth --arch llama4`: Scout's kind (every layer sparse with a shared
/// expert, one layer in four without rope, the text model under
/// `language_model.`), as its text config alone.
static SYNTH: Shape = Shape {
    name: "llama4",
    attention: SynthAttention::Own(synth_layer),
    moe: None,
    dense_prefix: 0,
    dtypes: FLOAT_DTYPES,
    expert_groups: 1,
    config: |s| {
        json!({
            "model_type": "llama4_text", "head_dim": s.hidden / s.heads,
            "intermediate_size": s.moe_intermediate, "intermediate_size_mlp": s.dense_intermediate,
            "num_local_experts": s.experts, "interleave_moe_layer_step": 1, "use_qk_norm": true,
            "attention_chunk_size": 8192, "attn_temperature_tuning": true, "rope_theta": DEFAULT_ROPE_THETA,
            "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
        })
    },
    head: None,
};

/// Layer `p`'s attention, router, shared expert and stacked experts.
fn synth_layer(s: &SynthSpec, p: &str, _l: usize, t: &mut Add) {
    let (h, i, e) = (s.hidden, s.moe_intermediate, s.experts);
    let std = |fan_in: usize| Fill::Uniform(1.0 / (fan_in as f32).sqrt());
    grouped(
        s,
        &format!("{p}.self_attn"),
        crate::synth::QkNorm::None,
        false,
        t,
    );
    let f = format!("{p}.feed_forward");
    let popularity = crate::synth::popularity(e, s.zipf);
    t(
        format!("{f}.router.weight"),
        vec![e, h],
        Fill::Router {
            std: 1.0 / (h as f32).sqrt(),
            popularity,
        },
    );
    for (name, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)] {
        t(
            format!("{f}.shared_expert.{name}.weight"),
            vec![rows, cols],
            std(cols),
        );
    }
    t(
        format!("{f}.experts.gate_up_proj"),
        vec![e, h, 2 * i],
        std(h),
    );
    t(format!("{f}.experts.down_proj"), vec![e, i, h], std(i));
}

family_config! {
    layout: |c| grouped_layout(c.common.num_layers, c.kv_heads, c.head_dim),

    fn stacked_experts(&self) -> Option<StackedExperts> {
        Some(self.stacked())
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
                r#"{{"model_type": "llama4_text", "vocab_size": 8, "hidden_size": 64,
                "num_hidden_layers": 8, "num_attention_heads": 16 {extra}}}"#
            ),
        )
        .unwrap();
        Config::parse(&raw)
    }

    #[test]
    fn defaults_follow_llama4_text_config() {
        let c = config("").unwrap();
        assert_eq!(
            (c.kv_heads, c.head_dim, c.experts, c.top_k),
            (8, 128, 16, 1)
        );
        let nope = [false, false, false, true, false, false, false, true];
        assert_eq!(c.rope_layers, nope.map(|n| !n));
        assert_eq!(c.chunked, c.rope_layers);
        assert_eq!((c.chunk, c.sparse), (Some(8192), vec![true; 8]));
        assert!(c.qk_norm && c.temperature.is_some());
    }

    #[test]
    fn maverick_alternates_and_scout_stretches_rope() {
        let c = config(
            r#", "num_key_value_heads": 2, "head_dim": null, "interleave_moe_layer_step": 2,
               "attn_temperature_tuning": 4, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0, 1],
               "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        assert_eq!((c.kv_heads, c.head_dim), (2, 4));
        assert_eq!(c.sparse, (0..8).map(|i| i % 2 == 1).collect::<Vec<_>>());
        assert!(c.temperature.is_some());
        assert!(matches!(c.rope.kind, RopeKind::Llama3 { .. }));
        // Equal band edges leave no band: nothing divides by zero.
        let (inv, _) = c.rope.frequencies(16);
        assert!(inv.iter().all(|f| f.is_finite() && *f > 0.0));
        let err = config(r#", "moe_layers": [9]"#).unwrap_err().to_string();
        assert!(err.contains("moe_layers"), "{err}");
    }
}
