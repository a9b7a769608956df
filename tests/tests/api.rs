//! The service end to end: the real binary, real HTTP, real SQLite.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Service, expected, fixture};

const FIXTURE: &str = "deepseek_v3_released";
const WAIT: Duration = Duration::from_secs(60);

fn started() -> (tempfile::TempDir, Service) {
    let dir = tempfile::tempdir().unwrap();
    let s = Service::start(&dir.path().join("data"));
    s.add_model("tiny", &fixture(FIXTURE));
    (dir, s)
}

#[test]
fn the_api_needs_the_token_and_a_local_host() {
    let (_dir, s) = started();
    let (status, body) = s.call_text("GET", "/api/jobs", None, false);
    assert_eq!(status, 401, "{body}");
    let err: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err["error"]["type"], "authentication_error");
    let (status, _) = s.call_text("GET", "/api/health", None, false);
    assert_eq!(status, 200, "health needs no token");
    // A page on another name that resolves here (DNS rebinding) is refused.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let r = agent
        .get(format!("{}/api/jobs", s.url))
        .header("Host", "evil.example:80")
        .header("Authorization", &format!("Bearer {}", s.token))
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // Nor one that only starts like this machine, nor a second Host.
    use std::io::{Read, Write};
    let host = s.url.trim_start_matches("http://");
    let raw = |headers: &str| {
        let mut conn = std::net::TcpStream::connect(host).unwrap();
        write!(
            conn,
            "GET /api/health HTTP/1.1\r\n{headers}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        let _ = conn.read_to_string(&mut reply);
        reply
    };
    assert!(raw(&format!("Host: {host}\r\n")).starts_with("HTTP/1.1 200"));
    for headers in [
        "Host: [::1]evil.com\r\n".to_string(),
        "Host: localhost:evil.com\r\n".to_string(),
        "Host: 127.0.0.1:7433@evil.com\r\n".to_string(),
        format!("Host: {host}\r\nHost: evil.com\r\n"),
    ] {
        let reply = raw(&headers);
        assert!(reply.starts_with("HTTP/1.1 403"), "{headers}: {reply}");
    }
    // CORS: the desktop shell's origin is allowed, others get no grant.
    let allowed = agent
        .get(format!("{}/api/health", s.url))
        .header("Origin", "tauri://localhost")
        .call()
        .unwrap();
    assert_eq!(
        allowed.headers()["access-control-allow-origin"],
        "tauri://localhost"
    );
    let other = agent
        .get(format!("{}/api/health", s.url))
        .header("Origin", "https://evil.example")
        .call()
        .unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());
    // Bodies are bounded: a declared 20 MB body is refused before it is read.
    let mut conn = std::net::TcpStream::connect(host).unwrap();
    write!(
        conn,
        "POST /api/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 20000000\r\nConnection: close\r\n\r\n",
        s.token
    )
    .unwrap();
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(
        reply.contains("16 MiB limit"),
        "an API error, not plain text: {reply}"
    );
}

#[test]
fn a_job_runs_through_the_queue_and_matches_transformers() {
    let (_dir, s) = started();
    let exp = expected(FIXTURE);
    let (status, job) = s.call(
        "POST",
        "/api/jobs",
        Some(&json!({
            "model": "tiny",
            "prompt": exp["prompt"],
            "max_tokens": 32,
            "title": "reference prompt",
        })),
    );
    assert_eq!(status, 201, "{job}");
    assert!(["queued", "running"].contains(&job["state"].as_str().unwrap()));
    let id = job["id"].as_i64().unwrap();
    let done = s.wait_final(id, WAIT);
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(
        done["output"], exp["greedy_text"],
        "greedy output as transformers"
    );
    assert_eq!(done["title"], "reference prompt");
    let stats = &done["stats"];
    assert!(
        stats["tokens_per_second"].as_f64().unwrap() > 0.0,
        "{stats}"
    );
    assert!(stats["time_to_first_token_s"].as_f64().is_some(), "{stats}");
    assert!(stats["wall_seconds"].as_f64().unwrap() > 0.0);

    let (status, md) = s.call_text(
        "GET",
        &format!("/api/jobs/{id}/export?format=markdown"),
        None,
        true,
    );
    assert_eq!(status, 200);
    assert!(md.starts_with("# reference prompt"), "{md}");
    assert!(md.contains(exp["greedy_text"].as_str().unwrap()));
    assert!(md.contains("max_tokens 32"));
    let (status, exported) = s.call("GET", &format!("/api/jobs/{id}/export?format=json"), None);
    assert_eq!(status, 200);
    assert_eq!(exported["output"], done["output"]);
    assert_eq!(exported["request"]["settings"]["max_tokens"], 32);
    let list = s.get("/api/jobs");
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1);
    assert!(
        list["jobs"][0].get("output").is_none(),
        "lists leave output out"
    );
}

#[test]
fn bad_requests_say_what_is_wrong() {
    let (dir, s) = started();
    let pipe = dir.path().join("pipe");
    let c = std::ffi::CString::new(pipe.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let cases = [
        (
            json!({ "model": "tiny", "prompt": "hi", "temperature": -1 }),
            "temperature",
        ),
        (
            json!({ "model": "tiny", "prompt": "hi", "top_p": 0 }),
            "top_p",
        ),
        (
            json!({ "model": "tiny", "prompt": "hi", "max_tokens": 0 }),
            "max_tokens",
        ),
        (json!({ "model": "nope", "prompt": "hi" }), "model"),
        (json!({ "model": "tiny", "prompt": "  " }), "prompt"),
        (
            json!({ "model": "tiny", "messages": [{ "role": "robot", "content": "hi" }] }),
            "messages",
        ),
        (
            json!({ "model": "tiny", "prompt": "hi", "attachments": ["/no/such/dir"] }),
            "attachments",
        ),
        // Each once hung or killed the service; three pipes, more than its async workers.
        (
            json!({ "model": "tiny", "prompt": "hi", "attachments": [pipe, pipe, pipe] }),
            "attachments",
        ),
        (
            json!({ "model": "tiny", "prompt": "hi", "attachments": ["/dev/zero"] }),
            "attachments",
        ),
    ];
    for (body, param) in cases {
        let (status, err) = s.call("POST", "/api/jobs", Some(&body));
        assert_eq!(status, 400, "{body}: {err}");
        assert_eq!(err["error"]["param"], param, "{err}");
    }
    // A model's name becomes a path: no slashes, no climbing out.
    for name in ["a/b", "../x", "..", "a\\b"] {
        let body = json!({ "name": name, "path": fixture(FIXTURE) });
        let (status, err) = s.call("POST", "/api/models", Some(&body));
        assert_eq!(status, 400, "{name}: {err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(name),
            "{err}"
        );
    }
    for path in ["/dev/zero".into(), pipe] {
        let body = json!({ "model": "tiny", "prompt": "hi", "attachments": [path] });
        let (status, err) = s.call("POST", "/api/jobs/preview", Some(&body));
        assert_eq!(status, 400, "{body}: {err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(" is a "),
            "{err}"
        );
    }
    let (status, err) = s.call(
        "POST",
        "/api/jobs",
        Some(&json!({ "model": "tiny", "prompt": "hi", "temprature": 1 })),
    );
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("temprature"),
        "{err}"
    );
    let (status, _) = s.call("GET", "/api/jobs/999", None);
    assert_eq!(status, 404);
    assert_eq!(
        s.get("/api/jobs")["jobs"].as_array().unwrap().len(),
        0,
        "nothing queued"
    );
    let (status, err) = s.call(
        "POST",
        "/api/models",
        Some(&json!({ "name": "x", "path": "/no/such/model" })),
    );
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/no/such/model: no such file or folder")
    );
}

