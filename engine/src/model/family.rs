//! A family is a file and a row.
//!
//! Each model family (Qwen3-MoE, DeepSeek-V3, …) lives in its own file with
//! its row, a [`Family`]: which `model_type` values it reads and how, which
//! GGUF architectures and `synth` shape it has. The [`FamilyConfig`] it
//! parses knows its state and builds its decoder. [`FAMILIES`] lists the
//! rows; the supported types, config parsing, the GGUF architecture map and
//! `synth --arch` all read that one table. Adding MiniMax-M2 before this took
//! edits at seven places in `model/mod.rs` and four other model files; a
//! family now touches its file and one line of [`FAMILIES`].

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

use super::config::{ConfigError, RawConfig};
use super::layers::decoder::Decoder;
use super::layers::experts::ExpertProvider;
use super::quantization::Quantization;
use super::state::{SlotKind, StateLayout};
use super::{CommonConfig, ModelError};
use crate::weights::{TensorSource, Weights};

/// One model family: the `model_type` values it reads (the first names it),
/// how it reads a config, the GGUF `general.architecture` values its files
/// are imported from, and how `synth --arch NAME` writes one, where it can.
/// Each family's file holds its row as `FAMILY`.
pub struct Family {
    pub types: &'static [&'static str],
    /// Reads `raw`, whose `model_type` (the second argument) is one of `types`.
    pub parse: fn(&RawConfig, &str) -> Result<Parsed, ConfigError>,
    pub gguf: &'static [&'static str],
    pub synth: Option<&'static dyn crate::synth::SynthFamily>,
}

impl Family {
    /// The `model_type` values it reads; the first names the family.
    pub fn model_types(&self) -> &'static [&'static str] {
        self.types
    }

    /// Reads `raw`, whose `model_type` is one of [`Family::model_types`].
    pub fn parse(&self, raw: &RawConfig, model_type: &str) -> Result<Parsed, ConfigError> {
        (self.parse)(raw, model_type)
    }

    /// The GGUF `general.architecture` values its files are imported from.
    pub fn gguf_architectures(&self) -> &'static [&'static str] {
        self.gguf
    }

    /// How `synth --arch NAME` writes one, where it can.
    pub fn synth(&self) -> Option<&'static dyn crate::synth::SynthFamily> {
        self.synth
    }
}

/// A parsed config and where its weights are.
pub struct Parsed {
    pub config: Box<dyn FamilyConfig>,
    /// Prefix of the language model's tensors (multimodal checkpoints nest it).
    pub weight_prefix: &'static str,
    /// Whether the text model's `model.` tensors may be stored under
    /// `model.language_model.` (Qwen3.5's multimodal release, Step-3.7's
    /// index); flat names are read when the files have them.
    pub nested_language_model: bool,
    /// A weight format stated by a nested text config.
    pub quantization: Option<Quantization>,
}

impl Parsed {
    /// A config whose weights sit where transformers puts them.
    pub fn plain(config: impl FamilyConfig) -> Self {
        Self {
            config: Box::new(config),
            weight_prefix: "",
            nested_language_model: false,
            quantization: None,
        }
    }
}

/// A family's typed settings: what one sequence's state holds and how the
/// decoder is built.
pub trait FamilyConfig: Debug + Send + Sync + AsAny {
    fn common(&self) -> &CommonConfig;

    /// The state slots one sequence keeps, as the built decoder uses them.
    fn state_layout(&self) -> StateLayout;

    /// Builds the decoder from `w` (the language model's weights); routed
    /// experts come from `experts`, else from `w` into RAM.
    fn build(
        &self,
        w: &Weights,
        experts: Option<Arc<dyn ExpertProvider>>,
    ) -> Result<Decoder, ModelError>;

    /// The weights under the names the build asks for, where the release
    /// names them its own way (DeepSeek-V4's `layers.0.attn.wq_a`).
    fn released_names<'a>(
        &self,
        _source: &'a dyn TensorSource,
    ) -> Option<Box<dyn TensorSource + 'a>> {
        None
    }

    /// Routed experts stored as stacked `x · W` tensors (gpt-oss, Llama 4):
    /// their sizes and how gate and up share a tensor, for the pack writer.
    fn stacked_experts(&self) -> Option<super::layers::stacked::StackedExperts> {
        None
    }

    /// A tensor the last layer (`last`) must have: the check that the
    /// weights hold as many layers as the config says.
    fn last_layer_probe(&self, last: usize) -> String {
        format!("model.layers.{last}.input_layernorm.weight")
    }

    /// What may precede `layers.N.` in the release's names besides `model.`.
    fn extra_layer_prefixes(&self) -> &'static [&'static str] {
        &[]
    }
}

