//! The decoder stack every supported architecture shares: embed, then per
//! layer `x += attn(norm(x)); x += ffn(norm(x))`, then norm and LM head.
//! With hyper-connections (DeepSeek-V4) `x` is several residual streams: each
//! block reads a weighed collapse of them and its output is spread back.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::attention::{AttentionPart, GroupedQueryAttention};
use super::compressed::CompressedAttention;
use super::embedding::Embedding;
use super::experts::ExpertProvider;
use super::hyper::{HyperConnection, HyperHead, Mixing};
use super::indexer::Selection;
use super::linear::LinearAttention;
use super::mla::LatentAttention;
use super::moe::MoeBlock;
use super::rope::{Rope, RopeTables};
use super::{Linear, Mlp, RmsNorm, values};
use crate::model::lockstep::Lockstep;
use crate::model::{ModelError, state::SequenceState};
use crate::weights::Weights;

pub enum Attention {
    Grouped(GroupedQueryAttention),
    Latent(LatentAttention),
    /// Linear attention with a recurrent state (KDA, Gated DeltaNet).
    Linear(Box<LinearAttention>),
    /// A sliding window plus compressed entries (DeepSeek-V4).
    Compressed(Box<CompressedAttention>),
}

pub enum FeedForward {
    Dense(Mlp),
    Sparse(MoeBlock),
    /// LongCat-Flash's first sublayer: a dense MLP, and a MoE block on the
    /// same input whose output is held back (its reads go on meanwhile)
    /// and added after the next sublayer's MLP.
    Shortcut {
        mlp: Mlp,
        moe: Box<MoeBlock>,
    },
    /// LongCat-Flash's second sublayer: its MLP plus the held-back MoE output.
    AddShortcut(Mlp),
}

impl FeedForward {
    /// The MoE block whose experts this feed-forward reads, if any.
    pub fn moe(&self) -> Option<&MoeBlock> {
        match self {
            FeedForward::Sparse(moe) => Some(moe),
            FeedForward::Shortcut { moe, .. } => Some(moe),
            FeedForward::Dense(_) | FeedForward::AddShortcut(_) => None,
        }
    }
}

pub struct DecoderLayer {
    pub input_norm: RmsNorm,
    pub attention: Attention,
    pub post_attention_norm: RmsNorm,
    pub ffn: FeedForward,
    /// Hyper-connections around the attention and the feed-forward block
    /// (DeepSeek-V4); without them the residual stream is one wide.
    pub hyper: Option<Box<[HyperConnection; 2]>>,
}

impl DecoderLayer {
    /// Adds the two norms every layer has (`input_layernorm`,
    /// `post_attention_layernorm` under `w`) to its attention and FFN.
    pub fn load(
        w: &Weights,
        hidden: usize,
        eps: f64,
        attention: Attention,
        ffn: FeedForward,
    ) -> Result<Self, ModelError> {
        Self::load_offset(w, hidden, eps, 0.0, attention, ffn)
    }

    /// As [`DecoderLayer::load`], with norms that scale by `offset + weight`
    /// (zero-centred norms: Qwen3-Next, Step).
    pub fn load_offset(
        w: &Weights,
        hidden: usize,
        eps: f64,
        offset: f32,
        attention: Attention,
        ffn: FeedForward,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            input_norm: RmsNorm::load_offset(w, "input_layernorm", hidden, eps, offset)?,
            attention,
            post_attention_norm: RmsNorm::load_offset(
                w,
                "post_attention_layernorm",
                hidden,
                eps,
                offset,
            )?,
            ffn,
            hyper: None,
        })
    }
}

/// Which positions to compute logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last position (generation).
    Last,
    /// Every position (scoring, `longhaul logits`).
    All,
}

pub struct Decoder {
    pub embed: Embedding,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    pub lm_head: Linear,
    /// Rotary tables are computed once per forward pass and shared by all layers.
    pub rope: Rope,
    pub experts: Arc<dyn ExpertProvider>,
    pub vocab_size: usize,
    /// Slots of sequence state: one per layer, then any a layer keeps
    /// besides its attention cache (a sparse-attention indexer's keys).
    pub state_slots: usize,
    /// With hyper-connections, the residual streams' last collapse.
    pub hyper_head: Option<HyperHead>,
    /// Residual streams per position (`hc_mult`; 1 without hyper-connections).
    pub streams: usize,
    /// Where threads decoding together meet to share their passes.
    pub lockstep: Lockstep,
}

/// The block input a hyper-connection weighs from the streams `x`, or `x`
/// itself without one.
fn collapse(
    hc: Option<&HyperConnection>,
    x: &Tensor,
    seq: usize,
) -> Result<(Tensor, Option<Mixing>), ModelError> {
    let Some(hc) = hc else {
        return Ok((x.clone(), None));
    };
    let (input, mixing) = hc.collapse(&values(x)?, seq)?;
    let hidden = input.len() / seq.max(1);
    Ok((
        Tensor::from_vec(input, (seq, hidden), &Device::Cpu)?,
        Some(mixing),
    ))
}

