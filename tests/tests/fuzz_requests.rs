//! Job request bodies as the service's HTTP API takes them, mutated a fixed
//! number of times in CI (the fuzz target `job_request`, see `fuzz/`): a
//! request or an error, never a panic. The mutations are the engine's smoke
//! test's, from the same file.

#[path = "../../engine/tests/common/mutate.rs"]
mod mutate;

use serde_json::json;

#[test]
fn job_requests() {
    let seeds = [
        json!({ "model": "m", "prompt": "Audit this", "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 1, "stop": ["\n\n"], "title": "t", "priority": 2 }),
        json!({ "model": "m", "messages": [{ "role": "system", "content": "Be brief." }, { "role": "user", "content": "Hi" }], "attachments": ["/tmp"] }),
    ];
    mutate::fuzz("job_request", &seeds, |bytes| {
        longhaul_service::http::jobs::check_submission(bytes).is_ok()
    });
}
