//! Reading a model's answer for the tools it was offered, for every API
//! that offers tools. The answer text keeps the family's call markers; the
//! engine's [`ToolFormat`] reads them into calls. A call block that cannot
//! be read is returned as text with a warning, never an error: the client
//! sees what the model wrote.

use longhaul_engine::{ToolAnswer, ToolCall, ToolFormat};
use serde_json::{Map, Value, json};

use super::error::{ApiError, ApiResult};
use crate::queue::ForcedCall;
use crate::queue::job::tool_name;

/// The tools a request offered, the format its model writes calls in, and
/// the job that answers (calls without an id of the model's get one made
/// from the job and their place, unique over an agent's whole session).
#[derive(Debug, Clone)]
pub struct Offered {
    pub format: ToolFormat,
    pub tools: Vec<Value>,
    pub job: i64,
}

impl Offered {
    /// When tools were offered to a model with a known format.
    pub fn new(format: Option<ToolFormat>, tools: &[Value], job: i64) -> Option<Self> {
        (!tools.is_empty()).then_some(())?;
        Some(Self {
            format: format?,
            tools: tools.to_vec(),
            job,
        })
    }

    /// The whole answer read for calls (all text when it holds none or a
    /// call block cannot be read).
    pub fn read(&self, answer: &str) -> ToolAnswer {
        match self.format.parse(answer, &self.tools) {
            Ok(mut read) => {
                self.name_calls(&mut read.calls);
                read
            }
            Err(e) => {
                tracing::warn!("the answer is returned as text: {e}");
                ToolAnswer {
                    content: answer.to_string(),
                    calls: Vec::new(),
                }
            }
        }
    }

    /// The calls of an answer still being written, as far as they are sure:
    /// ids and names as [`Self::read`] gives them, all but the last whole,
    /// the last one's arguments a prefix of its final ones.
    pub fn partial(&self, answer: &str) -> Vec<ToolCall> {
        let mut calls = self.format.partial(answer, &self.tools);
        self.name_calls(&mut calls);
        calls
    }

    /// Ids for the calls of a format that writes none, from the job and
    /// their place: unique over an agent's whole session.
    fn name_calls(&self, calls: &mut [ToolCall]) {
        if !self.format.writes_ids() {
            for (i, call) in calls.iter_mut().enumerate() {
                call.id = format!("call_{}_{i}", self.job);
            }
        }
    }

    /// How much of a streamed answer can go out as text now: up to where a
    /// call block opens, or short of an end that could open one.
    pub fn shown_len(&self, answer: &str) -> usize {
        self.format
            .call_start(answer)
            .unwrap_or_else(|| answer.len() - self.format.held_back(answer))
    }
}

/// The tools a request offers and the call it forces, if any.
#[derive(Debug, Default)]
pub struct Offer {
    pub tools: Vec<Value>,
    pub forced: Option<ForcedCall>,
}

/// The tools a request offers, as its tool choice leaves them: `auto` (or
/// none given) offers them, `none` withholds them, `required` (OpenAI) or
/// `any` (Anthropic) forces a call to one of them, and a named function —
/// `{"type": "function", "function": {"name"}}` (Chat Completions),
/// `{"type": "function", "name"}` (Responses), `{"type": "tool", "name"}`
/// (Messages) — a call to it; decoding is then held to the family's call
/// opening. `choice` is the choice as sent: a string, or an object with a
/// `type`.
pub fn by_choice(tools: Vec<Value>, choice: Option<&Value>) -> ApiResult<Offer> {
    let kind = choice.and_then(|c| c.as_str().or_else(|| c.get("type")?.as_str()));
    let forced = match (choice, kind) {
        (None | Some(Value::Null), _) | (_, Some("auto")) => None,
        (_, Some("none")) => return Ok(Offer::default()),
        (_, Some("required" | "any")) => Some(ForcedCall::Any),
        (Some(c), Some("function" | "tool")) => {
            let name = c
                .get("function")
                .unwrap_or(c)
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::bad_param("tool_choice", format!("tool_choice {c} names no function"))
                })?;
            Some(ForcedCall::Function {
                name: name.to_string(),
            })
        }
        (Some(c), _) => {
            return Err(ApiError::bad_param(
                "tool_choice",
                format!(
                    "tool_choice {c} is not one Longhaul knows: use auto, none, required (any) or a function by name"
                ),
            ));
        }
    };
    if let Some(ForcedCall::Function { name }) = &forced
        && !tools.iter().any(|t| tool_name(t) == Some(name.as_str()))
    {
        return Err(ApiError::bad_param(
            "tool_choice",
            format!("tool_choice names `{name}`, which is not among the tools offered"),
        ));
    }
    if forced.is_some() && tools.is_empty() {
        return Err(ApiError::bad_param(
            "tool_choice",
            "tool_choice forces a call, but no tools are offered",
        ));
    }
    Ok(Offer { tools, forced })
}

/// Refuses a request's fields that Longhaul would otherwise ignore: any
/// but nulls and the `inert` ones, which mean nothing to generation.
pub fn refuse_other(other: &Map<String, Value>, inert: &[&str]) -> ApiResult<()> {
    match other
        .iter()
        .find(|(k, v)| !v.is_null() && !inert.contains(&k.as_str()))
    {
        Some((key, _)) => Err(ApiError::bad_param(
            key,
            format!("`{key}` is not supported by Longhaul; remove it or leave it at its default"),
        )),
        None => Ok(()),
    }
}

/// Calls in OpenAI Chat Completions' shape.
pub fn openai_calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({
                "id": c.id,
                "type": "function",
                "function": { "name": c.name, "arguments": c.arguments },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hermes() -> Offered {
        Offered {
            format: ToolFormat::Hermes,
            tools: vec![json!({ "type": "function", "function": { "name": "f" } })],
            job: 7,
        }
    }

    #[test]
    fn text_stops_where_a_call_could_open() {
        let o = hermes();
        assert_eq!(o.shown_len("Reading <tool"), "Reading ".len());
        assert_eq!(o.shown_len("Reading <tool_call>{\"na"), "Reading ".len());
        assert_eq!(o.shown_len("Reading it"), "Reading it".len());
    }

    #[test]
    fn a_broken_call_comes_back_as_the_text_written() {
        let text = "<tool_call>{\"name\": \"f\", \"argu";
        let read = hermes().read(text);
        assert_eq!((read.content.as_str(), read.calls.len()), (text, 0));
        let read = hermes().read("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
        let calls = openai_calls(&read.calls);
        assert_eq!(
            calls,
            json!([{ "id": "call_7_0", "type": "function",
                     "function": { "name": "f", "arguments": "{}" } }])
        );
    }

    #[test]
    fn tools_offered_to_a_model_without_a_format_are_not_read() {
        assert!(Offered::new(None, &[json!({})], 1).is_none());
        assert!(Offered::new(Some(ToolFormat::Hermes), &[], 1).is_none());
    }
}
