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

/// Marks the byte form of cache rows, so unrelated bytes are refused.
const ROWS_MAGIC: &[u8; 4] = b"LHKV";

impl KvCache {
    /// The cached positions from `start` on, as bytes that [`KvCache::extend_from_bytes`]
    /// appends to a cache holding the positions before `start`: for every
    /// layer, both tensors' dims and their f32 values.
    pub fn rows_from(&self, start: usize) -> Result<Vec<u8>, ModelError> {
        let count = self.len.saturating_sub(start);
        let mut out = Vec::new();
        out.extend_from_slice(ROWS_MAGIC);
        out.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        out.extend_from_slice(&(count as u32).to_le_bytes());
        for state in &self.layers {
            for t in [&state.first, &state.second] {
                let Some(t) = t.as_ref().filter(|_| count > 0) else {
                    out.extend_from_slice(&0u32.to_le_bytes());
                    continue;
                };
                let rows = t.narrow(SEQ_DIM, start, count)?.contiguous()?;
                let dims = rows.dims();
                out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
                for &d in dims {
                    out.extend_from_slice(&(d as u32).to_le_bytes());
                }
                let values: Vec<f32> = rows.flatten_all()?.to_vec1()?;
                for v in values {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        Ok(out)
    }

    /// Appends rows made by [`KvCache::rows_from`]; returns how many
    /// positions they held. Bytes that do not fit this cache are refused
    /// and leave it unchanged.
    pub fn extend_from_bytes(&mut self, bytes: &[u8]) -> Result<usize, ModelError> {
        let bad = || ModelError::Internal("saved attention state does not fit this model");
        let mut r = Reader { bytes, at: 0 };
        if r.take(4) != Some(ROWS_MAGIC.as_slice()) {
            return Err(bad());
        }
        if r.word()? != self.layers.len() {
            return Err(bad());
        }
        let count = r.word()?;
        let mut parsed: Vec<[Option<Tensor>; 2]> = Vec::with_capacity(self.layers.len());
        for _ in 0..self.layers.len() {
            let mut pair = [None, None];
            for slot in &mut pair {
                let rank = r.word()?;
                if rank == 0 {
                    continue;
                }
                let dims = (0..rank).map(|_| r.word()).collect::<Result<Vec<_>, _>>()?;
                if dims.get(SEQ_DIM) != Some(&count) {
                    return Err(bad());
                }
                let n: usize = dims.iter().product();
                let raw = r.take(4 * n).ok_or_else(bad)?;
                let values: Vec<f32> = raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                *slot = Some(Tensor::from_vec(values, dims, &candle_core::Device::Cpu)?);
            }
            parsed.push(pair);
        }
        if r.at != bytes.len() {
            return Err(bad());
        }
        // Shapes must continue the cached tensors before anything changes.
        for (state, pair) in self.layers.iter().zip(&parsed) {
            for (old, new) in [(&state.first, &pair[0]), (&state.second, &pair[1])] {
                if let (Some(old), Some(new)) = (old, new) {
                    let (a, b) = (old.dims(), new.dims());
                    if a.len() != b.len()
                        || a.iter()
                            .zip(b)
                            .enumerate()
                            .any(|(i, (x, y))| i != SEQ_DIM && x != y)
                    {
                        return Err(bad());
                    }
                }
            }
        }
        for (layer, pair) in parsed.into_iter().enumerate() {
            if let [Some(first), Some(second)] = &pair {
                self.append(layer, first, second)?;
            }
        }
        self.advance(count);
        Ok(count)
    }
}

/// Reads little-endian words and byte runs off a slice.
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
        let b = self.take(4).ok_or(ModelError::Internal(
            "saved attention state does not fit this model",
        ))?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn rows(seq: usize, base: f32) -> Tensor {
        let v: Vec<f32> = (0..2 * seq * 3).map(|i| base + i as f32).collect();
        Tensor::from_vec(v, (2, seq, 3), &Device::Cpu).unwrap()
    }

    /// A cached tensor's values, flat.
    fn values(t: &Option<Tensor>) -> Vec<f32> {
        t.as_ref()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn rows_round_trip_onto_a_cache_holding_the_earlier_positions() {
        let mut full = KvCache::new(2);
        for layer in 0..2 {
            full.append(layer, &rows(5, 0.0), &rows(5, 100.0)).unwrap();
        }
        full.advance(5);
        let mut head = KvCache::new(2);
        for layer in 0..2 {
            head.append(
                layer,
                &rows(5, 0.0).narrow(1, 0, 2).unwrap(),
                &rows(5, 100.0).narrow(1, 0, 2).unwrap(),
            )
            .unwrap();
        }
        head.advance(2);
        let bytes = full.rows_from(2).unwrap();
        assert_eq!(head.extend_from_bytes(&bytes).unwrap(), 3);
        assert_eq!(head.len(), 5);
        for (a, b) in head.layers.iter().zip(&full.layers) {
            for (x, y) in [(&a.first, &b.first), (&a.second, &b.second)] {
                assert_eq!(values(x), values(y));
            }
        }
        // Damaged or foreign bytes change nothing.
        assert!(head.extend_from_bytes(&bytes[..bytes.len() - 1]).is_err());
        assert!(KvCache::new(3).extend_from_bytes(&bytes).is_err());
        assert_eq!(head.len(), 5);
    }
}
