//! Reading a model's answer for the tools it was offered, for every API
//! that offers tools. The answer text keeps the family's call markers; the
//! engine's [`ToolFormat`] reads them into calls. A call block that cannot
//! be read is returned as text with a warning, never an error: the client
//! sees what the model wrote.

use longhaul_engine::{ToolAnswer, ToolCall, ToolFormat};
use serde_json::{Value, json};

/// The tools a request offered and the format its model writes calls in.
#[derive(Debug, Clone)]
pub struct Offered {
    pub format: ToolFormat,
    pub tools: Vec<Value>,
}

impl Offered {
    /// When tools were offered to a model with a known format.
    pub fn new(format: Option<ToolFormat>, tools: &[Value]) -> Option<Self> {
        (!tools.is_empty()).then_some(())?;
        Some(Self {
            format: format?,
            tools: tools.to_vec(),
        })
    }

    /// The whole answer read for calls (all text when it holds none or a
    /// call block cannot be read).
    pub fn read(&self, answer: &str) -> ToolAnswer {
        match self.format.parse(answer, &self.tools) {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!("the answer is returned as text: {e}");
                ToolAnswer {
                    content: answer.to_string(),
                    calls: Vec::new(),
                }
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

/// Calls in OpenAI Chat Completions' shape; `index` too when streamed.
pub fn openai_calls(calls: &[ToolCall], streamed: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut call = json!({
                "id": c.id,
                "type": "function",
                "function": { "name": c.name, "arguments": c.arguments },
            });
            if streamed {
                call["index"] = json!(i);
            }
            call
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
        let calls = openai_calls(&read.calls, true);
        assert_eq!(
            calls,
            json!([{ "id": "call_0", "type": "function", "index": 0,
                     "function": { "name": "f", "arguments": "{}" } }])
        );
    }

    #[test]
    fn tools_offered_to_a_model_without_a_format_are_not_read() {
        assert!(Offered::new(None, &[json!({})]).is_none());
        assert!(Offered::new(Some(ToolFormat::Hermes), &[]).is_none());
    }
}
