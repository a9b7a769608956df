//! GGUF files through the binary and the service: each fixture (Qwen3-MoE,
//! DeepSeek-V3, Mixtral and gpt-oss, every supported block type among them) packed over drives and queued as a job,
//! one served straight from its file, and a file holding a type Longhaul
//! does not compute with refused by name before anything is written.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use support::Service;

const WAIT: Duration = Duration::from_secs(60);
const FILES: [&str; 13] = [
    "deepseek2-f32",
    "deepseek2-q4_k_m",
    "gpt-oss-f32",
    "gpt-oss-mxfp4",
    "mixtral-f32",
    "mixtral-q8_0",
    "qwen3moe-f32",
    "qwen3moe-f16",
    "qwen3moe-q4_k_m",
    "qwen3moe-kquants",
    "qwen3moe-legacy",
    "qwen3moe-iq4",
    "qwen3moe-mxfp4_moe",
];
/// GGML's number for TQ1_0, a type Longhaul refuses.
const TQ1_0: u32 = 34;

fn gguf(name: &str) -> PathBuf {
    support::fixture("gguf").join(format!("{name}.gguf"))
}

fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(gguf(name).with_extension("json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn pack(source: &Path, root: &Path, name: &str) -> Output {
    let out = root.join(format!("{name}-pack"));
    support::pack_over_three_drives(source, root, name, &out, &[])
}

#[test]
fn gguf_files_pack_and_answer_through_the_queue_as_transformers_does() {
    let dir = tempfile::tempdir().unwrap();
    let s = Service::start(&dir.path().join("data"));
    for name in FILES {
        let out = pack(&gguf(name), dir.path(), name);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        s.add_model(name, &dir.path().join(format!("{name}-pack")));
    }
    // A file can also be served as it is, without a pack.
    s.add_model("direct", &gguf("qwen3moe-kquants"));
    let (_, models) = s.call("GET", "/api/models", None);
    let listed = |name: &str| {
        models["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .cloned()
            .unwrap()
    };
    // Q4_K_M gives the last layer's down rows Q6_K; the pack names the common pair.
    assert_eq!(
        listed("qwen3moe-q4_k_m")["weights"]["experts"],
        "GGUF:Q4_K/Q4_K"
    );
    assert_eq!(listed("qwen3moe-q4_k_m")["weights"]["lossy"], false);
    for (model, file) in FILES
        .iter()
        .map(|f| (*f, *f))
        .chain([("direct", "qwen3moe-kquants")])
    {
        let exp = expected(file);
        // The reference's greedy tokens, streamed as the service streams
        // text (a random model's bytes are often not UTF-8, where a stream
        // and a whole decode may render a byte run differently).
        let tokens: Vec<u32> = serde_json::from_value(exp["greedy_tokens"].clone()).unwrap();
        let engine = longhaul_engine::Engine::open(&gguf(file)).unwrap();
        let mut stream = engine.tokenizer().unwrap().stream();
        let mut want = String::new();
        // A job ends at the model's end-of-sequence token.
        let eos = engine.eos_token_ids();
        for t in tokens.into_iter().take_while(|t| !eos.contains(t)) {
            want += &stream.push(t).unwrap();
        }
        want += &stream.finish().unwrap();
        let job = s.post(
            "/api/jobs",
            json!({ "model": model, "prompt": exp["prompt"], "max_tokens": 12 }),
        );
        let done = s.wait_final(job["id"].as_i64().unwrap(), WAIT);
        assert_eq!(done["state"], "done", "{model}: {done}");
        assert_eq!(done["output"], want.as_str(), "{model}: {done}");
    }
}

#[test]
fn a_tensor_of_an_unsupported_type_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(gguf("qwen3moe-f16")).unwrap();
    // The table entry: name, dimension count, three dimensions, then the type.
    let name = b"blk.1.ffn_down_exps.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("tensor entry");
    let ty = at + name.len() + 4 + 3 * 8;
    bytes[ty..ty + 4].copy_from_slice(&TQ1_0.to_le_bytes());
    let file = dir.path().join("iq4.gguf");
    std::fs::write(&file, bytes).unwrap();
    let out = pack(&file, dir.path(), "iq4");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("blk.1.ffn_down_exps.weight") && err.contains("TQ1_0") && err.contains("Q6_K"),
        "{err}"
    );
    assert!(!dir.path().join("iq4-pack").exists(), "nothing is written");
}
