//! The fuzz targets' entry points (see `fuzz/`), run in CI for a fixed
//! number of mutated inputs each: pack manifests, config.json, job request
//! bodies, chat-template conversations and template texts, tokenizer.json,
//! and GGUF metadata values opened the whole way to a model. Each input must give a value or
//! an error, never a panic or an abort. Mutations are seeded, so a failure
//! reproduces; longer runs use cargo-fuzz (README).

mod support;

use std::path::Path;

use longhaul_engine::model::{ModelSpec, RawConfig};
use longhaul_engine::pack::Manifest;
use longhaul_engine::tokenizer::{ChatMessage, TextTokenizer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// Mutated inputs per target in CI; `LONGHAUL_FUZZ_ITERATIONS` for more.
const ITERATIONS: usize = 1500;

fn iterations() -> usize {
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
fn fuzz(name: &str, seeds: &[Value], check: impl Fn(&[u8]) -> bool) {
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

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn pack_manifests() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = tmp.path().join("pack");
    let drive = tmp.path().join("drive0");
    std::fs::create_dir_all(&drive).unwrap();
    let status = std::process::Command::new(support::longhaul())
        .arg("pack")
        .arg(support::fixture("deepseek_v3_released"))
        .arg("--out")
        .arg(&pack)
        .arg("--drives")
        .arg(&drive)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let seed = read_json(&pack.join("longhaul-pack.json"));
    fuzz("pack_manifest", &[seed], |bytes| {
        std::str::from_utf8(bytes)
            .is_ok_and(|text| Manifest::parse(Path::new("longhaul-pack.json"), text).is_ok())
    });
}

#[test]
fn model_configs() {
    let seeds: Vec<Value> = [
        "mixtral_released",
        "qwen3_moe_released",
        "deepseek_v3_released",
        "kimi_k25_text",
    ]
    .iter()
    .map(|f| read_json(&support::fixture(f).join("config.json")))
    .collect();
    fuzz("model_config", &seeds, |bytes| {
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| RawConfig::parse(Path::new("config.json"), text).ok())
            .is_some_and(|raw| ModelSpec::parse(&raw).is_ok())
    });
}

#[test]
fn job_requests() {
    let seeds = [
        json!({ "model": "m", "prompt": "Audit this", "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 1, "stop": ["\n\n"], "title": "t", "priority": 2 }),
        json!({ "model": "m", "messages": [{ "role": "system", "content": "Be brief." }, { "role": "user", "content": "Hi" }], "attachments": ["/tmp"] }),
    ];
    fuzz("job_request", &seeds, |bytes| {
        longhaul_service::http::jobs::check_submission(bytes).is_ok()
    });
}

#[test]
fn chat_templates() {
    let tokenizer = TextTokenizer::from_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe"),
    )
    .unwrap();
    let seeds = [json!([
        { "role": "system", "content": "You audit code." },
        { "role": "user", "content": "Look at main.rs" },
        { "role": "assistant", "content": "It is fine." },
        { "role": "user", "content": "Again, {{ with care }} <|im_end|>" }
    ])];
    fuzz("chat_template", &seeds, |bytes| {
        let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(bytes) else {
            return false;
        };
        let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
        let messages: Vec<ChatMessage> = items
            .iter()
            .map(|m| ChatMessage::new(text(&m["role"]), text(&m["content"])))
            .collect();
        tokenizer
            .render_chat(&messages, true)
            .and_then(|rendered| tokenizer.encode(&rendered, false))
            .is_ok()
    });
}

/// tokenizer.json as a model folder may hold it, mutated: a tokenizer or
/// an error, and a tokenizer encodes or refuses a text, never a panic.
#[test]
fn tokenizer_jsons() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe");
    let seed = read_json(&dir.join("tokenizer.json"));
    fuzz("tokenizer_json", &[seed], |bytes| {
        let Ok(tok) = TextTokenizer::from_parts(&dir, bytes, &Value::Null, None) else {
            return false;
        };
        tok.encode("Audit the storage layer <|im_end|> aaaa", true)
            .is_ok()
    });
}

/// Chat templates as a model folder may hold them, mutated character by
/// character: a prompt or an error within the fuel, never a panic.
#[test]
fn chat_template_texts() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe");
    let config = read_json(&dir.join("tokenizer_config.json"));
    let template = config["chat_template"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let messages = [
        ChatMessage::new("user", "Look at main.rs"),
        ChatMessage::new("assistant", "It is fine."),
    ];
    let seeds = [json!(template)];
    fuzz("template_text", &seeds, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        let text = serde_json::from_str::<String>(&text).unwrap_or_else(|_| text.into_owned());
        longhaul_engine::tokenizer::ChatTemplate::new(text)
            .render(&messages, &Default::default(), None, None)
            .is_ok()
    });
}

/// A GGUF file's metadata values set to what breaks careless code (zero,
/// huge, NaN, negative), the whole way through to a model: a model or an
/// error naming the key, never a panic or an allocation the file cannot
/// back.
#[test]
fn gguf_metadata_values() {
    use longhaul_engine::weights::gguf::{GgufFile, GgufValue};
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/gguf/qwen3moe-f16.gguf");
    let seed = std::fs::read(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let scalars: Vec<(String, usize)> = file
        .metadata
        .iter()
        .filter_map(|(key, value)| {
            let width = match value {
                GgufValue::U32(_) | GgufValue::I32(_) | GgufValue::F32(_) => 4,
                GgufValue::U64(_) | GgufValue::I64(_) | GgufValue::F64(_) => 8,
                _ => return None,
            };
            Some((key.clone(), width))
        })
        .collect();
    assert!(scalars.len() >= 10, "{scalars:?}");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.gguf");
    let mut rng = StdRng::seed_from_u64(0x6767);
    let (mut opened, total) = (0, iterations() / 10);
    for _ in 0..total {
        let mut bytes = seed.clone();
        for _ in 0..rng.random_range(1..3) {
            let (key, width) = &scalars[rng.random_range(0..scalars.len())];
            let at = bytes
                .windows(key.len() + 4)
                .position(|w| w[..key.len()] == *key.as_bytes())
                .map(|p| p + key.len() + 4)
                .unwrap_or(0);
            let value: [u8; 8] = match rng.random_range(0..6) {
                0 => [0; 8],
                1 => [0xff; 8],
                2 => f64::NAN.to_le_bytes(),
                3 => 1u64.to_le_bytes(),
                4 => (1u64 << 31).to_le_bytes(),
                _ => f32::NAN
                    .to_le_bytes()
                    .repeat(2)
                    .try_into()
                    .unwrap_or([0; 8]),
            };
            bytes[at..at + width].copy_from_slice(&value[..*width]);
        }
        std::fs::write(&out, &bytes).unwrap();
        if let Ok(engine) = longhaul_engine::Engine::open(&out) {
            opened += 1;
            let _ = engine.logits(&[1, 2, 3]);
        }
    }
    println!("gguf_metadata: {total} files, {opened} opened");
    assert!(opened < total, "every mutation was accepted");
}
