//! Model folders as their makers publish them, through the real binary and
//! the service: a Kimi folder with only `tiktoken.model`, DeepSeek-V3.2's
//! folder with a prompt encoder and no template, a model found by name in
//! the Hugging Face cache, an MTP block a pack leaves out, and reasoning
//! kept apart from the answer with the template's switches passed through.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Service, fixture, pack_over_three_drives};

const WAIT: Duration = Duration::from_secs(60);

fn longhaul(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(support::longhaul());
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `run --chat` from the folder as published and from a pack of it: each
/// run's output.
/// `longhaul run --chat` of `model` on `prompt`, with `extra` arguments.
fn run_chat(model: &str, prompt: &str, extra: &[&str]) -> Output {
    let mut args = vec!["run", "--model", model, "--chat", "--prompt", prompt];
    args.extend_from_slice(extra);
    longhaul(&args, &[])
}

fn chats_from_folder_and_pack(name: &str, extra: &[&str]) -> Vec<Output> {
    let tmp = tempfile::tempdir().unwrap();
    let source = fixture(name);
    let pack = tmp.path().join("pack");
    let packed = pack_over_three_drives(&source, tmp.path(), name, &pack, &[]);
    ok(&packed, "pack");
    let mut outs = Vec::new();
    for model in [source.as_path(), pack.as_path()] {
        let model = model.to_str().unwrap();
        let out = run_chat(model, "Audit the storage engine", extra);
        ok(&out, &format!("{name}: run --chat from {model}"));
        outs.push(out);
    }
    outs
}

#[test]
fn a_kimi_folder_with_only_tiktoken_chats_from_the_folder_and_a_pack() {
    assert!(!fixture("kimi_k2_published").join("tokenizer.json").exists());
    chats_from_folder_and_pack("kimi_k2_published", &["--max-tokens", "6"]);
}

/// gpt-oss answers in harmony: the analysis channel is thinking (on stderr
/// with --show-thinking), the final channel the answer, and `<|return|>`
/// ends it (the scripted fixture's answer is the same as transformers').
#[test]
fn gpt_oss_thinks_apart_from_its_answer_in_harmony() {
    let outs = chats_from_folder_and_pack(
        "gpt_oss_harmony",
        &[
            "--temperature",
            "0",
            "--show-thinking",
            "--max-tokens",
            "32",
        ],
    );
    for out in outs {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stdout.trim(), "lazy dog", "{stdout}\n{stderr}");
        assert!(stderr.contains("quick fox"), "{stderr}");
        for marker in ["analysis", "assistant", "final"] {
            assert!(!stdout.contains(marker), "{stdout}");
        }
    }
}

#[test]
fn deepseek_v32_and_v4_chat_through_their_prompt_encoders() {
    chats_from_folder_and_pack(
        "deepseek_v32_released",
        &["--max-tokens", "6", "--chat-arg", "thinking=true"],
    );
    chats_from_folder_and_pack(
        "deepseek_v4_released",
        &[
            "--max-tokens",
            "6",
            "--chat-arg",
            "reasoning_effort=max",
            "--chat-arg",
            "thinking_mode=thinking",
        ],
    );
    // A switch the encoder does not know the value of is refused by name.
    let out = longhaul(
        &[
            "run",
            "--model",
            fixture("deepseek_v4_released").to_str().unwrap(),
            "--chat",
            "--prompt",
            "x",
            "--chat-arg",
            "reasoning_effort=extreme",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reasoning_effort"));
}

/// A Hugging Face cache repo folder: `refs/main` names a snapshot whose
/// files link into `blobs/`.
fn hf_cache(root: &Path, org: &str, name: &str, from: &Path) {
    let repo = root.join("hub").join(format!("models--{org}--{name}"));
    let rev = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo.join("snapshots").join(rev);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), rev).unwrap();
    for (i, entry) in std::fs::read_dir(from).unwrap().enumerate() {
        let path = entry.unwrap().path();
        let blob = format!("blob{i}");
        std::fs::copy(&path, repo.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            snapshot.join(path.file_name().unwrap()),
        )
        .unwrap();
    }
}

