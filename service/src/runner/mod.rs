//! The runner: one thread that takes jobs from the queue and runs each on a
//! thread of its own, generating with the loaded model and committing output
//! as it goes. Up to [`RunnerConfig::together`] jobs of the loaded model run
//! at once and decode together (their passes are shared, so each MoE layer
//! reads the union of their experts once; every answer is bitwise what it
//! would be alone); a job of another model, a remote one, or one that
//! crashed the service waits until it can run alone.
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
mod tally;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use longhaul_engine::StreamingOptions;
use longhaul_engine::memory::MemorySettings;
use longhaul_engine::{Flow, Phase};

use crate::events::{Event, Events, JobProgress, QueueOrder};
use crate::queue::{
    DriveBytes, JobState, ModelKind, Output, PauseCause, Queue, QueueError, Runnable,
};
use local::{LoadedModel, LocalBackend};
use tally::Tally;

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
    /// Prompt state kept for later prompts that begin the same way: turns
    /// of one conversation, jobs sharing a long preamble.
    pub prefix: Option<Arc<longhaul_engine::PrefixCache>>,
    /// Jobs of one model that may run at once, decoding together.
    pub together: usize,
}

/// Jobs that run at once by default: one. Measured on a Zipf-skewed
/// DeepSeek-V3-shaped pack streaming from 4 drives under 2 GiB, four jobs
/// together decoded 5.07 tok/s in all against 5.06 for one (the misses of
/// different prompts are in the experts the cache does not hold, and rarely
/// the same ones), while each answer took four times as long; they pay when
/// decoding is bound by compute rather than the drives (1.39x with every
/// expert cached) or the cache is small (1.19x at 256 MiB, 1.55x for eight).
pub const DEFAULT_TOGETHER: usize = 1;

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            streaming: StreamingOptions::default(),
            memory: None,
            commit_tokens: COMMIT_TOKENS,
            commit_interval: COMMIT_INTERVAL,
            state_dir: None,
            prefix: None,
            together: DEFAULT_TOGETHER,
        }
    }
}

/// Output a backend produced: token ids when the model runs here (kept for
/// resuming), or only a count when a remote server produced it.
#[derive(Clone, Copy)]
pub struct Produced<'a> {
    /// Reading the prompt (no output yet) or answering.
    pub phase: Phase,
    pub tokens: &'a [u32],
    pub count: usize,
    pub text: &'a str,
    /// Reasoning the model wrote (its thinking before the answer).
    pub reasoning: &'a str,
    /// The model's session and the prompt's length in it, when the model
    /// runs here.
    pub state: Option<(&'a longhaul_engine::Session<'a>, usize)>,
    /// What the run has read so far, when the model runs here.
    pub usage: Option<&'a dyn Fn() -> Usage>,
    /// What guessing ahead has done so far in the run, when the model runs here.
    pub speculation: Option<longhaul_engine::SpeculationStats>,
}

/// Text a progress event carries, with the byte offsets where it begins in
/// the job's answer and reasoning.
struct Delta {
    offset: usize,
    text: String,
    reasoning_offset: usize,
    reasoning: String,
}

impl Delta {
    /// No text, at these offsets.
    fn at(offset: usize, reasoning_offset: usize) -> Self {
        Self {
            offset,
            text: String::new(),
            reasoning_offset,
            reasoning: String::new(),
        }
    }
}

/// Expert reads and cache lookups of one run.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub expert_bytes_read: u64,
    /// The same bytes, per drive folder.
    pub drive_bytes: Vec<DriveBytes>,
    /// Expert cache (hits, misses).
    pub lookups: (u64, u64),
}

/// Where a backend sends its output; it returns whether to go on.
pub type Sink<'a> = dyn FnMut(Produced<'_>) -> Flow + 'a;

