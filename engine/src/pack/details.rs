//! What a pack holds, for a person choosing a model: its family and size in
//! parameters (all of them, and those one token uses), how it is stored,
//! the RAM its resident part needs and what each drive holds. Read from the
//! manifest, the resident file's header and config.json: nothing is loaded.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::manifest::Manifest;
use crate::weights::SafetensorsFile;

/// config.json keys naming the experts each token is routed to, by family.
const EXPERTS_PER_TOKEN_KEYS: [&str; 3] = ["num_experts_per_tok", "experts_per_token", "moe_topk"];
/// Matrices in one expert record: gate, up and down.
const MATRICES_PER_EXPERT: u64 = 3;

#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct PackDetails {
    pub model_type: String,
    pub layers: usize,
    pub context_length: Option<usize>,
    /// Every parameter: the resident weights and every expert.
    pub total_params: u64,
    /// What one token uses: the resident weights and its experts in each
    /// expert layer (absent when config.json does not say how many).
    pub active_params: Option<u64>,
    pub expert_layers: usize,
    pub experts_per_layer: usize,
    pub experts_per_token: Option<usize>,
    /// How experts are stored (a safetensors dtype or a quantisation).
    pub expert_dtype: String,
    /// Quantisation asked for when packing (lossy), if any.
    pub expert_quantization: Option<String>,
    pub resident_quantization: Option<String>,
    /// Lossless compression of expert records, if any.
    pub compression: Option<String>,
    /// Bytes of expert records on the drives.
    pub expert_bytes: u64,
    /// Bytes of the resident weights: the RAM they need, as stored.
    pub resident_bytes: u64,
    pub drives: Vec<DriveShare>,
}

/// What one drive holds of a pack.
#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct DriveShare {
    pub path: PathBuf,
    pub bytes: u64,
}

/// The details of the pack at `dir` whose manifest is `manifest`; `None`
/// when its config cannot be read.
pub fn describe(dir: &Path, manifest: &Manifest) -> Option<PackDetails> {
    let config: serde_json::Value = serde_json::from_str(
        &crate::regular::read_text(&dir.join("config.json"), crate::regular::SETTINGS_LIMIT)
            .ok()?,
    )
    .ok()?;
    let spec = crate::model::ModelSpec::read(&dir.join("config.json")).ok();
    let resident_path = if manifest.resident.path.is_absolute() {
        manifest.resident.path.clone()
    } else {
        dir.join(&manifest.resident.path)
    };
    let resident_params: u64 = SafetensorsFile::open(&resident_path)
        .map(|f| {
            f.tensors()
                .values()
                .map(|t| t.shape.iter().product::<usize>() as u64)
                .sum()
        })
        .unwrap_or(0);
    let layers = &manifest.experts.layers;
    let per_expert = |l: &super::manifest::ExpertLayer| {
        MATRICES_PER_EXPERT * l.hidden as u64 * l.intermediate as u64
    };
    let expert_params: u64 = layers
        .iter()
        .map(|l| per_expert(l) * l.records.len() as u64)
        .sum();
    let experts_per_token = EXPERTS_PER_TOKEN_KEYS
        .iter()
        .find_map(|k| config.get(*k)?.as_u64())
        .and_then(|k| usize::try_from(k).ok());
    let active_params = experts_per_token
        .map(|k| resident_params + layers.iter().map(|l| per_expert(l) * k as u64).sum::<u64>());
    let mut drives: Vec<DriveShare> = manifest
        .drives
        .iter()
        .map(|p| DriveShare {
            path: p.clone(),
            bytes: 0,
        })
        .collect();
    let mut expert_bytes = 0;
    for record in layers.iter().flat_map(|l| &l.records) {
        for segment in record.placements().flatten() {
            expert_bytes += segment.len;
            if let Some(d) = drives.get_mut(segment.drive) {
                d.bytes += segment.len;
            }
        }
    }
    let quantized = |q: Option<&super::manifest::QuantizationReport>, stored: &str| {
        q.map(|q| q.requested.clone().unwrap_or_else(|| stored.to_string()))
    };
    Some(PackDetails {
        model_type: manifest.model_type.clone(),
        layers: spec.as_ref().map_or(0, |s| s.common().num_layers),
        context_length: spec.as_ref().and_then(|s| s.common().context_length),
        total_params: resident_params + expert_params,
        active_params,
        expert_layers: layers.len(),
        experts_per_layer: layers.iter().map(|l| l.records.len()).max().unwrap_or(0),
        experts_per_token,
        expert_dtype: manifest.experts.dtype.clone(),
        expert_quantization: quantized(
            manifest.experts.quantization.as_ref(),
            &manifest.experts.dtype,
        ),
        resident_quantization: quantized(manifest.resident.quantization.as_ref(), "Q8_0"),
        compression: manifest.experts.compression.clone(),
        expert_bytes,
        resident_bytes: manifest.resident.size,
        drives,
    })
}
