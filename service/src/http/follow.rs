//! Following a job as it answers, for every streaming API. Progress events
//! carry text as it is produced; when one does not line up with what was
//! received (a missed event, or text regenerated after a pause) the
//! committed output is read and only what is new goes on. With tools
//! offered, the answer's text goes on only up to where a call could open;
//! then each call goes on as it is written — its id and name once whole,
//! its arguments in fragments (the engine's `ToolFormat::partial` keeps
//! every fragment a piece of the final arguments) — and what the whole
//! answer adds at the end. While the prompt is read, how far it has come
//! goes out every few seconds. Each API turns the [`Update`]s into its own
//! events.

use std::time::Duration;

use longhaul_engine::{ToolAnswer, ToolCall};
use tokio::sync::{broadcast, mpsc};

use super::AppState;
use super::error::ApiError;
use super::tool_calls::{CallReader, Offered};
use crate::events::Event;
use crate::queue::{JobState, JobView};

/// How often a stream says it is alive while nothing else is sent (the
/// prompt being read, drives being waited on): well inside the 60 s and
/// 600 s timeouts agent clients give up after.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// How often a follower re-reads its job when no event arrives.
pub const POLL: Duration = Duration::from_millis(500);
/// Updates a follower holds for a slow client before it waits for it.
const UPDATES_BUFFERED: usize = 64;
/// How often a stream says how far the prompt has been read: a client
/// that shows it sees it move, and it keeps the stream alive as well.
pub const PROMPT_REPORT: Duration = Duration::from_secs(5);

