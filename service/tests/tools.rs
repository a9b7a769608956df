//! Tool calls through the OpenAI endpoint with the tool demo model
//! (`assets/longhaul-demo-tools`, trained to call tools as Qwen3 does):
//! the tools reach the template, the answer comes back as `tool_calls`,
//! whole and streamed, and the tool's result renders into the second turn.

mod support;

use std::path::Path;

use serde_json::{Value, json};
use support::Service;

fn tools() -> Value {
    json!([{ "type": "function", "function": { "name": "read_file",
        "description": "Reads a file of the project.",
        "parameters": { "type": "object", "properties": { "path": { "type": "string" } },
                        "required": ["path"] } } }])
}

fn started() -> (tempfile::TempDir, Service) {
    let dir = tempfile::tempdir().unwrap();
    let s = Service::start(&dir.path().join("data"));
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-tools");
    s.add_model("tools", &model);
    (dir, s)
}

const QUESTION: &str = "What does src/cache.rs do?";

#[test]
fn a_call_comes_back_as_tool_calls_and_its_result_feeds_the_next_turn() {
    let (_dir, s) = started();
    let ask = json!({ "model": "tools", "tools": tools(),
                      "messages": [{ "role": "user", "content": QUESTION }] });
    let first = s.post("/v1/chat/completions", ask.clone());
    let choice = &first["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{first}");
    assert_eq!(choice["message"]["content"], Value::Null, "{first}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "read_file", "{first}");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({ "path": "src/cache.rs" }));

    // The call and its result go back; the model answers from the result.
    let mut turn = ask.clone();
    turn["messages"] = json!([
        { "role": "user", "content": QUESTION },
        { "role": "assistant", "content": null, "tool_calls": [call] },
        { "role": "tool", "tool_call_id": call["id"],
          "content": "// src/cache.rs: keeps the hottest experts in memory." },
    ]);
    let second = s.post("/v1/chat/completions", turn);
    let answer = &second["choices"][0];
    assert_eq!(answer["finish_reason"], "stop", "{second}");
    assert!(
        answer["message"]["content"]
            .as_str()
            .unwrap()
            .contains("keeps the hottest experts in memory"),
        "{second}"
    );

    // Streamed: no text, the same call in one delta, then the finish.
    let mut streamed = ask;
    streamed["stream"] = json!(true);
    let (status, body) = s.call_text("POST", "/v1/chat/completions", Some(&streamed), true);
    assert_eq!(status, 200, "{body}");
    let chunks: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "", "{body}");
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(calls.len(), 1, "{body}");
    assert_eq!(calls[0][0]["index"], 0);
    // Ids are unique over a session: each answer's calls have their own.
    assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
    assert_ne!(calls[0][0]["id"], call["id"]);
    assert_eq!(calls[0][0]["function"], call["function"]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{body}");
}
