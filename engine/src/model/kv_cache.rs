//! Per-layer attention state carried from one forward pass to the next.
//!
//! Each layer keeps two tensors that grow along dimension 1 (the sequence):
//! keys and values for grouped-query attention, or the compressed latent and
//! the shared rotary key for multi-head latent attention. Which is which is the
//! attention layer's business; the cache only appends and counts.

use candle_core::Tensor;

use super::ModelError;

/// Sequence axis of every cached tensor.
const SEQ_DIM: usize = 1;

#[derive(Debug, Clone, Default)]
struct LayerState {
    first: Option<Tensor>,
    second: Option<Tensor>,
}

/// Attention state for one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerState>,
    len: usize,
}

impl KvCache {
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![LayerState::default(); num_layers],
            len: 0,
        }
    }

    /// Positions already processed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `first` and `second` (each `[_, seq, _]`) to layer `layer` and
    /// returns the full tensors so far.
    pub fn append(
        &mut self,
        layer: usize,
        first: &Tensor,
        second: &Tensor,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let state = self
            .layers
            .get_mut(layer)
            .ok_or(ModelError::Internal("layer index past the cache"))?;
        let join = |old: &Option<Tensor>, new: &Tensor| -> Result<Tensor, ModelError> {
            Ok(match old {
                Some(old) => Tensor::cat(&[old, new], SEQ_DIM)?,
                None => new.clone(),
            })
        };
        let a = join(&state.first, first)?;
        let b = join(&state.second, second)?;
        state.first = Some(a.clone());
        state.second = Some(b.clone());
        Ok((a, b))
    }

    /// Records that `n` more positions were processed by every layer.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
