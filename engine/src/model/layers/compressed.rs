//! DeepSeek-V4's attention: one key/value head whose keys are its values,
//! read over a sliding window of the last `sliding_window` tokens plus
//! compressed entries that pool every `m` tokens into one.
//!
//! - Heavily compressed layers (HCA, `m` = 128 in V4-Flash) read every
//!   entry: at 8,192 tokens of context that is 128 + 64 keys instead of 8,192.
//! - Compressed sparse layers (CSA, `m` = 4) pool overlapping windows of
//!   `2m` tokens and read only the `index_topk` entries (512) a lightning
//!   indexer picks, ties at the cut going to the lowest entry.
//! - Sliding layers read the window alone.
//!
//! State: the attention slot keeps each position's rotated key/value row.
//! An entry is pooled when its window's last token arrives; the positions
//! of the next window each add `dim / m` of its values to a second slot, so
//! entries cost no more than they hold and every slot only appends (saved
//! state is the rows from a position on). The raw projections a window's
//! pooling reads, and the latest entry while it is being spread, are kept
//! in a fixed ring (the last `m` rows, or `2m` with overlap) — state that
//! cannot be cut back by dropping rows, so a cut returns to the last mark
//! and feeds the tokens after it again, as for linear attention. Together:
//! about 100 KB per token of context at V4-Flash's widths over its 43
//! layers, where a row of everything per position would take 480 KB
//! (DeepSeek-V3's MLA keeps 140 KB).

use std::borrow::Cow;

use super::indexer::{choose, head_weights};
use super::rope::{Rope, RopeTables};
use super::{Linear, RmsNorm, values};
use crate::kernels::math::{exp, powf};
use crate::kernels::ops::{EntryRows, QueryKeys, rms_norm, sink_attention};
use crate::model::{ModelError, state::SequenceState};
use crate::weights::Weights;

/// Sizes of a DeepSeek-V4 attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressedShape {
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Trailing lanes of each head that turn with rope.
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub sliding_window: usize,
    pub eps: f64,
}

/// What a layer reads besides its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Sliding,
    /// Every entry, pooled from `rate` tokens each.
    Heavy {
        rate: usize,
    },
    /// Entries pooled from overlapping windows, as many as the indexer picks.
    Sparse {
        rate: usize,
    },
}

/// The lightning indexer's sizes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexShape {
    pub heads: usize,
    pub head_dim: usize,
    pub top_k: usize,
}

/// Pools the projections of every `rate` tokens into one entry: per channel
/// a softmax over the tokens' gates (plus a learned bias per offset) weighs
/// their values. With `overlap`, a window also reads the previous window's
/// tokens through the first half of the projections.
struct Compressor {
    kv_proj: Linear,
    gate_proj: Linear,
    /// `[rate][projection width]`.
    position_bias: Vec<f32>,
    norm: RmsNorm,
    rate: usize,
    /// Width of one entry.
    dim: usize,
    overlap: bool,
}

impl Compressor {
    fn load(
        w: &Weights,
        hidden: usize,
        dim: usize,
        rate: usize,
        overlap: bool,
        eps: f64,
    ) -> Result<Self, ModelError> {
        let width = if overlap { 2 * dim } else { dim };
        Ok(Self {
            kv_proj: Linear::load(w, "kv_proj", hidden, width, false)?,
            gate_proj: Linear::load(w, "gate_proj", hidden, width, false)?,
            position_bias: values(&w.get("position_bias", &[rate, width])?)?,
            norm: RmsNorm::load(w, "kv_norm", dim, eps)?,
            rate,
            dim,
            overlap,
        })
    }

    /// Values then gates of one position.
    fn raw_width(&self) -> usize {
        if self.overlap {
            4 * self.dim
        } else {
            2 * self.dim
        }
    }

    /// The raw rows of `seq` new positions.
    fn project(&self, xs: &[f32], seq: usize) -> Result<Vec<f32>, ModelError> {
        let kv = self.kv_proj.forward_values(xs, seq)?;
        let gate = self.gate_proj.forward_values(xs, seq)?;
        let width = self.raw_width() / 2;
        let mut out = Vec::with_capacity(seq * 2 * width);
        for (k, g) in kv.chunks_exact(width).zip(gate.chunks_exact(width)) {
            out.extend_from_slice(k);
            out.extend_from_slice(g);
        }
        Ok(out)
    }

