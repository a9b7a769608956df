//! A GGUF file's metadata as the `config.json` its model was converted
//! from, so one parser (and its checks) serves both. Settings llama.cpp
//! fixes per architecture rather than storing are stated here with the
//! reason; a key the model cannot do without is an error naming it.

use serde_json::{Map, Value, json};

use super::names::Arch;
use super::{ImportError, Meta};
use crate::weights::gguf::GgufFile;
use crate::weights::{SafetensorsCheckpoint, TensorSource};

/// llama.cpp's converter writes DeepSeek's `mscale_all_dim` times this.
const YARN_LOG_MULTIPLIER_SCALE: f64 = 0.1;
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
    let mut c = Map::new();
    let head_dim = common(&m, arch, ckpt, &mut c)?;
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
    put(&mut c, "num_experts_per_tok", json!(used));
    let layers = m.u64("block_count", "it counts the layers")?;
    // Every layer has tensors of its own: a count past the file's tensors
    // is not this file's.
    let tensors = ckpt.names().count() as u64;
    if layers > tensors {
        return Err(ImportError::Invalid {
            path: file.path.clone(),
            what: format!(
                "{}.block_count is {layers}, more layers than the model's {tensors} tensors could hold",
                arch.key()
            ),
        });
    }
    match arch {
        Arch::Qwen3Moe => qwen3moe(&m, &mut c, experts, layers, ckpt)?,
        Arch::Deepseek2 => deepseek2(&m, &mut c, experts)?,
        Arch::GptOss => gpt_oss(&m, &mut c, experts, layers)?,
        Arch::Llama => mixtral(&m, &mut c, experts, head_dim)?,
    }
    Ok(Value::Object(c))
}

/// What every architecture states alike: sizes, norms, RoPE, tying, bias
/// and special tokens. Returns the head size when the file states one.
fn common(
    m: &Meta,
    arch: Arch,
    ckpt: &SafetensorsCheckpoint,
    c: &mut Map<String, Value>,
) -> Result<Option<u64>, ImportError> {
    let file = m.file;
    let embed = ckpt
        .shape("model.embed_tokens.weight")
        .ok_or_else(|| ImportError::Invalid {
            path: file.path.clone(),
            what: "it holds no `token_embd.weight`".to_string(),
        })?;
    let heads = m.u64("attention.head_count", "it sizes attention")?;
    // MLA's latent "head" makes key and value lengths differ by design.
    let head_dim = match (
        m.u64_opt("attention.key_length")?,
        m.u64_opt("attention.value_length")?,
    ) {
        (Some(k), Some(v)) if k != v && arch != Arch::Deepseek2 => {
            return Err(ImportError::Unsupported {
                path: file.path.clone(),
                what: format!("key length {k} differs from value length {v}"),
            });
        }
        (k, _) => k.filter(|_| arch != Arch::Deepseek2),
    };
    put(c, "vocab_size", json!(embed[0]));
    let width = m.u64("embedding_length", "it is the model's width")?;
    put(c, "hidden_size", json!(width));
    put(
        c,
        "num_hidden_layers",
        json!(m.u64("block_count", "it counts the layers")?),
    );
    put(c, "num_attention_heads", json!(heads));
    let kv_heads = m.u64_opt("attention.head_count_kv")?.unwrap_or(heads);
    put(c, "num_key_value_heads", json!(kv_heads));
    if let Some(d) = head_dim {
        put(c, "head_dim", json!(d));
    }
    let eps = m
        .f64_opt("attention.layer_norm_rms_epsilon")?
        .ok_or_else(|| ImportError::MissingKey {
            path: file.path.clone(),
            key: format!("{}.attention.layer_norm_rms_epsilon", arch.key()),
            needs: "the RMS norms need it",
        })?;
    put(c, "rms_norm_eps", json!(eps));
    let base = m.f64_opt("rope.freq_base")?.unwrap_or(DEFAULT_ROPE_BASE);
    put(c, "rope_theta", json!(base));
    if let Some(ctx) = m.u64_opt("context_length")? {
        put(c, "max_position_embeddings", json!(ctx));
    }
    if let Some(scaling) = rope_scaling(m)? {
        put(c, "rope_scaling", scaling);
    }
    put(c, "hidden_act", json!("silu"));
    put(
        c,
        "tie_word_embeddings",
        json!(ckpt.shape("lm_head.weight").is_none()),
    );
    let bias = ckpt.shape("model.layers.0.self_attn.q_proj.bias").is_some();
    put(c, "attention_bias", json!(bias));
    let token = |key: &str| file.metadata.get(key).and_then(|v| v.as_u64());
    if let Some(eos) = token("tokenizer.ggml.eos_token_id") {
        put(c, "eos_token_id", json!(eos));
    }
    if let Some(bos) = token("tokenizer.ggml.bos_token_id") {
        put(c, "bos_token_id", json!(bos));
    }
    Ok(head_dim)
}

