//! gpt-oss: grouped-query attention with biases and learnt attention sinks,
//! alternating sliding-window and full layers (`layer_types`), YaRN rope on
//! rotate-half pairs, a router with a bias whose softmax runs over the top-k
//! logits only, and experts with biases and a clamped SwiGLU.
//!
//! Experts are published two ways: MXFP4 (`gate_up_proj_blocks`/`_scales`,
//! output rows along the reduction) and, as `save_pretrained` writes them,
//! plain floats transposed (`gate_up_proj` `[E, H, 2I]`, `x · W`). Either
//! way gate and up interleave (gate on even rows, up on odd). Longhaul holds
//! an expert as its other families do — gate rows, then up rows, then down
//! rows — so the same kernels, packs and streaming serve it; the biases,
//! a few KiB per expert, stay resident.

use std::sync::Arc;

use super::config::{ConfigError, RawConfig};
use super::layers::attention::{GqaShape, GroupedQueryAttention};
use super::layers::decoder::{Attention, Decoder, DecoderLayer, FeedForward};
use super::layers::experts::{Activation, Expert, ExpertProvider, ExpertSetup};
use super::layers::moe::{ExpertBiases, ExpertExtras, MoeBlock};
use super::layers::rope::{Rope, RopeParams};
use super::layers::router::{Router, Scoring};
use super::layers::{Linear, values};
use super::qwen3_moe::check_heads;
use super::{CommonConfig, ModelError, assemble};
use crate::kernels::{Format, Matrix};
use crate::weights::{TensorSource, Weights, WeightsError, expect_shape, mxfp4, stored_rows};
use super::family::{Family, FamilyConfig, Parsed, grouped_layout};
use super::state::StateLayout;
use crate::synth::{Shape, SynthFamily};

const DEFAULT_ROPE_THETA: f64 = 150_000.0;
const DEFAULT_RMS_EPS: f64 = 1e-5;
const DEFAULT_SWIGLU_ALPHA: f64 = 1.702;
const DEFAULT_SWIGLU_LIMIT: f64 = 7.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub common: CommonConfig,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    /// Each expert's intermediate size.
    pub intermediate_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub sliding_window: Option<usize>,
    /// Per layer: whether it attends through the sliding window.
    pub sliding: Vec<bool>,
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
    pub rope: RopeParams,
}

impl Config {
    pub fn parse(raw: &RawConfig) -> Result<Self, ConfigError> {
        let common = CommonConfig::parse(raw, DEFAULT_RMS_EPS)?;
        let heads = raw.positive("num_attention_heads")?;
        let kv_heads = raw.usize_any(&["num_key_value_heads"])?.unwrap_or(heads);
        check_heads(raw, heads, kv_heads)?;
        let num_experts = raw.positive_any(&["num_local_experts", "num_experts"])?;
        let top_k = raw.positive("num_experts_per_tok")?;
        if top_k > num_experts {
            return Err(raw.invalid(
                "num_experts_per_tok",
                format!("{top_k} exceeds num_local_experts {num_experts}"),
            ));
        }
        // As gpt-oss's config fills `layer_types` in: even layers slide.
        let sliding = raw.sliding_layers(common.num_layers, |i| i % 2 == 0)?;
        let sliding_window = raw.usize_any(&["sliding_window"])?;
        if sliding.iter().any(|&s| s) && sliding_window.is_none() {
            return Err(raw.missing("sliding_window"));
        }
        Ok(Self {
            heads,
            kv_heads,
            head_dim: raw
                .usize_any(&["head_dim"])?
                .unwrap_or(common.hidden_size / heads),
            attention_bias: raw.bool_or("attention_bias", true)?,
            intermediate_size: raw.positive("intermediate_size")?,
            num_experts,
            top_k,
            sliding_window,
            sliding,
            swiglu_alpha: raw.f64_or("swiglu_alpha", DEFAULT_SWIGLU_ALPHA)? as f32,
            swiglu_limit: raw.f64_or("swiglu_limit", DEFAULT_SWIGLU_LIMIT)? as f32,
            rope: raw.rope(DEFAULT_ROPE_THETA)?,
            common,
        })
    }
}

