//! `quantization_config`: which published weight formats a checkpoint uses.
//!
//! The frontier checkpoints Longhaul exists for are not published in BF16:
//! DeepSeek-V3/R1 and Kimi K2 ship FP8 (e4m3) with 128×128 block scales;
//! Kimi K2-Thinking and K2.5 ship INT4 experts through compressed-tensors
//! (`pack-quantized`, symmetric, groups of 32); gpt-oss ships MXFP4 experts;
//! GLM-4.5's FP8 releases and llm-compressor's FP8 checkpoints ship
//! compressed-tensors `float-quantized` e4m3 weights with a `weight_scale`
//! per output channel, per tensor or per 128×128 block.
//! A method or layout Longhaul does not read is refused here, before a
//! byte is loaded, naming what was found and what is supported — never
//! loaded as if its packed integers were floats.

use serde_json::Value;

use super::config::{ConfigError, RawConfig};

/// The published FP8 scale block: 128 rows × 128 columns.
pub const FP8_WEIGHT_BLOCK: [u64; 2] = [128, 128];
/// INT4 group size Longhaul reads (Kimi's releases).
pub const INT4_GROUP_SIZE: u64 = 32;
/// What this Longhaul reads, for messages.
/// `fmt` values naming FP8 e4m3.
const FP8_FORMATS: [&str; 2] = ["e4m3", "float8_e4m3fn"];
/// `expert_dtype` values beside FP8: the experts' own format (FP4 is
/// DeepSeek-V4's, E2M1 with E8M0 scales per 32).
const EXPERT_DTYPES: [&str; 2] = ["fp8", "fp4"];
const SUPPORTED: &str = "fp8 (fmt e4m3, weight_block_size [128, 128], scale_fmt ue8m0, expert_dtype fp8 or fp4), or compressed-tensors \
     (format pack-quantized: weights int 4-bit symmetric in groups of 32, no activation quantisation; \
     or format float-quantized: weights float 8-bit symmetric per channel, tensor or 128x128 block, \
     activations unquantised or float 8-bit, computed in f32), or mxfp4 (gpt-oss's `_blocks`/`_scales` experts)";
/// compressed-tensors FP8 weight strategies and the scale each stores.
const FP8_STRATEGIES: [&str; 3] = ["channel", "tensor", "block"];

/// A checkpoint's weight quantisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// `F8_E4M3` weights, each with a `weight_scale_inv` of 128×128 blocks.
    Fp8Blocks,
    /// compressed-tensors `pack-quantized` INT4 weights (`weight_packed`,
    /// `weight_scale`, `weight_shape`) in groups of 32; modules it `ignore`s
    /// stay plain floats.
    Int4Groups,
    /// gpt-oss's MXFP4 experts (`*_blocks`, `*_scales`); the modules it
    /// does not convert stay plain floats.
    Mxfp4,
    /// compressed-tensors `float-quantized` `F8_E4M3` weights, each with a
    /// `weight_scale` per output channel (`[rows, 1]`), per tensor, or per
    /// 128×128 block; `w = fp8 × weight_scale`. Activations stay f32 where
    /// a GPU kernel would quantise them (the `input_scale`s go unread).
    Fp8Scaled,
}

