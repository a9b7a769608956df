//! `/api/jobs` and `/api/queue`: submitting, listing, steering and
//! exporting jobs, and holding the queue.

use std::path::PathBuf;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::admission::{Ask, Counted, admit, count_prompt, read_attachments};
use super::error::{ApiError, ApiResult};
use super::{ApiJson, ApiPath, AppState};
use crate::events::JobProgress;
use crate::queue::{
    Input, JobState, JobView, Message, ModelEntry, ModelKind, PauseCause, Request, Settings,
    Speculate,
};
use longhaul_engine::tools::SamplingDefaults;

/// Longest answer a job may ask for.
pub const MAX_TOKENS_LIMIT: usize = 1_000_000;
/// Characters of the prompt used as a title when none is given.
const TITLE_CHARS: usize = 60;
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// Generation settings as a request gives them; absent ones take defaults.
#[derive(Debug, Default, Deserialize)]
pub struct SettingsBody {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Option<Vec<String>>,
    pub speculate: Option<Speculate>,
    pub draft_model: Option<String>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
}

/// Where sampling defaults come from, as a job records it.
pub const FROM_GENERATION_CONFIG: &str = "the model's generation_config.json";

impl SettingsBody {
    /// Checks ranges, naming the field at fault. Sampling the request
    /// leaves out comes from the model's `defaults` when it has them; a
    /// temperature of 0 (greedy) needs no other setting.
    pub fn into_settings(self, defaults: Option<SamplingDefaults>) -> Result<Settings, ApiError> {
        let d = Settings::default();
        let model = defaults.filter(|_| self.temperature != Some(0.0));
        let s = Settings {
            max_tokens: self.max_tokens.unwrap_or(d.max_tokens),
            temperature: self
                .temperature
                .or(model.map(|m| m.temperature as f32))
                .unwrap_or(d.temperature),
            top_p: self
                .top_p
                .or(model.map(|m| m.top_p as f32))
                .unwrap_or(d.top_p),
            top_k: self.top_k.or(model.and_then(|m| m.top_k)),
            seed: self.seed.unwrap_or(d.seed),
            stop: self.stop.unwrap_or_default(),
            speculate: self.speculate.unwrap_or_default(),
            draft_model: self.draft_model.filter(|m| !m.trim().is_empty()),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            sampling_from: model
                .filter(|_| {
                    self.temperature.is_none() || self.top_p.is_none() || self.top_k.is_none()
                })
                .map(|_| FROM_GENERATION_CONFIG.to_string()),
        };
        if s.max_tokens == 0 || s.max_tokens > MAX_TOKENS_LIMIT {
            return Err(ApiError::bad_param(
                "max_tokens",
                format!("max_tokens must be between 1 and {MAX_TOKENS_LIMIT}"),
            ));
        }
        if !(s.temperature.is_finite() && s.temperature >= 0.0) {
            return Err(ApiError::bad_param(
                "temperature",
                "temperature must be a number ≥ 0 (0 is greedy)",
            ));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return Err(ApiError::bad_param("top_p", "top_p must be in (0, 1]"));
        }
        if s.top_k == Some(0) {
            return Err(ApiError::bad_param("top_k", "top_k must be at least 1"));
        }
        if !(s.repetition_penalty.is_finite() && s.repetition_penalty > 0.0) {
            return Err(ApiError::bad_param(
                "repetition_penalty",
                "repetition_penalty must be a number > 0 (1 is off; above 1 discourages repeats)",
            ));
        }
        for (name, value) in [
            ("frequency_penalty", s.frequency_penalty),
            ("presence_penalty", s.presence_penalty),
        ] {
            if value.is_nan() || value.abs() > longhaul_engine::MAX_OPENAI_PENALTY {
                return Err(ApiError::bad_param(
                    name,
                    format!("{name} must be a number from -2 to 2 (0 is off)"),
                ));
            }
        }
        if s.stop.iter().any(String::is_empty) {
            return Err(ApiError::bad_param(
                "stop",
                "stop strings must not be empty",
            ));
        }
        Ok(s)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    model: String,
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    /// Files or folders on this machine, read into the prompt now.
    attachments: Option<Vec<PathBuf>>,
    title: Option<String>,
    priority: Option<i64>,
    /// Unset: all the model's context leaves after the prompt.
    max_tokens: Option<usize>,
    /// `max_tokens` is a cap, cut to what the context leaves, instead of
    /// an ask refused when it does not fit (a follow-up keeps its task's
    /// length where it can).
    #[serde(default)]
    fit_max_tokens: bool,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    seed: Option<u64>,
    stop: Option<Vec<String>>,
    /// transformers' repetition penalty (1: off) and OpenAI's frequency and
    /// presence penalties (0: off).
    repetition_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    /// Guessing ahead: `auto` (the default), `lookup` or `off`; the answer
    /// is the same either way.
    speculate: Option<Speculate>,
    /// A registered local model that guesses ahead instead of prompt lookup.
    draft_model: Option<String>,
    /// Switches for the model's chat template or prompt encoder
    /// (`enable_thinking`, `thinking`, `reasoning_effort`, …).
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// How a registered local model asks to be sampled.
pub async fn model_sampling(app: &AppState, name: &str) -> Option<SamplingDefaults> {
    app.model_facts(name, false).await.ok()?.1.facts.sampling
}

impl SubmitBody {
    /// The generation settings the body asks for, checked.
    fn settings(&self, defaults: Option<SamplingDefaults>) -> Result<Settings, ApiError> {
        SettingsBody {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            stop: self.stop.clone(),
            speculate: self.speculate,
            draft_model: self.draft_model.clone(),
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
        }
        .into_settings(defaults)
    }
}

/// Checks a `POST /api/jobs` body as the handler does, short of reading
/// attachments and queueing (the entry point of the job-request fuzz target).
pub fn check_submission(body: &[u8]) -> Result<(), ApiError> {
    let body: SubmitBody =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    body.settings(None)?;
    check_input(body.prompt, body.messages)?;
    Ok(())
}

/// Checks a prompt-or-messages pair; returns the input and a default title.
pub fn check_input(
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
) -> Result<(Input, String), ApiError> {
    let shorten = |t: &str| {
        let line = t.trim().lines().next().unwrap_or("").trim();
        let mut title: String = line.chars().take(TITLE_CHARS).collect();
        if line.chars().count() > TITLE_CHARS {
            title.push('…');
        }
        if title.is_empty() {
            "Untitled task".to_string()
        } else {
            title
        }
    };
    match (prompt, messages) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "give either `prompt` or `messages`, not both",
        )),
        (None, None) => Err(ApiError::bad_request(
            "give the task as `prompt` (text) or `messages` (a conversation)",
        )),
        (Some(p), None) => {
            if p.trim().is_empty() {
                return Err(ApiError::bad_param("prompt", "the prompt is empty"));
            }
            let title = shorten(&p);
            Ok((Input::Prompt(p), title))
        }
        (None, Some(m)) => {
            if m.is_empty() {
                return Err(ApiError::bad_param("messages", "messages is empty"));
            }
            if let Some((i, bad)) = m
                .iter()
                .enumerate()
                .find(|(_, m)| !ROLES.contains(&m.role.as_str()))
            {
                return Err(ApiError::bad_param(
                    "messages",
                    format!(
                        "messages[{i}].role is `{}`; use system, developer, user, assistant or tool",
                        bad.role
                    ),
                ));
            }
            let title = m
                .iter()
                .rev()
                .find(|m| m.role == "user")
                .map_or_else(|| "Untitled task".to_string(), |u| shorten(&u.content));
            Ok((Input::Messages(m), title))
        }
    }
}

