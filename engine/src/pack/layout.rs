//! Which tensors of a checkpoint are routed experts, by name.
//!
//! All supported families name routed experts the same few ways, so the
//! split into "streamed" and "resident" needs no architecture knowledge:
//! per-expert tensors `…layers.L.<block>.experts.E.{gate_proj,up_proj,down_proj,w1,w3,w2}.weight`
//! (with their scales: `weight_scale_inv`, INT4's parts, DeepSeek-V4's `scale`)
//! or fused ones `…layers.L.<block>.experts.{gate_up_proj,down_proj}`, or
//! Step's three stacks `…layers.L.moe.{gate_proj,up_proj,down_proj}.weight`.
//! Shared experts (`shared_experts.gate_proj`) have no index and stay resident.
//! A name counts only under the decoder's own prefix and layer range
//! ([`DecoderNames`]): blocks beside the decoder (MTP) are left out.

use std::collections::BTreeMap;

use regex::Regex;

use crate::model::{DecoderNames, ExtraBlock};

/// Which projection of an expert a tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Gate,
    Up,
    Down,
}

/// Where one layer's expert weights are in the checkpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerTensors {
    /// Per-expert tensors: expert id → (gate, up, down) names.
    pub per_expert: BTreeMap<usize, [Option<String>; 3]>,
    /// Fused `[E, 2I, H]` gate/up and `[E, H, I]` down tensors.
    pub fused: [Option<String>; 2],
    /// Stacks `[E, I, H]` of gates and of ups, and `[E, H, I]` of downs.
    pub stacks: [Option<String>; 3],
}

/// The routed-expert tensors of a checkpoint, by decoder layer.
#[derive(Debug, Default)]
pub struct ExpertTensors {
    pub layers: BTreeMap<usize, LayerTensors>,
}

/// A checkpoint's tensors sorted for a pack.
#[derive(Debug, Default)]
pub struct Classified {
    pub experts: ExpertTensors,
    /// Everything else the decoder reads: the resident file's tensors.
    pub resident: Vec<String>,
    /// Tensors of blocks the decoder does not run, by block.
    pub left_out: BTreeMap<ExtraBlock, Vec<String>>,
}

