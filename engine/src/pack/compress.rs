//! Lossless compression of float expert records.
//!
//! Why: decoding from drives is bound by their bandwidth, so the bytes read
//! per token set the speed. The byte holding a float's sign and exponent
//! takes few values in real and synthetic weights alike: in the 5.1 GB F16
//! Qwen3-MoE the peers compare on, its entropy is 5.5 bits where the low
//! mantissa byte's is 8. Entropy-coding the high bytes with zstd and storing
//! the rest as they are makes records 0.84 of their size, and the reader
//! threads restore them at about 5 GB/s of record per core, so on drives
//! slower than that the saving is speed.
//!
//! A compressed record: the length of the zstd frame (u32, little-endian),
//! the frame (every element's most significant byte, in element order), then
//! the other bytes of every element, in element order.

use std::cell::RefCell;

/// The manifest's name for this compression.
pub const COMPRESSION_NAME: &str = "zstd-high-bytes";
/// zstd level: higher levels gained nothing measurable on weights (0.843 of
/// the record at levels 1, 3, 9 and 19) and write more slowly.
const LEVEL: i32 = 3;
/// A record stays plain unless compressing saves at least this share of it.
pub const MIN_SAVING: f64 = 0.05;
/// Bytes of the frame-length prefix.
const PREFIX: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum CompressError {
    #[error("a compressed record of {found} bytes is too short for its header")]
    Truncated { found: usize },
    #[error(
        "a compressed record holds {found} high bytes and {rest} other bytes; {elements} elements of {size} bytes were expected"
    )]
    Size {
        found: usize,
        rest: usize,
        elements: usize,
        size: usize,
    },
    #[error("elements of {0} bytes cannot be split into a high byte and the rest")]
    Element(usize),
    #[error("zstd: {0}")]
    Zstd(#[from] std::io::Error),
}

/// `plain` (elements of `size` bytes, little-endian) compressed, if that
/// saves at least [`MIN_SAVING`]; `None` otherwise.
pub fn compress(plain: &[u8], size: usize) -> Result<Option<Vec<u8>>, CompressError> {
    if size < 2 || !plain.len().is_multiple_of(size) {
        return Err(CompressError::Element(size));
    }
    let high: Vec<u8> = plain.chunks_exact(size).map(|e| e[size - 1]).collect();
    let frame = zstd::bulk::compress(&high, LEVEL)?;
    let stored = PREFIX + frame.len() + plain.len() - high.len();
    if stored as f64 > plain.len() as f64 * (1.0 - MIN_SAVING) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(stored);
    out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    out.extend_from_slice(&frame);
    for e in plain.chunks_exact(size) {
        out.extend_from_slice(&e[..size - 1]);
    }
    Ok(Some(out))
}

thread_local! {
    /// The high bytes of the record being restored, reused by each reader thread.
    static HIGH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Restores a compressed record into `out` (its plain length).
pub fn decompress(stored: &[u8], size: usize, out: &mut [u8]) -> Result<(), CompressError> {
    if size < 2 || !out.len().is_multiple_of(size) {
        return Err(CompressError::Element(size));
    }
    let elements = out.len() / size;
    let prefix = stored
        .first_chunk::<PREFIX>()
        .ok_or(CompressError::Truncated {
            found: stored.len(),
        })?;
    let frame_len = u32::from_le_bytes(*prefix) as usize;
    let frame =
        stored
            .get(PREFIX..PREFIX.saturating_add(frame_len))
            .ok_or(CompressError::Truncated {
                found: stored.len(),
            })?;
    let rest = &stored[PREFIX + frame_len..];
    HIGH.with(|high| {
        let mut high = high.borrow_mut();
        high.resize(elements, 0);
        let found = zstd::bulk::decompress_to_buffer(frame, &mut high[..])?;
        if found != elements || rest.len() != elements * (size - 1) {
            return Err(CompressError::Size {
                found,
                rest: rest.len(),
                elements,
                size,
            });
        }
        interleave(&high, rest, size, out);
        Ok(())
    })
}

/// Puts every element back together: its low bytes, then its high byte.
fn interleave(high: &[u8], rest: &[u8], size: usize, out: &mut [u8]) {
    if size == 2 {
        // Equal-length slices and an index loop: compiles to byte shuffles.
        let (pairs, _) = out.as_chunks_mut::<2>();
        let n = pairs.len().min(high.len()).min(rest.len());
        let (pairs, high, rest) = (&mut pairs[..n], &high[..n], &rest[..n]);
        for i in 0..n {
            pairs[i] = [rest[i], high[i]];
        }
        return;
    }
    for ((o, &h), l) in out
        .chunks_exact_mut(size)
        .zip(high)
        .zip(rest.chunks_exact(size - 1))
    {
        o[..size - 1].copy_from_slice(l);
        o[size - 1] = h;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::format::f32_to_f16_bytes;

    fn weights(n: usize) -> Vec<f32> {
        let mut state = 7u64;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * 0.04
            })
            .collect()
    }

    #[test]
    fn records_round_trip_exactly_and_shrink() {
        let w = weights(50_000);
        let f16 = f32_to_f16_bytes(&w);
        let f32: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        for (plain, size) in [(f16, 2), (f32, 4)] {
            let stored = compress(&plain, size).unwrap().expect("weights compress");
            assert!(
                stored.len() < plain.len() * 95 / 100,
                "{size}: {}",
                stored.len()
            );
            let mut out = vec![0u8; plain.len()];
            decompress(&stored, size, &mut out).unwrap();
            assert!(out == plain, "{size}-byte elements round trip");
        }
    }

    #[test]
    fn incompressible_records_stay_plain_and_damage_is_an_error() {
        let mut state = 1u64;
        let noise: Vec<u8> = (0..20_000)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect();
        assert!(compress(&noise, 2).unwrap().is_none());
        let plain = f32_to_f16_bytes(&weights(4096));
        let stored = compress(&plain, 2).unwrap().unwrap();
        let mut out = vec![0u8; plain.len()];
        assert!(decompress(&stored[..3], 2, &mut out).is_err());
        assert!(decompress(&stored[..stored.len() - 1], 2, &mut out).is_err());
        let mut bad = stored.clone();
        bad[PREFIX + 5] ^= 0xff;
        assert!(decompress(&bad, 2, &mut out).is_err() || out != plain);
    }
}
