//! Grouped-query attention (Qwen3-MoE, Mixtral, gpt-oss) and the scaled-dot-product
//! core shared with multi-head latent attention.

use candle_core::{Device, Tensor};

use super::indexer::Selection;
use super::rope::{Rope, RopeTables};
use super::{Linear, RmsNorm, Stacked, values};
use crate::kernels::math::{log1p, sigmoid};
use crate::kernels::ops::{self, AttentionShape};
use crate::model::{ModelError, state::SequenceState};
use crate::weights::Weights;

/// One sequence's rows in a pass: its cache, its rotary tables, how many
/// rows it has, and (for sparse latent attention) the positions the last
/// indexer of the pass chose for it.
pub struct AttentionPart<'a> {
    pub cache: &'a mut SequenceState,
    pub tables: &'a RopeTables,
    pub rows: usize,
    pub chosen: &'a mut Option<Selection>,
}

/// Rows `span` of `values`, which holds `rows` rows of equal width.
pub(super) fn part_rows(
    values: &[f32],
    rows: usize,
    span: std::ops::Range<usize>,
) -> Result<&[f32], ModelError> {
    let width = values.len() / rows.max(1);
    values
        .get(span.start * width..span.end * width)
        .ok_or(ModelError::Internal(
            "attention parts hold more rows than the pass",
        ))
}

/// Multi-head attention with fewer key/value heads than query heads.
pub struct GroupedQueryAttention {
    /// The query, key and value projections stacked into one product.
    pub qkv_proj: Stacked,
    pub o_proj: Linear,
    /// Per-head RMSNorm on queries and keys before rope (Qwen3).
    pub qk_norm: Option<(RmsNorm, RmsNorm)>,
    /// Whether those norms apply after rope instead (Hunyuan).
    pub qk_norm_after_rope: bool,
    /// Whether the layer skips rope.
    pub no_rope: bool,
    pub chunk: Option<usize>,
    pub temperature: Option<Temperature>,
    /// `g_proj`: one gate per head or per lane of the output.
    pub head_gate: Option<Linear>,
    pub softmax_scale: f32,
    pub own_rope: bool,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope: Rope,
    pub window: Option<usize>,
    /// One learnt logit per query head that takes a share of the softmax
    /// and attends to nothing (gpt-oss).
    pub sinks: Option<Vec<f32>>,
    /// Each head's output is scaled by `sigmoid(gate)`, the gate coming
    /// with the query from `q_proj`.
    pub output_gate: bool,
}

/// Shape of a grouped-query attention layer, as read from a config.
#[derive(Debug, Clone, Copy)]
pub struct GqaShape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Biases on the query, key and value projections.
    pub bias: bool,
    /// A bias on the output projection (GLM-4.5 has q/k/v biases only).
    pub o_bias: bool,
    /// Epsilon of the q/k norms, for architectures that have them.
    pub qk_norm_eps: Option<f64>,
    /// Whether the q/k norms span all heads' lanes at once (MiniMax-M2)
    /// rather than each head's.
    pub qk_norm_full_width: bool,
    pub window: Option<usize>,
    /// Whether the layer has attention sinks (`sinks`, one per head).
    pub sinks: bool,
    /// Whether `q_proj` also gives each head a gate on its output
    /// (`[head][query | gate]`, Qwen3-Next).
    pub output_gate: bool,
    /// Whether the q/k norms scale by `1 + weight` (Qwen3-Next).
    pub centred_norms: bool,
    /// Whether the q/k norms apply after rope rather than before (Hunyuan).
    pub qk_norm_after_rope: bool,
    /// Whether the q/k norms have no weights (Llama 4's L2 norm).
    pub qk_norm_unweighted: bool,
    /// Whether the layer skips rope (Llama 4's NoPE layers).
    pub no_rope: bool,
    /// Queries see only keys of their own chunk of this many positions
    /// (Llama 4's chunked attention).
    pub chunk: Option<usize>,
    /// Queries scaled by their position's temperature (Llama 4's NoPE layers).
    pub temperature: Option<Temperature>,
    /// A sigmoid gate on the output from its own projection (`g_proj`),
    /// this many values a position: one per head or one per lane (Step).
    pub head_gate: Option<usize>,
    /// The softmax scale, when not `1 / sqrt(head_dim)`.
    pub softmax_scale: Option<f64>,
    /// Whether the layer rotates by its own rope tables rather than the
    /// decoder's (layers whose rope differs by type: Step).
    pub own_rope: bool,
}

