//! The runner: one thread that takes jobs from the queue one at a time
//! (decoding is bound by the drives, so two jobs would only share them),
//! generates with the loaded model, and commits output as it goes.
//!
//! Output is committed every [`RunnerConfig::commit_tokens`] tokens or
//! [`RunnerConfig::commit_interval`], whichever comes first, and at every
//! state change, so a crash loses at most that much — and nothing a resumed
//! run will not produce again identically.

pub mod crash;
pub mod local;
pub mod rate;
pub mod remote;
pub mod state_file;
mod storage;

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use longhaul_engine::Flow;
use longhaul_engine::StreamingOptions;
use longhaul_engine::memory::MemorySettings;

use crate::events::{Event, Events, JobProgress, QueueOrder};
use crate::queue::{JobState, ModelKind, Queue, QueueError, Runnable};
use local::{LoadedModel, LocalBackend};
use rate::RollingRate;

/// Commit at least every this many tokens.
pub const COMMIT_TOKENS: usize = 16;
/// Commit at least this often while tokens arrive.
pub const COMMIT_INTERVAL: Duration = Duration::from_secs(2);
/// Progress events per job at most this often.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
/// How long the idle runner sleeps before looking at the queue again.
const IDLE_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub streaming: StreamingOptions,
    /// A memory limit each model's expert budget is planned against.
    pub memory: Option<MemorySettings>,
    pub commit_tokens: usize,
    pub commit_interval: Duration,
    /// Where answers' attention state is saved for fast resumes (none: a
    /// resumed job recomputes its answer token by token).
    pub state_dir: Option<PathBuf>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            streaming: StreamingOptions::default(),
            memory: None,
            commit_tokens: COMMIT_TOKENS,
            commit_interval: COMMIT_INTERVAL,
            state_dir: None,
        }
    }
}

/// Output a backend produced: token ids when the model runs here (kept for
/// resuming), or only a count when a remote server produced it.
#[derive(Debug, Clone, Copy)]
pub struct Produced<'a> {
    pub tokens: &'a [u32],
    pub count: usize,
    pub text: &'a str,
    /// The model's session and the prompt's length in it, when the model
    /// runs here.
    pub state: Option<(&'a longhaul_engine::Session<'a>, usize)>,
}

/// Where a backend sends its output; it returns whether to go on.
pub type Sink<'a> = dyn FnMut(Produced<'_>) -> Flow + 'a;

/// How a backend's run ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `eos`, `stop`, `length`, or `stopped` (asked to stop).
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub expert_bytes_read: u64,
    /// The same bytes, per drive folder.
    pub drive_bytes: Vec<crate::queue::DriveBytes>,
    /// Expert cache (hits, misses) during the run.
    pub lookups: (u64, u64),
    /// Tokens the run produced, as a remote server reported them (its
    /// stream chunks need not be one token each).
    pub reported_tokens: Option<usize>,
    /// Why a resume could not use the saved model state (it recomputed).
    pub state_refused: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Storage trouble (a drive missing or failing): the job pauses and can go on later.
    #[error("{0}")]
    Fault(String),
    #[error("{0}")]
    Failed(String),
}

#[derive(Debug, Default)]
struct ControlState {
    running: Option<i64>,
    stop_running: bool,
    queue_paused: bool,
    shutdown: bool,
    wake: bool,
    /// Why the data dir cannot be written, while that lasts.
    storage_fault: Option<String>,
}

/// How the rest of the service steers the runner.
#[derive(Default)]
pub struct Control {
    state: Mutex<ControlState>,
    changed: Condvar,
}

impl Control {
    fn with<T>(&self, f: impl FnOnce(&mut ControlState) -> T) -> T {
        let mut s = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let out = f(&mut s);
        self.changed.notify_all();
        out
    }

    /// Something was queued or changed: look again.
    pub fn wake(&self) {
        self.with(|s| s.wake = true);
    }

