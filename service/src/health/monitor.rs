//! The slow watch over the drives' health: a reading of each disk under a
//! pack every [`HEALTH_EVERY`], a week of them kept in the data dir, and
//! warnings from what changed.
//!
//! Ten minutes because health moves slowly and each reading wakes the
//! drive's controller: 144 smartctl runs a day per disk, each tens of
//! milliseconds. Temperature can rise faster than that, which is why the
//! drive's own count of minutes above its warning temperature (where it
//! throttles) is read too: it says what happened between readings.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::smart::{Health, Unavailable};

/// How often the drives are read.
pub const HEALTH_EVERY: Duration = Duration::from_secs(600);

/// Readings kept per drive: a week at one per [`HEALTH_EVERY`].
pub const HISTORY_LEN: usize = 7 * 24 * 6;

/// A drive this warm warns: consumer NVMe drives begin to throttle between
/// 70 and 80 °C, and most set their warning temperature there.
pub const HOT_CELSIUS: i64 = 70;

/// Endurance used past which a drive is called worn.
pub const WORN_PERCENT: u64 = 90;

/// New errors are counted over this window: an error logged in the last
/// day warns, and the warning ends a day after the last one.
pub const ERROR_WINDOW_SECS: f64 = 24.0 * 3600.0;

/// The file in the data dir.
const FILE: &str = "drive-health.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// Seconds since the Unix epoch.
    pub t: f64,
    pub health: Health,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// The drive says it is failing (SMART verdict, NVMe critical warning).
    Failing,
    /// Media, integrity, reallocation or link errors grew.
    NewErrors,
    Hot,
    /// Minutes above the drive's own warning temperature grew.
    Throttled,
    Worn,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct Warning {
    pub kind: WarningKind,
    pub text: String,
}

/// One disk under one or more drive folders, and what it said last.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DriveHealth {
    /// The drive folders on this disk.
    pub folders: Vec<PathBuf>,
    /// The disk's node (`/dev/nvme0n1`), when it was found.
    pub device: Option<String>,
    /// How it is attached, in words ("NVMe, PCIe 16.0 GT/s x4").
    pub link: Option<String>,
    /// Layers between folder and disk ("loop0 over /srv/drive1.img").
    pub via: Vec<String>,
    /// When it was last read, in seconds since the Unix epoch.
    pub checked_at: f64,
    /// The last reading, when there is one.
    pub health: Option<Health>,
    /// Why there is no reading.
    pub unavailable: Option<Unavailable>,
    pub warnings: Vec<Warning>,
    /// Readings, oldest first.
    pub history: VecDeque<Reading>,
}

impl DriveHealth {
    fn key(&self) -> String {
        self.device.clone().unwrap_or_else(|| {
            self.folders
                .first()
                .map(|f| f.display().to_string())
                .unwrap_or_default()
        })
    }
}

/// The warnings `now` earns against the readings before it.
pub fn warnings(history: &VecDeque<Reading>, now: &Reading) -> Vec<Warning> {
    let h = &now.health;
    let mut out = Vec::new();
    let failing = h.passed == Some(false) || h.critical_warning.is_some_and(|w| w != 0);
    if failing {
        out.push(Warning {
            kind: WarningKind::Failing,
            text: format!("says it is failing: {}", failing_words(h)),
        });
    }
    // Errors against the oldest reading still in the window.
    let since = history
        .iter()
        .find(|r| now.t - r.t <= ERROR_WINDOW_SECS)
        .map(|r| &r.health);
    if let Some(before) = since {
        let grew: Vec<String> = [
            ("media errors", before.media_errors, h.media_errors),
            (
                "error-log entries",
                before.error_log_entries,
                h.error_log_entries,
            ),
            ("reallocated blocks", before.reallocated, h.reallocated),
            ("link CRC errors", before.crc_errors, h.crc_errors),
        ]
        .into_iter()
        .filter_map(|(what, a, b)| match (a, b) {
            (Some(a), Some(b)) if b > a => Some(format!("{} new {what}", b - a)),
            _ => None,
        })
        .collect();
        if !grew.is_empty() {
            out.push(Warning {
                kind: WarningKind::NewErrors,
                text: format!("logged {} in the last day", grew.join(", ")),
            });
        }
    }
    if let Some(t) = h.temperature_c.filter(|t| *t >= HOT_CELSIUS) {
        out.push(Warning {
            kind: WarningKind::Hot,
            text: format!("runs hot: {t} °C (warns from {HOT_CELSIUS} °C)"),
        });
    }
    if let Some(before) = history.back().map(|r| &r.health) {
        let more = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => 0,
        };
        let warm = more(before.warning_temp_minutes, h.warning_temp_minutes);
        let critical = more(before.critical_temp_minutes, h.critical_temp_minutes);
        if warm + critical > 0 {
            out.push(Warning {
                kind: WarningKind::Throttled,
                text: format!(
                    "ran above its warning temperature for {warm} more minutes{} since the last reading; it slows itself down there",
                    if critical > 0 {
                        format!(" ({critical} above critical)")
                    } else {
                        String::new()
                    }
                ),
            });
        }
    }
    let spare_low = matches!(
        (h.available_spare, h.available_spare_threshold),
        (Some(s), Some(t)) if s < t
    );
    if let Some(used) = h.percentage_used.filter(|u| *u >= WORN_PERCENT) {
        out.push(Warning {
            kind: WarningKind::Worn,
            text: format!("is worn: {used}% of its rated endurance used"),
        });
    } else if spare_low {
        out.push(Warning {
            kind: WarningKind::Worn,
            text: "is worn: its spare blocks are under the drive's own threshold".into(),
        });
    }
    out
}