#[test]
fn attachments_become_part_of_the_prompt() {
    let (dir, s) = started();
    let folder = dir.path().join("project");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("main.rs"), "fn main() {}").unwrap();
    std::fs::write(folder.join("blob.bin"), [0u8, 1, 2]).unwrap();
    let job = s.post(
        "/api/jobs",
        json!({ "model": "tiny", "prompt": "Audit this.", "attachments": [folder], "max_tokens": 4 }),
    );
    let attached = job["request"]["attachments"].as_str().unwrap();
    assert!(attached.contains("main.rs ===\nfn main() {}"), "{attached}");
    assert!(!attached.contains("blob.bin"));
    let id = job["id"].as_i64().unwrap();
    assert_eq!(s.wait_final(id, WAIT)["state"], "done");
}

#[test]
fn pause_resume_and_cancel_keep_the_answer_whole() {
    let (dir, s) = started();
    s.add_model("long", &support::synth_model(dir.path()));
    let body = json!({ "model": "long", "prompt": "Draft an architecture", "max_tokens": 600, "temperature": 0.8, "seed": 3 });
    let reference = s.post("/api/jobs", body.clone());
    let reference = s.wait_final(reference["id"].as_i64().unwrap(), WAIT);
    assert_eq!(reference["state"], "done");

    let total = reference["tokens"].as_u64().unwrap();
    assert!(
        total >= 100,
        "a long enough answer to pause in: {total} tokens"
    );

    let id = s.post("/api/jobs", body.clone())["id"].as_i64().unwrap();
    let queued = s.post("/api/jobs", body)["id"].as_i64().unwrap();
    s.wait_state(id, "running", WAIT);
    while s.get(&format!("/api/jobs/{id}"))["tokens"]
        .as_u64()
        .unwrap()
        == 0
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let paused = s.post(&format!("/api/jobs/{id}/pause"), json!({}));
    assert_eq!(paused["state"], "paused");
    let at_pause = paused["tokens"].as_u64().unwrap();
    assert!(
        at_pause > 0 && at_pause < total,
        "paused part-way: {at_pause} of {total}"
    );
    assert_eq!(paused["pause_reason"], "paused by the user");
    // The waiting job cannot be paused twice nor resumed while queued.
    let (status, err) = s.call(
        "POST",
        &format!("/api/jobs/{queued}/resume"),
        Some(&json!({})),
    );
    assert_eq!(status, 409, "{err}");
    let cancelled = s.post(&format!("/api/jobs/{queued}/cancel"), json!({}));
    assert_eq!(cancelled["state"], "cancelled");
    s.post(&format!("/api/jobs/{id}/resume"), json!({}));
    let done = s.wait_final(id, WAIT);
    assert_eq!(done["state"], "done");
    assert_eq!(
        done["output"], reference["output"],
        "paused and resumed = uninterrupted"
    );
    assert_eq!(done["tokens"], reference["tokens"]);
    assert!(
        done["log"].as_str().unwrap().contains("resumed"),
        "{}",
        done["log"]
    );
}