/// How a backend's run ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `eos`, `stop`, `length`, or `stopped` (asked to stop).
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub usage: Usage,
    /// Tokens the run produced, as a remote server reported them (its
    /// stream chunks need not be one token each).
    pub reported_tokens: Option<usize>,
    /// Why a resume could not use the saved model state (it recomputed).
    pub state_refused: Option<String>,
    /// What guessing ahead did, when the model runs here.
    pub speculation: Option<longhaul_engine::SpeculationStats>,
    /// Prompt tokens taken from the prefix cache, and the bytes of state.
    pub prefix_reused: (usize, u64),
    /// Why a cached prompt block was not used, when one was not.
    pub prefix_refused: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Storage trouble (a drive missing or failing): the job pauses and can go on later.
    #[error("{0}")]
    Fault(String),
    #[error("{0}")]
    Failed(String),
}

/// A running job, as the runner schedules around it.
#[derive(Debug, Clone)]
struct RunningJob {
    id: i64,
    model: String,
    /// It may decode together with others of its model.
    shares: bool,
}

#[derive(Debug, Default)]
struct ControlState {
    /// Running jobs, in the order they started.
    running: Vec<RunningJob>,
    /// Running jobs asked to stop.
    stop: HashSet<i64>,
    queue_paused: bool,
    shutdown: bool,
    wake: bool,
    /// Why the data dir cannot be written, while that lasts.
    storage_fault: Option<String>,
    /// Jobs that stopped running since [`Control::take_stopped`] was last
    /// asked (however briefly they ran: a drive fault can stop a job
    /// within its first second).
    stopped: Vec<i64>,
}

