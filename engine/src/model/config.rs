//! Reading `config.json` into typed specs.
//!
//! Hugging Face configs come in two generations: the released one
//! (`rope_theta` + `rope_scaling`, Qwen's `num_experts`) and the one recent
//! transformers versions write (`rope_parameters`, `num_local_experts`).
//! [`RawConfig`] answers for both, and every missing or malformed field is an
//! error that names the field and the file.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::layers::moe::SigmoidGroupedMoe;
use super::layers::rope::{RopeKind, RopeParams};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {reason}")]
    Json { path: PathBuf, reason: String },
    #[error("{path}: model_type `{found}` is not supported; supported: {}", supported.join(", "))]
    UnknownModelType {
        path: PathBuf,
        found: String,
        supported: Vec<&'static str>,
    },
    #[error("{path}: missing field `{field}`")]
    Missing { path: PathBuf, field: String },
    #[error("{path}: field `{field}`: {reason}")]
    Invalid {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("{path}: `{field}` = {value} is not supported; supported: {supported}")]
    Unsupported {
        path: PathBuf,
        field: String,
        value: String,
        supported: String,
    },
}

/// Largest size or count a config.json may state (layers, widths, heads,
/// experts, vocabulary, context): 2^24, past every published model (the
/// longest context, 10M positions, included) and small enough that nothing
/// sized from one aborts the process before the weights are checked against
/// it (a `hidden_size` of 2^40 once asked for 512 GiB of rotary tables).
pub const MAX_CONFIG_SIZE: usize = 1 << 24;

/// A parsed `config.json` with typed, error-reporting accessors.
pub struct RawConfig {
    path: PathBuf,
    map: Map<String, Value>,
}