/// What a streamed answer says next.
pub enum Update {
    /// How far the prompt has been read: `done` of `total` positions.
    Prompt { done: usize, total: usize },
    /// More of the model's thinking.
    Reasoning(String),
    /// More of the answer's text.
    Text(String),
    /// A tool call begins: its place among the answer's calls, id and name.
    /// The call before it, if any, is whole.
    Call {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments.
    Arguments { index: usize, fragment: String },
    /// The end, with the finished job and its calls read whole: every one
    /// of them was begun and filled by the updates before.
    Done {
        job: Box<JobView>,
        calls: Vec<ToolCall>,
    },
    /// The job failed or was cancelled.
    Failed(ApiError),
}

/// The job's end as an error, when it did not finish.
pub fn ended_badly(job: &JobView) -> Option<ApiError> {
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

/// Waits for job `id` to end, reading it again on every event about it.
pub async fn wait_done(
    app: &AppState,
    id: i64,
    rx: &mut broadcast::Receiver<Event>,
) -> Result<JobView, ApiError> {
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

/// Which part of the answer a piece of text belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Answer,
    Reasoning,
}

/// What an event's text adds to what was received of one part.
enum CatchUp {
    Fresh(String),
    Nothing,
    /// The event begins past what was received: some text was missed.
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

/// What has been received of each part and shown of the answer.
#[derive(Default)]
struct Received {
    answer: String,
    reasoning: String,
    shown: usize,
    /// Reads the answer for calls, when tools were offered.
    calls: Option<CallReader>,
    /// The calls sent so far, with the arguments sent of each.
    sent: Vec<ToolCall>,
}

impl Received {
    fn of(&self, part: Part) -> &str {
        match part {
            Part::Answer => &self.answer,
            Part::Reasoning => &self.reasoning,
        }
    }

    /// Takes in `fresh` text of `part`; returns what can go on now.
    fn take(&mut self, part: Part, fresh: &str) -> Vec<Update> {
        if part == Part::Reasoning {
            self.reasoning.push_str(fresh);
            return vec![Update::Reasoning(fresh.to_string())];
        }
        self.answer.push_str(fresh);
        let Some(reader) = &mut self.calls else {
            self.shown = self.answer.len();
            return vec![Update::Text(fresh.to_string())];
        };
        let read = reader.read(&self.answer);
        let mut out: Vec<Update> = self
            .answer
            .get(self.shown..read.shown)
            .filter(|t| !t.is_empty())
            .map(|t| Update::Text(t.to_string()))
            .into_iter()
            .collect();
        self.shown = self.shown.max(read.shown);
        out.extend(self.calls_grown(&read.calls));
        out
    }

    /// What `calls` (the calls read so far) add to those sent.
    fn calls_grown(&mut self, calls: &[ToolCall]) -> Vec<Update> {
        let mut out = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            if index == self.sent.len() {
                out.push(Update::Call {
                    index,
                    id: call.id.clone(),
                    name: call.name.clone(),
                });
                self.sent.push(ToolCall {
                    arguments: String::new(),
                    ..call.clone()
                });
            }
            let sent = &mut self.sent[index];
            if let Some(fragment) = call
                .arguments
                .strip_prefix(sent.arguments.as_str())
                .filter(|f| !f.is_empty())
            {
                out.push(Update::Arguments {
                    index,
                    fragment: fragment.to_string(),
                });
                sent.arguments.clone_from(&call.arguments);
            }
        }
        out
    }

    /// At the end: the answer's text not yet shown, what its calls add to
    /// those sent, and the calls whole.
    fn finish(&mut self) -> (Vec<Update>, Vec<ToolCall>) {
        let read = match &self.calls {
            Some(reader) => reader.offered.read(&self.answer),
            None => ToolAnswer {
                content: self.answer.clone(),
                calls: Vec::new(),
            },
        };
        let rest = read.content.get(self.shown..).unwrap_or_default();
        let mut out: Vec<Update> = (!rest.is_empty())
            .then(|| Update::Text(rest.to_string()))
            .into_iter()
            .collect();
        let differs = self.sent.iter().zip(&read.calls).any(|(sent, whole)| {
            sent.id != whole.id || !whole.arguments.starts_with(&sent.arguments)
        });
        if differs || self.sent.len() > read.calls.len() {
            tracing::warn!(
                "the calls streamed are not those the whole answer reads to; the whole answer's calls follow"
            );
        }
        out.extend(self.calls_grown(&read.calls));
        (out, read.calls)
    }
}

/// Follows job `id` (its events from `events`, subscribed before it was
/// queued) until it ends; the updates arrive on the returned channel, which
/// closes after `Done` or `Failed`, or when the client goes away.
pub fn follow(
    app: AppState,
    id: i64,
    mut events: broadcast::Receiver<Event>,
    offered: Option<Offered>,
) -> mpsc::Receiver<Update> {
    let (tx, rx) = mpsc::channel(UPDATES_BUFFERED);
    tokio::spawn(async move {
        let mut got = Received {
            calls: offered.map(CallReader::new),
            ..Received::default()
        };
        let mut reported: Option<std::time::Instant> = None;
        let report_every = crate::faults::prompt_report().unwrap_or(PROMPT_REPORT);
        loop {
            let event = tokio::time::timeout(POLL, events.recv()).await;
            let mut reread = matches!(event, Err(_) | Ok(Err(_)));
            if let Ok(Ok(Event::Job(p))) = &event
                && p.id == id
                && let Some(prompt) = &p.prompt
                && reported.is_none_or(|at| at.elapsed() >= report_every)
            {
                reported = Some(std::time::Instant::now());
                let update = Update::Prompt {
                    done: prompt.done,
                    total: prompt.total,
                };
                if tx.send(update).await.is_err() {
                    return;
                }
            }
            if let Ok(Ok(Event::Job(p))) = &event
                && p.id == id
                && let Some(offset) = p.offset
            {
                let reasoning_offset = p.reasoning_offset.unwrap_or(got.reasoning.len());
                for (part, offset, delta) in [
                    (Part::Reasoning, reasoning_offset, &p.reasoning_delta),
                    (Part::Answer, offset, &p.delta),
                ] {
                    match catch_up(got.of(part), offset, delta) {
                        CatchUp::Fresh(fresh) => {
                            if !send_all(&tx, got.take(part, &fresh)).await {
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
            for (part, whole) in [(Part::Reasoning, reasoning), (Part::Answer, output)] {
                let sent = got.of(part);
                if whole.len() > sent.len() && whole.starts_with(sent) {
                    let fresh = whole[sent.len()..].to_string();
                    if !send_all(&tx, got.take(part, &fresh)).await {
                        return;
                    }
                }
            }
            if !job.state.is_final() {
                continue;
            }
            let end = match ended_badly(&job) {
                Some(e) => vec![Update::Failed(e)],
                None => {
                    let (mut last, calls) = got.finish();
                    last.push(Update::Done {
                        job: Box::new(job),
                        calls,
                    });
                    last
                }
            };
            send_all(&tx, end).await;
            return;
        }
    });
    rx
}

/// Sends `updates` in order; false when the client has gone.
async fn send_all(tx: &mpsc::Sender<Update>, updates: Vec<Update>) -> bool {
    for u in updates {
        if tx.send(u).await.is_err() {
            return false;
        }
    }
    true
}

/// How far the prompt has been read, as an SSE comment: every protocol's
/// clients skip comments, and a person watching the stream sees it move.
pub fn prompt_comment(done: usize, total: usize) -> axum::response::sse::Event {
    axum::response::sse::Event::default().comment(format!("prompt: {done} of {total} tokens read"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_engine::ToolFormat;
    use serde_json::json;

    #[test]
    fn text_catches_up_from_where_it_was_received() {
        assert!(matches!(catch_up("abc", 2, "cde"), CatchUp::Fresh(f) if f == "de"));
        assert!(matches!(catch_up("abc", 0, "ab"), CatchUp::Nothing));
        assert!(matches!(catch_up("abc", 5, "x"), CatchUp::Gap));
    }

    #[test]
    fn with_tools_the_text_stops_where_a_call_opens_and_the_call_streams() {
        let mut got = Received {
            calls: Offered::new(
                Some(ToolFormat::Hermes),
                &[json!({ "type": "function", "function": { "name": "f" } })],
                3,
            )
            .map(CallReader::new),
            ..Received::default()
        };
        let mut said = |fresh: &str| -> Vec<String> {
            got.take(Part::Answer, fresh)
                .iter()
                .map(|u| match u {
                    Update::Text(t) => format!("text {t}"),
                    Update::Call { index, id, name } => format!("call {index} {id} {name}"),
                    Update::Arguments { index, fragment } => format!("args {index} {fragment}"),
                    _ => "other".into(),
                })
                .collect()
        };
        assert_eq!(said("Let me look <tool"), ["text Let me look "]);
        assert!(said("_call>{\"name\": \"f\", ").is_empty());
        assert_eq!(
            said("\"arguments\": {\"path\": \"src"),
            ["call 0 call_3_0 f", "args 0 {\"path\": \"src"]
        );
        assert_eq!(said("/a.rs\"}}"), ["args 0 /a.rs\""]);
        assert!(said("\n</tool_").is_empty());
        got.answer.push_str("call>");
        let (last, calls) = got.finish();
        assert!(matches!(&last[..], [Update::Arguments { index: 0, fragment }] if fragment == "}"));
        assert_eq!(calls[0].arguments, "{\"path\": \"src/a.rs\"}");
    }
}
