//! Synthetic checkpoints of any shape and size, for tests and benchmarks.
//!
//! Weights are drawn uniformly with the standard deviation 1/√fan-in, so
//! activations stay O(1) and the hidden state changes from token to token:
//! routers then pick different experts for different tokens, as trained
//! models do. (Weights drawn at a tiny scale would make every token route to
//! the same few experts, and a cache benchmark would measure nothing.)
//!
//! Expert popularity is skewed on purpose, never by accident: hidden
//! dimension 0 of every embedding is a constant "bias channel", and each
//! router reads it with a weight proportional to log p(e) for a Zipf
//! distribution p, so popular experts win more often.
//!
//! Tensors are generated and written piece by piece, so memory use does not
//! grow with the model's size.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::kernels::math::ln;
use crate::weights::safetensors::{TensorEntry, header_bytes};

pub mod deepseek_v4;
pub mod gpt_oss;
pub mod kimi_linear;
mod shape;

pub use shape::{
    ALL_DTYPES, Add, DEEPSEEK_MOE, FLOAT_DTYPES, MIXTRAL_MOE, Moe, PROJ_MOE, QkNorm, RouterBias,
    Shape, SynthAttention, SynthFamily, experts, grouped, latent_kv,
};

/// Values generated and written per chunk.
const CHUNK_VALUES: usize = 1 << 20;
/// Value of the bias channel (hidden dimension 0) in every embedding.
const BIAS_CHANNEL: f32 = 4.0;
/// Router weight on the bias channel per unit of log-popularity. Calibrated so
/// that `zipf:1` on a 64-expert, top-8 DeepSeek-V3 shape sends 0.40 of lookups
/// to the most used tenth of experts (ideal Zipf(1) sampling of 8 of 64: 0.44).
const POPULARITY_STRENGTH: f32 = 1.8;
/// Consecutive tokens' hashed experts start this many apart.
const TOKEN_EXPERT_STRIDE: usize = 7;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The shape of a synthetic model.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub arch: &'static dyn SynthFamily,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub experts: usize,
    pub top_k: usize,
    pub moe_intermediate: usize,
    pub dense_intermediate: usize,
    /// Zipf exponent of expert popularity; 0 for none.
    pub zipf: f64,
    pub dtype: SynthDtype,
    pub seed: u64,
}

/// How a synthetic checkpoint stores its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthDtype {
    /// BF16, as released models are.
    Bf16,
    F32,
    /// Projections in FP8 with 128×128 block scales, as DeepSeek-V3 ships;
    /// embeddings, norms, routers and the LM head stay BF16.
    Fp8,
    /// Routed experts in INT4 (compressed-tensors pack-quantized, groups of
    /// 32), as Kimi K2-Thinking ships; everything else BF16.
    Int4,
    /// gpt-oss's experts in MXFP4 (E2M1 values, an E8M0 scale per 32), as
    /// released; everything else BF16.
    Mxfp4,
}

impl SynthDtype {
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
            Self::Fp8 => "fp8",
            Self::Int4 => "int4",
            Self::Mxfp4 => "mxfp4",
        }
    }

    pub fn parse(name: &str) -> Result<Self, SynthError> {
        match name.to_ascii_lowercase().as_str() {
            "bf16" => Ok(Self::Bf16),
            "f32" => Ok(Self::F32),
            "fp8" => Ok(Self::Fp8),
            "int4" => Ok(Self::Int4),
            "mxfp4" => Ok(Self::Mxfp4),
            other => Err(SynthError::Invalid(format!(
                "--dtype {other}: expected bf16, f32, fp8, int4 or mxfp4"
            ))),
        }
    }
}