impl ExpertTensors {
    /// Sorts `names` into the decoder's expert tensors, its other tensors
    /// and the tensors of other blocks.
    pub fn classify<'a>(
        names: impl Iterator<Item = &'a str>,
        decoder: &DecoderNames,
    ) -> Result<Classified, regex::Error> {
        let per_expert = Regex::new(
            r"(?:^|\.)(?:layers|blocks)\.(\d+)\.[A-Za-z_]+\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.(?:weight(_scale_inv|_packed|_scale|_shape|_zero_point|_g_idx)?|(scale))$",
        )?;
        let fused = Regex::new(
            r"(?:^|\.)(?:layers|blocks)\.(\d+)\.[A-Za-z_]+\.experts\.(gate_up_proj|down_proj)(_blocks|_scales)?$",
        )?;
        let stacks = Regex::new(
            r"(?:^|\.)(?:layers|blocks)\.(\d+)\.moe\.(gate_proj|up_proj|down_proj)\.weight$",
        )?;
        let mut out = ExpertTensors::default();
        let mut resident = Vec::new();
        let mut left_out: BTreeMap<ExtraBlock, Vec<String>> = BTreeMap::new();
        for name in names {
            let outside = |name: &str| {
                decoder
                    .layer_of(name)
                    .is_none_or(|(layer, _)| layer >= decoder.layers)
            };
            let extra = decoder.extra_block(name).or_else(|| {
                let expert =
                    per_expert.is_match(name) || fused.is_match(name) || stacks.is_match(name);
                (expert && outside(name)).then_some(ExtraBlock::OutsideDecoder)
            });
            if let Some(block) = extra {
                left_out.entry(block).or_default().push(name.to_string());
            } else if let Some(c) = per_expert.captures(name) {
                let (Ok(layer), Ok(expert)) = (c[1].parse::<usize>(), c[2].parse::<usize>()) else {
                    resident.push(name.to_string());
                    continue;
                };
                let part = match &c[3] {
                    "gate_proj" | "w1" => Part::Gate,
                    "up_proj" | "w3" => Part::Up,
                    _ => Part::Down,
                };
                // DeepSeek-V4's released `….w1.scale` travels with its weight.
                if c.get(5).is_some() {
                    continue;
                }
                let name = match c.get(4).map(|m| m.as_str()) {
                    None => name.to_string(),
                    // An INT4 expert is known by its weight's name; its
                    // parts are read through it.
                    Some("_packed") => name.trim_end_matches("_packed").to_string(),
                    // FP8 block scales and INT4 group scales travel with the
                    // expert (read by the weight's name), not in the resident file.
                    Some(_) => continue,
                };
                let slots = out
                    .layers
                    .entry(layer)
                    .or_default()
                    .per_expert
                    .entry(expert)
                    .or_default();
                slots[part as usize] = Some(name);
            } else if let Some(c) = fused.captures(name) {
                let Ok(layer) = c[1].parse::<usize>() else {
                    resident.push(name.to_string());
                    continue;
                };
                // MXFP4 stacks are known by their name without `_blocks`;
                // their scales travel with them.
                let name = match c.get(3).map(|m| m.as_str()) {
                    None => name,
                    Some("_blocks") => name.trim_end_matches("_blocks"),
                    Some(_) => continue,
                };
                let slot = if &c[2] == "gate_up_proj" { 0 } else { 1 };
                out.layers.entry(layer).or_default().fused[slot] = Some(name.to_string());
            } else if let Some(c) = stacks.captures(name) {
                let Ok(layer) = c[1].parse::<usize>() else {
                    resident.push(name.to_string());
                    continue;
                };
                let part = match &c[2] {
                    "gate_proj" => Part::Gate,
                    "up_proj" => Part::Up,
                    _ => Part::Down,
                };
                out.layers.entry(layer).or_default().stacks[part as usize] = Some(name.to_string());
            } else {
                resident.push(name.to_string());
            }
        }
        Ok(Classified {
            experts: out,
            resident,
            left_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_experts_from_resident_tensors() {
        let names = [
            "model.embed_tokens.weight",
            "model.layers.1.mlp.experts.0.gate_proj.weight",
            "model.layers.1.mlp.experts.0.up_proj.weight",
            "model.layers.1.mlp.experts.0.down_proj.weight",
            "model.layers.1.mlp.shared_experts.gate_proj.weight",
            "model.layers.2.block_sparse_moe.experts.3.w2.weight",
            "language_model.model.layers.4.mlp.experts.gate_up_proj",
            "model.layers.1.mlp.gate.weight",
            "model.layers.5.mlp.experts.2.down_proj.weight_packed",
            "model.layers.5.mlp.experts.2.down_proj.weight_scale",
            "model.layers.5.mlp.experts.2.down_proj.weight_shape",
            "model.layers.6.mlp.experts.gate_up_proj_blocks",
            "model.layers.6.mlp.experts.gate_up_proj_scales",
            "model.layers.6.mlp.experts.gate_up_proj_bias",
            "layers.7.ffn.experts.1.w2.weight",
            "layers.7.ffn.experts.1.w2.scale",
            "model.layers.8.moe.gate_proj.weight",
            "model.layers.8.moe.up_proj.weight",
            "model.layers.8.moe.down_proj.weight",
            "model.layers.8.moe.gate.weight",
            "model.layers.8.mlp.gate_proj.weight",
        ];
        let decoder = DecoderNames {
            prefixes: vec!["model.".into(), "language_model.model.".into(), "".into()],
            layers: 9,
        };
        let sorted = ExpertTensors::classify(names.iter().copied(), &decoder).unwrap();
        let (experts, resident) = (sorted.experts, sorted.resident);
        assert!(sorted.left_out.is_empty());
        assert_eq!(
            resident,
            vec![
                "model.embed_tokens.weight",
                "model.layers.1.mlp.shared_experts.gate_proj.weight",
                "model.layers.1.mlp.gate.weight",
                "model.layers.6.mlp.experts.gate_up_proj_bias",
                "model.layers.8.moe.gate.weight",
                "model.layers.8.mlp.gate_proj.weight",
            ]
        );
        // Step's stacks of every expert's gates, ups and downs.
        assert!(experts.layers[&8].stacks.iter().all(Option::is_some));
        let l1 = &experts.layers[&1].per_expert[&0];
        assert!(l1.iter().all(Option::is_some));
        assert_eq!(
            experts.layers[&2].per_expert[&3][Part::Down as usize].as_deref(),
            Some("model.layers.2.block_sparse_moe.experts.3.w2.weight")
        );
        assert!(experts.layers[&4].fused[0].is_some());
        assert_eq!(
            experts.layers[&6].fused[0].as_deref(),
            Some("model.layers.6.mlp.experts.gate_up_proj")
        );
        assert_eq!(
            experts.layers[&5].per_expert[&2][Part::Down as usize].as_deref(),
            Some("model.layers.5.mlp.experts.2.down_proj.weight")
        );
        // DeepSeek-V4's released scale travels with its weight.
        assert_eq!(
            experts.layers[&7].per_expert[&1][Part::Down as usize].as_deref(),
            Some("layers.7.ffn.experts.1.w2.weight")
        );
    }

    #[test]
    fn blocks_beside_the_decoder_are_left_out() {
        let names = [
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "mtp.layers.0.mlp.experts.0.gate_proj.weight",
            "mtp.fc.weight",
            "model.layers.2.mlp.experts.1.up_proj.weight",
            "model.layers.2.eh_proj.weight",
            "vision.layers.0.mlp.experts.0.gate_proj.weight",
        ];
        let decoder = DecoderNames {
            prefixes: vec!["model.".into()],
            layers: 2,
        };
        let sorted = ExpertTensors::classify(names.iter().copied(), &decoder).unwrap();
        assert_eq!(
            sorted.experts.layers.keys().copied().collect::<Vec<_>>(),
            [0]
        );
        assert!(sorted.resident.is_empty(), "{:?}", sorted.resident);
        assert_eq!(
            sorted.left_out[&ExtraBlock::Mtp],
            [
                "mtp.layers.0.mlp.experts.0.gate_proj.weight",
                "mtp.fc.weight",
                "model.layers.2.mlp.experts.1.up_proj.weight",
                "model.layers.2.eh_proj.weight"
            ]
        );
        assert_eq!(
            sorted.left_out[&ExtraBlock::OutsideDecoder],
            ["vision.layers.0.mlp.experts.0.gate_proj.weight"]
        );
    }
}
