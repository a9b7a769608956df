//! What the desktop shell needs from the service, kept here so the shell
//! holds no logic of its own: start `longhaul serve` (or attach to one already
//! answering on the port), restart it if it dies, sum up the queue for the
//! tray, notice jobs that ended, and keep the machine awake while a job runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client::{Client, ENDPOINT_FILE};
use crate::queue::PauseCause;

/// How long a starting service may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the service did not start within {0:?}; see its log at {1}")]
    Timeout(Duration, PathBuf),
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
}

#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// The `longhaul` binary.
    pub binary: PathBuf,
    pub data_dir: PathBuf,
    pub port: u16,
    /// More `serve` arguments (budget, cache options).
    pub serve_args: Vec<String>,
}

/// The queue at a glance, for the tray icon and its tooltip.
#[derive(Debug, Clone, PartialEq)]
pub enum TrayState {
    Idle,
    Running,
    Paused,
    /// The service does not answer.
    Error,
}

#[derive(Debug, Clone)]
pub struct TrayStatus {
    pub state: TrayState,
    /// One line: what is running, how fast, what waits.
    pub text: String,
    /// A few characters beside the tray icon: the state, and the share done.
    pub title: String,
    /// Whether the queue is paused (the menu offers to resume it).
    pub queue_paused: bool,
    /// Jobs that ended since the previous status, and jobs newly paused by
    /// a fault that needs the user: (id, title, state); see [`notice`].
    pub ended: Vec<(i64, String, String)>,
    /// Drive health warnings not told before ("/dev/nvme0 runs hot: 79 °C").
    pub health: Vec<String>,
}

pub struct Supervisor {
    config: SupervisorConfig,
    child: Mutex<Option<Child>>,
    client: Mutex<Option<Client>>,
    /// Last seen state of each job, to notice endings.
    seen: Mutex<HashMap<i64, String>>,
    /// Jobs whose fault pause was told, until they end: a job retried by
    /// itself may pause again every few minutes, and is told once.
    told_paused: Mutex<std::collections::HashSet<i64>>,
    /// Drive warnings told, by device and kind, while they last: a drive
    /// that stays hot all night is told once, and again if it cools and
    /// heats up later.
    told_health: Mutex<std::collections::HashSet<(String, String)>>,
    awake: Mutex<Option<Child>>,
    /// `longhaul demo`, while it runs on the first start.
    demo: Mutex<Option<Child>>,
}

/// Written when the demo has been started once for a data dir.
const DEMO_MARKER: &str = "demo-started";

fn log_path(data_dir: &Path) -> PathBuf {
    data_dir.join("service.log")
}

fn percent(done: u64, total: u64) -> u64 {
    100 * done.min(total) / total.max(1)
}

/// Whether job `j` is paused by a fault (a drive, a server, a full disk)
/// rather than by a person: the pause the tray turns red for.
fn needs_you(j: &Value) -> bool {
    j["state"] == "paused"
        && j["pause_cause"]
            .as_str()
            .and_then(PauseCause::parse)
            .is_some_and(PauseCause::is_fault)
}

/// The notification for a job of `title` that reached `state`.
pub fn notice(title: &str, state: &str) -> String {
    match state {
        "done" => format!("Finished: {title}"),
        "failed" => format!("Failed: {title}"),
        _ => format!("Paused, needs you: {title}"),
    }
}

/// The running job's share done: of its prompt while it reads it, then of
/// its answer's `max_tokens`.
fn share_done(j: &Value) -> u64 {
    let prompt = &j["live"]["prompt"];
    if let (Some(done), Some(total)) = (prompt["done"].as_u64(), prompt["total"].as_u64()) {
        return percent(done, total);
    }
    let max = j["request"]["settings"]["max_tokens"].as_u64().unwrap_or(0);
    let tokens = j["live"]["tokens"]
        .as_u64()
        .or_else(|| j["tokens"].as_u64())
        .unwrap_or(0);
    percent(tokens, max)
}

/// Where the running job `j` is: reading its prompt or writing its answer,
/// with the share done.
fn running_line(j: &Value, rate: Option<f64>) -> String {
    let prompt = &j["live"]["prompt"];
    if let (Some(done), Some(total)) = (prompt["done"].as_u64(), prompt["total"].as_u64()) {
        return format!(
            "reading the prompt, {done} of {total} tokens ({}%)",
            percent(done, total)
        );
    }
    let max = j["request"]["settings"]["max_tokens"].as_u64().unwrap_or(0);
    // The live count, with what is not yet committed.
    let tokens = j["live"]["tokens"]
        .as_u64()
        .or_else(|| j["tokens"].as_u64())
        .unwrap_or(0);
    let speed = rate.map_or(String::new(), |r| format!(", {r:.2} tok/s"));
    format!(
        "{tokens} of {max} tokens ({}%){speed}",
        percent(tokens, max)
    )
}

