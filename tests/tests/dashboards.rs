//! What the dashboards and the drives view read: drives, metrics and the
//! event stream from a packed model that really streams; a missing drive
//! pausing a job until it is repaired; the prompt preview.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use support::{Service, follow_events, synth_model};

const WAIT: Duration = Duration::from_secs(120);

/// Packs `model` over two drive folders under `root`.
fn pack(root: &Path, model: &Path) -> std::path::PathBuf {
    let drives: Vec<String> = (0..2)
        .map(|i| {
            let d = root.join(format!("drive{i}"));
            std::fs::create_dir_all(&d).unwrap();
            d.to_str().unwrap().to_string()
        })
        .collect();
    let out = root.join("pack");
    let status = Command::new(support::longhaul())
        .arg("pack")
        .arg(model)
        .arg("--out")
        .arg(&out)
        .args(["--drives", &drives.join(","), "--split-threshold", "4K"])
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    out
}

#[test]
fn drives_metrics_and_events_show_a_streaming_model_at_work() {
    let tmp = tempfile::tempdir().unwrap();
    let packed = pack(tmp.path(), &synth_model(tmp.path()));
    let s = Service::start_with(&tmp.path().join("data"), &["--budget", "0"]);
    s.add_model("packed", &packed);
    let events = follow_events(&s);
    let job = s.post(
        "/api/jobs",
        json!({ "model": "packed", "prompt": "Audit the storage layer", "max_tokens": 1500 }),
    );
    let id = job["id"].as_i64().unwrap();
    let (mut metrics, mut progress) = (Vec::new(), Vec::new());
    loop {
        let (name, data) = events.recv_timeout(WAIT).expect("events keep coming");
        match name.as_str() {
            "metrics" => metrics.push(data),
            "job" if data["id"] == id && data["offset"].is_u64() => {
                let state = data["state"].as_str().unwrap().to_string();
                progress.push(data);
                if state == "done" {
                    break;
                }
            }
            _ => {}
        }
    }
    let done = s.get(&format!("/api/jobs/{id}"));
    assert_eq!(done["state"], "done");
    assert!(progress.len() >= 3, "{} progress events", progress.len());
    // Deltas placed at their offsets rebuild the output.
    let mut text = String::new();
    for p in &progress {
        let offset = p["offset"].as_u64().unwrap() as usize;
        text.truncate(offset);
        text.push_str(p["delta"].as_str().unwrap());
    }
    assert!(done["output"].as_str().unwrap().starts_with(&text));
    assert!(
        progress
            .iter()
            .any(|p| p["tokens_per_second"].as_f64().is_some_and(|r| r > 0.0))
    );
    assert!(progress.iter().any(|p| p["eta_seconds"].as_f64().is_some()));
    // With no budget every expert is read: the drives show traffic. A short
    // job may end before the first sample; the model stays loaded, so one comes.
    while metrics.is_empty() {
        let (name, data) = events.recv_timeout(WAIT).expect("metrics once a second");
        if name == "metrics" {
            metrics.push(data);
        }
    }
    let engine = &metrics.last().unwrap()["engine"];
    let drives = engine["drives"].as_array().unwrap();
    assert_eq!(drives.len(), 2);
    assert!(
        drives.iter().all(|d| d["bytes"].as_u64().unwrap() > 0),
        "{engine}"
    );
    assert_eq!(engine["cache"]["budget_bytes"], 0);
    let stats = &done["stats"];
    assert!(stats["expert_bytes_read"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["cache_hit_rate"], 0.0);

    let listed = s.get("/api/drives");
    let drives = listed["drives"].as_array().unwrap();
    assert_eq!(drives.len(), 2, "{listed}");
    for d in drives {
        assert_eq!(d["present"], true);
        assert_eq!(d["status"], "present", "{d}");
        assert_eq!(d["errors"], 0, "{d}");
        // Both folders are in one temporary directory: one device.
        assert_eq!(d["same_device"].as_array().map(Vec::len), Some(1), "{d}");
        assert!(d["model_bytes"].as_u64().unwrap() > 0);
        assert!(d["total_bytes"].as_u64().unwrap() >= d["free_bytes"].as_u64().unwrap());
        assert_eq!(d["models"], json!(["packed"]));
    }
    let m = s.get("/api/metrics");
    assert!(m["metrics"]["engine"]["drives"].is_array(), "{m}");
}

#[test]
fn a_failing_drive_pauses_the_job_until_it_is_back() {
    let tmp = tempfile::tempdir().unwrap();
    let packed = pack(tmp.path(), &synth_model(tmp.path()));
    let s = Service::start_with(&tmp.path().join("data"), &["--budget", "0"]);
    s.add_model("packed", &packed);
    let body = json!({ "model": "packed", "prompt": "Draft an architecture", "max_tokens": 200, "temperature": 0.8, "seed": 4 });
    let reference = s.post("/api/jobs", body.clone());
    let reference = s.wait_final(reference["id"].as_i64().unwrap(), WAIT);
    assert_eq!(reference["state"], "done");

    // The drive starts failing: its extent files read short, as a drive
    // that drops out mid-read does.
    let drive = tmp.path().join("drive1").join("pack");
    let mut saved = Vec::new();
    for entry in std::fs::read_dir(&drive).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "bin") {
            saved.push((path.clone(), std::fs::read(&path).unwrap()));
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(0)
                .unwrap();
        }
    }
    assert!(!saved.is_empty());
    let job = s.post("/api/jobs", body.clone());
    let id = job["id"].as_i64().unwrap();
    let paused = s.wait_state(id, "paused", WAIT);
    let reason = paused["pause_reason"].as_str().unwrap();
    assert!(
        reason.contains("storage fault") && reason.contains("drive 1"),
        "{reason}"
    );

    for (path, bytes) in saved {
        std::fs::write(path, bytes).unwrap();
    }
    // Retried by itself once the drive reads again.
    let done = s.wait_final(id, WAIT);
    assert_eq!(done["state"], "done", "{}", done["error"]);
    assert_eq!(done["output"], reference["output"]);
}

