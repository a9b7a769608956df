//! A weight matrix at its stored width, and products with it.
//!
//! `matmul` computes `y[t][r] = Σ_k W[r][k] · x[t][k]` for a batch of rows
//! `x[t]`. Each weight row is decoded once into f32 (in L1/L2-sized tiles) and
//! then dotted with up to four input rows at a time in the canonical order of
//! [`super::dot`], so every output is what a one-row product gives: batched
//! prefill and one-token steps agree bitwise. Rows of `W` are split among the
//! compute threads; which thread computes a row changes nothing either.

use std::sync::Arc;

use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use super::dot::{LANES, axpy, finish};
use super::format::{Format, decode_row};
use super::{Isa, KernelError, dispatch, fast, kquant};
use crate::aligned::{AlignedBytes, WEIGHT_ALIGN};

/// Weight rows decoded and computed together.
const ROW_TILE: usize = 4;
/// Input rows dotted with a decoded weight tile at once.
const TOKEN_TILE: usize = 4;
/// Below this many multiply-adds a product runs on the calling thread: the
/// hand-off to the other compute thread costs more than it saves. Keeping
/// products up to 2^18 (a router's) on one thread measured 3% slower warm.
const PARALLEL_MIN_WORK: usize = 1 << 16;
/// Row ranges per compute thread, so a thread slowed by other work (a reader
/// checking a record) does not hold the product up.
const PARTS_PER_THREAD: usize = 2;

/// The bytes behind a matrix: its own buffer or a range of a shared one (an
/// expert record read from a drive holds both of its matrices in one buffer).
type Bytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A `[rows, cols]` matrix stored row by row in one [`Format`].
#[derive(Clone)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    format: Format,
    row_bytes: usize,
    bytes: Bytes,
    /// Offset of row 0 in `bytes`.
    start: usize,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Matrix[{}x{} {}]",
            self.rows,
            self.cols,
            self.format.name()
        )
    }
}

impl Matrix {
    fn layout(rows: usize, cols: usize, format: Format) -> Result<(usize, usize), KernelError> {
        let row_bytes = format
            .row_bytes(cols)
            .ok_or(KernelError::PartialBlock { cols, format })?;
        let len = row_bytes
            .checked_mul(rows)
            .ok_or(KernelError::TooLarge { rows, cols })?;
        Ok((row_bytes, len))
    }

    /// A matrix over its own copy of `bytes`.
    pub fn from_bytes(
        rows: usize,
        cols: usize,
        format: Format,
        bytes: &[u8],
    ) -> Result<Self, KernelError> {
        let (row_bytes, len) = Self::layout(rows, cols, format)?;
        if bytes.len() != len {
            return Err(KernelError::Length {
                rows,
                cols,
                format,
                expected: len,
                found: bytes.len(),
            });
        }
        let owned = AlignedBytes::copy_from(bytes, WEIGHT_ALIGN)?;
        Ok(Self {
            rows,
            cols,
            format,
            row_bytes,
            bytes: Arc::new(owned),
            start: 0,
        })
    }

    /// A matrix over `bytes[start..]` of a buffer shared with other matrices.
    /// The buffer should be aligned for the format's element type.
    pub fn shared(
        rows: usize,
        cols: usize,
        format: Format,
        bytes: Bytes,
        start: usize,
    ) -> Result<Self, KernelError> {
        let (row_bytes, len) = Self::layout(rows, cols, format)?;
        let available = (*bytes).as_ref().len().saturating_sub(start);
        if available < len {
            return Err(KernelError::Length {
                rows,
                cols,
                format,
                expected: len,
                found: available,
            });
        }
        Ok(Self {
            rows,
            cols,
            format,
            row_bytes,
            bytes,
            start,
        })
    }

