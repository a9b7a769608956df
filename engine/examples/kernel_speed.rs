//! Throughput of the matrix kernels on shapes a decode step and a prefill
//! meet: `cargo run --release --example kernel_speed`.

// Random weights for timing: std's functions make them.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Instant;

use longhaul_engine::aligned::AlignedBytes;
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

/// Experts in a warm decode step: 192 of 3 MiB (F16), each a [1024x1024]
/// and a [1024x512] product.
const EXPERTS: usize = 192;
const EXPERT_BYTES: usize = 3 << 20;
const GATE_UP_BYTES: usize = 2 << 20;

/// Expert `e`'s weights as F16 bytes: gate/up rows, then down rows.
fn expert_bytes(e: usize) -> Vec<u8> {
    let w: Vec<f32> = (0..1536 * 1024)
        .map(|i| (((i + e) % 97) as f32 - 48.0) * 1e-3)
        .collect();
    f32_to_f16_bytes(&w)
}

/// Times a decode step's experts from DRAM, eight to a layer, side by side
/// on the compute threads as the MoE layer runs them.
fn time_layers(label: &str, experts: &[(Matrix, Matrix)]) {
    let x: Vec<f32> = (0..1024).map(|i| (i % 89) as f32 * 1e-2).collect();
    let expert = |(gu, d): &(Matrix, Matrix)| {
        let h = gu.matmul_serial(&x, 1).unwrap();
        std::hint::black_box(d.matmul_serial(&h[..512], 1).unwrap());
    };
    let report = |what: String, secs: f64| {
        let gb_s = (EXPERTS * EXPERT_BYTES) as f64 / secs / 1e9;
        println!(
            "{EXPERTS} experts {label}, {what}: {:.2} ms ({gb_s:.1} GB/s)",
            secs * 1e3
        );
    };
    let started = Instant::now();
    experts.iter().for_each(expert);
    report("on one thread".into(), started.elapsed().as_secs_f64());
    for round in 0..3 {
        let started = Instant::now();
        longhaul_engine::kernels::on_compute_threads(|| {
            use rayon::prelude::*;
            for layer in experts.chunks(8) {
                layer.par_iter().for_each(expert);
            }
        });
        report(
            format!("8 at a time, round {round}"),
            started.elapsed().as_secs_f64(),
        );
    }
}

/// Each expert in a buffer of its own, as the cache holds them.
fn experts_apart() {
    let experts: Vec<(Matrix, Matrix)> = (0..EXPERTS)
        .map(|e| {
            let bytes = expert_bytes(e);
            let (gate_up, down) = bytes.split_at(GATE_UP_BYTES);
            (
                Matrix::from_bytes(1024, 1024, Format::F16, gate_up).unwrap(),
                Matrix::from_bytes(1024, 512, Format::F16, down).unwrap(),
            )
        })
        .collect();
    time_layers("in buffers of their own", &experts);
}

/// All experts one after another in one buffer (all of it in huge pages
/// where the system gives them).
fn experts_in_one_buffer() {
    let mut all = AlignedBytes::zeroed(EXPERTS * EXPERT_BYTES, 4096).unwrap();
    for (e, dst) in all
        .as_mut_slice()
        .chunks_exact_mut(EXPERT_BYTES)
        .enumerate()
    {
        dst.copy_from_slice(&expert_bytes(e));
    }
    let all: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(all);
    let experts: Vec<(Matrix, Matrix)> = (0..EXPERTS)
        .map(|e| {
            let at = e * EXPERT_BYTES;
            (
                Matrix::shared(1024, 1024, Format::F16, all.clone(), at).unwrap(),
                Matrix::shared(1024, 512, Format::F16, all.clone(), at + GATE_UP_BYTES).unwrap(),
            )
        })
        .collect();
    time_layers("in one buffer", &experts);
}

/// One decode-step product, [1024x1024] x 1, in each stored format: how
/// fast a step decodes experts as a GGUF stores them.
fn formats_speed() {
    use candle_core::quantized::{GgmlDType, QTensor};
    let (rows, cols) = (1024, 1024);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
        .collect();
    let t =
        candle_core::Tensor::from_vec(w.clone(), (rows, cols), &candle_core::Device::Cpu).unwrap();
    let x: Vec<f32> = (0..cols).map(|i| ((i % 89) as f32 - 44.0) * 1e-2).collect();
    let quantised = [
        (GgmlDType::Q8_0, Format::Q8_0),
        (GgmlDType::Q4K, Format::Q4K),
        (GgmlDType::Q6K, Format::Q6K),
        (GgmlDType::Q5K, Format::Q5K),
        (GgmlDType::Q3K, Format::Q3K),
        (GgmlDType::Q2K, Format::Q2K),
        (GgmlDType::Q4_0, Format::Q4_0),
        (GgmlDType::Q4_1, Format::Q4_1),
        (GgmlDType::Q5_0, Format::Q5_0),
        (GgmlDType::Q5_1, Format::Q5_1),
    ];
    // BF16: the top half of each f32 (the weights here round alike).
    let bf16: Vec<u8> = w
        .iter()
        .flat_map(|v| v.to_bits().to_le_bytes()[2..].to_vec())
        .collect();
    let mut matrices = vec![
        (
            Format::F16,
            Matrix::from_bytes(rows, cols, Format::F16, &f32_to_f16_bytes(&w)).unwrap(),
        ),
        (
            Format::BF16,
            Matrix::from_bytes(rows, cols, Format::BF16, &bf16).unwrap(),
        ),
    ];
    for (dtype, format) in quantised {
        let bytes = QTensor::quantize(&t, dtype)
            .unwrap()
            .data()
            .unwrap()
            .to_vec();
        matrices.push((
            format,
            Matrix::from_bytes(rows, cols, format, &bytes).unwrap(),
        ));
    }
    // `--only NAME` times one format, for profiling it alone.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    // `--inputs 1,2,4,8` times products with that many input rows at once.
    let inputs: Vec<usize> = args
        .iter()
        .position(|a| a == "--inputs")
        .and_then(|i| args.get(i + 1))
        .map_or(vec![1], |list| {
            list.split(',').filter_map(|n| n.parse().ok()).collect()
        });
    for (format, m) in &matrices {
        if only.is_some_and(|name| name != format.name()) {
            continue;
        }
        for &n in &inputs {
            let xs: Vec<f32> = x.iter().copied().cycle().take(n * cols).collect();
            let reps = 2000 / n;
            let started = Instant::now();
            for _ in 0..reps {
                std::hint::black_box(m.matmul_serial(&xs, n).unwrap());
            }
            let secs = started.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{:>5} [{rows}x{cols}] x {n} on one thread: {:7.3} ms  {:5.2} G weights/s  {:5.1} GB/s stored",
                format.name(),
                secs * 1e3,
                (rows * cols * n) as f64 / secs / 1e9,
                m.stored_bytes() as f64 / secs / 1e9
            );
        }
    }
}

fn main() {
    let paths: Vec<String> = longhaul_engine::kernels::product_paths()
        .into_iter()
        .map(|(format, path)| format!("{format} {path}"))
        .collect();
    println!("products by format: {}", paths.join(", "));
    formats_speed();
    if std::env::args().any(|a| a == "--formats") {
        return;
    }
    experts_apart();
    experts_in_one_buffer();
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
