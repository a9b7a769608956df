//! OpenAI-compatible endpoints. Each request becomes a high-priority job in
//! the same durable queue, so an answer survives a restart of the service
//! like any other job; the handler waits for it (or streams it) and answers
//! in OpenAI's shapes. Parameters Longhaul cannot honour are refused with
//! an OpenAI-shaped 400 naming them, never ignored.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::admission::{Ask, admit};
use super::error::{ApiError, ApiResult};
use super::jobs::{SettingsBody, check_input, model_sampling};
use super::{ApiJson, AppState};
use crate::events::Event;
use crate::queue::{Input, JobState, JobView, Message, Settings, Speculate};

/// Priority of OpenAI requests: ahead of queued long-form tasks.
pub const OPENAI_PRIORITY: i64 = 100;
/// OpenAI's default `max_tokens` for `/v1/completions`.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;
/// How often a waiting handler re-reads its job when no event arrives.
const POLL: Duration = Duration::from_millis(500);

/// Fields that are accepted and mean nothing to generation.
const INERT_FIELDS: &[&str] = &["user"];

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct ChatBody {
    model: String,
    messages: Vec<ChatMessage>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    seed: Option<Seed>,
    stop: Option<Stop>,
    /// Longhaul's own: how the answer guesses ahead (`auto`, `lookup`,
    /// `off`); the answer is the same either way.
    speculate: Option<Speculate>,
    /// Switches for the model's chat template or prompt encoder, as vLLM
    /// and llama.cpp's server take them (`enable_thinking`, `thinking`, …).
    chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

/// A chat message as OpenAI clients send it: `content` a string, or a list
/// of parts of which Longhaul reads text (`{"type": "text", "text": ...}`).
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    role: String,
    content: Content,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Map<String, Value>>),
}

impl ChatMessage {
    fn into_message(self, index: usize) -> ApiResult<Message> {
        let content = match self.content {
            Content::Text(t) => t,
            Content::Parts(parts) => {
                let mut text = String::new();
                for part in parts {
                    match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::bad_param(
                                "messages",
                                format!(
                                    "message {index}: content part of type `{}` is not supported; Longhaul reads text parts",
                                    kind.unwrap_or("(none)")
                                ),
                            ));
                        }
                    }
                }
                text
            }
        };
        Ok(Message {
            role: self.role,
            content,
        })
    }
}

/// OpenAI's `seed`: a negative one (clients send -1) means none.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct Seed(i64);

fn seed(s: Option<Seed>) -> Option<u64> {
    s.and_then(|Seed(v)| u64::try_from(v).ok())
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    model: String,
    prompt: Value,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    seed: Option<Seed>,
    stop: Option<Stop>,
    /// Longhaul's own: how the answer guesses ahead (`auto`, `lookup`,
    /// `off`); the answer is the same either way.
    speculate: Option<Speculate>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

/// Refuses fields that would change the answer in ways Longhaul does not do.
/// Nulls, and values equal to what Longhaul does anyway, are accepted.
fn refuse_unsupported(other: &Map<String, Value>, n: Option<u32>) -> Result<(), ApiError> {
    if n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_param("n", "only n = 1 is supported"));
    }
    for (key, value) in other {
        let harmless = value.is_null()
            || INERT_FIELDS.contains(&key.as_str())
            || match key.as_str() {
                "frequency_penalty" | "presence_penalty" => value.as_f64() == Some(0.0),
                "logprobs" | "echo" => value.as_bool() == Some(false),
                "best_of" => value.as_u64() == Some(1),
                "parallel_tool_calls" => true,
                _ => false,
            };
        if !harmless {
            return Err(ApiError::bad_param(
                key,
                format!(
                    "`{key}` is not supported by Longhaul; remove it or leave it at its default"
                ),
            ));
        }
    }
    Ok(())
}

fn stop_list(stop: Option<Stop>) -> Option<Vec<String>> {
    stop.map(|s| match s {
        Stop::One(s) => vec![s],
        Stop::Many(v) => v,
    })
}

