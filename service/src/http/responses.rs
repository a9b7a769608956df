//! OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`),
//! which Codex CLI and newer OpenAI clients speak. A response is a job in
//! the durable queue (`resp_N` is job N), admitted as every other: input
//! items become the conversation the model's template reads (function calls
//! the assistant's `tool_calls`, their outputs `tool` messages), and
//! `previous_response_id` continues a stored response's conversation with
//! its answer. A client that goes away fetches the answer later by id; a
//! service killed mid-answer resumes it exactly, like any job.

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use longhaul_engine::{ToolAnswer, ToolCall};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::admission::{Ask, Submitted, submit};
use super::content::text_of;
use super::error::{ApiError, ApiResult};
use super::follow::{KEEP_ALIVE, Update, follow, prompt_comment};
use super::jobs::{SettingsBody, check_input, model_sampling};
use super::tool_calls::{Offer, Offered, by_choice, refuse_other};
use super::{ApiJson, ApiPath, AppState};
use crate::queue::{Input, JobState, JobView, Message};

/// Fields that are accepted and mean nothing to generation here.
const INERT_FIELDS: &[&str] = &[
    "metadata",
    "user",
    "store",
    "parallel_tool_calls",
    "truncation",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "include",
    "stream_options",
];
const ID_PREFIX: &str = "resp_";

#[derive(Debug, Deserialize)]
pub struct ResponsesBody {
    model: String,
    input: Value,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    previous_response_id: Option<String>,
    #[serde(default)]
    stream: bool,
    max_output_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    reasoning: Option<Value>,
    text: Option<Value>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

fn bad(message: String) -> ApiError {
    ApiError::bad_param("input", message)
}

/// A message item's text: a string, or its text parts joined.
fn item_text(content: Option<&Value>, at: &str) -> ApiResult<String> {
    text_of(content, &["input_text", "output_text", "text"], "input", at)
}

/// Input items appended to `out` as the template's messages.
fn read_items(input: Value, out: &mut Vec<Message>) -> ApiResult<()> {
    let items = match input {
        Value::String(s) => {
            out.push(Message::user(s));
            return Ok(());
        }
        Value::Array(items) => items,
        other => {
            return Err(bad(format!(
                "input must be a string or a list of items, not {other}"
            )));
        }
    };
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                out.push(Message::new(role, item_text(item.get("content"), &at)?));
            }
            "function_call" => {
                let call = json!({
                    "id": item.get("call_id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {
                        "name": item.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": arguments_object(item.get("arguments"), &at)?,
                    },
                });
                // Calls after an assistant message belong to its turn.
                match out.last_mut() {
                    Some(m) if m.role == "assistant" => {
                        let calls = m.extra.entry("tool_calls").or_insert_with(|| json!([]));
                        if let Value::Array(calls) = calls {
                            calls.push(call);
                        }
                    }
                    _ => {
                        let mut m = Message::new("assistant", "");
                        m.extra.insert("tool_calls".into(), json!([call]));
                        out.push(m);
                    }
                }
            }
            "function_call_output" => {
                let mut m = Message::new("tool", item_text(item.get("output"), &at)?);
                let id = item.get("call_id").cloned().unwrap_or(Value::Null);
                m.extra.insert("tool_call_id".into(), id);
                out.push(m);
            }
            // The model's earlier thinking is not read back by the templates.
            "reasoning" => {}
            other => {
                return Err(bad(format!(
                    "{at}: an item of type `{other}` is not supported; Longhaul reads message, function_call, function_call_output and reasoning items"
                )));
            }
        }
    }
    Ok(())
}

fn arguments_object(arguments: Option<&Value>, at: &str) -> ApiResult<Value> {
    match arguments {
        Some(Value::String(t)) if t.trim().is_empty() => Ok(json!({})),
        Some(Value::String(t)) => {
            serde_json::from_str(t).map_err(|e| bad(format!("{at}: arguments are not JSON: {e}")))
        }
        Some(v) => Ok(v.clone()),
        None => Ok(json!({})),
    }
}

