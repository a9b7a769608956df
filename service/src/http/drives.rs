//! `/api/drives`: every drive folder under a registered pack — whether it
//! is there and reading without errors, its space, live rate and measured
//! latency, which folders share its disk, and the disk's own health.
//!
//! Error counts are the service's, not one engine's (see
//! [`crate::drive_errors`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiResult;
use crate::health::{DriveHealth, Health, Unavailable, Warning};
use crate::queue::ModelKind;

/// A drive whose last read error is this recent is shown as erring.
const RECENT_ERROR_SECS: f64 = 120.0;

/// Temperatures shown beside a drive: its last day of readings.
const TEMPERATURE_SPAN_SECS: f64 = 24.0 * 3600.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum DriveStatus {
    Present,
    Missing,
    /// Present, and reads failed within [`RECENT_ERROR_SECS`].
    Errors,
}

#[derive(Debug, Serialize, ts_rs::TS)]
#[ts(rename = "Drive")]
pub struct DriveView {
    pub path: PathBuf,
    pub status: DriveStatus,
    /// Whether the folder is there now.
    pub present: bool,
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Bytes of registered models' packs stored in this folder.
    pub model_bytes: u64,
    /// Which models have data here.
    pub models: Vec<String>,
    pub mb_per_s: Option<f64>,
    /// The drive's read rate at the last `longhaul drives probe` (or bench).
    pub ceiling_mb_per_s: Option<f64>,
    /// Measured over the reads of the last second; none when none finished.
    pub latency_p50_ms: Option<f64>,
    pub latency_p90_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    /// Failed reads since the service started, over every model load.
    pub errors: u64,
    pub last_error_seconds_ago: Option<f64>,
    /// Other folders on the same device: striping over them buys nothing.
    pub same_device: Vec<PathBuf>,
    /// The disk under the folder and what it says of itself.
    pub disk: Option<DiskView>,
}

#[derive(Debug, Serialize, ts_rs::TS)]
#[ts(rename = "Disk")]
pub struct DiskView {
    pub device: Option<String>,
    pub link: Option<String>,
    pub via: Vec<String>,
    pub checked_at: f64,
    pub health: Option<Health>,
    pub unavailable: Option<String>,
    pub warnings: Vec<Warning>,
    /// (seconds since the epoch, °C), the last day of readings.
    pub temperatures: Vec<(f64, i64)>,
}

impl DiskView {
    fn of(d: &DriveHealth) -> Self {
        let newest = d.history.back().map_or(0.0, |r| r.t);
        let temperatures = d
            .history
            .iter()
            .filter(|r| newest - r.t <= TEMPERATURE_SPAN_SECS)
            .filter_map(|r| Some((r.t, r.health.temperature_c?)))
            .collect();
        Self {
            device: d.device.clone(),
            link: d.link.clone(),
            via: d.via.clone(),
            checked_at: d.checked_at,
            health: d.health.clone(),
            unavailable: d.unavailable.as_ref().map(Unavailable::to_string),
            warnings: d.warnings.clone(),
            temperatures,
        }
    }
}

/// Free and total bytes of the file system holding `path`.
#[cfg(unix)]
pub fn space(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    if rc != 0 {
        return None;
    }
    let block = s.f_frsize as u64;
    Some((s.f_bavail as u64 * block, s.f_blocks as u64 * block))
}

#[cfg(not(unix))]
pub fn space(_path: &Path) -> Option<(u64, u64)> {
    None
}

/// Bytes of the files directly in `dir`.
pub fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Every drive folder of every registered pack, with the models on each.
pub fn pack_folders(app: &AppState) -> BTreeMap<PathBuf, Vec<String>> {
    let mut folders: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    for m in app.queue.models().unwrap_or_default() {
        let ModelKind::Local { path } = &m.kind else {
            continue;
        };
        let Ok(manifest) = longhaul_engine::tools::Manifest::read(path) else {
            continue;
        };
        for dir in manifest.drives {
            folders.entry(dir).or_default().push(m.name.clone());
        }
    }
    folders
}

