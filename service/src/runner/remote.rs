//! Running jobs on a remote OpenAI-compatible server (vLLM, SGLang, a
//! llama.cpp server, another Longhaul service): same queue, same committed
//! output, same resume. A plain-prompt job continues from its committed text
//! (the text is appended to the prompt of `/v1/completions`); a chat answer
//! cannot be continued from part of it through the OpenAI API, so such a job
//! starts over and its log says so.
//!
//! The stream is read on a thread of its own and handed over line by line,
//! so the runner keeps its cancellation points while it waits: a server
//! that sent only keep-alive comments (or a remote URL naming this very
//! service) once held the runner for good, and cancel answered `cancelled`
//! while every later job stayed queued. Progress is a `data:` chunk; a
//! stream of nothing but keep-alive comments for [`STALL_LIMIT`] is a
//! fault, which pauses the job for a retry.

use std::io::BufRead;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use longhaul_engine::{Flow, Phase};
use serde_json::{Value, json};

use super::{Outcome, Produced, RunError, Sink, Usage};
use crate::queue::{Input, Runnable};

/// How long connecting and waiting for the response headers may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a stream may go without progress: a big model's server may
/// read a long prompt for minutes, sending only keep-alives meanwhile.
const STALL_LIMIT: Duration = Duration::from_secs(900);
/// How often the runner looks whether it should stop while it waits.
const STOP_POLL: Duration = Duration::from_millis(100);
/// Lines the reader holds for the runner.
const LINES_BUFFERED: usize = 256;

pub struct RemoteBackend<'a> {
    pub url: &'a str,
    pub api_key: Option<&'a str>,
    pub remote_model: &'a str,
    /// Whether the runner should stop (cancel, pause, shutdown).
    pub stop: &'a dyn Fn() -> bool,
}

/// What the reader hands over: a line, or how the stream ended.
enum Read {
    Line(String),
    Broke(String),
}

/// The outcome of a job stopped before its end.
fn stopped() -> Outcome {
    Outcome {
        finish_reason: "stopped",
        prompt_tokens: 0,
        usage: Usage::default(),
        reported_tokens: None,
        state_refused: None,
        prefix_reused: (0, 0),
        prefix_refused: None,
        speculation: None,
    }
}

/// Reads `body`'s lines on a thread of its own. The thread ends with the
/// stream, or at the next line once the runner has stopped listening.
fn read_lines(body: impl std::io::Read + Send + 'static) -> Result<mpsc::Receiver<Read>, RunError> {
    let (tx, rx) = mpsc::sync_channel(LINES_BUFFERED);
    std::thread::Builder::new()
        .name("remote-stream".into())
        .spawn(move || {
            for line in std::io::BufReader::new(body).lines() {
                let read = line.map_or_else(|e| Read::Broke(e.to_string()), Read::Line);
                let broke = matches!(read, Read::Broke(_));
                if tx.send(read).is_err() || broke {
                    return;
                }
            }
        })
        .map_err(|e| {
            RunError::Fault(format!(
                "cannot start a thread to read the remote stream: {e}"
            ))
        })?;
    Ok(rx)
}

/// Whether a job with this input can continue from committed text remotely.
pub fn can_continue(input: &Input) -> bool {
    matches!(input, Input::Prompt(_))
}

