//! GLM-5 (`glm_moe_dsa`): DeepSeek-V3's multi-head latent attention and
//! sigmoid-routed experts, with DeepSeek sparse attention (DSA): a lightning
//! indexer picks the `index_topk` positions (2,048 in GLM-5) each query
//! reads. Layers marked `shared` reuse the choice of the last layer that ran
//! its own indexer, which saves the indexer's keys and scoring there.
//! Differences from DeepSeek-V3 in transformers' code: rope is always
//! interleaved, dense layers may be listed per layer (`mlp_layer_types`),
//! and the defaults (one expert group, RMS epsilon 1e-5).

use std::sync::Arc;

use super::config::{ConfigError, RawConfig};
use super::deepseek_v3::{self, Defaults};
use super::family::{Family, FamilyConfig, Parsed};
use super::layers::decoder::Decoder;
use super::layers::experts::ExpertProvider;
use super::layers::indexer::{Indexer, IndexerShape};
use super::layers::mla::SparseKeys;
use super::layers::rope::Rope;
use super::state::{SlotKind, SlotRole, StateLayout};
use super::{CommonConfig, ModelError};
use crate::synth::{self, ALL_DTYPES, DEEPSEEK_MOE, Shape, SynthAttention};
use crate::weights::Weights;
use serde_json::json;

/// A family built on DeepSeek sparse attention, as its transformers config
/// class differs from the others.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    pub defaults: Defaults,
    pub index_heads: usize,
    /// Whether layers may reuse an earlier indexer's choice (`indexer_types`).
    pub shared_indexers: bool,
    /// Whether the indexer rotates interleaved pairs, as the attention does.
    pub index_rope_interleaved: bool,
}

/// `GlmMoeDsaConfig`'s.
pub const GLM5: Variant = Variant {
    defaults: Defaults {
        rms_eps: 1e-5,
        first_k_dense: 3,
        n_group: 1,
        topk_group: 1,
    },
    index_heads: 32,
    shared_indexers: true,
    index_rope_interleaved: true,
};
const DEFAULT_INDEX_TOPK: usize = 2048;
const DEFAULT_INDEX_HEAD_DIM: usize = 128;
/// `index_topk_freq` and `index_skip_topk_offset`'s defaults: every layer
/// runs its indexer.
const DEFAULT_INDEX_FREQ: usize = 1;
const DEFAULT_INDEX_OFFSET: usize = 2;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub base: deepseek_v3::Config,
    /// Per layer: a dense MLP (else routed experts).
    pub dense_layers: Vec<bool>,
    /// Per layer: runs its own indexer (else reuses the last one's choice).
    pub own_indexer: Vec<bool>,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub index_rope_interleaved: bool,
}

impl Config {
    pub fn common(&self) -> &CommonConfig {
        &self.base.common
    }

    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        Self::parse_with(raw, &GLM5)
    }

    pub fn parse_with(raw: &RawConfig, variant: &Variant) -> Result<Self, ConfigError> {
        let mut base = deepseek_v3::Config::parse_with(raw, &variant.defaults)?;
        // transformers rotates interleaved pairs whatever the config says.
        base.rope_interleave = true;
        if base.q_lora_rank.is_none() {
            return Err(raw.missing("q_lora_rank"));
        }
        let n = base.common.num_layers;
        let dense_layers = match raw.str_list("mlp_layer_types")? {
            Some(kinds) => per_layer(raw, "mlp_layer_types", &kinds, n, ("dense", "sparse"))?,
            None => (0..n).map(|i| i < base.first_k_dense_replace).collect(),
        };
        let own_indexer = if variant.shared_indexers {
            indexer_types(raw, n)?
        } else {
            vec![true; n]
        };
        let index_head_dim = raw
            .usize_any(&["index_head_dim"])?
            .unwrap_or(DEFAULT_INDEX_HEAD_DIM);
        if index_head_dim < base.qk_rope_head_dim {
            return Err(raw.invalid(
                "index_head_dim",
                format!(
                    "{index_head_dim} is narrower than qk_rope_head_dim {}",
                    base.qk_rope_head_dim
                ),
            ));
        }
        let positive = |field: &str, default: usize| -> Result<usize, ConfigError> {
            match raw.usize_any(&[field])?.unwrap_or(default) {
                0 => Err(raw.invalid(field, "must be positive")),
                v => Ok(v),
            }
        };
        Ok(Self {
            dense_layers,
            own_indexer,
            index_heads: positive("index_n_heads", variant.index_heads)?,
            index_head_dim,
            index_topk: positive("index_topk", DEFAULT_INDEX_TOPK)?,
            index_rope_interleaved: variant.index_rope_interleaved,
            base,
        })
    }

    /// Layers that run their own indexer.
    pub fn indexers(&self) -> usize {
        self.own_indexer.iter().filter(|f| **f).count()
    }
}

