//! The prefix cache through the service: an agent's second turn resends
//! the first, and what they share comes from the cache — in the same
//! service and after a restart, from the folder — with the answer the
//! service gives without a cache, and the job's figures saying so.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::Service;

/// A system prompt longer than one block (512 tokens) of the demo's tokenizer.
fn system() -> String {
    let line =
        "The project streams expert weights from several drives and keeps the hottest in memory. ";
    line.repeat(24)
}

fn turns() -> (Value, Value) {
    let tools = json!([{ "type": "function", "function": { "name": "read_file",
        "description": "Reads a file of the project.",
        "parameters": { "type": "object", "properties": { "path": { "type": "string" } },
                        "required": ["path"] } } }]);
    let first = json!({ "model": "tools", "tools": tools, "max_tokens": 24,
        "messages": [{ "role": "system", "content": system() },
                     { "role": "user", "content": "What does src/cache.rs do?" }] });
    let mut second = first.clone();
    second["messages"] = json!([
        { "role": "system", "content": system() },
        { "role": "user", "content": "What does src/cache.rs do?" },
        { "role": "assistant", "content": "I will read it." },
        { "role": "user", "content": "Then say what you found." },
    ]);
    (first, second)
}

fn start(data: &Path, extra: &[&str]) -> Service {
    let s = Service::start_with(data, extra);
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-tools");
    s.add_model("tools", &model);
    s
}

/// The answer's text and the job's figures.
fn ask(s: &Service, body: &Value) -> (Value, Value) {
    let answer = s.post("/v1/chat/completions", body.clone());
    let id: i64 = answer["id"]
        .as_str()
        .and_then(|t| t.strip_prefix("chatcmpl-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{answer}"));
    let job = s.wait_final(id, Duration::from_secs(60));
    (
        answer["choices"][0]["message"].clone(),
        job["stats"].clone(),
    )
}

#[test]
fn a_second_turn_reads_what_it_shares_with_the_first_from_the_cache_and_answers_as_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = turns();

    let plain = start(&dir.path().join("plain"), &["--no-prefix-cache"]);
    let (want_first, stats) = ask(&plain, &first);
    assert_eq!(stats["prefix_tokens"], 0);
    let (want_second, stats) = ask(&plain, &second);
    assert_eq!(stats["prefix_tokens"], 0);
    assert!(stats["prompt_tokens"].as_u64().unwrap() > 512, "{stats}");
    plain.stop();
    assert!(!dir.path().join("plain/prefix").exists());

    let data = dir.path().join("cached");
    let s = start(&data, &[]);
    let (got, stats) = ask(&s, &first);
    assert_eq!(got, want_first);
    assert_eq!(stats["prefix_tokens"], 0, "nothing cached yet");
    let (got, stats) = ask(&s, &second);
    assert_eq!(got, want_second, "the cached prefix changed the answer");
    // The first block, and the tail to where the first turn's prompt ended.
    let reused = stats["prefix_tokens"].as_u64().unwrap();
    let prompt = stats["prompt_tokens"].as_u64().unwrap();
    assert!(reused > 512 && reused < prompt, "{stats}");
    assert!(stats["prefix_bytes"].as_u64().unwrap() > 0);
    // The dashboard's figures, once sampled (every second).
    let started = std::time::Instant::now();
    let prefix = loop {
        let metrics = s.get("/api/metrics");
        let prefix = metrics["metrics"]["prefix"].clone();
        if prefix["hits"].as_u64().unwrap_or(0) >= 1 {
            break prefix;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(prefix["reused_tokens"], reused, "{prefix}");
    assert!(prefix["disk_blocks"].as_u64().unwrap() >= 1, "{prefix}");
    s.stop();

    // A restarted service reads the block back from the folder.
    let s = Service::start(&data);
    let (got, stats) = ask(&s, &second);
    assert_eq!(got, want_second);
    assert!(
        stats["prefix_tokens"].as_u64().unwrap() >= reused,
        "{stats}"
    );
    s.stop();
}
