//! Durability: the service is SIGKILLed at random moments while it works
//! through a queue, restarted each time, and in the end every job is there
//! once, done, with exactly the text an uninterrupted run gives, in a
//! database that passes `PRAGMA integrity_check`.
//!
//! It runs on an attention-only model and on a hybrid whose linear layers
//! keep a recurrent state that every token overwrites.
//!
//! `LONGHAUL_KILLS` sets the number of kills (default 30; the stress run uses 300).

mod support;

use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::{Service, synth_model, synth_model_of};

const DEFAULT_KILLS: usize = 30;
/// Longest a service lives before it is killed, in milliseconds.
const MAX_LIFE_MS: u64 = 400;
const WAIT: Duration = Duration::from_secs(300);

fn jobs() -> Vec<Value> {
    vec![
        json!({ "model": "m", "prompt": "Audit the storage layer", "max_tokens": 900, "title": "greedy" }),
        json!({ "model": "m", "prompt": "Draft an architecture", "max_tokens": 900, "temperature": 0.9, "top_p": 0.95, "seed": 17, "title": "sampled" }),
        json!({ "model": "m", "messages": [{ "role": "user", "content": "Plan the migration" }], "max_tokens": 900, "temperature": 0.7, "top_k": 40, "seed": 5, "title": "chat" }),
        json!({ "model": "m", "prompt": "Summarise the findings", "max_tokens": 900, "temperature": 1.0, "seed": 99, "stop": ["zq"], "title": "stop string" }),
    ]
}

/// Outputs of the jobs run without interruption, and how long they took.
fn reference(root: &std::path::Path, model: &std::path::Path) -> (Vec<Value>, Duration) {
    let s = Service::start(&root.join("reference"));
    s.add_model("m", model);
    let started = std::time::Instant::now();
    let ids: Vec<i64> = jobs()
        .into_iter()
        .map(|j| s.post("/api/jobs", j)["id"].as_i64().unwrap())
        .collect();
    let out = ids.iter().map(|&id| s.wait_final(id, WAIT)).collect();
    (out, started.elapsed())
}

fn kills() -> usize {
    std::env::var("LONGHAUL_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_KILLS)
}

#[test]
fn killed_at_random_moments_no_job_is_lost_duplicated_or_changed() {
    let tmp = tempfile::tempdir().unwrap();
    killed_at_random_moments(tmp.path(), &synth_model(tmp.path()), kills());
}

/// Kimi-Linear's shape: KDA layers between a dense first layer and an MLA
/// fourth layer.
#[test]
fn a_hybrid_model_killed_at_random_moments_loses_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = synth_model_of(
        tmp.path(),
        "kimi_linear",
        &["--layers", "4", "--top-k", "4"],
    );
    killed_at_random_moments(tmp.path(), &model, kills());
}

