//! One way in. Every entry point that asks a model something — `/api/jobs`,
//! the OpenAI endpoints and the ones to come — hands an [`Ask`] to
//! [`admit`], which reads the attachments once, renders and tokenizes the
//! prompt with the model's own tokenizer, checks it against the model's
//! context with the numbers, and queues it with the token ids it admitted.
//! The runner then reads those ids rather than rendering again, so what was
//! checked is what runs, and a resumed job reads the prompt it started with
//! even if the template or the attached files have changed since.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Map, Value};

use tokio::sync::broadcast;

use super::AppState;
use super::error::{ApiError, ApiResult};
use super::tool_calls::Offered;
use crate::attach::{self, Attachments};
use crate::events::Event;
use crate::model_facts::Known;
use crate::queue::{ForcedCall, Input, JobView, ModelKind, NewJob, PromptInput, Request, Settings};
use longhaul_engine::ToolFormat;

/// Characters per token when a model's tokenizer is not at hand (a remote
/// model, or a GGUF file whose tokenizer is rebuilt when it loads).
const CHARS_PER_TOKEN_ESTIMATE: usize = 4;

/// Priority of API requests (OpenAI, Anthropic): ahead of queued long-form tasks.
pub const API_PRIORITY: i64 = 100;

/// What a request asks, checked for its shape but not yet for the model.
#[derive(Debug, Clone)]
pub struct Ask {
    pub model: String,
    pub input: Input,
    /// Files or folders on this machine, read into the prompt now.
    pub attachments: Vec<PathBuf>,
    pub settings: Settings,
    /// Whether `settings.max_tokens` was asked for: a default is cut to what
    /// the context leaves, an explicit ask that does not fit is refused.
    pub explicit_max_tokens: bool,
    /// An unset `max_tokens` takes all the context leaves (Longhaul's own
    /// jobs, which end at the model's end of answer) rather than the
    /// default; where the context is not known the default stays.
    pub fill_context: bool,
    /// Switches for the chat template or prompt encoder.
    pub chat_args: Map<String, Value>,
    /// Tools offered to the model; a model that shows no tool-call format
    /// is refused them.
    pub tools: Vec<Value>,
    /// A call the answer must make.
    pub forced_call: Option<ForcedCall>,
    pub title: String,
    pub priority: i64,
    /// Who asked: `api`, `openai`, `cli`.
    pub origin: String,
}

impl Ask {
    /// An API request's conversation or prompt, at the API priority, with
    /// no attachments, switches or tools (set them with struct update).
    pub fn api(model: String, input: Input, settings: Settings, title: &str, origin: &str) -> Self {
        Self {
            model,
            input,
            attachments: Vec::new(),
            settings,
            explicit_max_tokens: false,
            fill_context: false,
            chat_args: Map::new(),
            tools: Vec::new(),
            forced_call: None,
            title: title.into(),
            priority: API_PRIORITY,
            origin: origin.into(),
        }
    }
}

/// An API request queued as a job: the job, its events (subscribed before
/// it was queued, so none is missed) and the tools its answer is read for.
pub struct Submitted {
    pub job: JobView,
    pub events: broadcast::Receiver<Event>,
    pub offered: Option<Offered>,
}

/// Admits an API request and subscribes to its job's events.
pub async fn submit(app: &AppState, ask: Ask) -> ApiResult<Submitted> {
    let events = app.events.subscribe();
    let tools = ask.tools.clone();
    let admitted = admit(app, ask).await?;
    Ok(Submitted {
        offered: Offered::new(admitted.tool_format, &tools, admitted.job.id),
        job: admitted.job,
        events,
    })
}

/// The prompt as the model will read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counted {
    /// Tokenized by the model's own tokenizer: these ids, exactly.
    Exact(Vec<u32>),
    /// About this many tokens, from the text's length.
    Estimate(usize),
}

impl Counted {
    pub fn tokens(&self) -> usize {
        match self {
            Counted::Exact(ids) => ids.len(),
            Counted::Estimate(n) => *n,
        }
    }
}

/// Reads attached files and folders off the async threads.
pub async fn read_attachments(paths: Vec<PathBuf>) -> ApiResult<Attachments> {
    if paths.is_empty() {
        return Ok(Attachments::default());
    }
    tokio::task::spawn_blocking(move || attach::collect(&paths))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::bad_param("attachments", e.to_string()))
}

/// Admits `ask`: the prompt assembled, counted and fitted to the model's
/// context, then queued. A prompt that cannot fit is refused with its
/// numbers and nothing is queued.
/// A draft model must be another registered model on this machine.
async fn check_draft(app: &AppState, model: &str, draft: Option<&str>) -> ApiResult<()> {
    let Some(draft) = draft else {
        return Ok(());
    };
    if draft == model {
        return Err(ApiError::bad_param(
            "draft_model",
            format!(
                "`{draft}` is the model itself: a draft model is a smaller one that guesses for it"
            ),
        ));
    }
    let name = draft.to_string();
    match app.blocking(move |q| q.model(&name)).await {
        Ok(m) if matches!(m.kind, ModelKind::Local { .. }) => Ok(()),
        Ok(_) => Err(ApiError::bad_param(
            "draft_model",
            format!("`{draft}` is a remote server: a draft model runs on this machine"),
        )),
        Err(_) => Err(ApiError::bad_param(
            "draft_model",
            format!("no model named `{draft}` is registered"),
        )),
    }
}