/// Job number of a `resp_N` id.
fn job_id(id: &str, param: &str) -> ApiResult<i64> {
    id.strip_prefix(ID_PREFIX)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ApiError::bad_param(param, format!("`{id}` is not a response id (resp_N)")))
}

/// The conversation of a stored response, its answer last.
async fn earlier(app: &AppState, id: &str) -> ApiResult<Vec<Message>> {
    let n = job_id(id, "previous_response_id")?;
    let job = app.blocking(move |q| q.job(n)).await.map_err(|_| {
        ApiError::bad_param(
            "previous_response_id",
            format!("Previous response with id '{id}' not found."),
        )
    })?;
    if !job.state.is_final() {
        return Err(ApiError::conflict(format!(
            "response {id} is still {}",
            job.state.as_str()
        )));
    }
    let Input::Messages(mut messages) = job.request.input.clone() else {
        return Err(ApiError::bad_param(
            "previous_response_id",
            format!("{id} was not a conversation"),
        ));
    };
    let answer = read_answer(app, &job).await;
    let mut reply = Message::new("assistant", answer.content);
    if !answer.calls.is_empty() {
        let calls: Vec<Value> = answer
            .calls
            .iter()
            .map(|c| json!({ "id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| json!({})) } }))
            .collect();
        reply.extra.insert("tool_calls".into(), Value::Array(calls));
    }
    messages.push(reply);
    Ok(messages)
}

/// A job's answer read for calls to the tools it was offered.
async fn read_answer(app: &AppState, job: &JobView) -> ToolAnswer {
    let tools = &job.request.tools;
    // Jobs admitted before the format was kept on them: the model's now.
    let format = match job.request.tool_format {
        Some(format) => Some(format),
        None if !tools.is_empty() => app
            .model_facts(&job.model, true)
            .await
            .ok()
            .and_then(|(_, known)| known.tool_format()),
        None => None,
    };
    read(Offered::new(format, tools, job.id).as_ref(), job)
}

fn refuse_unsupported(body: &ResponsesBody) -> ApiResult<()> {
    refuse_other(&body.other, INERT_FIELDS)?;
    let format = body
        .text
        .as_ref()
        .and_then(|t| t.pointer("/format/type"))
        .and_then(Value::as_str);
    if format.is_some_and(|f| f != "text") {
        return Err(ApiError::bad_param(
            "text",
            "text.format other than text needs sampling constrained to a grammar, which Longhaul does not do",
        ));
    }
    Ok(())
}

/// Flat function tools as the chat template's `tools`, as `tool_choice` leaves them.
fn offered_tools(tools: Option<Vec<Value>>, choice: Option<&Value>) -> ApiResult<Offer> {
    let tools: Vec<Value> = tools
        .unwrap_or_default()
        .into_iter()
        .map(|t| match t.get("type").and_then(Value::as_str) {
            Some("function") => Ok(json!({ "type": "function", "function": {
                "name": t.get("name").cloned().unwrap_or(Value::Null),
                "description": t.get("description").cloned().unwrap_or(Value::Null),
                "parameters": t.get("parameters").cloned().unwrap_or_else(|| json!({ "type": "object" })),
            }})),
            other => Err(ApiError::bad_param(
                "tools",
                format!("a tool of type `{}`; Longhaul offers function tools", other.unwrap_or("(none)")),
            )),
        })
        .collect::<ApiResult<_>>()?;
    by_choice(tools, choice)
}

/// `POST /v1/responses`.
pub async fn create(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<ResponsesBody>,
) -> ApiResult<Response> {
    refuse_unsupported(&body)?;
    let offer = offered_tools(body.tools, body.tool_choice.as_ref())?;
    let mut messages = match &body.previous_response_id {
        Some(id) => earlier(&app, id).await?,
        None => Vec::new(),
    };
    if let Some(instructions) = body.instructions {
        // New instructions replace a stored response's.
        if messages.first().is_some_and(|m| m.role == "system") {
            messages.remove(0);
        }
        messages.insert(0, Message::new("system", instructions));
    }
    read_items(body.input, &mut messages)?;
    let (input, _) = check_input(None, Some(messages))?;
    let settings = SettingsBody {
        max_tokens: body.max_output_tokens,
        temperature: body.temperature,
        top_p: body.top_p,
        ..SettingsBody::default()
    }
    .into_settings(model_sampling(&app, &body.model).await)?;
    let mut chat_args = Map::new();
    if let Some(effort) = body
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .filter(|e| e.is_string())
    {
        chat_args.insert("reasoning_effort".into(), effort.clone());
    }
    let ask = Ask {
        explicit_max_tokens: body.max_output_tokens.is_some(),
        chat_args,
        tools: offer.tools,
        forced_call: offer.forced,
        ..Ask::api(body.model, input, settings, "OpenAI response", "openai")
    };
    let Submitted {
        job,
        mut events,
        offered,
    } = submit(&app, ask).await?;
    let context = Echo {
        previous: body.previous_response_id,
    };
    if body.stream {
        let updates = follow(app.clone(), job.id, events, offered.clone());
        return Ok(stream(app, job, context, offered, updates).into_response());
    }
    let done = super::follow::wait_done(&app, job.id, &mut events).await?;
    Ok(Json(response(&done, &read(offered.as_ref(), &done), &context)).into_response())
}

/// `GET /v1/responses/{id}`: the response as it stands, finished or not.
pub async fn retrieve(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let n = job_id(&id, "id")?;
    let job = app.blocking(move |q| q.job(n)).await?;
    let answer = read_answer(&app, &job).await;
    Ok(Json(response(&job, &answer, &Echo { previous: None })))
}

/// What a response object repeats of its request.
struct Echo {
    previous: Option<String>,
}

fn status(job: &JobView) -> &'static str {
    match job.state {
        JobState::Queued => "queued",
        JobState::Done if job.finish_reason.as_deref() == Some("length") => "incomplete",
        JobState::Done => "completed",
        JobState::Failed => "failed",
        JobState::Cancelled => "cancelled",
        _ => "in_progress",
    }
}

fn reasoning_item(job: &JobView, text: &str) -> Value {
    json!({ "type": "reasoning", "id": format!("rs_{}", job.id), "summary": [],
            "content": [{ "type": "reasoning_text", "text": text }], "status": "completed" })
}

fn message_item(job: &JobView, text: &str, status: &str) -> Value {
    json!({ "type": "message", "id": format!("msg_{}", job.id), "role": "assistant", "status": status,
            "content": [{ "type": "output_text", "text": text, "annotations": [] }] })
}

/// The id of call `i`'s item in job `job`'s output.
fn call_item_id(job: &JobView, i: usize) -> String {
    format!("fc_{}_{i}", job.id)
}

fn call_item(job: &JobView, i: usize, call: &ToolCall, status: &str) -> Value {
    json!({ "type": "function_call", "id": call_item_id(job, i), "call_id": call.id,
            "name": call.name, "arguments": call.arguments, "status": status })
}

/// The Response object of job `job` with its answer read.
fn response(job: &JobView, answer: &ToolAnswer, echo: &Echo) -> Value {
    let mut output = Vec::new();
    if let Some(r) = job.reasoning.as_deref().filter(|r| !r.is_empty()) {
        output.push(reasoning_item(job, r));
    }
    if !answer.content.is_empty() {
        output.push(message_item(job, &answer.content, "completed"));
    }
    output.extend(
        answer
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| call_item(job, i, c, "completed")),
    );
    let prompt = job.stats.as_ref().map_or(0, |s| s.prompt_tokens);
    let s = &job.request.settings;
    let error = super::follow::ended_badly(job)
        .filter(|_| job.state == JobState::Failed)
        .map(|e| json!({ "code": "server_error", "message": e.message }));
    json!({
        "id": format!("{ID_PREFIX}{}", job.id), "object": "response",
        "created_at": job.created_ms / 1000, "status": status(job), "model": job.model,
        "output": output, "error": error,
        "incomplete_details": (status(job) == "incomplete").then(|| json!({ "reason": "max_output_tokens" })),
        "previous_response_id": echo.previous, "parallel_tool_calls": true, "tool_choice": "auto",
        "tools": job.request.tools.iter().map(|t| {
            let f = t.get("function").unwrap_or(t);
            json!({ "type": "function", "name": f.get("name"), "description": f.get("description"),
                    "parameters": f.get("parameters"), "strict": false })
        }).collect::<Vec<_>>(),
        "temperature": s.temperature, "top_p": s.top_p, "max_output_tokens": s.max_tokens,
        "usage": {
            "input_tokens": prompt, "input_tokens_details": { "cached_tokens": 0 },
            "output_tokens": job.tokens, "output_tokens_details": { "reasoning_tokens": 0 },
            "total_tokens": prompt + job.tokens,
        },
    })
}

/// The item being written in a stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Item {
    Reasoning,
    Message,
}