    /// Rows of raw projections a window's pooling reads: its own tokens, and
    /// with `overlap` the window's before.
    fn ring_rows(&self) -> usize {
        if self.overlap {
            2 * self.rate
        } else {
            self.rate
        }
    }

    /// Floats of one entry's share of each position's row in the entry
    /// slot: an entry is spread over the `rate` rows of its window, so a
    /// sequence keeps `dim / rate` values a position instead of `dim`.
    fn piece(&self) -> usize {
        self.dim.div_ceil(self.rate)
    }

    /// Floats from one entry to the next in the entry slot.
    fn stride(&self) -> usize {
        self.piece() * self.rate
    }

    /// Floats of this compressor's part of the ring: the open windows' raw
    /// rows, then the latest entry while its window's successor spreads it.
    fn ring_len(&self) -> usize {
        self.ring_rows() * self.raw_width() + self.dim
    }

    /// Position `t`'s share of the entry the window before its own closed
    /// (`latest`): entry `w` is spread over window `w + 1`'s rows.
    fn piece_of(&self, latest: &[f32], t: usize) -> Vec<f32> {
        let mut piece = vec![0f32; self.piece()];
        if t >= self.rate {
            let from = (t % self.rate) * self.piece();
            let part = latest
                .get(from..(from + self.piece()).min(self.dim))
                .unwrap_or(&[]);
            piece[..part.len()].copy_from_slice(part);
        }
        piece
    }

    /// Writes position `t`'s raw row into the ring; when `t` closes a
    /// window, returns that window's entry, rotated to its first position.
    fn push(
        &self,
        ring: &mut [f32],
        t: usize,
        raw: &[f32],
        rope: &Rope,
        rope_offset: usize,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let (m, d, rw) = (self.rate, self.dim, self.raw_width());
        let at = (t % self.ring_rows()) * rw;
        ring[at..at + rw].copy_from_slice(raw);
        if !(t + 1).is_multiple_of(m) {
            return Ok(None);
        }
        let window = (t + 1) / m - 1;
        let mut entry = self.norm.forward_values(&self.pool(ring, window));
        let tables = rope.tables(window * m, 1);
        rope.rotate_pairs(&mut entry, 1, d, rope_offset, &tables, false)?;
        Ok(Some(entry))
    }

    /// The softmax-weighted sum over window `w`'s slots, per channel, from
    /// the raw rows in `ring`.
    fn pool(&self, ring: &[f32], w: usize) -> Vec<f32> {
        let (m, d, rw) = (self.rate, self.dim, self.raw_width());
        let (half, rows) = (rw / 2, self.ring_rows());
        let bias_width = half;
        // (value, gate) of slot `j` for channel `c`.
        let slot = |j: usize, c: usize| -> (f32, f32) {
            let (token, lane, offset) = if !self.overlap {
                (w * m + j, c, j)
            } else if j < m {
                if w == 0 {
                    return (0.0, f32::NEG_INFINITY);
                }
                ((w - 1) * m + j, c, j)
            } else {
                (w * m + j - m, d + c, j - m)
            };
            let at = (token % rows) * rw;
            let row = &ring[at..at + rw];
            let gate = row[half + lane] + self.position_bias[offset * bias_width + lane];
            (row[lane], gate)
        };
        let slots = if self.overlap { 2 * m } else { m };
        (0..d)
            .map(|c| {
                let max = (0..slots)
                    .map(|j| slot(j, c).1)
                    .fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = (0..slots).map(|j| exp(slot(j, c).1 - max)).collect();
                let total: f32 = exps.iter().sum();
                (0..slots).map(|j| exps[j] / total * slot(j, c).0).sum()
            })
            .collect()
    }
}