/// Qwen3-MoE's settings; layers without a router are dense.
fn qwen3moe(
    m: &Meta,
    c: &mut Map<String, Value>,
    experts: u64,
    layers: u64,
    ckpt: &SafetensorsCheckpoint,
) -> Result<(), ImportError> {
    put(c, "model_type", json!("qwen3_moe"));
    put(c, "num_experts", json!(experts));
    let moe = m.u64("expert_feed_forward_length", "it sizes the experts")?;
    put(c, "moe_intermediate_size", json!(moe));
    let dense = m.u64_opt("feed_forward_length")?.unwrap_or(moe);
    put(c, "intermediate_size", json!(dense));
    // llama.cpp always renormalises Qwen3-MoE's top-k weights (`norm_w` is
    // fixed in its graph), as every released config does.
    put(c, "norm_topk_prob", json!(true));
    let dense: Vec<u64> = (0..layers)
        .filter(|l| {
            ckpt.shape(&format!("model.layers.{l}.mlp.gate.weight"))
                .is_none()
        })
        .collect();
    put(c, "mlp_only_layers", json!(dense));
    Ok(())
}

/// Mixtral's settings (`llama` with experts).
fn mixtral(
    m: &Meta,
    c: &mut Map<String, Value>,
    experts: u64,
    head_dim: Option<u64>,
) -> Result<(), ImportError> {
    put(c, "model_type", json!("mixtral"));
    put(c, "num_local_experts", json!(experts));
    let width = m.u64("feed_forward_length", "it sizes the experts")?;
    put(c, "intermediate_size", json!(width));
    if head_dim.is_none()
        && let Some(d) = m.u64_opt("rope.dimension_count")?
    {
        put(c, "head_dim", json!(d));
    }
    Ok(())
}

/// DeepSeek-V3's settings, as llama.cpp's converter states them.
fn deepseek2(m: &Meta, c: &mut Map<String, Value>, experts: u64) -> Result<(), ImportError> {
    let path = &m.file.path;
    let need = |name: &str, why: &'static str| m.u64(name, why);
    let gating = m.u64_opt("expert_gating_func")?;
    // llama.cpp's numbering: 1 softmax, 2 sigmoid.
    const SIGMOID: u64 = 2;
    if gating != Some(SIGMOID) {
        return Err(ImportError::Unsupported {
            path: path.clone(),
            what: format!(
                "deepseek2.expert_gating_func is {gating:?}; Longhaul runs DeepSeek-V3-style sigmoid routing (2)"
            ),
        });
    }
    let rope_dim = need(
        "rope.dimension_count",
        "it sizes the rotary part of each head",
    )?;
    // Files that split kv_b state the per-head lengths under `_mla`;
    // older ones under the plain keys.
    let qk = match m.u64_opt("attention.key_length_mla")? {
        Some(k) => k,
        None => need("attention.key_length", "it sizes the query and key heads")?,
    };
    let v = match m.u64_opt("attention.value_length_mla")? {
        Some(v) => v,
        None => need("attention.value_length", "it sizes the value heads")?,
    };
    let nope = qk
        .checked_sub(rope_dim)
        .ok_or_else(|| ImportError::Invalid {
            path: path.clone(),
            what: format!("key length {qk} is shorter than the rotary part {rope_dim}"),
        })?;
    put(c, "model_type", json!("deepseek_v3"));
    put(c, "n_routed_experts", json!(experts));
    put(c, "qk_rope_head_dim", json!(rope_dim));
    put(c, "qk_nope_head_dim", json!(nope));
    put(c, "v_head_dim", json!(v));
    put(
        c,
        "kv_lora_rank",
        json!(need("attention.kv_lora_rank", "MLA needs it")?),
    );
    if let Some(q) = m.u64_opt("attention.q_lora_rank")?.filter(|&q| q > 0) {
        put(c, "q_lora_rank", json!(q));
    }
    put(
        c,
        "moe_intermediate_size",
        json!(need("expert_feed_forward_length", "it sizes the experts")?),
    );
    put(
        c,
        "intermediate_size",
        json!(need("feed_forward_length", "it sizes the dense layers")?),
    );
    put(
        c,
        "n_shared_experts",
        json!(m.u64_opt("expert_shared_count")?.unwrap_or(0)),
    );
    put(
        c,
        "first_k_dense_replace",
        json!(m.u64_opt("leading_dense_block_count")?.unwrap_or(0)),
    );
    put(
        c,
        "routed_scaling_factor",
        json!(m.f64_opt("expert_weights_scale")?.unwrap_or(1.0)),
    );
    // The converter writes the key only when true.
    let norm = matches!(
        m.get("expert_weights_norm"),
        Some(crate::weights::gguf::GgufValue::Bool(true))
    );
    put(c, "norm_topk_prob", json!(norm));
    put(
        c,
        "n_group",
        json!(m.u64_opt("expert_group_count")?.unwrap_or(1).max(1)),
    );
    put(
        c,
        "topk_group",
        json!(m.u64_opt("expert_group_used_count")?.unwrap_or(1).max(1)),
    );
    put(c, "rope_interleave", json!(true));
    Ok(())
}

