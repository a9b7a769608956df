//! What a job is: its request, its settings, its states and the transitions
//! between them. The state machine is a pure function, so the queue and the
//! tests agree on it by construction.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Paused,
    /// Was running when the service stopped; continues from its committed output.
    Interrupted,
    Done,
    Failed,
    Cancelled,
}

/// Everything that moves a job from one state to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    Start,
    Finish,
    Fail,
    Cancel,
    Pause,
    Resume,
    Interrupt,
}

pub const ALL_STATES: [JobState; 7] = [
    JobState::Queued,
    JobState::Running,
    JobState::Paused,
    JobState::Interrupted,
    JobState::Done,
    JobState::Failed,
    JobState::Cancelled,
];

pub const ALL_TRANSITIONS: [Transition; 7] = [
    Transition::Start,
    Transition::Finish,
    Transition::Fail,
    Transition::Cancel,
    Transition::Pause,
    Transition::Resume,
    Transition::Interrupt,
];

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Paused => "paused",
            JobState::Interrupted => "interrupted",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        ALL_STATES.into_iter().find(|st| st.as_str() == s)
    }

    /// Done, failed or cancelled: nothing more will happen to it.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Done | JobState::Failed | JobState::Cancelled
        )
    }

    /// The state `t` leads to, or `None` if `t` is not allowed from here.
    pub fn after(self, t: Transition) -> Option<JobState> {
        use JobState as S;
        use Transition as T;
        match (self, t) {
            (S::Queued | S::Interrupted, T::Start) => Some(S::Running),
            (S::Running, T::Finish) => Some(S::Done),
            (S::Running, T::Fail) => Some(S::Failed),
            (S::Queued | S::Running | S::Paused | S::Interrupted, T::Cancel) => Some(S::Cancelled),
            (S::Queued | S::Running | S::Interrupted, T::Pause) => Some(S::Paused),
            (S::Paused, T::Resume) => Some(S::Queued),
            (S::Running, T::Interrupt) => Some(S::Interrupted),
            _ => None,
        }
    }
}

impl Transition {
    pub fn as_str(self) -> &'static str {
        match self {
            Transition::Start => "start",
            Transition::Finish => "finish",
            Transition::Fail => "fail",
            Transition::Cancel => "cancel",
            Transition::Pause => "pause",
            Transition::Resume => "resume",
            Transition::Interrupt => "interrupt",
        }
    }
}

/// Why a job is paused: who or what holds it. The reason beside it says
/// the same to people; code decides on the cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum PauseCause {
    /// Someone asked (the API, the UI, the CLI).
    User,
    /// The queue was held while the job ran.
    Queue,
    /// A drive folder of its model is not there.
    DriveMissing,
    /// Reading its model (a drive, a remote server) failed.
    ReadFault,
    /// The data dir could not be written.
    Storage,
}

impl PauseCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Queue => "queue",
            Self::DriveMissing => "drive_missing",
            Self::ReadFault => "read_fault",
            Self::Storage => "storage",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::User,
            Self::Queue,
            Self::DriveMissing,
            Self::ReadFault,
            Self::Storage,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    /// Whether a fault holds the job rather than a person's choice.
    pub fn is_fault(self) -> bool {
        !matches!(self, Self::User | Self::Queue)
    }
}

/// One message of a conversation: its role, its text (a null reads as
/// empty) and the other fields its sender wrote (`tool_calls`,
/// `tool_call_id`, `name`, `reasoning_content`), as templates read them.
pub type Message = longhaul_engine::ChatMessage;

/// How to generate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub seed: u64,
    pub stop: Vec<String>,
    /// Where the sampling settings the request left out came from, when
    /// the model's `generation_config.json` gave them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_from: Option<String>,
    /// Guessing ahead: `auto` (prompt lookup, while it pays), `lookup` or
    /// `off`. The answer is the same either way.
    #[serde(default)]
    pub speculate: Speculate,
    /// A registered local model that guesses ahead for this one (a small
    /// model of the same family); prompt lookup when absent. The answer is
    /// the same either way: every guess is verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// transformers' `repetition_penalty`: 1 is off.
    #[serde(default = "no_repetition_penalty")]
    pub repetition_penalty: f32,
    /// OpenAI's `frequency_penalty`: 0 is off.
    #[serde(default)]
    pub frequency_penalty: f32,
    /// OpenAI's `presence_penalty`: 0 is off.
    #[serde(default)]
    pub presence_penalty: f32,
}

