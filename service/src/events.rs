//! Events the service publishes: job progress as it happens and engine
//! metrics once a second. The HTTP layer streams them as server-sent events.
//!
//! Delivery: a stream begins with a `resync` event, then carries every
//! event in order; a subscriber that falls more than [`EVENT_BACKLOG`]
//! events behind (it never blocks the runner) gets another `resync`, never
//! a silent gap. After a `resync` a client refetches what it shows. Each
//! event says what changed, once: a queue change is one event with the
//! waiting order (one event per waiting job made 201,266 events, 35.7 MB,
//! for 420 one-token jobs, and slow clients missed a fifth of the `done`s).

use serde::Serialize;
use tokio::sync::broadcast;

use crate::queue::{JobState, JobStats};

/// Events kept for a slow subscriber before it starts losing them.
pub const EVENT_BACKLOG: usize = 4096;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A job produced text or changed state.
    Job(Box<JobProgress>),
    /// The queue changed (a job was added, moved or ended): lists are stale.
    Queue(QueueOrder),
    /// The engine's counters, once a second while a model is loaded.
    Metrics(Box<MetricsEvent>),
}

#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct JobProgress {
    pub id: i64,
    pub state: JobState,
    /// Tokens of the answer so far.
    pub tokens: usize,
    pub max_tokens: usize,
    /// Byte offset in the job's output where `delta` begins. A watcher whose
    /// copy of the output is not `offset` bytes long missed or holds text
    /// that was not committed, and should re-read the job. Absent from
    /// events that only report a waiting job's place.
    pub offset: Option<usize>,
    /// Text made final since the previous event of this job.
    pub delta: String,
    /// Byte offset in the job's reasoning where `reasoning_delta` begins
    /// (absent where `offset` is).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub reasoning_offset: Option<usize>,
    /// Reasoning made final since the previous event (the model's thinking
    /// before its answer), kept apart from `delta`.
    #[serde(skip_serializing_if = "String::is_empty")]
    #[ts(optional = nullable)]
    pub reasoning_delta: String,
    /// Over the last few seconds of decoding.
    pub tokens_per_second: Option<f64>,
    /// To reach `max_tokens` at the current rate (an upper bound: the model may stop sooner).
    pub eta_seconds: Option<f64>,
    pub queue_position: Option<usize>,
    /// While the prompt is read (before the first token), how far.
    pub prompt: Option<PromptProgress>,
    /// The job's figures so far, while it runs.
    pub stats: Option<JobStats>,
}

/// How far a running job has read its prompt (and, resuming, the answer it
/// had: the model reads it again unless its state was saved).
#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct PromptProgress {
    pub done: usize,
    pub total: usize,
    /// Positions per second since reading began.
    pub per_second: Option<f64>,
    pub eta_seconds: Option<f64>,
}

/// The jobs waiting to run, in the order they will run (place 1 first).
#[derive(Debug, Clone, Serialize)]
pub struct QueueOrder {
    pub waiting: Vec<i64>,
}

#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct MetricsEvent {
    pub model: String,
    pub running_job: Option<i64>,
    pub tokens_per_second: Option<f64>,
    /// Drive and cache counters; absent for models held in RAM.
    pub engine: Option<longhaul_engine::MetricsSnapshot>,
    pub budget_bytes: u64,
    /// The prefix cache's counters, when the service keeps one.
    #[serde(default)]
    pub prefix: Option<longhaul_engine::PrefixStats>,
}

/// The service's event channel.
#[derive(Clone)]
pub struct Events {
    sender: broadcast::Sender<Event>,
}

impl Default for Events {
    fn default() -> Self {
        Self::with_backlog(EVENT_BACKLOG)
    }
}

impl Events {
    /// A channel keeping `backlog` events for each slow subscriber.
    pub fn with_backlog(backlog: usize) -> Self {
        Self {
            sender: broadcast::channel(backlog.max(1)).0,
        }
    }

    pub fn publish(&self, event: Event) {
        // No subscribers is fine: nobody is watching.
        let _ = self.sender.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender.subscribe()
    }

    /// How many are listening now (event streams open in UIs, waiting handlers).
    pub fn subscribers(&self) -> usize {
        self.sender.receiver_count()
    }
}
