//! The one reduction order every dot product uses.
//!
//! Sixteen running sums: element `k` of a dot product is fused into sum
//! `k mod 16`, in increasing `k`; the sixteen sums are then added as a fixed
//! tree (lane `l` with `l + 8`, then `+ 4`, `+ 2`, `+ 1`). The order depends on
//! nothing but the length, so a row's result is the same however many rows are
//! computed with it, in whichever thread, and on every instruction set: one
//! 512-bit register, two 256-bit ones, four 128-bit ones and the scalar path
//! all compute exactly these sums (a fused multiply-add rounds once everywhere).

/// Running sums of one dot product, in the canonical order.
pub const LANES: usize = 16;

#[derive(Debug, Clone, Copy)]
pub struct Acc([f32; LANES]);

impl Default for Acc {
    fn default() -> Self {
        Self::new()
    }
}

impl Acc {
    #[inline(always)]
    pub fn new() -> Self {
        Acc([0.0; LANES])
    }

    /// Fuses one block of sixteen products into the sums.
    #[inline(always)]
    pub fn fma(&mut self, w: &[f32; LANES], x: &[f32; LANES]) {
        for l in 0..LANES {
            self.0[l] = w[l].mul_add(x[l], self.0[l]);
        }
    }

    /// Fuses the last, shorter block (fewer than sixteen products).
    #[inline(always)]
    pub fn fma_tail(&mut self, w: &[f32], x: &[f32]) {
        for (l, (a, b)) in w.iter().zip(x).enumerate().take(LANES) {
            self.0[l] = a.mul_add(*b, self.0[l]);
        }
    }

    /// The sums added as a fixed tree.
    #[inline(always)]
    pub fn sum(&self) -> f32 {
        let mut s = self.0;
        let mut width = LANES / 2;
        while width > 0 {
            for l in 0..width {
                s[l] += s[l + width];
            }
            width /= 2;
        }
        s[0]
    }
}

/// `Σ w[k]·x[k]` in the canonical order (`w` and `x` of equal length).
#[inline(always)]
pub fn dot(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = Acc::new();
    let (wb, wt) = w.as_chunks::<LANES>();
    let (xb, xt) = x.as_chunks::<LANES>();
    for (a, b) in wb.iter().zip(xb) {
        acc.fma(a, b);
    }
    acc.fma_tail(wt, xt);
    acc.sum()
}

/// `out[j] += a · v[j]` for every `j`, fused: the building block of sums over
/// rows (`Σ_i a_i · v_i`), which stay exact as long as rows are added in a
/// fixed order.
#[inline(always)]
pub fn axpy(out: &mut [f32], a: f32, v: &[f32]) {
    for (o, &x) in out.iter_mut().zip(v) {
        *o = a.mul_add(x, *o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_follows_the_canonical_order() {
        let w: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut lanes = [0f32; LANES];
        for k in 0..w.len() {
            lanes[k % LANES] = w[k].mul_add(x[k], lanes[k % LANES]);
        }
        let mut width = LANES / 2;
        while width > 0 {
            for l in 0..width {
                lanes[l] += lanes[l + width];
            }
            width /= 2;
        }
        assert_eq!(dot(&w, &x).to_bits(), lanes[0].to_bits());
        let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!((dot(&w, &x) as f64 - exact).abs() < 1e-5);
    }
}
