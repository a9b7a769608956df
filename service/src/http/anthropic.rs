//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`),
//! so Claude Code and Anthropic's SDKs can work against a local model. A
//! request is a job in the same durable queue, admitted as every other:
//! content blocks become the conversation the model's template reads
//! (`tool_use` blocks the assistant's `tool_calls`, `tool_result` blocks
//! `tool` messages, `thinking` blocks its `reasoning_content`), and the
//! answer comes back as `thinking`, `text` and `tool_use` blocks, whole or
//! as Anthropic's event stream. Errors take Anthropic's shape, so the SDK
//! raises its own exception classes.

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use longhaul_engine::ToolCall;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::admission::{Ask, Submitted, count_prompt, submit};
use super::content::text_of;
use super::error::{ApiError, ApiResult};
use super::follow::{KEEP_ALIVE, Update, ended_badly, follow, prompt_comment, wait_done};
use super::jobs::{SettingsBody, check_input, model_sampling};
use super::tool_calls::{Offer, by_choice, refuse_other};
use super::{ApiJson, AppState};
use crate::queue::{JobView, Message, Request};

/// Fields that are accepted and mean nothing to generation here.
const INERT_FIELDS: &[&str] = &[
    "metadata",
    "service_tier",
    "cache_control",
    "context_management",
];

/// An error in Anthropic's shape: `{"type": "error", "error": {type, message}}`.
pub struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let e = self.0;
        let kind = match e.status {
            StatusCode::BAD_REQUEST | StatusCode::CONFLICT => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            _ => "api_error",
        };
        let message = match &e.param {
            Some(p) => format!("{p}: {}", e.message),
            None => e.message,
        };
        let body = json!({ "type": "error", "error": { "type": kind, "message": message } });
        (e.status, Json(body)).into_response()
    }
}

type Result<T> = std::result::Result<T, AnthropicError>;

#[derive(Debug, Deserialize)]
pub struct MessagesBody {
    model: String,
    max_tokens: usize,
    messages: Vec<AnthropicMessage>,
    system: Option<Blocks>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    #[serde(default)]
    stream: bool,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

/// `POST /v1/messages/count_tokens`: the prompt a request would read.
#[derive(Debug, Deserialize)]
pub struct CountBody {
    model: String,
    messages: Vec<AnthropicMessage>,
    system: Option<Blocks>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct AnthropicMessage {
    role: String,
    content: Blocks,
}

/// Content as a string or a list of blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Blocks {
    Text(String),
    List(Vec<Map<String, Value>>),
}

fn bad(message: String) -> AnthropicError {
    AnthropicError(ApiError::bad_param("messages", message))
}

fn block_text(block: &Map<String, Value>, at: &str) -> Result<String> {
    block
        .get("text")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| bad(format!("{at}: a text block without text")))
}

/// A tool result's content: a string or text blocks, joined.
fn result_text(content: Option<&Value>, at: &str) -> Result<String> {
    Ok(text_of(content, &["text"], "messages", at)?)
}

/// The conversation as the model's template reads it: the system prompt
/// first, each message's blocks in order (a user's tool results as `tool`
/// messages ahead of its text).
fn conversation(system: Option<Blocks>, messages: Vec<AnthropicMessage>) -> Result<Vec<Message>> {
    let mut out = Vec::new();
    match system {
        None => {}
        Some(Blocks::Text(t)) => out.push(Message::new("system", t)),
        Some(Blocks::List(blocks)) => {
            let text = blocks
                .iter()
                .map(|b| block_text(b, "system"))
                .collect::<Result<Vec<_>>>()?;
            out.push(Message::new("system", text.concat()));
        }
    }
    for (i, m) in messages.into_iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(bad(format!(
                "messages[{i}].role is `{}`; use user or assistant",
                m.role
            )));
        }
        let blocks = match m.content {
            Blocks::Text(t) => {
                out.push(Message::new(m.role, t));
                continue;
            }
            Blocks::List(b) => b,
        };
        let (mut text, mut calls, mut thinking) = (String::new(), Vec::new(), String::new());
        for (j, block) in blocks.iter().enumerate() {
            let at = format!("messages[{i}].content[{j}]");
            match block.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(&block_text(block, &at)?),
                Some("thinking") => {
                    thinking.push_str(block.get("thinking").and_then(Value::as_str).unwrap_or(""))
                }
                Some("redacted_thinking") => {}
                Some("tool_use") if m.role == "assistant" => calls.push(json!({
                    "id": block.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {
                        "name": block.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": block.get("input").cloned().unwrap_or_else(|| json!({})),
                    },
                })),
                Some("tool_result") if m.role == "user" => {
                    let mut result = Message::new("tool", result_text(block.get("content"), &at)?);
                    let id = block.get("tool_use_id").cloned().unwrap_or(Value::Null);
                    result.extra.insert("tool_call_id".into(), id);
                    out.push(result);
                }
                kind => {
                    return Err(bad(format!(
                        "{at}: a `{}` block in a {} message is not supported; Longhaul reads text, thinking, tool_use and tool_result blocks",
                        kind.unwrap_or("(none)"),
                        m.role
                    )));
                }
            }
        }
        if text.is_empty() && calls.is_empty() && thinking.is_empty() {
            continue;
        }
        let mut message = Message::new(m.role, text);
        if !calls.is_empty() {
            message
                .extra
                .insert("tool_calls".into(), Value::Array(calls));
        }
        if !thinking.is_empty() {
            message
                .extra
                .insert("reasoning_content".into(), Value::String(thinking));
        }
        out.push(message);
    }
    Ok(out)
}