    /// An f32 matrix holding `values` (`rows × cols`, row by row).
    pub fn from_f32(rows: usize, cols: usize, values: &[f32]) -> Result<Self, KernelError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(rows, cols, Format::F32, &bytes)
    }

    /// The rows of `parts` (same format and width) one after another, in a
    /// new buffer.
    pub fn stack(parts: &[&Matrix]) -> Result<Self, KernelError> {
        let first = parts.first().ok_or(KernelError::Shape {
            what: "stacked matrices",
            expected: 1,
            found: 0,
        })?;
        let mut bytes = Vec::new();
        let mut rows = 0;
        for p in parts {
            if p.format != first.format {
                return Err(KernelError::MixedFormats {
                    first: first.format,
                    other: p.format,
                });
            }
            if p.cols != first.cols {
                return Err(KernelError::Shape {
                    what: "stacked matrix width",
                    expected: first.cols,
                    found: p.cols,
                });
            }
            bytes.extend_from_slice(p.bytes());
            rows += p.rows;
        }
        Self::from_bytes(rows, first.cols, first.format, &bytes)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Bytes the stored elements take.
    pub fn stored_bytes(&self) -> u64 {
        (self.row_bytes * self.rows) as u64
    }

    /// The stored bytes of every row, in order.
    pub fn stored(&self) -> &[u8] {
        self.bytes()
    }

    /// Bytes one stored row takes.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Whether no other matrix shares this one's storage, so that dropping
    /// it gives its bytes back.
    pub fn owns_storage(&self) -> bool {
        Arc::strong_count(&self.bytes) == 1
    }

    fn bytes(&self) -> &[u8] {
        let len = self.row_bytes * self.rows;
        &(*self.bytes).as_ref()[self.start..self.start + len]
    }

    /// Rows `first .. first + count` as a matrix sharing this one's storage.
    pub fn row_range(&self, first: usize, count: usize) -> Result<Self, KernelError> {
        if first.checked_add(count).is_none_or(|end| end > self.rows) {
            return Err(KernelError::Shape {
                what: "row range",
                expected: self.rows,
                found: first.saturating_add(count),
            });
        }
        Ok(Self {
            rows: count,
            start: self.start + first * self.row_bytes,
            bytes: Arc::clone(&self.bytes),
            ..*self
        })
    }

    fn row_slice(&self, r: usize) -> &[u8] {
        &self.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Row `r` in f32 (`out` is `cols` long).
    pub fn row_into(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if r >= self.rows || out.len() != self.cols {
            return Err(KernelError::Shape {
                what: "row",
                expected: self.cols,
                found: out.len(),
            });
        }
        dispatch(
            Isa::Best,
            Decode {
                format: self.format,
                bytes: self.row_slice(r),
                out,
            },
        );
        Ok(())
    }

    /// The whole matrix in f32, row by row.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            decode_row(self.format, self.row_slice(r), o);
        }
        out
    }

    /// `y[t] = W · x[t]` for the `n` rows of `x` (`n × cols`); `y` is `n × rows`.
    pub fn matmul(&self, x: &[f32], n: usize) -> Result<Vec<f32>, KernelError> {
        self.matmul_on(x, n, Isa::Best)
    }

    /// Like [`Matrix::matmul`], on the calling thread only: for work that is
    /// already spread over the compute threads at a coarser grain.
    pub fn matmul_serial(&self, x: &[f32], n: usize) -> Result<Vec<f32>, KernelError> {
        self.product(x, n, Isa::Best, false)
    }

    pub(crate) fn matmul_on(&self, x: &[f32], n: usize, isa: Isa) -> Result<Vec<f32>, KernelError> {
        self.product(x, n, isa, true)
    }

    fn product(&self, x: &[f32], n: usize, isa: Isa, split: bool) -> Result<Vec<f32>, KernelError> {
        if x.len() != n * self.cols {
            return Err(KernelError::Shape {
                what: "matmul input",
                expected: n * self.cols,
                found: x.len(),
            });
        }
        let mut by_row = vec![0f32; self.rows * n];
        if self.rows == 0 || n == 0 {
            return Ok(by_row);
        }
        let work = self.rows * self.cols * n;
        let parts = if !split || work < PARALLEL_MIN_WORK {
            1
        } else {
            rayon::current_num_threads() * PARTS_PER_THREAD
        };
        let per_part = self.rows.div_ceil(parts).next_multiple_of(ROW_TILE);
        // k-quants are computed blockwise, with the sums of `x` over each
        // sub-block taken once here for every row range.
        let blockwise = kquant::layout(self.format);
        let sums = blockwise.map(|l| kquant::x_sums(l, x)).unwrap_or_default();
        let run = |(p, out): (usize, &mut [f32])| {
            let first = p * per_part;
            let count = out.len() / n;
            let bytes = &self.bytes()[first * self.row_bytes..(first + count) * self.row_bytes];
            if isa == Isa::Best
                && n == 1
                && fast::matvec(self.format, bytes, self.row_bytes, count, x, &sums, out)
            {
                return;
            }
            if isa == Isa::Best
                && (2..=fast::each_max_inputs(self.format)).contains(&n)
                && fast::matvec_each(self.format, bytes, self.row_bytes, count, x, n, &sums, out)
            {
                return;
            }
            if let Some(layout) = blockwise {
                let op = kquant::Rows {
                    format: self.format,
                    layout,
                    bytes,
                    row_bytes: self.row_bytes,
                    cols: self.cols,
                    x,
                    xs: &sums,
                    n,
                    out,
                };
                dispatch(isa, op);
                return;
            }
            let op = RowRange {
                m: self,
                x,
                n,
                first,
                count,
                out,
            };
            dispatch(isa, op);
        };
        if parts == 1 {
            run((0, by_row.as_mut_slice()));
        } else {
            by_row
                .par_chunks_mut(per_part * n)
                .enumerate()
                .for_each(run);
        }
        if n == 1 {
            return Ok(by_row);
        }
        let mut y = vec![0f32; n * self.rows];
        for (r, col) in by_row.chunks_exact(n).enumerate() {
            for (t, v) in col.iter().enumerate() {
                y[t * self.rows + r] = *v;
            }
        }
        Ok(y)
    }

    /// `y[t] = Σ_i x[t][i] · W[i]` (a row vector times the matrix) for the `n`
    /// rows of `x` (`n × rows`); `y` is `n × cols`. Rows of `W` are added in
    /// increasing order, so each output row is independent of the others.
    pub fn vecmat(&self, x: &[f32], n: usize) -> Result<Vec<f32>, KernelError> {
        if x.len() != n * self.rows {
            return Err(KernelError::Shape {
                what: "vecmat input",
                expected: n * self.rows,
                found: x.len(),
            });
        }
        let mut y = vec![0f32; n * self.cols];
        dispatch(
            Isa::Best,
            VecMat {
                m: self,
                x,
                n,
                y: &mut y,
            },
        );
        Ok(y)
    }
}