impl RawConfig {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text =
            crate::regular::read_text(path, crate::regular::SETTINGS_LIMIT).map_err(|source| {
                ConfigError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::from_value(path, value)
    }

    fn from_value(path: &Path, value: Value) -> Result<Self, ConfigError> {
        match value {
            Value::Object(map) => Ok(Self {
                path: path.to_path_buf(),
                map,
            }),
            _ => Err(ConfigError::Json {
                path: path.to_path_buf(),
                reason: "the top level is not an object".to_string(),
            }),
        }
    }

    /// A nested object (e.g. a multimodal config's `text_config`) as its own config.
    pub fn sub_config(&self, field: &str) -> Result<RawConfig, ConfigError> {
        match self.map.get(field) {
            Some(v @ Value::Object(_)) => Self::from_value(&self.path, v.clone()),
            Some(_) => Err(self.invalid(field, "expected an object")),
            None => Err(self.missing(field)),
        }
    }

    /// This config with `field` set to `value` (a field a family names its
    /// own way).
    pub fn with(&self, field: &str, value: Value) -> Self {
        let mut map = self.map.clone();
        map.insert(field.to_string(), value);
        Self {
            path: self.path.clone(),
            map,
        }
    }

    /// This config without `field` (a field a family reads its own way).
    pub fn without(&self, field: &str) -> Self {
        let mut map = self.map.clone();
        map.remove(field);
        Self {
            path: self.path.clone(),
            map,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn missing(&self, field: &str) -> ConfigError {
        ConfigError::Missing {
            path: self.path.clone(),
            field: field.to_string(),
        }
    }

    pub fn invalid(&self, field: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.clone(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    pub fn unsupported(
        &self,
        field: &str,
        value: impl std::fmt::Display,
        supported: &str,
    ) -> ConfigError {
        ConfigError::Unsupported {
            path: self.path.clone(),
            field: field.to_string(),
            value: value.to_string(),
            supported: supported.to_string(),
        }
    }

    /// The first of `names` that is present and not null.
    fn lookup<'a>(&'a self, names: &[&'a str]) -> Option<(&'a str, &'a Value)> {
        names
            .iter()
            .find_map(|n| self.map.get(*n).filter(|v| !v.is_null()).map(|v| (*n, v)))
    }

    /// Whether the config has field `name` at all, even as `null` (which
    /// some fields' defaults tell apart from absence).
    pub fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub fn str_opt(&self, name: &str) -> Result<Option<&str>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.invalid(name, "expected a string")),
        }
    }

    /// An optional size or count, at most [`MAX_CONFIG_SIZE`].
    pub fn usize_any(&self, names: &[&str]) -> Result<Option<usize>, ConfigError> {
        let Some((n, v)) = self.lookup(names) else {
            return Ok(None);
        };
        let v = v
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| self.invalid(n, "expected a non-negative integer"))?;
        if v > MAX_CONFIG_SIZE {
            return Err(self.invalid(
                n,
                format!("{v} is larger than any model's (at most {MAX_CONFIG_SIZE})"),
            ));
        }
        Ok(Some(v))
    }

    pub fn usize_req(&self, name: &str) -> Result<usize, ConfigError> {
        self.usize_any(&[name])?.ok_or_else(|| self.missing(name))
    }

    /// A required positive integer, under any of its names.
    pub fn positive_any(&self, names: &[&str]) -> Result<usize, ConfigError> {
        let v = self
            .usize_any(names)?
            .ok_or_else(|| self.missing(names[0]))?;
        if v == 0 {
            return Err(self.invalid(names[0], "must be positive"));
        }
        Ok(v)
    }

    pub fn positive(&self, name: &str) -> Result<usize, ConfigError> {
        self.positive_any(&[name])
    }

    pub fn f64_opt(&self, name: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.invalid(name, "expected a number")),
        }
    }

    pub fn f64_or(&self, name: &str, default: f64) -> Result<f64, ConfigError> {
        Ok(self.f64_opt(name)?.unwrap_or(default))
    }

    /// A number that must be finite and above zero (an epsilon, a scaling
    /// factor): `rms_norm_eps: -1` or a YaRN `factor` of 0 once loaded and
    /// answered with garbage.
    pub fn positive_f64_or(&self, name: &str, default: f64) -> Result<f64, ConfigError> {
        self.positive_f64(name, self.f64_or(name, default)?)
    }

    /// `value` of field `name`, if it is finite and above zero.
    pub fn positive_f64(&self, name: &str, value: f64) -> Result<f64, ConfigError> {
        if value.is_finite() && value > 0.0 {
            Ok(value)
        } else {
            Err(self.invalid(name, format!("{value} must be a positive number")))
        }
    }

    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(self.invalid(name, "expected true or false")),
        }
    }

    pub fn usize_list(&self, name: &str) -> Result<Vec<usize>, ConfigError> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().and_then(|v| usize::try_from(v).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.invalid(name, "expected a list of non-negative integers")),
            Some(_) => Err(self.invalid(name, "expected a list")),
        }
    }

    /// Numbers of a per-layer list (`null` entries as `None`), if present.
    pub fn numbers(&self, field: &str) -> Result<Option<Vec<Option<f64>>>, ConfigError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::Null => Ok(None),
                    v => v
                        .as_f64()
                        .map(Some)
                        .ok_or_else(|| self.invalid(field, "expected numbers")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(self.invalid(field, "expected a list")),
        }
    }

    /// A list of strings (`layer_types`), if present.
    pub fn str_list(&self, name: &str) -> Result<Option<Vec<String>>, ConfigError> {
        match self.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| self.invalid(name, "expected a list of strings")),
            Some(_) => Err(self.invalid(name, "expected a list")),
        }
    }

    /// Which layers use linear attention: `layer_types` when given (one
    /// `linear_attention` or `full_attention` per layer), else `default`.
    pub fn linear_layers(
        &self,
        layers: usize,
        default: impl Fn(usize) -> bool,
    ) -> Result<Vec<bool>, ConfigError> {
        self.layer_kinds(layers, "linear_attention", default)
    }

    /// Which layers are sparse: `mlp_layer_types` when given (`sparse` or
    /// `dense` per layer), else those from `first_k_dense_replace` (or
    /// `first_dense` when absent) on.
    pub fn sparse_layers(&self, n: usize, first_dense: usize) -> Result<Vec<bool>, ConfigError> {
        match self.str_list("mlp_layer_types")? {
            Some(types) if types.len() == n => types
                .iter()
                .map(|t| match t.as_str() {
                    "sparse" => Ok(true),
                    "dense" => Ok(false),
                    other => Err(self.unsupported("mlp_layer_types", other, "dense, sparse")),
                })
                .collect(),
            Some(types) => Err(self.invalid(
                "mlp_layer_types",
                format!("{} entries for {n} layers", types.len()),
            )),
            None => {
                let dense = self
                    .usize_any(&["first_k_dense_replace"])?
                    .unwrap_or(first_dense);
                Ok((0..n).map(|i| i >= dense).collect())
            }
        }
    }

    /// Which layers attend through a sliding window: `layer_types` when
    /// given (one `sliding_attention` or `full_attention` per layer), else
    /// `default`.
    pub fn sliding_layers(
        &self,
        layers: usize,
        default: impl Fn(usize) -> bool,
    ) -> Result<Vec<bool>, ConfigError> {
        self.layer_kinds(layers, "sliding_attention", default)
    }

    /// Per layer, whether `layer_types` names it `kind` (rather than
    /// `full_attention`); `default` when the list is absent.
    fn layer_kinds(
        &self,
        layers: usize,
        kind: &str,
        default: impl Fn(usize) -> bool,
    ) -> Result<Vec<bool>, ConfigError> {
        let Some(types) = self.str_list("layer_types")? else {
            return Ok((0..layers).map(default).collect());
        };
        if types.len() != layers {
            return Err(self.invalid(
                "layer_types",
                format!("{} entries for {layers} layers", types.len()),
            ));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(false),
                other if other == kind => Ok(true),
                other => {
                    Err(self.unsupported("layer_types", other, &format!("{kind}, full_attention")))
                }
            })
            .collect()
    }

    /// Checks that the activation is SiLU, the only one these families use.
    pub fn require_silu(&self) -> Result<(), ConfigError> {
        for field in ["hidden_act", "hidden_activation"] {
            if let Some(act) = self.str_opt(field)?
                && act != "silu"
                && act != "swish"
            {
                return Err(self.unsupported(field, act, "silu"));
            }
        }
        Ok(())
    }

    /// Reads the rotary-embedding settings in either config generation.
    /// Whether the config names `partial_rotary_factor`, at the top or in
    /// its rope settings (families whose default is not 1 need to know).
    pub fn gives_rotary_factor(&self) -> bool {
        let named = |v: Option<&Value>| v.is_some_and(|v| !v.is_null());
        named(self.get("partial_rotary_factor"))
            || ["rope_parameters", "rope_scaling"]
                .iter()
                .any(|k| named(self.get(k).and_then(|p| p.get("partial_rotary_factor"))))
    }

    pub fn rope(&self, default_theta: f64) -> Result<RopeParams, ConfigError> {
        let (field, params) = match self.lookup(&["rope_parameters", "rope_scaling"]) {
            None => ("rope_parameters", Map::new()),
            Some((field, Value::Object(m))) => (field, m.clone()),
            Some((field, _)) => return Err(self.invalid(field, "expected an object")),
        };
        let nested = params.values().any(Value::is_object);
        if nested {
            return Err(self.unsupported(
                field,
                "per-layer-type rope parameters",
                "one rope setting for all layers",
            ));
        }
        self.rope_from(field, params, default_theta)
    }

    /// The rope setting nested at `path` (`["rope_parameters", "compress"]`).
    pub fn rope_at(&self, path: &[&str], default_theta: f64) -> Result<RopeParams, ConfigError> {
        let field = path.join(".");
        let mut at = self.get(path.first().copied().unwrap_or_default());
        for key in path.iter().skip(1) {
            at = at.and_then(|v| v.get(key));
        }
        match at {
            Some(Value::Object(m)) => self.rope_from(&field, m.clone(), default_theta),
            Some(_) => Err(self.invalid(&field, "expected an object")),
            None => Err(self.missing(&field)),
        }
    }

    /// The rope setting `params` describes (a `rope_parameters` object),
    /// reported as `field`; what it leaves out is read from the config.
    pub fn rope_from(
        &self,
        field: &str,
        params: Map<String, Value>,
        default_theta: f64,
    ) -> Result<RopeParams, ConfigError> {
        let sub = RawConfig {
            path: self.path.clone(),
            map: params,
        };
        let theta = match sub.f64_opt("rope_theta")? {
            Some(t) => t,
            None => self.f64_or("rope_theta", default_theta)?,
        };
        if !(theta.is_finite() && theta > 0.0) {
            return Err(self.invalid("rope_theta", "must be a positive number"));
        }
        let partial_rotary_factor = match sub.f64_opt("partial_rotary_factor")? {
            Some(f) => f,
            None => self.f64_or("partial_rotary_factor", 1.0)?,
        };
        // A share of each head's dimensions: it sizes the rotation tables.
        if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
            return Err(self.invalid(
                "partial_rotary_factor",
                format!("{partial_rotary_factor} must lie in (0, 1]"),
            ));
        }
        let rope_type = match sub.str_opt("rope_type")? {
            Some(t) => t.to_string(),
            None => sub.str_opt("type")?.unwrap_or("default").to_string(),
        };
        let max_pos = self.usize_any(&["max_position_embeddings"])?;
        let kind = match rope_type.as_str() {
            "default" => RopeKind::Default,
            "linear" => RopeKind::Linear {
                factor: sub.positive_f64(
                    &format!("{field}.factor"),
                    sub.f64_opt("factor")?
                        .ok_or_else(|| sub.missing(&format!("{field}.factor")))?,
                )?,
            },
            // transformers reads an `alpha` only for Hunyuan, whose releases
            // label their fixed stretch "dynamic"; dynamic NTK proper
            // depends on the sequence length and is not supported.
            "dynamic" if sub.f64_opt("alpha")?.is_some_and(|a| a != 0.0) => RopeKind::NtkAlpha {
                alpha: sub.positive_f64(
                    &format!("{field}.alpha"),
                    sub.f64_opt("alpha")?.unwrap_or_default(),
                )?,
            },
            "llama3" => {
                let number = |name: &str| -> Result<f64, ConfigError> {
                    let full = format!("{field}.{name}");
                    let v = sub.f64_opt(name)?.ok_or_else(|| sub.missing(&full))?;
                    sub.positive_f64(&full, v)
                };
                let original = sub
                    .usize_any(&["original_max_position_embeddings"])?
                    .or(max_pos)
                    .ok_or_else(|| {
                        sub.missing(&format!("{field}.original_max_position_embeddings"))
                    })?;
                RopeKind::Llama3 {
                    factor: number("factor")?,
                    low_freq_factor: number("low_freq_factor")?,
                    high_freq_factor: number("high_freq_factor")?,
                    original_max_position_embeddings: original,
                }
            }
            "yarn" => {
                let original = match sub.usize_any(&["original_max_position_embeddings"])? {
                    Some(o) => o,
                    None => self
                        .usize_any(&["original_max_position_embeddings"])?
                        .or(max_pos)
                        .ok_or_else(|| self.missing("max_position_embeddings"))?,
                };
                let factor = match sub.f64_opt("factor")? {
                    Some(f) => f,
                    None => {
                        let max_pos =
                            max_pos.ok_or_else(|| self.missing("max_position_embeddings"))?;
                        max_pos as f64 / original as f64
                    }
                };
                let finite = |name: &str| -> Result<Option<f64>, ConfigError> {
                    match sub.f64_opt(name)? {
                        Some(v) if !v.is_finite() => {
                            Err(sub.invalid(&format!("{field}.{name}"), "must be finite"))
                        }
                        v => Ok(v),
                    }
                };
                RopeKind::Yarn {
                    factor: sub.positive_f64(&format!("{field}.factor"), factor)?,
                    attention_factor: finite("attention_factor")?,
                    mscale: finite("mscale")?,
                    mscale_all_dim: finite("mscale_all_dim")?,
                    beta_fast: truthy_or(finite("beta_fast")?, 32.0),
                    beta_slow: truthy_or(finite("beta_slow")?, 1.0),
                    original_max_position_embeddings: original,
                    truncate: sub.bool_or("truncate", true)?,
                }
            }
            other => {
                return Err(self.unsupported(
                    &format!("{field}.rope_type"),
                    other,
                    "default, linear, yarn, llama3, dynamic with an alpha",
                ));
            }
        };
        Ok(RopeParams {
            theta,
            partial_rotary_factor,
            kind,
        })
    }
}