/// One compressor's work on a pass: the new positions' raw projections and
/// the shares of entries they add to the entry slot.
struct Pending<'c> {
    compressor: &'c Compressor,
    raw: Vec<f32>,
    pieces: Vec<f32>,
}

impl<'c> Pending<'c> {
    fn new(compressor: &'c Compressor, xs: &[f32], seq: usize) -> Result<Self, ModelError> {
        Ok(Self {
            compressor,
            raw: compressor.project(xs, seq)?,
            pieces: Vec::with_capacity(seq * compressor.piece()),
        })
    }

    fn ring_len(&self) -> usize {
        self.compressor.ring_len()
    }

    /// Feeds the new positions from `start` through `ring` (this
    /// compressor's part of it), in order: each adds its share of the latest
    /// entry, then pools the entry its window closes, if it closes one.
    fn run(
        &mut self,
        ring: &mut [f32],
        start: usize,
        rope: &Rope,
        rope_dim: usize,
    ) -> Result<(), ModelError> {
        let c = self.compressor;
        let (rows, latest) = ring.split_at_mut(c.ring_rows() * c.raw_width());
        for (i, raw) in self.raw.chunks_exact(c.raw_width()).enumerate() {
            let t = start + i;
            self.pieces.extend(c.piece_of(latest, t));
            if let Some(entry) = c.push(rows, t, raw, rope, c.dim - rope_dim)? {
                latest.copy_from_slice(&entry);
            }
        }
        Ok(())
    }
}

/// The indexer of a compressed sparse layer: its own compressor over
/// narrower entries, and a multi-head ReLU scorer of them.
struct EntryIndexer {
    compressor: Compressor,
    q_b_proj: Linear,
    weights_proj: Linear,
    shape: IndexShape,
}

pub struct CompressedAttention {
    q_a: Linear,
    q_a_norm: RmsNorm,
    q_b: Linear,
    kv_proj: Linear,
    kv_norm: RmsNorm,
    /// `[groups × o_lora_rank, heads × head_dim / groups]`, one block per group.
    o_a: Linear,
    o_b: Linear,
    sinks: Vec<f32>,
    compressor: Option<Compressor>,
    indexer: Option<EntryIndexer>,
    shape: CompressedShape,
    rope: Rope,
    /// Slots of state: the entries (and the indexer's), then the ring of
    /// raw projections of the windows still open.
    slots: (usize, usize),
}

impl CompressedAttention {
    /// Loads the layer's weights under `w`; `rope` is the layer's (plain for
    /// sliding layers, the compressed branches' otherwise) and `slots` the
    /// two state slots after the layers' own that compressed layers use:
    /// the entries, then the ring of open windows' projections.
    pub fn load(
        w: &Weights,
        s: &CompressedShape,
        kind: LayerKind,
        index: &IndexShape,
        rope: &Rope,
        slots: (usize, usize),
    ) -> Result<Self, ModelError> {
        let (h, hd, g) = (s.hidden, s.head_dim, s.o_groups);
        let (compressor, indexer) = match kind {
            LayerKind::Sliding => (None, None),
            LayerKind::Heavy { rate } => (
                Some(Compressor::load(
                    &w.pp("compressor"),
                    h,
                    hd,
                    rate,
                    false,
                    s.eps,
                )?),
                None,
            ),
            LayerKind::Sparse { rate } => {
                let cw = w.pp("compressor");
                let iw = cw.pp("indexer");
                let indexer = EntryIndexer {
                    compressor: Compressor::load(&iw, h, index.head_dim, rate, true, s.eps)?,
                    q_b_proj: Linear::load(
                        &iw,
                        "q_b_proj",
                        s.q_lora_rank,
                        index.heads * index.head_dim,
                        false,
                    )?,
                    weights_proj: Linear::load(
                        &iw.pp("scorer"),
                        "weights_proj",
                        h,
                        index.heads,
                        false,
                    )?,
                    shape: *index,
                };
                (
                    Some(Compressor::load(&cw, h, hd, rate, true, s.eps)?),
                    Some(indexer),
                )
            }
        };
        Ok(Self {
            q_a: Linear::load(w, "q_a_proj", h, s.q_lora_rank, false)?,
            q_a_norm: RmsNorm::load(w, "q_a_norm", s.q_lora_rank, s.eps)?,
            q_b: Linear::load(w, "q_b_proj", s.q_lora_rank, s.heads * hd, false)?,
            kv_proj: Linear::load(w, "kv_proj", h, hd, false)?,
            kv_norm: RmsNorm::load(w, "kv_norm", hd, s.eps)?,
            o_a: Linear::load(w, "o_a_proj", s.heads * hd / g, g * s.o_lora_rank, false)?,
            o_b: Linear::load(w, "o_b_proj", g * s.o_lora_rank, h, false)?,
            sinks: values(&w.get("sinks", &[s.heads])?)?,
            compressor,
            indexer,
            shape: *s,
            rope: rope.clone(),
            slots,
        })
    }

