//! GGUF files against both references (`tools/reference/make_gguf_fixtures.py`):
//! transformers on the file's dequantised weights (the exact contract, 1e-4)
//! and llama.cpp itself (its tokenizer exactly; its logits by statistics,
//! since it rounds activations inside quantised products).

// Statistics against llama.cpp's logits: std's functions compute them.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::PathBuf;

use common::{LOGIT_TOLERANCE, max_abs_diff};
use longhaul_engine::Engine;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Expected {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
    llama_cpp_logits: Vec<Vec<f32>>,
    texts: Vec<String>,
    llama_cpp_tokens: Vec<Vec<u32>>,
}

fn gguf_fixtures() -> Vec<(String, PathBuf, Expected)> {
    let dir = common::fixtures_dir().join("gguf");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("gguf fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "expected the committed GGUF fixtures, found {files:?}"
    );
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(p.with_extension("json")).expect("expected json");
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (
                name,
                p,
                serde_json::from_str(&text).expect("expected json parses"),
            )
        })
        .collect()
}

/// Log-softmax of a row, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    row.iter().map(|&v| v as f64 - max - sum.ln()).collect()
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 { (i, v) } else { best }
        })
        .0
}

/// Mean KL(llama.cpp ‖ ours), top-1 agreement and the median over positions
/// of the largest |Δlogit| in each.
fn agreement(ours: &[Vec<f32>], theirs: &[Vec<f32>]) -> (f64, f64, f32) {
    let mut kl = 0.0;
    let mut top1 = 0;
    let mut worst: Vec<f32> = Vec::new();
    for (a, b) in ours.iter().zip(theirs) {
        let (la, lb) = (log_softmax(a), log_softmax(b));
        kl += lb
            .iter()
            .zip(&la)
            .map(|(q, p)| q.exp() * (q - p))
            .sum::<f64>();
        top1 += usize::from(argmax(a) == argmax(b));
        worst.push(
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max),
        );
    }
    worst.sort_by(f32::total_cmp);
    let n = ours.len() as f64;
    (kl / n, top1 as f64 / n, worst[worst.len() / 2])
}