struct Decode<'a> {
    format: Format,
    bytes: &'a [u8],
    out: &'a mut [f32],
}

impl WithSimd for Decode<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) {
        decode_row(self.format, self.bytes, self.out);
    }
}

/// Computes weight rows `first .. first + count` for every input row into
/// `out`, laid out `[count][n]`.
struct RowRange<'a> {
    m: &'a Matrix,
    x: &'a [f32],
    n: usize,
    first: usize,
    count: usize,
    out: &'a mut [f32],
}

impl WithSimd for RowRange<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let RowRange {
            m,
            x,
            n,
            first,
            count,
            out,
        } = self;
        let cols = m.cols;
        let token_tile = token_tile::<S>();
        let mut decoded = vec![0f32; ROW_TILE * cols];
        // Resolved once: the storage sits behind a shared trait object.
        let bytes = m.bytes();
        let row = |r: usize| &bytes[r * m.row_bytes..(r + 1) * m.row_bytes];
        let mut r = 0;
        while r < count {
            let rows = ROW_TILE.min(count - r);
            for (i, buf) in decoded.chunks_exact_mut(cols).take(rows).enumerate() {
                decode_row(m.format, row(first + r + i), buf);
            }
            let mut t = 0;
            while t < n {
                let tokens = token_tile.min(n - t);
                let xs = |k: usize| &x[(t + k) * cols..(t + k + 1) * cols];
                if rows == ROW_TILE {
                    let w: [&[f32]; ROW_TILE] =
                        std::array::from_fn(|i| &decoded[i * cols..(i + 1) * cols]);
                    let sums = tile_rows(simd, w, tokens, &xs);
                    for (i, row) in sums.iter().enumerate() {
                        out[(r + i) * n + t..(r + i) * n + t + tokens]
                            .copy_from_slice(&row[..tokens]);
                    }
                } else {
                    for i in 0..rows {
                        let w = [&decoded[i * cols..(i + 1) * cols]];
                        let sums = tile_rows(simd, w, tokens, &xs);
                        out[(r + i) * n + t..(r + i) * n + t + tokens]
                            .copy_from_slice(&sums[0][..tokens]);
                    }
                }
                t += tokens;
            }
            r += rows;
        }
    }
}