/// A drive that fails with EIO mid-job pauses that job, holds the queue's
/// other jobs of the model (they do not start onto the failing drive and
/// pause in turn), is retried with backoff while it fails, and once the
/// drive reads again every job finishes by itself with the text of an
/// uninterrupted run.
#[test]
fn drive_io_errors_hold_the_queue_and_a_retry_finishes_it_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let packed = pack(tmp.path(), &synth_model(tmp.path()));
    let eio = tmp.path().join("eio");
    let faults = format!("store-eio-while={},token-delay-ms=20", eio.display());
    let s = Service::start_env(
        &tmp.path().join("data"),
        &["--budget", "0"],
        &[("LONGHAUL_FAULTS", &faults)],
    );
    s.add_model("packed", &packed);
    let body = json!({ "model": "packed", "prompt": "Audit this design", "max_tokens": 60, "temperature": 0.8, "seed": 9 });
    let ids: Vec<i64> = (0..3)
        .map(|_| s.post("/api/jobs", body.clone())["id"].as_i64().unwrap())
        .collect();
    s.wait_output(ids[0], WAIT);
    std::fs::write(&eio, b"").unwrap();
    let paused = s.wait_state(ids[0], "paused", WAIT);
    let reason = paused["pause_reason"].as_str().unwrap();
    assert!(
        reason.contains("storage fault") && reason.contains("Input/output error"),
        "{reason}"
    );
    // Past the first retry (after 2 s), which meets the fault again.
    std::thread::sleep(Duration::from_millis(3500));
    let first = s.get(&format!("/api/jobs/{}", ids[0]));
    assert_eq!(first["state"], "paused", "{first}");
    assert!(
        first["pause_reason"]
            .as_str()
            .is_some_and(|r| r.contains("retrying by itself in 4 s")),
        "the second wait is twice the first: {first}"
    );
    for id in &ids[1..] {
        let held = s.get(&format!("/api/jobs/{id}"));
        assert_eq!(held["state"], "queued", "held, not started: {held}");
    }
    // The drives view shows the fault: reads failing, counted, and no
    // latency for reads that returned nothing.
    let listed = s.get("/api/drives");
    let drives = listed["drives"].as_array().unwrap();
    assert!(
        drives
            .iter()
            .any(|d| d["status"] == "errors" && d["errors"].as_u64() > Some(0)),
        "{listed}"
    );
    assert!(
        drives.iter().all(|d| d["latency_p50_ms"].is_null()),
        "{listed}"
    );
    std::fs::remove_file(&eio).unwrap();
    let texts: Vec<serde_json::Value> = ids
        .iter()
        .map(|&id| {
            let done = s.wait_final(id, WAIT);
            assert_eq!(done["state"], "done", "{}", done["error"]);
            done["output"].clone()
        })
        .collect();
    assert!(texts.iter().all(|t| *t == texts[0]));
    let log = s.get(&format!("/api/jobs/{}", ids[0]))["log"].to_string();
    assert!(log.contains("retrying by itself (attempt 2)"), "{log}");
    let again = s.post("/api/jobs", body)["id"].as_i64().unwrap();
    assert_eq!(texts[0], s.wait_final(again, WAIT)["output"]);
}