#[test]
fn openai_clients_get_openai_answers_through_the_queue() {
    let (_dir, s) = started();
    let models = s.get("/v1/models");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");

    let messages = json!([{ "role": "user", "content": "Draft an architecture" }]);
    let chat = s.post(
        "/v1/chat/completions",
        json!({ "model": "tiny", "messages": messages, "max_tokens": 24 }),
    );
    assert_eq!(chat["object"], "chat.completion");
    let content = chat["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!content.is_empty());
    let finish = chat["choices"][0]["finish_reason"].clone();
    assert!(finish == "length" || finish == "stop", "{chat}");
    // The same request as a job gives the same text: one queue, one engine.
    let job = s.post(
        "/api/jobs",
        json!({ "model": "tiny", "messages": messages, "max_tokens": 24 }),
    );
    let job = s.wait_final(job["id"].as_i64().unwrap(), WAIT);
    assert_eq!(job["output"], content);
    assert_eq!(chat["usage"]["completion_tokens"], job["tokens"]);
    let jobs = s.get("/api/jobs");
    assert!(
        jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["origin"] == "openai" && j["priority"] == 100)
    );

    // Streaming: the chunks add up to the same text, then [DONE].
    let (status, body) = s.call_text(
        "POST",
        "/v1/chat/completions",
        Some(&json!({ "model": "tiny", "messages": messages, "max_tokens": 24, "stream": true, "stream_options": { "include_usage": true } })),
        true,
    );
    assert_eq!(status, 200);
    let datas: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(datas.last(), Some(&"[DONE]"), "{body}");
    let mut streamed = String::new();
    for d in &datas[..datas.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        streamed.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed, content);
    let last: Value = serde_json::from_str(datas[datas.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], finish);
    assert_eq!(last["usage"]["completion_tokens"], job["tokens"]);

    let completion = s.post(
        "/v1/completions",
        json!({ "model": "tiny", "prompt": "Draft an architecture", "max_tokens": 8, "seed": 1 }),
    );
    assert_eq!(completion["object"], "text_completion");
    assert!(completion["usage"]["completion_tokens"].as_u64().unwrap() <= 8);
    assert!(completion["choices"][0]["text"].is_string());

    // What cannot be honoured is refused, OpenAI-style, never ignored.
    for (field, value) in [
        ("logit_bias", json!({"1": 5})),
        // This model's template and vocabulary show no tool-call format.
        (
            "tools",
            json!([{ "type": "function", "function": { "name": "f" } }]),
        ),
        ("tool_choice", json!("required")),
        ("response_format", json!({ "type": "json_object" })),
        ("n", json!(2)),
        // Out of OpenAI's range.
        ("frequency_penalty", json!(2.5)),
        ("presence_penalty", json!(-3)),
        ("repetition_penalty", json!(0)),
    ] {
        let mut body = json!({ "model": "tiny", "messages": messages });
        body[field] = value;
        let (status, err) = s.call("POST", "/v1/chat/completions", Some(&body));
        assert_eq!(status, 400, "{field}: {err}");
        assert_eq!(err["error"]["param"], field);
        assert_eq!(err["error"]["type"], "invalid_request_error");
    }
    // Penalties are honoured (engine/tests/penalties.rs checks the
    // answers), and kept with the job.
    let mut body = json!({ "model": "tiny", "messages": messages, "max_tokens": 4 });
    body["frequency_penalty"] = json!(0.5);
    body["presence_penalty"] = json!(0.25);
    body["repetition_penalty"] = json!(1.2);
    let (status, answer) = s.call("POST", "/v1/chat/completions", Some(&body));
    assert_eq!(status, 200, "{answer}");
    let job = s.post(
        "/api/jobs",
        json!({ "model": "tiny", "prompt": "Draft", "max_tokens": 4, "repetition_penalty": 1.3, "frequency_penalty": -0.5 }),
    );
    let settings = &job["request"]["settings"];
    assert_eq!(
        (
            settings["repetition_penalty"].as_f64(),
            settings["frequency_penalty"].as_f64(),
            settings["presence_penalty"].as_f64()
        ),
        (Some(1.3), Some(-0.5), Some(0.0)),
        "{settings}"
    );
    // The list shows the numbers as given, not widened from f32
    // (1.2999999523162842).
    let listed = s.get("/api/jobs");
    let listed = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == job["id"])
        .unwrap();
    assert_eq!(
        listed["request"]["settings"]["repetition_penalty"],
        json!(1.3)
    );
}

#[test]
fn the_queue_can_be_held_and_reordered() {
    let (_dir, s) = started();
    s.post("/api/queue/pause", json!({}));
    let ids: Vec<i64> = (0..3)
        .map(|i| {
            s.post(
                "/api/jobs",
                json!({ "model": "tiny", "prompt": format!("task {i}"), "max_tokens": 4 }),
            )["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        s.get(&format!("/api/jobs/{}", ids[0]))["state"],
        "queued",
        "held"
    );
    let events = support::follow_events(&s);
    std::thread::sleep(Duration::from_millis(200));
    let moved = s.post(&format!("/api/jobs/{}/move", ids[2]), json!({ "index": 0 }));
    assert_eq!(moved["queue_position"], 1);
    // Watchers hear the new order, in one event.
    loop {
        let (name, data) = events.recv_timeout(WAIT).expect("a queue event");
        if name == "queue" && data["waiting"][0] == ids[2] {
            assert_eq!(data["waiting"], json!([ids[2], ids[0], ids[1]]), "{data}");
            break;
        }
    }
    let status = s.get("/api/queue");
    assert_eq!(status["paused"], true);
    assert_eq!(status["waiting"], 3);
    s.post("/api/queue/resume", json!({}));
    for id in &ids {
        assert_eq!(s.wait_final(*id, WAIT)["state"], "done");
    }
    // Reordered: the last submitted ran first.
    let started_at = |id: i64| {
        s.get(&format!("/api/jobs/{id}"))["started_ms"]
            .as_i64()
            .unwrap()
    };
    assert!(started_at(ids[2]) <= started_at(ids[0]));
}

#[test]
fn a_second_service_on_the_same_data_dir_is_refused_and_the_first_runs_on() {
    let (_dir, s) = started();
    let second = std::process::Command::new(support::longhaul())
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(&s.data_dir)
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("another Longhaul service"), "{err}");
    assert!(err.contains(&s.url), "names the running one: {err}");
    let endpoint = std::fs::read_to_string(s.data_dir.join("endpoint")).unwrap();
    assert_eq!(endpoint.trim(), s.url, "the first one's endpoint stays");
    assert_eq!(s.get("/api/jobs")["jobs"].as_array().unwrap().len(), 0);
}

#[cfg(unix)]
#[test]
fn the_data_dir_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, s) = started();
    let job = s.post(
        "/api/jobs",
        json!({ "model": "tiny", "prompt": "hi", "max_tokens": 2 }),
    );
    s.wait_final(job["id"].as_i64().unwrap(), WAIT);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&s.data_dir), 0o700);
    for entry in std::fs::read_dir(&s.data_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
}

