//! Packing checkpoints from the UI: `longhaul pack` run in the background,
//! with its progress (bytes, MB/s, ETA) for the Models view, and the pack
//! registered as a model when it is finished.
//!
//! A pack holds its name from the start: its folder is created before it
//! begins (so of two packs of one name only one starts) and a marker beside
//! it (`packs/.NAME.packing`) says what it writes where. A pack that fails
//! removes what it wrote; one the service did not live to finish is removed
//! at the next start, listed as failed, and its name is free again. Once a
//! killed pack vanished from the list, its empty folder blocked the name,
//! and its partial files stayed on the drives.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use longhaul_engine::tools::Quantization;
use longhaul_engine::tools::{
    PackOptions, PackPhase, PackProgress, discard_unfinished, write_pack,
};
use serde::{Deserialize, Serialize};

use crate::queue::{ModelEntry, ModelKind, Queue};

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum PackState {
    Running,
    Done,
    Failed,
}

/// One packing, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PackTask {
    pub id: u64,
    pub name: String,
    pub source: PathBuf,
    pub out: PathBuf,
    pub drives: Vec<PathBuf>,
    pub state: PackState,
    /// `hashing source`, `writing experts`, `writing resident`.
    pub phase: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub mb_per_s: Option<f64>,
    pub eta_seconds: Option<f64>,
    pub error: Option<String>,
}

/// What to pack.
#[derive(Debug, Clone)]
pub struct PackRequest {
    pub name: String,
    pub source: PathBuf,
    pub drives: Vec<PathBuf>,
    pub quantization: Option<Quantization>,
}

#[derive(Default)]
pub struct Packer {
    tasks: Mutex<Vec<PackTask>>,
}

/// What a pack in progress writes where, kept beside its folder.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    name: String,
    source: PathBuf,
    out: PathBuf,
    drives: Vec<PathBuf>,
}

/// The marker of the pack writing into `out`.
fn marker_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    out.with_file_name(format!(".{name}.packing"))
}

/// Removes what the unfinished pack into `out` wrote, and its marker; what
/// it removed, in words.
fn discard(out: &Path, drives: &[PathBuf]) -> String {
    let said = match discard_unfinished(out, drives) {
        Ok(gone) => format!(
            "its {} partial files ({} bytes) were removed",
            gone.files, gone.bytes
        ),
        Err(e) => format!("its partial files could not all be removed: {e}"),
    };
    let _ = std::fs::remove_file(marker_path(out));
    said
}