pub fn build(
    c: &Config,
    w: &Weights,
    experts: Option<Arc<dyn ExpertProvider>>,
) -> Result<Decoder, ModelError> {
    let h = c.common.hidden_size;
    let eps = c.common.rms_norm_eps;
    let rope = Rope::new(&c.rope, c.head_dim, false);
    let mut experts = ExpertSetup::new(experts);
    let mut layers = Vec::with_capacity(c.common.num_layers);
    for i in 0..c.common.num_layers {
        let lw = w.pp(format_args!("model.layers.{i}"));
        let shape = GqaShape {
            hidden: h,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            bias: c.attention_bias,
            o_bias: c.attention_bias,
            qk_norm_eps: None,
            qk_norm_full_width: false,
            window: c.sliding_window.filter(|_| c.sliding[i]),
            sinks: true,
            output_gate: false,
            centred_norms: false,
            qk_norm_after_rope: false,
        };
        let attention = GroupedQueryAttention::load(&lw.pp("self_attn"), shape, &rope)?;
        let mw = lw.pp("mlp");
        let ew = mw.pp("experts");
        if let ExpertSetup::Resident(resident) = &mut experts {
            let records = layer_records(&ew, c.num_experts, h, c.intermediate_size)?;
            let loaded = records
                .iter()
                .map(|(format, bytes)| expert(bytes, *format, h, c.intermediate_size).map(Arc::new))
                .collect::<Result<Vec<_>, _>>()?;
            resident.insert_layer(i, loaded);
        }
        let router = Linear::load(&mw, "router", h, c.num_experts, true)?;
        let moe = MoeBlock {
            layer: i,
            router: Router::new(router, c.num_experts, c.top_k, Scoring::TopKSoftmax),
            shared: None,
            shared_gate: None,
            extras: ExpertExtras {
                activation: Activation::ClampedSwiglu {
                    alpha: c.swiglu_alpha,
                    limit: c.swiglu_limit,
                },
                biases: Some(Box::new(biases(
                    &ew,
                    c.num_experts,
                    h,
                    c.intermediate_size,
                )?)),
            },
        };
        layers.push(DecoderLayer::load(
            &lw,
            h,
            eps,
            Attention::Grouped(attention),
            FeedForward::Sparse(moe),
        )?);
    }
    assemble(&c.common, w, layers, rope, experts)
}

/// One expert from its record (gate rows, up rows, down rows).
fn expert(
    record: &[u8],
    format: Format,
    hidden: usize,
    inter: usize,
) -> Result<Expert, ModelError> {
    let split = 2 * inter * format.row_bytes(hidden).unwrap_or(0);
    let gate_up = Matrix::from_bytes(
        2 * inter,
        hidden,
        format,
        &record[..split.min(record.len())],
    )?;
    let down = Matrix::from_bytes(hidden, inter, format, &record[split.min(record.len())..])?;
    Expert::new(gate_up, down)
}

/// The experts' biases with gate and up de-interleaved as their rows are.
fn biases(
    ew: &Weights,
    count: usize,
    hidden: usize,
    inter: usize,
) -> Result<ExpertBiases, ModelError> {
    if !ew.has("gate_up_proj_bias") && ew.has("0.gate_proj.bias") {
        // Per expert, gate and up apart, as a GGUF stores them.
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for e in 0..count {
            let ee = ew.pp(e);
            gate_up.extend(values(&ee.get("gate_proj.bias", &[inter])?)?);
            gate_up.extend(values(&ee.get("up_proj.bias", &[inter])?)?);
            down.extend(values(&ee.get("down_proj.bias", &[hidden])?)?);
        }
        return Ok(ExpertBiases { gate_up, down });
    }
    let gate_up = values(&ew.get("gate_up_proj_bias", &[count, 2 * inter])?)?;
    let down = values(&ew.get("down_proj_bias", &[count, hidden])?)?;
    let gate_up = gate_up
        .chunks_exact(2 * inter)
        .flat_map(|b| {
            b.iter()
                .step_by(2)
                .chain(b.iter().skip(1).step_by(2))
                .copied()
        })
        .collect();
    Ok(ExpertBiases { gate_up, down })
}

/// Every expert of one layer (`ew`: its `mlp.experts`) as a record at its
/// stored width: gate rows, up rows (de-interleaved), then down rows. Each
/// stacked tensor is read once; packs write exactly these bytes.
pub fn layer_records(
    ew: &Weights,
    count: usize,
    hidden: usize,
    inter: usize,
) -> Result<Vec<(Format, Vec<u8>)>, ModelError> {
    let source = ew.source();
    if ew.has("0.gate_proj.weight") {
        return per_expert_records(ew, count, hidden, inter);
    }
    let (gate_up, down) = (ew.full_name("gate_up_proj"), ew.full_name("down_proj"));
    if mxfp4::is_blocked(source, &gate_up) {
        let gu = mxfp4::load(source, &gate_up, &[count, 2 * inter, hidden])?;
        let d = mxfp4::load(source, &down, &[count, hidden, inter])?;
        return Ok(stack_records(&gu, &d, Format::Mxfp4, count, hidden, inter));
    }
    // Plain floats, stored `x · W`: transposed to rows of outputs.
    let gu = transposed(source, &gate_up, &[count, hidden, 2 * inter])?;
    let d = transposed(source, &down, &[count, inter, hidden])?;
    let format = gu.0;
    Ok(stack_records(&gu.1, &d.1, format, count, hidden, inter))
}

