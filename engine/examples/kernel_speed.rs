//! Throughput of the matrix kernels on shapes a decode step and a prefill
//! meet: `cargo run --release --example kernel_speed`.

use std::time::Instant;

use longhaul_engine::kernels::format::f32_to_f16_bytes;
use longhaul_engine::kernels::{Format, Matrix};

fn main() {
    for (rows, cols, n) in [
        (1024, 1024, 1),
        (1024, 512, 1),
        (1024, 1024, 32),
        (1024, 512, 32),
        (1024, 1024, 256),
        (32000, 1024, 1),
    ] {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
            .collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i % 89) as f32 - 44.0) * 1e-2)
            .collect();
        let m = Matrix::from_bytes(rows, cols, Format::F16, &f32_to_f16_bytes(&w)).unwrap();
        let reps = (2e9 / (rows * cols * n) as f64).clamp(3.0, 2000.0) as usize;
        let started = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(m.matmul(&x, n).unwrap());
        }
        let secs = started.elapsed().as_secs_f64() / reps as f64;
        let flops = 2.0 * (rows * cols * n) as f64 / secs;
        let bytes = (rows * cols * 2) as f64 / secs;
        println!(
            "F16 [{rows}x{cols}] x {n:>3} rows: {:8.3} ms  {:6.1} GFLOP/s  {:5.1} GB/s of weights",
            secs * 1e3,
            flops / 1e9,
            bytes / 1e9
        );
    }
}
