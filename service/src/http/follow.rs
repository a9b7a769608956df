//! Following a job as it answers, for every streaming API. Progress events
//! carry text as it is produced; when one does not line up with what was
//! received (a missed event, or text regenerated after a pause) the
//! committed output is read and only what is new goes on. With tools
//! offered, the answer's text goes on only up to where a call could open,
//! and the calls come at the end, whole. While the prompt is read, how far
//! it has come goes out every few seconds. Each API turns the [`Update`]s
//! into its own events.

use std::time::Duration;

use longhaul_engine::{ToolAnswer, ToolCall};
use tokio::sync::{broadcast, mpsc};

use super::AppState;
use super::error::ApiError;
use super::tool_calls::Offered;
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
    /// The end: the rest of the text and the calls, with the finished job.
    Done {
        job: Box<JobView>,
        rest: String,
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
    offered: Option<Offered>,
}

impl Received {
    fn of(&self, part: Part) -> &str {
        match part {
            Part::Answer => &self.answer,
            Part::Reasoning => &self.reasoning,
        }
    }

    /// Takes in `fresh` text of `part`; returns what can go on now.
    fn take(&mut self, part: Part, fresh: &str) -> Option<Update> {
        if part == Part::Reasoning {
            self.reasoning.push_str(fresh);
            return Some(Update::Reasoning(fresh.to_string()));
        }
        self.answer.push_str(fresh);
        let limit = self
            .offered
            .as_ref()
            .map_or(self.answer.len(), |o| o.shown_len(&self.answer));
        let out = self
            .answer
            .get(self.shown..limit)
            .filter(|t| !t.is_empty())?;
        let out = out.to_string();
        self.shown = limit;
        Some(Update::Text(out))
    }

    /// At the end: the answer's text not yet shown, and its calls.
    fn finish(&self) -> (String, Vec<ToolCall>) {
        let read = match &self.offered {
            Some(o) => o.read(&self.answer),
            None => ToolAnswer {
                content: self.answer.clone(),
                calls: Vec::new(),
            },
        };
        let rest = read
            .content
            .get(self.shown..)
            .unwrap_or_default()
            .to_string();
        (rest, read.calls)
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
            offered,
            ..Received::default()
        };
        let mut reported: Option<std::time::Instant> = None;
        loop {
            let event = tokio::time::timeout(POLL, events.recv()).await;
            let mut reread = matches!(event, Err(_) | Ok(Err(_)));
            if let Ok(Ok(Event::Job(p))) = &event
                && p.id == id
                && let Some(prompt) = &p.prompt
                && reported.is_none_or(|at| at.elapsed() >= PROMPT_REPORT)
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
                            if let Some(u) = got.take(part, &fresh)
                                && tx.send(u).await.is_err()
                            {
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
                    if let Some(u) = got.take(part, &fresh)
                        && tx.send(u).await.is_err()
                    {
                        return;
                    }
                }
            }
            if !job.state.is_final() {
                continue;
            }
            let end = match ended_badly(&job) {
                Some(e) => Update::Failed(e),
                None => {
                    let (rest, calls) = got.finish();
                    Update::Done {
                        job: Box::new(job),
                        rest,
                        calls,
                    }
                }
            };
            let _ = tx.send(end).await;
            return;
        }
    });
    rx
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
    fn with_tools_the_text_stops_where_a_call_opens_and_the_call_comes_at_the_end() {
        let mut got = Received {
            offered: Offered::new(
                Some(ToolFormat::Hermes),
                &[json!({ "type": "function", "function": { "name": "f" } })],
                3,
            ),
            ..Received::default()
        };
        let text = |u: Option<Update>| match u {
            Some(Update::Text(t)) => t,
            _ => String::new(),
        };
        assert_eq!(
            text(got.take(Part::Answer, "Let me look <tool")),
            "Let me look "
        );
        assert_eq!(text(got.take(Part::Answer, "_call>{\"name\": \"f\", ")), "");
        assert_eq!(
            text(got.take(Part::Answer, "\"arguments\": {}}</tool_call>")),
            ""
        );
        let (rest, calls) = got.finish();
        assert_eq!((rest.as_str(), calls.len()), ("", 1));
        assert_eq!(calls[0].name, "f");
    }
}
