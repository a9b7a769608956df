//! OpenAI-compatible endpoints. Each request becomes a high-priority job in
//! the same durable queue, so an answer survives a restart of the service
//! like any other job; the handler waits for it (or streams it) and answers
//! in OpenAI's shapes. Parameters Longhaul cannot honour are refused with
//! an OpenAI-shaped 400 naming them, never ignored.

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::admission::{Ask, Submitted, submit};
use super::content::text_of;
use super::error::{ApiError, ApiResult};
use super::follow::{KEEP_ALIVE, Update, ended_badly, follow, prompt_comment, wait_done};
use super::jobs::{SettingsBody, check_input, model_sampling};
use super::tool_calls::{by_choice, openai_calls};
use super::{ApiJson, AppState};
use crate::queue::{Input, JobView, Message, Settings, Speculate};
use longhaul_engine::ToolAnswer;

/// `finish_reason` of an answer that ends in tool calls.
const TOOL_CALLS_FINISH: &str = "tool_calls";
/// OpenAI's default `max_tokens` for `/v1/completions`.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

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
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    /// vLLM's extension: transformers' repetition penalty.
    repetition_penalty: Option<f32>,
    /// Switches for the model's chat template or prompt encoder, as vLLM
    /// and llama.cpp's server take them (`enable_thinking`, `thinking`, …).
    chat_template_kwargs: Option<Map<String, Value>>,
    /// Function tools the model may call, and whether it may.
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

/// A chat message as OpenAI clients send it: `content` a string, a list of
/// parts of which Longhaul reads text (`{"type": "text", "text": ...}`), or
/// null (an assistant turn that only called tools); the other fields
/// (`tool_calls`, `tool_call_id`, `name`) pass to the template.
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

impl ChatMessage {
    fn into_message(self, index: usize) -> ApiResult<Message> {
        let content = text_of(
            self.content.as_ref(),
            &["text"],
            "messages",
            &format!("message {index}"),
        )?;
        let mut extra = self.other;
        if let Some(calls) = extra.get_mut("tool_calls") {
            objects_for_arguments(calls, index)?;
        }
        Ok(Message {
            role: self.role,
            content,
            extra,
        })
    }
}