impl SynthSpec {
    /// A DeepSeek-V3-shaped default, small enough for one machine.
    pub fn new(arch: &'static dyn SynthFamily) -> Self {
        Self {
            arch,
            vocab: 4096,
            hidden: 1024,
            layers: 8,
            heads: 8,
            kv_heads: 8,
            experts: 64,
            top_k: 8,
            moe_intermediate: 512,
            dense_intermediate: 2048,
            zipf: 0.0,
            dtype: SynthDtype::Bf16,
            seed: 0,
        }
    }

    /// Bytes of one routed expert as stored (without its scales).
    pub fn expert_bytes(&self) -> u64 {
        let weights = 3 * (self.hidden * self.moe_intermediate) as u64;
        match self.dtype {
            SynthDtype::Bf16 => weights * 2,
            SynthDtype::F32 => weights * 4,
            SynthDtype::Fp8 => weights,
            SynthDtype::Int4 | SynthDtype::Mxfp4 => weights / 2,
        }
    }

    /// Sets the layer count so routed experts take about `bytes`.
    pub fn fit_size(&mut self, bytes: u64) {
        let per_layer = self.expert_bytes() * self.experts as u64;
        let sparse_layers = bytes.div_ceil(per_layer.max(1)).max(1) as usize;
        self.layers = sparse_layers + self.dense_prefix();
    }

    fn dense_prefix(&self) -> usize {
        self.arch.dense_prefix()
    }

    fn validate(&self) -> Result<(), SynthError> {
        let bad = |m: &str| Err(SynthError::Invalid(m.to_string()));
        if self.hidden < 8 || !self.hidden.is_multiple_of(self.heads) {
            return bad("--hidden must be at least 8 and divisible by --heads");
        }
        if !self.heads.is_multiple_of(self.kv_heads.max(1)) {
            return bad("--kv-heads must divide --heads");
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return bad("--top-k must be between 1 and --experts");
        }
        if self.layers <= self.dense_prefix() {
            return bad("--layers leaves no MoE layer");
        }
        if self.vocab < 256 {
            return bad("--vocab must be at least 256 (the tokenizer's byte alphabet)");
        }
        self.arch.check(self).map_err(SynthError::Invalid)?;
        let group = crate::kernels::format::INT4_GROUP;
        if matches!(self.dtype, SynthDtype::Int4 | SynthDtype::Mxfp4)
            && !(self.hidden.is_multiple_of(group) && self.moe_intermediate.is_multiple_of(group))
        {
            return bad(
                "int4 and mxfp4 need --hidden and --moe-intermediate divisible by 32 (their blocks)",
            );
        }
        Ok(())
    }
}

/// How a tensor's values are drawn.
#[derive(Debug, Clone)]
pub enum Fill {
    /// Uniform with this standard deviation.
    Uniform(f32),
    /// 1 + uniform noise (norm weights).
    NearOne,
    /// Embedding rows with the bias channel set.
    Embedding,
    /// A router: uniform rows plus the popularity weight on the bias channel.
    Router {
        std: f32,
        popularity: Vec<f32>,
    },
    Zeros,
    /// One value everywhere (FP8 block scales).
    Constant(f32),
    /// These values in order (an INT4 matrix's recorded shape).
    List(Vec<f32>),
    /// A token's distinct experts (DeepSeek-V4's `tid2eid` rows).
    TokenExperts {
        experts: usize,
    },
}

struct TensorPlan {
    name: String,
    shape: Vec<usize>,
    fill: Fill,
}

/// What [`write_synthetic`] made.
#[derive(Debug, Clone)]
pub struct SynthSummary {
    pub parameters: u64,
    pub bytes: u64,
    pub expert_bytes: u64,
    pub layers: usize,
}

