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

    /// Ids for the calls of a format that writes none, from the job and
    /// their place: unique over an agent's whole session.
    fn name_calls(&self, calls: &mut [ToolCall]) {
        if !self.format.writes_ids() {
            for (i, call) in calls.iter_mut().enumerate() {
                call.id = format!("call_{}_{i}", self.job);
            }
        }
    }
}

/// An answer read for calls while it is written, one piece at a time. It
/// keeps where the call block opens, so the answer's text is searched once
/// (only what is new, and the few bytes before it that could begin the
/// opener): a streamed answer of n bytes with no call costs O(n), where
/// searching it whole at every event cost O(n²). Once the block opens,
/// only the block is read again as it grows.
#[derive(Debug)]
pub struct CallReader {
    pub offered: Offered,
    /// Where the first call block opens in the answer, once it has.
    start: Option<usize>,
    /// How much of the answer has been searched for the block's opener.
    searched: usize,
}

/// What an answer so far reads to.
#[derive(Debug, PartialEq)]
pub struct ReadSoFar {
    /// How much can go out as text now: up to where a call block opens, or
    /// short of an end that could open one.
    pub shown: usize,
    /// The calls as far as they are sure: ids and names as
    /// [`Offered::read`] gives them, all but the last whole, the last one's
    /// arguments a prefix of its final ones.
    pub calls: Vec<ToolCall>,
}

impl CallReader {
    pub fn new(offered: Offered) -> Self {
        Self {
            offered,
            start: None,
            searched: 0,
        }
    }

    /// Reads `answer`, which holds the answer read before and more after it.
    pub fn read(&mut self, answer: &str) -> ReadSoFar {
        let format = self.offered.format;
        if self.start.is_none() {
            // An opener not found before may end in the new text: it then
            // begins in the tail of the old that is a prefix of it.
            let before = answer.get(..self.searched).unwrap_or_default();
            let from = self.searched - format.held_back(before);
            self.start = answer
                .get(from..)
                .and_then(|fresh| format.call_start(fresh))
                .map(|at| from + at);
            self.searched = answer.len();
        }
        let Some(start) = self.start else {
            return ReadSoFar {
                shown: answer.len() - format.held_back(answer),
                calls: Vec::new(),
            };
        };
        let mut calls = format.partial(&answer[start..], &self.offered.tools);
        self.offered.name_calls(&mut calls);
        ReadSoFar {
            shown: start,
            calls,
        }
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
        let shown = |answer: &str| CallReader::new(hermes()).read(answer).shown;
        assert_eq!(shown("Reading <tool"), "Reading ".len());
        assert_eq!(shown("Reading <tool_call>{\"na"), "Reading ".len());
        assert_eq!(shown("Reading it"), "Reading it".len());
    }

    /// The answer read whole, as a reader that keeps nothing would.
    fn read_whole(o: &Offered, answer: &str) -> ReadSoFar {
        let format = o.format;
        let mut calls = format.partial(answer, &o.tools);
        o.name_calls(&mut calls);
        ReadSoFar {
            shown: format
                .call_start(answer)
                .unwrap_or_else(|| answer.len() - format.held_back(answer)),
            calls,
        }
    }

    #[test]
    fn read_in_pieces_an_answer_reads_as_it_does_whole() {
        let answers = [
            (
                ToolFormat::Hermes,
                "Let me <tool look <tool_call>{\"name\": \"f\", \"arguments\": {\"p\": \"é\"}}</tool_call>\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
            ),
            (
                ToolFormat::Kimi,
                "ok <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>",
            ),
            (
                ToolFormat::Glm,
                "<tool_call>f<arg_key>p</arg_key><arg_value>x</arg_value></tool_call>",
            ),
            (ToolFormat::Minimax, "no call here, only <minimax:tool text"),
        ];
        for (format, answer) in answers {
            let o = Offered { format, ..hermes() };
            for step in [1, 2, 3, 7] {
                let mut reader = CallReader::new(o.clone());
                let mut end = 0;
                while end < answer.len() {
                    end = (end + step).min(answer.len());
                    while !answer.is_char_boundary(end) {
                        end += 1;
                    }
                    let so_far = &answer[..end];
                    assert_eq!(
                        reader.read(so_far),
                        read_whole(&o, so_far),
                        "{format:?} {so_far:?}"
                    );
                }
            }
        }
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