/// The NVMe critical warning bits in words, or the SMART verdict.
fn failing_words(h: &Health) -> String {
    let Some(w) = h.critical_warning.filter(|w| *w != 0) else {
        return "its SMART self-assessment failed".into();
    };
    let bits = [
        (0x01, "spare below threshold"),
        (0x02, "temperature past a threshold"),
        (0x04, "reliability degraded"),
        (0x08, "media read-only"),
        (0x10, "volatile memory backup failed"),
        (0x20, "persistent memory unreliable"),
    ];
    let said: Vec<&str> = bits
        .iter()
        .filter(|(bit, _)| w & bit != 0)
        .map(|(_, words)| *words)
        .collect();
    if said.is_empty() {
        format!("critical warning 0x{w:02x}")
    } else {
        said.join(", ")
    }
}

/// Finds the disk under each of `folders` (folders on one disk share its
/// entry) and reads each disk once; no history and no warnings.
pub fn survey(folders: &[PathBuf], now: f64) -> Vec<DriveHealth> {
    let mut found: Vec<DriveHealth> = Vec::new();
    for folder in folders {
        let d = match super::device::resolve(folder) {
            Ok(d) => d,
            Err(why) => {
                found.push(DriveHealth {
                    folders: vec![folder.clone()],
                    checked_at: now,
                    unavailable: Some(why),
                    ..DriveHealth::default()
                });
                continue;
            }
        };
        if let Some(same) = found
            .iter_mut()
            .find(|f| f.device.as_ref() == Some(&d.node))
        {
            same.folders.push(folder.clone());
            continue;
        }
        let (health, unavailable) = match super::check_device(&d) {
            Ok(h) => (Some(h), None),
            Err(why) => (None, Some(why)),
        };
        found.push(DriveHealth {
            folders: vec![folder.clone()],
            device: Some(d.node.clone()),
            link: Some(d.link.to_string()),
            via: d.via.clone(),
            checked_at: now,
            health,
            unavailable,
            ..DriveHealth::default()
        });
    }
    found
}

/// The readings of every disk under a pack, kept across restarts.
pub struct HealthMonitor {
    drives: Mutex<Vec<DriveHealth>>,
    file: PathBuf,
    last: Mutex<Option<Instant>>,
}

impl HealthMonitor {
    /// Loads the kept readings from `data_dir` (none when there are none or
    /// they cannot be read: a week of history is not worth refusing to start).
    pub fn open(data_dir: &Path) -> Self {
        let file = data_dir.join(FILE);
        let drives = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Self {
            drives: Mutex::new(drives),
            file,
            last: Mutex::new(None),
        }
    }

    /// Whether a reading is due (never read since start, or [`HEALTH_EVERY`] ago).
    pub fn due(&self) -> bool {
        self.last
            .lock()
            .map(|l| l.is_none_or(|t| t.elapsed() >= HEALTH_EVERY))
            .unwrap_or(false)
    }

    /// Reads the disks under `folders` now (blocking: one smartctl run per
    /// disk), keeps the readings and saves them.
    pub fn refresh(&self, folders: &[PathBuf], now: f64) {
        if let Ok(mut l) = self.last.lock() {
            *l = Some(Instant::now());
        }
        let mut found = survey(folders, now);
        let Ok(mut kept) = self.drives.lock() else {
            return;
        };
        for drive in &mut found {
            let old = kept.iter().find(|k| k.key() == drive.key());
            let mut history = old.map(|o| o.history.clone()).unwrap_or_default();
            if let Some(h) = &drive.health {
                let reading = Reading {
                    t: now,
                    health: h.clone(),
                };
                drive.warnings = warnings(&history, &reading);
                history.push_back(reading);
                while history.len() > HISTORY_LEN {
                    history.pop_front();
                }
            }
            drive.history = history;
        }
        *kept = found;
        if let Ok(bytes) = serde_json::to_vec(&*kept)
            && let Err(e) = crate::data_dir::write_private(&self.file, &bytes)
        {
            tracing::warn!(
                "cannot keep the drives' health in {}: {e}",
                self.file.display()
            );
        }
    }