impl RemoteBackend<'_> {
    fn agent(&self) -> ureq::Agent {
        ureq::Agent::config_builder()
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_response(Some(RESPONSE_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into()
    }

    fn post(&self, path: &str, body: &Value) -> Result<ureq::http::Response<ureq::Body>, RunError> {
        let mut request = self.agent().post(format!("{}{path}", self.url));
        if let Some(key) = self.api_key {
            request = request.header("Authorization", &format!("Bearer {key}"));
        }
        request
            .send_json(body)
            // The server may be restarting or asleep: pause, do not fail.
            .map_err(|e| RunError::Fault(format!("remote server {} unreachable: {e}", self.url)))
    }

    /// Generates the rest of `job`'s answer on the remote server.
    pub fn run(&self, job: &Runnable, sink: &mut Sink<'_>) -> Result<Outcome, RunError> {
        let r = &job.request;
        let s = &r.settings;
        let remaining = s.max_tokens.saturating_sub(job.committed_count);
        let mut body = json!({
            "model": self.remote_model,
            "max_tokens": remaining.max(1),
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": s.seed,
            "stream": true,
            "stream_options": { "include_usage": true },
        });
        if !s.stop.is_empty() {
            body["stop"] = json!(s.stop);
        }
        if let Some(k) = s.top_k {
            body["top_k"] = json!(k);
        }
        let path = match &r.input {
            Input::Prompt(p) => {
                body["prompt"] = json!(format!("{}{p}{}", r.attachments, job.committed_text));
                "/v1/completions"
            }
            Input::Messages(messages) => {
                let mut m: Vec<Value> = messages
                    .iter()
                    .map(|m| json!({ "role": m.role, "content": m.content }))
                    .collect();
                if let Some(first) = m.iter_mut().find(|m| m["role"] == "user") {
                    let content = first["content"].as_str().unwrap_or("").to_string();
                    first["content"] = json!(format!("{}{content}", r.attachments));
                }
                body["messages"] = json!(m);
                if !r.chat_args.is_empty() {
                    body["chat_template_kwargs"] = Value::Object(r.chat_args.clone());
                }
                "/v1/chat/completions"
            }
        };
        let response = self.post(path, &body)?;
        let status = response.status().as_u16();
        if status >= 400 {
            let text = response.into_body().read_to_string().unwrap_or_default();
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            let error = format!(
                "remote server {} refused the job (HTTP {status}): {message}",
                self.url
            );
            return Err(if status >= 500 || status == 429 {
                RunError::Fault(error)
            } else {
                RunError::Failed(error)
            });
        }
        let lines = read_lines(response.into_body().into_reader())?;
        let stall = crate::faults::remote_stall().unwrap_or(STALL_LIMIT);
        let mut progress = Instant::now();
        let mut finish = "length";
        let mut remote_id = None;
        let mut reported = None;
        let mut prompt_tokens = 0;
        loop {
            if (self.stop)() {
                self.cancel_remote(remote_id.as_deref());
                return Ok(stopped());
            }
            if progress.elapsed() > stall {
                self.cancel_remote(remote_id.as_deref());
                return Err(RunError::Fault(format!(
                    "remote server {} sent nothing but keep-alives for {} s",
                    self.url,
                    stall.as_secs()
                )));
            }
            let line = match lines.recv_timeout(STOP_POLL) {
                Ok(Read::Line(line)) => line,
                Ok(Read::Broke(e)) => {
                    return Err(RunError::Fault(format!("remote stream broke: {e}")));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                continue;
            };
            progress = Instant::now();
            if data == "[DONE]" {
                break;
            }
            let v: Value = serde_json::from_str(data).map_err(|e| {
                RunError::Failed(format!("remote server sent an unreadable chunk: {e}"))
            })?;
            if let Some(err) = v.get("error") {
                return Err(RunError::Failed(format!(
                    "remote server: {}",
                    err["message"].as_str().unwrap_or("unknown error")
                )));
            }
            remote_id = remote_id.or_else(|| v["id"].as_str().map(str::to_string));
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                reported = Some(n as usize);
                prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
            }
            let choice = &v["choices"][0];
            let text = choice["text"]
                .as_str()
                .or(choice["delta"]["content"].as_str())
                .unwrap_or("");
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = if f == "length" { "length" } else { "stop" };
            }
            if text.is_empty() {
                continue;
            }
            // Servers stream about one token per chunk.
            let flow = sink(Produced {
                phase: Phase::Answer,
                tokens: &[],
                count: 1,
                text,
                reasoning: "",
                state: None,
                usage: None,
                speculation: None,
            });
            if flow == Flow::Stop {
                self.cancel_remote(remote_id.as_deref());
                return Ok(stopped());
            }
        }
        Ok(Outcome {
            finish_reason: finish,
            prompt_tokens,
            usage: Usage::default(),
            reported_tokens: reported,
            state_refused: None,
            prefix_reused: (0, 0),
            prefix_refused: None,
            speculation: None,
        })
    }

    /// When the remote is a Longhaul service, its job is cancelled too rather
    /// than left running for nobody (other servers stop when the stream closes).
    fn cancel_remote(&self, id: Option<&str>) {
        let Some(n) = id
            .and_then(|id| id.rsplit('-').next())
            .and_then(|n| n.parse::<i64>().ok())
        else {
            return;
        };
        let _ = self.post(&format!("/api/jobs/{n}/cancel"), &json!({}));
    }
}
