//! Load, bounded and on loopback: hundreds of short jobs submitted from
//! several threads while dozens of event-stream clients watch. Every job
//! ends done exactly once, every client sees every `done` (or is told to
//! resync, never left with a silent gap), and the events per job stay few.
//! Prints API latency percentiles and events per job.

mod support;

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{Service, fixture};

const JOBS: usize = 240;
const SUBMITTERS: usize = 4;
const CLIENTS: usize = 24;
/// Events one job may cost each client: queued, started, progress, done,
/// and the queue changes around it.
const MAX_EVENTS_PER_JOB: f64 = 8.0;
const WAIT: Duration = Duration::from_secs(300);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn hundreds_of_jobs_and_dozens_of_watchers() {
    let dir = tempfile::tempdir().unwrap();
    let s = Service::start(&dir.path().join("data"));
    s.add_model("tiny", &fixture("deepseek_v3_released"));
    let clients: Vec<mpsc::Receiver<(String, serde_json::Value)>> =
        (0..CLIENTS).map(|_| support::follow_events(&s)).collect();
    // Each stream opens with a resync; after it, nothing may be missed.
    for c in &clients {
        let (name, _) = c.recv_timeout(WAIT).expect("the stream opens");
        assert_eq!(name, "resync");
    }

    let latencies = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..SUBMITTERS)
            .map(|t| {
                let s = &s;
                scope.spawn(move || {
                    let mut times = Vec::new();
                    for i in 0..JOBS / SUBMITTERS {
                        let body = json!({ "model": "tiny", "prompt": format!("job {t}.{i}"), "max_tokens": 1 });
                        let started = Instant::now();
                        let (status, job) = s.call("POST", "/api/jobs", Some(&body));
                        times.push(started.elapsed().as_secs_f64() * 1e3);
                        assert_eq!(status, 201, "{job}");
                        let started = Instant::now();
                        s.get("/api/queue");
                        times.push(started.elapsed().as_secs_f64() * 1e3);
                    }
                    times
                })
            })
            .collect();
        let mut all: Vec<f64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_by(f64::total_cmp);
        all
    });

    let started = Instant::now();
    let jobs = loop {
        let jobs = s.get("/api/jobs")["jobs"].as_array().unwrap().clone();
        if jobs.iter().all(|j| j["state"] == "done") {
            break jobs;
        }
        assert!(started.elapsed() < WAIT, "jobs still unfinished");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(jobs.len(), JOBS, "every job once");
    let ids: HashSet<i64> = jobs.iter().map(|j| j["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), JOBS);

    let mut events_total = 0usize;
    for (n, c) in clients.iter().enumerate() {
        let mut done = HashSet::new();
        let mut resyncs = 0;
        let mut events = 0usize;
        while done.len() < JOBS {
            let (name, data) = c
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("client {n} saw {} of {JOBS} done", done.len()));
            events += 1;
            match name.as_str() {
                "resync" => resyncs += 1,
                "job" if data["state"] == "done" => {
                    done.insert(data["id"].as_i64().unwrap());
                }
                _ => {}
            }
        }
        assert_eq!(resyncs, 0, "client {n} fell behind");
        assert!(done.is_subset(&ids));
        events_total += events;
    }
    let per_job = events_total as f64 / (CLIENTS * JOBS) as f64;
    println!(
        "{JOBS} jobs, {CLIENTS} event clients: API latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {per_job:.2} events per job per client",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );
    assert!(per_job <= MAX_EVENTS_PER_JOB, "{per_job:.2} events per job");
}