pub async fn submit(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<SubmitBody>,
) -> ApiResult<(StatusCode, Json<JobView>)> {
    let settings = body.settings(model_sampling(&app, &body.model).await)?;
    let (input, default_title) = check_input(body.prompt, body.messages)?;
    let ask = Ask {
        model: body.model,
        input,
        attachments: body.attachments.unwrap_or_default(),
        settings,
        explicit_max_tokens: body.max_tokens.is_some() && !body.fit_max_tokens,
        fill_context: body.max_tokens.is_none(),
        chat_args: body.chat_template_kwargs.unwrap_or_default(),
        tools: Vec::new(),
        forced_call: None,
        title: body
            .title
            .filter(|t| !t.trim().is_empty())
            .unwrap_or(default_title),
        priority: body.priority.unwrap_or(0),
        origin: "api".into(),
    };
    Ok((StatusCode::CREATED, Json(admit(&app, ask).await?.job)))
}

/// A job as the API shows it: as saved, and while it runs with its live
/// figures (its statistics so far, and in `live` the tokens not yet
/// committed, speed and prompt reading), so every view of a running job
/// says the same.
#[derive(Debug, Serialize, ts_rs::TS)]
#[ts(rename = "Job")]
pub struct ShownJob {
    #[serde(flatten)]
    job: JobView,
    /// The running job's latest progress; absent for the others.
    live: Option<JobProgress>,
    /// Why the running job is held: the data dir cannot be written, so its
    /// saved state cannot say so yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    storage_fault: Option<String>,
}

