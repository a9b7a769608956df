//! Throughput of the matrix kernels on shapes a decode step and a prefill
//! meet: `cargo run --release --example kernel_speed`.

use std::time::Instant;

use longhaul_engine::kernels::format::f32_to_f16_bytes;
use longhaul_engine::kernels::{Format, Matrix};

/// Restoring a compressed F16 record of 3 MiB (an expert of the 5.1 GB
/// Qwen3-MoE): record bytes per second on one core.
fn decompress_speed() {
    // Normal weights (std 0.02) through Box–Muller, as initialised models hold.
    let mut state = 1u64;
    let mut uniform = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    };
    let w: Vec<f32> = (0..3 << 19)
        .map(|_| {
            let (a, b) = (uniform(), uniform());
            0.02 * (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos()
        })
        .collect();
    let plain = f32_to_f16_bytes(&w);
    let stored = longhaul_engine::pack::compress::compress(&plain, 2)
        .unwrap()
        .unwrap();
    let mut out = vec![0u8; plain.len()];
    let reps = 200;
    let started = Instant::now();
    for _ in 0..reps {
        longhaul_engine::pack::compress::decompress(&stored, 2, &mut out).unwrap();
    }
    let secs = started.elapsed().as_secs_f64() / reps as f64;
    println!(
        "restore a {:.1} MB F16 record stored as {:.1} MB: {:.3} ms, {:.2} GB/s of record",
        plain.len() as f64 / 1e6,
        stored.len() as f64 / 1e6,
        secs * 1e3,
        plain.len() as f64 / secs / 1e9
    );
}

/// A warm decode step's experts: 192 experts of 3 MiB (F16), each a
/// [1024x1024] and a [1024x512] product, from DRAM, four to a compute thread
/// at a time as the MoE layer runs them.
fn experts_from_dram() {
    let experts: Vec<(Matrix, Matrix)> = (0..192)
        .map(|e| {
            let w: Vec<f32> = (0..1536 * 1024)
                .map(|i| (((i + e) % 97) as f32 - 48.0) * 1e-3)
                .collect();
            let bytes = f32_to_f16_bytes(&w);
            (
                Matrix::from_bytes(1024, 1024, Format::F16, &bytes[..1024 * 1024 * 2]).unwrap(),
                Matrix::from_bytes(1024, 512, Format::F16, &bytes[1024 * 1024 * 2..]).unwrap(),
            )
        })
        .collect();
    let x: Vec<f32> = (0..1024).map(|i| (i % 89) as f32 * 1e-2).collect();
    let started = Instant::now();
    for (gu, d) in &experts {
        let h = gu.matmul_serial(&x, 1).unwrap();
        std::hint::black_box(d.matmul_serial(&h[..512], 1).unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "192 experts from DRAM on one thread: {:.2} ms ({:.1} GB/s)",
        secs * 1e3,
        192.0 * 3.0 * 1048576.0 / secs / 1e9
    );
    for round in 0..3 {
        let started = Instant::now();
        longhaul_engine::kernels::on_compute_threads(|| {
            use rayon::prelude::*;
            for layer in experts.chunks(8) {
                layer.par_iter().for_each(|(gu, d)| {
                    let h = gu.matmul_serial(&x, 1).unwrap();
                    std::hint::black_box(d.matmul_serial(&h[..512], 1).unwrap());
                });
            }
        });
        let secs = started.elapsed().as_secs_f64();
        println!(
            "192 experts from DRAM, 8 at a time, round {round}: {:.2} ms ({:.1} GB/s)",
            secs * 1e3,
            192.0 * 3.0 * 1048576.0 / secs / 1e9
        );
    }
}

fn main() {
    experts_from_dram();
    decompress_speed();
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