/// gpt-oss's settings. Even layers use the sliding window (llama.cpp's
/// pattern, as the released configs' `layer_types`); its YaRN does not
/// truncate the correction range (`truncate: false` in every released
/// config, which GGUF does not record; llama.cpp's YaRN truncates).
fn gpt_oss(
    m: &Meta,
    c: &mut Map<String, Value>,
    experts: u64,
    layers: u64,
) -> Result<(), ImportError> {
    put(c, "model_type", json!("gpt_oss"));
    put(c, "num_local_experts", json!(experts));
    put(
        c,
        "intermediate_size",
        json!(m.u64("expert_feed_forward_length", "it sizes the experts")?),
    );
    put(
        c,
        "sliding_window",
        json!(m.u64(
            "attention.sliding_window",
            "gpt-oss's sliding layers need it"
        )?),
    );
    let types: Vec<&str> = (0..layers)
        .map(|l| {
            if l % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    put(c, "layer_types", json!(types));
    put(c, "attention_bias", json!(true));
    if let Some(Value::Object(yarn)) = c.get_mut("rope_scaling") {
        yarn.insert("truncate".into(), json!(false));
    }
    Ok(())
}

fn put(c: &mut Map<String, Value>, key: &str, value: Value) {
    c.insert(key.to_string(), value);
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
            let mut yarn = json!({
                "rope_type": "yarn",
                "factor": factor.unwrap_or(1.0),
                "original_max_position_embeddings": original,
            });
            // The model's own β where the file keeps them (llama.cpp's
            // deepseek2 graph ignores them and uses 32/1).
            for (key, field) in [
                ("beta_fast", "yarn_beta_fast"),
                ("beta_slow", "yarn_beta_slow"),
            ] {
                if let Some(b) = m.f64_opt(&format!("rope.scaling.{field}"))? {
                    yarn[key] = json!(b);
                }
            }
            // DeepSeek's `mscale_all_dim`, written as 0.1 × it. Its `mscale`
            // is not written; the released models set both alike.
            if let Some(mul) = m.f64_opt("rope.scaling.yarn_log_multiplier")? {
                let all = mul / YARN_LOG_MULTIPLIER_SCALE;
                yarn["mscale_all_dim"] = json!(all);
                yarn["mscale"] = json!(all);
            }
            Ok(Some(yarn))
        }
        other => Err(ImportError::Unsupported {
            path: m.file.path.clone(),
            what: format!("RoPE scaling `{other}` is not supported (none, linear and yarn are)"),
        }),
    }
}
