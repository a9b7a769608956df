//! Seeded mutations for the fuzz smoke tests: the fuzz targets' inputs
//! (see `fuzz/`) changed structurally and byte by byte, so that a failure
//! reproduces. Shared by the engine's smoke test and the service's (the
//! end-to-end crate includes this file by path).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// Mutated inputs per target in CI; `LONGHAUL_FUZZ_ITERATIONS` for more.
const ITERATIONS: usize = 1500;

pub fn iterations() -> usize {
    std::env::var("LONGHAUL_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ITERATIONS)
}

/// Values that break careless code: sizes, signs, types.
fn nasty(rng: &mut StdRng) -> Value {
    match rng.random_range(0..9) {
        0 => json!(null),
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(1u64 << 40),
        4 => json!(1e308),
        5 => json!(""),
        6 => json!([]),
        7 => json!({}),
        _ => json!("\u{0}\u{FFFF}{{ x }}{% for %}"),
    }
}

/// A JSON value with one nested value replaced, removed or duplicated.
fn mutate_json(v: &mut Value, rng: &mut StdRng) {
    match v {
        Value::Object(map) if !map.is_empty() && rng.random_bool(0.8) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = &keys[rng.random_range(0..keys.len())];
            match rng.random_range(0..6) {
                0 => {
                    map.remove(key);
                }
                1 => {
                    map.insert(key.clone(), nasty(rng));
                }
                _ => mutate_json(map.get_mut(key).unwrap_or(&mut Value::Null), rng),
            }
        }
        Value::Array(items) if !items.is_empty() && rng.random_bool(0.8) => {
            let i = rng.random_range(0..items.len());
            match rng.random_range(0..5) {
                0 => {
                    items.remove(i);
                }
                1 => items.push(items[i].clone()),
                _ => mutate_json(&mut items[i], rng),
            }
        }
        other => *other = nasty(rng),
    }
}

/// Bytes with a few flips, cuts or repeats.
fn mutate_bytes(bytes: &mut Vec<u8>, rng: &mut StdRng) {
    for _ in 0..rng.random_range(1..4) {
        if bytes.is_empty() {
            bytes.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..bytes.len());
        match rng.random_range(0..4) {
            0 => bytes[at] ^= 1 << rng.random_range(0..8),
            1 => bytes.truncate(at),
            2 => {
                let end = (at + rng.random_range(1..16)).min(bytes.len());
                let piece = bytes[at..end].to_vec();
                bytes.splice(at..at, piece);
            }
            _ => bytes.insert(at, rng.random()),
        }
    }
}

/// Runs `check` (true: the input was accepted) on [`iterations`] mutations
/// of `seeds`, structural and raw; both outcomes must occur, so the
/// mutations reach past the first parse.
pub fn fuzz(name: &str, seeds: &[Value], check: impl Fn(&[u8]) -> bool) {
    let mut rng = StdRng::seed_from_u64(name.len() as u64 * 7919);
    let (mut accepted, total) = (0, iterations());
    for i in 0..total {
        let mut v = seeds[i % seeds.len()].clone();
        for _ in 0..rng.random_range(1..4) {
            mutate_json(&mut v, &mut rng);
        }
        let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
        if rng.random_bool(0.3) {
            mutate_bytes(&mut bytes, &mut rng);
        }
        accepted += usize::from(check(&bytes));
    }
    println!("{name}: {total} inputs, {accepted} accepted");
    assert!(
        accepted > 0 && accepted < total,
        "{name}: {accepted} accepted"
    );
}