/// Runs `longhaul serve` with `env` until it exits by itself; its exit status.
fn serve_until_it_dies(data: &std::path::Path, env: (&str, &str)) -> std::process::ExitStatus {
    let mut child = std::process::Command::new(support::longhaul())
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(data)
        .env(env.0, env.1)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > WAIT {
            let _ = child.kill();
            panic!("the service did not crash");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_job_that_crashes_the_service_three_times_is_failed_and_the_queue_goes_on() {
    let (_dir, s) = started();
    s.post("/api/queue/pause", json!({}));
    let ids: Vec<i64> = ["crashes", "runs"]
        .iter()
        .map(|p| {
            s.post(
                "/api/jobs",
                json!({ "model": "tiny", "prompt": p, "max_tokens": 4 }),
            )["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    let data = s.data_dir.clone();
    s.stop();
    let fault = format!("abort-job={}", ids[0]);
    for _ in 0..3 {
        let status = serve_until_it_dies(&data, ("LONGHAUL_FAULTS", &fault));
        assert!(!status.success(), "{status}");
    }
    let s = Service::start_env(&data, &[], &[("LONGHAUL_FAULTS", &fault)]);
    let crashed = s.wait_final(ids[0], WAIT);
    assert_eq!(crashed["state"], "failed", "{crashed}");
    let error = crashed["error"].as_str().unwrap();
    assert!(
        error.contains("SIGABRT") && error.contains("3 times"),
        "{error}"
    );
    assert_eq!(s.wait_final(ids[1], WAIT)["state"], "done");
}

#[test]
fn a_full_disk_pauses_the_job_with_the_reason_and_resume_finishes_it_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("disk-is-full");
    let faults = format!("db-full-while={},token-delay-ms=40", full.display());
    let s = Service::start_env(
        &dir.path().join("data"),
        &[],
        &[("LONGHAUL_FAULTS", &faults)],
    );
    s.add_model("tiny", &fixture(FIXTURE));
    let body = json!({ "model": "tiny", "prompt": "Once upon a time", "max_tokens": 48 });
    let id = s.post("/api/jobs", body.clone())["id"].as_i64().unwrap();
    s.wait_output(id, WAIT);
    std::fs::write(&full, b"").unwrap();
    // The service keeps answering and says what is wrong while the disk is full.
    let started = std::time::Instant::now();
    loop {
        let queue = s.get("/api/queue");
        if let Some(fault) = queue["storage_fault"].as_str() {
            assert!(fault.contains("database or disk is full"), "{fault}");
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "no storage fault reported: {queue}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The job's own view says it too, though its saved state cannot yet.
    let view = s.get(&format!("/api/jobs/{id}"));
    assert_eq!(view["state"], "running");
    let fault = view["storage_fault"].as_str().unwrap_or_default();
    assert!(fault.contains("database or disk is full"), "{view}");
    std::fs::remove_file(&full).unwrap();
    let paused = s.wait_state(id, "paused", WAIT);
    assert!(paused.get("storage_fault").is_none(), "{paused}");
    let reason = paused["pause_reason"].as_str().unwrap();
    assert!(reason.contains("database or disk is full"), "{reason}");
    assert!(s.get("/api/queue")["storage_fault"].is_null());
    s.post(&format!("/api/jobs/{id}/resume"), json!({}));
    let done = s.wait_final(id, WAIT);
    assert_eq!(done["state"], "done", "{done}");
    // The same request, never interrupted, gives the same answer.
    let again = s.post("/api/jobs", body)["id"].as_i64().unwrap();
    let want = s.wait_final(again, WAIT);
    assert_eq!(done["output"], want["output"]);
    assert_eq!(done["tokens"], want["tokens"]);
}

#[test]
fn every_refusal_is_json_that_names_the_limit_or_field() {
    let (_dir, s) = started();
    // Bodies up to the documented 16 MiB are read (3 MB of JSON whitespace here).
    let padded = format!(
        r#"{{"model": "nope", "prompt": "hi"{}}}"#,
        " ".repeat(3 << 20)
    );
    let (status, err) = s.post_raw("/api/jobs", &padded);
    assert_eq!(
        (status, &err["error"]["param"]),
        (400, &json!("model")),
        "{err}"
    );
    // (Past the limit: see the_api_needs_the_token_and_a_local_host.)
    // A value of the wrong type names its field.
    let (status, err) = s.call(
        "POST",
        "/api/jobs",
        Some(&json!({ "model": "tiny", "prompt": "hi", "temperature": "hot" })),
    );
    assert_eq!(
        (status, &err["error"]["param"]),
        (400, &json!("temperature")),
        "{err}"
    );
    let (status, err) = s.call("GET", "/api/jobs/abc", None);
    assert_eq!(
        (status, &err["error"]["param"]),
        (400, &json!("id")),
        "{err}"
    );
    // The preview takes the same fields as a submission, checked the same way.
    let body = json!({ "model": "tiny", "prompt": "hi", "max_tokens": 8, "seed": 1 });
    assert!(
        s.post("/api/jobs/preview", body)["prompt_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let (status, err) = s.call(
        "POST",
        "/api/jobs/preview",
        Some(&json!({ "model": "tiny", "prompt": "hi", "top_p": 0 })),
    );
    assert_eq!(
        (status, &err["error"]["param"]),
        (400, &json!("top_p")),
        "{err}"
    );
    // The token in the query string opens the event stream and downloads only.
    let (status, _) = s.call_text("GET", &format!("/api/jobs?token={}", s.token), None, false);
    assert_eq!(status, 401);
    // Not another path that ends in /export, nor another method on one.
    s.add_model("export", &fixture(FIXTURE));
    for (method, path) in [
        ("DELETE", "/api/models/export"),
        ("DELETE", "/api/jobs/1/export"),
        ("GET", "/api/models/export"),
    ] {
        let (status, body) = s.call_text(method, &format!("{path}?token={}", s.token), None, false);
        assert_eq!(status, 401, "{method} {path}: {body}");
    }
    let models = s.get("/api/models");
    assert!(
        models.to_string().contains("\"export\""),
        "the model named export is still there: {models}"
    );
}

#[test]
fn openai_content_parts_and_a_negative_seed_are_understood() {
    let (_dir, s) = started();
    let (status, answer) = s.call(
        "POST",
        "/v1/chat/completions",
        Some(&json!({
            "model": "tiny",
            "messages": [{ "role": "user", "content": [{ "type": "text", "text": "Hello" }] }],
            "seed": -1,
            "max_tokens": 2,
        })),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "chat.completion");
    let (status, err) = s.call(
        "POST",
        "/v1/chat/completions",
        Some(&json!({
            "model": "tiny",
            "messages": [{ "role": "user", "content": [{ "type": "image_url", "image_url": {} }] }],
        })),
    );
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("image_url"),
        "{err}"
    );
}

#[test]
fn an_attachment_that_cannot_be_read_is_named_and_nothing_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let s = Service::start_env(
        &dir.path().join("data"),
        &[],
        &[("LONGHAUL_FAULTS", "attach-eio=notes.txt")],
    );
    s.add_model("tiny", &fixture(FIXTURE));
    let folder = dir.path().join("project");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("main.rs"), "fn main() {}").unwrap();
    std::fs::write(folder.join("notes.txt"), "read me").unwrap();
    let body = json!({ "model": "tiny", "prompt": "Audit this.", "attachments": [folder] });
    let (status, err) = s.call("POST", "/api/jobs", Some(&body));
    assert_eq!(
        (status, &err["error"]["param"]),
        (400, &json!("attachments")),
        "{err}"
    );
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("notes.txt") && message.contains("Input/output error"),
        "{message}"
    );
    assert_eq!(s.get("/api/jobs")["jobs"].as_array().unwrap().len(), 0);
}

#[test]
fn an_empty_queue_database_is_reported_at_start() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("queue.sqlite"), b"").unwrap();
    let mut child = std::process::Command::new(support::longhaul())
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(&data)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = Vec::new();
    for line in stderr.lines().map_while(Result::ok) {
        let opened = line.starts_with("Open ");
        said.push(line);
        if opened {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        said.iter()
            .any(|l| l.contains("queue.sqlite is empty (0 bytes)")),
        "{said:?}"
    );
    // Captured output (a log) never holds the token.
    let token = std::fs::read_to_string(data.join("token")).unwrap();
    assert!(said.iter().all(|l| !l.contains(token.trim())), "{said:?}");
}

/// A job must fit the model's context (`max_position_embeddings`, 64 for
/// the fixture): an explicit `max_tokens` that does not fit and a prompt
/// that leaves no room are refused with the numbers; without `max_tokens`
/// the answer may take all the context leaves, and a `max_tokens` sent as a
/// cap is cut to fit. Preview shows the context.
#[test]
fn jobs_that_cannot_fit_the_context_are_refused_with_the_numbers() {
    let (_tmp, s) = started();
    let preview = s.post(
        "/api/jobs/preview",
        json!({ "model": "tiny", "prompt": "Draft" }),
    );
    assert_eq!(preview["context_tokens"], 64, "{preview}");
    let prompt = preview["prompt_tokens"].as_u64().unwrap();
    let body = json!({ "model": "tiny", "prompt": "Draft", "max_tokens": 70 });
    let (status, err) = s.call("POST", "/api/jobs", Some(&body));
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "max_tokens");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "the prompt ({prompt} tokens) plus max_tokens (70)"
        )) && message.contains("context of 64 tokens")
            && message.contains(&format!("lower max_tokens to at most {}", 64 - prompt)),
        "{message}"
    );
    let long = "storage engine audit ".repeat(40);
    let (status, err) = s.call(
        "POST",
        "/api/jobs",
        Some(&json!({ "model": "tiny", "prompt": long })),
    );
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shorten the prompt"),
        "{err}"
    );
    let job = s.post("/api/jobs", json!({ "model": "tiny", "prompt": "Draft" }));
    assert_eq!(
        job["request"]["settings"]["max_tokens"].as_u64(),
        Some(64 - prompt),
        "{job}"
    );
    // A max_tokens sent as a cap (a follow-up keeping its task's length)
    // is cut to fit instead of refused.
    let job = s.post(
        "/api/jobs",
        json!({ "model": "tiny", "prompt": "Draft", "max_tokens": 70, "fit_max_tokens": true }),
    );
    assert_eq!(
        job["request"]["settings"]["max_tokens"].as_u64(),
        Some(64 - prompt),
        "{job}"
    );
    // Unset, max_tokens is all the context leaves, past the old default
    // of 1,024 where the context is longer.
    let tmp = tempfile::tempdir().unwrap();
    let wide = support::copy_fixture(FIXTURE, &tmp.path().join("wide"));
    let config = wide.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    c["max_position_embeddings"] = json!(5000);
    std::fs::write(&config, c.to_string()).unwrap();
    s.add_model("wide", &wide);
    let job = s.post("/api/jobs", json!({ "model": "wide", "prompt": "Draft" }));
    assert_eq!(
        job["request"]["settings"]["max_tokens"].as_u64(),
        Some(5000 - prompt),
        "{job}"
    );
    // The OpenAI endpoints are admitted the same way: refused with the
    // numbers, and nothing queued.
    let before = s.get("/api/jobs")["jobs"].as_array().unwrap().len();
    for (path, body) in [
        (
            "/v1/completions",
            json!({ "model": "tiny", "prompt": long, "max_tokens": 4 }),
        ),
        (
            "/v1/chat/completions",
            json!({ "model": "tiny", "messages": [{ "role": "user", "content": long }] }),
        ),
        (
            "/v1/completions",
            json!({ "model": "tiny", "prompt": "Draft", "max_tokens": 70 }),
        ),
    ] {
        let (status, err) = s.call("POST", path, Some(&body));
        assert_eq!(status, 400, "{path}: {err}");
        assert_eq!(err["error"]["param"], "max_tokens", "{path}: {err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("tokens) plus max_tokens (")
                && message.contains("context of 64 tokens"),
            "{path}: {message}"
        );
    }
    assert_eq!(s.get("/api/jobs")["jobs"].as_array().unwrap().len(), before);
}

