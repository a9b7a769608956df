//! A model entry pointing at another Longhaul service: jobs sent there get
//! the same queue, durability and resume as local ones.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Service, synth_model};

const WAIT: Duration = Duration::from_secs(120);

#[test]
fn jobs_run_on_a_remote_service_and_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let model = synth_model(tmp.path());
    let far = Service::start(&tmp.path().join("far"));
    far.add_model("m", &model);
    let near_dir = tmp.path().join("near");
    let near = Service::start(&near_dir);
    near.post(
        "/api/models",
        json!({ "name": "remote", "url": far.url, "api_key": far.token, "remote_model": "m" }),
    );
    let listed = near.get("/api/models");
    assert!(
        !listed.to_string().contains(&far.token),
        "keys are never shown"
    );

    // The same prompt run directly on the far service and through the near one.
    let prompt = json!({ "prompt": "Audit the storage layer", "max_tokens": 120 });
    let mut direct = prompt.clone();
    direct["model"] = json!("m");
    let direct = far.post("/api/jobs", direct);
    let direct = far.wait_final(direct["id"].as_i64().unwrap(), WAIT);
    let mut via = prompt.clone();
    via["model"] = json!("remote");
    let via = near.post("/api/jobs", via);
    let via = near.wait_final(via["id"].as_i64().unwrap(), WAIT);
    assert_eq!(via["state"], "done", "{via}");
    assert_eq!(via["output"], direct["output"]);
    assert_eq!(
        via["tokens"], direct["tokens"],
        "token count from the server's usage"
    );
    assert_eq!(via["finish_reason"], "length");

    // Killed mid-answer, the near service continues from its committed text.
    let long = near.post(
        "/api/jobs",
        json!({ "model": "remote", "prompt": "Draft an architecture", "max_tokens": 4000 }),
    );
    let id = long["id"].as_i64().unwrap();
    let before = loop {
        let j = near.get(&format!("/api/jobs/{id}"));
        if j["tokens"].as_u64().unwrap() > 0 {
            break j["output"].as_str().unwrap().to_string();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    near.kill();
    let near = Service::start(&near_dir);
    let done = near.wait_final(id, WAIT);
    assert_eq!(done["state"], "done", "{}", done["error"]);
    assert!(
        done["output"].as_str().unwrap().starts_with(&before),
        "committed text kept"
    );
    assert!(
        done["log"]
            .as_str()
            .unwrap()
            .contains("continuing on the remote server"),
        "{}",
        done["log"]
    );

    // A server that is not there pauses the job with the reason, not a failure.
    near.post(
        "/api/models",
        json!({ "name": "gone", "url": "http://127.0.0.1:9", "remote_model": "m" }),
    );
    let job = near.post("/api/jobs", json!({ "model": "gone", "prompt": "hello" }));
    let paused = near.wait_state(job["id"].as_i64().unwrap(), "paused", WAIT);
    assert!(
        paused["pause_reason"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{paused}"
    );
}

#[test]
fn a_remote_chat_answer_starts_over_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let model = synth_model(tmp.path());
    let far = Service::start(&tmp.path().join("far"));
    far.add_model("m", &model);
    let messages = json!([{ "role": "user", "content": "Plan the migration" }]);
    let direct = far.post(
        "/api/jobs",
        json!({ "model": "m", "messages": messages, "max_tokens": 4000 }),
    );
    let direct = far.wait_final(direct["id"].as_i64().unwrap(), WAIT);

    let near_dir = tmp.path().join("near");
    let near = Service::start(&near_dir);
    near.post(
        "/api/models",
        json!({ "name": "remote", "url": far.url, "api_key": far.token, "remote_model": "m" }),
    );
    let job = near.post(
        "/api/jobs",
        json!({ "model": "remote", "messages": messages, "max_tokens": 4000 }),
    );
    let id = job["id"].as_i64().unwrap();
    while near.get(&format!("/api/jobs/{id}"))["tokens"]
        .as_u64()
        .unwrap()
        == 0
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    near.kill();
    let near = Service::start(&near_dir);
    let done = near.wait_final(id, WAIT);
    assert_eq!(done["state"], "done");
    assert!(
        done["log"].as_str().unwrap().contains("restarted"),
        "{}",
        done["log"]
    );
    assert_eq!(
        done["output"], direct["output"],
        "a greedy answer started over is the same answer"
    );
}

/// A server that answers a stream with keep-alive comments only, forever.
fn stalling_server() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut request = [0u8; 65536];
                let _ = conn.read(&mut request);
                let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n";
                if conn.write_all(head.as_bytes()).is_err() {
                    return;
                }
                while conn.write_all(b": keep-alive\n\n").is_ok() {
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        }
    });
    url
}

/// A remote stream that sends keep-alives and nothing else holds the
/// runner no longer: cancel frees it at once for the next job, a stall past
/// the limit pauses the job saying why, and the service stops when asked
/// (it once answered `cancelled` while every later job stayed queued).
#[test]
fn a_remote_stream_that_stalls_neither_wedges_the_queue_nor_the_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let model = synth_model(tmp.path());
    let s = Service::start_env(
        &tmp.path().join("data"),
        &[],
        &[("LONGHAUL_FAULTS", "remote-stall-ms=2000")],
    );
    s.add_model("local", &model);
    // A remote model naming this very service is refused outright.
    for url in [
        s.url.clone(),
        format!("{}/v1/", s.url.replace("127.0.0.1", "localhost")),
    ] {
        let (status, err) = s.call(
            "POST",
            "/api/models",
            Some(&json!({ "name": "self", "url": url, "remote_model": "m" })),
        );
        assert_eq!(status, 400, "{url}: {err}");
        assert!(err.to_string().contains("this service itself"), "{err}");
    }
    s.post(
        "/api/models",
        json!({ "name": "stalls", "url": stalling_server(), "remote_model": "m" }),
    );
    let ask = |model: &str| {
        s.post(
            "/api/jobs",
            json!({ "model": model, "prompt": "Audit", "max_tokens": 4 }),
        )["id"]
            .as_i64()
            .unwrap()
    };
    let stalled = ask("stalls");
    s.wait_state(stalled, "running", WAIT);
    s.post(&format!("/api/jobs/{stalled}/cancel"), json!({}));
    let next = ask("local");
    let done = s.wait_final(next, Duration::from_secs(30));
    assert_eq!(done["state"], "done", "the queue went on: {done}");
    // Left alone, the stall is a fault: the job pauses with the reason.
    let stalled = ask("stalls");
    let paused = s.wait_state(stalled, "paused", Duration::from_secs(30));
    let reason = paused["pause_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("keep-alives"), "{paused}");
    // Stopping while a stalled stream is read ends the service promptly.
    s.post(&format!("/api/jobs/{stalled}/resume"), json!({}));
    s.wait_state(stalled, "running", WAIT);
    let stopped = s.terminate(Duration::from_secs(20));
    assert!(stopped.is_some(), "the service did not stop");
}