pub async fn admit(app: &AppState, ask: Ask) -> ApiResult<Admitted> {
    let attached = read_attachments(ask.attachments).await?;
    let mut request = Request {
        input: ask.input,
        attachments: attached.text,
        settings: ask.settings,
        chat_args: ask.chat_args,
        rendered_at: Some(crate::queue::now_seconds()),
        tools: ask.tools,
        forced_call: ask.forced_call,
        tool_format: None,
    };
    check_draft(app, &ask.model, request.settings.draft_model.as_deref()).await?;
    // A model that is not registered is reported by the queue when it refuses the job.
    let (mut prompt_ids, mut tool_format, mut found) = (None, None, false);
    let name = ask.model.clone();
    if let Ok(model) = app.blocking(move |q| q.model(&name)).await {
        let known = Arc::new(app.known(model, true).await?);
        let checked = request.clone();
        let reading = Arc::clone(&known);
        let counted = tokio::task::spawn_blocking(move || count_prompt(&reading, &checked))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))??;
        let context = known.facts.context;
        (tool_format, found) = (known.tool_format(), true);
        if let Counted::Exact(ids) = counted {
            let asked = match context {
                Some(c) if ask.fill_context && !ask.explicit_max_tokens && ids.len() < c => {
                    c - ids.len()
                }
                _ => request.settings.max_tokens,
            };
            request.settings.max_tokens =
                fit_answer(ids.len(), asked, ask.explicit_max_tokens, context)?;
            prompt_ids = Some(ids);
        }
    }
    if found && !request.tools.is_empty() && tool_format.is_none() {
        return Err(ApiError::bad_param(
            "tools",
            format!(
                "model `{}` shows no tool-call format (none of the families' call markers is in its vocabulary or template), so its answer cannot be read for calls; ask without tools",
                ask.model
            ),
        ));
    }
    if found && request.forced_call.is_some() && tool_format == Some(ToolFormat::Harmony) {
        return Err(ApiError::bad_param(
            "tool_choice",
            format!(
                "model `{}` writes calls as harmony messages, whose headers Longhaul does not hold decoding to; use tool_choice auto",
                ask.model
            ),
        ));
    }
    if !request.tools.is_empty() {
        request.tool_format = tool_format;
    }
    let job = app
        .enqueue(NewJob {
            title: ask.title,
            model: ask.model,
            request,
            prompt_ids,
            priority: ask.priority,
            origin: ask.origin,
        })
        .await?;
    Ok(Admitted { job, tool_format })
}

/// A queued job, and the format its model writes tool calls in.
pub struct Admitted {
    pub job: JobView,
    pub tool_format: Option<ToolFormat>,
}

/// The prompt as the model will read it (attachments first): its ids with a
/// local model's tokenizer, an estimate of their number otherwise.
/// Blocking (a long conversation takes a while to render and encode).
pub fn count_prompt(known: &Known, request: &Request) -> ApiResult<Counted> {
    let input = request.prompt_input();
    let Some(tokenizer) = known.tokenizer() else {
        let chars = match &input {
            PromptInput::Plain(text) => text.chars().count(),
            PromptInput::Chat(messages, _) => {
                messages.iter().map(|m| m.content.chars().count()).sum()
            }
        };
        return Ok(Counted::Estimate(chars.div_ceil(CHARS_PER_TOKEN_ESTIMATE)));
    };
    match input {
        PromptInput::Plain(text) => tokenizer.encode(&text, true),
        PromptInput::Chat(messages, options) => tokenizer
            .render_chat_with(&messages, &options)
            .and_then(|t| tokenizer.encode(&t, false)),
    }
    .map(Counted::Exact)
    .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// The answer's token budget for a prompt of `prompt` tokens: `asked`
/// when it fits the model's context; without an explicit ask, the default
/// cut to what the context leaves. A prompt that leaves no room, or an
/// explicit ask that does not fit, is refused with the numbers and what to
/// change.
pub fn fit_answer(
    prompt: usize,
    asked: usize,
    explicit: bool,
    context: Option<usize>,
) -> ApiResult<usize> {
    let Some(context) = context else {
        return Ok(asked);
    };
    if prompt + asked <= context {
        return Ok(asked);
    }
    if !explicit && prompt < context {
        return Ok(context - prompt);
    }
    let advice = if prompt >= context {
        format!(
            "shorten the prompt or its attachments by at least {} tokens",
            prompt + 1 - context
        )
    } else {
        format!(
            "lower max_tokens to at most {} or shorten the prompt or its attachments",
            context - prompt
        )
    };
    Err(ApiError::bad_param(
        "max_tokens",
        format!(
            "the prompt ({prompt} tokens) plus max_tokens ({asked}) is more than the model's context of {context} tokens: {advice}"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_budget_is_cut_to_the_context_and_an_explicit_one_refused() {
        assert_eq!(fit_answer(10, 100, false, None).ok(), Some(100));
        assert_eq!(fit_answer(10, 100, false, Some(200)).ok(), Some(100));
        assert_eq!(fit_answer(150, 100, false, Some(200)).ok(), Some(50));
        let explicit = fit_answer(150, 100, true, Some(200))
            .err()
            .map(|e| e.message);
        assert_eq!(
            explicit.as_deref(),
            Some(
                "the prompt (150 tokens) plus max_tokens (100) is more than the model's context of 200 tokens: lower max_tokens to at most 50 or shorten the prompt or its attachments"
            )
        );
        let full = fit_answer(200, 100, false, Some(200))
            .err()
            .map(|e| e.message);
        assert!(full.is_some_and(|m| {
            m.ends_with("shorten the prompt or its attachments by at least 1 tokens")
        }));
    }
}
