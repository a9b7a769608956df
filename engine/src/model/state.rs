//! One sequence's state, per layer, carried from one forward pass to the next.
//!
//! Layers keep one of two shapes of state:
//! - **Appending**: two position-major buffers that grow by one row per
//!   position — keys and values (`[position][kv head][dim]`) for
//!   grouped-query attention, or compressed latents and the shared rotary
//!   keys for multi-head latent attention. Appending writes only the new
//!   positions and attention reads the buffers in place: concatenating
//!   tensors instead copied the whole cache twice a token, about 2 GB a token
//!   at 20,000 tokens of context on the 5.1 GB Qwen3-MoE.
//! - **Recurrent**: a fixed-size state overwritten every position (linear
//!   attention's `[head][key dim][value dim]` matrix) and the short
//!   convolution's window of the last inputs. Its size does not grow with
//!   the context, so it cannot be cut back by dropping rows.
//!
//! Which layer holds what is the layer's business; this type appends,
//! counts, saves and restores. Cutting back (`truncate`) drops rows of
//! appending layers and returns recurrent layers to a checkpoint taken
//! earlier ([`SequenceState::checkpoint`]); the session replays the tokens
//! after it, which gives the same bits because every kernel computes a row
//! the same way whatever rows run with it.

use std::collections::VecDeque;

use super::ModelError;

/// Checkpoints kept for cutting back recurrent layers; older ones are dropped.
pub const MAX_CHECKPOINTS: usize = 4;

/// Who uses a state slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRole {
    /// Decoder layer `n`'s own attention or recurrent state.
    Layer(usize),
    /// The index keys of layer `n`'s lightning indexer (DeepSeek sparse
    /// attention).
    IndexKeys(usize),
    /// Layer `n`'s compressed entries (DeepSeek-V4), appended per position.
    Entries(usize),
    /// Layer `n`'s ring of open windows' projections (DeepSeek-V4).
    Ring(usize),
}

/// What a state slot holds, in f32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// Rows appended per position: this many values a position.
    Appending { per_position: usize },
    /// A fixed state overwritten as positions go: this many values, kept
    /// again at each checkpoint.
    Fixed { values: usize },
}

/// The state slots one sequence keeps: the layers' own first (slot `n` is
/// layer `n`'s), then the extra slots some layers use, each found by its
/// role. The memory a sequence needs and the slots a built decoder reads
/// both come from it, so they cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLayout {
    slots: Vec<(SlotRole, SlotKind)>,
}

impl StateLayout {
    /// One slot per layer, of the given kinds.
    pub fn layers(kinds: impl IntoIterator<Item = SlotKind>) -> Self {
        Self {
            slots: kinds
                .into_iter()
                .enumerate()
                .map(|(i, k)| (SlotRole::Layer(i), k))
                .collect(),
        }
    }

    /// Adds a slot after the others.
    pub fn push(&mut self, role: SlotRole, kind: SlotKind) {
        self.slots.push((role, kind));
    }

