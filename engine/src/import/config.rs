//! A GGUF file's metadata as the `config.json` its model was converted
//! from, so one parser (and its checks) serves both. Settings llama.cpp
//! fixes per architecture rather than storing are stated here with the
//! reason; a key the model cannot do without is an error naming it.

use serde_json::{Map, Value, json};

use super::names::Arch;
use super::{ImportError, Meta};
use crate::weights::gguf::GgufFile;
use crate::weights::{SafetensorsCheckpoint, TensorSource};

/// llama.cpp's RoPE base when a file states none.
const DEFAULT_ROPE_BASE: f64 = 10_000.0;

pub fn config_json(
    arch: Arch,
    file: &GgufFile,
    ckpt: &SafetensorsCheckpoint,
) -> Result<Value, ImportError> {
    let m = Meta {
        file,
        arch: arch.key(),
    };
    let embed = ckpt
        .shape("model.embed_tokens.weight")
        .ok_or_else(|| ImportError::Invalid {
            path: file.path.clone(),
            what: "it holds no `token_embd.weight`".to_string(),
        })?;
    let layers = m.u64("block_count", "it counts the layers")?;
    let heads = m.u64("attention.head_count", "it sizes attention")?;
    let head_dim = match (
        m.u64_opt("attention.key_length")?,
        m.u64_opt("attention.value_length")?,
    ) {
        (Some(k), Some(v)) if k != v => {
            return Err(ImportError::Unsupported {
                path: file.path.clone(),
                what: format!("key length {k} differs from value length {v}"),
            });
        }
        (k, _) => k,
    };
    let mut c = Map::new();
    let mut set = |k: &str, v: Value| {
        c.insert(k.to_string(), v);
    };
    set("vocab_size", json!(embed[0]));
    set(
        "hidden_size",
        json!(m.u64("embedding_length", "it is the model's width")?),
    );
    set("num_hidden_layers", json!(layers));
    set("num_attention_heads", json!(heads));
    set(
        "num_key_value_heads",
        json!(m.u64_opt("attention.head_count_kv")?.unwrap_or(heads)),
    );
    if let Some(d) = head_dim {
        set("head_dim", json!(d));
    }
    set(
        "rms_norm_eps",
        json!(
            m.f64_opt("attention.layer_norm_rms_epsilon")?
                .ok_or_else(|| {
                    ImportError::MissingKey {
                        path: file.path.clone(),
                        key: format!("{}.attention.layer_norm_rms_epsilon", arch.key()),
                        needs: "the RMS norms need it",
                    }
                })?
        ),
    );
    set(
        "rope_theta",
        json!(m.f64_opt("rope.freq_base")?.unwrap_or(DEFAULT_ROPE_BASE)),
    );
    if let Some(ctx) = m.u64_opt("context_length")? {
        set("max_position_embeddings", json!(ctx));
    }
    if let Some(scaling) = rope_scaling(&m)? {
        set("rope_scaling", scaling);
    }
    set("hidden_act", json!("silu"));
    set(
        "tie_word_embeddings",
        json!(ckpt.shape("lm_head.weight").is_none()),
    );
    set(
        "attention_bias",
        json!(ckpt.shape("model.layers.0.self_attn.q_proj.bias").is_some()),
    );
    let token = |key: &str| file.metadata.get(key).and_then(|v| v.as_u64());
    if let Some(eos) = token("tokenizer.ggml.eos_token_id") {
        set("eos_token_id", json!(eos));
    }
    if let Some(bos) = token("tokenizer.ggml.bos_token_id") {
        set("bos_token_id", json!(bos));
    }
    let experts = m
        .u64_opt("expert_count")?
        .filter(|&e| e > 0)
        .ok_or_else(|| ImportError::MissingKey {
            path: file.path.clone(),
            key: format!("{}.expert_count", arch.key()),
            needs: "Longhaul runs mixture-of-experts models, and this file states no experts",
        })?;
    let used = m.u64(
        "expert_used_count",
        "it says how many experts each token uses",
    )?;
    set("num_experts_per_tok", json!(used));
    match arch {
        Arch::Qwen3Moe => {
            set("model_type", json!("qwen3_moe"));
            set("num_experts", json!(experts));
            let moe = m.u64("expert_feed_forward_length", "it sizes the experts")?;
            set("moe_intermediate_size", json!(moe));
            set(
                "intermediate_size",
                json!(m.u64_opt("feed_forward_length")?.unwrap_or(moe)),
            );
            // llama.cpp always renormalises Qwen3-MoE's top-k weights
            // (`norm_w` is fixed in its graph), as every released config does.
            set("norm_topk_prob", json!(true));
            let dense: Vec<u64> = (0..layers)
                .filter(|l| {
                    ckpt.shape(&format!("model.layers.{l}.mlp.gate.weight"))
                        .is_none()
                })
                .collect();
            set("mlp_only_layers", json!(dense));
        }
        Arch::Llama => {
            set("model_type", json!("mixtral"));
            set("num_local_experts", json!(experts));
            set(
                "intermediate_size",
                json!(m.u64("feed_forward_length", "it sizes the experts")?),
            );
            if head_dim.is_none()
                && let Some(d) = m.u64_opt("rope.dimension_count")?
            {
                set("head_dim", json!(d));
            }
        }
    }
    Ok(Value::Object(c))
}

/// `rope_scaling` from `rope.scaling.*`: none, linear or YaRN.
fn rope_scaling(m: &Meta) -> Result<Option<Value>, ImportError> {
    let Some(kind) = m.str_opt("rope.scaling.type")? else {
        return Ok(None);
    };
    let factor = m.f64_opt("rope.scaling.factor")?;
    match kind {
        "none" => Ok(None),
        "linear" => Ok(Some(
            json!({"rope_type": "linear", "factor": factor.unwrap_or(1.0)}),
        )),
        "yarn" => {
            let original = m.u64("rope.scaling.original_context_length", "YaRN needs it")?;
            Ok(Some(json!({
                "rope_type": "yarn",
                "factor": factor.unwrap_or(1.0),
                "original_max_position_embeddings": original,
            })))
        }
        other => Err(ImportError::Unsupported {
            path: m.file.path.clone(),
            what: format!("RoPE scaling `{other}` is not supported (none, linear and yarn are)"),
        }),
    }
}