/// Python's `x or default` for an optional number: zero counts as absent.
fn truthy_or(value: Option<f64>, default: f64) -> f64 {
    match value {
        Some(v) if v != 0.0 => v,
        _ => default,
    }
}

/// Checks that the key-value heads divide the query heads.
pub fn check_heads(raw: &RawConfig, heads: usize, kv_heads: usize) -> Result<(), ConfigError> {
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(raw.invalid(
            "num_key_value_heads",
            format!("{kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    Ok(())
}

/// Checks that the rotated lanes are an even count within the head.
pub fn check_rotary(
    raw: &RawConfig,
    head_dim: usize,
    rope: &RopeParams,
) -> Result<(), ConfigError> {
    let rotated = (head_dim as f64 * rope.partial_rotary_factor) as usize;
    if rotated == 0 || rotated > head_dim || !rotated.is_multiple_of(2) {
        return Err(raw.invalid(
            "partial_rotary_factor",
            format!("rotates {rotated} of {head_dim} lanes: must be even, 2 to head_dim"),
        ));
    }
    Ok(())
}

/// Defaults of the DeepSeek-V3-style routing fields, per family.
pub struct MoeDefaults {
    /// `n_shared_experts` when the config is silent (`None`: required).
    pub shared: Option<usize>,
    pub renormalize: bool,
    pub scaling: f64,
}

/// The routed experts' settings: sigmoid scores, group-limited top-k
/// (a `null` group count is one group), renormalised and scaled. Each
/// field is read under the names the DeepSeek-V3-style families give it
/// (Ling's `num_experts`, `num_expert_group`, `moe_renormalize`…).
pub fn parse_moe(raw: &RawConfig, d: &MoeDefaults) -> Result<SigmoidGroupedMoe, ConfigError> {
    let experts = raw.positive_any(&["n_routed_experts", "num_local_experts", "num_experts"])?;
    let top_k = raw.positive_any(&["num_experts_per_tok", "num_experts_per_token"])?;
    let n_group = raw
        .usize_any(&["n_group", "num_expert_group"])?
        .unwrap_or(1);
    let topk_group = raw.usize_any(&["topk_group"])?.unwrap_or(1);
    if n_group == 0 || !experts.is_multiple_of(n_group) {
        return Err(raw.invalid(
            "n_group",
            format!("{n_group} does not divide n_routed_experts {experts}"),
        ));
    }
    if topk_group == 0 || topk_group > n_group || top_k > experts / n_group * topk_group {
        return Err(raw.invalid(
            "topk_group",
            format!("{topk_group} of {n_group} groups cannot hold num_experts_per_tok {top_k}"),
        ));
    }
    let shared = match (
        raw.usize_any(&["n_shared_experts", "num_shared_experts"])?,
        d.shared,
    ) {
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => return Err(raw.missing("n_shared_experts")),
    };
    Ok(SigmoidGroupedMoe {
        experts,
        top_k,
        n_group,
        topk_group,
        renormalize: match raw.get("moe_renormalize") {
            Some(_) => raw.bool_or("moe_renormalize", d.renormalize)?,
            None => raw.bool_or("norm_topk_prob", d.renormalize)?,
        },
        scaling: raw.f64_or("routed_scaling_factor", d.scaling)?,
        intermediate: raw.positive("moe_intermediate_size")?,
        shared,
    })
}
