//! Running the real `longhaul serve` for end-to-end tests, and talking to it
//! over real HTTP.

#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a service may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A binary the workspace builds: from `LONGHAUL_BIN` (`longhaul`) or
/// `LONGHAUL_DESKTOP_BIN` (`longhaul-desktop`) when set, else beside this
/// test's own binary (`target/PROFILE/deps/TEST` → `target/PROFILE/NAME`),
/// where `cargo test --workspace` puts it. A test in this package cannot be
/// handed `CARGO_BIN_EXE_*`: that is only set for a package's own binaries.
pub fn built(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&var) {
        return PathBuf::from(path);
    }
    let me = std::env::current_exe().expect("the test binary's own path");
    let path = me
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join(format!("{name}{}", std::env::consts::EXE_SUFFIX)))
        .expect("the test binary lies in target/PROFILE/deps");
    assert!(
        path.is_file(),
        "{} is not built: run these tests with `cargo test --workspace`, build it with `cargo build -p {}`, or set {var}",
        path.display(),
        if name == "longhaul" {
            "longhaul-service"
        } else {
            name
        }
    );
    path
}

/// The `longhaul` binary under test.
pub fn longhaul() -> PathBuf {
    built("longhaul")
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures")
        .join(name)
}

/// Runs `longhaul pack SOURCE --out OUT` over three drive folders named
/// after `name` under `root`, with `extra` arguments.
pub fn pack_over_three_drives(
    source: &Path,
    root: &Path,
    name: &str,
    out: &Path,
    extra: &[&str],
) -> Output {
    let drives: Vec<String> = (0..3)
        .map(|i| {
            let d = root.join(format!("{name}-d{i}"));
            std::fs::create_dir_all(&d).unwrap();
            d.to_string_lossy().into_owned()
        })
        .collect();
    Command::new(longhaul())
        .arg("pack")
        .arg(source)
        .arg("--out")
        .arg(out)
        .arg("--drives")
        .arg(drives.join(","))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Asserts that `path` (and, for a folder, everything in it) can be read
/// by its owner only.
pub fn assert_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).unwrap();
    let mode = meta.permissions().mode() & 0o777;
    assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", path.display());
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            assert_private(&entry.unwrap().path());
        }
    }
}

/// A copy of fixture `name`'s folder at `dest`, to change without touching it.
pub fn copy_fixture(name: &str, dest: &Path) -> PathBuf {
    std::fs::create_dir_all(dest).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dest.join(entry.file_name())).unwrap();
    }
    dest.to_path_buf()
}

/// Gives the model folder `dir` a pre-tokenizer pattern that backtracks
/// without end on [`backtracking_prompt`], as a hostile tokenizer.json may.
pub fn give_backtracking_pattern(dir: &Path) {
    let path = dir.join("tokenizer.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json["pre_tokenizer"] = serde_json::json!({
        "type": "Split", "pattern": { "Regex": "(a+)+$" }, "behavior": "Isolated", "invert": false,
    });
    std::fs::write(&path, json.to_string()).unwrap();
}

/// The prompt that sets off [`give_backtracking_pattern`]'s pattern.
pub fn backtracking_prompt() -> String {
    format!("{}b", "a".repeat(5000))
}

pub fn expected(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("expected.json")).unwrap())
        .unwrap()
}

pub struct Service {
    pub child: Child,
    pub url: String,
    pub token: String,
    pub data_dir: PathBuf,
    agent: ureq::Agent,
}