fn finish_reason(job: &JobView) -> &'static str {
    match job.finish_reason.as_deref() {
        Some("length") => "length",
        _ => "stop",
    }
}

fn usage(job: &JobView) -> Value {
    let prompt = job.stats.as_ref().map_or(0, |s| s.prompt_tokens);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": job.tokens,
        "total_tokens": prompt + job.tokens,
    })
}

fn unix_seconds(ms: i64) -> i64 {
    ms / 1000
}

/// Waits for job `id` to end, reading it again on every event about it.
async fn wait_done(
    app: &AppState,
    id: i64,
    rx: &mut broadcast::Receiver<Event>,
) -> ApiResult<JobView> {
    loop {
        let job = app.blocking(move |q| q.job(id)).await?;
        if job.state.is_final() {
            return Ok(job);
        }
        let _ = tokio::time::timeout(POLL, async {
            loop {
                match rx.recv().await {
                    Ok(Event::Job(p)) if p.id == id => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                    _ => {}
                }
            }
        })
        .await;
    }
}

/// The job's end as an error, when it did not finish.
fn ended_badly(job: &JobView) -> Option<ApiError> {
    match job.state {
        JobState::Failed => Some(ApiError::internal(format!(
            "job {} failed: {}",
            job.id,
            job.error.as_deref().unwrap_or("unknown error")
        ))),
        JobState::Cancelled => Some(ApiError::conflict(format!("job {} was cancelled", job.id))),
        _ => None,
    }
}

struct Submitted {
    id: i64,
    model: String,
    created: i64,
    rx: broadcast::Receiver<Event>,
}

/// Admits the request as a high-priority job, subscribed to its events
/// first so none is missed.
async fn submit(app: &AppState, ask: Ask) -> ApiResult<Submitted> {
    let rx = app.events.subscribe();
    let view = admit(app, ask).await?;
    Ok(Submitted {
        id: view.id,
        model: view.model,
        created: unix_seconds(view.created_ms),
        rx,
    })
}

pub async fn models(State(app): State<AppState>) -> ApiResult<Json<Value>> {
    let models = app.blocking(|q| q.models()).await?;
    let data: Vec<Value> = models
        .iter()
        .map(|m| {
            json!({
                "id": m.name,
                "object": "model",
                "created": unix_seconds(m.created_ms),
                "owned_by": "longhaul",
            })
        })
        .collect();
    Ok(Json(json!({ "object": "list", "data": data })))
}

pub async fn chat_completions(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<ChatBody>,
) -> ApiResult<Response> {
    refuse_unsupported(&body.other, body.n)?;
    let messages = body
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.into_message(i))
        .collect::<ApiResult<Vec<_>>>()?;
    let (input, _) = check_input(None, Some(messages))?;
    let max_tokens = body.max_completion_tokens.or(body.max_tokens);
    let settings = SettingsBody {
        max_tokens,
        temperature: body.temperature,
        top_p: body.top_p,
        top_k: body.top_k,
        seed: seed(body.seed),
        stop: stop_list(body.stop),
        speculate: body.speculate,
    }
    .into_settings(model_sampling(&app, &body.model).await)?;
    let include_usage = body.stream_options.is_some_and(|o| o.include_usage);
    let ask = Kind::Chat.ask(
        body.model,
        input,
        settings,
        max_tokens.is_some(),
        body.chat_template_kwargs.unwrap_or_default(),
    );
    answer(app, Kind::Chat, ask, body.stream, include_usage).await
}