#[test]
fn gguf_logits_match_transformers_on_the_dequantised_weights() {
    let mut failures = Vec::new();
    for (name, path, exp) in gguf_fixtures() {
        let engine = Engine::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let logits: Vec<Vec<f32>> = engine.logits(&exp.ids).unwrap().to_vec2().unwrap();
        let diff = max_abs_diff(&logits, &exp.logits);
        let (kl, top1, median) = agreement(&logits, &exp.llama_cpp_logits);
        println!(
            "{name}: max |Δ| vs transformers {diff:e}; vs llama.cpp: mean KL {kl:.2e}, top-1 {top1:.3}, median |Δ| {median:.4}"
        );
        if diff > LOGIT_TOLERANCE || diff.is_nan() {
            failures.push(format!("{name}: {diff:e}"));
        }
        // F32 weights: llama.cpp rounds nothing either. gpt-oss excepted:
        // llama.cpp truncates YaRN's correction range, which the reference
        // (`truncate: false`) does not (transformers with `truncate: true`
        // gives llama.cpp's logits within 3e-6; as released, 1e-2 apart).
        if name.ends_with("f32") && !name.starts_with("gpt-oss") {
            let to_llama = max_abs_diff(&logits, &exp.llama_cpp_logits);
            assert!(
                to_llama <= LOGIT_TOLERANCE,
                "{name}: {to_llama:e} from llama.cpp"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "GGUF logits differ from transformers: {failures:?}"
    );
}

#[test]
fn gguf_tokenizer_gives_llama_cpps_ids() {
    for (name, path, exp) in gguf_fixtures() {
        let engine = Engine::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tok = engine.tokenizer().unwrap();
        for (text, want) in exp.texts.iter().zip(&exp.llama_cpp_tokens) {
            let got = tok.encode(text, false).unwrap();
            assert_eq!(&got, want, "{name}: {text:?}");
        }
    }
}

/// The same model in three parts: opened from its first part it computes
/// bitwise what the single file does; any other part, or a missing one, is
/// refused with what to give instead.
#[test]
fn split_files_open_from_their_first_part() {
    let dir = common::fixtures_dir().join("gguf");
    let whole = Engine::open(&dir.join("qwen3moe-f16.gguf")).unwrap();
    let parts = dir.join("split");
    let first = parts.join("qwen3moe-f16-00001-of-00003.gguf");
    let split = Engine::open(&first).unwrap();
    let ids = [5u32, 17, 42, 99, 3, 250];
    let a: Vec<Vec<f32>> = whole.logits(&ids).unwrap().to_vec2().unwrap();
    let b: Vec<Vec<f32>> = split.logits(&ids).unwrap().to_vec2().unwrap();
    assert!(a == b, "split and whole files differ");

    let second = parts.join("qwen3moe-f16-00002-of-00003.gguf");
    let err = Engine::open(&second)
        .err()
        .expect("a later part is refused")
        .to_string();
    assert!(
        err.contains("part 2 of 3") && err.contains("00001-of-00003"),
        "{err}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let lone = tmp.path().join("qwen3moe-f16-00001-of-00003.gguf");
    std::fs::copy(&first, &lone).unwrap();
    let err = Engine::open(&lone)
        .err()
        .expect("a missing part is refused")
        .to_string();
    assert!(
        err.contains("00002-of-00003.gguf") && err.contains("missing"),
        "{err}"
    );
}

/// Greedy decoding from each file gives transformers' tokens.
#[test]
fn gguf_greedy_tokens_match_transformers() {
    #[derive(Deserialize)]
    struct Greedy {
        prompt_ids: Vec<u32>,
        greedy_tokens: Vec<u32>,
    }
    for (name, path, _) in gguf_fixtures() {
        let text = std::fs::read_to_string(path.with_extension("json")).unwrap();
        let exp: Greedy = serde_json::from_str(&text).unwrap();
        let engine = Engine::open(&path).unwrap();
        let mut ids = exp.prompt_ids.clone();
        for _ in 0..exp.greedy_tokens.len() {
            let logits: Vec<Vec<f32>> = engine.logits(&ids).unwrap().to_vec2().unwrap();
            ids.push(argmax(logits.last().unwrap()) as u32);
        }
        assert_eq!(
            &ids[exp.prompt_ids.len()..],
            exp.greedy_tokens.as_slice(),
            "{name}"
        );
    }
}

/// A file whose tokenizer cannot be rebuilt (here a split llama.cpp names
/// but Longhaul does not know) still loads and scores ids; asking it for
/// text says why it cannot.
#[test]
fn a_file_without_a_usable_tokenizer_still_scores_ids() {
    let dir = common::fixtures_dir().join("gguf");
    let mut bytes = std::fs::read(dir.join("qwen3moe-f32.gguf")).unwrap();
    let (key, from) = (b"tokenizer.ggml.pre".as_slice(), b"gpt-2".as_slice());
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
    let value = at
        + bytes[at..]
            .windows(from.len())
            .position(|w| w == from)
            .unwrap();
    bytes[value..value + from.len()].copy_from_slice(b"gpt-9");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("odd-split.gguf");
    std::fs::write(&file, bytes).unwrap();
    let engine = Engine::open(&file).unwrap();
    let whole = Engine::open(&dir.join("qwen3moe-f32.gguf")).unwrap();
    let ids = [5u32, 6, 7];
    let (a, b): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (
        engine.logits(&ids).unwrap().to_vec2().unwrap(),
        whole.logits(&ids).unwrap().to_vec2().unwrap(),
    );
    assert!(a == b);
    let err = engine.tokenizer().err().expect("no tokenizer").to_string();
    assert!(err.contains("tokenizer.ggml.pre `gpt-9`"), "{err}");
}

/// Damaged headers — flipped bits, truncation, huge counts — in a real
/// file, opened the whole way (tensor names, config, tokenizer, model): an
/// error or a model, never a panic or an allocation the file cannot back.
#[test]
fn damaged_gguf_headers_open_or_fail_cleanly() {
    let path = common::fixtures_dir().join("gguf/qwen3moe-f16.gguf");
    let seed = std::fs::read(&path).unwrap();
    let header = longhaul_engine::weights::gguf::GgufFile::open(&path)
        .unwrap()
        .data_offset as usize;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("damaged.gguf");
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n.max(1) as u64) as usize
    };
    let (mut opened, total) = (0, 300);
    for _ in 0..total {
        let mut b = seed.clone();
        let at = next(header);
        match next(4) {
            0 => b[at] ^= 1 << next(8),
            1 => b.truncate(at),
            2 if at + 8 <= b.len() => b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes()),
            _ => b[at] = next(256) as u8,
        }
        std::fs::write(&file, &b).unwrap();
        if let Ok(engine) = Engine::open(&file) {
            opened += 1;
            let _ = engine.logits(&[1, 2, 3]);
        }
    }
    println!("{opened} of {total} damaged files still opened");
    assert!(opened < total, "no damage was ever noticed");
}

