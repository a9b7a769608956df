//! The desktop shell's supervisor without the shell: it starts the service,
//! restarts it when it dies, sums up the queue for the tray and notices jobs
//! that ended.

mod support;

use std::time::{Duration, Instant};

use longhaul_service::supervisor::{Supervisor, SupervisorConfig, TrayState};
use serde_json::json;
use support::synth_model;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A supervisor of `data` on a free port.
fn config(data: &std::path::Path) -> SupervisorConfig {
    SupervisorConfig {
        binary: support::longhaul(),
        data_dir: data.to_path_buf(),
        port: free_port(),
        serve_args: vec![],
    }
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_supervisor_starts_restarts_and_reports_the_service() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let sup = Supervisor::start(config(&data)).unwrap();
    let url = sup.ui_url().unwrap();
    let token = std::fs::read_to_string(data.join("token")).unwrap();
    assert!(url.ends_with(&format!("/#token={}", token.trim())), "{url}");
    let status = sup.status();
    assert_eq!(status.state, TrayState::Idle, "{}", status.text);
    assert_eq!(sup.quit_question(), None, "nothing runs: Quit asks nothing");

    let client = longhaul_service::client::Client::new(&data, None).unwrap();
    let model = synth_model(tmp.path());
    client
        .post::<serde_json::Value>("/api/models", &json!({ "name": "m", "path": model }))
        .unwrap();
    let job: serde_json::Value = client
        .post("/api/jobs", &json!({ "model": "m", "prompt": "Audit", "max_tokens": 2500, "title": "nightly audit" }))
        .unwrap();
    let id = job["id"].as_i64().unwrap();
    // Past reading the prompt: then the tray counts tokens.
    wait_for("the job to write", || {
        client
            .get::<serde_json::Value>(&format!("/api/jobs/{id}"))
            .is_ok_and(|j| j["tokens"].as_u64() > Some(0))
    });
    let question = sup.quit_question().expect("Quit asks while a task runs");
    assert!(
        question.contains("“nightly audit” is running")
            && question.contains("goes on from where it stopped"),
        "{question}"
    );
    let status = sup.status();
    assert!(
        status.text.contains("nightly audit") && status.text.contains("of 2500 tokens"),
        "{}",
        status.text
    );
    assert!(
        status.title.starts_with("▶ ") && status.title.ends_with('%'),
        "the tray title shows the share done: {}",
        status.title
    );

    // The service dies; the supervisor brings it back and the job resumes.
    let pid = sup.service_pid().unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    wait_for("the service to die", || sup.keep_alive().unwrap());
    assert_ne!(sup.service_pid(), Some(pid));
    let mut ended = Vec::new();
    wait_for("the job to end", || {
        ended.extend(sup.status().ended);
        !ended.is_empty()
    });
    assert_eq!(
        ended,
        vec![(id, "nightly audit".to_string(), "done".to_string())]
    );
    assert!(!sup.holding_awake(), "idle again: sleep allowed");

    // With notifications turned off, an ending is not told.
    client
        .put::<serde_json::Value>("/api/preferences", &json!({ "notify_when_done": false }))
        .unwrap();
    let quiet: serde_json::Value = client
        .post(
            "/api/jobs",
            &json!({ "model": "m", "prompt": "Audit", "max_tokens": 4 }),
        )
        .unwrap();
    let quiet = quiet["id"].as_i64().unwrap();
    wait_for("the quiet job to end", || {
        assert!(sup.status().ended.is_empty(), "an ending was told");
        client
            .get::<serde_json::Value>(&format!("/api/jobs/{quiet}"))
            .is_ok_and(|j| j["state"] == "done")
    });
    assert!(sup.status().ended.is_empty());

    sup.set_queue_paused(true).unwrap();
    assert_eq!(sup.status().state, TrayState::Paused);
    sup.shutdown();
    assert_eq!(sup.status().state, TrayState::Error, "stopped");
}

#[test]
fn the_supervisor_uses_a_service_already_running_on_its_data_dir_on_another_port() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let running = support::Service::start(&data);
    let sup = Supervisor::start(config(&data)).unwrap();
    let url = sup.ui_url().unwrap();
    assert!(
        url.starts_with(&running.url),
        "{url} is not {}",
        running.url
    );
    assert_eq!(sup.service_pid(), None, "it started no service of its own");
    let endpoint = std::fs::read_to_string(data.join("endpoint")).unwrap();
    assert_eq!(endpoint.trim(), running.url);
}