#[test]
fn a_long_prompt_shows_its_reading_and_cancel_stops_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // Each forward pass waits 400 ms: a prompt of 3 passes reads for ~1.6 s.
    let s = Service::start_env(
        &dir.path().join("data"),
        &[],
        &[("LONGHAUL_FAULTS", "token-delay-ms=400")],
    );
    s.add_model("synth", &support::synth_model(dir.path()));
    let events = support::follow_events(&s);
    let prompt = "x".repeat(2 * longhaul_engine::PROMPT_CHUNK + 100);
    let body = json!({ "model": "synth", "prompt": prompt, "max_tokens": 8 });
    let id = s.post("/api/jobs", body.clone())["id"].as_i64().unwrap();
    let next = s.post(
        "/api/jobs",
        json!({ "model": "synth", "prompt": "hi", "max_tokens": 1 }),
    )["id"]
        .as_i64()
        .unwrap();

    // Progress while the prompt is read, in events and in the job itself.
    let reading = loop {
        let (name, e) = events.recv_timeout(WAIT).expect("a progress event");
        if name == "job" && e["id"] == id && e["prompt"]["done"].as_u64().unwrap_or(0) > 0 {
            break e;
        }
    };
    let total = reading["prompt"]["total"].as_u64().unwrap();
    assert!(total >= prompt.len() as u64, "{reading}");
    assert!(
        reading["prompt"]["done"].as_u64().unwrap() < total,
        "{reading}"
    );
    assert_eq!(reading["tokens"], 0);
    let shown = s.get(&format!("/api/jobs/{id}"));
    assert_eq!(shown["state"], "running");
    assert!(
        shown["live"]["prompt"]["done"].as_u64().unwrap() > 0,
        "the job says how far its prompt is read: {shown}"
    );
    assert!(
        shown["stats"]["wall_seconds"].as_f64().unwrap() > 0.0,
        "{shown}"
    );

    // Cancel lands between two passes, not after the whole prompt.
    let asked = std::time::Instant::now();
    s.post(&format!("/api/jobs/{id}/cancel"), json!({}));
    let started_next = s.wait_state(next, "running", WAIT);
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_millis(1500),
        "the runner was held {waited:?} after the cancel: {started_next}"
    );
    let cancelled = s.get(&format!("/api/jobs/{id}"));
    assert_eq!(cancelled["state"], "cancelled");
    assert_eq!(cancelled["tokens"], 0);
    assert!(cancelled["live"].is_null(), "{cancelled}");
}