/// Writes a checkpoint folder (config, weights, tokenizer) to `out`;
/// `report` gets (done, total) bytes.
pub fn write_synthetic(
    spec: &SynthSpec,
    out: &Path,
    report: &dyn Fn(u64, u64),
) -> Result<SynthSummary, SynthError> {
    spec.validate()?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthError::Io { path, source }
    };
    fs::create_dir_all(out).map_err(io(out))?;
    let plans = storage_plans(spec, plan(spec));
    let sizes: Vec<u64> = plans
        .iter()
        .map(|(p, st)| st.bytes(p.shape.iter().product::<usize>() as u64))
        .collect();
    let shapes: Vec<Vec<usize>> = plans.iter().map(|(p, st)| st.shape(&p.shape)).collect();
    let entries: Vec<TensorEntry> = plans
        .iter()
        .zip(&sizes)
        .zip(&shapes)
        .map(|(((p, st), &len), shape)| TensorEntry {
            name: &p.name,
            dtype: st.name(),
            shape,
            len,
        })
        .collect();
    let parameters: u64 = plans
        .iter()
        .filter(|(p, _)| !matches!(p.fill, Fill::Constant(_) | Fill::List(_)))
        .map(|(p, _)| p.shape.iter().product::<usize>() as u64)
        .sum();
    let total: u64 = sizes.iter().sum();
    let weights = out.join("model.safetensors");
    let mut file = BufWriter::new(File::create(&weights).map_err(io(&weights))?);
    file.write_all(&header_bytes(&entries))
        .map_err(io(&weights))?;
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    let mut done = 0;
    let mut bytes = Vec::with_capacity(CHUNK_VALUES * 4);
    for (p, storage) in &plans {
        let count: usize = p.shape.iter().product();
        let row = *p.shape.last().unwrap_or(&1);
        let mut index = 0;
        while index < count {
            let n = CHUNK_VALUES.min(count - index);
            bytes.clear();
            for k in index..index + n {
                let v = value(&p.fill, &mut rng, k / row.max(1), k % row.max(1));
                storage.push(v, k, &mut bytes);
            }
            file.write_all(&bytes).map_err(io(&weights))?;
            index += n;
            done += bytes.len() as u64;
            report(done, total);
        }
    }
    file.flush().map_err(io(&weights))?;
    let config = out.join("config.json");
    fs::write(
        &config,
        serde_json::to_string_pretty(&config_json(spec)).unwrap_or_default(),
    )
    .map_err(io(&config))?;
    let tokenizer = out.join("tokenizer.json");
    fs::write(&tokenizer, tokenizer_json(spec.vocab).to_string()).map_err(io(&tokenizer))?;
    let template = out.join("chat_template.jinja");
    fs::write(&template, CHAT_TEMPLATE).map_err(io(&template))?;
    let expert_bytes =
        spec.expert_bytes() * spec.experts as u64 * (spec.layers - spec.dense_prefix()) as u64;
    Ok(SynthSummary {
        parameters,
        bytes: total,
        expert_bytes,
        layers: spec.layers,
    })
}

fn value(fill: &Fill, rng: &mut SmallRng, row: usize, col: usize) -> f32 {
    // Uniform(-a, a) has standard deviation a/√3.
    let uniform =
        |rng: &mut SmallRng, std: f32| (rng.random::<f32>() * 2.0 - 1.0) * std * 3f32.sqrt();
    match fill {
        Fill::Uniform(std) => uniform(rng, *std),
        Fill::NearOne => 1.0 + uniform(rng, 0.1),
        Fill::Embedding => {
            if col == 0 {
                BIAS_CHANNEL
            } else {
                uniform(rng, 1.0)
            }
        }
        Fill::Router { std, popularity } => {
            if col == 0 {
                popularity.get(row).copied().unwrap_or(0.0)
            } else {
                uniform(rng, *std)
            }
        }
        Fill::Zeros => 0.0,
        Fill::Constant(v) => *v,
        Fill::List(values) => values.get(col).copied().unwrap_or(0.0),
        Fill::TokenExperts { experts } => {
            ((row * TOKEN_EXPERT_STRIDE + col) % experts.max(&1)) as f32
        }
    }
}