/// The residual after a block's output `h`: added, or spread over the streams.
fn spread(
    hc: Option<&HyperConnection>,
    mixing: Option<Mixing>,
    x: Tensor,
    h: Tensor,
) -> Result<Tensor, ModelError> {
    match (hc, mixing) {
        (Some(hc), Some(m)) => {
            let dims = x.dims().to_vec();
            let y = hc.spread(&m, &values(&x)?, &values(&h)?);
            Ok(Tensor::from_vec(y, dims, &Device::Cpu)?)
        }
        _ => Ok((x + h)?),
    }
}

impl Decoder {
    /// Guesses which experts layer `layer` will ask for from the residual
    /// stream `x` as it is now (an earlier layer's), through that layer's own
    /// norm and router, and tells the expert provider.
    fn pilot(&self, layer: usize, x: &Tensor, ids: &[u32]) -> Result<(), ModelError> {
        let Some(next) = self.layers.get(layer) else {
            return Ok(());
        };
        let Some(moe) = next.ffn.moe() else {
            return Ok(());
        };
        if !self.experts.wants_hints() {
            return Ok(());
        }
        let (n, _) = x.dims2()?;
        let normed = next.post_attention_norm.forward_values(&values(x)?);
        let experts = moe.predict(&normed, n, ids)?;
        self.experts.prefetch(moe.layer, &experts);
        Ok(())
    }