    /// Stops job `id` if it is the one running (after its state has been changed).
    pub fn stop_job(&self, id: i64) {
        self.with(|s| {
            if s.running == Some(id) {
                s.stop_running = true;
            }
        });
    }

    /// Holds the queue: the running job pauses and no other starts.
    pub fn set_queue_paused(&self, paused: bool) {
        self.with(|s| {
            s.queue_paused = paused;
            s.wake = true;
        });
    }

    pub fn queue_paused(&self) -> bool {
        self.with(|s| s.queue_paused)
    }

    pub fn running(&self) -> Option<i64> {
        self.with(|s| s.running)
    }

    /// Why the runner is waiting for the data dir to be writable again.
    pub fn storage_fault(&self) -> Option<String> {
        self.with(|s| s.storage_fault.clone())
    }

    fn set_storage_fault(&self, fault: Option<String>) {
        self.with(|s| s.storage_fault = fault);
    }

    /// Sleeps `d` unless the service stops first; false once stopping.
    fn sleep(&self, d: Duration) -> bool {
        let s = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let waited = self.changed.wait_timeout_while(s, d, |s| !s.shutdown);
        let s = match waited {
            Ok((s, _)) => s,
            Err(poisoned) => poisoned.into_inner().0,
        };
        !s.shutdown
    }

    pub fn shutdown(&self) {
        self.with(|s| {
            s.shutdown = true;
            s.stop_running = true;
        });
    }

    fn should_stop(&self) -> bool {
        self.with(|s| s.stop_running || s.shutdown)
    }

    /// Waits until there may be work; false once shutting down.
    fn wait_for_work(&self) -> bool {
        let mut s = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        loop {
            if s.shutdown {
                return false;
            }
            if !s.queue_paused && s.wake {
                s.wake = false;
                return true;
            }
            let (next, timeout) = match self.changed.wait_timeout(s, IDLE_POLL) {
                Ok(r) => r,
                Err(poisoned) => poisoned.into_inner(),
            };
            s = next;
            if timeout.timed_out() && !s.queue_paused {
                return !s.shutdown;
            }
        }
    }
}

/// What the runner shares with the HTTP layer.
pub struct Runner {
    pub queue: Arc<Queue>,
    pub events: Events,
    pub control: Arc<Control>,
    pub loaded: Arc<LoadedModel>,
    /// Rolling decode rate of the running job, for the metrics stream.
    pub rate: Arc<Mutex<Option<f64>>>,
    config: RunnerConfig,
}

impl Runner {
    pub fn new(queue: Arc<Queue>, events: Events, config: RunnerConfig) -> Self {
        Self {
            queue,
            events,
            control: Arc::new(Control::default()),
            loaded: Arc::new(LoadedModel::default()),
            rate: Arc::new(Mutex::new(None)),
            config,
        }
    }

    pub fn config(&self) -> &RunnerConfig {
        &self.config
    }

    /// Drops a job's saved attention state (it was cancelled while waiting
    /// or paused; a job that ends while running has its state dropped here).
    pub fn forget_state(&self, id: i64) {
        if self.control.running() != Some(id)
            && let Some(dir) = &self.config.state_dir
        {
            state_file::StateFile::for_job(dir, id).remove();
        }
    }