    /// The index of the slot `role` uses.
    pub fn slot(&self, role: SlotRole) -> Result<usize, ModelError> {
        self.slots
            .iter()
            .position(|(r, _)| *r == role)
            .ok_or(ModelError::Internal(
                "a layer asked for a state slot its layout lacks",
            ))
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// f32 bytes per position and fixed (with the checkpoints kept of it).
    pub fn bytes(&self) -> crate::memory::StateBytes {
        const F32: u64 = 4;
        let (mut per_position, mut fixed) = (0u64, 0u64);
        for (_, kind) in &self.slots {
            match *kind {
                SlotKind::Appending { per_position: n } => per_position += n as u64,
                SlotKind::Fixed { values } => fixed += values as u64,
            }
        }
        crate::memory::StateBytes {
            per_token: per_position * F32,
            fixed: fixed * F32 * (1 + MAX_CHECKPOINTS as u64),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
enum LayerState {
    /// Nothing computed yet (or a layer without state).
    #[default]
    Empty,
    Appending {
        first: Vec<f32>,
        second: Vec<f32>,
        /// Values per position of each buffer, fixed by the first append.
        widths: (usize, usize),
    },
    Recurrent {
        /// The convolution's last inputs, `[kernel − 1][channels]`.
        window: Vec<f32>,
        state: Vec<f32>,
    },
}

/// Recurrent layers' state at one position.
#[derive(Debug, Clone)]
struct Checkpoint {
    len: usize,
    layers: Vec<(usize, Vec<f32>, Vec<f32>)>,
}

/// Per-layer state of one sequence.
#[derive(Debug, Clone)]
pub struct SequenceState {
    layers: Vec<LayerState>,
    len: usize,
    checkpoints: VecDeque<Checkpoint>,
}

fn misfit(reason: impl Into<String>) -> ModelError {
    ModelError::StateMismatch(reason.into())
}

impl SequenceState {
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![LayerState::Empty; num_layers],
            len: 0,
            checkpoints: VecDeque::new(),
        }
    }

    /// Positions already processed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether any layer keeps state that cannot be cut back by dropping rows.
    pub fn has_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent { .. }))
    }

    /// Bytes the state holds now.
    pub fn bytes(&self) -> usize {
        let values: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Empty => 0,
                LayerState::Appending { first, second, .. } => first.len() + second.len(),
                LayerState::Recurrent { window, state } => window.len() + state.len(),
            })
            .sum();
        values * size_of::<f32>()
    }

    /// Appends positions to layer `layer`: `first` holds `first_width`
    /// values per position and `second` `second_width`, for the same number
    /// of positions. Returns both buffers so far.
    pub fn append(
        &mut self,
        layer: usize,
        first: &[f32],
        first_width: usize,
        second: &[f32],
        second_width: usize,
    ) -> Result<(&[f32], &[f32]), ModelError> {
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or(ModelError::Internal("layer index past the state"))?;
        if *slot == LayerState::Empty {
            *slot = LayerState::Appending {
                first: Vec::new(),
                second: Vec::new(),
                widths: (first_width, second_width),
            };
        }
        let LayerState::Appending {
            first: a,
            second: b,
            widths,
        } = slot
        else {
            return Err(ModelError::Internal("appending to a recurrent layer"));
        };
        let positions = first.len() / first_width.max(1);
        if *widths != (first_width, second_width)
            || first.len() != positions * first_width
            || second.len() != positions * second_width
        {
            return Err(ModelError::Internal(
                "attention state appended with another width",
            ));
        }
        a.extend_from_slice(first);
        b.extend_from_slice(second);
        Ok((a, b))
    }

    /// Slot `slot`'s two appended buffers as they are (empty before the
    /// first append), for layers that read several slots at once.
    pub fn rows(&self, slot: usize) -> Result<(&[f32], &[f32]), ModelError> {
        match self.layers.get(slot) {
            Some(LayerState::Appending { first, second, .. }) => Ok((first, second)),
            Some(LayerState::Empty) => Ok((&[], &[])),
            Some(LayerState::Recurrent { .. }) => {
                Err(ModelError::Internal("rows asked of a recurrent layer"))
            }
            None => Err(ModelError::Internal("layer index past the state")),
        }
    }

    /// Slot `slot`'s recurrent state as it is.
    pub fn recurrent_state(&self, slot: usize) -> Result<&[f32], ModelError> {
        match self.layers.get(slot) {
            Some(LayerState::Recurrent { state, .. }) => Ok(state),
            _ => Err(ModelError::Internal(
                "recurrent state asked of another slot",
            )),
        }
    }

    /// Layer `layer`'s convolution window (`window_len` values) and
    /// recurrent state (`state_len`), zero before the first position.
    pub fn recurrent(
        &mut self,
        layer: usize,
        window_len: usize,
        state_len: usize,
    ) -> Result<(&mut [f32], &mut [f32]), ModelError> {
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or(ModelError::Internal("layer index past the state"))?;
        if *slot == LayerState::Empty {
            *slot = LayerState::Recurrent {
                window: vec![0.0; window_len],
                state: vec![0.0; state_len],
            };
        }
        match slot {
            LayerState::Recurrent { window, state }
                if window.len() == window_len && state.len() == state_len =>
            {
                Ok((window, state))
            }
            _ => Err(ModelError::Internal(
                "recurrent state asked for with another size",
            )),
        }
    }

    /// Records that `n` more positions were processed by every layer.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Remembers the recurrent layers' state at the current position, so
    /// that [`SequenceState::truncate`] can return to it.
    pub fn checkpoint(&mut self) {
        if !self.has_recurrent() || self.checkpoints.back().is_some_and(|c| c.len == self.len) {
            return;
        }
        let layers = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match l {
                LayerState::Recurrent { window, state } => Some((i, window.clone(), state.clone())),
                _ => None,
            })
            .collect();
        if self.checkpoints.len() == MAX_CHECKPOINTS {
            self.checkpoints.pop_front();
        }
        self.checkpoints.push_back(Checkpoint {
            len: self.len,
            layers,
        });
    }

    /// Cuts the state back towards `len` positions and returns the length
    /// it reached: `len` itself when every layer can be cut there, or the
    /// latest checkpoint before it (0 at worst), from which the caller feeds
    /// the tokens up to `len` again.
    pub fn truncate(&mut self, len: usize) -> usize {
        if len >= self.len {
            return self.len;
        }
        let reached = if self.has_recurrent() {
            while self.checkpoints.back().is_some_and(|c| c.len > len) {
                self.checkpoints.pop_back();
            }
            match self.checkpoints.back() {
                Some(c) => {
                    for (i, window, state) in &c.layers {
                        if let Some(slot) = self.layers.get_mut(*i) {
                            *slot = LayerState::Recurrent {
                                window: window.clone(),
                                state: state.clone(),
                            };
                        }
                    }
                    c.len
                }
                None => {
                    for slot in &mut self.layers {
                        if matches!(slot, LayerState::Recurrent { .. }) {
                            *slot = LayerState::Empty;
                        }
                    }
                    0
                }
            }
        } else {
            len
        };
        for slot in &mut self.layers {
            if let LayerState::Appending {
                first,
                second,
                widths,
            } = slot
            {
                first.truncate(reached * widths.0);
                second.truncate(reached * widths.1);
            }
        }
        self.len = reached;
        reached
    }
}