/// Builds a stream's events with their sequence numbers.
struct Events {
    job: JobView,
    seq: u64,
    index: usize,
    /// The open text item and its text so far.
    open: Option<(Item, String)>,
    /// The open function call (its place among the calls) and its
    /// arguments so far; at most one of it and `open` is set.
    open_call: Option<(usize, ToolCall)>,
    out: Vec<Value>,
}

impl Events {
    fn push(&mut self, mut event: Value) {
        event["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.out.push(event);
    }

    fn part(kind: Item, text: &str) -> Value {
        match kind {
            Item::Reasoning => json!({ "type": "reasoning_text", "text": text }),
            Item::Message => json!({ "type": "output_text", "text": text, "annotations": [] }),
        }
    }

    /// Opens an item of `kind` unless one is open (closing another kind).
    fn enter(&mut self, kind: Item) {
        if self.open.as_ref().is_some_and(|(k, _)| *k == kind) {
            return;
        }
        self.close();
        let item = match kind {
            Item::Reasoning => {
                json!({ "type": "reasoning", "id": format!("rs_{}", self.job.id), "summary": [], "content": [], "status": "in_progress" })
            }
            Item::Message => {
                json!({ "type": "message", "id": format!("msg_{}", self.job.id), "role": "assistant", "status": "in_progress", "content": [] })
            }
        };
        let id = item["id"].clone();
        self.push(json!({ "type": "response.output_item.added", "output_index": self.index, "item": item }));
        self.push(json!({ "type": "response.content_part.added", "item_id": id, "output_index": self.index, "content_index": 0, "part": Self::part(kind, "") }));
        self.open = Some((kind, String::new()));
    }

    fn delta(&mut self, kind: Item, text: &str) {
        self.enter(kind);
        if let Some((_, whole)) = &mut self.open {
            whole.push_str(text);
        }
        let (name, id) = match kind {
            Item::Reasoning => (
                "response.reasoning_text.delta",
                format!("rs_{}", self.job.id),
            ),
            Item::Message => ("response.output_text.delta", format!("msg_{}", self.job.id)),
        };
        self.push(json!({ "type": name, "item_id": id, "output_index": self.index, "content_index": 0, "delta": text, "logprobs": [] }));
    }

    fn close(&mut self) {
        self.close_call();
        let Some((kind, text)) = self.open.take() else {
            return;
        };
        let i = self.index;
        let (done, id, item) = match kind {
            Item::Reasoning => (
                "response.reasoning_text.done",
                format!("rs_{}", self.job.id),
                reasoning_item(&self.job, &text),
            ),
            Item::Message => (
                "response.output_text.done",
                format!("msg_{}", self.job.id),
                message_item(&self.job, &text, "completed"),
            ),
        };
        self.push(json!({ "type": done, "item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": [] }));
        self.push(json!({ "type": "response.content_part.done", "item_id": id, "output_index": i, "content_index": 0, "part": Self::part(kind, &text) }));
        self.push(json!({ "type": "response.output_item.done", "output_index": i, "item": item }));
        self.index += 1;
    }

    /// Opens a function_call item for call `n` being written.
    fn call(&mut self, n: usize, id: String, name: String) {
        self.close();
        let call = ToolCall {
            id,
            name,
            arguments: String::new(),
        };
        let item = call_item(&self.job, n, &call, "in_progress");
        self.push(json!({ "type": "response.output_item.added", "output_index": self.index, "item": item }));
        self.open_call = Some((n, call));
    }

    fn arguments(&mut self, fragment: &str) {
        let Some((n, call)) = &mut self.open_call else {
            return;
        };
        call.arguments.push_str(fragment);
        let id = call_item_id(&self.job, *n);
        let event = json!({ "type": "response.function_call_arguments.delta", "item_id": id, "output_index": self.index, "delta": fragment });
        self.push(event);
    }

    fn close_call(&mut self) {
        let Some((n, call)) = self.open_call.take() else {
            return;
        };
        let i = self.index;
        let id = call_item_id(&self.job, n);
        self.push(json!({ "type": "response.function_call_arguments.done", "item_id": id, "output_index": i, "arguments": call.arguments, "name": call.name }));
        self.push(json!({ "type": "response.output_item.done", "output_index": i, "item": call_item(&self.job, n, &call, "completed") }));
        self.index += 1;
    }
}

/// The Responses event stream: `response.created`, items added, filled and
/// done in order, then `response.completed` (or `incomplete`, `failed`).
fn stream(
    app: AppState,
    job: JobView,
    echo: Echo,
    offered: Option<Offered>,
    mut updates: tokio::sync::mpsc::Receiver<Update>,
) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    let stopping = app.clone();
    tokio::spawn(async move {
        let start = response(&job, &ToolAnswer::default(), &echo);
        let mut events = Events {
            job,
            seq: 0,
            index: 0,
            open: None,
            open_call: None,
            out: Vec::new(),
        };
        events.push(json!({ "type": "response.created", "response": dict_with(&start, "status", "in_progress") }));
        events.push(json!({ "type": "response.in_progress", "response": dict_with(&start, "status", "in_progress") }));
        let mut ended = false;
        loop {
            for e in std::mem::take(&mut events.out) {
                let name = e["type"].as_str().unwrap_or("message").to_string();
                if tx
                    .send(Ok(SseEvent::default().event(name).data(e.to_string())))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if ended {
                return;
            }
            let Some(update) = updates.recv().await else {
                return;
            };
            match update {
                Update::Prompt { done, total } => {
                    if tx.send(Ok(prompt_comment(done, total))).await.is_err() {
                        return;
                    }
                    continue;
                }
                Update::Reasoning(t) => events.delta(Item::Reasoning, &t),
                Update::Text(t) => events.delta(Item::Message, &t),
                Update::Failed(e) => {
                    let mut failed = dict_with(&start, "status", "failed");
                    failed["error"] = json!({ "code": "server_error", "message": e.message });
                    events.push(json!({ "type": "response.failed", "response": failed }));
                    ended = true;
                }
                Update::Call { index, id, name } => events.call(index, id, name),
                Update::Arguments { fragment, .. } => events.arguments(&fragment),
                Update::Done { job, .. } => {
                    events.close();
                    let whole = response(&job, &read(offered.as_ref(), &job), &echo);
                    let kind = if whole["status"] == "incomplete" {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    events.push(json!({ "type": kind, "response": whole }));
                    ended = true;
                }
            }
        }
    });
    let rx = tokio_stream::wrappers::ReceiverStream::new(rx);
    Sse::new(stopping.until_stopping(rx)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// A finished job's answer read for the tools it was offered.
fn read(offered: Option<&Offered>, job: &JobView) -> ToolAnswer {
    let output = job.output.clone().unwrap_or_default();
    match offered {
        Some(o) => o.read(&output),
        None => ToolAnswer {
            content: output,
            calls: Vec::new(),
        },
    }
}

fn dict_with(v: &Value, key: &str, value: &str) -> Value {
    let mut v = v.clone();
    v[key] = json!(value);
    v
}