/// Implements [`FamilyConfig`] for the `Config` of the family file it is
/// used in, whose `common` field is its [`CommonConfig`] and whose `build`
/// function builds its decoder: `layout` gives the state layout from the
/// config (`c`), and any further methods (`released_names`,
/// `stacked_experts`, …) follow it. Sixteen files wrote those three methods
/// out each.
macro_rules! family_config {
    ($(#[$doc:meta])* layout: |$c:ident| $layout:expr, $($methods:tt)*) => {
        impl $crate::model::family::FamilyConfig for Config {
            fn common(&self) -> &$crate::model::CommonConfig {
                &self.common
            }

            $(#[$doc])*
            fn state_layout(&self) -> $crate::model::state::StateLayout {
                let $c = self;
                $layout
            }

            fn build(
                &self,
                w: &$crate::weights::Weights,
                experts: Option<
                    std::sync::Arc<dyn $crate::model::layers::experts::ExpertProvider>,
                >,
            ) -> Result<$crate::model::layers::decoder::Decoder, $crate::model::ModelError> {
                build(self, w, experts)
            }

            $($methods)*
        }
    };
}
pub(crate) use family_config;

/// Lets a `dyn FamilyConfig` be looked at as its own type (the pack
/// writer asks for a family's settings by type).
pub trait AsAny: Any {
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One appending slot per layer of grouped-query attention: a key and a
/// value row per KV head a position.
pub fn grouped_layout(layers: usize, kv_heads: usize, head_dim: usize) -> StateLayout {
    StateLayout::layers((0..layers).map(|_| SlotKind::Appending {
        per_position: 2 * kv_heads * head_dim,
    }))
}

/// Linear-attention layers' fixed state (`values` each) beside latent
/// attention's rows (`per_position` a position) on the others (Kimi-Linear,
/// Ling 3).
pub fn hybrid_layout(linear: &[bool], values: usize, per_position: usize) -> StateLayout {
    StateLayout::layers(linear.iter().map(|&linear| {
        if linear {
            SlotKind::Fixed { values }
        } else {
            SlotKind::Appending { per_position }
        }
    }))
}

/// Every family Longhaul runs, in the order the README lists them.
pub static FAMILIES: &[&Family] = &[
    &super::qwen3_moe::FAMILY,
    &super::mixtral::FAMILY,
    &super::deepseek_v3::FAMILY,
    &super::gpt_oss::FAMILY,
    &super::kimi_linear::FAMILY,
    &super::qwen3_next::FAMILY,
    &super::minimax_m2::FAMILY,
    &super::glm4_moe::FAMILY,
    &super::glm_moe_dsa::FAMILY,
    &super::deepseek_v32::FAMILY,
    &super::deepseek_v4::FAMILY,
    &super::dots1::FAMILY,
    &super::hunyuan_v1_moe::FAMILY,
    &super::ernie4_5_moe::FAMILY,
    &super::llama4::FAMILY,
    &super::step3p7::FAMILY,
    &super::bailing_hybrid::FAMILY,
    &super::longcat_flash::FAMILY,
    &super::glm5_next::FAMILY,
];

/// The family that reads `model_type`.
pub fn family_of(model_type: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_types().contains(&model_type))
}

/// Every `model_type` value Longhaul reads.
pub fn supported_model_types() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.model_types().iter().copied())
        .collect()
}

/// The family `synth --arch name` writes.
pub fn synth_family(name: &str) -> Option<&'static dyn crate::synth::SynthFamily> {
    FAMILIES
        .iter()
        .filter_map(|f| f.synth())
        .find(|s| s.name() == name)
}

/// Every `synth --arch` name, in the families' order.
pub fn synth_names() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .filter_map(|f| f.synth())
        .map(|s| s.name())
        .collect()
}

/// The family a GGUF file's `general.architecture` names.
pub fn family_of_gguf(architecture: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.gguf_architectures().contains(&architecture))
}

/// Every GGUF architecture Longhaul imports.
pub fn supported_gguf_architectures() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.gguf_architectures().iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::SynthSpec;

    #[test]
    fn every_type_belongs_to_one_family() {
        let types = supported_model_types();
        for t in &types {
            let owners = FAMILIES
                .iter()
                .filter(|f| f.model_types().contains(t))
                .count();
            assert_eq!(owners, 1, "{t}");
        }
        assert!(types.contains(&"kimi_k2") && types.contains(&"deepseek_v4"));
    }

    fn synth_spec(arch: &str) -> SynthSpec {
        SynthSpec::new(synth_family(arch).unwrap())
    }

    /// Every architecture's synthetic checkpoint opens as that family and
    /// computes finite logits.
    #[test]
    fn every_architecture_writes_a_checkpoint_that_opens() {
        for arch in synth_names() {
            let tmp = tempfile::tempdir().unwrap();
            let mut s = synth_spec(arch);
            (s.vocab, s.hidden, s.layers, s.heads, s.kv_heads) = (300, 64, 2, 4, 2);
            (s.experts, s.top_k, s.moe_intermediate, s.dense_intermediate) = (8, 2, 32, 64);
            s.layers = match arch {
                // Sliding, sparse and heavily compressed layers.
                "deepseek_v4" => 4,
                // A latent-attention layer after five linear ones.
                "bailing_hybrid" => 6,
                // Sparse attention after three KDA layers, and experts.
                "glm5_next" => 5,
                _ => s.layers,
            };
            let out = tmp.path().join(arch);
            crate::synth::write_synthetic(&s, &out, &|_, _| {}).unwrap();
            let engine = crate::Engine::open(&out).unwrap();
            let family = family_of(&engine.spec().model_type);
            assert_eq!(family.and_then(|f| f.synth()).map(|f| f.name()), Some(arch));
            let logits = engine.logits(&[1, 2, 3]).unwrap().to_vec2::<f32>().unwrap();
            assert!(logits.iter().flatten().all(|v| v.is_finite()), "{arch}");
        }
    }

    #[test]
    fn fit_size_picks_enough_layers() {
        let mut s = synth_spec("deepseek_v3");
        s.fit_size(1 << 30);
        let experts = s.expert_bytes() * s.experts as u64 * (s.layers - 1) as u64;
        assert!(experts >= 1 << 30 && experts < (1 << 30) + s.expert_bytes() * s.experts as u64);
    }
}