    /// Attention of `xs`' `seq` rows after what `cache` holds.
    pub fn forward(
        &self,
        xs: &[f32],
        seq: usize,
        layer: usize,
        cache: &mut SequenceState,
    ) -> Result<Vec<f32>, ModelError> {
        let s = &self.shape;
        let (hd, heads) = (s.head_dim, s.heads);
        let offset = hd - s.rope_dim;
        let start = cache.len();
        // The layer's own rope (plain or the compressed branches'), not the decoder's.
        let tables = &self.rope.tables(start, seq);
        let q_res = self
            .q_a_norm
            .forward_values(&self.q_a.forward_values(xs, seq)?);
        let mut q = rms_norm(
            &self.q_b.forward_values(&q_res, seq)?,
            &vec![1.0; hd],
            s.eps as f32,
        );
        self.rope
            .rotate_pairs(&mut q, heads, hd, offset, tables, false)?;
        let mut kv = self
            .kv_norm
            .forward_values(&self.kv_proj.forward_values(xs, seq)?);
        self.rope
            .rotate_pairs(&mut kv, 1, hd, offset, tables, false)?;
        cache.append(layer, &kv, hd, &[], 0)?;
        let chosen = self.update_entries(xs, &q_res, seq, cache, tables)?;
        let keys: Vec<QueryKeys> = (0..seq)
            .map(|i| {
                let t = start + i;
                QueryKeys {
                    window: (t + 1).saturating_sub(s.sliding_window)..t + 1,
                    entries: chosen.get(i).cloned().unwrap_or_default(),
                }
            })
            .collect();
        let (window, _) = cache.rows(layer)?;
        let entries = match self.compressor {
            Some(_) => self.entries(cache, false, start + seq)?,
            None => EntryRows::NONE,
        };
        let scale = powf(hd as f32, -0.5);
        let mut out = sink_attention(&q, heads, window, entries, &keys, &self.sinks, scale);
        self.rope
            .rotate_pairs(&mut out, heads, hd, offset, tables, true)?;
        self.project_out(&out, seq)
    }

    /// Pools the entries the new positions close (the indexer's too), adds
    /// each position's share of the entries to the entry slot, and returns
    /// per query row the entries it reads.
    fn update_entries(
        &self,
        xs: &[f32],
        q_res: &[f32],
        seq: usize,
        cache: &mut SequenceState,
        tables: &RopeTables,
    ) -> Result<Vec<Vec<usize>>, ModelError> {
        let Some(main) = &self.compressor else {
            return Ok(vec![Vec::new(); seq]);
        };
        let start = cache.len();
        let index = self.indexer.as_ref().map(|i| &i.compressor);
        let mut streams = vec![Pending::new(main, xs, seq)?];
        if let Some(ic) = index {
            streams.push(Pending::new(ic, xs, seq)?);
        }
        let ring_len: usize = streams.iter().map(|p| p.ring_len()).sum();
        {
            let (_, ring) = cache.recurrent(self.slots.1, 0, ring_len)?;
            let mut rest = ring;
            for p in &mut streams {
                let (mine, others) = rest.split_at_mut(p.ring_len());
                p.run(mine, start, &self.rope, self.shape.rope_dim)?;
                rest = others;
            }
        }
        let index_pieces = streams.get(1).map_or(&[][..], |p| &p.pieces);
        let index_piece = index.map_or(0, Compressor::piece);
        cache.append(
            self.slots.0,
            &streams[0].pieces,
            main.piece(),
            index_pieces,
            index_piece,
        )?;
        let Some(indexer) = &self.indexer else {
            return Ok((0..seq)
                .map(|i| (0..(start + i + 1) / main.rate).collect())
                .collect());
        };
        let index_entries = self.entries(cache, true, start + seq)?;
        indexer.select(q_res, xs, seq, start, &index_entries, &self.rope, tables)
    }

