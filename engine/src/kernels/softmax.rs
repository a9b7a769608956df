//! Attention's softmax, in one order on every instruction set.
//!
//! A prompt pass computes one exponential per score: at head size 64 the
//! tiled kernel spends as long on `f32::exp` (a library call per value,
//! 13% of a long prompt's samples) and on summing the row one value at a
//! time as on all its multiply-adds. Here the exponential is a polynomial in
//! vector lanes (Cephes' `expf`: range reduction by ln 2, degree-5
//! polynomial, within 2 ulp; a test checks it against f64) made only of
//! exactly rounded operations, and the sum runs in the dot product's
//! canonical order (sixteen running sums, then the fixed tree). So a row's
//! probabilities are the same bits whichever kernel, instruction set or
//! machine computes them, which the library exponential could not promise
//! across platforms.

use pulp::Simd;

use super::dot::{LANES, tree_sum};

/// Rounds to an integer when added (1.5 · 2^23: the sum's last mantissa
/// bit is worth 1, and the integer sits in its low bits).
const SHIFTER: f32 = 12_582_912.0;
/// ln 2 split in two: `HI` has 9 significant bits, so `n · HI` is exact for
/// every exponent `n` here.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this, e^x is under f32's smallest normal number: taken as 0.
const EXP_MIN: f32 = -87.336_55;
/// Above this, 2^n would overflow the exponent field: inputs are clamped
/// (softmax only ever passes values ≤ 0).
const EXP_MAX: f32 = 88.0;
/// Cephes' minimax polynomial for `(e^r − 1 − r) / r²` on `|r| ≤ ln 2 / 2`.
const POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
/// IEEE single precision: exponent bias and mantissa width.
const EXP_BIAS: u32 = 127;
const MANTISSA_BITS: u32 = 23;

/// e^x in every lane, for `x ≤ 88` (NaN stays NaN, −∞ gives 0).
#[inline(always)]
pub fn exp_f32s<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let xc = simd.min_f32s(
        simd.max_f32s(x, simd.splat_f32s(EXP_MIN)),
        simd.splat_f32s(EXP_MAX),
    );
    let k = simd.mul_add_f32s(
        xc,
        simd.splat_f32s(std::f32::consts::LOG2_E),
        simd.splat_f32s(SHIFTER),
    );
    let n = simd.sub_f32s(k, simd.splat_f32s(SHIFTER));
    let r = simd.mul_add_f32s(n, simd.splat_f32s(-LN2_HI), xc);
    let r = simd.mul_add_f32s(n, simd.splat_f32s(-LN2_LO), r);
    let mut y = simd.splat_f32s(POLY[0]);
    for c in &POLY[1..] {
        y = simd.mul_add_f32s(y, r, simd.splat_f32s(*c));
    }
    let y = simd.mul_add_f32s(y, simd.mul_f32s(r, r), r);
    let y = simd.add_f32s(y, simd.splat_f32s(1.0));
    // 2^n: the integer in k's low bits, moved into the exponent field.
    let bias = EXP_BIAS.wrapping_sub(SHIFTER.to_bits());
    let bits = simd.add_u32s(simd.transmute_u32s_f32s(k), simd.splat_u32s(bias));
    let two_n = simd.wrapping_dyn_shl_u32s(bits, simd.splat_u32s(MANTISSA_BITS));
    let e = simd.mul_f32s(y, simd.transmute_f32s_u32s(two_n));
    let e = simd.select_f32s(
        simd.less_than_f32s(x, simd.splat_f32s(EXP_MIN)),
        simd.splat_f32s(0.0),
        e,
    );
    simd.select_f32s(simd.equal_f32s(x, x), e, x)
}

/// e^x of one value, the same bits as a lane of [`exp_f32s`].
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_f32s(pulp::Scalar, x)
}

/// Softmax of one row in place: `exp(s − max) / Σ`, as if the row had one
/// more logit `sink` that takes its share of the sum and is then dropped
/// (gpt-oss's attention sinks).
#[inline(always)]
pub fn softmax<S: Simd>(simd: S, row: &mut [f32], sink: Option<f32>) {
    let max = row_max(row).max(sink.unwrap_or(f32::NEG_INFINITY));
    let m = simd.splat_f32s(max);
    let (head, tail) = S::as_mut_simd_f32s(row);
    for v in head {
        *v = exp_f32s(simd, simd.sub_f32s(*v, m));
    }
    for s in tail {
        *s = exp(*s - max);
    }
    let sum = row_sum(row) + sink.map_or(0.0, |s| exp(s - max));
    for s in row.iter_mut() {
        *s /= sum;
    }
}

/// The largest value (NaN ignored, as `f32::max` does); the order of a
/// maximum does not change it, so this one is chosen for speed.
fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, x) in lanes.iter_mut().zip(c) {
            *l = l.max(*x);
        }
    }
    rest.iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// `Σ row` in the canonical order: value `k` into running sum `k mod 16`,
/// in increasing `k`, then the sums as the fixed tree.
fn row_sum(row: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, x) in lanes.iter_mut().zip(c) {
            *l += *x;
        }
    }
    for (l, x) in lanes.iter_mut().zip(rest) {
        *l += *x;
    }
    tree_sum(lanes)
}

#[cfg(test)]
// Inputs and references for the tests, not answers: std's functions do.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use crate::kernels::{Isa, dispatch};

    struct Softmax<'a>(&'a mut [f32], Option<f32>);
    impl pulp::WithSimd for Softmax<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            softmax(simd, self.0, self.1)
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value() {
        let mut worst = 0f64;
        for i in 0..=2_000_000 {
            let x = -87.0 + 97.0 * i as f32 / 2_000_000.0;
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            let ulp = (want as f32).abs() as f64 * f32::EPSILON as f64;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    /// The same row gives the same bits on the best instruction set and the
    /// scalar path (ragged length, a sink, masked scores), and sums to one.
    #[test]
    fn softmax_has_one_result_on_every_instruction_set() {
        let row: Vec<f32> = (0..53)
            .map(|i| {
                if i % 11 == 5 {
                    f32::NEG_INFINITY
                } else {
                    ((i * 37 % 29) as f32 - 14.0) * 0.7
                }
            })
            .collect();
        for sink in [None, Some(2.5)] {
            let (mut best, mut scalar) = (row.clone(), row.clone());
            dispatch(Isa::Best, Softmax(&mut best, sink));
            dispatch(Isa::Scalar, Softmax(&mut scalar, sink));
            assert!(
                best.iter()
                    .zip(&scalar)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            let exact: Vec<f64> = row.iter().map(|&s| s as f64).collect();
            let max = exact
                .iter()
                .copied()
                .chain(sink.map(f64::from))
                .fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = exact.iter().map(|s| (s - max).exp()).sum::<f64>()
                + sink.map_or(0.0, |s| (s as f64 - max).exp());
            for (got, s) in best.iter().zip(&exact) {
                assert!((*got as f64 - (s - max).exp() / total).abs() < 1e-7);
            }
        }
    }
}