/// Input rows per tile: as many as keep the `ROW_TILE × tokens` sums, four
/// weight registers and an input register within the register file.
#[inline(always)]
fn token_tile<S: Simd>() -> usize {
    let per_sum = (LANES / S::F32_LANES).max(1);
    let free = S::REGISTER_COUNT.saturating_sub(ROW_TILE + 1);
    (free / (ROW_TILE * per_sum)).clamp(1, TOKEN_TILE)
}

/// Dots `R` decoded weight rows with `tokens` (1–4) input rows.
#[inline(always)]
fn tile_rows<'x, S: Simd, const R: usize>(
    simd: S,
    w: [&[f32]; R],
    tokens: usize,
    xs: &impl Fn(usize) -> &'x [f32],
) -> [[f32; TOKEN_TILE]; R] {
    let mut out = [[0f32; TOKEN_TILE]; R];
    match tokens {
        1 => put(&mut out, tile::<S, R, 1>(simd, w, [xs(0)])),
        2 => put(&mut out, tile::<S, R, 2>(simd, w, [xs(0), xs(1)])),
        3 => put(&mut out, tile::<S, R, 3>(simd, w, [xs(0), xs(1), xs(2)])),
        _ => put(
            &mut out,
            tile::<S, R, 4>(simd, w, [xs(0), xs(1), xs(2), xs(3)]),
        ),
    }
    out
}

#[inline(always)]
fn put<const R: usize, const T: usize>(out: &mut [[f32; TOKEN_TILE]; R], sums: [[f32; T]; R]) {
    for (o, s) in out.iter_mut().zip(sums) {
        o[..T].copy_from_slice(&s);
    }
}

/// `R × T` dot products of equal-length rows, each in the canonical order.
///
/// A lane's running sum depends only on the elements that fall into it, so
/// the sixteen lanes are computed one register's width at a time: each pass
/// keeps exactly `R × T` accumulators, which fit the register file.
#[inline(always)]
fn tile<S: Simd, const R: usize, const T: usize>(
    simd: S,
    w: [&[f32]; R],
    x: [&[f32]; T],
) -> [[f32; T]; R] {
    let width = S::F32_LANES;
    let cols = w[0].len();
    let full = cols / LANES * LANES;
    let mut lanes = [[[0f32; LANES]; T]; R];
    let mut j = 0;
    while j < LANES {
        let mut acc = [[simd.splat_f32s(0.0); T]; R];
        let mut k = j;
        while k < full {
            for r in 0..R {
                let (wv, _) = S::as_simd_f32s(&w[r][k..k + width]);
                for t in 0..T {
                    let (xv, _) = S::as_simd_f32s(&x[t][k..k + width]);
                    acc[r][t] = simd.mul_add_f32s(wv[0], xv[0], acc[r][t]);
                }
            }
            k += LANES;
        }
        for r in 0..R {
            for t in 0..T {
                let (out, _) = S::as_mut_simd_f32s(&mut lanes[r][t][j..j + width]);
                out[0] = acc[r][t];
            }
        }
        j += width;
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            out[r][t] = finish(lanes[r][t], &w[r][full..], &x[t][full..]);
        }
    }
    out
}

struct VecMat<'a> {
    m: &'a Matrix,
    x: &'a [f32],
    n: usize,
    y: &'a mut [f32],
}