/// Marks the byte form of saved state (and its version), so unrelated or
/// older bytes are refused.
const STATE_MAGIC: &[u8; 4] = b"LHS3";
const KIND_EMPTY: u8 = 0;
const KIND_APPENDING: u8 = 1;
const KIND_RECURRENT: u8 = 2;

/// One layer's saved part, read back and checked.
enum Saved {
    Nothing,
    Rows((usize, usize), Vec<f32>, Vec<f32>),
    Recurrent(Vec<f32>, Vec<f32>),
}

impl SequenceState {
    /// The state from position `start` on, as bytes that
    /// [`SequenceState::extend_from_bytes`] applies to a state holding the
    /// positions before `start`: appending layers' rows from `start`, and
    /// recurrent layers' whole state as it is now.
    pub fn save_since(&self, start: usize) -> Result<Vec<u8>, ModelError> {
        let count = self.len.saturating_sub(start);
        let mut out = Vec::new();
        out.extend_from_slice(STATE_MAGIC);
        out.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        out.extend_from_slice(&(count as u32).to_le_bytes());
        let put = |out: &mut Vec<u8>, values: &[f32]| {
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        };
        for layer in &self.layers {
            match layer {
                LayerState::Appending {
                    first,
                    second,
                    widths: (a, b),
                } if count > 0 => {
                    out.push(KIND_APPENDING);
                    out.extend_from_slice(&(*a as u32).to_le_bytes());
                    out.extend_from_slice(&(*b as u32).to_le_bytes());
                    for (buf, width) in [(first, *a), (second, *b)] {
                        let rows = buf.get(start * width..(start + count) * width).ok_or(
                            ModelError::Internal("attention state shorter than its count"),
                        )?;
                        put(&mut out, rows);
                    }
                }
                LayerState::Recurrent { window, state } => {
                    out.push(KIND_RECURRENT);
                    out.extend_from_slice(&(window.len() as u32).to_le_bytes());
                    out.extend_from_slice(&(state.len() as u32).to_le_bytes());
                    put(&mut out, window);
                    put(&mut out, state);
                }
                _ => out.push(KIND_EMPTY),
            }
        }
        Ok(out)
    }