    /// Every disk's last reading.
    pub fn drives(&self) -> Vec<DriveHealth> {
        self.drives.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// The disk under `folder`, when it was read.
    pub fn for_folder(&self, folder: &Path) -> Option<DriveHealth> {
        self.with_folder(folder, DriveHealth::clone)
    }

    /// What `f` makes of each disk, read in place.
    pub fn each<T>(&self, f: impl FnMut(&DriveHealth) -> T) -> Vec<T> {
        self.drives
            .lock()
            .map(|d| d.iter().map(f).collect())
            .unwrap_or_default()
    }

    /// What `f` makes of the disk under `folder`, read in place: the drives
    /// view asks every 2 s, and a week of history is not copied for it.
    pub fn with_folder<T>(&self, folder: &Path, f: impl FnOnce(&DriveHealth) -> T) -> Option<T> {
        self.drives
            .lock()
            .ok()?
            .iter()
            .find(|d| d.folders.iter().any(|x| x == folder))
            .map(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(file: &str, t: f64) -> Reading {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/health")
            .join(file);
        let text = std::fs::read_to_string(path).unwrap();
        Reading {
            t,
            health: super::super::smart::parse("/dev/nvme0", &text).unwrap(),
        }
    }

    fn kinds(w: &[Warning]) -> Vec<WarningKind> {
        w.iter().map(|w| w.kind).collect()
    }

    #[test]
    fn a_healthy_drive_warns_of_nothing() {
        let first = reading("nvme.json", 0.0);
        assert!(warnings(&VecDeque::new(), &first).is_empty());
        let again = reading("nvme.json", 600.0);
        assert!(warnings(&VecDeque::from([first]), &again).is_empty());
    }

    #[test]
    fn a_hot_night_with_errors_warns_of_each() {
        let before = VecDeque::from([reading("nvme.json", 0.0)]);
        let after = reading("nvme-hot-errors.json", 600.0);
        let w = warnings(&before, &after);
        assert_eq!(
            kinds(&w),
            [
                WarningKind::Failing,
                WarningKind::NewErrors,
                WarningKind::Hot,
                WarningKind::Throttled
            ]
        );
        assert!(w[0].text.contains("temperature past a threshold"), "{w:?}");
        assert!(
            w[1].text.contains("2 new media errors")
                && w[1].text.contains("3 new error-log entries"),
            "{w:?}"
        );
        assert!(w[2].text.contains("79 °C"), "{w:?}");
        assert!(
            w[3].text.contains("41 more minutes") && w[3].text.contains("2 above critical"),
            "{w:?}"
        );
    }

    #[test]
    fn errors_older_than_a_day_no_longer_warn() {
        let day = ERROR_WINDOW_SECS;
        let before = VecDeque::from([
            reading("nvme.json", 0.0),
            reading("nvme-hot-errors.json", 600.0),
        ]);
        let later = reading("nvme-hot-errors.json", 600.0 + day + 1.0);
        assert!(!kinds(&warnings(&before, &later)).contains(&WarningKind::NewErrors));
        let within = reading("nvme-hot-errors.json", day - 1.0);
        assert!(kinds(&warnings(&before, &within)).contains(&WarningKind::NewErrors));
    }

    #[test]
    fn a_worn_drive_says_so() {
        let w = warnings(&VecDeque::new(), &reading("nvme-worn.json", 0.0));
        assert_eq!(kinds(&w), [WarningKind::Failing, WarningKind::Worn]);
        assert!(w[0].text.contains("spare below threshold"), "{w:?}");
        assert!(w[1].text.contains("104%"), "{w:?}");
    }

    #[test]
    fn readings_are_kept_across_a_restart_and_a_missing_folder_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let m = HealthMonitor::open(dir.path());
        assert!(m.due());
        m.refresh(std::slice::from_ref(&gone), 1.0);
        assert!(!m.due());
        let d = m.for_folder(&gone).unwrap();
        assert!(d.unavailable.is_some() && d.health.is_none(), "{d:?}");
        let again = HealthMonitor::open(dir.path());
        assert_eq!(again.drives(), m.drives());
    }
}