/// Reads `quantization_config` (absent: plain float weights).
pub fn parse(raw: &RawConfig) -> Result<Option<Quantization>, ConfigError> {
    let Some(q) = raw.get("quantization_config") else {
        return Ok(None);
    };
    let field = "quantization_config";
    let unsupported = |what: &str, value: String| ConfigError::Unsupported {
        path: raw.path().to_path_buf(),
        field: format!("{field}.{what}"),
        value,
        supported: SUPPORTED.to_string(),
    };
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .ok_or_else(|| raw.invalid(field, "no `quant_method`"))?;
    match method {
        "fp8" => {}
        "compressed-tensors" => return parse_compressed_tensors(q, &unsupported),
        "mxfp4" => return Ok(Some(Quantization::Mxfp4)),
        _ => return Err(unsupported("quant_method", method.to_string())),
    }
    // MiniMax-M2 spells the same format as torch names its dtype.
    if let Some(fmt) = q.get("fmt").and_then(Value::as_str)
        && !FP8_FORMATS.contains(&fmt)
    {
        return Err(unsupported("fmt", fmt.to_string()));
    }
    match q.get("weight_block_size") {
        Some(Value::Array(b)) if b.iter().map(Value::as_u64).eq(FP8_WEIGHT_BLOCK.map(Some)) => {}
        other => {
            return Err(unsupported(
                "weight_block_size",
                other.map_or("(absent: per-tensor scales)".to_string(), Value::to_string),
            ));
        }
    }
    if let Some(a) = q.get("activation_scheme").and_then(Value::as_str)
        && a != "dynamic"
    {
        return Err(unsupported("activation_scheme", a.to_string()));
    }
    // Power-of-two scales (DeepSeek-V3.1, V4), stored as floats or as E8M0.
    if let Some(f) = q.get("scale_fmt").and_then(Value::as_str)
        && f != "ue8m0"
    {
        return Err(unsupported("scale_fmt", f.to_string()));
    }
    // DeepSeek-V4 keeps its routed experts in FP4 (beside the config's FP8).
    let expert_dtype = q.get("expert_dtype").or(raw.get("expert_dtype"));
    if let Some(d) = expert_dtype.and_then(Value::as_str)
        && !EXPERT_DTYPES.contains(&d)
    {
        return Err(unsupported("expert_dtype", d.to_string()));
    }
    Ok(Some(Quantization::Fp8Blocks))
}