/// Every drive folder of every registered pack, with space and live figures.
pub fn drives(app: &AppState) -> Vec<DriveView> {
    let folders = pack_folders(app);
    let paths: Vec<PathBuf> = folders.keys().cloned().collect();
    let shared = crate::devices::shared(&paths);
    let ceilings = probed_ceilings(app);
    let live: HashMap<PathBuf, longhaul_engine::DriveMetrics> = app
        .latest_metrics()
        .and_then(|m| m.engine)
        .map(|e| e.drives.into_iter().map(|d| (d.path.clone(), d)).collect())
        .unwrap_or_default();
    let now = crate::queue::now_unix();
    folders
        .into_iter()
        .enumerate()
        .map(|(i, (dir, models))| {
            let present = dir.is_dir();
            let (errors, last_at) = app.runner.loaded.errors.get(&dir);
            let last_error_seconds_ago = last_at.map(|t| (now - t).max(0.0));
            let status = match (present, last_error_seconds_ago) {
                (false, _) => DriveStatus::Missing,
                (true, Some(ago)) if ago <= RECENT_ERROR_SECS => DriveStatus::Errors,
                _ => DriveStatus::Present,
            };
            let sp = space(&dir);
            let d = live.get(&dir);
            DriveView {
                status,
                present,
                free_bytes: sp.map(|s| s.0),
                total_bytes: sp.map(|s| s.1),
                model_bytes: folder_bytes(&dir),
                models,
                mb_per_s: d.map(|d| d.mb_per_s),
                ceiling_mb_per_s: ceilings.get(&dir).copied(),
                latency_p50_ms: d.and_then(|d| d.latency_p50_ms),
                latency_p90_ms: d.and_then(|d| d.latency_p90_ms),
                latency_p99_ms: d.and_then(|d| d.latency_p99_ms),
                errors,
                last_error_seconds_ago,
                same_device: shared
                    .iter()
                    .find(|g| g.contains(&i))
                    .map(|g| {
                        g.iter()
                            .filter(|&&j| j != i)
                            .map(|&j| paths[j].clone())
                            .collect()
                    })
                    .unwrap_or_default(),
                disk: app.health.with_folder(&dir, DiskView::of),
                path: dir,
            }
        })
        .collect()
}

/// Each drive folder's read rate at its pack's last probe.
fn probed_ceilings(app: &AppState) -> HashMap<PathBuf, f64> {
    let mut out = HashMap::new();
    for m in app.queue.models().unwrap_or_default() {
        let ModelKind::Local { path } = &m.kind else {
            continue;
        };
        if let Some(p) = longhaul_engine::tools::ProbeReport::load(path) {
            for d in p.drives {
                out.entry(d.path).or_insert(d.mb_per_s);
            }
        }
    }
    out
}

pub async fn list_drives(State(app): State<AppState>) -> ApiResult<Json<Value>> {
    let app2 = app.clone();
    let drives = tokio::task::spawn_blocking(move || drives(&app2))
        .await
        .unwrap_or_default();
    Ok(Json(json!({ "drives": drives })))
}

/// `POST /api/drives/health`: reads every disk's health now.
pub async fn refresh_health(State(app): State<AppState>) -> ApiResult<Json<Value>> {
    let app2 = app.clone();
    let drives = tokio::task::spawn_blocking(move || {
        let folders: Vec<PathBuf> = pack_folders(&app2).into_keys().collect();
        app2.health.refresh(&folders, crate::queue::now_unix());
        drives(&app2)
    })
    .await
    .unwrap_or_default();
    Ok(Json(json!({ "drives": drives })))
}

/// How often the health watch looks whether a reading is due.
const HEALTH_TICK: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads the disks' health on its slow clock, and at once when a pack on a
/// folder not yet read is registered.
pub async fn watch_health(app: AppState) {
    let mut tick = tokio::time::interval(HEALTH_TICK);
    loop {
        tick.tick().await;
        let app2 = app.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let folders: Vec<PathBuf> = pack_folders(&app2).into_keys().collect();
            let unseen = folders
                .iter()
                .any(|f| app2.health.with_folder(f, |_| ()).is_none());
            if !folders.is_empty() && (unseen || app2.health.due()) {
                app2.health.refresh(&folders, crate::queue::now_unix());
            }
        })
        .await;
    }
}

/// Every disk warning now, for the tray and the banner.
pub fn health_warnings(app: &AppState) -> Vec<Value> {
    // Read in place: the tray asks every second.
    app.health
        .each(|d| {
            let name = d.device.as_deref().unwrap_or_default();
            d.warnings
                .iter()
                .map(|w| {
                    json!({
                        "device": name,
                        "folders": d.folders,
                        "kind": w.kind,
                        "text": format!("{name} {}", w.text),
                    })
                })
                .collect::<Vec<_>>()
        })
        .into_iter()
        .flatten()
        .collect()
}