impl Service {
    /// Starts `longhaul serve` on a free port with `data_dir`, waiting until it listens.
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[])
    }

    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_env(data_dir, extra, &[])
    }

    /// Starts with extra arguments and environment variables.
    pub fn start_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_from(&longhaul(), data_dir, extra, env)
    }

    /// Starts `binary` (an installed copy) on `data_dir`.
    pub fn start_with_binary(binary: &Path, data_dir: &Path) -> Self {
        Self::start_from(binary, data_dir, &[], &[])
    }

    fn start_from(binary: &Path, data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        std::fs::create_dir_all(data_dir).unwrap();
        let endpoint = data_dir.join("endpoint");
        let _ = std::fs::remove_file(&endpoint);
        let child = Command::new(binary)
            .args(["serve", "--port", "0", "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start longhaul serve");
        let started = Instant::now();
        let url = loop {
            if let Ok(u) = std::fs::read_to_string(&endpoint)
                && !u.trim().is_empty()
            {
                break u.trim().to_string();
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "the service did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let token = std::fs::read_to_string(data_dir.join("token"))
            .unwrap()
            .trim()
            .to_string();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        Self {
            child,
            url,
            token,
            data_dir: data_dir.to_path_buf(),
            agent,
        }
    }

    /// (status, JSON body) of a request with the token.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let (status, text) = self.call_text(method, path, body, true);
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub fn call_text(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        with_token: bool,
    ) -> (u16, String) {
        let url = format!("{}{path}", self.url);
        let auth = format!("Bearer {}", self.token);
        let result = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if with_token {
                    r = r.header("Authorization", &auth);
                }
                r.call()
            }
            ("DELETE", _) => {
                let mut r = self.agent.delete(&url);
                if with_token {
                    r = r.header("Authorization", &auth);
                }
                r.call()
            }
            (_, b) => {
                let mut r = self.agent.post(&url);
                if with_token {
                    r = r.header("Authorization", &auth);
                }
                r.send_json(b.cloned().unwrap_or(Value::Null))
            }
        };
        let mut response = result.expect("the service answers");
        let status = response.status().as_u16();
        (status, response.body_mut().read_to_string().unwrap())
    }

    /// (status, body) of a POST with a raw body and the token.
    pub fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        let mut response = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Authorization", &format!("Bearer {}", self.token))
            .header("Content-Type", "application/json")
            .send(body)
            .expect("the service answers");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub fn get(&self, path: &str) -> Value {
        let (status, v) = self.call("GET", path, None);
        assert_eq!(status, 200, "GET {path}: {v}");
        v
    }

    pub fn post(&self, path: &str, body: Value) -> Value {
        let (status, v) = self.call("POST", path, Some(&body));
        assert!(status < 300, "POST {path}: {status} {v}");
        v
    }

    pub fn add_model(&self, name: &str, path: &Path) {
        self.post(
            "/api/models",
            serde_json::json!({ "name": name, "path": path }),
        );
    }

    /// Waits until job `id` is done, failed or cancelled, and returns it.
    pub fn wait_final(&self, id: i64, timeout: Duration) -> Value {
        let started = Instant::now();
        loop {
            let job = self.get(&format!("/api/jobs/{id}"));
            if ["done", "failed", "cancelled"].contains(&job["state"].as_str().unwrap()) {
                return job;
            }
            assert!(
                started.elapsed() < timeout,
                "job {id} still {} after {timeout:?}",
                job["state"]
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until job `id` has committed some output.
    pub fn wait_output(&self, id: i64, timeout: Duration) {
        let started = Instant::now();
        while self.get(&format!("/api/jobs/{id}"))["tokens"]
            .as_u64()
            .unwrap_or(0)
            == 0
        {
            assert!(started.elapsed() < timeout, "job {id} produced no output");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until job `id` passes `check`; `what` names the wait in the
    /// failure message.
    pub fn wait_job(
        &self,
        id: i64,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let started = Instant::now();
        loop {
            let job = self.get(&format!("/api/jobs/{id}"));
            if check(&job) {
                return job;
            }
            assert!(started.elapsed() < timeout, "job {id}: {what}: {job}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until job `id` is in `state`.
    pub fn wait_state(&self, id: i64, state: &str, timeout: Duration) -> Value {
        let started = Instant::now();
        loop {
            let job = self.get(&format!("/api/jobs/{id}"));
            if job["state"] == state {
                return job;
            }
            let st = job["state"].as_str().unwrap_or("");
            assert!(
                !["done", "failed", "cancelled"].contains(&st),
                "job {id} ended {st} instead of becoming {state}: {}",
                job["error"]
            );
            assert!(
                started.elapsed() < timeout,
                "job {id} is {} not {state}",
                job["state"]
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM; the exit status if it exits within `limit`.
    pub fn terminate(mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        terminate(self.child.id());
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(mut self) {
        terminate(self.child.id());
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends SIGTERM through the `kill` command (no unsafe code in tests).
fn terminate(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// A small random-weight MoE checkpoint with no end-of-sequence token, so
/// answers run to `max_tokens`.
pub fn synth_model(dir: &Path) -> PathBuf {
    synth_model_of(
        dir,
        "qwen3_moe",
        &["--kv-heads", "2", "--layers", "2", "--top-k", "2"],
    )
}

/// A tiny synthetic `arch` checkpoint (hidden 64, 4 heads, 8 experts of
/// 32, vocabulary 512) with `extra` settings, written under `dir`.
pub fn synth_model_of(dir: &Path, arch: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("synth-{arch}"));
    let status = Command::new(longhaul())
        .args(["synth", "--arch", arch, "--hidden", "64", "--heads", "4"])
        .args([
            "--experts",
            "8",
            "--moe-intermediate",
            "32",
            "--vocab",
            "512",
        ])
        .args(extra)
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    out
}

/// Follows the event stream on a thread, sending (event name, data).
pub fn follow_events(s: &Service) -> mpsc::Receiver<(String, Value)> {
    let (tx, rx) = mpsc::channel();
    let url = format!("{}/api/events?token={}", s.url, s.token);
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
        let Ok(response) = agent.get(&url).call() else {
            return;
        };
        let reader = std::io::BufReader::new(response.into_body().into_reader());
        let mut name = String::new();
        for line in reader.lines().map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("event:") {
                name = n.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                let v: Value = serde_json::from_str(d.trim()).unwrap_or(Value::Null);
                if tx.send((name.clone(), v)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// A stand-in for smartctl that prints what `reading` holds (a recorded
/// output from `service/tests/fixtures/health`, copied in by [`set_health`]),
/// whatever device it is asked for. Returns the command to give the service
/// as `LONGHAUL_SMARTCTL`.
pub fn fake_smartctl(dir: &Path, reading: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("smartctl");
    std::fs::write(&script, format!("#!/bin/sh\ncat '{}'\n", reading.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.to_str().unwrap().to_string()
}

/// Makes the fake smartctl print the recorded output `name`.
pub fn set_health(reading: &Path, name: &str) {
    let recorded = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../service/tests/fixtures/health")
        .join(name);
    std::fs::copy(&recorded, reading).unwrap();
}