/// The most stopped jobs remembered for [`Control::take_stopped`] (a
/// reader that never comes does not make the list grow).
const STOPPED_KEPT: usize = 256;

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

    /// The jobs that stopped running since the last call, oldest first.
    pub fn take_stopped(&self) -> Vec<i64> {
        self.with(|s| std::mem::take(&mut s.stopped))
    }

    /// Something was queued or changed: look again.
    pub fn wake(&self) {
        self.with(|s| s.wake = true);
    }

    /// Stops job `id` if it is running (after its state has been changed).
    pub fn stop_job(&self, id: i64) {
        self.with(|s| {
            if s.running.iter().any(|r| r.id == id) {
                s.stop.insert(id);
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

    /// The job that has run longest of those running, if any.
    pub fn running(&self) -> Option<i64> {
        self.with(|s| s.running.first().map(|r| r.id))
    }

    /// Every running job, in the order they started.
    pub fn running_jobs(&self) -> Vec<i64> {
        self.with(|s| s.running.iter().map(|r| r.id).collect())
    }

    pub fn is_running(&self, id: i64) -> bool {
        self.with(|s| s.running.iter().any(|r| r.id == id))
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
        self.with(|s| s.shutdown = true);
    }

    fn should_stop(&self, id: i64) -> bool {
        self.with(|s| s.stop.contains(&id) || s.shutdown)
    }

    /// Waits up to `d` for something to change (a job ended, a wake);
    /// false once shutting down.
    fn wait_for_change(&self, d: Duration) -> bool {
        let s = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let s = match self.changed.wait_timeout(s, d) {
            Ok((s, _)) => s,
            Err(poisoned) => poisoned.into_inner().0,
        };
        !s.shutdown
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
    /// Rolling decode rate of each running job, for the metrics stream.
    rate: Mutex<HashMap<i64, f64>>,
    /// Each running job's latest progress (without text).
    live: Mutex<HashMap<i64, JobProgress>>,
    /// The running jobs' threads.
    threads: Mutex<Vec<JoinHandle<()>>>,
    config: RunnerConfig,
}

impl Runner {
    /// Where the job's draft model is, when it asks for one that is still
    /// registered here (one removed since guesses nothing: the answer is the
    /// same without it).
    fn draft_path(&self, job: &Runnable) -> Option<PathBuf> {
        let name = job.request.settings.draft_model.as_deref()?;
        match self.queue.model(name).map(|m| m.kind) {
            Ok(ModelKind::Local { path }) => Some(path),
            _ => {
                let _ = self.queue.log(job.id, &format!("the draft model `{name}` is no longer registered: guessing from earlier text instead"));
                None
            }
        }
    }

    /// RAM for each model's cached experts, as configured (a memory limit
    /// plans it per model when the model loads).
    pub fn expert_budget(&self) -> u64 {
        self.config.streaming.budget_bytes
    }

    pub fn new(queue: Arc<Queue>, events: Events, config: RunnerConfig) -> Self {
        Self {
            queue,
            events,
            control: Arc::new(Control::default()),
            loaded: Arc::new(LoadedModel::default()),
            rate: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            config,
        }
    }

    /// The running jobs' decode rates added up.
    pub fn tokens_per_second(&self) -> Option<f64> {
        let rates = self.rate.lock().ok()?;
        (!rates.is_empty()).then(|| rates.values().sum())
    }

    /// Job `id`'s latest progress while it runs.
    pub fn live(&self, id: i64) -> Option<JobProgress> {
        self.live.lock().ok().and_then(|l| l.get(&id).cloned())
    }

    pub fn config(&self) -> &RunnerConfig {
        &self.config
    }

    /// Drops a job's saved attention state (it was cancelled while waiting
    /// or paused; a job that ends while running has its state dropped here).
    pub fn forget_state(&self, id: i64) {
        if !self.control.is_running(id)
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

    fn run_loop(self: &Arc<Self>) {
        self.control.wake();
        'serve: while self.control.wait_for_work() {
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
                if !self.can_start(&job) {
                    // The next job waits for a running one to end.
                    if !self.control.wait_for_change(IDLE_POLL) {
                        break 'serve;
                    }
                    continue;
                }
                self.start_job(job);
                if self.control.with(|s| s.shutdown) {
                    break 'serve;
                }
            }
        }
        let threads = self.threads.lock().map(|mut t| std::mem::take(&mut *t));
        for t in threads.unwrap_or_default() {
            let _ = t.join();
        }
    }

    /// Whether `job` may start now: nothing runs, or it joins jobs of the
    /// same local model that share, below [`RunnerConfig::together`].
    fn can_start(&self, job: &Runnable) -> bool {
        let running = self.control.with(|s| s.running.clone());
        if running.is_empty() {
            return true;
        }
        running.len() < self.config.together
            && self.shares(job)
            && running.iter().all(|r| r.shares && r.model == job.model)
    }

    /// Whether `job` may decode together with others: a local model's, and
    /// not one that crashed the service (it runs alone until it ends).
    fn shares(&self, job: &Runnable) -> bool {
        job.crashes == 0
            && self
                .queue
                .model(&job.model)
                .is_ok_and(|m| matches!(m.kind, ModelKind::Local { .. }))
    }

    /// Publishes that the queue changed, with the waiting order: one event,
    /// however many jobs wait.
    pub fn announce_queue(&self) {
        let waiting = self.queue.waiting().unwrap_or_default();
        self.events.publish(Event::Queue(QueueOrder { waiting }));
    }

    /// Publishes where job `job` is; the running job's latest progress is
    /// also kept for views fetched between events.
    fn publish_progress(&self, job: &Runnable, state: JobState, tally: &Tally, delta: Delta) {
        let rate = tally.rate();
        let max = job.request.settings.max_tokens;
        let prompt = tally.prompt();
        let running = state == JobState::Running;
        let progress = JobProgress {
            id: job.id,
            state,
            tokens: tally.total,
            max_tokens: max,
            offset: Some(delta.offset),
            delta: delta.text,
            reasoning_offset: Some(delta.reasoning_offset),
            reasoning_delta: delta.reasoning,
            tokens_per_second: rate.filter(|_| prompt.is_none()),
            eta_seconds: rate
                .filter(|r| *r > 0.0 && prompt.is_none())
                .map(|r| max.saturating_sub(tally.total) as f64 / r),
            queue_position: None,
            prompt: prompt.filter(|_| running),
            stats: running.then(|| tally.stats(job)),
        };
        if let Ok(mut live) = self.live.lock() {
            match running {
                true => live.insert(
                    job.id,
                    JobProgress {
                        delta: String::new(),
                        reasoning_delta: String::new(),
                        ..progress.clone()
                    },
                ),
                false => live.remove(&job.id),
            };
        }
        self.events.publish(Event::Job(Box::new(progress)));
    }

    /// Marks `job` running and runs it on a thread of its own.
    fn start_job(self: &Arc<Self>, job: Runnable) {
        let id = job.id;
        if let Err(e) = self.queue.start(id) {
            tracing::warn!("job {id} could not start: {e}");
            if e.is_storage_fault() {
                self.wait_for_storage(&e);
            }
            return;
        }
        let shares = self.shares(&job);
        self.control.with(|s| {
            s.running.push(RunningJob {
                id,
                model: job.model.clone(),
                shares,
            });
            s.stop.remove(&id);
        });
        crash::started(id);
        crate::faults::on_job_start(id);
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("longhaul-job-{id}"))
            .spawn(move || me.run_started_job(job));
        match spawned {
            Ok(handle) => {
                if let Ok(mut t) = self.threads.lock() {
                    t.retain(|h| !h.is_finished());
                    t.push(handle);
                }
            }
            Err(e) => {
                tracing::error!("cannot start a thread for job {id}: {e}");
                self.control.with(|s| s.running.retain(|r| r.id != id));
                crash::ended(id);
                let _ = self.queue.pause(
                    id,
                    PauseCause::Queue,
                    "the runner could not start a thread for it",
                );
            }
        }
    }

    /// A remote server cannot continue a chat answer from part of it: such
    /// a job starts its answer again.
    fn prepare_remote(&self, job: &mut Runnable) {
        let id = job.id;
        let remote = self
            .queue
            .model(&job.model)
            .is_ok_and(|m| matches!(m.kind, ModelKind::Remote { .. }));
        if !remote || job.committed_count == 0 {
            return;
        }
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

    fn run_started_job(&self, mut job: Runnable) {
        let id = job.id;
        self.prepare_remote(&mut job);
        self.announce_queue();
        let mut tally = Tally::new(&job);
        let mut shown = job.committed_text.len();
        let mut shown_reasoning = job.committed_reasoning_len;
        self.publish_progress(
            &job,
            JobState::Running,
            &tally,
            Delta::at(shown, shown_reasoning),
        );

        let mut pending_tokens: Vec<u32> = Vec::new();
        let mut pending_text = String::new();
        let mut pending_reasoning = String::new();
        let mut pending_count = 0usize;
        let mut unsent = String::new();
        let mut unsent_reasoning = String::new();
        let mut last_commit = Instant::now();
        let mut last_event = Instant::now();
        let mut lost_job = false;
        let mut storage_fault: Option<QueueError> = None;

        let state_file = self
            .config
            .state_dir
            .as_deref()
            .map(|d| state_file::StateFile::for_job(d, id));
        let loaded = state_file
            .as_ref()
            .map(|f| f.load(job.committed_count))
            .unwrap_or_default();
        if let Some(why) = &loaded.refused {
            tracing::warn!("job {id}: {why}");
            let _ = self.queue.log(
                id,
                &format!("{why}; the answer's state from there is computed again"),
            );
        }
        let saved = loaded.records;
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
            let now = Instant::now();
            if let Some((_, prompt_len)) = p.state {
                tally.set_prompt_len(prompt_len);
            }
            let commit_due = pending_count >= self.config.commit_tokens
                || now.duration_since(last_commit) >= self.config.commit_interval;
            let event_due = now.duration_since(last_event) >= PROGRESS_INTERVAL;
            if let Some(usage) = p.usage.filter(|_| commit_due || event_due) {
                tally.set_usage(usage());
            }
            if let Some(s) = &p.speculation {
                tally.set_speculation(s);
            }
            if let Phase::Prompt { done, total } = p.phase {
                crate::faults::on_prompt_progress();
                tally.prompt_read(done, total, now);
                if event_due || done == total {
                    let at = Delta::at(shown, shown_reasoning);
                    self.publish_progress(&job, JobState::Running, &tally, at);
                    last_event = now;
                }
                return if self.control.should_stop(id) {
                    Flow::Stop
                } else {
                    Flow::Continue
                };
            }
            // The first token ends the prompt phase: say so at once.
            let first = p.count > 0 && tally.first_token.is_none();
            tally.add_tokens(p.count, now);
            if let (Ok(mut r), Some(rate)) = (self.rate.lock(), tally.rate()) {
                r.insert(id, rate);
            }
            pending_count += p.count;
            pending_tokens.extend_from_slice(p.tokens);
            pending_text.push_str(p.text);
            unsent.push_str(p.text);
            shown += p.text.len();
            pending_reasoning.push_str(p.reasoning);
            unsent_reasoning.push_str(p.reasoning);
            shown_reasoning += p.reasoning.len();
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
                let so_far = tally.stats(&job);
                let output = Output {
                    tokens: &pending_tokens,
                    count: pending_count,
                    text: &pending_text,
                    reasoning: &pending_reasoning,
                };
                if let Err(e) = self.queue.commit_with_stats(id, &output, Some(&so_far)) {
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
                pending_reasoning.clear();
                pending_count = 0;
                last_commit = now;
            }
            if event_due || first {
                let delta = Delta {
                    offset: shown - unsent.len(),
                    text: std::mem::take(&mut unsent),
                    reasoning_offset: shown_reasoning - unsent_reasoning.len(),
                    reasoning: std::mem::take(&mut unsent_reasoning),
                };
                self.publish_progress(&job, JobState::Running, &tally, delta);
                last_event = now;
            }
            if self.control.should_stop(id) {
                return Flow::Stop;
            }
            Flow::Continue
        };

        let result = self.run_backend(&job, &saved, &mut sink);
        if let Ok(mut r) = self.rate.lock() {
            r.remove(&id);
        }
        if let Ok(o) = &result {
            // Only a remote run has not said: its server counts the
            // committed text it was asked to continue as prompt.
            tally.default_prompt_len(o.prompt_tokens.saturating_sub(job.committed_count));
            tally.set_usage(o.usage.clone());
            if let Some(s) = &o.speculation {
                tally.set_speculation(s);
            }
            if let Some(s) = o.speculation.as_ref().filter(|s| s.verify_passes > 0) {
                let _ = self.queue.log(
                    id,
                    &format!(
                        "speculation: {} of {} guessed tokens kept in {} verify passes; {} plain steps",
                        s.accepted, s.drafted, s.verify_passes, s.plain_steps
                    ),
                );
            }
            tally.set_prefix(o.prefix_reused);
            if o.prefix_reused.0 > 0 {
                let _ = self.queue.log(
                    id,
                    &format!(
                        "prompt: {} of {} tokens from the prefix cache ({:.1} MB of saved state)",
                        o.prefix_reused.0,
                        o.prompt_tokens,
                        o.prefix_reused.1 as f64 / 1e6
                    ),
                );
            }
            if let Some(reason) = &o.prefix_refused {
                let _ = self
                    .queue
                    .log(id, &format!("prefix cache: {reason}; recomputed"));
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
        let mut stats = tally.stats(&job);
        let pending_output = Output {
            tokens: &pending_tokens,
            count: pending_count,
            text: &pending_text,
            reasoning: &pending_reasoning,
        };

        let end_state = match (result, storage_fault) {
            (_, Some(fault)) => {
                self.pause_after_storage_fault(id, &fault);
                self.state_of(id)
            }
            (Ok(outcome), None) if outcome.finish_reason != "stopped" && !lost_job => {
                if let Some(reported) = outcome.reported_tokens {
                    // Trust the server's count over the chunks counted so far.
                    let committed = tally.new_tokens - pending_count;
                    pending_count = reported.saturating_sub(committed);
                    stats.generated_tokens = job.committed_count + committed + pending_count;
                }
                let output = Output {
                    count: pending_count,
                    ..pending_output
                };
                match self
                    .queue
                    .finish(id, &output, outcome.finish_reason, &stats)
                {
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
                    let _ = self.queue.commit(id, &pending_output);
                }
                let _ = self.queue.save_stats(id, &stats);
                self.state_of(id)
            }
            (Err(RunError::Fault(reason)), None) => {
                // Reload on resume, so the drives are checked afresh.
                self.loaded.replace(None);
                let _ = self.queue.commit(id, &pending_output);
                let _ = self.queue.save_stats(id, &stats);
                let _ = self.queue.log(id, &format!("paused: {reason}"));
                match self.queue.pause(
                    id,
                    PauseCause::ReadFault,
                    &format!("storage fault: {reason}"),
                ) {
                    Err(e) if e.is_storage_fault() => self.pause_after_storage_fault(id, &e),
                    Err(e) => tracing::warn!("job {id}: cannot pause: {e}"),
                    Ok(_) => {}
                }
                self.state_of(id)
            }
            (Err(RunError::Failed(reason)), None) => {
                let _ = self.queue.commit(id, &pending_output);
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
            s.running.retain(|r| r.id != id);
            s.stop.remove(&id);
            if s.stopped.len() < STOPPED_KEPT {
                s.stopped.push(id);
            }
        });
        crash::ended(id);
        // The last event carries no text and the committed output: `offset`
        // is its length (a watcher holding another length re-reads the
        // job), and `tokens` what was kept, not what a pause threw away.
        let (committed_tokens, committed_len) = self.queue.job(id).map_or((tally.total, 0), |v| {
            (v.tokens, v.output.map_or(0, |t| t.len()))
        });
        tally.total = committed_tokens;
        let reasoning_len = self
            .queue
            .committed_parts(id)
            .map_or(0, |c| c.reasoning.len());
        self.publish_progress(
            &job,
            end_state,
            &tally,
            Delta::at(committed_len, reasoning_len),
        );
        self.announce_queue();
    }

    /// Runs the job on its backend; a panic there fails the job instead of
    /// ending the runner thread, which would leave every later job waiting.
    fn run_backend(
        &self,
        job: &Runnable,
        saved: &[Vec<u8>],
        sink: &mut Sink<'_>,
    ) -> Result<Outcome, RunError> {
        let run = std::panic::AssertUnwindSafe(|| match self.queue.model(&job.model) {
            Err(e) => Err(RunError::Failed(e.to_string())),
            Ok(entry) => match &entry.kind {
                ModelKind::Local { path } => LocalBackend {
                    draft: self.draft_path(job),
                    streaming: self.config.streaming.clone(),
                    // Room in the plan for the attention state of every job together.
                    memory: self.config.memory.map(|m| MemorySettings {
                        context_tokens: m.context_tokens * self.config.together.max(1) as u64,
                        ..m
                    }),
                    prefix: self.config.prefix.clone(),
                    loaded: Arc::clone(&self.loaded),
                }
                .run(&PathBuf::from(path), job, saved, sink),
                ModelKind::Remote {
                    url,
                    api_key,
                    remote_model,
                } => remote::RemoteBackend {
                    url,
                    api_key: api_key.as_deref(),
                    remote_model,
                    stop: &|| self.control.should_stop(job.id),
                }
                .run(job, sink),
            },
        });
        std::panic::catch_unwind(run).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            Err(RunError::Failed(format!(
                "internal error ({what}); the job was stopped so the queue can go on"
            )))
        })
    }

    fn state_of(&self, id: i64) -> JobState {
        self.queue.job(id).map_or(JobState::Failed, |v| v.state)
    }
}