pub async fn completions(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<CompletionBody>,
) -> ApiResult<Response> {
    refuse_unsupported(&body.other, body.n)?;
    let prompt = match body.prompt {
        Value::String(s) => s,
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_string()
        }
        _ => {
            return Err(ApiError::bad_param(
                "prompt",
                "prompt must be one string (batches and token arrays are not supported)",
            ));
        }
    };
    let (input, _) = check_input(Some(prompt), None)?;
    let settings = SettingsBody {
        max_tokens: Some(body.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS)),
        temperature: body.temperature,
        top_p: body.top_p,
        top_k: body.top_k,
        seed: seed(body.seed),
        stop: stop_list(body.stop),
        speculate: body.speculate,
    }
    .into_settings(model_sampling(&app, &body.model).await)?;
    let include_usage = body.stream_options.is_some_and(|o| o.include_usage);
    let explicit = body.max_tokens.is_some();
    let ask = Kind::Text.ask(body.model, input, settings, explicit, Map::new());
    answer(app, Kind::Text, ask, body.stream, include_usage).await
}

/// Which OpenAI endpoint a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    fn title(self) -> &'static str {
        match self {
            Kind::Chat => "OpenAI chat completion",
            Kind::Text => "OpenAI completion",
        }
    }

    /// The request as a job to admit, ahead of queued long-form tasks.
    fn ask(
        self,
        model: String,
        input: Input,
        settings: Settings,
        explicit_max_tokens: bool,
        chat_args: Map<String, Value>,
    ) -> Ask {
        Ask {
            model,
            input,
            attachments: Vec::new(),
            settings,
            explicit_max_tokens,
            chat_args,
            title: self.title().into(),
            priority: OPENAI_PRIORITY,
            origin: "openai".into(),
        }
    }

    fn id(self, job: i64) -> String {
        match self {
            Kind::Chat => format!("chatcmpl-{job}"),
            Kind::Text => format!("cmpl-{job}"),
        }
    }

    /// The `object` of a whole answer and of a streamed chunk.
    fn objects(self) -> (&'static str, &'static str) {
        match self {
            Kind::Chat => ("chat.completion", "chat.completion.chunk"),
            Kind::Text => ("text_completion", "text_completion"),
        }
    }

    /// The one choice of a whole answer; a chat answer's reasoning in
    /// `reasoning_content`, where the model thought aloud.
    fn choice(self, text: String, reasoning: Option<String>, finish: &str) -> Value {
        match self {
            Kind::Chat => {
                let mut message = json!({ "role": "assistant", "content": text });
                if let Some(r) = reasoning {
                    message["reasoning_content"] = Value::String(r);
                }
                json!({ "index": 0, "message": message, "finish_reason": finish })
            }
            Kind::Text => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish,
            }),
        }
    }
}

/// Queues the request as a high-priority job and answers it, whole or streamed.
async fn answer(
    app: AppState,
    kind: Kind,
    ask: Ask,
    streamed: bool,
    include_usage: bool,
) -> ApiResult<Response> {
    let sub = submit(&app, ask).await?;
    let id_text = kind.id(sub.id);
    let (object, chunk_object) = kind.objects();
    if streamed {
        return Ok(stream(app, sub, id_text, chunk_object, include_usage).into_response());
    }
    let Submitted {
        id,
        model,
        created,
        mut rx,
    } = sub;
    let job = wait_done(&app, id, &mut rx).await?;
    if let Some(e) = ended_badly(&job) {
        return Err(e);
    }
    Ok(Json(json!({
        "id": id_text,
        "object": object,
        "created": created,
        "model": model,
        "choices": [kind.choice(
            job.output.clone().unwrap_or_default(),
            job.reasoning.clone(),
            finish_reason(&job),
        )],
        "usage": usage(&job),
    }))
    .into_response())
}

/// Which part of the answer a streamed chunk carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Answer,
    Reasoning,
}