fn shown(app: &AppState, mut job: JobView) -> ShownJob {
    let live = app
        .runner
        .live(job.id)
        .filter(|_| job.state == JobState::Running);
    // `tokens` stays what is committed (what a restart keeps); the live
    // count, with tokens not yet committed, is `live.tokens`.
    if let Some(l) = &live {
        job.stats = l.stats.clone();
    }
    let control = &app.runner.control;
    let storage_fault = (job.state == JobState::Running && control.is_running(job.id))
        .then(|| control.storage_fault())
        .flatten();
    ShownJob {
        job,
        live,
        storage_fault,
    }
}

/// `GET /api/jobs`'s answer, serialized as it is typed: through a JSON
/// value, an f32 setting such as 0.7 would read 0.699999988079071.
#[derive(Serialize)]
pub struct JobList {
    jobs: Vec<ShownJob>,
}

pub async fn list(State(app): State<AppState>) -> ApiResult<Json<JobList>> {
    let jobs = app.blocking(|q| q.list()).await?;
    let jobs = jobs.into_iter().map(|j| shown(&app, j)).collect();
    Ok(Json(JobList { jobs }))
}

pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<ShownJob>> {
    let job = app.blocking(move |q| q.job(id)).await?;
    Ok(Json(shown(&app, job)))
}

/// `POST /api/jobs/{id}/{action}` with action cancel, pause or resume.
pub async fn act(
    State(app): State<AppState>,
    ApiPath((id, action)): ApiPath<(i64, String)>,
) -> ApiResult<Json<JobView>> {
    match action.as_str() {
        "cancel" => {
            app.blocking(move |q| q.cancel(id)).await?;
            app.runner.control.stop_job(id);
            app.runner.forget_state(id);
        }
        "pause" => {
            app.blocking(move |q| q.pause(id, PauseCause::User, PAUSED_BY_USER))
                .await?;
            app.runner.control.stop_job(id);
        }
        "resume" => {
            app.blocking(move |q| q.resume(id)).await?;
            app.runner.control.wake();
        }
        other => {
            return Err(ApiError::not_found(format!(
                "no job action `{other}`; use cancel, pause or resume"
            )));
        }
    }
    app.runner.announce_queue();
    Ok(Json(app.blocking(move |q| q.job(id)).await?))
}