/// Records from experts stored one by one, gate and up apart (a GGUF's
/// layout: llama.cpp's converter de-interleaves and transposes them).
fn per_expert_records(
    ew: &Weights,
    count: usize,
    hidden: usize,
    inter: usize,
) -> Result<Vec<(Format, Vec<u8>)>, ModelError> {
    let source = ew.source();
    (0..count)
        .map(|e| {
            let mut record = Vec::new();
            let mut format = None;
            for (part, shape) in [
                ("gate_proj", [inter, hidden]),
                ("up_proj", [inter, hidden]),
                ("down_proj", [hidden, inter]),
            ] {
                let name = ew.full_name(&format!("{e}.{part}.weight"));
                expect_shape(source, &name, &shape)?;
                let (f, bytes) = stored_rows(source, &name, &shape, 1)?;
                if format.is_some_and(|first| first != f) {
                    return Err(WeightsError::InvalidFile {
                        path: source.location(&name),
                        reason: format!(
                            "expert {e} stores `{part}` as {}, its other matrices otherwise; a gpt-oss expert is one format",
                            f.name()
                        ),
                    }
                    .into());
                }
                format = Some(f);
                record.extend(bytes);
            }
            Ok((format.unwrap_or(Format::F32), record))
        })
        .collect()
}

/// The `[E, K, N]` float stack `name`, each matrix transposed to `[N, K]`.
fn transposed(
    source: &dyn TensorSource,
    name: &str,
    shape: &[usize; 3],
) -> Result<(Format, Vec<u8>), ModelError> {
    expect_shape(source, name, shape)?;
    let (format, bytes) = stored_rows(source, name, shape, shape[0])?;
    let size: usize = match format {
        Format::F32 => 4,
        Format::F16 | Format::BF16 => 2,
        _ => {
            return Err(WeightsError::InvalidFile {
                path: source.location(name),
                reason: format!(
                    "gpt-oss experts `{name}` are stored as {}; they are read as floats or as MXFP4 blocks",
                    format.name()
                ),
            }
            .into());
        }
    };
    let [_, k, n] = *shape;
    let mut out = vec![0u8; bytes.len()];
    for (src, dst) in bytes
        .chunks_exact(k * n * size)
        .zip(out.chunks_exact_mut(k * n * size))
    {
        for row in 0..k {
            for col in 0..n {
                let from = (row * n + col) * size;
                let to = (col * k + row) * size;
                dst[to..to + size].copy_from_slice(&src[from..from + size]);
            }
        }
    }
    Ok((format, out))
}

/// Records from stacks of rows: gate/up `[E, 2I, H]` (interleaved) and down
/// `[E, H, I]`, each row already in `format`.
fn stack_records(
    gate_up: &[u8],
    down: &[u8],
    format: Format,
    count: usize,
    hidden: usize,
    inter: usize,
) -> Vec<(Format, Vec<u8>)> {
    let gu_row = format.row_bytes(hidden).unwrap_or(0);
    let d_len = hidden * format.row_bytes(inter).unwrap_or(0);
    (0..count)
        .map(|e| {
            let rows = &gate_up[e * 2 * inter * gu_row..(e + 1) * 2 * inter * gu_row];
            let mut record = Vec::with_capacity(rows.len() + d_len);
            for parity in [0, 1] {
                for r in (parity..2 * inter).step_by(2) {
                    record.extend_from_slice(&rows[r * gu_row..(r + 1) * gu_row]);
                }
            }
            record.extend_from_slice(&down[e * d_len..(e + 1) * d_len]);
            (format, record)
        })
        .collect()
}

/// gpt-oss.
pub struct GptOssFamily;

pub static FAMILY: GptOssFamily = GptOssFamily;

impl Family for GptOssFamily {
    fn synth(&self) -> Option<&'static dyn SynthFamily> {
        Some(SYNTH)
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["gpt_oss"]
    }

    fn parse(&self, raw: &RawConfig, _model_type: &str) -> Result<Parsed, ConfigError> {
        Ok(Parsed::plain(Config::parse(raw)?))
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["gpt-oss"]
    }
}

/// `synth --arch gpt_oss`.
static SYNTH: &Shape = &crate::synth::gpt_oss::SHAPE;

impl FamilyConfig for Config {
    fn common(&self) -> &CommonConfig {
        &self.common
    }

    fn state_layout(&self) -> StateLayout {
        grouped_layout(self.common.num_layers, self.kv_heads, self.head_dim)
    }

    fn build(
        &self,
        w: &Weights,
        experts: Option<Arc<dyn ExpertProvider>>,
    ) -> Result<Decoder, ModelError> {
        build(self, w, experts)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
