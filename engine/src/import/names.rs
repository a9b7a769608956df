//! GGUF tensor names and types to Hugging Face names and dtypes, per
//! architecture, as llama.cpp's converter (`gguf-py`'s tensor map) names
//! them. Stacked experts (`ffn_gate_exps`, `[E, I, H]`) become one tensor
//! per expert: each is a contiguous slice of the stack, so the pack writer
//! reads an expert's blocks where they lie.

use std::collections::BTreeMap;

use super::ImportError;
use crate::kernels::Format;
use crate::weights::gguf::{GgmlType, GgufFile, GgufTensor};
use crate::weights::{Dtype, RowOrder, SafetensorsCheckpoint, SafetensorsFile, TensorInfo};

/// GGUF tensor types Longhaul computes with, by GGML's names.
pub fn supported_types() -> Vec<&'static str> {
    crate::kernels::format::FORMATS
        .iter()
        .filter_map(|r| r.ggml.map(|(_, name)| name))
        .collect()
}

/// GGUF architectures Longhaul reads, by `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Qwen3-MoE.
    Qwen3Moe,
    /// `llama` with experts: Mixtral and its kin.
    Llama,
    /// DeepSeek-V3/R1 and Kimi K2 (MLA, sigmoid routing, shared experts).
    Deepseek2,
    /// gpt-oss (attention sinks, biases, MXFP4 experts).
    GptOss,
}

impl Arch {
    pub fn of(file: &GgufFile) -> Result<Self, ImportError> {
        let key = "general.architecture";
        let name = file
            .metadata
            .get(key)
            .and_then(|v| v.as_str())
            .ok_or_else(|| ImportError::MissingKey {
                path: file.path.clone(),
                key: key.to_string(),
                needs: "it names the model's architecture",
            })?;
        // The families' table says which architectures are read; this
        // module knows how each one's names map.
        let known = crate::model::family::family_of_gguf(name).and(match name {
            "qwen3moe" => Some(Arch::Qwen3Moe),
            "llama" => Some(Arch::Llama),
            "deepseek2" => Some(Arch::Deepseek2),
            "gpt-oss" => Some(Arch::GptOss),
            _ => None,
        });
        known.ok_or_else(|| ImportError::Unsupported {
            path: file.path.clone(),
            what: format!(
                "GGUF architecture `{name}` is not supported; supported: {} (`llama` with experts)",
                crate::model::family::supported_gguf_architectures().join(", ")
            ),
        })
    }

    /// The metadata key prefix.
    pub fn key(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Llama => "llama",
            Arch::Deepseek2 => "deepseek2",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// The Hugging Face module holding a layer's MoE, and its expert names
    /// for gate, up and down.
    fn moe(self) -> (&'static str, [&'static str; 3]) {
        match self {
            Arch::Qwen3Moe | Arch::Deepseek2 | Arch::GptOss => {
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            }
            Arch::Llama => ("block_sparse_moe", ["w1", "w3", "w2"]),
        }
    }

    /// The Hugging Face name of one layer's tensor `part` (the GGUF name
    /// after `blk.N.`, without `.weight`/`.bias`).
    fn layer_part(self, part: &str) -> Option<String> {
        let (moe, _) = self.moe();
        let fixed = match part {
            "attn_norm" => "input_layernorm",
            "attn_q" => "self_attn.q_proj",
            "attn_k" => "self_attn.k_proj",
            "attn_v" => "self_attn.v_proj",
            "attn_output" => "self_attn.o_proj",
            "attn_q_norm" => "self_attn.q_norm",
            "attn_k_norm" => "self_attn.k_norm",
            "ffn_norm" => "post_attention_layernorm",
            "ffn_gate" => "mlp.gate_proj",
            "ffn_up" => "mlp.up_proj",
            "ffn_down" => "mlp.down_proj",
            // gpt-oss calls its router a router and its second norm so.
            "ffn_gate_inp" if self == Arch::GptOss => "mlp.router",
            "post_attention_norm" if self == Arch::GptOss => "post_attention_layernorm",
            "ffn_gate_inp" => return Some(format!("{moe}.gate")),
            _ if self == Arch::Deepseek2 => return deepseek2_part(part),
            _ => return None,
        };
        Some(fixed.to_string())
    }
}