/// `DELETE /api/jobs/{id}`: an ended job and its output, for good.
pub async fn delete(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    app.blocking(move |q| q.delete(id)).await?;
    app.runner.forget_state(id);
    app.runner.announce_queue();
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveBody {
    /// New place among the waiting jobs of the same priority, 0 first.
    index: usize,
}

pub async fn move_job(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<MoveBody>,
) -> ApiResult<Json<JobView>> {
    app.blocking(move |q| q.reorder(id, body.index)).await?;
    app.runner.announce_queue();
    Ok(Json(app.blocking(move |q| q.job(id)).await?))
}

#[derive(Debug, Deserialize)]
pub struct ExportQuery {
    format: Option<String>,
}

pub async fn export(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    Query(q): Query<ExportQuery>,
) -> ApiResult<Response> {
    let job = app.blocking(move |q| q.job(id)).await?;
    let format = q.format.as_deref().unwrap_or("markdown");
    let (body, kind, ext) = match format {
        "markdown" | "md" => (markdown(&job), "text/markdown; charset=utf-8", "md"),
        "json" => (
            serde_json::to_string_pretty(&job).map_err(|e| ApiError::internal(e.to_string()))?,
            "application/json",
            "json",
        ),
        other => {
            return Err(ApiError::bad_param(
                "format",
                format!("no export format `{other}`; use markdown or json"),
            ));
        }
    };
    let disposition = format!("attachment; filename=\"longhaul-job-{id}.{ext}\"");
    Ok((
        [
            (header::CONTENT_TYPE, kind.to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}

/// A job as a Markdown document: title, settings, statistics, prompt, output.
pub fn markdown(job: &JobView) -> String {
    let s = &job.request.settings;
    let mut md = format!("# {}\n\n", job.title);
    md.push_str(&format!(
        "- Model: {}\n- State: {}{}\n- Settings: max_tokens {}, temperature {}, top_p {}, top_k {}, seed {}{}\n",
        job.model,
        job.state.as_str(),
        job.finish_reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
        s.max_tokens,
        s.temperature,
        s.top_p,
        s.top_k.map_or("off".to_string(), |k| k.to_string()),
        s.seed,
        if s.stop.is_empty() {
            String::new()
        } else {
            format!(", stop {:?}", s.stop)
        }
    ));
    if let Some(st) = &job.stats {
        md.push_str(&format!(
            "- Statistics: {} tokens, {:.2} tokens/s, {:.0} s wall, time to first token {}, expert bytes read {}, cache hit rate {}\n",
            st.generated_tokens,
            st.tokens_per_second,
            st.wall_seconds,
            st.time_to_first_token_s
                .map_or("–".to_string(), |t| format!("{t:.2} s")),
            st.expert_bytes_read,
            st.cache_hit_rate
                .map_or("–".to_string(), |h| format!("{:.1}%", 100.0 * h)),
        ));
    }
    if let Some(e) = &job.error {
        md.push_str(&format!("- Error: {e}\n"));
    }
    md.push_str("\n## Task\n\n");
    match &job.request.input {
        Input::Prompt(p) => md.push_str(p),
        Input::Messages(m) => {
            for msg in m {
                md.push_str(&format!("**{}**: {}\n\n", msg.role, msg.content));
            }
        }
    }
    md.push_str("\n\n## Result\n\n");
    md.push_str(job.output.as_deref().unwrap_or(""));
    md.push('\n');
    md
}

/// `POST /api/queue/{pause|resume}`: hold or release the whole queue.
pub async fn queue_act(
    State(app): State<AppState>,
    Path(action): Path<String>,
) -> ApiResult<Json<Value>> {
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        "resume-all" => {
            // The queue and every paused job, whatever paused it.
            app.blocking(|q| q.resume_all()).await?;
            false
        }
        other => {
            return Err(ApiError::not_found(format!(
                "no queue action `{other}`; use pause, resume or resume-all"
            )));
        }
    };
    if paused {
        // The running jobs pause too, so they keep their place and output.
        for id in app.runner.control.running_jobs() {
            let _ = app
                .blocking(move |q| q.pause(id, PauseCause::Queue, PAUSED_WITH_QUEUE))
                .await;
            app.runner.control.stop_job(id);
        }
    }
    app.runner.control.set_queue_paused(paused);
    app.runner.announce_queue();
    queue_status(State(app)).await
}

/// Why the user paused a job, or the whole queue.
const PAUSED_BY_USER: &str = "paused by the user";
const PAUSED_WITH_QUEUE: &str = "the queue was paused";

/// `GET /api/queue`: whether it is held, what runs and waits, and the jobs
/// a fault holds (a drive missing or failing, a full data dir).
pub async fn queue_status(State(app): State<AppState>) -> ApiResult<Json<Value>> {
    let jobs = app.blocking(|q| q.list()).await?;
    let waiting = jobs.iter().filter(|j| j.queue_position.is_some()).count();
    let running = jobs
        .iter()
        .find(|j| j.state == JobState::Running)
        .map(|j| j.id);
    let running_all: Vec<i64> = jobs
        .iter()
        .filter(|j| j.state == JobState::Running)
        .map(|j| j.id)
        .collect();
    // Jobs held by something other than the user: a drive or a failing read.
    let held: Vec<Value> = jobs
        .iter()
        .filter(|j| j.state == JobState::Paused)
        .filter(|j| j.pause_cause.is_some_and(PauseCause::is_fault))
        .map(|j| json!({ "id": j.id, "title": j.title, "reason": j.pause_reason, "cause": j.pause_cause }))
        .collect();
    Ok(Json(json!({
        "paused": app.runner.control.queue_paused(),
        // Why the data dir cannot be written, while that lasts.
        "storage_fault": app.runner.control.storage_fault(),
        "running": running,
        // Every running job; up to `together` of one model decode together.
        "running_jobs": running_all,
        "together": app.runner.config().together,
        "waiting": waiting,
        "held": held,
        // What the disks under the packs warn of: hot, worn, new errors.
        "health_warnings": super::drives::health_warnings(&app),
    })))
}

/// `POST /api/jobs/preview`: what a submission would send, before sending
/// it — the prompt's token count and which attached files are read or skipped.
pub async fn preview(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<SubmitBody>,
) -> ApiResult<Json<Value>> {
    // The same fields as a submission, checked the same way.
    let (model, known) = app.model_facts(&body.model, true).await?;
    let settings = body.settings(known.facts.sampling)?;
    // Without max_tokens (or with it as a cap), the answer may fill the context.
    let fills = body.max_tokens.is_none() || body.fit_max_tokens;
    let body_max = body.max_tokens;
    let input = match body.messages.filter(|m| !m.is_empty()) {
        Some(m) => Input::Messages(m),
        None => Input::Prompt(body.prompt.unwrap_or_default()),
    };
    let chat_args = body.chat_template_kwargs.unwrap_or_default();
    let attached = read_attachments(body.attachments.unwrap_or_default()).await?;
    let finished = app.blocking(|q| q.list()).await?;
    let budget = match app.latest_metrics() {
        // The loaded model's planned budget, when it is this one.
        Some(m) if Some(m.model.as_str()) == model_path(&model).as_deref() => m.budget_bytes,
        _ => app.runner.expert_budget(),
    };
    let result = tokio::task::spawn_blocking(move || -> Result<Value, ApiError> {
        let inputs = forecast_inputs(&model, budget, &finished);
        let skipped: Vec<Value> = attached
            .skipped
            .iter()
            .map(|(p, why)| json!({ "path": p, "reason": why }))
            .collect();
        let request = Request {
            input,
            attachments: attached.text.clone(),
            settings: settings.clone(),
            chat_args,
            rendered_at: Some(crate::queue::now_seconds()),
            tools: Vec::new(),
            forced_call: None,
            tool_format: None,
        };
        let counted = count_prompt(&known, &request)?;
        let context = known.facts.context;
        let left = context.map(|c| c.saturating_sub(counted.tokens()));
        let answer = match (fills, left) {
            (true, Some(left)) if body_max.is_none_or(|m| m > left) => left,
            _ => settings.max_tokens,
        };
        let forecast = crate::forecast::forecast(&inputs, counted.tokens(), answer);
        Ok(json!({
            "prompt_tokens": counted.tokens(),
            // RAM, time to the first token and to the end, before queueing.
            "forecast": forecast,
            "estimate": matches!(counted, Counted::Estimate(_)),
            "context_tokens": context,
            "attachment_files": attached.files,
            "attachment_bytes": attached.text.len(),
            "skipped": skipped,
            // The settings the job would run with (the model's sampling
            // defaults where the request says nothing).
            "settings": settings,
        }))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(result))
}

fn model_path(model: &ModelEntry) -> Option<String> {
    match &model.kind {
        ModelKind::Local { path } => Some(path.display().to_string()),
        ModelKind::Remote { .. } => None,
    }
}

/// What a forecast for `model` rests on: its pack's shape and probed
/// drives, and the speeds of its finished tasks (`jobs`, newest first).
fn forecast_inputs(model: &ModelEntry, budget: u64, jobs: &[JobView]) -> crate::forecast::Inputs {
    use crate::forecast::{ExpertShape, Finished, Inputs};
    let finished = jobs
        .iter()
        .filter(|j| j.model == model.name && j.state == JobState::Done)
        .filter_map(|j| j.stats.as_ref())
        .filter(|s| s.generated_tokens > 0)
        .filter_map(|s| {
            Some(Finished {
                prompt_tokens: s.prompt_tokens,
                time_to_first_token_s: s.time_to_first_token_s?,
                tokens_per_second: s.tokens_per_second,
            })
        })
        .collect();
    let ModelKind::Local { path } = &model.kind else {
        return Inputs {
            finished,
            ..Inputs::default()
        };
    };
    let state = longhaul_engine::tools::state_bytes(path);
    let details = longhaul_engine::tools::Manifest::read(path)
        .ok()
        .and_then(|m| longhaul_engine::tools::describe_pack(path, &m));
    let Some(d) = details else {
        // Not a pack: every weight is loaded into RAM.
        let resident_bytes = super::drives::folder_bytes(path);
        return Inputs {
            resident_bytes,
            state,
            finished,
            ..Inputs::default()
        };
    };
    Inputs {
        resident_bytes: d.resident_bytes,
        budget_bytes: budget,
        state,
        experts: d.experts_per_token.map(|per_token| ExpertShape {
            total_bytes: d.expert_bytes,
            layers: d.expert_layers,
            per_layer: d.experts_per_layer,
            per_token,
        }),
        drives_mb_per_s: longhaul_engine::tools::ProbeReport::load(path)
            .map(|p| p.aggregate_mb_per_s),
        finished,
    }
}
