//! The one reduction order every dot product uses.
//!
//! Sixteen running sums: element `k` of a dot product is fused into sum
//! `k mod 16`, in increasing `k`; the sixteen sums are then added as a fixed
//! tree (lane `l` with `l + 8`, then `+ 4`, `+ 2`, `+ 1`). The order depends on
//! nothing but the length, so a row's result is the same however many rows are
//! computed with it, in whichever thread, and on every instruction set: one
//! 512-bit register, two 256-bit ones, four 128-bit ones and the scalar path
//! all hold exactly these sums (a fused multiply-add rounds once everywhere).

use pulp::Simd;

/// Running sums of one dot product, in the canonical order.
pub const LANES: usize = 16;

/// The sixteen running sums of one dot product. Held as sixteen floats, they
/// are one 512-bit register, two 256-bit or four 128-bit ones: the loads and
/// stores around each fused multiply-add vanish once inlined.
#[derive(Clone, Copy)]
pub struct Acc<S: Simd> {
    lanes: [f32; LANES],
    simd: std::marker::PhantomData<S>,
}

impl<S: Simd> Acc<S> {
    #[inline(always)]
    pub fn new(_: S) -> Self {
        Self {
            lanes: [0.0; LANES],
            simd: std::marker::PhantomData,
        }
    }

    /// Fuses one block of sixteen products (`w` and `x` hold sixteen values).
    #[inline(always)]
    pub fn fma(&mut self, simd: S, w: &[f32], x: &[f32]) {
        let (wv, _) = S::as_simd_f32s(w);
        let (xv, _) = S::as_simd_f32s(x);
        let (acc, _) = S::as_mut_simd_f32s(&mut self.lanes);
        for ((a, w), x) in acc.iter_mut().zip(wv).zip(xv) {
            *a = simd.mul_add_f32s(*w, *x, *a);
        }
    }

    /// Fuses the last, shorter block (fewer than sixteen products) and adds
    /// the sums as a fixed tree.
    #[inline(always)]
    pub fn finish(&self, w_tail: &[f32], x_tail: &[f32]) -> f32 {
        finish(self.lanes, w_tail, x_tail)
    }
}

/// Fuses a last, shorter block into sixteen running sums and adds them as a
/// fixed tree.
#[inline(always)]
pub fn finish(mut lanes: [f32; LANES], w_tail: &[f32], x_tail: &[f32]) -> f32 {
    for (l, (a, b)) in w_tail.iter().zip(x_tail).enumerate().take(LANES) {
        lanes[l] = a.mul_add(*b, lanes[l]);
    }
    tree_sum(lanes)
}

/// The sixteen sums added pairwise: `l + 8`, `+ 4`, `+ 2`, `+ 1`.
#[inline(always)]
pub(super) fn tree_sum(mut s: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            s[l] += s[l + width];
        }
        width /= 2;
    }
    s[0]
}

/// `Σ w[k]·x[k]` in the canonical order (`w` and `x` of equal length).
#[inline(always)]
pub fn dot<S: Simd>(simd: S, w: &[f32], x: &[f32]) -> f32 {
    let mut acc = Acc::new(simd);
    let full = w.len().min(x.len()) / LANES * LANES;
    let mut k = 0;
    while k < full {
        acc.fma(simd, &w[k..k + LANES], &x[k..k + LANES]);
        k += LANES;
    }
    acc.finish(&w[full..], &x[full..])
}

/// `out[j] += a · v[j]` for every `j`, fused: the building block of sums over
/// rows (`Σ_i a_i · v_i`), which stay exact as long as rows are added in a
/// fixed order.
#[inline(always)]
pub fn axpy<S: Simd>(simd: S, out: &mut [f32], a: f32, v: &[f32]) {
    let (ov, ot) = S::as_mut_simd_f32s(out);
    let (vv, vt) = S::as_simd_f32s(v);
    let av = simd.splat_f32s(a);
    for (o, x) in ov.iter_mut().zip(vv) {
        *o = simd.mul_add_f32s(av, *x, *o);
    }
    for (o, x) in ot.iter_mut().zip(vt) {
        *o = a.mul_add(*x, *o);
    }
}

#[cfg(test)]
// Inputs and references for the tests, not answers: std's functions do.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn dot_follows_the_canonical_order_on_every_instruction_set() {
        let w: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut lanes = [0f32; LANES];
        for k in 0..w.len() {
            lanes[k % LANES] = w[k].mul_add(x[k], lanes[k % LANES]);
        }
        let want = tree_sum(lanes);
        assert_eq!(dot(pulp::Scalar, &w, &x).to_bits(), want.to_bits());
        struct Dot<'a>(&'a [f32], &'a [f32]);
        impl pulp::WithSimd for Dot<'_> {
            type Output = f32;
            #[inline(always)]
            fn with_simd<S: Simd>(self, simd: S) -> f32 {
                dot(simd, self.0, self.1)
            }
        }
        assert_eq!(
            pulp::Arch::new().dispatch(Dot(&w, &x)).to_bits(),
            want.to_bits()
        );
        let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!((want as f64 - exact).abs() < 1e-5);
    }
}