    /// Positions that bytes made by [`SequenceState::save_since`] hold, read
    /// from their header (the rest is checked when they are applied).
    pub fn positions_in(bytes: &[u8]) -> Result<usize, ModelError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4) != Some(STATE_MAGIC.as_slice()) {
            return Err(misfit("not sequence state of this version"));
        }
        r.word()?;
        r.word()
    }

    /// Applies bytes made by [`SequenceState::save_since`]; returns how many
    /// positions they held. Bytes that do not fit this model or this state
    /// are refused with the reason and leave it unchanged.
    pub fn extend_from_bytes(&mut self, bytes: &[u8]) -> Result<usize, ModelError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4) != Some(STATE_MAGIC.as_slice()) {
            return Err(misfit("not sequence state of this version"));
        }
        let layers = r.word()?;
        if layers != self.layers.len() {
            return Err(misfit(format!(
                "saved for {layers} layers, the model has {}",
                self.layers.len()
            )));
        }
        let count = r.word()?;
        let mut parsed = Vec::with_capacity(layers);
        for (i, layer) in self.layers.iter().enumerate() {
            let kind = r.take(1).ok_or_else(|| misfit("cut short"))?[0];
            let saved = match kind {
                KIND_EMPTY => Saved::Nothing,
                KIND_APPENDING => {
                    let widths = (r.word()?, r.word()?);
                    let fits = match layer {
                        LayerState::Empty => true,
                        LayerState::Appending { widths: w, .. } => *w == widths,
                        LayerState::Recurrent { .. } => false,
                    };
                    if !fits {
                        return Err(misfit(format!("layer {i} holds another kind or width")));
                    }
                    let first = r.values(count.checked_mul(widths.0))?;
                    let second = r.values(count.checked_mul(widths.1))?;
                    Saved::Rows(widths, first, second)
                }
                KIND_RECURRENT => {
                    let (w, s) = (r.word()?, r.word()?);
                    let fits = match layer {
                        LayerState::Empty => true,
                        LayerState::Recurrent { window, state } => {
                            window.len() == w && state.len() == s
                        }
                        LayerState::Appending { .. } => false,
                    };
                    if !fits {
                        return Err(misfit(format!("layer {i} holds another kind or size")));
                    }
                    Saved::Recurrent(r.values(Some(w))?, r.values(Some(s))?)
                }
                other => return Err(misfit(format!("layer {i} has unknown kind {other}"))),
            };
            parsed.push(saved);
        }
        if r.at != bytes.len() {
            return Err(misfit("bytes left over"));
        }
        for (i, saved) in parsed.into_iter().enumerate() {
            match saved {
                Saved::Nothing => {}
                Saved::Rows((a, b), first, second) => {
                    self.append(i, &first, a, &second, b)?;
                }
                Saved::Recurrent(window, state) => {
                    self.layers[i] = LayerState::Recurrent { window, state };
                }
            }
        }
        self.advance(count);
        Ok(count)
    }
}