#[test]
fn a_running_job_shows_its_figures_and_a_paused_one_counts_what_was_kept() {
    let dir = tempfile::tempdir().unwrap();
    let s = Service::start_env(
        &dir.path().join("data"),
        &[],
        &[("LONGHAUL_FAULTS", "token-delay-ms=40")],
    );
    s.add_model("synth", &support::synth_model(dir.path()));
    let events = support::follow_events(&s);
    let body = json!({ "model": "synth", "prompt": "Audit", "max_tokens": 2000 });
    let id = s.post("/api/jobs", body)["id"].as_i64().unwrap();
    // Between two commits (every 16 tokens): some output is not yet saved.
    loop {
        let (name, e) = events.recv_timeout(WAIT).expect("progress");
        let tokens = e["tokens"].as_u64().unwrap_or(0);
        if name == "job" && e["id"] == id && tokens > 20 && (4..12).contains(&(tokens % 16)) {
            break;
        }
    }
    let running = s.get(&format!("/api/jobs/{id}"));
    let st = &running["stats"];
    assert!(
        st["tokens_per_second"].as_f64().unwrap() > 0.0
            && st["time_to_first_token_s"].as_f64().is_some()
            && st["wall_seconds"].as_f64().unwrap() > 0.0
            && st["prompt_tokens"].as_u64().unwrap() > 0,
        "a running job's figures: {st}"
    );
    assert!(
        running["live"]["eta_seconds"].as_f64().is_some(),
        "{running}"
    );
    let paused = s.post(&format!("/api/jobs/{id}/pause"), json!({}));
    assert_eq!(paused["state"], "paused");
    let last = loop {
        let (name, e) = events.recv_timeout(WAIT).expect("the paused event");
        if name == "job" && e["id"] == id && e["state"] == "paused" {
            break e;
        }
    };
    let kept = s.get(&format!("/api/jobs/{id}"));
    assert_eq!(
        last["tokens"], kept["tokens"],
        "the event and the job agree on what a pause kept: {last}"
    );
    let list = s.get("/api/jobs");
    let listed = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id)
        .unwrap();
    assert_eq!(listed["tokens"], kept["tokens"]);
}

#[test]
fn sigterm_stops_the_service_while_an_event_stream_is_open() {
    let (_dir, s) = started();
    let events = support::follow_events(&s);
    let (name, _) = events.recv_timeout(WAIT).expect("the stream is open");
    assert_eq!(name, "resync");
    let endpoint = s.data_dir.join("endpoint");
    let asked = std::time::Instant::now();
    let status = s
        .terminate(Duration::from_secs(20))
        .expect("the service exits on SIGTERM");
    assert!(status.success(), "{status}");
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "the open stream held the stop for {:?}",
        asked.elapsed()
    );
    // The stream was ended, not left hanging.
    loop {
        match events.recv_timeout(Duration::from_secs(5)) {
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(e, std::sync::mpsc::RecvTimeoutError::Disconnected);
                break;
            }
        }
    }
    assert!(!endpoint.exists(), "a stopped service leaves no endpoint");
}

#[test]
fn sampling_left_unset_follows_the_models_generation_config() {
    let (_dir, s) = started();
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe");
    s.add_model("demo", &demo);
    s.post("/api/queue/pause", json!({}));
    let settings = |body: Value| s.post("/api/jobs", body)["request"]["settings"].clone();
    // The demo checkpoint asks for do_sample, temperature 0.7, top-p 0.9 (top-k: transformers' 50).
    let unset = settings(json!({ "model": "demo", "prompt": "hi", "max_tokens": 4 }));
    assert_eq!(
        unset["temperature"].as_f64().map(|t| (t * 100.0).round()),
        Some(70.0),
        "{unset}"
    );
    assert_eq!(
        unset["top_p"].as_f64().map(|t| (t * 100.0).round()),
        Some(90.0),
        "{unset}"
    );
    assert_eq!(unset["top_k"], 50, "{unset}");
    assert_eq!(unset["sampling_from"], "the model's generation_config.json");
    // Greedy stays one setting away, and says nothing came from the model.
    let greedy =
        settings(json!({ "model": "demo", "prompt": "hi", "max_tokens": 4, "temperature": 0 }));
    assert_eq!(greedy["temperature"], 0.0);
    assert_eq!(greedy["top_k"], Value::Null);
    assert!(greedy.get("sampling_from").is_none(), "{greedy}");
    // What the request gives wins; what it leaves out still comes from the model.
    let mixed =
        settings(json!({ "model": "demo", "prompt": "hi", "max_tokens": 4, "temperature": 1.2 }));
    assert_eq!(
        mixed["temperature"].as_f64().map(|t| (t * 100.0).round()),
        Some(120.0)
    );
    assert_eq!(mixed["top_k"], 50);
    // A model without sampling settings decodes greedily, as before.
    let plain = settings(json!({ "model": "tiny", "prompt": "hi", "max_tokens": 4 }));
    assert_eq!(plain["temperature"], 0.0);
    assert!(plain.get("sampling_from").is_none());
    let models = s.get("/api/models");
    let listed = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "demo")
        .unwrap();
    assert_eq!(listed["sampling"]["top_k"], 50, "{listed}");
}