/// DeepSeek-V3's own layer tensors. `attn_k_b`/`attn_v_b` are `kv_b_proj`
/// split per head (keys transposed) by llama.cpp's converter; the model
/// reads them as they are (see `deepseek_v3::load_kv_b`).
fn deepseek2_part(part: &str) -> Option<String> {
    let name = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_q_a" => "self_attn.q_a_proj",
        "attn_q_a_norm" => "self_attn.q_a_layernorm",
        "attn_q_b" => "self_attn.q_b_proj",
        "attn_kv_a_mqa" => "self_attn.kv_a_proj_with_mqa",
        "attn_kv_a_norm" => "self_attn.kv_a_layernorm",
        "attn_kv_b" => "self_attn.kv_b_proj",
        "attn_k_b" => "self_attn.k_b_proj",
        "attn_v_b" => "self_attn.v_b_proj",
        "ffn_gate_shexp" => "mlp.shared_experts.gate_proj",
        "ffn_up_shexp" => "mlp.shared_experts.up_proj",
        "ffn_down_shexp" => "mlp.shared_experts.down_proj",
        _ => return None,
    };
    Some(name.to_string())
}

/// What one GGUF tensor becomes.
enum Mapped {
    One(String),
    /// A stack of experts: the per-expert name with `{e}` for the expert.
    Experts(String),
}

fn map_name(arch: Arch, name: &str) -> Option<Mapped> {
    // gpt-oss's sinks are a parameter of attention, not a weight.
    if let Some(layer) = name
        .strip_prefix("blk.")
        .and_then(|r| r.strip_suffix(".attn_sinks.weight"))
        .filter(|_| arch == Arch::GptOss)
    {
        let layer: usize = layer.parse().ok()?;
        return Some(Mapped::One(format!("model.layers.{layer}.self_attn.sinks")));
    }
    // DeepSeek's routing bias is a parameter of the gate, not a bias.
    if let Some(layer) = name
        .strip_prefix("blk.")
        .and_then(|r| r.strip_suffix(".exp_probs_b.bias"))
        .filter(|_| arch == Arch::Deepseek2)
    {
        let layer: usize = layer.parse().ok()?;
        return Some(Mapped::One(format!(
            "model.layers.{layer}.mlp.gate.e_score_correction_bias"
        )));
    }
    let (mapped, suffix) = map_stem(arch, name)?;
    Some(match mapped {
        Mapped::One(n) => Mapped::One(format!("{n}.{suffix}")),
        Mapped::Experts(p) => Mapped::Experts(format!("{p}.{suffix}")),
    })
}

/// [`map_name`] for names ending in `.weight` or `.bias`, without it.
fn map_stem(arch: Arch, name: &str) -> Option<(Mapped, &'static str)> {
    let (stem, suffix) = if let Some(s) = name.strip_suffix(".weight") {
        (s, "weight")
    } else {
        (name.strip_suffix(".bias")?, "bias")
    };
    let global = match stem {
        "token_embd" => Some("model.embed_tokens"),
        "output_norm" => Some("model.norm"),
        "output" => Some("lm_head"),
        _ => None,
    };
    if let Some(g) = global {
        return Some((Mapped::One(g.to_string()), suffix));
    }
    let rest = stem.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let prefix = format!("model.layers.{layer}");
    let (moe, [gate, up, down]) = arch.moe();
    let stacked = match part {
        "ffn_gate_exps" => Some(gate),
        "ffn_up_exps" => Some(up),
        "ffn_down_exps" => Some(down),
        _ => None,
    };
    if let Some(p) = stacked {
        return Some((
            Mapped::Experts(format!("{prefix}.{moe}.experts.{{e}}.{p}")),
            suffix,
        ));
    }
    // Older Mixtral files store each expert on its own: `ffn_gate.E`.
    if let Some((kind, e)) = part.split_once('.')
        && let Ok(e) = e.parse::<usize>()
    {
        let p = match kind {
            "ffn_gate" => gate,
            "ffn_up" => up,
            "ffn_down" => down,
            _ => return None,
        };
        return Some((
            Mapped::One(format!("{prefix}.{moe}.experts.{e}.{p}")),
            suffix,
        ));
    }
    let hf = arch.layer_part(part)?;
    Some((Mapped::One(format!("{prefix}.{hf}")), suffix))
}

/// The dtype a GGUF tensor type is read as, if Longhaul computes with it.
fn dtype(ty: GgmlType) -> Option<Dtype> {
    Some(match Format::of_ggml(ty.0)? {
        Format::F32 => Dtype::F32,
        Format::F16 => Dtype::F16,
        Format::BF16 => Dtype::BF16,
        f => Dtype::Blocks(f),
    })
}

