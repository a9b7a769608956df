//! Packing checkpoints from the UI: `longhaul pack` run in the background,
//! with its progress (bytes, MB/s, ETA) for the Models view, and the pack
//! registered as a model when it is finished.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use longhaul_engine::tools::Quantization;
use longhaul_engine::tools::{PackOptions, PackPhase, PackProgress, write_pack};
use serde::Serialize;

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

impl Packer {
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

    /// Starts packing `req` into `out` on a thread; the pack is registered
    /// as model `req.name` when done.
    pub fn start(self: &Arc<Self>, req: PackRequest, out: PathBuf, queue: Arc<Queue>) -> PackTask {
        let task = {
            let mut tasks = match self.tasks.lock() {
                Ok(t) => t,
                Err(p) => p.into_inner(),
            };
            let task = PackTask {
                id: tasks.len() as u64 + 1,
                name: req.name.clone(),
                source: req.source.clone(),
                out: out.clone(),
                drives: req.drives.clone(),
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
        };
        let me = Arc::clone(self);
        let id = task.id;
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut opts = PackOptions::new(req.source.clone(), out.clone(), req.drives.clone());
            opts.quantization = req.quantization;
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
            let result = write_pack(&opts, &report)
                .map_err(|e| e.to_string())
                .and_then(|_| {
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