/// OpenAI sends a call's `arguments` as JSON text; templates iterate them
/// as a mapping (`arguments|items`), so they are read into one, as vLLM
/// does before rendering.
fn objects_for_arguments(calls: &mut Value, index: usize) -> ApiResult<()> {
    let bad = |why: String| ApiError::bad_param("messages", format!("message {index}: {why}"));
    let Value::Array(calls) = calls else {
        return Err(bad("tool_calls is not a list".into()));
    };
    for (i, call) in calls.iter_mut().enumerate() {
        let Some(arguments) = call.pointer_mut("/function/arguments") else {
            return Err(bad(format!("tool_calls[{i}] has no function.arguments")));
        };
        if let Value::String(text) = arguments {
            *arguments = match text.trim() {
                "" => Value::Object(Map::new()),
                t => serde_json::from_str(t).map_err(|e| {
                    bad(format!(
                        "tool_calls[{i}].function.arguments is not JSON: {e}"
                    ))
                })?,
            };
        }
    }
    Ok(())
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
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    /// vLLM's extension: transformers' repetition penalty.
    repetition_penalty: Option<f32>,
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
                "logprobs" | "echo" => value.as_bool() == Some(false),
                "best_of" => value.as_u64() == Some(1),
                "parallel_tool_calls" => true,
                "response_format" => value.get("type").and_then(Value::as_str) == Some("text"),
                _ => false,
            };
        if !harmless && key == "response_format" {
            return Err(ApiError::bad_param(
                key,
                "response_format other than text needs sampling constrained to a grammar, which Longhaul does not do; ask for JSON in the prompt, or offer a tool whose parameters are the schema",
            ));
        }
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
    let offer = by_choice(body.tools.unwrap_or_default(), body.tool_choice.as_ref())?;
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
        repetition_penalty: body.repetition_penalty,
        frequency_penalty: body.frequency_penalty,
        presence_penalty: body.presence_penalty,
        draft_model: None,
    }
    .into_settings(model_sampling(&app, &body.model).await)?;
    let include_usage = body.stream_options.is_some_and(|o| o.include_usage);
    let ask = Ask {
        tools: offer.tools,
        forced_call: offer.forced,
        ..Kind::Chat.ask(
            body.model,
            input,
            settings,
            max_tokens.is_some(),
            body.chat_template_kwargs.unwrap_or_default(),
        )
    };
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
        repetition_penalty: body.repetition_penalty,
        frequency_penalty: body.frequency_penalty,
        presence_penalty: body.presence_penalty,
        draft_model: None,
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
            explicit_max_tokens,
            chat_args,
            ..Ask::api(model, input, settings, self.title(), "openai")
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
    /// `reasoning_content`, where the model thought aloud, and its calls in
    /// `tool_calls` (the text around them, if any, in `content`).
    fn choice(self, answer: ToolAnswer, reasoning: Option<String>, finish: &str) -> Value {
        let text = answer.content;
        match self {
            Kind::Chat => {
                let mut message = json!({ "role": "assistant", "content": text });
                if let Some(r) = reasoning {
                    message["reasoning_content"] = Value::String(r);
                }
                let mut finish = finish;
                if !answer.calls.is_empty() {
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = openai_calls(&answer.calls);
                    finish = TOOL_CALLS_FINISH;
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
    let id_text = kind.id(sub.job.id);
    let (object, chunk_object) = kind.objects();
    if streamed {
        return Ok(stream(app, sub, id_text, chunk_object, include_usage).into_response());
    }
    let Submitted {
        job,
        mut events,
        offered,
    } = sub;
    let (model, created) = (job.model, unix_seconds(job.created_ms));
    let job = wait_done(&app, job.id, &mut events).await?;
    if let Some(e) = ended_badly(&job) {
        return Err(e);
    }
    let output = job.output.clone().unwrap_or_default();
    let answer = match &offered {
        Some(o) => o.read(&output),
        None => ToolAnswer {
            content: output,
            calls: Vec::new(),
        },
    };
    Ok(Json(json!({
        "id": id_text,
        "object": object,
        "created": created,
        "model": model,
        "choices": [kind.choice(answer, job.reasoning.clone(), finish_reason(&job))],
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

/// Streams a job's text as OpenAI chunks, its calls as they are written
/// (id and name, then the arguments in fragments), the finish and `[DONE]`.
fn stream(
    app: AppState,
    sub: Submitted,
    id_text: String,
    object: &'static str,
    include_usage: bool,
) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    let stopping = app.clone();
    let Submitted {
        job,
        events,
        offered,
    } = sub;
    let (model, created) = (job.model, unix_seconds(job.created_ms));
    let mut updates = follow(app, job.id, events, offered);
    tokio::spawn(async move {
        let event_of = |data: Value| Ok(SseEvent::default().data(data.to_string()));
        let chunk_of = |part: Part, text: &str, finish: Option<&str>| {
            chunk(object, &id_text, created, &model, (part, text), finish)
        };
        while let Some(update) = updates.recv().await {
            let events: Vec<Value> = match update {
                Update::Prompt { done, total } => {
                    if tx.send(Ok(prompt_comment(done, total))).await.is_err() {
                        return;
                    }
                    continue;
                }
                Update::Reasoning(t) => vec![chunk_of(Part::Reasoning, &t, None)],
                Update::Text(t) => vec![chunk_of(Part::Answer, &t, None)],
                Update::Failed(e) => {
                    vec![json!({ "error": { "message": e.message, "type": e.kind } })]
                }
                Update::Call { index, id, name } => {
                    let mut delta = chunk_of(Part::Answer, "", None);
                    delta["choices"][0]["delta"] = json!({ "role": "assistant", "tool_calls": [{
                        "index": index, "id": id, "type": "function",
                        "function": { "name": name, "arguments": "" },
                    }] });
                    vec![delta]
                }
                Update::Arguments { index, fragment } => {
                    let mut delta = chunk_of(Part::Answer, "", None);
                    delta["choices"][0]["delta"] = json!({ "tool_calls": [{
                        "index": index, "function": { "arguments": fragment },
                    }] });
                    vec![delta]
                }
                Update::Done { job, calls } => {
                    let finish = if calls.is_empty() {
                        finish_reason(&job)
                    } else {
                        TOOL_CALLS_FINISH
                    };
                    let mut last = chunk_of(Part::Answer, "", Some(finish));
                    if include_usage {
                        last["usage"] = usage(&job);
                    }
                    vec![last]
                }
            };
            for e in events {
                if tx.send(event_of(e)).await.is_err() {
                    return;
                }
            }
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    let rx = tokio_stream::wrappers::ReceiverStream::new(rx);
    Sse::new(stopping.until_stopping(rx)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