/// A task paused by a fault needs the user: the tray turns red and says
/// which task and why, even with notifications of endings turned off, and
/// tells it once. The pause's typed cause decides, not its wording.
#[test]
fn a_task_paused_by_a_missing_drive_turns_the_tray_red_and_is_told_once() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = tmp.path().join("pack");
    let packed = support::pack_over_three_drives(
        &synth_model(tmp.path()),
        tmp.path(),
        "p",
        &pack,
        &["--split-threshold", "4K"],
    );
    assert!(packed.status.success(), "{packed:?}");
    let data = tmp.path().join("data");
    let service = support::Service::start_with(&data, &["--budget", "0"]);
    service.add_model("packed", &pack);
    let sup = Supervisor::start(config(&data)).unwrap();
    let client = longhaul_service::client::Client::new(&data, None).unwrap();
    client
        .put::<serde_json::Value>("/api/preferences", &json!({ "notify_when_done": false }))
        .unwrap();
    let job = service.post(
        "/api/jobs",
        json!({ "model": "packed", "prompt": "Audit", "max_tokens": 20000, "title": "drive audit" }),
    );
    let id = job["id"].as_i64().unwrap();
    wait_for("the job to write", || {
        service.get(&format!("/api/jobs/{id}"))["tokens"].as_u64() > Some(0)
    });
    let _ = sup.status();
    let drive = tmp.path().join("p-d1");
    let away = tmp.path().join("p-d1-away");
    std::fs::rename(&drive, &away).unwrap();
    service.wait_state(id, "paused", Duration::from_secs(60));
    let status = sup.status();
    assert_eq!(status.state, TrayState::Error, "{}", status.text);
    assert!(
        status
            .text
            .contains("“drive audit” is paused: drive missing"),
        "{}",
        status.text
    );
    assert_eq!(
        status.ended,
        vec![(id, "drive audit".to_string(), "paused".to_string())]
    );
    assert!(sup.status().ended.is_empty(), "told once");
    std::fs::rename(&away, &drive).unwrap();
    service.wait_state(id, "running", Duration::from_secs(60));
    // The tray looks while it runs, as its loop does every second.
    assert_ne!(sup.status().state, TrayState::Error);
    // Paused again (a retry meeting the fault again): not told again.
    std::fs::rename(&drive, &away).unwrap();
    service.wait_state(id, "paused", Duration::from_secs(60));
    let again = sup.status();
    assert_eq!(again.state, TrayState::Error);
    assert!(again.ended.is_empty(), "told once: {:?}", again.ended);
    std::fs::rename(&away, &drive).unwrap();
    service.wait_state(id, "running", Duration::from_secs(60));
    service.post(&format!("/api/jobs/{id}/cancel"), json!({}));
    wait_for("the tray to leave red", || {
        sup.status().state != TrayState::Error
    });
}

#[test]
fn a_drive_that_warns_is_told_once_and_one_failing_turns_the_tray_red() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let pack = tmp.path().join("pack");
    let packed =
        support::pack_over_three_drives(&synth_model(tmp.path()), tmp.path(), "p", &pack, &[]);
    assert!(packed.status.success(), "{packed:?}");
    let reading = tmp.path().join("reading.json");
    support::set_health(&reading, "nvme.json");
    let smartctl = support::fake_smartctl(tmp.path(), &reading);
    let data = tmp.path().join("data");
    let service = support::Service::start_env(&data, &[], &[("LONGHAUL_SMARTCTL", &smartctl)]);
    service.add_model("packed", &pack);
    let sup = Supervisor::start(config(&data)).unwrap();
    service.post("/api/drives/health", json!({}));
    let calm = sup.status();
    assert_eq!(calm.state, TrayState::Idle, "{}", calm.text);
    assert!(calm.health.is_empty(), "{:?}", calm.health);
    support::set_health(&reading, "nvme-hot-errors.json");
    service.post("/api/drives/health", json!({}));
    let hot = sup.status();
    assert_eq!(hot.state, TrayState::Error, "{}", hot.text);
    assert!(hot.text.contains("says it is failing"), "{}", hot.text);
    assert_eq!(hot.health.len(), 4, "{:?}", hot.health);
    assert!(
        hot.health.iter().any(|n| n.contains("runs hot: 79 °C")),
        "{:?}",
        hot.health
    );
    assert!(sup.status().health.is_empty(), "told once");
    // Cooled down and no new errors: the tray leaves red.
    support::set_health(&reading, "nvme.json");
    service.post("/api/drives/health", json!({}));
    let again = sup.status();
    assert_eq!(again.state, TrayState::Idle, "{}", again.text);
}
