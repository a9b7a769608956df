//! Compute kernels: products, norms and attention, from weights at their
//! stored width, batch-invariant by construction.
//!
//! Why our own: decoding is matrix–vector work bound by memory bandwidth, so
//! a weight should be read at the width it is stored in. Widening F16 experts
//! to f32 before every product made the F16 cache 4.3× slower than an f32
//! one (1.73 against 7.45 tok/s warm on a 5.1 GB Qwen3-MoE), so holding twice
//! the experts bought nothing. And a general GEMM picks its blocking from the
//! batch size, so a batched prefill summed in another order than one-token
//! steps; every kernel here reduces in one fixed order ([`dot`]), which makes
//! a row's result independent of the rows computed with it, of the thread
//! that computed it and of the instruction set.
//!
//! Vector code comes from `pulp`: the same Rust is compiled for AVX-512,
//! AVX2+FMA, NEON or plain scalar, and the best one is picked at run time.

pub mod dot;
mod fast;
pub mod format;
pub mod ggml;
pub mod iq;
mod iq_grids;
mod kquant;
pub mod math;
pub mod matrix;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod ops;
mod softmax;
mod tiled;

use std::sync::OnceLock;

pub use format::{FP8_BLOCK, Format, fp8_e4m3_to_f32};
pub use matrix::Matrix;

use crate::aligned::AllocError;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{format:?} stores rows in whole blocks of {}, but a row has {cols} elements", format.block())]
    PartialBlock { cols: usize, format: Format },
    #[error("a {rows}x{cols} matrix is too large to address")]
    TooLarge { rows: usize, cols: usize },
    #[error("a {rows}x{cols} {format:?} matrix takes {expected} bytes, but {found} were given")]
    Length {
        rows: usize,
        cols: usize,
        format: Format,
        expected: usize,
        found: usize,
    },
    #[error("{what}: expected {expected} values, found {found}")]
    Shape {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("matrices stored as {} and {} cannot be stacked into one", first.name(), other.name())]
    MixedFormats { first: Format, other: Format },
    #[error(transparent)]
    Alloc(#[from] AllocError),
}

/// Which instruction set a kernel runs on: the best the machine has, or the
/// portable scalar path (which computes the same bits, slowly; for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Best,
    #[cfg_attr(not(test), allow(dead_code))]
    Scalar,
}

fn best() -> pulp::Arch {
    static ARCH: OnceLock<pulp::Arch> = OnceLock::new();
    *ARCH.get_or_init(pulp::Arch::new)
}

pub(crate) fn dispatch<Op: pulp::WithSimd>(isa: Isa, op: Op) -> Op::Output {
    match isa {
        Isa::Best => best().dispatch(op),
        Isa::Scalar => pulp::Simd::vectorize(pulp::Scalar, op),
    }
}

/// The compute threads: one per core. Readers have threads of their own,
/// but they sleep in system calls and take little CPU.
fn compute_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("longhaul-compute-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Runs `work` on a compute thread, so the products inside it split their
/// rows with the other compute threads without waking a third thread for
/// every product: a decode step makes about 500 of them, and handing each
/// from the caller to the pool cost a quarter of the step in context switches.
pub fn on_compute_threads<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    match compute_pool() {
        Some(pool) => pool.install(work),
        None => work(),
    }
}

/// Which path each format's products take on this machine, by format
/// name: the instruction set of its fast path, or `portable` (the tiles
/// every machine runs; the same bits, slower). [`instruction_set`] alone
/// would name AVX-512 or NEON where every product of a format falls to
/// the portable tiles.
pub fn product_paths() -> Vec<(&'static str, &'static str)> {
    format::FORMATS
        .iter()
        .map(|r| {
            (
                r.format.name(),
                fast::fast_path(r.format).unwrap_or("portable"),
            )
        })
        .collect()
}

/// The instruction set the kernels use on this machine, for reports.
pub fn instruction_set() -> &'static str {
    match best() {
        #[cfg(target_arch = "x86_64")]
        pulp::Arch::V4(_) => "avx512",
        #[cfg(target_arch = "x86_64")]
        pulp::Arch::V3(_) => "avx2+fma",
        #[cfg(target_arch = "aarch64")]
        pulp::Arch::Neon(_) => "neon",
        _ => "scalar",
    }
}
