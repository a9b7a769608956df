//! Prompt encoders for releases that ship code instead of a chat template.
//!
//! DeepSeek-V3.2 publishes `encoding/encoding_dsv32.py` and DeepSeek-V4
//! `encoding/encoding_dsv4.py`, and neither folder has a Jinja template: a
//! conversation is turned into prompt text by those Python functions. They
//! are ported here line for line, so a conversation gives the same bytes as
//! the release's own encoder (fixtures of its output are in
//! `tests/fixtures/encoders`, made by `tools/reference/make_encoder_fixtures.py`).
//! Which encoder a folder uses follows from its `model_type`.

mod deepseek;
mod deepseek_v32;
mod deepseek_v4;

use super::ChatMessage;
use super::chat::ChatOptions;

#[derive(Debug, thiserror::Error)]
pub enum EncoderError {
    #[error("{encoder}: message {index} ({role}): {reason}")]
    Message {
        encoder: &'static str,
        index: usize,
        role: String,
        reason: String,
    },
    #[error("{encoder}: {reason}")]
    Options {
        encoder: &'static str,
        reason: String,
    },
}

/// A family's own prompt encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptEncoder {
    /// `encoding_dsv32.py`.
    DeepseekV32,
    /// `encoding_dsv4.py`.
    DeepseekV4,
}

/// `thinking` (or `thinking_mode: "thinking"`) among the template switches
/// selects the encoders' thinking mode; the release's default is chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingMode {
    Chat,
    Thinking,
}

impl PromptEncoder {
    /// The encoder a release of `model_type` ships in place of a template.
    pub fn for_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "deepseek_v32" => Some(Self::DeepseekV32),
            "deepseek_v4" => Some(Self::DeepseekV4),
            _ => None,
        }
    }

    /// Whether the prompts it builds write `text`: both DeepSeek encoders
    /// open and close thinking with `<think>` and `</think>`, and write tool
    /// calls in DSML (`<｜DSML｜invoke …>`).
    pub fn mentions(self, text: &str) -> bool {
        matches!(text, "<think>" | "</think>" | "｜DSML｜")
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::DeepseekV32 => "encoding_dsv32",
            Self::DeepseekV4 => "encoding_dsv4",
        }
    }

    /// The prompt text of `messages`, ready for the assistant's answer.
    pub fn encode(
        self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<String, EncoderError> {
        let mode = self.thinking_mode(options)?;
        let with_tools = offer_tools(messages, options);
        let messages = with_tools.as_deref().unwrap_or(messages);
        match self {
            Self::DeepseekV32 => deepseek_v32::encode_messages(messages, mode),
            Self::DeepseekV4 => {
                let effort = match options.args.get("reasoning_effort") {
                    None | Some(serde_json::Value::Null) => None,
                    Some(serde_json::Value::String(e)) => Some(e.as_str()),
                    Some(other) => {
                        return Err(EncoderError::Options {
                            encoder: self.name(),
                            reason: format!("`reasoning_effort` must be a string, not {other}"),
                        });
                    }
                };
                deepseek_v4::encode_messages(messages, mode, effort)
            }
        }
    }

    fn thinking_mode(self, options: &ChatOptions) -> Result<ThinkingMode, EncoderError> {
        let bad = |reason: String| EncoderError::Options {
            encoder: self.name(),
            reason,
        };
        match (
            options.args.get("thinking_mode"),
            options.args.get("thinking"),
        ) {
            (Some(serde_json::Value::String(m)), _) => match m.as_str() {
                "thinking" => Ok(ThinkingMode::Thinking),
                "chat" => Ok(ThinkingMode::Chat),
                other => Err(bad(format!(
                    "`thinking_mode` is `{other}`; expected `chat` or `thinking`"
                ))),
            },
            (Some(other), _) => Err(bad(format!(
                "`thinking_mode` must be `chat` or `thinking`, not {other}"
            ))),
            (None, Some(serde_json::Value::Bool(true))) => Ok(ThinkingMode::Thinking),
            (None, Some(serde_json::Value::Bool(false) | serde_json::Value::Null) | None) => {
                Ok(ThinkingMode::Chat)
            }
            (None, Some(other)) => Err(bad(format!(
                "`thinking` must be true or false, not {other}"
            ))),
        }
    }
}

/// The conversation with the `tools` switch (as an OpenAI request offers
/// tools) where the encoders read tools: on the first system or developer
/// message, or on a system message put first. None when there are no such
/// tools or a message already carries its own.
fn offer_tools(messages: &[ChatMessage], options: &ChatOptions) -> Option<Vec<ChatMessage>> {
    let tools = options.args.get("tools").filter(|t| deepseek::truthy(t))?;
    if messages.iter().any(|m| m.extra.contains_key("tools")) {
        return None;
    }
    let mut messages = messages.to_vec();
    let first = messages
        .iter()
        .position(|m| m.role == "system" || m.role == "developer");
    let at = match first {
        Some(i) => i,
        None => {
            messages.insert(0, ChatMessage::new("system", ""));
            0
        }
    };
    messages[at].extra.insert("tools".into(), tools.clone());
    Some(messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tools_given_as_a_switch_are_encoded_as_on_a_system_message() {
        let tools = json!([{ "type": "function", "function": { "name": "read_file",
            "description": "Reads a file", "parameters": { "type": "object",
            "properties": { "path": { "type": "string" } } } } }]);
        let mut options = ChatOptions::generation();
        options.args.insert("tools".into(), tools.clone());
        for encoder in [PromptEncoder::DeepseekV32, PromptEncoder::DeepseekV4] {
            let user = ChatMessage::user("Read README.md");
            let mut system = ChatMessage::new("system", "");
            system.extra.insert("tools".into(), tools.clone());
            let expected = encoder
                .encode(&[system, user.clone()], &ChatOptions::generation())
                .unwrap();
            assert!(expected.contains("read_file"), "{expected}");
            assert_eq!(encoder.encode(&[user], &options).unwrap(), expected);
        }
    }
}