#[test]
fn guessing_ahead_leaves_a_jobs_answer_as_it_is() {
    let (_dir, s) = started();
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe");
    s.add_model("demo", &demo);
    // Quoted text: prompt lookup guesses, and most guesses are kept.
    let text = "the cache keeps hot experts; the drive streams cold experts; ".repeat(4);
    let run = |speculate: &str| {
        let body = json!({ "model": "demo", "prompt": text, "max_tokens": 96, "temperature": 0, "speculate": speculate });
        let id = s.post("/api/jobs", body)["id"].as_i64().unwrap();
        s.wait_final(id, WAIT)
    };
    let plain = run("off");
    let guessed = run("lookup");
    let auto = run("auto");
    assert_eq!(guessed["output"], plain["output"]);
    assert_eq!(auto["output"], plain["output"]);
    assert_eq!(guessed["request"]["settings"]["speculate"], "lookup");
    assert!(
        guessed["log"]
            .as_str()
            .unwrap()
            .contains("guessed tokens kept"),
        "{}",
        guessed["log"]
    );
    assert!(!plain["log"].as_str().unwrap().contains("speculation"));
    let spec = &guessed["stats"]["speculation"];
    assert!(
        spec["accepted"].as_u64().unwrap() > 0
            && spec["verify_passes"].as_u64().unwrap() > 0
            && spec["accepted"].as_u64() <= spec["drafted"].as_u64(),
        "the job's statistics say what guessing did: {spec}"
    );
    assert_eq!(plain["stats"]["speculation"]["drafted"], 0);
    let (status, err) = s.call(
        "POST",
        "/api/jobs",
        Some(&json!({ "model": "demo", "prompt": "hi", "speculate": "always" })),
    );
    assert_eq!(status, 400, "{err}");
    // The OpenAI endpoints take the same setting, and keep the same answer.
    for speculate in ["off", "lookup"] {
        let body = json!({ "model": "demo", "prompt": text, "max_tokens": 96, "temperature": 0, "speculate": speculate });
        let completion = s.post("/v1/completions", body);
        assert_eq!(completion["choices"][0]["text"], plain["output"]);
        let chat = json!({ "model": "demo", "messages": [{"role": "user", "content": text}],
                           "max_tokens": 8, "speculate": speculate });
        s.post("/v1/chat/completions", chat);
        let jobs = s.get("/api/jobs");
        let newest = jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .max()
            .unwrap();
        let job = s.get(&format!("/api/jobs/{newest}"));
        assert_eq!(job["request"]["settings"]["speculate"], speculate, "{job}");
    }
    let (status, err) = s.call(
        "POST",
        "/v1/completions",
        Some(&json!({ "model": "demo", "prompt": "hi", "speculate": "always" })),
    );
    assert_eq!(status, 400, "{err}");
}

/// Model files that once aborted the whole service, or answered 500 with a
/// backtrace: a GGUF whose block count is 10^9, and a tokenizer.json whose
/// pattern backtracks without end on the prompt. Each is refused with what
/// and where; the service answers on.
#[test]
fn hostile_model_files_are_refused_and_the_service_answers_on() {
    let (dir, s) = started();
    let mut gguf = std::fs::read(fixture("gguf/qwen3moe-f16.gguf")).unwrap();
    let key = b"qwen3moe.block_count";
    let at = gguf.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    gguf[at..at + 4].copy_from_slice(&1_000_000_000u32.to_le_bytes());
    let hostile = dir.path().join("hostile.gguf");
    std::fs::write(&hostile, &gguf).unwrap();
    let tokenizer = support::copy_fixture(FIXTURE, &dir.path().join("pattern"));
    support::give_backtracking_pattern(&tokenizer);
    let prompt = support::backtracking_prompt();
    s.add_model("hostile", &hostile);
    s.add_model("pattern", &tokenizer);
    // The pattern gives up on this prompt: refused before anything is queued.
    for path in ["/api/jobs/preview", "/api/jobs"] {
        let body = json!({ "model": "pattern", "prompt": prompt });
        let (status, err) = s.call("POST", path, Some(&body));
        assert_eq!(status, 400, "{path}: {err}");
        assert!(err.to_string().contains("gave up"), "{path}: {err}");
    }
    // A GGUF file's tokenizer is read when it loads: the job fails naming the key.
    let id = s.post("/api/jobs", json!({ "model": "hostile", "prompt": "hi" }))["id"]
        .as_i64()
        .unwrap();
    let failed = s.wait_final(id, WAIT);
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(error.contains("qwen3moe.block_count"), "{error}");
    // A 3 GiB generation_config.json (sparse: it takes no disk) is not read:
    // listings show no sampling defaults, and the job says which file.
    let huge = support::copy_fixture(FIXTURE, &dir.path().join("huge"));
    let config = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(huge.join("generation_config.json"))
        .unwrap();
    config.set_len(3 << 30).unwrap();
    s.add_model("huge", &huge);
    for _ in 0..2 {
        let models = s.get("/api/models");
        let listed = models["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "huge")
            .cloned()
            .unwrap_or_default();
        assert!(listed["sampling"].is_null(), "{listed}");
    }
    let id = s.post("/api/jobs", json!({ "model": "huge", "prompt": "hi" }))["id"]
        .as_i64()
        .unwrap();
    let failed = s.wait_final(id, WAIT);
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("generation_config.json") && error.contains("at most"),
        "{error}"
    );
    assert_eq!(s.call("GET", "/api/health", None).0, 200);
}

/// Files under `root` whose names a pack writer gives its extents and
/// resident weights.
fn pack_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                dirs.push(path);
            } else if name.starts_with("experts-") || name.starts_with("resident.") {
                found.push(path);
            }
        }
    }
    found
}

/// Two empty drive folders under `root`.
fn two_drive_folders(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    (0..2)
        .map(|i| {
            let d = root.join(format!("drive{i}"));
            std::fs::create_dir(&d).unwrap();
            d
        })
        .collect()
}

/// A pack that fails on a full drive leaves nothing on the drives, says
/// why, and frees its name.
#[test]
fn a_pack_that_fills_its_drive_leaves_nothing_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let source = support::synth_model(tmp.path());
    let drives = two_drive_folders(tmp.path());
    let data = tmp.path().join("data");
    // Room for a few records, not the whole pack.
    let full = [("LONGHAUL_FAULTS", "pack-enospc-after=65536")];
    let s = Service::start_env(&data, &[], &full);
    let body = json!({ "name": "packed", "source": source, "drives": drives });
    let (status, started) = s.call("POST", "/api/packs", Some(&body));
    assert_eq!(status, 202);
    // Both folders are in one temporary directory: striping buys nothing.
    let warned = started["warnings"].as_array().unwrap();
    assert!(
        warned.len() == 1 && warned[0].as_str().unwrap().contains("are on one device"),
        "{started}"
    );
    let task = wait_for_pack(&s);
    assert_eq!(task["state"], "failed", "{task}");
    let error = task["error"].as_str().unwrap_or_default();
    assert!(error.contains("no space left"), "{task}");
    assert!(error.contains("experts-"), "names the file: {task}");
    assert_eq!(pack_files(tmp.path()), Vec::<std::path::PathBuf>::new());
    assert!(!data.join("packs/packed").exists());
    assert!(!data.join("packs/.packed.packing").exists());
    // The name is free again.
    let (status, _) = s.call("POST", "/api/packs", Some(&body));
    assert_eq!(status, 202);
}