/// How one tensor is written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Storage {
    F32,
    Bf16,
    I32,
    /// FP8 e4m3 values of `v / scale`.
    Fp8 {
        scale: f32,
    },
    U8,
    /// E2M1 codes of `v / scale`, two a byte (low first).
    Mxfp4 {
        scale: f32,
    },
    /// INT4 values of `v / scale`, offset by 8, two a byte (low first):
    /// the little-endian bytes of compressed-tensors' packed words.
    Int4 {
        scale: f32,
    },
}

impl Storage {
    fn name(self) -> &'static str {
        match self {
            Storage::F32 => "F32",
            Storage::Bf16 => "BF16",
            Storage::I32 | Storage::Int4 { .. } => "I32",
            Storage::U8 | Storage::Mxfp4 { .. } => "U8",
            Storage::Fp8 { .. } => "F8_E4M3",
        }
    }

    /// Bytes of `values` values.
    fn bytes(self, values: u64) -> u64 {
        match self {
            Storage::F32 | Storage::I32 => values * 4,
            Storage::Bf16 => values * 2,
            Storage::Fp8 { .. } | Storage::U8 => values,
            Storage::Int4 { .. } | Storage::Mxfp4 { .. } => values / 2,
        }
    }

    /// The stored shape of a tensor of `shape` values.
    fn shape(self, shape: &[usize]) -> Vec<usize> {
        let mut s = shape.to_vec();
        match (self, s.last_mut()) {
            (Storage::Int4 { .. }, Some(last)) => *last /= crate::weights::int4::PER_WORD,
            (Storage::Mxfp4 { .. }, Some(last)) => {
                let block = crate::kernels::format::MXFP4_BLOCK;
                *last /= block;
                s.push(block / 2);
            }
            _ => {}
        }
        s
    }

    /// Appends value number `k` of a tensor.
    fn push(self, v: f32, k: usize, bytes: &mut Vec<u8>) {
        match self {
            Storage::F32 => bytes.extend(v.to_le_bytes()),
            Storage::Bf16 => bytes.extend(half::bf16::from_f32(v).to_le_bytes()),
            Storage::I32 => bytes.extend((v as i32).to_le_bytes()),
            Storage::U8 => bytes.push(v as u8),
            Storage::Mxfp4 { scale } => push_nibble(gpt_oss::e2m1_code(v / scale), k, bytes),
            Storage::Fp8 { scale } => bytes.push(float8::F8E4M3::from_f32(v / scale).to_bits()),
            Storage::Int4 { scale } => {
                let nibble = ((v / scale).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                push_nibble(nibble, k, bytes);
            }
        }
    }
}

/// Appends value `k`'s nibble: even values start a byte, odd ones fill its
/// high half.
fn push_nibble(nibble: u8, k: usize, bytes: &mut Vec<u8>) {
    match bytes.last_mut() {
        Some(last) if k % 2 == 1 => *last |= nibble << 4,
        _ => bytes.push(nibble),
    }
}

/// Largest magnitude FP8 e4m3 holds.
const FP8_MAX: f32 = 448.0;
/// Largest magnitude of a symmetric INT4 weight, in steps of its scale.
const INT4_MAX: f32 = 7.0;