#[test]
fn a_preview_counts_the_prompt_and_lists_skipped_files() {
    let tmp = tempfile::tempdir().unwrap();
    let model = synth_model(tmp.path());
    let s = Service::start(&tmp.path().join("data"));
    s.add_model("m", &model);
    let folder = tmp.path().join("src");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("a.txt"), "abc").unwrap();
    std::fs::write(folder.join("b.bin"), [0u8, 0, 0]).unwrap();
    let p = s.post(
        "/api/jobs/preview",
        json!({ "model": "m", "prompt": "hello", "attachments": [folder] }),
    );
    // Byte-level tokenizer: one token per byte of header, file and prompt.
    let attached = format!("=== {} ===\nabc\n\n", folder.join("a.txt").display());
    assert_eq!(
        p["prompt_tokens"].as_u64().unwrap() as usize,
        attached.len() + "hello".len(),
        "{p}"
    );
    assert_eq!(p["estimate"], false);
    assert_eq!(p["skipped"][0]["reason"], "binary");
    assert_eq!(p["attachment_files"].as_array().unwrap().len(), 1);
}

#[test]
fn a_preview_forecasts_ram_and_time_from_the_probed_drives_then_from_finished_tasks() {
    let tmp = tempfile::tempdir().unwrap();
    let packed = pack(tmp.path(), &synth_model(tmp.path()));
    let s = Service::start_with(&tmp.path().join("data"), &["--budget", "0"]);
    s.add_model("packed", &packed);
    let body = json!({ "model": "packed", "prompt": "Audit the storage layer", "max_tokens": 40 });
    let before = &s.post("/api/jobs/preview", body.clone())["forecast"];
    assert_eq!(before["basis"], "none", "{before}");
    assert!(before["ram_bytes"].as_u64() > Some(0), "{before}");
    assert!(
        before["read_bytes_per_token"].as_u64() > Some(0),
        "{before}"
    );
    assert!(before["total_seconds"].is_null(), "{before}");
    assert!(
        before["words"].as_str().unwrap().contains("probe"),
        "{before}"
    );
    let probed = Command::new(support::longhaul())
        .args(["drives", "probe", "--bytes", "1M", "--model"])
        .arg(&packed)
        .output()
        .unwrap();
    assert!(probed.status.success(), "{probed:?}");
    let drives = &s.post("/api/jobs/preview", body.clone())["forecast"];
    assert_eq!(drives["basis"], "probed_drives", "{drives}");
    assert!(
        drives["first_token_seconds"].as_f64() > Some(0.0),
        "{drives}"
    );
    assert!(
        drives["total_seconds"].as_f64() > drives["first_token_seconds"].as_f64(),
        "{drives}"
    );
    let id = s.post("/api/jobs", body.clone())["id"].as_i64().unwrap();
    let done = s.wait_final(id, WAIT);
    assert_eq!(done["state"], "done");
    let measured = &s.post("/api/jobs/preview", body)["forecast"];
    assert_eq!(measured["basis"], "measured", "{measured}");
    assert_eq!(
        measured["tokens_per_second"], done["stats"]["tokens_per_second"],
        "{measured}"
    );
}

#[test]
fn an_unplugged_drive_pauses_the_running_job_and_it_resumes_when_the_drive_is_back() {
    let tmp = tempfile::tempdir().unwrap();
    let packed = pack(tmp.path(), &synth_model(tmp.path()));
    let s = Service::start_with(&tmp.path().join("data"), &["--budget", "0"]);
    s.add_model("packed", &packed);
    let job = s.post(
        "/api/jobs",
        json!({ "model": "packed", "prompt": "Audit everything", "max_tokens": 20000 }),
    );
    let id = job["id"].as_i64().unwrap();
    // Unplugged while it generates (not while the model loads).
    while s.get(&format!("/api/jobs/{id}"))["tokens"]
        .as_u64()
        .unwrap()
        == 0
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let drive = tmp.path().join("drive1");
    let away = tmp.path().join("drive1-unplugged");
    std::fs::rename(&drive, &away).unwrap();
    let paused = s.wait_state(id, "paused", WAIT);
    let reason = paused["pause_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("drive missing: ") && reason.contains("drive1"),
        "{reason}"
    );
    assert_eq!(s.get("/api/drives")["drives"][1]["present"], false);
    // The retry round adds its note to the reason within a tick.
    s.wait_job(id, "the reason says it retries by itself", WAIT, |job| {
        job["pause_reason"]
            .as_str()
            .is_some_and(|r| r.ends_with("retrying by itself when the drive is back"))
    });
    std::fs::rename(&away, &drive).unwrap();
    // No one presses Resume.
    s.wait_state(id, "running", WAIT);
    s.post(&format!("/api/jobs/{id}/cancel"), json!({}));
}