/// One streamed chunk carrying `text` of `part` (or the end, with `finish`).
fn chunk(
    object: &str,
    id: &str,
    created: i64,
    model: &str,
    (part, text): (Part, &str),
    finish: Option<&str>,
) -> Value {
    if object == "text_completion" {
        json!({
            "id": id, "object": object, "created": created, "model": model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }],
        })
    } else {
        let delta = match (finish, part) {
            (Some(_), _) => json!({}),
            (None, Part::Answer) => json!({ "role": "assistant", "content": text }),
            (None, Part::Reasoning) => json!({ "role": "assistant", "reasoning_content": text }),
        };
        json!({
            "id": id, "object": object, "created": created, "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        })
    }
}

/// What an event's text adds to what was sent of one part.
enum CatchUp {
    Fresh(String),
    Nothing,
    /// The event begins past what was sent: some text was missed.
    Gap,
}

fn catch_up(sent: &str, offset: usize, delta: &str) -> CatchUp {
    let end = offset + delta.len();
    if offset <= sent.len() && end > sent.len() && delta.is_char_boundary(sent.len() - offset) {
        CatchUp::Fresh(delta[sent.len() - offset..].to_string())
    } else if offset > sent.len() {
        CatchUp::Gap
    } else {
        CatchUp::Nothing
    }
}

/// Streams a job's text as OpenAI chunks. Progress events carry text as it
/// is produced; when one does not line up with what was sent (a missed
/// event, or text regenerated after a pause) the committed output is read
/// and only what was not yet sent goes out.
fn stream(
    app: AppState,
    sub: Submitted,
    id_text: String,
    object: &'static str,
    include_usage: bool,
) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    let stopping = app.clone();
    tokio::spawn(async move {
        let Submitted {
            id,
            model,
            created,
            rx: mut events,
        } = sub;
        let (mut sent, mut sent_reasoning) = (String::new(), String::new());
        let send = |part: Part, text: String| {
            let data = chunk(object, &id_text, created, &model, (part, &text), None).to_string();
            Ok(SseEvent::default().data(data))
        };
        loop {
            let event = tokio::time::timeout(POLL, events.recv()).await;
            let mut reread = matches!(event, Err(_) | Ok(Err(_)));
            if let Ok(Ok(Event::Job(p))) = &event
                && p.id == id
                && let Some(offset) = p.offset
            {
                let reasoning_offset = p.reasoning_offset.unwrap_or(sent_reasoning.len());
                for (part, sent, offset, delta) in [
                    (
                        Part::Reasoning,
                        &mut sent_reasoning,
                        reasoning_offset,
                        &p.reasoning_delta,
                    ),
                    (Part::Answer, &mut sent, offset, &p.delta),
                ] {
                    match catch_up(sent, offset, delta) {
                        CatchUp::Fresh(fresh) => {
                            sent.push_str(&fresh);
                            if tx.send(send(part, fresh)).await.is_err() {
                                return;
                            }
                        }
                        CatchUp::Gap => reread = true,
                        CatchUp::Nothing => {}
                    }
                }
                reread |= p.state.is_final();
            }
            if !reread {
                continue;
            }
            let Ok(job) = app.blocking(move |q| q.job(id)).await else {
                return;
            };
            let reasoning = job.reasoning.clone().unwrap_or_default();
            let output = job.output.clone().unwrap_or_default();
            for (part, sent, whole) in [
                (Part::Reasoning, &mut sent_reasoning, reasoning),
                (Part::Answer, &mut sent, output),
            ] {
                if whole.len() > sent.len() && whole.starts_with(sent.as_str()) {
                    let fresh = whole[sent.len()..].to_string();
                    sent.push_str(&fresh);
                    if tx.send(send(part, fresh)).await.is_err() {
                        return;
                    }
                }
            }
            if job.state.is_final() {
                if let Some(e) = ended_badly(&job) {
                    let data = json!({ "error": { "message": e.message, "type": e.kind } });
                    let _ = tx
                        .send(Ok(SseEvent::default().data(data.to_string())))
                        .await;
                } else {
                    let mut last = chunk(
                        object,
                        &id_text,
                        created,
                        &model,
                        (Part::Answer, ""),
                        Some(finish_reason(&job)),
                    );
                    if include_usage {
                        last["usage"] = usage(&job);
                    }
                    let _ = tx
                        .send(Ok(SseEvent::default().data(last.to_string())))
                        .await;
                }
                let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
                return;
            }
        }
    });
    let rx = tokio_stream::wrappers::ReceiverStream::new(rx);
    Sse::new(stopping.until_stopping(rx)).keep_alive(KeepAlive::default())
}