fn no_repetition_penalty() -> f32 {
    1.0
}

/// How a job guesses ahead (see the engine's speculative decoding).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "lowercase")]
pub enum Speculate {
    #[default]
    Auto,
    Lookup,
    Off,
}

/// Tokens generated when a request does not say.
pub const DEFAULT_MAX_TOKENS: usize = 1024;

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_tokens: DEFAULT_MAX_TOKENS,
            temperature: 0.0,
            top_p: 1.0,
            top_k: None,
            seed: 0,
            stop: Vec::new(),
            sampling_from: None,
            speculate: Speculate::Auto,
            draft_model: None,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
        }
    }
}

/// What the model is asked: plain text, or a conversation for the chat template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    Prompt(String),
    Messages(Vec<Message>),
}

/// A job as stored: fixed at submission, so a resumed job sees exactly what
/// it started with even if attached files have changed since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct Request {
    pub input: Input,
    /// Attached files rendered as text, placed before the prompt.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub attachments: String,
    pub settings: Settings,
    /// Switches for the chat template or prompt encoder
    /// (`chat_template_kwargs`: `enable_thinking`, `thinking`, …).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub chat_args: serde_json::Map<String, serde_json::Value>,
    /// When the job was submitted (seconds since the epoch): the instant a
    /// template's `strftime_now` formats, so a resumed job reads the prompt
    /// it started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered_at: Option<i64>,
    /// Tools offered to the model (OpenAI's function tools), rendered by
    /// its template as `tools`; its answer is read for calls to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<serde_json::Value>,
    /// A call the answer must make (`tool_choice` forcing one): decoding
    /// is held to the family's opening of a call to one of the tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_call: Option<ForcedCall>,
    /// The format the model wrote tool calls in when the job was admitted
    /// (with tools offered): its answer is read in it, whatever the
    /// model's files say later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_format: Option<longhaul_engine::ToolFormat>,
}

/// Which call a request forces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ForcedCall {
    /// A call to any of the tools offered (`required`, Anthropic's `any`).
    Any,
    /// A call to this one.
    Function { name: String },
}

impl Request {
    /// The names a forced call may take, none when no call is forced.
    pub fn forced_names(&self) -> Option<Vec<&str>> {
        Some(match self.forced_call.as_ref()? {
            ForcedCall::Function { name } => vec![name.as_str()],
            ForcedCall::Any => self.tools.iter().filter_map(tool_name).collect(),
        })
    }
}

/// A tool's name, in OpenAI's nested shape or the flat one.
pub fn tool_name(tool: &serde_json::Value) -> Option<&str> {
    tool.get("function")
        .unwrap_or(tool)
        .get("name")
        .and_then(serde_json::Value::as_str)
}

/// What the model reads, assembled from a request.
pub enum PromptInput {
    /// Plain text, attachments first.
    Plain(String),
    /// A conversation for the chat template, with its switches and instant.
    Chat(
        Vec<longhaul_engine::ChatMessage>,
        longhaul_engine::ChatOptions,
    ),
}

impl Request {
    /// The prompt as the model reads it: attachments before a plain prompt
    /// or the first user message, and the template's switches and instant.
    pub fn prompt_input(&self) -> PromptInput {
        let messages = match &self.input {
            Input::Prompt(p) => return PromptInput::Plain(format!("{}{p}", self.attachments)),
            Input::Messages(m) => m,
        };
        let mut chat: Vec<longhaul_engine::ChatMessage> = messages.clone();
        if let Some(first) = chat.iter_mut().find(|m| m.role == "user") {
            first.content = format!("{}{}", self.attachments, first.content);
        }
        let mut args = self.chat_args.clone();
        if !self.tools.is_empty() {
            args.insert("tools".into(), serde_json::Value::from(self.tools.clone()));
        }
        let options = longhaul_engine::ChatOptions {
            add_generation_prompt: true,
            args,
            now: self.rendered_at,
        };
        PromptInput::Chat(chat, options)
    }
}