/// A compressed-tensors config: every group is `pack-quantized` INT4
/// weights (symmetric, groups of 32, activations left in float) or
/// `float-quantized` FP8 weights (symmetric, per channel, tensor or 128×128
/// block; activations unquantised or FP8, which Longhaul leaves in f32).
fn parse_compressed_tensors(
    q: &Value,
    unsupported: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Option<Quantization>, ConfigError> {
    let top_format = q.get("format").and_then(Value::as_str);
    let groups = match q.get("config_groups") {
        Some(Value::Object(g)) if !g.is_empty() => g,
        other => {
            return Err(unsupported(
                "config_groups",
                other.map_or("(absent)".to_string(), Value::to_string),
            ));
        }
    };
    let mut found = Quantization::Fp8Scaled;
    for (name, group) in groups {
        let at = |what: &str| format!("config_groups.{name}.{what}");
        let format = group.get("format").and_then(Value::as_str).or(top_format);
        match format {
            Some("pack-quantized") => {
                int4_group(group, &at, unsupported)?;
                found = Quantization::Int4Groups;
            }
            Some("float-quantized") => fp8_group(group, &at, unsupported)?,
            other => {
                return Err(unsupported(
                    &at("format"),
                    other.unwrap_or("(absent)").to_string(),
                ));
            }
        }
    }
    Ok(Some(found))
}

/// Checks that `w` (a group's `weights`) has each of `expect`.
fn expect_fields(
    w: &Value,
    expect: &[(&str, Value)],
    at: &dyn Fn(&str) -> String,
    unsupported: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    for (field, want) in expect {
        let found = w.get(*field).unwrap_or(&Value::Null);
        if found != want {
            return Err(unsupported(
                &at(&format!("weights.{field}")),
                found.to_string(),
            ));
        }
    }
    for field in ["actorder", "dynamic"] {
        if let Some(v) = w
            .get(field)
            .filter(|v| !v.is_null() && **v != Value::Bool(false))
        {
            return Err(unsupported(&at(&format!("weights.{field}")), v.to_string()));
        }
    }
    Ok(())
}

fn int4_group(
    group: &Value,
    at: &dyn Fn(&str) -> String,
    unsupported: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    for side in ["input_activations", "output_activations"] {
        if let Some(v) = group.get(side).filter(|v| !v.is_null()) {
            return Err(unsupported(&at(side), v.to_string()));
        }
    }
    let expect = [
        ("type", "int".into()),
        ("num_bits", 4.into()),
        ("symmetric", true.into()),
        ("strategy", "group".into()),
        ("group_size", INT4_GROUP_SIZE.into()),
    ];
    expect_fields(
        group.get("weights").unwrap_or(&Value::Null),
        &expect,
        at,
        unsupported,
    )
}

fn fp8_group(
    group: &Value,
    at: &dyn Fn(&str) -> String,
    unsupported: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    if let Some(v) = group.get("output_activations").filter(|v| !v.is_null()) {
        return Err(unsupported(&at("output_activations"), v.to_string()));
    }
    // Activations stay f32: a GPU kernel's FP8 activations, dynamic or by a
    // static `input_scale`, are its own rounding, not the weights' values
    // (transformers' dequantised model reads no `input_scale` either).
    if let Some(a) = group.get("input_activations").filter(|v| !v.is_null())
        && (a.get("type").and_then(Value::as_str) != Some("float")
            || a.get("num_bits").and_then(Value::as_u64) != Some(8))
    {
        return Err(unsupported(&at("input_activations"), a.to_string()));
    }
    let w = group.get("weights").unwrap_or(&Value::Null);
    let expect = [
        ("type", "float".into()),
        ("num_bits", 8.into()),
        ("symmetric", true.into()),
    ];
    expect_fields(w, &expect, at, unsupported)?;
    let strategy = w.get("strategy").and_then(Value::as_str);
    match strategy {
        Some("block") => {
            let b = w.get("block_structure").unwrap_or(&Value::Null);
            if !matches!(b, Value::Array(b) if b.iter().map(Value::as_u64).eq(FP8_WEIGHT_BLOCK.map(Some)))
            {
                return Err(unsupported(&at("weights.block_structure"), b.to_string()));
            }
        }
        Some(s) if FP8_STRATEGIES.contains(&s) => {}
        other => {
            return Err(unsupported(
                &at("weights.strategy"),
                other.unwrap_or("(absent)").to_string(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_json(v: Value) -> Result<Option<Quantization>, ConfigError> {
        let raw = RawConfig::parse(std::path::Path::new("config.json"), &v.to_string()).unwrap();
        parse(&raw)
    }

    #[test]
    fn deepseeks_fp8_config_is_read_and_anything_else_is_refused_by_name() {
        let fp8 = json!({ "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128] });
        assert_eq!(parse_json(json!({})).unwrap(), None);
        assert_eq!(
            parse_json(json!({ "quantization_config": fp8 })).unwrap(),
            Some(Quantization::Fp8Blocks)
        );
        // DeepSeek-V4's, with FP4 experts named at the top of the config.
        let v4 = json!({ "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                         "scale_fmt": "ue8m0", "weight_block_size": [128, 128] });
        assert_eq!(
            parse_json(json!({ "quantization_config": v4, "expert_dtype": "fp4" })).unwrap(),
            Some(Quantization::Fp8Blocks)
        );
        let err = parse_json(json!({ "quantization_config": v4, "expert_dtype": "int2" }))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expert_dtype") && err.contains("int2"),
            "{err}"
        );
        for (config, names) in [
            (json!({ "quant_method": "gptq", "bits": 4 }), "gptq"),
            (
                json!({ "quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128] }),
                "e5m2",
            ),
            (
                json!({ "quant_method": "fp8", "weight_block_size": [64, 64] }),
                "[64,64]",
            ),
            (json!({ "quant_method": "fp8" }), "per-tensor"),
            (
                json!({ "quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static" }),
                "static",
            ),
            (
                json!({ "quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "e4m3" }),
                "scale_fmt",
            ),
        ] {
            let err = parse_json(json!({ "quantization_config": config }))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(names) && err.contains("fp8 (fmt e4m3"),
                "{err}"
            );
        }
    }

    /// Kimi K2-Thinking's config, as published.
    fn kimi_int4() -> Value {
        json!({
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"],
            "config_groups": { "group_0": {
                "targets": ["Linear"],
                "input_activations": null,
                "output_activations": null,
                "weights": { "type": "int", "num_bits": 4, "symmetric": true, "strategy": "group",
                             "group_size": 32, "actorder": null, "dynamic": false, "observer": "minmax" }
            }}
        })
    }

    #[test]
    fn gpt_oss_mxfp4_config_is_read() {
        let q = json!({ "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"] });
        assert_eq!(
            parse_json(json!({ "quantization_config": q })).unwrap(),
            Some(Quantization::Mxfp4)
        );
    }

    #[test]
    fn kimis_int4_config_is_read_and_other_schemes_are_refused_by_name() {
        assert_eq!(
            parse_json(json!({ "quantization_config": kimi_int4() })).unwrap(),
            Some(Quantization::Int4Groups)
        );
        let edits: [(&str, Value, &str); 6] = [
            ("/format", "int-quantized".into(), "int-quantized"),
            (
                "/config_groups/group_0/weights/group_size",
                128.into(),
                "group_size",
            ),
            (
                "/config_groups/group_0/weights/num_bits",
                8.into(),
                "num_bits",
            ),
            (
                "/config_groups/group_0/weights/symmetric",
                false.into(),
                "symmetric",
            ),
            (
                "/config_groups/group_0/weights/actorder",
                "group".into(),
                "actorder",
            ),
            (
                "/config_groups/group_0/input_activations",
                json!({ "num_bits": 8, "type": "int" }),
                "input_activations",
            ),
        ];
        for (pointer, value, names) in edits {
            let mut q = kimi_int4();
            *q.pointer_mut(pointer).unwrap() = value;
            let err = parse_json(json!({ "quantization_config": q }))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(names) && err.contains("pack-quantized"),
                "{pointer}: {err}"
            );
        }
    }

    /// An FP8 config as llm-compressor writes it (GLM-4.5's FP8 releases):
    /// per-channel weights, dynamic per-token activations.
    fn fp8_channel() -> Value {
        json!({
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*mlp.gate$"],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": { "type": "float", "num_bits": 8, "symmetric": true, "strategy": "channel",
                                 "dynamic": false, "group_size": null, "observer": "minmax" },
                    "input_activations": { "type": "float", "num_bits": 8, "symmetric": true,
                                           "strategy": "token", "dynamic": true },
                    "output_activations": null
                },
                "group_1": {
                    "format": "float-quantized",
                    "targets": ["re:.*self_attn.*"],
                    "weights": { "type": "float", "num_bits": 8, "symmetric": true, "strategy": "block",
                                 "block_structure": [128, 128] }
                }
            }
        })
    }

    #[test]
    fn compressed_tensors_fp8_is_read_and_other_float_schemes_are_refused_by_name() {
        assert_eq!(
            parse_json(json!({ "quantization_config": fp8_channel() })).unwrap(),
            Some(Quantization::Fp8Scaled)
        );
        let edits: [(&str, Value, &str); 5] = [
            (
                "/config_groups/group_0/weights/strategy",
                "group".into(),
                "strategy",
            ),
            (
                "/config_groups/group_0/weights/num_bits",
                4.into(),
                "num_bits",
            ),
            (
                "/config_groups/group_0/input_activations/type",
                "int".into(),
                "input_activations",
            ),
            (
                "/config_groups/group_1/weights/block_structure",
                json!([64, 64]),
                "block_structure",
            ),
            (
                "/config_groups/group_0/output_activations",
                json!({ "num_bits": 8 }),
                "output_activations",
            ),
        ];
        for (pointer, value, names) in edits {
            let mut q = fp8_channel();
            *q.pointer_mut(pointer).unwrap() = value;
            let err = parse_json(json!({ "quantization_config": q }))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(names) && err.contains("float-quantized"),
                "{pointer}: {err}"
            );
        }
    }
}
