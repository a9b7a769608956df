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
    // The call's id and name come first, its arguments after in pieces.
    assert!(calls.iter().all(|c| c[0]["index"] == 0), "{body}");
    assert_eq!(calls[0][0]["function"]["name"], call["function"]["name"]);
    // Ids are unique over a session: each answer's calls have their own.
    assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
    assert_ne!(calls[0][0]["id"], call["id"]);
    assert!(
        calls[1..].iter().all(|c| c[0].get("id").is_none()),
        "{body}"
    );
    let arguments: String = calls
        .iter()
        .filter_map(|c| c[0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, call["function"]["arguments"].as_str().unwrap());
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{body}");
}

/// A forced choice makes the model call a tool it would not have called,
/// and a job that resumes mid-answer keeps to it.
#[test]
fn a_forced_tool_choice_holds_the_answer_to_a_call() {
    let (_dir, s) = started();
    let sum = json!([{ "role": "user", "content": "What is 2 plus 3?" }]);
    let free = s.post(
        "/v1/chat/completions",
        json!({ "model": "tools", "tools": tools(), "messages": sum }),
    );
    assert_eq!(free["choices"][0]["finish_reason"], "stop", "{free}");
    for choice in [
        json!("required"),
        json!({ "type": "function", "function": { "name": "read_file" } }),
    ] {
        let forced = s.post(
            "/v1/chat/completions",
            json!({ "model": "tools", "tools": tools(), "messages": sum, "tool_choice": choice }),
        );
        let choice_out = &forced["choices"][0];
        assert_eq!(
            choice_out["finish_reason"], "tool_calls",
            "{choice}: {forced}"
        );
        let call = &choice_out["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "read_file", "{forced}");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args.is_object(), "{forced}");
    }
    let (status, err) = s.call(
        "POST",
        "/v1/chat/completions",
        Some(
            &json!({ "model": "tools", "tools": tools(), "messages": sum,
                      "tool_choice": { "type": "function", "function": { "name": "rm" } } }),
        ),
    );
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "tool_choice", "{err}");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("`rm`"),
        "{err}"
    );
}

/// While a long prompt is read, every stream says how far it has come (an
/// SSE comment, which clients skip), as well as keeping alive.
#[test]
fn a_stream_reports_prompt_progress_while_the_prompt_is_read() {
    let dir = tempfile::tempdir().unwrap();
    // Each report of prompt reading waits 600 ms and the stream reports at
    // most every 500 ms: a ~970-token prompt, read in two passes, is
    // reported at least twice.
    // Without a prefix cache, or the second request would read the first's
    // prompt from it.
    let s = Service::start_env(
        &dir.path().join("data"),
        &["--no-prefix-cache"],
        &[(
            "LONGHAUL_FAULTS",
            "prompt-delay-ms=600,prompt-report-ms=500",
        )],
    );
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-tools");
    s.add_model("tools", &model);
    let long = "The project streams expert weights from several drives. ".repeat(60);
    let ask = json!({ "model": "tools", "stream": true, "max_tokens": 4,
                      "messages": [{ "role": "user", "content": long }] });
    for (path, body) in [
        ("/v1/chat/completions", ask.clone()),
        ("/v1/messages", ask.clone()),
        (
            "/v1/responses",
            json!({ "model": "tools", "stream": true, "max_output_tokens": 4, "input": long }),
        ),
    ] {
        let (status, text) = s.call_text("POST", path, Some(&body), true);
        assert_eq!(status, 200, "{path}: {text}");
        let reports: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(": prompt: "))
            .collect();
        assert!(reports.len() >= 2, "{path}: {text}");
        assert!(
            reports.iter().all(|r| r.ends_with(" tokens read")),
            "{reports:?}"
        );
        assert!(text.contains("data: "), "{path}: the answer follows");
    }
}
