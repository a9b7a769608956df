//! Exponentials, logarithms, powers and trigonometry with the same bits on
//! every machine, and the activations built from them.
//!
//! The platform's math library is not one library: glibc on Linux, Apple's
//! libm on macOS, and they round some values differently (glibc's own
//! `log1pf` gave two fixtures' softplus gates other bits on aarch64 than on
//! x86-64, and so their logits). Every transcendental function the
//! engine's numerics use comes from here, from the `libm` crate: plain
//! Rust that every target compiles alike, so a Mac computes the bits
//! x86-64 computes. `engine/clippy.toml` refuses std's methods in the
//! engine, so none comes back by accident. (Attention's softmax has its
//! own vector exponential, made of exactly rounded operations: see
//! `softmax`.)

/// The functions, for f32 and f64 alike (RoPE's tables are made in f64).
pub trait Real: Copy {
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
}

/// `exp` is the double-precision table method of Arm's optimized routines
/// (also glibc's and musl's `expf`): on every f32 it gives glibc's bits but
/// two, within 0.5 ulp of the exact value, as fast (3.3 ns here). `libm`'s
/// own `expf` (FreeBSD's, in single precision) differs from glibc's on 10 %
/// of inputs, and moved a Gated DeltaNet fixture's logits from 6.6e-5 of
/// transformers' to 1.03e-4. The others, which only build tables (RoPE's
/// angles, scales), run in f64 and are rounded once.
impl Real for f32 {
    fn exp(self) -> f32 {
        expf(self)
    }
    fn ln(self) -> f32 {
        libm::log(f64::from(self)) as f32
    }
    fn powf(self, e: f32) -> f32 {
        libm::pow(f64::from(self), f64::from(e)) as f32
    }
    fn sin(self) -> f32 {
        libm::sin(f64::from(self)) as f32
    }
    fn cos(self) -> f32 {
        libm::cos(f64::from(self)) as f32
    }
}

/// `2^(i/32)`'s bits less `i/32` in the exponent field, for `i` in 0..32:
/// added to `k << 47`, they are `2^(k/32)` (`k mod 32 = i`).
const EXP_TABLE_BITS: u32 = 5;
const EXP_TABLE: [u64; 1 << EXP_TABLE_BITS] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// The table's steps per doubling.
const EXP_STEPS: f64 = (1u64 << EXP_TABLE_BITS) as f64;

/// `1.mantissa × 2^exponent`, as a hexadecimal float literal would write it.
const fn hex_float(mantissa: u64, exponent: i64) -> f64 {
    f64::from_bits((((1023 + exponent) as u64) << 52) | mantissa)
}

/// `32 / ln 2`.
const EXP_INV_LN2_STEPS: f64 = hex_float(0x71547652b82fe, 0) * EXP_STEPS;
/// Added and taken away, it rounds to an integer in the low mantissa bits.
const EXP_SHIFT: f64 = hex_float(0x8000000000000, 52);
/// The polynomial for `2^(r/32)`, scaled for the table's steps.
const EXP_POLY: [f64; 3] = [
    hex_float(0xc6af84b912394, -5) / (EXP_STEPS * EXP_STEPS * EXP_STEPS),
    hex_float(0xebfce50fac4f3, -3) / (EXP_STEPS * EXP_STEPS),
    hex_float(0x62e42ff0c52d6, -1) / EXP_STEPS,
];
/// Above this, `e^x` overflows f32; below [`EXP_UNDERFLOW`] it rounds to 0.
const EXP_OVERFLOW: f32 = f32::from_bits(0x42b1_7217);
const EXP_UNDERFLOW: f32 = f32::from_bits(0xc2cf_f1b4);