impl WithSimd for VecMat<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let VecMat { m, x, n, y } = self;
        let (rows, cols) = (m.rows, m.cols);
        let bytes = m.bytes();
        let mut row = vec![0f32; cols];
        for i in 0..rows {
            decode_row(
                m.format,
                &bytes[i * m.row_bytes..(i + 1) * m.row_bytes],
                &mut row,
            );
            for t in 0..n {
                axpy(
                    simd,
                    &mut y[t * cols..(t + 1) * cols],
                    x[t * rows + i],
                    &row,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::format::f32_to_f16_bytes;
    use proptest::prelude::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(40503));
                (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * rows];
        for t in 0..n {
            for r in 0..rows {
                y[t * rows + r] = super::super::dot::dot(
                    pulp::Scalar,
                    &w[r * cols..(r + 1) * cols],
                    &x[t * cols..(t + 1) * cols],
                );
            }
        }
        y
    }

    fn abs(v: &[f32]) -> Vec<f32> {
        v.iter().map(|x| x.abs()).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// `rows` rows of `cols` weights stored as `format`, from arbitrary
    /// bytes (`salt` varies them) with each block's scale bytes kept in a
    /// realistic range, so that every weight is finite.
    fn stored_bytes(format: Format, rows: usize, cols: usize, salt: usize) -> Vec<u8> {
        let row_bytes = format.row_bytes(cols).unwrap();
        let mut bytes: Vec<u8> = (0..rows * row_bytes)
            .map(|i| ((i + salt).wrapping_mul(2654435761) >> 7) as u8)
            .collect();
        let block_bytes = format.block_bytes();
        for (i, b) in bytes.iter_mut().enumerate() {
            let at = i % row_bytes % block_bytes;
            match format {
                Format::Mxfp4 if at == 0 => *b = 110 + *b % 30,
                Format::Int4G32 if at == 1 => *b = 0x3C + *b % 2,
                Format::Fp8Block if at < 4 => *b = [0, 0, 0x80, 0x3C][at],
                Format::Fp8Block if *b & 0x7F == 0x7F => *b = 0x10,
                Format::Iq4Nl
                | Format::Iq4Xs
                | Format::Iq2Xxs
                | Format::Iq2Xs
                | Format::Iq2S
                | Format::Iq3Xxs
                | Format::Iq3S
                | Format::Iq1S
                    if at == 1 =>
                {
                    *b = 0x20 + *b % 8
                }
                Format::Iq1M if matches!(at, 49 | 51 | 53 | 55) => *b = 0x30 | (*b & 0x0F),
                Format::Mxfp4Ggml if at == 0 => *b = 110 + *b % 30,
                // F16 scales (Q8_0's and the k-quants' `d`, `dmin`) between
                // 2^-14 and 2^-7: the top byte of a little-endian half.
                Format::Q8_0 | Format::Q4_0 | Format::Q5_0 if at == 1 => *b = 0x04 + *b % 0x1C,
                Format::Q4_1 | Format::Q5_1 | Format::Q4K | Format::Q5K if at == 1 || at == 3 => {
                    *b = 0x04 + *b % 0x1C
                }
                // At the end of the block (Q3_K's and Q6_K's `d`; Q2_K's `d`
                // and `dmin`); the other byte set is a scale, any value.
                Format::Q2K | Format::Q3K | Format::Q6K
                    if at + 1 == block_bytes || at + 3 == block_bytes =>
                {
                    *b = 0x04 + *b % 0x1C
                }
                _ => {}
            }
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any batch, any thread split, any instruction set: each output is
        /// the canonical dot product of its two rows.
        #[test]
        fn every_output_is_its_rows_dot_product(
            rows in 1usize..70,
            cols in 1usize..300,
            n in 1usize..20,
            seed in 0u32..1000,
        ) {
            let w = values(rows * cols, seed);
            let x = values(n * cols, seed + 1);
            let m = Matrix::from_f32(rows, cols, &w).unwrap();
            let want = bits(&reference(&w, &x, rows, cols, n));
            prop_assert_eq!(bits(&m.matmul(&x, n).unwrap()), want.clone());
            prop_assert_eq!(bits(&m.matmul_on(&x, n, Isa::Scalar).unwrap()), want);
            for t in 0..n {
                let one = m.matmul(&x[t * cols..(t + 1) * cols], 1).unwrap();
                prop_assert_eq!(bits(&one), bits(&m.matmul(&x, n).unwrap()[t * rows..(t + 1) * rows]));
            }
            // F16 weights: one-row products take the widening fast path where
            // the machine has one; they agree with the portable path bitwise.
            // So do BF16 ones (the top halves of the f32 weights).
            let bf16: Vec<u8> = w.iter().flat_map(|v| v.to_bits().to_le_bytes()[2..].to_vec()).collect();
            let narrow = [
                Matrix::from_bytes(rows, cols, Format::F16, &f32_to_f16_bytes(&w)).unwrap(),
                Matrix::from_bytes(rows, cols, Format::BF16, &bf16).unwrap(),
            ];
            for h in &narrow {
                let widened = h.to_f32();
                let mut every = Vec::new();
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    let want = bits(&reference(&widened, xt, rows, cols, 1));
                    prop_assert_eq!(bits(&h.matmul(xt, 1).unwrap()), want.clone());
                    prop_assert_eq!(bits(&h.matmul_on(xt, 1, Isa::Scalar).unwrap()), want.clone());
                    every.extend(want);
                }
                // Up to sixteen rows at once go through the fused inputs
                // path, more through the portable tiles: the same bits.
                prop_assert_eq!(bits(&h.matmul(&x, n).unwrap()), every.clone());
                prop_assert_eq!(bits(&h.matmul_on(&x, n, Isa::Scalar).unwrap()), every);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        /// Every stored format, any shape and batch: the fast paths this
        /// machine has (AVX-512 on x86-64, NEON on aarch64) give the
        /// portable path's bits.
        #[test]
        fn every_format_gives_the_portable_bits(
            rows in 1usize..20,
            blocks in 1usize..4,
            n in 1usize..10,
            seed in 0u32..1000,
        ) {
            for format in crate::kernels::format::FORMATS.map(|r| r.format) {
                // Plain floats get rows with a tail past the last sixteen.
                let cols = blocks * if format.block() == 1 { 37 } else { format.block() };
                let w = values(rows * cols, seed);
                let m = match format {
                    Format::F32 => Matrix::from_f32(rows, cols, &w),
                    Format::F16 => Matrix::from_bytes(rows, cols, format, &f32_to_f16_bytes(&w)),
                    Format::BF16 => {
                        let top: Vec<u8> = w.iter().flat_map(|v| v.to_bits().to_le_bytes()[2..].to_vec()).collect();
                        Matrix::from_bytes(rows, cols, format, &top)
                    }
                    _ => Matrix::from_bytes(rows, cols, format, &stored_bytes(format, rows, cols, seed as usize)),
                }
                .unwrap();
                let x = values(n * cols, seed + 1);
                for k in [1, n] {
                    let xk = &x[..k * cols];
                    prop_assert_eq!(
                        bits(&m.matmul(xk, k).unwrap()),
                        bits(&m.matmul_on(xk, k, Isa::Scalar).unwrap()),
                        "{:?}, {}x{}, {} inputs", format, rows, cols, k
                    );
                }
            }
        }
    }

    #[test]
    fn narrow_and_quantised_weights_compute_as_their_f32_values() {
        let (rows, cols, n) = (37, 512, 5);
        let w = values(rows * cols, 7);
        let x = values(n * cols, 8);
        let f16 = Matrix::from_bytes(rows, cols, Format::F16, &f32_to_f16_bytes(&w)).unwrap();
        let widened = Matrix::from_f32(rows, cols, &f16.to_f32()).unwrap();
        let large = Matrix::from_f32(rows, cols * 300, &values(rows * cols * 300, 9)).unwrap();
        let xl = values(n * cols * 300, 10);
        assert_eq!(
            bits(&f16.matmul(&x, n).unwrap()),
            bits(&widened.matmul(&x, n).unwrap())
        );
        assert_eq!(
            bits(&large.matmul(&xl, n).unwrap()),
            bits(&large.matmul_on(&xl, n, Isa::Scalar).unwrap()),
            "threads and SIMD agree with the scalar path"
        );
        let t = candle_core::Tensor::from_vec(w.clone(), (rows, cols), &candle_core::Device::Cpu)
            .unwrap();
        use candle_core::quantized::GgmlDType as G;
        let quantised = [
            (G::Q8_0, Format::Q8_0),
            (G::Q4K, Format::Q4K),
            (G::Q6K, Format::Q6K),
            (G::Q5K, Format::Q5K),
            (G::Q3K, Format::Q3K),
            (G::Q2K, Format::Q2K),
            (G::Q4_0, Format::Q4_0),
            (G::Q4_1, Format::Q4_1),
            (G::Q5_0, Format::Q5_0),
            (G::Q5_1, Format::Q5_1),
        ];
        for (dtype, format) in quantised {
            let q = candle_core::quantized::QTensor::quantize(&t, dtype).unwrap();
            let m = Matrix::from_bytes(rows, cols, format, &q.data().unwrap()).unwrap();
            let widened = Matrix::from_f32(rows, cols, &m.to_f32()).unwrap();
            // One row takes the fast paths where the machine has them.
            for k in [1, n] {
                let xk = &x[..k * cols];
                let want = widened.matmul(xk, k).unwrap();
                let got = m.matmul(xk, k).unwrap();
                assert_eq!(
                    bits(&m.matmul_on(xk, k, Isa::Scalar).unwrap()),
                    bits(&got),
                    "{format:?}, {k} rows, scalar"
                );
                if !format.is_blockwise() {
                    assert_eq!(bits(&got), bits(&want), "{format:?}, {k} rows");
                    continue;
                }
                // k-quants sum blockwise: the same weights, summed in
                // another order.
                let magnitude = Matrix::from_f32(rows, cols, &abs(&m.to_f32()))
                    .unwrap()
                    .matmul(&abs(xk), k)
                    .unwrap();
                for ((g, w), s) in got.iter().zip(&want).zip(&magnitude) {
                    assert!((g - w).abs() <= 1e-6 * s, "{format:?}: {g} vs {w}");
                }
            }
        }
        // Published block formats from arbitrary bytes (scale bytes kept in a
        // realistic range), one row at a time too: that is where fast paths run.
        // ...and the GGML types candle cannot quantise to.
        let quantised = quantised.map(|(_, f)| f);
        let from_bytes = Format::ggml_blocks().filter(|f| !quantised.contains(f));
        for format in [Format::Mxfp4, Format::Int4G32, Format::Fp8Block]
            .into_iter()
            .chain(from_bytes)
        {
            let bytes = stored_bytes(format, rows, cols, 0);
            let m = Matrix::from_bytes(rows, cols, format, &bytes).unwrap();
            let widened = Matrix::from_f32(rows, cols, &m.to_f32()).unwrap();
            assert!(m.to_f32().iter().all(|v| v.is_finite()), "{format:?}");
            for k in [1, n] {
                assert_eq!(
                    bits(&m.matmul(&x[..k * cols], k).unwrap()),
                    bits(&widened.matmul(&x[..k * cols], k).unwrap()),
                    "{format:?}, {k} rows"
                );
                assert_eq!(
                    bits(&m.matmul_on(&x[..k * cols], k, Isa::Scalar).unwrap()),
                    bits(&widened.matmul(&x[..k * cols], k).unwrap()),
                    "{format:?}, {k} rows, scalar"
                );
            }
        }
    }

    #[test]
    fn vecmat_sums_rows_in_order() {
        let (rows, cols) = (5, 19);
        let w = values(rows * cols, 3);
        let x = values(2 * rows, 4);
        let m = Matrix::from_f32(rows, cols, &w).unwrap();
        let y = m.vecmat(&x, 2).unwrap();
        for t in 0..2 {
            for c in 0..cols {
                let mut s = 0f32;
                for i in 0..rows {
                    s = x[t * rows + i].mul_add(w[i * cols + c], s);
                }
                assert_eq!(y[t * cols + c].to_bits(), s.to_bits());
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(Matrix::from_bytes(2, 48, Format::Q8_0, &[0; 100]).is_err());
        assert!(Matrix::from_bytes(2, 3, Format::F16, &[0; 11]).is_err());
        let m = Matrix::from_f32(2, 3, &[0.0; 6]).unwrap();
        assert!(m.matmul(&[0.0; 5], 2).is_err());
    }
}