/// Seconds since the epoch, now.
/// Seconds since the Unix epoch, with their fraction (for figures over time).
pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A job to add to the queue.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub title: String,
    pub model: String,
    pub request: Request,
    /// The prompt's token ids as admitted, when the model's tokenizer was
    /// at hand; the runner renders the request itself otherwise.
    pub prompt_ids: Option<Vec<u32>>,
    pub priority: i64,
    /// Who asked: `api`, `openai`, `cli`.
    pub origin: String,
}

/// Output to append to a job: token ids when the model runs here (kept for
/// resuming) or only their count, the answer's text and the reasoning's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Output<'a> {
    pub tokens: &'a [u32],
    pub count: usize,
    pub text: &'a str,
    pub reasoning: &'a str,
}

impl<'a> Output<'a> {
    /// Text only, as a count of tokens.
    pub fn text(tokens: &'a [u32], count: usize, text: &'a str) -> Self {
        Self {
            tokens,
            count,
            text,
            reasoning: "",
        }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.text.is_empty() && self.reasoning.is_empty()
    }
}

/// Per-job figures, recorded when the job stops.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct JobStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub time_to_first_token_s: Option<f64>,
    pub tokens_per_second: f64,
    pub wall_seconds: f64,
    pub expert_bytes_read: u64,
    /// The expert bytes read from each drive folder, in the pack's drive order.
    #[serde(default)]
    pub drive_bytes_read: Vec<DriveBytes>,
    pub cache_hit_rate: Option<f64>,
    /// Times the job was resumed after an interruption or a pause.
    pub resumes: u32,
    /// What guessing ahead did over the job's runs.
    #[serde(default)]
    pub speculation: SpeculationTally,
    /// Prompt tokens the latest run took from the prefix cache rather than
    /// computing them, and the bytes of saved state they came from.
    #[serde(default)]
    pub prefix_tokens: usize,
    #[serde(default)]
    pub prefix_bytes: u64,
}

/// Guesses verified and kept over a job's runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[ts(rename = "Speculation")]
pub struct SpeculationTally {
    pub verify_passes: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Forward passes of one token (nothing guessed, or guessing paused).
    #[serde(default)]
    pub plain_steps: usize,
}

/// Bytes a job read from one drive folder.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct DriveBytes {
    pub path: std::path::PathBuf,
    pub bytes: u64,
}

impl JobStats {
    /// Adds one run's reads per drive to the job's totals.
    pub fn add_drive_bytes(&mut self, reads: &[DriveBytes]) {
        for r in reads {
            match self.drive_bytes_read.iter_mut().find(|d| d.path == r.path) {
                Some(d) => d.bytes += r.bytes,
                None => self.drive_bytes_read.push(r.clone()),
            }
        }
    }
}

/// A job as the API shows it.
#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct JobView {
    pub id: i64,
    pub title: String,
    pub model: String,
    pub state: JobState,
    pub priority: i64,
    /// Place among the jobs waiting to run (1 is next), when waiting.
    pub queue_position: Option<usize>,
    pub origin: String,
    pub request: Request,
    /// Output so far (omitted from lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub output: Option<String>,
    /// The model's reasoning so far, apart from the answer (omitted from
    /// lists and where the model did not think aloud).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub reasoning: Option<String>,
    pub tokens: usize,
    pub stats: Option<JobStats>,
    pub error: Option<String>,
    pub pause_reason: Option<String>,
    /// What holds a paused job (see [`PauseCause`]).
    pub pause_cause: Option<PauseCause>,
    pub finish_reason: Option<String>,
    pub log: String,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    pub updated_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_states_allow_nothing() {
        for s in ALL_STATES.into_iter().filter(|s| s.is_final()) {
            for t in ALL_TRANSITIONS {
                assert_eq!(s.after(t), None, "{s:?} --{t:?}");
            }
        }
    }

    #[test]
    fn every_state_is_reachable_from_queued() {
        let mut seen = vec![JobState::Queued];
        let mut i = 0;
        while i < seen.len() {
            for t in ALL_TRANSITIONS {
                if let Some(n) = seen[i].after(t)
                    && !seen.contains(&n)
                {
                    seen.push(n);
                }
            }
            i += 1;
        }
        assert_eq!(seen.len(), ALL_STATES.len());
    }

    #[test]
    fn names_round_trip() {
        for s in ALL_STATES {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
    }
}
