//! `quantization_config`: which published weight formats a checkpoint uses.
//!
//! The frontier checkpoints Longhaul exists for are not published in BF16:
//! DeepSeek-V3/R1 and Kimi K2 ship FP8 (e4m3) with 128×128 block scales.
//! A method or layout Longhaul does not read is refused here, before a
//! byte is loaded, naming what was found and what is supported — never
//! loaded as if its packed integers were floats.

use serde_json::Value;

use super::config::{ConfigError, RawConfig};

/// The published FP8 scale block: 128 rows × 128 columns.
pub const FP8_WEIGHT_BLOCK: [u64; 2] = [128, 128];
/// What this Longhaul reads, for messages.
const SUPPORTED: &str = "fp8 (fmt e4m3, weight_block_size [128, 128])";

/// A checkpoint's weight quantisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// `F8_E4M3` weights, each with a `weight_scale_inv` of 128×128 blocks.
    Fp8Blocks,
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
    if method != "fp8" {
        return Err(unsupported("quant_method", method.to_string()));
    }
    if let Some(fmt) = q.get("fmt").and_then(Value::as_str)
        && fmt != "e4m3"
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
    Ok(Some(Quantization::Fp8Blocks))
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
}