/// Scales each position's attention output (`width` values: heads times
/// their lanes) by `sigmoid(g_proj(x))`, one gate per head or per lane as
/// `g_proj` is wide (Step, Ling 3).
pub fn gate_output(
    out: &mut [f32],
    width: usize,
    g_proj: &Linear,
    xs: &[f32],
    seq: usize,
) -> Result<(), ModelError> {
    let gates = g_proj.forward_values(xs, seq)?;
    let gate_width = g_proj.weight().rows().max(1);
    let lanes = (width / gate_width).max(1);
    for (row, g) in out
        .chunks_exact_mut(width.max(1))
        .zip(gates.chunks_exact(gate_width))
    {
        for (lane, o) in row.iter_mut().enumerate() {
            *o *= sigmoid(g[lane / lanes]);
        }
    }
    Ok(())
}

/// The attention output of a pass's `seq` rows (`out`, `width` wide), gated
/// by `head_gate` of the layer's input rows `xs` when the layer has one, then
/// through `o_proj`.
pub(super) fn project_output(
    mut out: Vec<f32>,
    width: usize,
    head_gate: Option<&Linear>,
    o_proj: &Linear,
    xs: &[f32],
    seq: usize,
) -> Result<Tensor, ModelError> {
    if let Some(g_proj) = head_gate {
        gate_output(&mut out, width, g_proj, xs, seq)?;
    }
    let y = o_proj.forward_values(&out, seq)?;
    Ok(Tensor::from_vec(
        y,
        (seq, o_proj.weight().rows()),
        &Device::Cpu,
    )?)
}

/// Llama 4's attention temperature: the query at position `p` is scaled by
/// `log1p(floor((p + 1) / floor_scale)) · attn_scale + 1`, in f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Temperature {
    pub floor_scale: f32,
    pub attn_scale: f32,
}

impl Temperature {
    fn at(&self, position: usize) -> f32 {
        log1p(((position as f32 + 1.0) / self.floor_scale).floor()) * self.attn_scale + 1.0
    }
}

impl GqaShape {
    /// `heads` query heads over `kv_heads` key/value heads of `head_dim`
    /// lanes, with none of the options: no biases, norms, window or gates.
    pub fn new(hidden: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self {
            hidden,
            heads,
            kv_heads,
            head_dim,
            bias: false,
            o_bias: false,
            qk_norm_eps: None,
            qk_norm_full_width: false,
            window: None,
            sinks: false,
            output_gate: false,
            centred_norms: false,
            qk_norm_after_rope: false,
            qk_norm_unweighted: false,
            no_rope: false,
            chunk: None,
            temperature: None,
            head_gate: None,
            softmax_scale: None,
            own_rope: false,
        }
    }
}

impl GroupedQueryAttention {
    /// Loads `{q,k,v,o}_proj` (and `{q,k}_norm`) under `w`.
    pub fn load(w: &Weights, s: GqaShape, rope: &Rope) -> Result<Self, ModelError> {
        let (q_out, kv_out) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let offset = if s.centred_norms { 1.0 } else { 0.0 };
        // A norm's width decides the rows it normalises over (q is laid out
        // `[position][head · lane]`), so loading it full width is all it takes.
        let (q_norm_width, k_norm_width) = if s.qk_norm_full_width {
            (q_out, kv_out)
        } else {
            (s.head_dim, s.head_dim)
        };
        let qk_norm = match s.qk_norm_eps {
            Some(eps) if s.qk_norm_unweighted => Some((
                RmsNorm::unweighted(q_norm_width, eps),
                RmsNorm::unweighted(k_norm_width, eps),
            )),
            Some(eps) => Some((
                RmsNorm::load_offset(w, "q_norm", q_norm_width, eps, offset)?,
                RmsNorm::load_offset(w, "k_norm", k_norm_width, eps, offset)?,
            )),
            None => None,
        };
        let q_rows = if s.output_gate { 2 * q_out } else { q_out };
        let sinks = if s.sinks {
            Some(w.get("sinks", &[s.heads])?.to_vec1::<f32>()?)
        } else {
            None
        };
        Ok(Self {
            qkv_proj: Stacked::new(vec![
                Linear::load(w, "q_proj", s.hidden, q_rows, s.bias)?,
                Linear::load(w, "k_proj", s.hidden, kv_out, s.bias)?,
                Linear::load(w, "v_proj", s.hidden, kv_out, s.bias)?,
            ])?,
            o_proj: Linear::load(w, "o_proj", q_out, s.hidden, s.o_bias)?,
            qk_norm,
            qk_norm_after_rope: s.qk_norm_after_rope,
            no_rope: s.no_rope,
            chunk: s.chunk,
            temperature: s.temperature,
            head_gate: match s.head_gate {
                Some(width) => Some(Linear::load(w, "g_proj", s.hidden, width, false)?),
                None => None,
            },
            softmax_scale: s.softmax_scale.unwrap_or(1.0 / (s.head_dim as f64).sqrt()) as f32,
            own_rope: s.own_rope,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            rope: rope.clone(),
            window: s.window,
            sinks,
            output_gate: s.output_gate,
        })
    }

