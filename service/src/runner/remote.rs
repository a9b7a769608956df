//! Running jobs on a remote OpenAI-compatible server (vLLM, SGLang, a
//! llama.cpp server, another Longhaul service): same queue, same committed
//! output, same resume. A plain-prompt job continues from its committed text
//! (the text is appended to the prompt of `/v1/completions`); a chat answer
//! cannot be continued from part of it through the OpenAI API, so such a job
//! starts over and its log says so.

use std::io::BufRead;
use std::time::Duration;

use longhaul_engine::{Flow, Phase};
use serde_json::{Value, json};

use super::{Outcome, Produced, RunError, Sink, Usage};
use crate::queue::{Input, Runnable};

/// How long connecting and waiting for the response headers may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);

pub struct RemoteBackend<'a> {
    pub url: &'a str,
    pub api_key: Option<&'a str>,
    pub remote_model: &'a str,
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
        let reader = std::io::BufReader::new(response.into_body().into_reader());
        let mut finish = "length";
        let mut remote_id = None;
        let mut reported = None;
        let mut prompt_tokens = 0;
        for line in reader.lines() {
            let line = line.map_err(|e| RunError::Fault(format!("remote stream broke: {e}")))?;
            let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                continue;
            };
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
                return Ok(Outcome {
                    finish_reason: "stopped",
                    prompt_tokens: 0,
                    usage: Usage::default(),
                    reported_tokens: None,
                    state_refused: None,
                    prefix_reused: (0, 0),
                    prefix_refused: None,
                    speculation: None,
                });
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