    /// Starts the runner thread.
    pub fn spawn(self: &Arc<Self>) -> std::io::Result<JoinHandle<()>> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("longhaul-runner".into())
            .spawn(move || me.run_loop())
    }

    fn run_loop(&self) {
        self.control.wake();
        while self.control.wait_for_work() {
            loop {
                if self.control.queue_paused() {
                    break;
                }
                let job = match self.queue.next_runnable() {
                    Ok(Some(job)) => job,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!("cannot read the queue: {e}");
                        break;
                    }
                };
                self.run_job(job);
                if self.control.with(|s| s.shutdown) {
                    return;
                }
            }
        }
    }

    /// Publishes that the queue changed, with the waiting order: one event,
    /// however many jobs wait.
    pub fn announce_queue(&self) {
        let waiting = self.queue.waiting().unwrap_or_default();
        self.events.publish(Event::Queue(QueueOrder { waiting }));
    }

    fn publish_progress(
        &self,
        job: &Runnable,
        state: JobState,
        tokens: usize,
        offset: usize,
        delta: String,
    ) {
        let rate = self.rate.lock().ok().and_then(|r| *r);
        let max = job.request.settings.max_tokens;
        self.events.publish(Event::Job(JobProgress {
            id: job.id,
            state,
            tokens,
            max_tokens: max,
            offset: Some(offset),
            delta,
            tokens_per_second: rate,
            eta_seconds: rate
                .filter(|r| *r > 0.0)
                .map(|r| max.saturating_sub(tokens) as f64 / r),
            queue_position: None,
        }));
    }

    fn run_job(&self, job: Runnable) {
        let id = job.id;
        if let Err(e) = self.queue.start(id) {
            tracing::warn!("job {id} could not start: {e}");
            if e.is_storage_fault() {
                self.wait_for_storage(&e);
            }
            return;
        }
        crash::set_running(Some(id));
        crate::faults::on_job_start(id);
        self.run_started_job(job);
        crash::set_running(None);
    }

    fn run_started_job(&self, mut job: Runnable) {
        let id = job.id;
        let remote = self
            .queue
            .model(&job.model)
            .is_ok_and(|m| matches!(m.kind, ModelKind::Remote { .. }));
        if remote && job.committed_count > 0 {
            if remote::can_continue(&job.request.input) {
                let _ = self.queue.log(
                    id,
                    &format!(
                        "continuing on the remote server from {} committed characters",
                        job.committed_text.chars().count()
                    ),
                );
            } else if self.queue.discard_output(id).is_ok() {
                let _ = self.queue.log(
                    id,
                    "restarted: the remote server cannot continue a chat answer from part of it",
                );
                job.committed_tokens.clear();
                job.committed_text.clear();
                job.committed_count = 0;
            }
        }
        self.control.with(|s| {
            s.running = Some(id);
            s.stop_running = false;
        });
        self.announce_queue();
        let mut shown = job.committed_text.len();
        self.publish_progress(
            &job,
            JobState::Running,
            job.committed_count,
            shown,
            String::new(),
        );

        let started = Instant::now();
        let mut first_token: Option<f64> = None;
        let mut pending_tokens: Vec<u32> = Vec::new();
        let mut pending_text = String::new();
        let mut unsent = String::new();
        let mut last_commit = Instant::now();
        let mut last_event = Instant::now();
        let mut total = job.committed_count;
        let mut new_tokens = 0usize;
        let mut rate = RollingRate::default();
        let mut lost_job = false;
        let mut storage_fault: Option<QueueError> = None;

        let mut pending_count = 0usize;
        let state_file = self
            .config
            .state_dir
            .as_deref()
            .map(|d| state_file::StateFile::for_job(d, id));
        let saved: Vec<(usize, Vec<u8>)> = state_file
            .as_ref()
            .map(|f| f.load(job.committed_count))
            .unwrap_or_default();
        let mut state_saved: usize = saved.iter().map(|(n, _)| n).sum();
        let saved: Vec<Vec<u8>> = saved.into_iter().map(|(_, rows)| rows).collect();
        if job.resumed {
            let _ = self.queue.log(
                id,
                &format!(
                    "resumed with {} committed tokens, attention state saved for {state_saved}",
                    job.committed_count
                ),
            );
        }
        let mut sink = |p: Produced<'_>| -> Flow {
            crate::faults::on_output();
            let (tokens, text) = (p.tokens, p.text);
            let now = Instant::now();
            if p.count > 0 {
                first_token.get_or_insert(started.elapsed().as_secs_f64());
                rate.tick(now);
                if let Ok(mut r) = self.rate.lock() {
                    *r = rate.per_second();
                }
            }
            total += p.count;
            new_tokens += p.count;
            pending_count += p.count;
            pending_tokens.extend_from_slice(tokens);
            pending_text.push_str(text);
            unsent.push_str(text);
            shown += text.len();
            if pending_count >= self.config.commit_tokens
                || now.duration_since(last_commit) >= self.config.commit_interval
            {
                // The attention rows first: they must be on disk no later
                // than the output they belong to.
                if let (Some(file), Some((session, prompt_len))) = (&state_file, p.state) {
                    let have = session.len().saturating_sub(prompt_len);
                    if have > state_saved {
                        match session.snapshot_since(prompt_len + state_saved) {
                            Ok(rows) => match file.append(state_saved, have - state_saved, &rows) {
                                Ok(()) => state_saved = have,
                                Err(e) => {
                                    tracing::warn!("job {id}: cannot save attention state: {e}")
                                }
                            },
                            Err(e) => tracing::warn!("job {id}: cannot read attention state: {e}"),
                        }
                    }
                }
                // The run so far, so a crash forgets no resume or wall time.
                let mut so_far = job.stats.clone().unwrap_or_default();
                so_far.resumes += u32::from(job.resumed);
                so_far.wall_seconds += started.elapsed().as_secs_f64();
                so_far.generated_tokens = total;
                if let Err(e) = self.queue.commit_with_stats(
                    id,
                    &pending_tokens,
                    pending_count,
                    &pending_text,
                    Some(&so_far),
                ) {
                    // Paused or cancelled meanwhile: what was not committed
                    // is produced again on resume.
                    if !matches!(e, QueueError::Illegal { .. }) {
                        tracing::error!("job {id}: cannot commit output: {e}");
                    }
                    if e.is_storage_fault() {
                        storage_fault = Some(e);
                    }
                    lost_job = true;
                    return Flow::Stop;
                }
                pending_tokens.clear();
                pending_text.clear();
                pending_count = 0;
                last_commit = now;
            }
            if now.duration_since(last_event) >= PROGRESS_INTERVAL {
                let offset = shown - unsent.len();
                self.publish_progress(
                    &job,
                    JobState::Running,
                    total,
                    offset,
                    std::mem::take(&mut unsent),
                );
                last_event = now;
            }
            if self.control.should_stop() {
                return Flow::Stop;
            }
            Flow::Continue
        };

        // A panic in a backend fails its job instead of ending the runner
        // thread, which would leave every later job waiting forever.
        let run = std::panic::AssertUnwindSafe(|| match self.queue.model(&job.model) {
            Err(e) => Err(RunError::Failed(e.to_string())),
            Ok(entry) => match &entry.kind {
                ModelKind::Local { path } => LocalBackend {
                    streaming: self.config.streaming.clone(),
                    memory: self.config.memory,
                    loaded: Arc::clone(&self.loaded),
                }
                .run(&PathBuf::from(path), &job, &saved, &mut sink),
                ModelKind::Remote {
                    url,
                    api_key,
                    remote_model,
                } => remote::RemoteBackend {
                    url,
                    api_key: api_key.as_deref(),
                    remote_model,
                }
                .run(&job, &mut sink),
            },
        });
        let result = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            Err(RunError::Failed(format!(
                "internal error ({what}); the job was stopped so the queue can go on"
            )))
        });
        if let Ok(mut r) = self.rate.lock() {
            *r = None;
        }
        let wall = started.elapsed().as_secs_f64();
        let mut stats = job.stats.clone().unwrap_or_default();
        stats.resumes += u32::from(job.resumed);
        stats.generated_tokens = total;
        stats.wall_seconds += wall;
        if stats.time_to_first_token_s.is_none() {
            stats.time_to_first_token_s = first_token;
        }
        let decode_seconds = first_token.map_or(0.0, |f| wall - f);
        if new_tokens > 1 && decode_seconds > 0.0 {
            stats.tokens_per_second = (new_tokens - 1) as f64 / decode_seconds;
        }
        if let Ok(o) = &result {
            stats.prompt_tokens = o.prompt_tokens - job.committed_tokens.len().min(o.prompt_tokens);
            stats.expert_bytes_read += o.expert_bytes_read;
            stats.add_drive_bytes(&o.drive_bytes);
            let (hits, misses) = o.lookups;
            if hits + misses > 0 {
                stats.cache_hit_rate = Some(hits as f64 / (hits + misses) as f64);
            }
            if let Some(reason) = &o.state_refused {
                let _ = self.queue.log(
                    id,
                    &format!(
                        "saved model state not used ({reason}); the answer so far was recomputed"
                    ),
                );
            }
        }

        let end_state = match (result, storage_fault) {
            (_, Some(fault)) => {
                self.pause_after_storage_fault(id, &fault);
                self.state_of(id)
            }
            (Ok(outcome), None) if outcome.finish_reason != "stopped" && !lost_job => {
                if let Some(reported) = outcome.reported_tokens {
                    // Trust the server's count over the chunks counted so far.
                    let committed = new_tokens - pending_count;
                    pending_count = reported.saturating_sub(committed);
                    stats.generated_tokens = job.committed_count + committed + pending_count;
                }
                match self.queue.finish(
                    id,
                    &pending_tokens,
                    pending_count,
                    &pending_text,
                    outcome.finish_reason,
                    &stats,
                ) {
                    Ok(()) => JobState::Done,
                    Err(e) if e.is_storage_fault() => {
                        self.pause_after_storage_fault(id, &e);
                        self.state_of(id)
                    }
                    Err(e) => {
                        tracing::warn!("job {id}: cannot finish: {e}");
                        self.state_of(id)
                    }
                }
            }
            (Ok(_), None) => {
                // Asked to stop: paused, cancelled, or the service is stopping.
                if self.state_of(id) == JobState::Running {
                    let _ = self
                        .queue
                        .commit(id, &pending_tokens, pending_count, &pending_text);
                }
                let _ = self.queue.save_stats(id, &stats);
                self.state_of(id)
            }
            (Err(RunError::Fault(reason)), None) => {
                // Reload on resume, so the drives are checked afresh.
                if let Ok(mut slot) = self.loaded.slot.lock() {
                    *slot = None;
                }
                let _ = self
                    .queue
                    .commit(id, &pending_tokens, pending_count, &pending_text);
                let _ = self.queue.save_stats(id, &stats);
                let _ = self.queue.log(id, &format!("paused: {reason}"));
                match self.queue.pause(id, &format!("storage fault: {reason}")) {
                    Err(e) if e.is_storage_fault() => self.pause_after_storage_fault(id, &e),
                    Err(e) => tracing::warn!("job {id}: cannot pause: {e}"),
                    Ok(_) => {}
                }
                self.state_of(id)
            }
            (Err(RunError::Failed(reason)), None) => {
                let _ = self
                    .queue
                    .commit(id, &pending_tokens, pending_count, &pending_text);
                match self.queue.fail(id, &reason, &stats) {
                    // Paused instead: a resume runs it again and records the failure.
                    Err(e) if e.is_storage_fault() => self.pause_after_storage_fault(id, &e),
                    Err(e) => tracing::warn!("job {id}: cannot record the failure: {e}"),
                    Ok(()) => {}
                }
                self.state_of(id)
            }
        };
        if end_state.is_final()
            && let Some(f) = &state_file
        {
            f.remove();
        }
        self.control.with(|s| {
            s.running = None;
            s.stop_running = false;
        });
        // The last event carries no text: `offset` is the committed output's
        // length, and a watcher that holds a different length re-reads the job.
        let committed = self.queue.committed(id).map_or(0, |(_, t)| t.len());
        self.publish_progress(&job, end_state, total, committed, String::new());
        self.announce_queue();
    }

    fn state_of(&self, id: i64) -> JobState {
        self.queue.job(id).map_or(JobState::Failed, |v| v.state)
    }
}
