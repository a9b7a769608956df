//! The desktop app under Xvfb: it starts the service, its window loads the
//! web UI (which connects to the service's event stream), the first start
//! runs the demo through the queue, the tray comes up without errors, and a
//! screenshot of the screen while a long prompt is read is kept in
//! `ui/test-artifacts/desktop.png`; a second, once a disk under the demo's
//! pack warns (a stand-in smartctl's hot night), in `desktop-health.png`.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Webkit's first start in a fresh profile can be slow on two cores.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the first-start demo (pack, load, a short answer) may take.
const DEMO_TIMEOUT: Duration = Duration::from_secs(120);

/// Each report of prompt reading waits this long (see the service's faults).
const PROMPT_DELAY_MS: u64 = 2500;

struct Killed(Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// WebKit's session starts the document portal, which mounts a FUSE file
/// system under the cache folder and outlives the session: the folder
/// could not be removed, nor the build folder around it. Detached (lazily,
/// whatever still holds it) when the test ends, before the folder goes.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let detached = |tool: &str| {
            Command::new(tool)
                .args(["-u", "-z"])
                .arg(&self.0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        // Not `exists()`: a mount whose daemon has gone answers ENOTCONN.
        if !detached("fusermount3") {
            detached("fusermount");
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_display() -> u32 {
    (90..200)
        .find(|n| {
            !Path::new(&format!("/tmp/.X11-unix/X{n}")).exists()
                && !Path::new(&format!("/tmp/.X{n}-lock")).exists()
        })
        .expect("a free X display number")
}

fn require(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "`{tool}` is needed for the desktop test; scripts/test.sh installs it"
    );
}

/// `event_subscribers` from the service's metrics, once it answers.
fn api(base: &str, token: &str, path: &str) -> Option<serde_json::Value> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut response = agent
        .get(format!("{base}{path}"))
        .header("Authorization", &format!("Bearer {token}"))
        .call()
        .ok()?;
    response.body_mut().read_json().ok()
}

/// Queues a task through the API; its id.
fn submit(base: &str, token: &str, body: &serde_json::Value) -> Option<i64> {
    post(base, token, "/api/jobs", body)?["id"].as_i64()
}

fn post(
    base: &str,
    token: &str,
    path: &str,
    body: &serde_json::Value,
) -> Option<serde_json::Value> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let mut response = agent
        .post(format!("{base}{path}"))
        .header("Authorization", &format!("Bearer {token}"))
        .send_json(body)
        .ok()?;
    response.body_mut().read_json().ok()
}

/// Photographs display `display` into `shot` and checks it is not blank.
fn photograph(display: u32, shot: &Path) {
    let status = Command::new("import")
        .args(["-display", &format!(":{display}"), "-window", "root"])
        .arg(shot)
        .status()
        .unwrap();
    assert!(status.success());
    let spread = Command::new("convert")
        .arg(shot)
        .args(["-format", "%[fx:standard_deviation]", "info:"])
        .output()
        .unwrap();
    let spread: f64 = String::from_utf8_lossy(&spread.stdout)
        .trim()
        .parse()
        .unwrap_or(0.0);
    assert!(
        spread > 0.05,
        "the screen is nearly blank (deviation {spread})"
    );
}

fn subscribers(base: &str, token: &str) -> Option<u64> {
    api(base, token, "/api/metrics")?["event_subscribers"].as_u64()
}

/// The state of the first-start demo's job, once it is queued.
fn demo_state(base: &str, token: &str) -> Option<String> {
    let jobs = api(base, token, "/api/jobs")?;
    jobs["jobs"]
        .as_array()?
        .iter()
        .find(|j| j["model"] == "longhaul-demo")
        .and_then(|j| j["state"].as_str().map(str::to_string))
}