/// Why reserving a pack's name failed.
#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    #[error("{0} already exists; choose another name")]
    Taken(PathBuf),
    #[error("cannot create {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Packer {
    /// The packer of a service starting on `packs`: packs the last run did
    /// not finish are removed and listed as failed.
    pub fn recover(packs: &Path) -> Self {
        let packer = Self::default();
        let Ok(entries) = std::fs::read_dir(packs) else {
            return packer;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_marker = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.') && n.ends_with(".packing"));
            if !is_marker {
                continue;
            }
            let Some(marker) = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Marker>(&b).ok())
            else {
                let _ = std::fs::remove_file(&path);
                continue;
            };
            let said = discard(&marker.out, &marker.drives);
            tracing::warn!("pack {} was interrupted by a restart; {said}", marker.name);
            let mut task = packer.add(&marker.name, &marker.source, &marker.out, &marker.drives);
            task.state = PackState::Failed;
            task.phase = "interrupted".into();
            task.error = Some(format!(
                "interrupted by a restart of the service; {said}; start it again"
            ));
            packer.update(task.id, |t| *t = task.clone());
        }
        packer
    }

    /// Reserves `out` for the pack named `name`: its folder, created here
    /// (so a second pack of the name is refused), and its marker.
    pub fn reserve(
        name: &str,
        source: &Path,
        out: &Path,
        drives: &[PathBuf],
    ) -> Result<(), ReserveError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReserveError::Io { path, source }
        };
        if let Some(parent) = out.parent() {
            longhaul_engine::private::create_dir_all(parent).map_err(io(parent))?;
        }
        match longhaul_engine::private::create_dir(out) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(ReserveError::Taken(out.to_path_buf()));
            }
            other => other.map_err(io(out))?,
        }
        let marker = Marker {
            name: name.to_string(),
            source: source.to_path_buf(),
            out: out.to_path_buf(),
            drives: drives.to_vec(),
        };
        let text = serde_json::to_vec(&marker).unwrap_or_default();
        let path = marker_path(out);
        longhaul_engine::private::write(&path, &text).map_err(|source| {
            let _ = std::fs::remove_dir(out);
            ReserveError::Io { path, source }
        })
    }

    fn add(&self, name: &str, source: &Path, out: &Path, drives: &[PathBuf]) -> PackTask {
        let mut tasks = match self.tasks.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        let task = PackTask {
            id: tasks.len() as u64 + 1,
            name: name.to_string(),
            source: source.to_path_buf(),
            out: out.to_path_buf(),
            drives: drives.to_vec(),
            state: PackState::Running,
            phase: "starting".into(),
            done_bytes: 0,
            total_bytes: 0,
            mb_per_s: None,
            eta_seconds: None,
            error: None,
        };
        tasks.push(task.clone());
        task
    }

    pub fn list(&self) -> Vec<PackTask> {
        self.tasks.lock().map(|t| t.clone()).unwrap_or_default()
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut PackTask)) {
        if let Ok(mut tasks) = self.tasks.lock()
            && let Some(t) = tasks.iter_mut().find(|t| t.id == id)
        {
            f(t);
        }
    }

    /// Starts packing `req` into `out` (reserved by [`Self::reserve`]) on a
    /// thread; the pack is registered as model `req.name` when done.
    pub fn start(self: &Arc<Self>, req: PackRequest, out: PathBuf, queue: Arc<Queue>) -> PackTask {
        let task = self.add(&req.name, &req.source, &out, &req.drives);
        let me = Arc::clone(self);
        let id = task.id;
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut opts = PackOptions::new(req.source.clone(), out.clone(), req.drives.clone());
            opts.quantization = req.quantization;
            opts.fail_writes_after = crate::faults::pack_room();
            // Rates and ETAs are per phase: each phase counts its own bytes.
            let phase_start = std::cell::Cell::new((PackPhase::HashingSource, started));
            let report = |p: PackProgress| {
                crate::faults::on_pack_progress();
                if phase_start.get().0 != p.phase {
                    phase_start.set((p.phase, Instant::now()));
                }
                let seconds = phase_start.get().1.elapsed().as_secs_f64();
                me.update(id, |t| {
                    t.phase = match p.phase {
                        PackPhase::HashingSource => "hashing source",
                        PackPhase::WritingExperts => "writing experts",
                        PackPhase::WritingResident => "writing resident weights",
                    }
                    .into();
                    t.done_bytes = p.done_bytes;
                    t.total_bytes = p.total_bytes;
                    let rate = p.done_bytes as f64 / seconds.max(1e-6);
                    t.mb_per_s = Some(rate / 1e6);
                    t.eta_seconds = (rate > 0.0)
                        .then(|| p.total_bytes.saturating_sub(p.done_bytes) as f64 / rate);
                });
            };
            let packed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                write_pack(&opts, &report).map_err(|e| e.to_string())
            }))
            .unwrap_or_else(|_| Err("the packer stopped on an internal error".into()));
            let result = packed
                .map_err(|e| format!("{e}; {}", discard(&out, &req.drives)))
                .and_then(|_| {
                    let _ = std::fs::remove_file(marker_path(&out));
                    queue
                        .add_model(&ModelEntry {
                            name: req.name.clone(),
                            kind: ModelKind::Local { path: out.clone() },
                            created_ms: 0,
                        })
                        .map_err(|e| format!("packed, but cannot register it: {e}"))
                });
            me.update(id, |t| match result {
                Ok(()) => {
                    t.state = PackState::Done;
                    t.phase = "done".into();
                    t.eta_seconds = Some(0.0);
                }
                Err(e) => {
                    t.state = PackState::Failed;
                    t.error = Some(e);
                }
            });
        });
        task
    }
}