    /// Attention of every part's rows after what its cache holds, the parts'
    /// rows one after another in `x`. The projections run once over all the
    /// rows (each weight read once for every sequence of a pass, and the
    /// kernels give a row the same bits whatever rows run with it); the
    /// attention itself runs part by part on its own cache.
    pub fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        parts: &mut [AttentionPart<'_>],
    ) -> Result<Tensor, ModelError> {
        let seq = x.dim(0)?;
        let q_out = self.heads * self.head_dim;
        let xs = values(x)?;
        let qkv = self.qkv_proj.forward_values(&xs, seq)?;
        let mut out = Vec::with_capacity(seq * q_out);
        let mut at = 0;
        for part in parts.iter_mut() {
            let rows = part_rows(&qkv, seq, at..at + part.rows)?;
            out.extend(self.attend_part(rows, part.rows, layer, part.cache, part.tables)?);
            at += part.rows;
        }
        project_output(out, q_out, self.head_gate.as_ref(), &self.o_proj, &xs, seq)
    }

    /// One sequence's `seq` projected rows (`qkv`) attended after what
    /// `cache` holds: `[seq, heads × head_dim]`, output gate applied.
    fn attend_part(
        &self,
        qkv: &[f32],
        seq: usize,
        layer: usize,
        cache: &mut SequenceState,
        tables: &RopeTables,
    ) -> Result<Vec<f32>, ModelError> {
        let start = cache.len();
        let hd = self.head_dim;
        let (q_out, kv_out) = (self.heads * hd, self.kv_heads * hd);
        let own_tables;
        let tables = if self.own_rope {
            own_tables = self.rope.tables(start, seq);
            &own_tables
        } else {
            tables
        };
        let q_rows = if self.output_gate { 2 * q_out } else { q_out };
        let (mut q, mut k, mut v) = (
            Vec::with_capacity(seq * q_out),
            Vec::with_capacity(seq * kv_out),
            Vec::with_capacity(seq * kv_out),
        );
        let mut gate = Vec::new();
        for row in qkv.chunks_exact(q_rows + 2 * kv_out) {
            if self.output_gate {
                for head in row[..q_rows].chunks_exact(2 * hd) {
                    q.extend_from_slice(&head[..hd]);
                    gate.extend_from_slice(&head[hd..]);
                }
            } else {
                q.extend_from_slice(&row[..q_out]);
            }
            k.extend_from_slice(&row[q_rows..q_rows + kv_out]);
            v.extend_from_slice(&row[q_rows + kv_out..]);
        }
        let norms = self.qk_norm.as_ref();
        if let Some((qn, kn)) = norms.filter(|_| !self.qk_norm_after_rope) {
            q = qn.forward_values(&q);
            k = kn.forward_values(&k);
        }
        if !self.no_rope {
            self.rope.rotate(&mut q, self.heads, hd, 0, tables)?;
            self.rope.rotate(&mut k, self.kv_heads, hd, 0, tables)?;
        }
        if let Some((qn, kn)) = norms.filter(|_| self.qk_norm_after_rope) {
            q = qn.forward_values(&q);
            k = kn.forward_values(&k);
        }
        if let Some(t) = &self.temperature {
            for (i, row) in q.chunks_exact_mut(q_out).enumerate() {
                let scale = t.at(start + i);
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        let (keys, vals) = cache.append(layer, &k, kv_out, &v, kv_out)?;
        let shape = AttentionShape {
            heads: self.heads,
            kv_heads: self.kv_heads,
            seq,
            total: keys.len() / kv_out.max(1),
            dim: hd,
            value_dim: hd,
            start,
            window: self.window,
            chunk: self.chunk,
        };
        let mut out = ops::attention_with_sinks(
            &q,
            keys,
            vals,
            &shape,
            self.softmax_scale,
            self.sinks.as_deref(),
        );
        for (o, g) in out.iter_mut().zip(&gate) {
            *o *= sigmoid(*g);
        }
        Ok(out)
    }
}