/// `key`'s value in a GGUF file's bytes, overwritten: where its scalar
/// begins (after the key's name and the value's type).
fn patch_key(bytes: &mut [u8], key: &str, value: &[u8]) {
    let name = key.as_bytes();
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .unwrap_or_else(|| panic!("no key {key}"));
    let value_at = at + name.len() + 4;
    bytes[value_at..value_at + value.len()].copy_from_slice(value);
}

/// Counts and numbers in GGUF metadata are checked before they size or
/// steer anything: a block count of 10^9 once made the importer build 10^9
/// layer names (an abort, in the service too), and a NaN RoPE base became
/// the default base without a word.
#[test]
fn hostile_gguf_counts_and_numbers_are_refused_by_name() {
    let path = common::fixtures_dir().join("gguf/qwen3moe-f16.gguf");
    let seed = std::fs::read(&path).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("hostile.gguf");
    let billion = 1_000_000_000u32.to_le_bytes();
    let nan = f32::NAN.to_le_bytes();
    for (key, value) in [
        ("qwen3moe.block_count", &billion[..]),
        ("qwen3moe.expert_count", &billion[..]),
        ("qwen3moe.attention.head_count", &billion[..]),
        ("qwen3moe.rope.freq_base", &nan[..]),
        ("qwen3moe.attention.layer_norm_rms_epsilon", &nan[..]),
    ] {
        let mut bytes = seed.clone();
        patch_key(&mut bytes, key, value);
        std::fs::write(&file, &bytes).unwrap();
        let err = match Engine::open(&file) {
            Ok(_) => panic!("{key} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(key), "{key}: {err}");
    }
    // A block count the file cannot hold, under the general limit.
    let mut bytes = seed.clone();
    patch_key(
        &mut bytes,
        "qwen3moe.block_count",
        &100_000u32.to_le_bytes(),
    );
    std::fs::write(&file, &bytes).unwrap();
    let err = Engine::open(&file).err().map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("more layers than")),
        "{err:?}"
    );
}

/// A tensor whose type was changed in the table (Q4_K, 144 bytes per 256
/// values, retyped as IQ3_S, 110) no longer fills its place in the data:
/// refused, naming the tensor, instead of computed as garbage.
#[test]
fn a_retyped_tensor_is_refused_by_its_span() {
    let path = common::fixtures_dir().join("gguf/qwen3moe-q4_k_m.gguf");
    let file = longhaul_engine::weights::gguf::GgufFile::open(&path).unwrap();
    let q4k = file
        .tensors
        .iter()
        .filter(|t| t.ggml_type.name() == "Q4_K")
        .max_by_key(|t| t.len)
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let name = q4k.name.as_bytes();
    let at = bytes
        .windows(name.len() + 8)
        .position(|w| w[8..] == *name && w[..8] == (name.len() as u64).to_le_bytes())
        .unwrap();
    let type_at = at + 8 + name.len() + 4 + 8 * q4k.shape.len();
    assert_eq!(
        bytes[type_at..type_at + 4],
        12u32.to_le_bytes(),
        "Q4_K's id"
    );
    bytes[type_at..type_at + 4].copy_from_slice(&21u32.to_le_bytes());
    let tmp = tempfile::tempdir().unwrap();
    let retyped = tmp.path().join("retyped.gguf");
    std::fs::write(&retyped, &bytes).unwrap();
    let err = Engine::open(&retyped).err().map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(
        err.contains(&q4k.name) && err.contains("IQ3_S") && err.contains("spans"),
        "{err}"
    );
}