    /// Where this layer's entries are now (the indexer's with `index`): the
    /// entry slot, and the latest entry, not yet spread, in the ring.
    fn entries<'s>(
        &self,
        cache: &'s SequenceState,
        index: bool,
        end: usize,
    ) -> Result<EntryRows<'s>, ModelError> {
        let compressor = match (index, &self.compressor, &self.indexer) {
            (false, Some(c), _) => c,
            (true, _, Some(i)) => &i.compressor,
            _ => return Err(ModelError::Internal("entries of a layer without them")),
        };
        let (main, index_rows) = cache.rows(self.slots.0)?;
        let ring = cache.recurrent_state(self.slots.1)?;
        let main_ring = self.compressor.as_ref().map_or(0, Compressor::ring_len);
        let at = if index {
            main_ring + compressor.ring_rows() * compressor.raw_width()
        } else {
            compressor.ring_rows() * compressor.raw_width()
        };
        let closed = end / compressor.rate;
        Ok(EntryRows {
            rows: if index { index_rows } else { main },
            stride: compressor.stride(),
            last: (closed.wrapping_sub(1), &ring[at..at + compressor.dim]),
        })
    }

    /// Inverse-rotated `[seq][heads][head_dim]` through the grouped output
    /// projection: each group of heads through its own block of `o_a`, then
    /// all groups through `o_b`.
    fn project_out(&self, out: &[f32], seq: usize) -> Result<Vec<f32>, ModelError> {
        let s = &self.shape;
        let (g, r) = (s.o_groups, s.o_lora_rank);
        let width = s.heads * s.head_dim / g;
        let mut low = vec![0f32; seq * g * r];
        for group in 0..g {
            let mut part = Vec::with_capacity(seq * width);
            for row in out.chunks_exact(g * width) {
                part.extend_from_slice(&row[group * width..(group + 1) * width]);
            }
            let block = self.o_a.weight().row_range(group * r, r)?;
            let y = block.matmul(&part, seq)?;
            for (i, y) in y.chunks_exact(r).enumerate() {
                low[(i * g + group) * r..(i * g + group + 1) * r].copy_from_slice(y);
            }
        }
        self.o_b.forward_values(&low, seq)
    }
}

impl EntryIndexer {
    /// Per query row, the entries (window numbers, ascending) it reads: all
    /// closed ones while they number at most `top_k`, else the `top_k` best
    /// scored, ties to the lowest.
    #[allow(clippy::too_many_arguments)]
    fn select(
        &self,
        q_res: &[f32],
        xs: &[f32],
        seq: usize,
        start: usize,
        entries: &EntryRows<'_>,
        rope: &Rope,
        tables: &RopeTables,
    ) -> Result<Vec<Vec<usize>>, ModelError> {
        let IndexShape {
            heads,
            head_dim: d,
            top_k,
        } = self.shape;
        let m = self.compressor.rate;
        let rope_offset = d - rope.dim();
        let mut q = self.q_b_proj.forward_values(q_res, seq)?;
        rope.rotate_pairs(&mut q, heads, d, rope_offset, tables, false)?;
        let weights = head_weights(&self.weights_proj, xs, seq, heads)?;
        let closed = (0..seq).map(|i| (start + i + 1) / m);
        let gathered = |n: usize| -> Cow<'_, [f32]> {
            Cow::Owned((0..n).flat_map(|w| entries.get(w, d)).copied().collect())
        };
        Ok(choose(&q, &weights, (heads, d, top_k), closed, gathered))
    }
}
