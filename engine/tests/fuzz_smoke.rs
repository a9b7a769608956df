//! The fuzz targets' entry points (see `fuzz/`), run in CI for a fixed
//! number of mutated inputs each: pack manifests, config.json, chat-template
//! conversations and template texts, tokenizer.json, and GGUF metadata
//! values opened the whole way to a model. Each input must give a value or
//! an error, never a panic or an abort. Mutations are seeded, so a failure
//! reproduces; longer runs use cargo-fuzz (README). Job request bodies are
//! the service's, in its own smoke test.

mod common;

use std::path::Path;

use common::mutate::{fuzz, iterations};
use longhaul_engine::model::{ModelSpec, RawConfig};
use longhaul_engine::pack::Manifest;
use longhaul_engine::tokenizer::{ChatMessage, TextTokenizer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn pack_manifests() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = common::pack_on_two_drives(
        &common::fixtures_dir().join("deepseek_v3_released"),
        tmp.path(),
    );
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
    .map(|f| read_json(&common::fixtures_dir().join(f).join("config.json")))
    .collect();
    fuzz("model_config", &seeds, |bytes| {
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| RawConfig::parse(Path::new("config.json"), text).ok())
            .is_some_and(|raw| ModelSpec::parse(&raw).is_ok())
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
    let path = common::fixtures_dir().join("gguf/qwen3moe-f16.gguf");
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