impl Supervisor {
    /// Attaches to a service answering on the port, or starts one.
    pub fn start(config: SupervisorConfig) -> Result<Self, SupervisorError> {
        let me = Self {
            config,
            child: Mutex::new(None),
            client: Mutex::new(None),
            seen: Mutex::new(HashMap::new()),
            told_paused: Mutex::new(std::collections::HashSet::new()),
            told_health: Mutex::new(std::collections::HashSet::new()),
            awake: Mutex::new(None),
            demo: Mutex::new(None),
        };
        if !me.attach() {
            me.spawn()?;
        }
        me.remember_current_jobs();
        Ok(me)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.config.port)
    }

    /// Uses a service of this data dir already answering: on the configured
    /// port, or where the data dir's `endpoint` says (one started by hand
    /// on another port holds the data dir, so starting ours would fail).
    fn attach(&self) -> bool {
        let dir = &self.config.data_dir;
        let urls = [self.url(), crate::client::service_url(dir, None)];
        let live = urls.iter().find_map(|url| {
            let client = Client::new(dir, Some(url)).ok()?;
            client.get::<Value>("/api/queue").ok().map(|_| client)
        });
        let Some(client) = live else {
            return false;
        };
        if let Ok(mut c) = self.client.lock() {
            *c = Some(client);
        }
        true
    }

    /// Where the service this supervisor uses answers.
    fn base_url(&self) -> String {
        self.with_client(|c| c.base().to_string())
            .unwrap_or_else(|| self.url())
    }

    fn spawn(&self) -> Result<(), SupervisorError> {
        let dir = &self.config.data_dir;
        let _ = crate::data_dir::create_private_dir(dir);
        let log = crate::data_dir::private_options()
            .create(true)
            .append(true)
            .open(log_path(dir))
            .ok();
        let stderr = log.map_or_else(Stdio::null, Stdio::from);
        let child = Command::new(&self.config.binary)
            .arg("serve")
            .arg("--data-dir")
            .arg(dir)
            .args(["--port", &self.config.port.to_string()])
            .args(&self.config.serve_args)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|source| SupervisorError::Spawn {
                binary: self.config.binary.clone(),
                source,
            })?;
        if let Ok(mut c) = self.child.lock() {
            *c = Some(child);
        }
        let started = Instant::now();
        while started.elapsed() < START_TIMEOUT {
            if dir.join(ENDPOINT_FILE).is_file() && self.attach() {
                return Ok(());
            }
            if self.child_exited() {
                break;
            }
            std::thread::sleep(POLL);
        }
        Err(SupervisorError::Timeout(START_TIMEOUT, log_path(dir)))
    }

    fn child_exited(&self) -> bool {
        self.child
            .lock()
            .ok()
            .and_then(|mut c| c.as_mut().map(|c| !matches!(c.try_wait(), Ok(None))))
            .unwrap_or(false)
    }

    /// Restarts the service if the one this supervisor started has died.
    /// Returns true when it restarted it.
    pub fn keep_alive(&self) -> Result<bool, SupervisorError> {
        let ours = self.child.lock().map(|c| c.is_some()).unwrap_or(false);
        if ours && self.child_exited() {
            tracing::warn!("the Longhaul service stopped; starting it again");
            self.spawn()?;
            return Ok(true);
        }
        if !ours && !self.attach() {
            // The service we attached to is gone: run our own.
            self.spawn()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn with_client<T>(&self, f: impl FnOnce(&Client) -> T) -> Option<T> {
        self.client.lock().ok()?.as_ref().map(f)
    }

    /// The address the UI opens, token included (in the fragment, which
    /// never leaves the machine).
    pub fn ui_url(&self) -> Option<String> {
        self.with_client(|c| format!("{}/#token={}", c.base(), c.token()))
    }

    pub fn set_queue_paused(&self, paused: bool) -> Result<(), SupervisorError> {
        let action = if paused { "pause" } else { "resume" };
        self.with_client(|c| {
            c.post::<Value>(&format!("/api/queue/{action}"), &serde_json::json!({}))
        })
        .transpose()?;
        Ok(())
    }

    fn jobs(&self) -> Option<Vec<Value>> {
        let v = self.with_client(|c| c.get::<Value>("/api/jobs"))?.ok()?;
        v["jobs"].as_array().cloned()
    }

    fn remember_current_jobs(&self) {
        let jobs = self.jobs().unwrap_or_default();
        if let Ok(mut seen) = self.seen.lock() {
            for j in jobs {
                if let (Some(id), Some(s)) = (j["id"].as_i64(), j["state"].as_str()) {
                    seen.insert(id, s.to_string());
                }
            }
        }
    }

    /// The queue at a glance; also keeps the machine awake while a job runs.
    pub fn status(&self) -> TrayStatus {
        let queue = self
            .with_client(|c| c.get::<Value>("/api/queue"))
            .and_then(Result::ok);
        let (Some(queue), Some(jobs)) = (queue, self.jobs()) else {
            self.hold_awake(false);
            return TrayStatus {
                state: TrayState::Error,
                text: "Longhaul: the service is not answering".into(),
                title: "!".into(),
                queue_paused: false,
                ended: Vec::new(),
                health: Vec::new(),
            };
        };
        let mut ended = Vec::new();
        if let Ok(mut seen) = self.seen.lock() {
            for j in &jobs {
                let (Some(id), Some(state)) = (j["id"].as_i64(), j["state"].as_str()) else {
                    continue;
                };
                let before = seen.insert(id, state.to_string());
                let pause_untold = needs_you(j)
                    && self
                        .told_paused
                        .lock()
                        .is_ok_and(|mut told| told.insert(id));
                if matches!(state, "done" | "failed" | "cancelled")
                    && let Ok(mut told) = self.told_paused.lock()
                {
                    told.remove(&id);
                }
                let ending = matches!(state, "done" | "failed") && before.as_deref() != Some(state);
                if ending || pause_untold {
                    ended.push((
                        id,
                        j["title"].as_str().unwrap_or("").to_string(),
                        state.to_string(),
                    ));
                }
            }
        }
        let waiting = queue["waiting"].as_u64().unwrap_or(0);
        let running = jobs.iter().find(|j| j["state"] == "running");
        let rate = self
            .with_client(|c| c.get::<Value>("/api/metrics"))
            .and_then(Result::ok)
            .and_then(|m| m["metrics"]["tokens_per_second"].as_f64());
        self.hold_awake(running.is_some());
        // What needs the user comes first, even while another task runs.
        let faulted = jobs.iter().find(|j| needs_you(j));
        let warnings = queue["health_warnings"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let health = self.untold_health(&warnings);
        // A drive that says it is failing or logs new errors needs the user;
        // heat and wear are told, and shown after the queue's state.
        let alarming = warnings
            .iter()
            .find(|w| matches!(w["kind"].as_str(), Some("failing" | "new_errors")));
        let (state, text) = if let Some(fault) = queue["storage_fault"].as_str() {
            (TrayState::Error, format!("Longhaul: held: {fault}"))
        } else if let Some(j) = faulted {
            (
                TrayState::Error,
                format!(
                    "Longhaul: “{}” is paused: {}",
                    j["title"].as_str().unwrap_or(""),
                    j["pause_reason"].as_str().unwrap_or("a fault")
                ),
            )
        } else if let Some(w) = alarming {
            (
                TrayState::Error,
                format!(
                    "Longhaul: {}",
                    w["text"].as_str().unwrap_or("a drive warns")
                ),
            )
        } else if queue["paused"] == true {
            (
                TrayState::Paused,
                format!("Longhaul: queue paused, {waiting} waiting"),
            )
        } else if let Some(j) = running {
            let waiting = if waiting > 0 {
                format!(", {waiting} waiting")
            } else {
                String::new()
            };
            (
                TrayState::Running,
                format!(
                    "Longhaul: {} — {}{waiting}",
                    j["title"].as_str().unwrap_or(""),
                    running_line(j, rate)
                ),
            )
        } else {
            (
                TrayState::Idle,
                format!("Longhaul: idle, {waiting} waiting"),
            )
        };
        let text = match (alarming, warnings.first()) {
            (None, Some(w)) => format!("{text} · {}", w["text"].as_str().unwrap_or("")),
            _ => text,
        };
        // Endings are only told when the user wants them told.
        let notify = self
            .with_client(|c| c.get::<Value>("/api/preferences"))
            .and_then(Result::ok)
            .is_none_or(|p| p["notify_when_done"] != false);
        if !notify {
            // Pauses that need the user are told whatever the preference.
            ended.retain(|(_, _, state)| state == "paused");
        }
        let title = match &state {
            TrayState::Idle => String::new(),
            TrayState::Running => running
                .map(|j| format!("▶ {}%", share_done(j)))
                .unwrap_or_else(|| "▶".into()),
            TrayState::Paused => "⏸".into(),
            TrayState::Error => "!".into(),
        };
        TrayStatus {
            state,
            text,
            title,
            queue_paused: queue["paused"] == true,
            ended,
            health,
        }
    }

    /// The drive warnings among `warnings` not told yet; forgets those that
    /// ended, so that they are told again if they come back.
    fn untold_health(&self, warnings: &[Value]) -> Vec<String> {
        let Ok(mut told) = self.told_health.lock() else {
            return Vec::new();
        };
        let key = |w: &Value| {
            (
                w["device"].as_str().unwrap_or("").to_string(),
                w["kind"].as_str().unwrap_or("").to_string(),
            )
        };
        let now: std::collections::HashSet<_> = warnings.iter().map(key).collect();
        told.retain(|k| now.contains(k));
        warnings
            .iter()
            .filter(|w| told.insert(key(w)))
            .map(|w| format!("Drive: {}", w["text"].as_str().unwrap_or("")))
            .collect()
    }

    /// Keeps the machine from sleeping while `hold` (a job runs), and lets it
    /// sleep again when idle.
    fn hold_awake(&self, hold: bool) {
        let Ok(mut awake) = self.awake.lock() else {
            return;
        };
        match (hold, awake.is_some()) {
            (true, false) => *awake = inhibit_sleep(),
            (false, true) => {
                if let Some(mut c) = awake.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            _ => {}
        }
    }

    /// On the first start for a data dir, runs `longhaul demo` against the
    /// service in the background (output in `demo.log`), so that a new user
    /// sees a real task stream through the queue. Returns whether it started.
    pub fn run_demo_on_first_start(&self) -> bool {
        let dir = &self.config.data_dir;
        let marker = dir.join(DEMO_MARKER);
        if marker.exists() || crate::data_dir::write_private(&marker, b"").is_err() {
            return false;
        }
        let Ok(log) = crate::data_dir::private_options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("demo.log"))
        else {
            return false;
        };
        let Ok(log_err) = log.try_clone() else {
            return false;
        };
        let child = Command::new(&self.config.binary)
            .arg("demo")
            .arg("--data-dir")
            .arg(dir)
            .args(["--url", &self.base_url()])
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .spawn();
        match child {
            Ok(child) => {
                if let Ok(mut d) = self.demo.lock() {
                    *d = Some(child);
                }
                true
            }
            Err(e) => {
                tracing::warn!("cannot start the demo: {e}");
                false
            }
        }
    }

    /// The process id of the service this supervisor started, if it did.
    pub fn service_pid(&self) -> Option<u32> {
        self.child.lock().ok()?.as_ref().map(Child::id)
    }

    /// Whether sleep is being held off now.
    pub fn holding_awake(&self) -> bool {
        self.awake.lock().map(|a| a.is_some()).unwrap_or(false)
    }

    /// What Quit asks first when it would stop a running task (the service
    /// is this supervisor's and a task runs); `None` when Quit stops
    /// nothing that is working.
    pub fn quit_question(&self) -> Option<String> {
        if !self.child.lock().is_ok_and(|c| c.is_some()) {
            return None;
        }
        let jobs = self.jobs()?;
        let running = jobs.iter().find(|j| j["state"] == "running")?;
        let waiting = jobs.iter().filter(|j| j["state"] == "queued").count();
        let after = match waiting {
            0 => String::new(),
            1 => " One more task waits.".into(),
            n => format!(" {n} more tasks wait."),
        };
        Some(format!(
            "“{}” is running: {}. Quitting stops it; it goes on from where it stopped, with the same text, when Longhaul starts again.{after}",
            running["title"].as_str().unwrap_or(""),
            running_line(running, None)
        ))
    }

    /// Stops the service if this supervisor started it (jobs resume next time).
    pub fn shutdown(&self) {
        self.hold_awake(false);
        if let Ok(mut d) = self.demo.lock()
            && let Some(mut demo) = d.take()
        {
            terminate(&mut demo);
        }
        if let Ok(mut c) = self.child.lock()
            && let Some(mut child) = c.take()
        {
            terminate(&mut child);
        }
    }
}

/// Holds off sleep with the platform's tool, if it has one.
fn inhibit_sleep() -> Option<Child> {
    let (program, args) = crate::platform::sleep_inhibitor(&std::process::id().to_string());
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// SIGTERM, so the service stops cleanly; SIGKILL after a grace period.
fn terminate(child: &mut Child) {
    const GRACE: Duration = Duration::from_secs(10);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let started = Instant::now();
    while started.elapsed() < GRACE {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(POLL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.shutdown();
    }
}