    /// Layers with linear attention (a fixed-size recurrent state).
    pub fn linear_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l.attention, Attention::Linear(_)))
            .count()
    }

    pub fn new_state(&self) -> SequenceState {
        SequenceState::new(self.state_slots)
    }

    /// Runs `ids` after whatever `cache` holds and returns logits `[n, vocab]`.
    /// On a thread decoding together with others (see [`Lockstep`]), the
    /// pass runs with theirs: the same logits, bitwise.
    pub fn forward(
        &self,
        ids: &[u32],
        cache: &mut SequenceState,
        which: LogitsFor,
    ) -> Result<Tensor, ModelError> {
        if self.lockstep.is_member() {
            return self.lockstep.pass(self, ids, cache, which);
        }
        let mut parts = [Part {
            ids,
            state: cache,
            which,
        }];
        let mut out = self.forward_parts(&mut parts)?;
        out.pop()
            .ok_or(ModelError::Internal("a pass gave no logits"))
    }

    /// Checks that `ids` can be fed: not empty, every id in the vocabulary.
    pub fn check_ids(&self, ids: &[u32]) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        match ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            Some(&bad) => Err(ModelError::TokenOutOfRange {
                id: bad,
                vocab_size: self.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// Runs several sequences' rows in one pass: attention reads each
    /// part's own state (grouped-query and latent attention project all the
    /// rows at once first), everything else runs over all rows at once, so a
    /// MoE layer asks for the union of the parts' experts once. Every kernel
    /// is batch-invariant, so each part's logits are bitwise what a pass of
    /// its own would give.
    pub fn forward_parts(&self, parts: &mut [Part<'_>]) -> Result<Vec<Tensor>, ModelError> {
        crate::kernels::on_compute_threads(|| self.forward_here(parts))
    }

    fn forward_here(&self, parts: &mut [Part<'_>]) -> Result<Vec<Tensor>, ModelError> {
        for part in parts.iter() {
            self.check_ids(part.ids)?;
        }
        let ids: Vec<u32> = parts.iter().flat_map(|p| p.ids.iter().copied()).collect();
        let lens: Vec<usize> = parts.iter().map(|p| p.ids.len()).collect();
        let seq = ids.len();
        let tables: Vec<_> = parts
            .iter()
            .map(|p| self.rope.tables(p.state.len(), p.ids.len()))
            .collect();
        let hidden = self.embed.cols();
        let mut rows = vec![0f32; seq * hidden];
        for (&id, row) in ids.iter().zip(rows.chunks_exact_mut(hidden.max(1))) {
            self.embed.row_into(id as usize, row)?;
        }
        let embedded = Tensor::from_vec(rows, (seq, hidden), &Device::Cpu)?;
        self.pilot(0, &embedded, &ids)?;
        // The residual streams, `streams` copies of the embedding per row.
        let mut x = if self.streams > 1 {
            Tensor::cat(&vec![&embedded; self.streams], 1)?
        } else {
            embedded
        };
        let mut chosen: Vec<_> = parts.iter().map(|_| None).collect();
        // A MoE block whose output waits for a later sublayer (LongCat).
        let mut held = None;
        for (index, layer) in self.layers.iter().enumerate() {
            let [attn_hc, ffn_hc] = match &layer.hyper {
                Some(hc) => [Some(&hc[0]), Some(&hc[1])],
                None => [None, None],
            };
            let (input, mixing) = collapse(attn_hc, &x, seq)?;
            let h = layer.input_norm.forward(&input)?;
            let h = match &layer.attention {
                Attention::Grouped(a) => a.forward(
                    &h,
                    index,
                    &mut attention_parts(parts, &tables, &lens, &mut chosen),
                )?,
                Attention::Latent(a) => a.forward(
                    &h,
                    index,
                    &mut attention_parts(parts, &tables, &lens, &mut chosen),
                )?,
                Attention::Linear(a) => {
                    each_part(parts, &h, &lens, |h, _, cache| a.forward(h, index, cache))?
                }
                Attention::Compressed(a) => each_part(parts, &h, &lens, |h, len, cache| {
                    let y = a.forward(&values(h)?, len, index, cache)?;
                    Ok(Tensor::from_vec(y, (len, hidden), &Device::Cpu)?)
                })?,
            };
            x = spread(attn_hc, mixing, x, h)?;
            let (input, mixing) = collapse(ffn_hc, &x, seq)?;
            let h = layer.post_attention_norm.forward(&input)?;
            let h = match &layer.ffn {
                FeedForward::Dense(m) => {
                    self.pilot(index + 1, &input, &ids)?;
                    m.forward(&h)?
                }
                FeedForward::Sparse(m) => {
                    // This layer's reads are queued first, then the guess
                    // for the next one, then the experts are computed.
                    let started = m.start(&h, &ids, self.experts.as_ref())?;
                    self.pilot(index + 1, &input, &ids)?;
                    m.finish(started)?
                }
                FeedForward::Shortcut { mlp, moe } => {
                    // The reads go on through this MLP and the next
                    // sublayer's attention and MLP.
                    let moe: &MoeBlock = moe;
                    held = Some((moe, moe.start(&h, &ids, self.experts.as_ref())?));
                    mlp.forward(&h)?
                }
                FeedForward::AddShortcut(mlp) => {
                    self.pilot(index + 1, &input, &ids)?;
                    let y = mlp.forward(&h)?;
                    let (moe, started) = held.take().ok_or(ModelError::Internal(
                        "a shortcut added before its MoE block ran",
                    ))?;
                    (y + moe.finish(started)?)?
                }
            };
            x = spread(ffn_hc, mixing, x, h)?;
        }
        if let Some(head) = &self.hyper_head {
            x = Tensor::from_vec(
                head.collapse(&values(&x)?, seq)?,
                (seq, hidden),
                &Device::Cpu,
            )?;
        }
        // The rows each part wants logits for, through the head in one product.
        let mut picked = Vec::with_capacity(parts.len());
        let mut at = 0;
        for (part, &len) in parts.iter_mut().zip(&lens) {
            part.state.advance(len);
            picked.push(match part.which {
                LogitsFor::Last => (at + len - 1, 1),
                LogitsFor::All => (at, len),
            });
            at += len;
        }
        let x = match picked.as_slice() {
            [(start, len)] => x.narrow(0, *start, *len)?,
            _ => {
                let rows: Vec<Tensor> = picked
                    .iter()
                    .map(|&(start, len)| x.narrow(0, start, len))
                    .collect::<Result<_, _>>()?;
                Tensor::cat(&rows, 0)?
            }
        };
        let logits = self.lm_head.forward(&self.norm.forward(&x)?)?;
        if picked.len() == 1 {
            return Ok(vec![logits]);
        }
        let mut out = Vec::with_capacity(picked.len());
        let mut at = 0;
        for &(_, len) in &picked {
            out.push(logits.narrow(0, at, len)?);
            at += len;
        }
        Ok(out)
    }
}

/// Attention that runs on each sequence's rows alone (`h` holds the parts'
/// rows one after another), its outputs stacked again.
fn each_part(
    parts: &mut [Part<'_>],
    h: &Tensor,
    lens: &[usize],
    mut attend: impl FnMut(&Tensor, usize, &mut SequenceState) -> Result<Tensor, ModelError>,
) -> Result<Tensor, ModelError> {
    if let [part] = parts {
        return attend(h, h.dim(0)?, part.state);
    }
    let mut outs = Vec::with_capacity(parts.len());
    let mut at = 0;
    for (part, &len) in parts.iter_mut().zip(lens) {
        outs.push(attend(&h.narrow(0, at, len)?, len, part.state)?);
        at += len;
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// The parts of a pass as attention sees them: each sequence's cache,
/// rotary tables, row count and sparse-attention choice.
fn attention_parts<'a>(
    parts: &'a mut [Part<'_>],
    tables: &'a [RopeTables],
    lens: &[usize],
    chosen: &'a mut [Option<Selection>],
) -> Vec<AttentionPart<'a>> {
    parts
        .iter_mut()
        .zip(tables)
        .zip(lens)
        .zip(chosen.iter_mut())
        .map(|(((part, tables), &rows), chosen)| AttentionPart {
            cache: &mut *part.state,
            tables,
            rows,
            chosen,
        })
        .collect()
}

/// One sequence's rows in a pass over several (see [`Decoder::forward_parts`]).
pub struct Part<'a> {
    pub ids: &'a [u32],
    pub state: &'a mut SequenceState,
    pub which: LogitsFor,
}