#[test]
fn a_model_in_the_hugging_face_cache_is_found_by_name_and_by_its_folder() {
    let tmp = tempfile::tempdir().unwrap();
    hf_cache(
        tmp.path(),
        "zai-org",
        "GLM-4.5-Air",
        &fixture("glm4_moe_released"),
    );
    let home = tmp.path().to_str().unwrap();
    let env = [("HF_HOME", home), ("HF_HUB_CACHE", "")];
    let out = longhaul(
        &[
            "run",
            "--model",
            "zai-org/GLM-4.5-Air",
            "--prompt",
            "Audit",
            "--max-tokens",
            "4",
        ],
        &env,
    );
    ok(&out, "run by name");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Hugging Face cache"));
    let repo = tmp.path().join("hub/models--zai-org--GLM-4.5-Air");
    let out = longhaul(
        &[
            "run",
            "--model",
            repo.to_str().unwrap(),
            "--prompt",
            "Audit",
            "--max-tokens",
            "4",
        ],
        &env,
    );
    ok(&out, "run by the repo folder");
    let out = longhaul(
        &["run", "--model", "zai-org/Nothing-Here", "--prompt", "x"],
        &env,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("models--zai-org--Nothing-Here") && err.contains("ollama"),
        "{err}"
    );
}

#[test]
fn a_pack_leaves_the_mtp_block_out_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let out = pack_over_three_drives(
        &fixture("glm4_moe_released"),
        tmp.path(),
        "glm",
        &tmp.path().join("pack"),
        &["--json"],
    );
    let report: Value = serde_json::from_str(ok(&out, "pack").trim()).unwrap();
    let left = &report["left_out"][0];
    assert_eq!(left["block"], "mtp", "{report}");
    assert!(
        left["first"]
            .as_str()
            .unwrap()
            .starts_with("model.layers.3."),
        "{report}"
    );
    assert!(left["tensors"].as_u64().unwrap() > 10);
}

/// A reasoning model's chat template: the answer opens in `<think>` unless
/// `enable_thinking` is false, as Qwen3's and GLM's templates do.
const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}";

#[test]
fn reasoning_comes_apart_from_the_answer_and_template_switches_reach_the_template() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("thinker");
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(fixture("qwen3_moe_recent")).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, model.join(p.file_name().unwrap())).unwrap();
    }
    std::fs::write(model.join("chat_template.jinja"), THINKING_TEMPLATE).unwrap();

    // The CLI: the thinking on stderr with --show-thinking, the answer alone on stdout.
    let m = model.to_str().unwrap();
    let out = run_chat(m, "Audit", &["--max-tokens", "8", "--show-thinking"]);
    let stdout = ok(&out, "run --show-thinking");
    assert!(String::from_utf8_lossy(&out.stderr).contains("thinking:"));
    assert_eq!(
        stdout.trim(),
        "",
        "every token is thinking while </think> does not come"
    );
    let out = run_chat(
        m,
        "Audit",
        &["--max-tokens", "8", "--chat-arg", "enable_thinking=false"],
    );
    assert!(!ok(&out, "run --chat-arg").trim().is_empty());

    let s = Service::start(&tmp.path().join("data"));
    s.add_model("thinker", &model);
    let messages = json!([{ "role": "user", "content": "Draft an architecture" }]);
    let thinking = s.post(
        "/v1/chat/completions",
        json!({ "model": "thinker", "messages": messages, "max_tokens": 10 }),
    );
    let message = &thinking["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap().to_string();
    assert!(
        !reasoning.is_empty() && message["content"] == "",
        "{thinking}"
    );
    let plain = s.post(
        "/v1/chat/completions",
        json!({ "model": "thinker", "messages": messages, "max_tokens": 10, "chat_template_kwargs": { "enable_thinking": false } }),
    );
    let message = &plain["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{plain}");
    assert!(!message["content"].as_str().unwrap().is_empty());

    // Streamed: the reasoning arrives in `reasoning_content` deltas.
    let (status, body) = s.call_text(
        "POST",
        "/v1/chat/completions",
        Some(
            &json!({ "model": "thinker", "messages": messages, "max_tokens": 10, "stream": true }),
        ),
        true,
    );
    assert_eq!(status, 200);
    let streamed: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .map(|v| {
            v["choices"][0]["delta"]["reasoning_content"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(streamed, reasoning);

    // A job keeps its reasoning apart, across the queue's commits.
    let job = s.post(
        "/api/jobs",
        json!({ "model": "thinker", "messages": messages, "max_tokens": 10, "chat_template_kwargs": { "enable_thinking": true } }),
    );
    let job = s.wait_final(job["id"].as_i64().unwrap(), WAIT);
    assert_eq!(job["reasoning"], reasoning, "{job}");
    assert_eq!(job["request"]["chat_args"]["enable_thinking"], true);
}
