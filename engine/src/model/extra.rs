//! Tensors a release carries beside the decoder Longhaul builds.
//!
//! Releases ship blocks the decoder never runs: a multi-token-prediction
//! (MTP) block for speculative drafting — Qwen3-Next's and Qwen3.5's `mtp.*`
//! (with 512 routed experts of its own under `mtp.layers.0.mlp.experts`),
//! DeepSeek-V3's, V3.2's and GLM's extra decoder layer past
//! `num_hidden_layers` (`model.layers.61.*` on DeepSeek-V3, experts
//! included), DeepSeek-V4's `mtp.*`, MiMo's `model.mtp_layers.*`, ERNIE
//! 4.5's `model.mtp_block.0.*` with its `mtp_{emb_norm,hidden_norm,linear_proj}`. Matched by
//! expert-name patterns alone, Qwen3-Next's MTP experts once landed on decoder
//! layer 0 and moved packed logits by up to 6.3. So a tensor counts as the
//! decoder's only under the decoder's own prefix and layer range; everything
//! that is recognisably another block is named here and kept out of packs.

use serde::{Deserialize, Serialize};

/// A block of a release that is not part of the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExtraBlock {
    /// Multi-token prediction: `mtp.*`, or a decoder layer past `num_hidden_layers`.
    Mtp,
    /// Routed experts outside the decoder's layers (no supported release has
    /// them; kept out rather than mistaken for a decoder layer's).
    OutsideDecoder,
}

impl ExtraBlock {
    pub fn describe(self) -> &'static str {
        match self {
            ExtraBlock::Mtp => "multi-token prediction block",
            ExtraBlock::OutsideDecoder => "experts outside the decoder's layers",
        }
    }
}

/// Where the decoder's layers are named in a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderNames {
    /// What precedes `layers.N.` (or `blocks.N.`) in the decoder's tensor
    /// names: `model.`, `language_model.model.`, `model.language_model.`, or
    /// nothing (DeepSeek-V4's released names).
    pub prefixes: Vec<String>,
    /// `num_hidden_layers`.
    pub layers: usize,
}

/// Path components that open an MTP block wherever they stand.
const MTP_COMPONENTS: &[&str] = &[
    "mtp",
    "mtp_layers",
    "mtp_block",
    "mtp_emb_norm",
    "mtp_hidden_norm",
    "mtp_linear_proj",
];
/// What the decoder's layer lists are called.
const LAYER_LISTS: &[&str] = &["layers", "blocks"];

impl DecoderNames {
    /// The decoder layer a tensor name is under, if it is under one of the
    /// decoder's own layer lists: `Some((layer, rest))`.
    pub fn layer_of<'a>(&self, name: &'a str) -> Option<(usize, &'a str)> {
        self.prefixes.iter().find_map(|prefix| {
            let rest = name.strip_prefix(prefix.as_str())?;
            let (list, rest) = rest.split_once('.')?;
            if !LAYER_LISTS.contains(&list) {
                return None;
            }
            let (index, rest) = rest.split_once('.')?;
            let layer = index.parse::<usize>().ok()?;
            Some((layer, rest))
        })
    }

    /// The block `name` belongs to when it is not the decoder's: an MTP
    /// component anywhere in the name, or a layer index at or past
    /// `num_hidden_layers` under the decoder's prefix.
    pub fn extra_block(&self, name: &str) -> Option<ExtraBlock> {
        if name.split('.').any(|c| MTP_COMPONENTS.contains(&c)) {
            return Some(ExtraBlock::Mtp);
        }
        match self.layer_of(name) {
            Some((layer, _)) if layer >= self.layers => Some(ExtraBlock::Mtp),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefixes: &[&str], layers: usize) -> DecoderNames {
        DecoderNames {
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            layers,
        }
    }

    #[test]
    fn recognises_each_releases_mtp_block() {
        let qwen = names(&["model."], 48);
        for name in [
            "mtp.fc.weight",
            "mtp.norm.weight",
            "mtp.pre_fc_norm_hidden.weight",
            "mtp.layers.0.mlp.experts.5.gate_proj.weight",
            "mtp.layers.0.self_attn.q_proj.weight",
        ] {
            assert_eq!(qwen.extra_block(name), Some(ExtraBlock::Mtp), "{name}");
        }
        assert_eq!(
            qwen.extra_block("model.layers.0.mlp.experts.5.gate_proj.weight"),
            None
        );
        let deepseek = names(&["model."], 61);
        assert_eq!(
            deepseek.extra_block("model.layers.61.mlp.experts.0.up_proj.weight"),
            Some(ExtraBlock::Mtp)
        );
        assert_eq!(
            deepseek.extra_block("model.layers.61.eh_proj.weight"),
            Some(ExtraBlock::Mtp)
        );
        assert_eq!(deepseek.extra_block("model.layers.60.eh_proj.weight"), None);
        assert_eq!(
            names(&["model."], 4).extra_block("model.mtp_layers.0.input_layernorm.weight"),
            Some(ExtraBlock::Mtp)
        );
        for name in [
            "model.mtp_block.0.mlp.experts.3.up_proj.weight",
            "model.mtp_emb_norm.0.weight",
            "model.mtp_hidden_norm.0.weight",
            "model.mtp_linear_proj.0.weight",
        ] {
            assert_eq!(qwen.extra_block(name), Some(ExtraBlock::Mtp), "{name}");
        }
        // DeepSeek-V4's released names have no `model.`.
        let v4 = names(&["", "model."], 43);
        assert_eq!(
            v4.extra_block("mtp.0.attn.wq_a.weight"),
            Some(ExtraBlock::Mtp)
        );
        assert_eq!(
            v4.layer_of("layers.7.ffn.experts.1.w2.weight").map(|l| l.0),
            Some(7)
        );
        // Names that merely contain the letters are the decoder's.
        assert_eq!(
            qwen.extra_block("model.layers.3.mlp.gate_mtp_like.weight"),
            None
        );
    }
}