#[test]
fn the_desktop_app_shows_the_ui_and_starts_its_tray() {
    for tool in ["Xvfb", "dbus-run-session", "import", "convert"] {
        require(tool);
    }
    let app = support::built("longhaul-desktop");
    let service = app.with_file_name("longhaul");
    assert!(
        service.is_file(),
        "the service binary is built beside the app: {}",
        service.display()
    );
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let _portal = Unmount(tmp.path().join("xdg-cache").join("doc"));
    let data = tmp.path().join("data");
    let port = free_port();
    let display = free_display();
    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let log_path = tmp.path().join("desktop.log");
    // Disk health from a stand-in smartctl: the demo's pack folders are
    // under the build's own directory, on a real disk.
    let health = tmp.path().join("reading.json");
    support::set_health(&health, "nvme.json");
    let smartctl = support::fake_smartctl(tmp.path(), &health);

    let xvfb = Command::new("Xvfb")
        .args([
            &format!(":{display}"),
            "-screen",
            "0",
            "1360x900x24",
            "-nolisten",
            "tcp",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut children = Killed(vec![xvfb]);
    std::thread::sleep(Duration::from_millis(500));
    let log = std::fs::File::create(&log_path).unwrap();
    let desktop = Command::new("dbus-run-session")
        .arg("--")
        .arg(&app)
        .env("DISPLAY", format!(":{display}"))
        .env("LONGHAUL_BIN", &service)
        .env("LONGHAUL_PORT", port.to_string())
        .env("LONGHAUL_DATA_DIR", &data)
        .env("LONGHAUL_SMARTCTL", &smartctl)
        .env("XDG_DATA_HOME", tmp.path().join("xdg-data"))
        .env("XDG_CACHE_HOME", tmp.path().join("xdg-cache"))
        .env("XDG_CONFIG_HOME", tmp.path().join("xdg-config"))
        .env("RUST_LOG", "info")
        .env("WEBKIT_DISABLE_COMPOSITING_MODE", "1")
        // Prompt reading slowed so the window can be photographed in it.
        .env(
            "LONGHAUL_FAULTS",
            format!("prompt-delay-ms={PROMPT_DELAY_MS}"),
        )
        // No desktop portals in a bare X session.
        .env("GTK_USE_PORTAL", "0")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    children.0.push(desktop);

    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let mut connected = false;
    while started.elapsed() < START_TIMEOUT {
        let token = std::fs::read_to_string(data.join("token")).ok();
        if token
            .as_deref()
            .and_then(|t| subscribers(&base, t.trim()))
            .is_some_and(|n| n >= 1)
        {
            connected = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        connected,
        "the window's UI never connected to the service; log:\n{}",
        log_text()
    );
    // The first start runs the demo: its task goes through the queue.
    let token = std::fs::read_to_string(data.join("token")).unwrap_or_default();
    let mut demo = None;
    while started.elapsed() < START_TIMEOUT + DEMO_TIMEOUT {
        demo = demo_state(&base, token.trim());
        if demo.as_deref() == Some("done") {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        demo.as_deref(),
        Some("done"),
        "the first-start demo; its log:\n{}",
        std::fs::read_to_string(data.join("demo.log")).unwrap_or_default()
    );
    // A long prompt, photographed while it is read.
    let prompt = "Audit the storage engine, module by module. ".repeat(64);
    let id = submit(
        &base,
        token.trim(),
        &serde_json::json!({ "model": "longhaul-demo", "title": "Overnight audit", "prompt": prompt, "max_tokens": 8 }),
    )
    .expect("the task is queued");
    let reading = Instant::now();
    while reading.elapsed() < DEMO_TIMEOUT {
        let job = api(&base, token.trim(), &format!("/api/jobs/{id}"));
        if job.is_some_and(|j| j["live"]["prompt"]["done"].as_u64() > Some(0)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let the view catch up before the picture.
    std::thread::sleep(Duration::from_millis(1500));
    let job = api(&base, token.trim(), &format!("/api/jobs/{id}")).unwrap_or_default();
    assert!(
        job["live"]["prompt"].is_object(),
        "the task is still reading its prompt at the picture: {job}"
    );
    photograph(display, &artifacts.join("desktop.png"));
    // A hot night on the disk under the demo's pack: the window's banner says so.
    support::set_health(&health, "nvme-hot-errors.json");
    let drives = post(
        &base,
        token.trim(),
        "/api/drives/health",
        &serde_json::json!({}),
    )
    .unwrap_or_default();
    let warned = api(&base, token.trim(), "/api/queue").unwrap_or_default();
    assert!(
        warned["health_warnings"]
            .as_array()
            .is_some_and(|w| !w.is_empty()),
        "{warned}\n{drives}"
    );
    // The banner reads the queue every 10 s.
    std::thread::sleep(Duration::from_secs(11));
    photograph(display, &artifacts.join("desktop-health.png"));

    let log = log_text();
    assert!(log.contains("tray icon ready"), "log:\n{log}");
    for bad in ["panicked", " ERROR "] {
        assert!(!log.contains(bad), "`{bad}` in the log:\n{log}");
    }
    drop(children);
    // The app was killed, not quit: stop the service it started.
    let _ = Command::new("pkill")
        .args(["-f", &data.display().to_string()])
        .status();
}