/// Anthropic's tools as function tools, as `tool_choice` leaves them.
fn offered_tools(tools: Option<Vec<Value>>, choice: Option<&Value>) -> Result<Offer> {
    let tools = tools
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_param("tools", format!("a tool without a name: {t}"))
            })?;
            Ok(json!({ "type": "function", "function": {
                "name": name,
                "description": t.get("description").cloned().unwrap_or(Value::Null),
                "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({ "type": "object" })),
            }}))
        })
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(by_choice(tools, choice)?)
}

/// `thinking` as the template switches reasoning models read.
fn thinking_args(thinking: Option<&Value>) -> Map<String, Value> {
    let on = match thinking.and_then(|t| t.get("type")).and_then(Value::as_str) {
        Some("enabled") | Some("adaptive") => true,
        Some("disabled") => false,
        _ => return Map::new(),
    };
    Map::from_iter([
        ("enable_thinking".to_string(), Value::Bool(on)),
        ("thinking".to_string(), Value::Bool(on)),
    ])
}

/// `POST /v1/messages`.
pub async fn messages(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<MessagesBody>,
) -> Result<Response> {
    refuse_other(&body.other, INERT_FIELDS)?;
    let offer = offered_tools(body.tools, body.tool_choice.as_ref())?;
    let chat_args = thinking_args(body.thinking.as_ref());
    let messages = conversation(body.system, body.messages)?;
    let (input, _) = check_input(None, Some(messages))?;
    let settings = SettingsBody {
        max_tokens: Some(body.max_tokens),
        temperature: body.temperature,
        top_p: body.top_p,
        top_k: body.top_k,
        seed: None,
        stop: body.stop_sequences,
        ..SettingsBody::default()
    }
    .into_settings(model_sampling(&app, &body.model).await)?;
    let ask = Ask {
        explicit_max_tokens: true,
        chat_args,
        tools: offer.tools,
        forced_call: offer.forced,
        ..Ask::api(
            body.model,
            input,
            settings,
            "Anthropic message",
            "anthropic",
        )
    };
    let Submitted {
        job,
        mut events,
        offered,
    } = submit(&app, ask).await?;
    if body.stream {
        let updates = follow(app.clone(), job.id, events, offered);
        return Ok(stream(app, job, updates).into_response());
    }
    let done = wait_done(&app, job.id, &mut events).await?;
    if let Some(e) = ended_badly(&done) {
        return Err(e.into());
    }
    let output = done.output.clone().unwrap_or_default();
    let (text, calls) = match &offered {
        Some(o) => {
            let read = o.read(&output);
            (read.content, read.calls)
        }
        None => (output, Vec::new()),
    };
    let mut content = Vec::new();
    if let Some(r) = done.reasoning.as_deref().filter(|r| !r.is_empty()) {
        content.push(json!({ "type": "thinking", "thinking": r, "signature": "" }));
    }
    if !text.is_empty() {
        content.push(json!({ "type": "text", "text": text }));
    }
    content.extend(calls.iter().map(tool_use));
    let mut message = message_head(&done, usage(&done));
    message["content"] = Value::Array(content);
    message["stop_reason"] = json!(stop_reason(&done, &calls));
    Ok(Json(message).into_response())
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}` of the prompt the
/// same request would read, rendered by the model's template with its tools.
pub async fn count_tokens(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<CountBody>,
) -> Result<Json<Value>> {
    let offer = offered_tools(body.tools, body.tool_choice.as_ref())?;
    let messages = conversation(body.system, body.messages)?;
    let (input, _) = check_input(None, Some(messages))?;
    let (_, known) = app.model_facts(&body.model, true).await?;
    let request = Request {
        input,
        attachments: String::new(),
        settings: Default::default(),
        chat_args: thinking_args(body.thinking.as_ref()),
        rendered_at: Some(crate::queue::now_seconds()),
        tools: offer.tools,
        forced_call: offer.forced,
        tool_format: None,
    };
    let counted = tokio::task::spawn_blocking(move || count_prompt(&known, &request))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(Json(json!({ "input_tokens": counted.tokens() })))
}

fn message_id(job: &JobView) -> String {
    format!("msg_{}", job.id)
}

fn usage(job: &JobView) -> Value {
    json!({
        "input_tokens": job.stats.as_ref().map_or(0, |s| s.prompt_tokens),
        "output_tokens": job.tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
}

/// A message without its content and stop, as `message_start` sends it.
fn message_head(job: &JobView, usage: Value) -> Value {
    json!({
        "id": message_id(job), "type": "message", "role": "assistant", "model": job.model,
        "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage,
    })
}

fn tool_use(call: &ToolCall) -> Value {
    let input: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
    json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": input })
}

fn stop_reason(job: &JobView, calls: &[ToolCall]) -> &'static str {
    if !calls.is_empty() {
        return "tool_use";
    }
    match job.finish_reason.as_deref() {
        Some("length") => "max_tokens",
        Some("stop") => "stop_sequence",
        _ => "end_turn",
    }
}

/// The open content block of a stream, by kind.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

type Events = Vec<(&'static str, Value)>;

/// The stream's content blocks: the index of the next, and the open one.
#[derive(Default)]
struct StreamBlocks {
    index: usize,
    open: Option<Block>,
}

impl StreamBlocks {
    /// Opens a thinking or text block unless one of `kind` is open (closing
    /// another kind); its index.
    fn enter(&mut self, kind: Block, out: &mut Events) -> usize {
        if self.open != Some(kind) {
            self.close(out);
            let block = if kind == Block::Thinking {
                json!({ "type": "thinking", "thinking": "", "signature": "" })
            } else {
                json!({ "type": "text", "text": "" })
            };
            out.push(("content_block_start", json!({ "type": "content_block_start", "index": self.index, "content_block": block })));
            self.open = Some(kind);
        }
        self.index
    }

    fn close(&mut self, out: &mut Events) {
        if self.open.take().is_some() {
            out.push((
                "content_block_stop",
                json!({ "type": "content_block_stop", "index": self.index }),
            ));
            self.index += 1;
        }
    }

    /// Opens a tool_use block for a call being written (closing the block
    /// before it); its input follows in `input_json_delta`s.
    fn call(&mut self, id: &str, name: &str, out: &mut Events) {
        self.close(out);
        let block = json!({ "type": "tool_use", "id": id, "name": name, "input": {} });
        out.push((
            "content_block_start",
            json!({ "type": "content_block_start", "index": self.index, "content_block": block }),
        ));
        self.open = Some(Block::ToolUse);
    }
}

fn text_delta(i: usize, text: String) -> (&'static str, Value) {
    (
        "content_block_delta",
        json!({ "type": "content_block_delta", "index": i, "delta": { "type": "text_delta", "text": text } }),
    )
}

/// Anthropic's event stream: `message_start`, blocks opened, filled and
/// closed in order, `message_delta` with the stop and usage, `message_stop`.
fn stream(
    app: AppState,
    job: JobView,
    mut updates: tokio::sync::mpsc::Receiver<Update>,
) -> Sse<impl tokio_stream::Stream<Item = std::result::Result<SseEvent, Infallible>>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::result::Result<SseEvent, Infallible>>(64);
    let stopping = app.clone();
    tokio::spawn(async move {
        let event =
            |name: &str, data: Value| Ok(SseEvent::default().event(name).data(data.to_string()));
        let start = json!({ "type": "message_start", "message": message_head(&job, usage(&job)) });
        if tx.send(event("message_start", start)).await.is_err() {
            return;
        }
        let mut blocks = StreamBlocks::default();
        while let Some(update) = updates.recv().await {
            let mut out = Events::new();
            match update {
                Update::Prompt { done, total } => {
                    if tx.send(Ok(prompt_comment(done, total))).await.is_err() {
                        return;
                    }
                    continue;
                }
                Update::Reasoning(t) => {
                    let i = blocks.enter(Block::Thinking, &mut out);
                    out.push(("content_block_delta", json!({ "type": "content_block_delta", "index": i, "delta": { "type": "thinking_delta", "thinking": t } })));
                }
                Update::Text(t) => {
                    let i = blocks.enter(Block::Text, &mut out);
                    out.push(text_delta(i, t));
                }
                Update::Failed(e) => {
                    let error = json!({ "type": "error", "error": { "type": "api_error", "message": e.message } });
                    let _ = tx.send(event("error", error)).await;
                    return;
                }
                Update::Call { id, name, .. } => blocks.call(&id, &name, &mut out),
                Update::Arguments { fragment, .. } if blocks.open == Some(Block::ToolUse) => {
                    out.push(("content_block_delta", json!({ "type": "content_block_delta", "index": blocks.index, "delta": { "type": "input_json_delta", "partial_json": fragment } })));
                }
                Update::Arguments { .. } => {}
                Update::Done { job: done, calls } => {
                    blocks.close(&mut out);
                    out.push(("message_delta", json!({ "type": "message_delta",
                        "delta": { "stop_reason": stop_reason(&done, &calls), "stop_sequence": null },
                        "usage": usage(&done) })));
                    out.push(("message_stop", json!({ "type": "message_stop" })));
                }
            }
            for (name, data) in out {
                if tx.send(event(name, data)).await.is_err() {
                    return;
                }
            }
        }
    });
    let rx = tokio_stream::wrappers::ReceiverStream::new(rx);
    Sse::new(stopping.until_stopping(rx)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