/// Each tensor with how it is stored; with FP8, the projections become
/// FP8 (their uniform values scaled to fill ±448) and gain a constant
/// `_scale_inv` of fixed 128×128 blocks; with INT4, routed experts become
/// packed nibbles (scaled to fill ±7) with constant BF16 group scales.
fn storage_plans(spec: &SynthSpec, plans: Vec<TensorPlan>) -> Vec<(TensorPlan, Storage)> {
    let wide = if spec.dtype == SynthDtype::F32 {
        Storage::F32
    } else {
        Storage::Bf16
    };
    let mut out = Vec::with_capacity(plans.len() * 2);
    for p in plans {
        let projection = p.shape.len() == 2 && p.name.ends_with("_proj.weight");
        let expert = projection && p.name.contains(".experts.");
        match p.fill {
            Fill::Uniform(std) if p.name.ends_with("_blocks") => {
                // The power of two its `_scales` tensor stores.
                let scale = 2f32.powi(gpt_oss::mxfp4_exponent(std) as i32 - 127);
                out.push((p, Storage::Mxfp4 { scale }));
            }
            Fill::Constant(_) if p.name.ends_with("_scales") => out.push((p, Storage::U8)),
            Fill::TokenExperts { .. } => out.push((p, Storage::I32)),
            Fill::Uniform(std) if spec.dtype == SynthDtype::Int4 && expert => {
                // A BF16 scale, so the nibbles and scale are what is stored.
                let scale = half::bf16::from_f32(std * 3f32.sqrt() / INT4_MAX).to_f32();
                let (rows, cols) = (p.shape[0], p.shape[1]);
                let [packed, scales, shape] = crate::weights::int4::parts(&p.name);
                let group = crate::kernels::format::INT4_GROUP;
                let parts = [
                    (
                        TensorPlan {
                            name: scales,
                            shape: vec![rows, cols / group],
                            fill: Fill::Constant(scale),
                        },
                        Storage::Bf16,
                    ),
                    (
                        TensorPlan {
                            name: shape,
                            shape: vec![2],
                            fill: Fill::List(vec![rows as f32, cols as f32]),
                        },
                        Storage::I32,
                    ),
                ];
                out.push((TensorPlan { name: packed, ..p }, Storage::Int4 { scale }));
                out.extend(parts);
            }
            Fill::Uniform(std) if spec.dtype == SynthDtype::Fp8 && projection => {
                // Uniform(-a, a) with a = std·√3 fills the block exactly.
                let scale = std * 3f32.sqrt() / FP8_MAX;
                let scales = TensorPlan {
                    name: format!("{}_scale_inv", p.name),
                    shape: crate::weights::fp8::scale_shape(&p.shape),
                    fill: Fill::Constant(scale),
                };
                out.push((p, Storage::Fp8 { scale }));
                out.push((scales, Storage::F32));
            }
            _ => out.push((p, wide)),
        }
    }
    out
}

/// Router weights on the bias channel: log of a Zipf(s) popularity, centred.
pub fn popularity(experts: usize, zipf: f64) -> Vec<f32> {
    if zipf == 0.0 {
        return vec![0.0; experts];
    }
    let logs: Vec<f64> = (1..=experts).map(|r| -zipf * ln(r as f64)).collect();
    let mean = logs.iter().sum::<f64>() / experts as f64;
    logs.iter()
        .map(|l| ((l - mean) as f32) * POPULARITY_STRENGTH / BIAS_CHANNEL)
        .collect()
}

fn plan(s: &SynthSpec) -> Vec<TensorPlan> {
    let h = s.hidden;
    let std = |fan_in: usize| Fill::Uniform(1.0 / (fan_in as f32).sqrt());
    let mut out = Vec::new();
    let mut t =
        |name: String, shape: Vec<usize>, fill: Fill| out.push(TensorPlan { name, shape, fill });
    t(
        "model.embed_tokens.weight".into(),
        vec![s.vocab, h],
        Fill::Embedding,
    );
    for l in 0..s.layers {
        let p = format!("model.layers.{l}");
        t(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            Fill::NearOne,
        );
        t(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Fill::NearOne,
        );
        s.arch.layer(s, &p, l, &mut t);
    }
    s.arch.head(s, &mut t);
    t("model.norm.weight".into(), vec![h], Fill::NearOne);
    t("lm_head.weight".into(), vec![s.vocab, h], std(h));
    out
}

/// MLA sizes derived from the hidden size, in DeepSeek-V3's proportions.
pub struct MlaDims {
    pub q_lora: usize,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    /// GLM-5's indexer: half the heads, twice the rotary width.
    pub index_heads: usize,
    pub index_dim: usize,
}