/// All tensors of `files` under Hugging Face names, as one checkpoint.
pub fn checkpoint(arch: Arch, files: &[GgufFile]) -> Result<SafetensorsCheckpoint, ImportError> {
    let heads = rope_heads(arch, &files[0])?;
    let mut opened = Vec::with_capacity(files.len());
    for file in files {
        let mut tensors = BTreeMap::new();
        for t in &file.tensors {
            for (name, info) in entries(arch, file, t, heads)? {
                tensors.insert(name, info);
            }
        }
        opened.push(SafetensorsFile::with_tensors(&file.path, tensors)?);
    }
    let dir = files[0].path.clone();
    Ok(SafetensorsCheckpoint::from_files(&dir, opened)?)
}

/// For `llama`, the query and key head counts whose rows the converter
/// reordered for interleaved RoPE.
fn rope_heads(arch: Arch, file: &GgufFile) -> Result<Option<(usize, usize)>, ImportError> {
    if arch != Arch::Llama {
        return Ok(None);
    }
    let meta = super::Meta {
        file,
        arch: arch.key(),
    };
    let heads = meta.u64("attention.head_count", "it sizes attention")? as usize;
    let kv = meta
        .u64_opt("attention.head_count_kv")?
        .map_or(heads, |k| k as usize);
    Ok(Some((heads, kv)))
}

/// The Hugging Face tensors GGUF tensor `t` holds.
fn entries(
    arch: Arch,
    file: &GgufFile,
    t: &GgufTensor,
    rope_heads: Option<(usize, usize)>,
) -> Result<Vec<(String, TensorInfo)>, ImportError> {
    let unsupported = || ImportError::UnsupportedType {
        path: file.path.clone(),
        tensor: t.name.clone(),
        ty: t.ggml_type.name(),
    };
    let dtype = dtype(t.ggml_type).ok_or_else(unsupported)?;
    let len = t.len.ok_or_else(unsupported)?;
    let invalid = |what: String| ImportError::Invalid {
        path: file.path.clone(),
        what: format!("tensor `{}`: {what}", t.name),
    };
    let shape: Vec<usize> = t
        .shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| invalid(format!("shape {:?} is too large", t.shape)))?;
    let mapped = map_name(arch, &t.name).ok_or_else(|| ImportError::Unsupported {
        path: file.path.clone(),
        what: format!(
            "tensor `{}` has no counterpart in the `{}` model Longhaul builds",
            t.name,
            arch.key()
        ),
    })?;
    let info = |shape: Vec<usize>, offset: u64, len: u64, rows: RowOrder| TensorInfo {
        dtype,
        shape,
        offset,
        len,
        rows,
    };
    match mapped {
        Mapped::One(name) => {
            let rows = match rope_heads {
                Some((q, _)) if name.ends_with(".q_proj.weight") => {
                    RowOrder::RopePairs { heads: q }
                }
                Some((_, kv)) if name.ends_with(".k_proj.weight") => {
                    RowOrder::RopePairs { heads: kv }
                }
                _ => RowOrder::Stored,
            };
            Ok(vec![(name, info(shape, t.offset, len, rows))])
        }
        Mapped::Experts(pattern) => {
            // Matrices `[experts, rows, cols]`, or biases `[experts, rows]`.
            let (count, one): (usize, Vec<usize>) = match shape[..] {
                [count, rows, cols] => (count, vec![rows, cols]),
                [count, rows] if pattern.ends_with(".bias") => (count, vec![rows]),
                _ => {
                    return Err(invalid(format!(
                        "expert stack has shape {shape:?}, not [experts, rows, cols]"
                    )));
                }
            };
            let each = len / count.max(1) as u64;
            Ok((0..count)
                .map(|e| {
                    let name = pattern.replace("{e}", &e.to_string());
                    let offset = t.offset + e as u64 * each;
                    (name, info(one.clone(), offset, each, RowOrder::Stored))
                })
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    /// The README's list of tensor types says what a GGUF file may hold:
    /// every type computed is named in it, and none where it says what is
    /// refused.
    #[test]
    fn the_readme_names_every_supported_type_and_refuses_none() {
        let readme = include_str!("../../../README.md");
        let paragraph = readme
            .split("Tensor types:")
            .nth(1)
            .and_then(|rest| rest.split("\n\n").next())
            .unwrap_or_default();
        let words = |text: &str| -> Vec<String> {
            text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map(str::to_string)
                .collect()
        };
        let named = words(paragraph);
        let refused: Vec<String> = paragraph
            .split(". ")
            .filter(|sentence| sentence.contains("refused"))
            .flat_map(words)
            .collect();
        for t in super::supported_types() {
            assert!(named.iter().any(|w| w == t), "README omits {t}");
            assert!(!refused.iter().any(|w| w == t), "README refuses {t}");
        }
    }
}