#[test]
fn the_dashboard_history_outlives_the_tab_and_the_service() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let s = Service::start(&data);
    s.add_model("m", &pack(tmp.path(), &synth_model(tmp.path())));
    let id = s.post(
        "/api/jobs",
        json!({ "model": "m", "prompt": "Audit", "max_tokens": 16 }),
    )["id"]
        .as_i64()
        .unwrap();
    s.wait_final(id, WAIT);
    // Metrics are sampled once a second while the model is loaded.
    let started = std::time::Instant::now();
    let history = loop {
        let h = s.get("/api/metrics/history");
        if h["recent"].as_array().unwrap().len() >= 3 {
            break h;
        }
        assert!(started.elapsed() < WAIT, "no history: {h}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let point = &history["recent"][0];
    assert!(point["t"].as_f64().unwrap() > 1.7e9, "{point}");
    assert_eq!(point["drives"].as_array().unwrap().len(), 2, "{point}");
    s.stop();
    // The minute in progress was kept when the service stopped.
    let file = data.join("metrics-history.jsonl");
    assert!(file.is_file());
    let s = Service::start(&data);
    let after = s.get("/api/metrics/history");
    let minutes = after["minutes"].as_array().unwrap();
    assert!(!minutes.is_empty(), "{after}");
    assert!(minutes.iter().all(|m| m["seconds"].as_f64().unwrap() > 0.0));
}

#[test]
fn drive_health_comes_from_the_disk_warns_when_it_changes_and_outlives_a_restart() {
    // Under the build's own directory, on a real disk (a tmpfs has none).
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let packed = pack(tmp.path(), &synth_model(tmp.path()));
    let reading = tmp.path().join("reading.json");
    support::set_health(&reading, "nvme.json");
    let smartctl = support::fake_smartctl(tmp.path(), &reading);
    let data = tmp.path().join("data");
    let env = [("LONGHAUL_SMARTCTL", smartctl.as_str())];
    let s = Service::start_env(&data, &[], &env);
    s.add_model("packed", &packed);
    let listed = s.post("/api/drives/health", json!({}));
    let drives = listed["drives"].as_array().unwrap();
    assert_eq!(drives.len(), 2, "{listed}");
    for d in drives {
        let disk = &d["disk"];
        assert!(
            disk["device"]
                .as_str()
                .is_some_and(|n| n.starts_with("/dev/")),
            "{d}"
        );
        assert!(disk["link"].is_string(), "{d}");
        assert_eq!(disk["health"]["model"], "Samsung SSD 990 PRO 2TB", "{d}");
        assert_eq!(disk["health"]["temperature_c"], 47);
        assert_eq!(disk["health"]["percentage_used"], 3);
        assert_eq!(disk["warnings"], json!([]));
    }
    assert_eq!(s.get("/api/queue")["health_warnings"], json!([]));
    // A hot night with new errors.
    support::set_health(&reading, "nvme-hot-errors.json");
    let listed = s.post("/api/drives/health", json!({}));
    let disk = &listed["drives"][0]["disk"];
    let kinds: Vec<&str> = disk["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["failing", "new_errors", "hot", "throttled"],
        "{disk}"
    );
    let temps: Vec<i64> = disk["temperatures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_i64().unwrap())
        .collect();
    assert_eq!(temps, [47, 79]);
    let queue = s.get("/api/queue");
    let told = queue["health_warnings"].as_array().unwrap();
    assert_eq!(told.len(), 4, "{queue}");
    assert!(
        told.iter()
            .all(|w| w["text"].as_str().unwrap().starts_with("/dev/")),
        "{queue}"
    );
    drop(s);
    // The readings are kept: a new service shows them before reading again.
    let s = Service::start_env(&data, &[], &env);
    let listed = s.get("/api/drives");
    assert_eq!(
        listed["drives"][0]["disk"]["temperatures"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "{listed}"
    );
    // A drive that hides its health says why.
    support::set_health(&reading, "usb-hidden.json");
    let listed = s.post("/api/drives/health", json!({}));
    let disk = &listed["drives"][0]["disk"];
    assert!(disk["health"].is_null(), "{disk}");
    assert!(
        disk["unavailable"]
            .as_str()
            .is_some_and(|w| w.contains("USB bridge")),
        "{disk}"
    );
}