impl MlaDims {
    pub fn of(s: &SynthSpec) -> Self {
        let head = (s.hidden / s.heads).max(8);
        Self {
            q_lora: (s.hidden / 4).max(8),
            kv_lora: (s.hidden / 8).max(8),
            nope: head,
            rope: (head / 2).max(2) & !1,
            v: head,
            index_heads: (s.heads / 2).max(1),
            index_dim: head.max(2) & !1,
        }
    }
}

/// Positions each query reads under GLM-5's sparse attention, as released.
pub const SYNTH_INDEX_TOPK: usize = 2048;

fn config_json(s: &SynthSpec) -> Value {
    let common = json!({
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "num_experts_per_tok": s.top_k,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "torch_dtype": if s.dtype == SynthDtype::F32 { "float32" } else { "bfloat16" },
    });
    let specific = s.arch.config(s);
    let mut merged = common;
    let quantization = match s.dtype {
        SynthDtype::Fp8 => Some(
            json!({ "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128] }),
        ),
        SynthDtype::Int4 => Some(json!({
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"],
            "config_groups": { "group_0": {
                "targets": ["Linear"], "input_activations": null, "output_activations": null,
                "weights": { "type": "int", "num_bits": 4, "symmetric": true, "strategy": "group",
                             "group_size": crate::kernels::format::INT4_GROUP, "actorder": null, "dynamic": false },
            }},
        })),
        SynthDtype::Mxfp4 => Some(json!({
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
        })),
        SynthDtype::Bf16 | SynthDtype::F32 => None,
    };
    if let (Some(q), Some(m)) = (quantization, merged.as_object_mut()) {
        m.insert("quantization_config".into(), q);
    }
    extended(merged, specific)
}

/// `base` with `extra`'s fields added (replacing any of the same name).
pub fn extended(mut base: Value, extra: Value) -> Value {
    if let (Some(m), Value::Object(extra)) = (base.as_object_mut(), extra) {
        m.extend(extra);
    }
    base
}

/// The fields DeepSeek-V3 and GLM-5 share: MLA sizes, the MoE, and
/// `(n_group, topk_group)` of its group-limited routing.
pub fn mla_config(s: &SynthSpec, model_type: &str, (n_group, topk_group): (usize, usize)) -> Value {
    let m = MlaDims::of(s);
    json!({
        "model_type": model_type,
        "q_lora_rank": m.q_lora, "kv_lora_rank": m.kv_lora,
        "qk_nope_head_dim": m.nope, "qk_rope_head_dim": m.rope, "v_head_dim": m.v,
        "intermediate_size": s.dense_intermediate, "moe_intermediate_size": s.moe_intermediate,
        "n_routed_experts": s.experts, "n_shared_experts": 1,
        "n_group": n_group, "topk_group": topk_group, "first_k_dense_replace": 1,
        "norm_topk_prob": true, "routed_scaling_factor": 2.5,
    })
}

/// A plain chat template, so conversations can be sent to synthetic models.
const CHAT_TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>\n{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>\n{% endif %}";

/// A byte-level tokenizer: the 256 byte symbols, then placeholder tokens up to `vocab`.
fn tokenizer_json(vocab: usize) -> Value {
    let bytes = byte_alphabet();
    let mut map = serde_json::Map::new();
    for (i, c) in bytes.iter().enumerate() {
        map.insert(c.to_string(), json!(i));
    }
    for i in bytes.len()..vocab {
        map.insert(format!("<t{i}>"), json!(i));
    }
    json!({
        "version": "1.0",
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": map, "merges": []}
    })
}

/// GPT-2's byte-to-character mapping, in byte order.
fn byte_alphabet() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or('?')
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn popularity_follows_zipf_ranks() {
        let p = popularity(8, 1.0);
        assert!(p.windows(2).all(|w| w[0] > w[1]));
        assert!(popularity(4, 0.0).iter().all(|&x| x == 0.0));
    }
}