/// Reads little-endian words and values off a slice.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }

    fn word(&mut self) -> Result<usize, ModelError> {
        let b = self.take(4).ok_or_else(|| misfit("cut short"))?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// `n` f32 values; `None` (an overflowed count) is refused.
    fn values(&mut self, n: Option<usize>) -> Result<Vec<f32>, ModelError> {
        let bytes = n
            .and_then(|n| n.checked_mul(4))
            .and_then(|n| self.take(n))
            .ok_or_else(|| misfit("cut short"))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(positions: usize, width: usize, base: f32) -> Vec<f32> {
        (0..positions * width).map(|i| base + i as f32).collect()
    }

    /// Two appending layers and one recurrent layer at `n` positions; the
    /// recurrent state's values say which position it is at.
    fn state_at(n: usize) -> SequenceState {
        let mut s = SequenceState::new(3);
        for layer in 0..2 {
            s.append(layer, &rows(n, 6, 0.0), 6, &rows(n, 3, 100.0), 3)
                .unwrap();
        }
        let (window, state) = s.recurrent(2, 4, 5).unwrap();
        window.fill(n as f32);
        state.fill(-(n as f32));
        s.advance(n);
        s
    }

    #[test]
    fn saved_state_round_trips_onto_a_state_holding_the_earlier_positions() {
        let full = state_at(5);
        let mut head = state_at(2);
        let bytes = full.save_since(2).unwrap();
        assert_eq!(head.extend_from_bytes(&bytes).unwrap(), 3);
        assert_eq!(head.len(), 5);
        assert_eq!(head.layers, full.layers);
        // Damaged or foreign bytes change nothing, and say why.
        let before = head.layers.clone();
        for bad in [&bytes[..bytes.len() - 1], b"LHK2....".as_slice()] {
            assert!(matches!(
                head.extend_from_bytes(bad),
                Err(ModelError::StateMismatch(_))
            ));
        }
        let err = SequenceState::new(4).extend_from_bytes(&bytes).unwrap_err();
        assert!(err.to_string().contains("3 layers"), "{err}");
        let mut other = SequenceState::new(3);
        other
            .append(0, &rows(1, 4, 0.0), 4, &rows(1, 3, 0.0), 3)
            .unwrap();
        assert!(other.extend_from_bytes(&bytes).is_err(), "another width");
        assert_eq!(head.layers, before);
    }

    #[test]
    fn truncate_cuts_rows_and_returns_recurrent_layers_to_a_checkpoint() {
        let mut s = SequenceState::new(2);
        s.append(0, &rows(3, 2, 0.0), 2, &rows(3, 1, 0.0), 1)
            .unwrap();
        s.advance(3);
        assert_eq!(s.truncate(1), 1, "rows alone cut anywhere");
        assert_eq!(s.bytes(), 3 * 4);

        let mut s = state_at(4);
        s.checkpoint();
        let at_four = s.layers.clone();
        for layer in 0..2 {
            s.append(layer, &rows(3, 6, 9.0), 6, &rows(3, 3, 9.0), 3)
                .unwrap();
        }
        s.recurrent(2, 4, 5).unwrap().1.fill(7.0);
        s.advance(3);
        assert_eq!(s.truncate(6), 4, "back to the checkpoint, to replay 2");
        assert_eq!(s.layers, at_four);
        assert_eq!(s.truncate(2), 0, "before every checkpoint: from the start");
        assert_eq!(s.len(), 0);
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn appends_of_another_width_are_refused() {
        let mut c = SequenceState::new(1);
        c.append(0, &rows(2, 4, 0.0), 4, &rows(2, 4, 0.0), 4)
            .unwrap();
        assert!(
            c.append(0, &rows(1, 5, 0.0), 5, &rows(1, 4, 0.0), 4)
                .is_err()
        );
        assert!(
            c.append(0, &rows(1, 4, 0.0), 4, &rows(2, 4, 0.0), 4)
                .is_err()
        );
        assert!(c.recurrent(0, 1, 1).is_err(), "another kind");
    }
}