/// One of two names per layer, as `true` for the first.
fn per_layer(
    raw: &RawConfig,
    field: &str,
    kinds: &[String],
    layers: usize,
    (yes, no): (&str, &str),
) -> Result<Vec<bool>, ConfigError> {
    if kinds.len() != layers {
        return Err(raw.invalid(
            field,
            format!("{} entries for {layers} layers", kinds.len()),
        ));
    }
    kinds
        .iter()
        .enumerate()
        .map(|(i, k)| match k.as_str() {
            k if k == yes => Ok(true),
            k if k == no => Ok(false),
            other => Err(raw.invalid(
                field,
                format!("entry {i} is `{other}`, expected `{yes}` or `{no}`"),
            )),
        })
        .collect()
}

/// Which layers run their own indexer, as transformers' config derives it:
/// `indexer_types`, else `index_topk_pattern` (`"FSSF…"` or a list), else
/// every `index_topk_freq`-th layer counting from `index_skip_topk_offset`.
fn indexer_types(raw: &RawConfig, layers: usize) -> Result<Vec<bool>, ConfigError> {
    let names = ("full", "shared");
    let own = if let Some(kinds) = raw.str_list("indexer_types")? {
        per_layer(raw, "indexer_types", &kinds, layers, names)?
    } else if let Some(pattern) = raw.get("index_topk_pattern").filter(|v| !v.is_null()) {
        let kinds: Vec<String> = match pattern.as_str() {
            Some(letters) => letters
                .chars()
                .map(|c| match c {
                    'F' => Ok("full".to_string()),
                    'S' => Ok("shared".to_string()),
                    other => Err(raw.invalid(
                        "index_topk_pattern",
                        format!("`{other}` is neither F nor S"),
                    )),
                })
                .collect::<Result<_, _>>()?,
            None => raw.str_list("index_topk_pattern")?.unwrap_or_default(),
        };
        per_layer(raw, "index_topk_pattern", &kinds, layers, names)?
    } else {
        let freq = raw
            .usize_any(&["index_topk_freq"])?
            .unwrap_or(DEFAULT_INDEX_FREQ)
            .max(1);
        let offset = raw
            .usize_any(&["index_skip_topk_offset"])?
            .unwrap_or(DEFAULT_INDEX_OFFSET);
        (0..layers)
            .map(|i| (i + 1).saturating_sub(offset).is_multiple_of(freq))
            .collect()
    };
    if own.first() == Some(&false) {
        return Err(raw.invalid(
            "indexer_types",
            "the first layer shares an indexer choice no layer before it made",
        ));
    }
    Ok(own)
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let b = &c.base;
    let shape = IndexerShape {
        hidden: b.common.hidden_size,
        q_lora_rank: b.q_lora_rank.unwrap_or(0),
        heads: c.index_heads,
        head_dim: c.index_head_dim,
        top_k: c.index_topk,
    };
    // Index keys are kept in slots of their own.
    let layout = c.state_layout();
    let index_rope = Rope::new(&b.rope, b.qk_rope_head_dim, c.index_rope_interleaved);
    let mut decoder = deepseek_v3::build_with(
        b,
        w,
        experts,
        |i| c.dense_layers.get(i).copied().unwrap_or(false),
        |i, aw, _| {
            if !c.own_indexer.get(i).copied().unwrap_or(true) {
                return Ok(Some(SparseKeys::Shared));
            }
            let slot = layout.slot(SlotRole::IndexKeys(i))?;
            let indexer = Indexer::load(&aw.pp("indexer"), &shape, &index_rope, slot)?;
            Ok(Some(SparseKeys::Own(Box::new(indexer))))
        },
    )?;
    decoder.state_slots = layout.len();
    Ok(decoder)
}

/// GLM-5.
pub static FAMILY: Family = Family {
    types: &["glm_moe_dsa"],
    parse: |raw, _| Ok(Parsed::plain(Config::parse(raw)?)),
    gguf: &[],
    synth: Some(&SYNTH),
};

/// `synth --arch glm_moe_dsa`.
static SYNTH: Shape = Shape {
    name: "glm_moe_dsa",
    attention: SynthAttention::Latent { indexer: true },
    moe: Some(DEEPSEEK_MOE),
    dense_prefix: 1,
    dtypes: ALL_DTYPES,
    expert_groups: 1,
    config: |s| {
        let m = synth::MlaDims::of(s);
        let index = json!({
            "index_topk": synth::SYNTH_INDEX_TOPK, "index_head_dim": m.index_dim,
            "index_n_heads": m.index_heads,
        });
        synth::extended(synth::mla_config(s, "glm_moe_dsa", (1, 1)), index)
    },
    head: None,
};

impl FamilyConfig for Config {
    fn common(&self) -> &CommonConfig {
        &self.base.common
    }

    /// The layers' latents, then the index keys of each layer that runs its
    /// own indexer.
    fn state_layout(&self) -> StateLayout {
        let mut layout = self.base.latent_layout();
        for (i, _) in self.own_indexer.iter().enumerate().filter(|(_, own)| **own) {
            layout.push(
                SlotRole::IndexKeys(i),
                SlotKind::Appending {
                    per_position: self.index_head_dim,
                },
            );
        }
        layout
    }

    fn build(
        &self,
        w: &Weights,
        experts: Option<Arc<dyn ExpertProvider>>,
    ) -> Result<Decoder, ModelError> {
        build(self, w, experts)
    }
}
