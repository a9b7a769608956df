//! Per-layer attention state carried from one forward pass to the next.
//!
//! Each layer keeps two position-major buffers that grow by appending: keys
//! and values (`[position][kv head][dim]`) for grouped-query attention, or
//! the compressed latents and the shared rotary keys (`[position][width]`)
//! for multi-head latent attention. Which is which is the attention layer's
//! business; the cache only appends and counts. Appending writes only the
//! new positions and attention reads the buffers in place: concatenating
//! tensors instead copied the whole cache twice a token, which on the 5.1 GB
//! Qwen3-MoE would be about 2 GB a token at 20,000 tokens of context.

use super::ModelError;

#[derive(Debug, Clone, Default)]
struct LayerState {
    first: Vec<f32>,
    second: Vec<f32>,
    /// Values per position of each buffer, fixed by the first append.
    widths: Option<(usize, usize)>,
}

/// Attention state for one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerState>,
    len: usize,
}

fn misfit() -> ModelError {
    ModelError::Internal("saved attention state does not fit this model")
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
        let state = self
            .layers
            .get_mut(layer)
            .ok_or(ModelError::Internal("layer index past the cache"))?;
        let widths = *state.widths.get_or_insert((first_width, second_width));
        let positions = first.len() / first_width.max(1);
        if widths != (first_width, second_width)
            || first.len() != positions * first_width
            || second.len() != positions * second_width
        {
            return Err(ModelError::Internal(
                "attention state appended with another width",
            ));
        }
        state.first.extend_from_slice(first);
        state.second.extend_from_slice(second);
        Ok((&state.first, &state.second))
    }

    /// Records that `n` more positions were processed by every layer.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

/// One layer's rows read back: their widths and both buffers' values.
type ParsedRows = ((usize, usize), Vec<f32>, Vec<f32>);

/// Marks the byte form of cache rows, so unrelated bytes are refused.
const ROWS_MAGIC: &[u8; 4] = b"LHK2";

impl KvCache {
    /// The cached positions from `start` on, as bytes that
    /// [`KvCache::extend_from_bytes`] appends to a cache holding the positions
    /// before `start`: for every layer, both widths and the f32 values.
    pub fn rows_from(&self, start: usize) -> Result<Vec<u8>, ModelError> {
        let count = self.len.saturating_sub(start);
        let mut out = Vec::new();
        out.extend_from_slice(ROWS_MAGIC);
        out.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        out.extend_from_slice(&(count as u32).to_le_bytes());
        for state in &self.layers {
            let (a, b) = state.widths.filter(|_| count > 0).unwrap_or((0, 0));
            out.extend_from_slice(&(a as u32).to_le_bytes());
            out.extend_from_slice(&(b as u32).to_le_bytes());
            for (buf, width) in [(&state.first, a), (&state.second, b)] {
                let rows =
                    buf.get(start * width..(start + count) * width)
                        .ok_or(ModelError::Internal(
                            "attention state shorter than its count",
                        ))?;
                for v in rows {
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
        let mut r = Reader { bytes, at: 0 };
        if r.take(4) != Some(ROWS_MAGIC.as_slice()) || r.word()? != self.layers.len() {
            return Err(misfit());
        }
        let count = r.word()?;
        let mut parsed: Vec<Option<ParsedRows>> = Vec::with_capacity(self.layers.len());
        for state in &self.layers {
            let widths = (r.word()?, r.word()?);
            if widths == (0, 0) {
                parsed.push(None);
                continue;
            }
            // Widths must continue what the cache holds.
            if state.widths.is_some_and(|w| w != widths) {
                return Err(misfit());
            }
            let mut read = |width: usize| -> Result<Vec<f32>, ModelError> {
                let n = count.checked_mul(width).ok_or_else(misfit)?;
                let raw = r
                    .take(n.checked_mul(4).ok_or_else(misfit)?)
                    .ok_or_else(misfit)?;
                Ok(raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect())
            };
            let first = read(widths.0)?;
            let second = read(widths.1)?;
            parsed.push(Some((widths, first, second)));
        }
        if r.at != bytes.len() {
            return Err(misfit());
        }
        for (layer, rows) in parsed.into_iter().enumerate() {
            if let Some(((a, b), first, second)) = rows {
                self.append(layer, &first, a, &second, b)?;
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
        let b = self.take(4).ok_or_else(misfit)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(positions: usize, width: usize, base: f32) -> Vec<f32> {
        (0..positions * width).map(|i| base + i as f32).collect()
    }

    #[test]
    fn rows_round_trip_onto_a_cache_holding_the_earlier_positions() {
        let mut full = KvCache::new(2);
        for layer in 0..2 {
            full.append(layer, &rows(5, 6, 0.0), 6, &rows(5, 3, 100.0), 3)
                .unwrap();
        }
        full.advance(5);
        let mut head = KvCache::new(2);
        for layer in 0..2 {
            head.append(layer, &rows(5, 6, 0.0)[..12], 6, &rows(5, 3, 100.0)[..6], 3)
                .unwrap();
        }
        head.advance(2);
        let bytes = full.rows_from(2).unwrap();
        assert_eq!(head.extend_from_bytes(&bytes).unwrap(), 3);
        assert_eq!(head.len(), 5);
        for (a, b) in head.layers.iter().zip(&full.layers) {
            assert_eq!(a.first, b.first);
            assert_eq!(a.second, b.second);
        }
        // Damaged or foreign bytes change nothing.
        assert!(head.extend_from_bytes(&bytes[..bytes.len() - 1]).is_err());
        assert!(KvCache::new(3).extend_from_bytes(&bytes).is_err());
        let mut other = KvCache::new(2);
        other
            .append(0, &rows(1, 4, 0.0), 4, &rows(1, 3, 0.0), 3)
            .unwrap();
        assert!(other.extend_from_bytes(&bytes).is_err(), "another width");
        assert_eq!(head.len(), 5);
    }

    #[test]
    fn appends_of_another_width_are_refused() {
        let mut c = KvCache::new(1);
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
    }
}