fn killed_at_random_moments(root: &std::path::Path, model: &std::path::Path, kills: usize) {
    let tmp = root;
    let model = model.to_path_buf();
    let (want, one_round) = reference(tmp, &model);
    for w in &want {
        assert_eq!(w["state"], "done", "{w}");
    }

    let data = tmp.join("killed");
    let s = Service::start(&data);
    s.add_model("m", &model);
    // Enough work that kills keep landing mid-job: rounds of the jobs for
    // twice the time the services live on average.
    let lives = Duration::from_millis(kills as u64 * MAX_LIFE_MS / 2);
    let rounds = (2.0 * lives.as_secs_f64() / one_round.as_secs_f64().max(1e-3)).ceil() as usize;
    let rounds = rounds.max(1);
    let ids: Vec<i64> = (0..rounds)
        .flat_map(|_| jobs())
        .map(|j| s.post("/api/jobs", j)["id"].as_i64().unwrap())
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    let mut s = Some(s);
    let mut mid_job = 0;
    for _ in 0..kills {
        let service = s.take().unwrap_or_else(|| Service::start(&data));
        std::thread::sleep(Duration::from_millis(rng.random_range(0..MAX_LIFE_MS)));
        let running = service
            .get("/api/queue")
            .get("running")
            .is_some_and(|r| !r.is_null());
        mid_job += usize::from(running);
        service.kill();
    }

    let s = Service::start(&data);
    for (id, w) in ids.iter().zip(want.iter().cycle()) {
        let got = s.wait_final(*id, WAIT);
        assert_eq!(got["state"], "done", "{got}");
        let (a, b) = (
            got["output"].as_str().unwrap(),
            w["output"].as_str().unwrap(),
        );
        let same = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
        assert!(
            a == b,
            "job {id} ({}) differs from the uninterrupted run: {} vs {} chars, first difference at char {same}",
            w["title"],
            a.chars().count(),
            b.chars().count()
        );
        assert_eq!(got["tokens"], w["tokens"]);
        assert_eq!(got["finish_reason"], w["finish_reason"]);
    }
    let all = s.get("/api/jobs");
    assert_eq!(
        all["jobs"].as_array().unwrap().len(),
        ids.len(),
        "no job lost or duplicated"
    );
    let interrupted: usize = ids
        .iter()
        .map(|id| {
            s.get(&format!("/api/jobs/{id}"))["log"]
                .as_str()
                .unwrap()
                .matches("interrupted")
                .count()
        })
        .sum();
    // Every interruption is counted as a resume, none forgotten by a later kill.
    for id in &ids {
        let job = s.get(&format!("/api/jobs/{id}"));
        let interruptions = job["log"].as_str().unwrap().matches("interrupted").count();
        assert_eq!(
            job["stats"]["resumes"], interruptions,
            "job {id}: {}",
            job["log"]
        );
    }
    // Resumes read the answer's saved attention state instead of recomputing it.
    let restored = ids.iter().any(|id| {
        s.get(&format!("/api/jobs/{id}"))["log"]
            .as_str()
            .unwrap()
            .lines()
            .any(|l| l.contains("attention state saved for") && !l.ends_with("saved for 0"))
    });
    assert!(restored, "no resume used saved attention state");
    s.stop();
    let conn = rusqlite::Connection::open(data.join("queue.sqlite")).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    println!("{kills} kills, {mid_job} while a job ran, {interrupted} interruptions recovered");
    assert!(
        mid_job > kills / 3,
        "most kills should land mid-job: {mid_job} of {kills}"
    );
}

/// Saved attention state changed on disk between a kill and the restart
/// (a bad sector, a stray write) is refused by its checksum: the job says
/// so in its log and finishes with the text an uninterrupted run gives.
#[test]
fn a_changed_state_file_is_refused_and_the_answer_is_the_same() {
    let root = tempfile::tempdir().unwrap();
    let model = synth_model(root.path());
    let data = root.path().join("data");
    let faults = [("LONGHAUL_FAULTS", "token-delay-ms=30")];
    let s = Service::start_env(&data, &[], &faults);
    s.add_model("m", &model);
    let body = json!({ "model": "m", "prompt": "Audit the storage layer", "max_tokens": 200 });
    let id = s.post("/api/jobs", body.clone())["id"].as_i64().unwrap();
    // Output committed, so the state saved before it is within it.
    s.wait_output(id, WAIT);
    let state = data.join(format!("state/job-{id}.kv"));
    let started = std::time::Instant::now();
    while std::fs::metadata(&state).map_or(0, |m| m.len()) < 256 {
        assert!(started.elapsed() < WAIT, "no state saved");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill();
    let mut raw = std::fs::read(&state).unwrap();
    for b in &mut raw[64..128] {
        *b ^= 0x5a;
    }
    std::fs::write(&state, &raw).unwrap();
    let s = Service::start_env(&data, &[], &faults);
    let done = s.wait_final(id, WAIT);
    assert_eq!(done["state"], "done", "{done}");
    let log = done["log"].as_str().unwrap_or_default();
    assert!(log.contains("fails its checksum"), "{log}");
    let again = s.post("/api/jobs", body)["id"].as_i64().unwrap();
    let want = s.wait_final(again, WAIT);
    assert_eq!(done["output"], want["output"]);
}
