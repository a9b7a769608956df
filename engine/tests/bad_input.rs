//! Corrupt or inconsistent checkpoints give errors that name the file and the
//! problem — never a panic, never a model that silently computes garbage.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use longhaul_engine::Engine;
use longhaul_engine::model::config::MAX_CONFIG_SIZE;
use serde_json::{Value, json};

/// A copy of the smallest released-style fixture in a temporary folder.
fn fixture_copy() -> (tempfile::TempDir, PathBuf) {
    copy_of("mixtral_released")
}

/// A copy of fixture `name` in a temporary folder.
fn copy_of(name: &str) -> (tempfile::TempDir, PathBuf) {
    let src = common::fixtures_dir().join(name);
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("model");
    fs::create_dir(&dst).unwrap();
    for entry in fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    (tmp, dst)
}

fn open_err(dir: &Path) -> String {
    match Engine::open(dir) {
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Splits a safetensors file into its header JSON and data section.
fn split(path: &Path) -> (serde_json::Map<String, Value>, Vec<u8>) {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

fn join(path: &Path, header: &serde_json::Map<String, Value>, data: &[u8]) {
    let h = serde_json::to_vec(header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    fs::write(path, out).unwrap();
}

fn weights(dir: &Path) -> PathBuf {
    dir.join("model.safetensors")
}

fn assert_mentions(err: &str, parts: &[&str]) {
    for p in parts {
        assert!(err.contains(p), "error `{err}` should mention `{p}`");
    }
}

#[test]
fn truncated_file_is_reported_with_its_name() {
    let (_t, dir) = fixture_copy();
    let bytes = fs::read(weights(&dir)).unwrap();
    fs::write(weights(&dir), &bytes[..bytes.len() - 1000]).unwrap();
    assert_mentions(
        &open_err(&dir),
        &["model.safetensors", "past the end", "truncated"],
    );
}

#[test]
fn header_length_past_end_of_file() {
    let (_t, dir) = fixture_copy();
    let mut bytes = fs::read(weights(&dir)).unwrap();
    let huge = (bytes.len() as u64 + 10).to_le_bytes();
    bytes[..8].copy_from_slice(&huge);
    fs::write(weights(&dir), &bytes).unwrap();
    assert_mentions(
        &open_err(&dir),
        &["model.safetensors", "header length", "past the end"],
    );
}

#[test]
fn header_over_the_size_limit() {
    let (_t, dir) = fixture_copy();
    let mut bytes = fs::read(weights(&dir)).unwrap();
    bytes[..8].copy_from_slice(&(200u64 * 1024 * 1024).to_le_bytes());
    fs::write(weights(&dir), &bytes).unwrap();
    assert_mentions(&open_err(&dir), &["model.safetensors", "exceeds"]);
}

#[test]
fn file_shorter_than_the_length_prefix() {
    let (_t, dir) = fixture_copy();
    fs::write(weights(&dir), [1u8, 2, 3]).unwrap();
    assert_mentions(&open_err(&dir), &["model.safetensors", "too short"]);
}

#[test]
fn header_that_is_not_json() {
    let (_t, dir) = fixture_copy();
    let mut out = 5u64.to_le_bytes().to_vec();
    out.extend(b"{oops");
    fs::write(weights(&dir), out).unwrap();
    assert_mentions(&open_err(&dir), &["model.safetensors", "not valid JSON"]);
}

#[test]
fn offsets_out_of_bounds() {
    let (_t, dir) = fixture_copy();
    let (mut header, data) = split(&weights(&dir));
    let len = data.len() as u64;
    header.insert(
        "extra".into(),
        json!({"dtype": "F32", "shape": [4], "data_offsets": [len, len + 16]}),
    );
    join(&weights(&dir), &header, &data);
    assert_mentions(
        &open_err(&dir),
        &["model.safetensors", "`extra`", "past the end"],
    );
}

#[test]
fn overlapping_tensors() {
    let (_t, dir) = fixture_copy();
    let (mut header, data) = split(&weights(&dir));
    header.insert(
        "alias".into(),
        json!({"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}),
    );
    join(&weights(&dir), &header, &data);
    assert_mentions(&open_err(&dir), &["model.safetensors", "overlap"]);
}

#[test]
fn byte_size_not_matching_dtype_and_shape() {
    let (_t, dir) = fixture_copy();
    let (mut header, data) = split(&weights(&dir));
    let entry = header.get_mut("model.norm.weight").unwrap();
    entry["shape"] = json!([63]);
    join(&weights(&dir), &header, &data);
    assert_mentions(
        &open_err(&dir),
        &["model.safetensors", "model.norm.weight", "needs"],
    );
}

#[test]
fn unsupported_dtype_names_the_tensor() {
    let (_t, dir) = fixture_copy();
    let (mut header, data) = split(&weights(&dir));
    let entry = header.get_mut("model.norm.weight").unwrap();
    entry["dtype"] = json!("I16");
    entry["shape"] = json!([64]);
    join(&weights(&dir), &header, &data);
    assert_mentions(
        &open_err(&dir),
        &["model.norm.weight", "supported weight dtypes"],
    );
}

#[test]
fn missing_tensor_is_named() {
    let (_t, dir) = fixture_copy();
    let (mut header, data) = split(&weights(&dir));
    header.remove("model.layers.1.self_attn.k_proj.weight");
    join(&weights(&dir), &header, &data);
    assert_mentions(
        &open_err(&dir),
        &["model.layers.1.self_attn.k_proj.weight", "missing"],
    );
}

#[test]
fn shape_contradicting_the_config() {
    let (_t, dir) = fixture_copy();
    let path = dir.join("config.json");
    let mut cfg: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    cfg["intermediate_size"] = json!(50);
    fs::write(&path, cfg.to_string()).unwrap();
    assert_mentions(
        &open_err(&dir),
        &["model.safetensors", "shape", "config.json implies"],
    );
}

#[test]
fn malformed_config_json() {
    let (_t, dir) = fixture_copy();
    fs::write(dir.join("config.json"), "{\"model_type\": \"mixtral\",").unwrap();
    assert_mentions(&open_err(&dir), &["config.json", "not valid JSON"]);
}

#[test]
fn config_field_of_the_wrong_type() {
    let (_t, dir) = fixture_copy();
    let path = dir.join("config.json");
    let mut cfg: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    cfg["num_attention_heads"] = json!("four");
    fs::write(&path, cfg.to_string()).unwrap();
    assert_mentions(&open_err(&dir), &["config.json", "num_attention_heads"]);
}

#[test]
fn unknown_model_type_lists_the_supported_ones() {
    let (_t, dir) = fixture_copy();
    fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    assert_mentions(
        &open_err(&dir),
        &[
            "llama",
            "not supported",
            "qwen3_moe",
            "mixtral",
            "deepseek_v3",
            "kimi_k2",
        ],
    );
}

#[test]
fn unsupported_option_is_named() {
    let (_t, dir) = fixture_copy();
    let path = dir.join("config.json");
    let mut cfg: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    cfg["rope_scaling"] = json!({"type": "longrope", "factor": 2.0});
    fs::write(&path, cfg.to_string()).unwrap();
    assert_mentions(&open_err(&dir), &["longrope", "default, linear, yarn"]);
    cfg["rope_scaling"] = Value::Null;
    cfg["hidden_act"] = json!("gelu");
    fs::write(&path, cfg.to_string()).unwrap();
    assert_mentions(&open_err(&dir), &["hidden_act", "gelu", "silu"]);
}

#[test]
fn missing_weights_file() {
    let (_t, dir) = fixture_copy();
    fs::remove_file(weights(&dir)).unwrap();
    assert_mentions(&open_err(&dir), &["no weights found"]);
}

#[test]
fn index_naming_a_missing_shard() {
    let (_t, dir) = fixture_copy();
    fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    assert_mentions(&open_err(&dir), &["model-00002-of-00002.safetensors"]);
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused() {
    let (_t, dir) = fixture_copy();
    let engine = Engine::open(&dir).unwrap();
    let err = engine.logits(&[1, 2, 100_000]).unwrap_err().to_string();
    assert_mentions(&err, &["100000", "outside the vocabulary"]);
}

/// Every size a config.json can state, set absurdly large, is an error (or a
/// model that still runs), never an allocation that aborts the process: one
/// such job used to crash the service at every restart.
#[test]
fn absurd_sizes_in_config_json_are_errors_not_aborts() {
    // Past the config limit, and at it (which the files must then refute).
    const ABSURD: [u64; 3] = [1 << 40, 1_000_000_000, MAX_CONFIG_SIZE as u64];
    for name in [
        "mixtral_released",
        "qwen3_moe_released",
        "deepseek_v3_released",
        "kimi_k25_text",
    ] {
        let (_tmp, dir) = copy_of(name);
        let path = dir.join("config.json");
        let original: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        let nested = original.get("text_config").is_some();
        let fields = if nested {
            &original["text_config"]
        } else {
            &original
        };
        let sizes: Vec<String> = fields
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.is_u64())
            .map(|(k, _)| k.clone())
            .collect();
        assert!(sizes.len() >= 8, "{name}: {sizes:?}");
        for field in &sizes {
            for value in ABSURD {
                let mut cfg = original.clone();
                let target = if nested {
                    &mut cfg["text_config"]
                } else {
                    &mut cfg
                };
                target[field.as_str()] = json!(value);
                fs::write(&path, cfg.to_string()).unwrap();
                eprintln!("{name}: {field} = {value}");
                if let Ok(engine) = Engine::open(&dir) {
                    // Accepted (an id, a context length): it must still run.
                    let mut session = longhaul_engine::generate::Session::new(engine.decoder());
                    let _ = session.feed(&[1, 2]);
                }
            }
        }
    }
}

/// transformers 5.24 saves Kimi-K2.5's text layers as
/// `language_model.model.blocks.N`; the released files say `…layers.N`.
/// Both load, to bitwise the same logits, from the folder and from a pack.
#[test]
fn kimi_k25_as_transformers_saves_it_names_its_layers_blocks() {
    use longhaul_engine::model::LogitsFor;
    use longhaul_engine::pack::{PackOptions, write_pack};
    let (tmp, dir) = copy_of("kimi_k25_text");
    let logits = |engine: &Engine, ids: &[u32]| -> Vec<Vec<f32>> {
        let d = engine.decoder();
        d.forward(ids, &mut d.new_state(), LogitsFor::All)
            .unwrap()
            .to_vec2()
            .unwrap()
    };
    let ids: Vec<u32> = (1..20).collect();
    let want = logits(&Engine::open(&dir).unwrap(), &ids);
    let (header, data) = split(&weights(&dir));
    let renamed: serde_json::Map<String, Value> = header
        .into_iter()
        .map(|(k, v)| {
            (
                k.replace(
                    "language_model.model.layers.",
                    "language_model.model.blocks.",
                ),
                v,
            )
        })
        .collect();
    assert!(renamed.keys().any(|k| k.contains(".blocks.")));
    join(&weights(&dir), &renamed, &data);
    assert!(logits(&Engine::open(&dir).unwrap(), &ids) == want);
    let drive = tmp.path().join("drive");
    fs::create_dir_all(&drive).unwrap();
    let pack = tmp.path().join("pack");
    write_pack(
        &PackOptions::new(dir.clone(), pack.clone(), vec![drive]),
        &|_| {},
    )
    .unwrap();
    let manifest = longhaul_engine::pack::Manifest::read(&pack).unwrap();
    assert!(!manifest.experts.layers.is_empty(), "the experts stream");
    assert!(logits(&Engine::open(&pack).unwrap(), &ids) == want);
}

/// Kimi-K2.5 as transformers saves it has no `lm_head` and ties it to the
/// embedding; a wrapper config that says untied needs the head, and says so.
#[test]
fn a_kimi_k25_without_its_head_ties_it_unless_the_config_says_untied() {
    let (_tmp, dir) = copy_of("kimi_k25_saved");
    assert!(Engine::open(&dir).is_ok());
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config["tie_word_embeddings"] = json!(false);
    fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    assert_mentions(&open_err(&dir), &["language_model.lm_head.weight"]);
}

/// Numbers a config states that no model can have — a negative epsilon, a
/// scaling factor of 0, a rotary share past 1 — are refused by name, not
/// loaded into a model that answers garbage.
#[test]
fn out_of_range_numbers_in_config_json_are_refused_by_name() {
    for (field, value, said) in [
        ("rms_norm_eps", json!(-1), "rms_norm_eps"),
        ("rms_norm_eps", json!(0), "rms_norm_eps"),
        (
            "rope_scaling",
            json!({ "rope_type": "yarn", "factor": 0, "original_max_position_embeddings": 32 }),
            "factor",
        ),
        (
            "rope_scaling",
            json!({ "rope_type": "linear", "factor": -2 }),
            "factor",
        ),
        (
            "partial_rotary_factor",
            json!(1000),
            "partial_rotary_factor",
        ),
    ] {
        let (_tmp, dir) = copy_of("qwen3_moe_released");
        let path = dir.join("config.json");
        let mut cfg: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        cfg[field] = value.clone();
        fs::write(&path, cfg.to_string()).unwrap();
        assert_mentions(&open_err(&dir), &["config.json", said]);
    }
}

/// Weights that make the scores NaN stop the answer with an error saying
/// so; sampling NaN once answered token 0 over and over, with success.
#[test]
fn scores_that_are_not_numbers_stop_the_answer_with_an_error() {
    let (_t, dir) = fixture_copy();
    let (header, mut data) = split(&weights(&dir));
    let norm = &header["model.norm.weight"];
    assert_eq!(norm["dtype"], "F16");
    let range = &norm["data_offsets"];
    let (start, end) = (
        range[0].as_u64().unwrap() as usize,
        range[1].as_u64().unwrap() as usize,
    );
    for half in data[start..end].chunks_exact_mut(2) {
        half.copy_from_slice(&0x7e00u16.to_le_bytes());
    }
    join(&weights(&dir), &header, &data);
    let engine = Engine::open(&dir).unwrap();
    let settings = common::greedy_settings(4, Vec::new());
    let err = engine
        .generate(&[1, 2, 3], &settings, |_| longhaul_engine::Flow::Continue)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_mentions(&err, &["not numbers", "answer token 0"]);
}