/// `e^x` in f32 (see `impl Real for f32`): `x / ln 2` split into `k/32 + r`,
/// `2^(k/32)` from the table and `2^r` from a cubic, in f64, rounded once.
fn expf(x: f32) -> f32 {
    let top = (x.to_bits() >> 20) & 0x7ff;
    if top >= (88f32.to_bits() >> 20) {
        if x == f32::NEG_INFINITY {
            return 0.0;
        }
        if top >= (f32::INFINITY.to_bits() >> 20) {
            return x + x;
        }
        if x > EXP_OVERFLOW {
            return f32::INFINITY;
        }
        if x < EXP_UNDERFLOW {
            return 0.0;
        }
    }
    let z = EXP_INV_LN2_STEPS * f64::from(x);
    let kd = z + EXP_SHIFT;
    let ki = kd.to_bits();
    let r = z - (kd - EXP_SHIFT);
    let t =
        EXP_TABLE[(ki % (1 << EXP_TABLE_BITS)) as usize].wrapping_add(ki << (52 - EXP_TABLE_BITS));
    let s = f64::from_bits(t);
    let p = EXP_POLY[0] * r + EXP_POLY[1];
    let y = EXP_POLY[2] * r + 1.0;
    ((p * (r * r) + y) * s) as f32
}

impl Real for f64 {
    fn exp(self) -> f64 {
        libm::exp(self)
    }
    fn ln(self) -> f64 {
        libm::log(self)
    }
    fn powf(self, e: f64) -> f64 {
        libm::pow(self, e)
    }
    fn sin(self) -> f64 {
        libm::sin(self)
    }
    fn cos(self) -> f64 {
        libm::cos(self)
    }
}

/// `e^x`.
#[inline]
pub fn exp<T: Real>(x: T) -> T {
    x.exp()
}

/// The natural logarithm.
#[inline]
pub fn ln<T: Real>(x: T) -> T {
    x.ln()
}

/// `x^e`.
#[inline]
pub fn powf<T: Real>(x: T, e: T) -> T {
    x.powf(e)
}

#[inline]
pub fn sin<T: Real>(x: T) -> T {
    x.sin()
}

#[inline]
pub fn cos<T: Real>(x: T) -> T {
    x.cos()
}

/// `ln(1 + x)`.
#[inline]
pub fn log1p(x: f32) -> f32 {
    libm::log1pf(x)
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `x · sigmoid(x)`, as `x / (1 + e^-x)`: torch's order.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// Above this, `softplus(x)` is `x` (torch's threshold).
pub const SOFTPLUS_THRESHOLD: f32 = 20.0;

/// `ln(1 + e^x)`, and `x` itself above [`SOFTPLUS_THRESHOLD`].
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > SOFTPLUS_THRESHOLD {
        x
    } else {
        log1p(exp(x))
    }
}

/// Softmax of a short row (router scores, compressed slots) in plain
/// order: the exponentials of `x − max`, each over their sum.
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = x.iter().map(|v| exp(v - max)).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

#[cfg(test)]
// Inputs and references for the tests, not answers: std's functions do.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    /// Within an ulp or two of f64's values: the same functions, not
    /// approximations of them.
    #[test]
    fn the_functions_are_what_they_say() {
        for i in -200..200 {
            let x = i as f32 * 0.173;
            let close = |got: f32, want: f64| {
                let tol = want.abs() * 4.0 * f32::EPSILON as f64 + 1e-30;
                assert!((got as f64 - want).abs() <= tol, "{x}: {got} vs {want}");
            };
            close(exp(x), (x as f64).exp());
            close(sin(x), (x as f64).sin());
            close(cos(x), (x as f64).cos());
            if x > 0.0 {
                close(ln(x), (x as f64).ln());
                close(powf(x, 0.37), (x as f64).powf(0.37));
            }
            if x > -1.0 {
                close(log1p(x), (x as f64).ln_1p());
            }
        }
        // Every f32 from -104 to 89 in 2^-10 steps: within half an ulp.
        for i in -(104 << 10)..(89 << 10) {
            let x = i as f32 / 1024.0;
            let want = (x as f64).exp();
            if want < f32::MIN_POSITIVE as f64 || want > f32::MAX as f64 {
                continue;
            }
            let ulp = (want as f32).abs() as f64 * f32::EPSILON as f64;
            assert!((exp(x) as f64 - want).abs() <= 0.501 * ulp, "{x}");
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(100f32), f32::INFINITY);
        assert_eq!(exp(-110f32), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(softplus(30.0), 30.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }
}