/// The last pack task, once it has stopped.
fn wait_for_pack(s: &Service) -> serde_json::Value {
    let began = std::time::Instant::now();
    loop {
        let packs = s.get("/api/packs");
        let last = packs["packs"].as_array().unwrap().last().cloned().unwrap();
        if last["state"] == "done" || last["state"] == "failed" {
            return last;
        }
        assert!(began.elapsed() < WAIT, "{last}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Packs through the service hold their name from the start and leave
/// nothing behind that did not finish: of four packs of one name one
/// starts; a service killed mid-pack lists it as failed at the next start,
/// with its partial files gone and the name free to pack again.
#[test]
fn a_pack_holds_its_name_and_an_interrupted_one_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let source = support::synth_model(tmp.path());
    let drives = two_drive_folders(tmp.path());
    let data = tmp.path().join("data");
    let slow = [("LONGHAUL_FAULTS", "pack-delay-ms=150")];
    let s = Service::start_env(&data, &[], &slow);
    let body = json!({ "name": "packed", "source": source, "drives": drives });
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| s.call("POST", "/api/packs", Some(&body)).0))
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let started = statuses.iter().filter(|&&c| c == 202).count();
    assert_eq!(started, 1, "{statuses:?}");
    assert!(
        statuses.iter().all(|&c| c == 202 || c == 409),
        "{statuses:?}"
    );
    // Killed once the pack has written to the drives.
    let began = std::time::Instant::now();
    while pack_files(tmp.path()).is_empty() {
        assert!(began.elapsed() < WAIT, "nothing written");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill();
    let s = Service::start_env(&data, &[], &slow);
    let packs = s.get("/api/packs");
    let task = &packs["packs"][0];
    assert_eq!(task["state"], "failed", "{packs}");
    assert!(
        task["error"]
            .as_str()
            .unwrap_or_default()
            .contains("interrupted"),
        "{packs}"
    );
    assert_eq!(pack_files(tmp.path()), Vec::<std::path::PathBuf>::new());
    assert!(!data.join("packs/packed").exists());
    // The name is free: the same pack, left alone, finishes.
    let (status, _) = s.call("POST", "/api/packs", Some(&body));
    assert_eq!(status, 202);
    let last = wait_for_pack(&s);
    assert_eq!(last["state"], "done", "{last}");
    assert!(s.get("/api/models").to_string().contains("\"packed\""));
}

/// Removing a pack's model can delete its files: its folder and its extents
/// on every drive, leaving what else the drives hold.
#[test]
fn removing_a_pack_with_its_files_deletes_them_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let source = support::synth_model(tmp.path());
    let pack = tmp.path().join("pack");
    let packed = support::pack_over_three_drives(&source, tmp.path(), "p", &pack, &[]);
    assert!(packed.status.success(), "{packed:?}");
    let drives = longhaul_engine::tools::Manifest::read(&pack)
        .unwrap()
        .drives;
    let keep = drives[0].join("notes.txt");
    std::fs::write(&keep, "mine").unwrap();
    let s = Service::start(&tmp.path().join("data"));
    s.add_model("packed", &pack);
    s.add_model("folder", &source);
    let (status, err) = s.call("DELETE", "/api/models/folder?files=true", None);
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is not a pack"),
        "{err}"
    );
    assert!(
        source.join("config.json").exists(),
        "a checkpoint folder is never deleted"
    );
    let (status, gone) = s.call("DELETE", "/api/models/packed?files=true", None);
    assert_eq!(status, 200, "{gone}");
    assert!(gone["removed_bytes"].as_u64() > Some(0), "{gone}");
    assert!(
        gone["removed_files"].as_u64() >= Some(3),
        "an extent per drive at least: {gone}"
    );
    assert!(!pack.exists());
    assert_eq!(std::fs::read_to_string(&keep).unwrap(), "mine");
    for d in &drives[1..] {
        assert!(!d.exists(), "{} emptied and removed", d.display());
    }
    let (status, _) = s.call("GET", "/api/models", None);
    assert_eq!(status, 200);
    assert!(
        s.get("/api/models")["models"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["name"] != "packed")
    );
}

/// A task can name a draft model: another registered model on this machine
/// guesses, the model verifies, and the answer is the one without it.
#[test]
fn a_draft_model_guesses_for_a_task_and_changes_nothing_in_its_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let model = support::synth_model(tmp.path());
    let s = Service::start(&tmp.path().join("data"));
    s.add_model("m", &model);
    // The same weights as the draft: every guess is right.
    s.add_model("d", &model);
    let body = json!({ "model": "m", "prompt": "Audit the storage layer", "max_tokens": 48, "temperature": 0 });
    let plain = s.post("/api/jobs", body.clone())["id"].as_i64().unwrap();
    let plain = s.wait_final(plain, Duration::from_secs(120));
    let mut drafted = body.clone();
    drafted["draft_model"] = json!("d");
    let job = s.post("/api/jobs", drafted.clone());
    assert_eq!(job["request"]["settings"]["draft_model"], "d", "{job}");
    let done = s.wait_final(job["id"].as_i64().unwrap(), Duration::from_secs(120));
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(
        done["output"], plain["output"],
        "the answer is the model's own"
    );
    let guessed = &done["stats"]["speculation"];
    assert!(guessed["drafted"].as_u64() > Some(0), "{guessed}");
    assert_eq!(
        guessed["accepted"], guessed["drafted"],
        "the model's own weights guess right: {guessed}"
    );
    for (draft, says) in [
        ("m", "the model itself"),
        ("nobody", "no model named `nobody`"),
    ] {
        drafted["draft_model"] = json!(draft);
        let (status, err) = s.call("POST", "/api/jobs", Some(&drafted));
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["error"]["param"], "draft_model", "{err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(says),
            "{err}"
        );
    }
}
