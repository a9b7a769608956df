//! SSD health from the drives themselves: which disk each drive folder is
//! on and how it is attached ([`device`]), what the disk says of itself
//! through `smartctl --json` ([`smart`]), and a slow watch that keeps the
//! readings' history and warns when a drive runs hot, wears out or logs new
//! errors ([`monitor`]).
//!
//! smartmontools is the source on Linux and macOS alike: it knows NVMe
//! logs, ATA attributes and USB bridges (a drive database of thousands of
//! enclosures), where each system's own interface knows only some. It is
//! run, never linked: `-n standby` leaves a sleeping drive asleep, and a
//! run that hangs on a stuck enclosure is killed after
//! [`SMARTCTL_TIMEOUT`].

pub mod device;
pub mod diskutil;
pub mod monitor;
pub mod smart;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use device::{BlockDevice, Link};
pub use monitor::{DriveHealth, HealthMonitor, Warning, WarningKind};
pub use smart::{Health, Unavailable};

/// The command run, unless `LONGHAUL_SMARTCTL` names another (a full path
/// where `PATH` lacks it, or a wrapper such as `sudo -n smartctl`).
const SMARTCTL: &str = "smartctl";

/// The environment variable naming the smartctl command.
pub const SMARTCTL_ENV: &str = "LONGHAUL_SMARTCTL";

/// How long one smartctl run may take: a healthy drive answers in tens of
/// milliseconds; a USB enclosure that stopped answering never does.
pub const SMARTCTL_TIMEOUT: Duration = Duration::from_secs(20);

/// How often a finished run is looked for while waiting.
const POLL: Duration = Duration::from_millis(20);

/// Reads `device`'s health with smartctl.
pub fn read(device: &str) -> Result<Health, Unavailable> {
    let configured = std::env::var(SMARTCTL_ENV).unwrap_or_else(|_| SMARTCTL.to_string());
    let mut words = configured.split_whitespace();
    let program = words.next().unwrap_or(SMARTCTL);
    let mut child = Command::new(program)
        .args(words)
        .args(["--json", "-a", "-n", "standby", device])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Unavailable::NoSmartctl,
            _ => Unavailable::Failed {
                device: device.to_string(),
                message: format!("cannot run {program}: {e}"),
            },
        })?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < SMARTCTL_TIMEOUT => std::thread::sleep(POLL),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Unavailable::Failed {
                    device: device.to_string(),
                    message: format!(
                        "smartctl did not answer in {} s (the drive or its enclosure is not responding)",
                        SMARTCTL_TIMEOUT.as_secs()
                    ),
                });
            }
        }
    }
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    smart::parse(device, &text)
}

/// What the disk `d` says of itself.
pub fn check_device(d: &BlockDevice) -> Result<Health, Unavailable> {
    read(&d.node).map_err(|why| match (why, &d.link) {
        // A virtual disk's health is its host's to read.
        (Unavailable::NoSmart { device, .. }, Link::Virtual { what }) => Unavailable::NoSmart {
            device,
            why: format!(
                "it is a {what} disk the host provides; the physical drive's health is the host's to read"
            ),
        },
        (why, _) => why,
    })
}

/// A disk's reading in a few lines of words, for the command line.
pub fn describe(d: &DriveHealth) -> Vec<String> {
    let folders: Vec<String> = d.folders.iter().map(|f| f.display().to_string()).collect();
    let name = d.device.clone().unwrap_or_else(|| folders.join(", "));
    let model = d
        .health
        .as_ref()
        .and_then(|h| h.model.clone())
        .map_or(String::new(), |m| format!(" — {m}"));
    let link = d.link.as_ref().map_or(String::new(), |l| format!(" · {l}"));
    let mut lines = vec![format!("{name}{model}{link}")];
    if d.device.is_some() {
        lines.push(format!("  folders: {}", folders.join(", ")));
    }
    for v in &d.via {
        lines.push(format!("  through {v}"));
    }
    match (&d.health, &d.unavailable) {
        (Some(h), _) => lines.push(format!("  {}", figures(h).join(" · "))),
        (None, Some(why)) => lines.push(format!("  no health: {why}")),
        (None, None) => {}
    }
    for w in &d.warnings {
        lines.push(format!("  warning: {name} {}", w.text));
    }
    lines
}

/// A reading's figures in words, those the drive reports.
pub fn figures(h: &Health) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |v: Option<String>| out.extend(v);
    add(h.passed.map(|p| {
        if p {
            "passes its self-assessment".into()
        } else {
            "FAILS its self-assessment".into()
        }
    }));
    add(h.temperature_c.map(|t| format!("{t} °C")));
    add(h.percentage_used.map(|u| format!("{u}% of endurance used")));
    add(h.media_errors.map(|n| format!("{n} media errors")));
    add(h
        .error_log_entries
        .map(|n| format!("{n} error-log entries")));
    add(h.reallocated.map(|n| format!("{n} reallocated")));
    add(h.crc_errors.map(|n| format!("{n} link CRC errors")));
    add(h.unsafe_shutdowns.map(|n| format!("{n} unsafe shutdowns")));
    add(h.power_on_hours.map(|n| format!("{n} h powered on")));
    add(h
        .warning_temp_minutes
        .map(|n| format!("{n} min above warning temperature")));
    out
}
