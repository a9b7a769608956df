//! Jobs decoding together through the service: `serve --together 4` runs up
//! to four jobs of one model at once, their passes shared, and every answer
//! is the one the job gives alone — through a pause and resume too.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Service;

const WAIT: Duration = Duration::from_secs(120);

/// Four jobs: greedy and sampled, different prompts and lengths.
fn bodies() -> Vec<Value> {
    (0..4)
        .map(|j| {
            json!({
                "model": "long",
                "prompt": format!("Draft architecture number {j}"),
                "max_tokens": 300 + 100 * j,
                "temperature": if j % 2 == 1 { 0.8 } else { 0.0 },
                "seed": j,
            })
        })
        .collect()
}

/// Submits every body and returns the jobs as they end, in order.
fn run_all(s: &Service, during: impl Fn(&Service, &[i64])) -> Vec<Value> {
    let ids: Vec<i64> = bodies()
        .into_iter()
        .map(|b| s.post("/api/jobs", b)["id"].as_i64().unwrap())
        .collect();
    during(s, &ids);
    ids.iter().map(|&id| s.wait_final(id, WAIT)).collect()
}

#[test]
fn jobs_run_together_and_answer_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let model = support::synth_model(dir.path());
    let alone = Service::start(&dir.path().join("alone"));
    alone.add_model("long", &model);
    let reference = run_all(&alone, |s, _| {
        // One at a time: never more than one running.
        let q = s.get("/api/queue");
        assert_eq!(q["together"], 1);
        assert!(q["running_jobs"].as_array().unwrap().len() <= 1);
    });
    alone.stop();

    let together = Service::start_with(&dir.path().join("together"), &["--together", "4"]);
    together.add_model("long", &model);
    let got = run_all(&together, |s, ids| {
        // They come to run at once.
        let started = Instant::now();
        loop {
            let q = s.get("/api/queue");
            assert_eq!(q["together"], 4);
            if q["running_jobs"].as_array().unwrap().len() >= 2 {
                break;
            }
            assert!(started.elapsed() < WAIT, "never two running: {q}");
            std::thread::sleep(Duration::from_millis(5));
        }
        // One pauses part-way and resumes while the others run.
        s.wait_output(ids[3], WAIT);
        let paused = s.post(&format!("/api/jobs/{}/pause", ids[3]), json!({}));
        assert_eq!(paused["state"], "paused", "{paused}");
        s.post(&format!("/api/jobs/{}/resume", ids[3]), json!({}));
    });
    for (want, got) in reference.iter().zip(&got) {
        assert_eq!(got["state"], "done", "{}", got["error"]);
        assert_eq!(
            got["output"], want["output"],
            "job {} differs together",
            got["id"]
        );
        assert_eq!(got["tokens"], want["tokens"]);
    }
    together.stop();
}

#[test]
fn together_is_checked_when_the_service_starts() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(support::longhaul())
        .args(["serve", "--together", "0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("from 1 to 16"), "{err}");
}
