//! Tool calls as each family writes them. A model asked with tools answers
//! with calls in its own format — Kimi's sections, DeepSeek's tool tokens
//! or DSML, Qwen's `<tool_call>` JSON or XML, GLM's `<arg_key>` pairs,
//! MiniMax's `<invoke>` — and this module reads them back into names and
//! JSON arguments, as vLLM's parser for that family does. Which format a
//! model speaks follows from its vocabulary and template, the way the
//! family's own server picks its parser.
//!
//! Values in the XML-style formats are typed by the tool's schema: a
//! parameter the schema calls a `string` stays the text written; any other
//! is read as JSON when it is JSON, and kept as text when it is not
//! (vLLM's rule for GLM and llama.cpp's for all XML formats).

mod deepseek;
mod glm;
mod harmony;
mod kimi;
mod minimax;
mod partial;
mod qwen;

use serde_json::{Map, Value};

use crate::tokenizer::TextTokenizer;

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The id the model wrote (Kimi's `functions.NAME:IDX`), or one made
    /// from the call's place in the answer.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object's text.
    pub arguments: String,
}

/// An answer read for tool calls: the text outside them and the calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolAnswer {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// A call block that opened and could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{format} tool call: {reason}")]
pub struct MalformedCall {
    pub format: &'static str,
    pub reason: String,
}

/// A family's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// Kimi K2: `<|tool_calls_section_begin|>…<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>`.
    Kimi,
    /// DeepSeek V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`
    /// (and V3's `function<｜tool▁sep｜>NAME` with a fenced JSON body).
    DeepseekTokens,
    /// DeepSeek V3.2 and V4: DSML `<｜DSML｜invoke name="…">` blocks.
    Dsml,
    /// Qwen3 and Hermes: `<tool_call>{"name": …, "arguments": …}</tool_call>`.
    Hermes,
    /// Qwen3-Coder and Qwen3.5: `<tool_call><function=NAME><parameter=P>…`.
    QwenXml,
    /// GLM-4.5 to 4.7: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`.
    Glm,
    /// MiniMax-M2: `<minimax:tool_call><invoke name="…"><parameter name="…">`.
    Minimax,
    /// gpt-oss's harmony: a commentary message `to=functions.NAME` whose
    /// body is the arguments.
    Harmony,
}

/// DeepSeek's fullwidth-bar markers, spelled once.
pub(crate) const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub(crate) const DSML: &str = "｜DSML｜";

/// How one family writes its calls: each format's file holds its row. A
/// new format is its file, its [`ToolFormat`] value, the value's line in
/// [`ToolFormat::syntax`] and its place in [`FORMATS`].
struct Syntax {
    /// The format's name (vLLM's parser's, where it has one).
    name: &'static str,
    /// What opens the first call block.
    opener: &'static str,
    /// Whether a model's vocabulary and prompts show this format.
    shown_by: fn(&Signs<'_>) -> bool,
    /// How an answer calling the name given begins, up to where the name
    /// has ended, for each way the family writes it; none where decoding
    /// cannot be held to a call.
    opening: Option<fn(&str) -> Vec<String>>,
    /// The calls of a whole block (from its opener on).
    parse: fn(&str, &Schemas<'_>) -> Result<Vec<ToolCall>, String>,
    /// The calls of a block still being written, as far as they are sure.
    partial: fn(&str, &Schemas<'_>) -> Vec<ToolCall>,
    /// Whether calls carry the ids the model wrote.
    writes_ids: bool,
}

/// Every format, in the order a model's files are checked for them: the
/// first a model shows is its format (harmony's tokens before all; Kimi's
/// and DeepSeek's markers before the `<tool_call>` that GLM, Qwen's XML and
/// Hermes share, and those three from the most particular sign to the
/// least).
const FORMATS: [ToolFormat; 8] = [
    ToolFormat::Harmony,
    ToolFormat::Kimi,
    ToolFormat::Dsml,
    ToolFormat::DeepseekTokens,
    ToolFormat::Minimax,
    ToolFormat::Glm,
    ToolFormat::QwenXml,
    ToolFormat::Hermes,
];

/// What a model's files show of its call format.
struct Signs<'a>(&'a TextTokenizer);

impl Signs<'_> {
    /// `text` is a token of the vocabulary.
    fn token(&self, text: &str) -> bool {
        self.0.token_id(text).is_some()
    }

    /// The template (or prompt encoder) writes `text`.
    fn prompts_mention(&self, text: &str) -> bool {
        self.0.prompts_mention(text)
    }

    /// Either.
    fn has(&self, text: &str) -> bool {
        self.token(text) || self.prompts_mention(text)
    }
}

impl ToolFormat {
    /// The format a model answers tools in, from its vocabulary and the
    /// template (or prompt encoder) its prompts are built by; none when the
    /// model shows no sign of tool calls.
    pub fn detect(tokenizer: &TextTokenizer) -> Option<Self> {
        let signs = Signs(tokenizer);
        FORMATS.into_iter().find(|f| (f.syntax().shown_by)(&signs))
    }

    /// The format's own file's reading of it.
    fn syntax(self) -> &'static Syntax {
        match self {
            Self::Kimi => &kimi::KIMI,
            Self::DeepseekTokens => &deepseek::TOKENS,
            Self::Dsml => &deepseek::DSML_CALLS,
            Self::Hermes => &qwen::HERMES,
            Self::QwenXml => &qwen::XML,
            Self::Glm => &glm::GLM,
            Self::Minimax => &minimax::MINIMAX,
            Self::Harmony => &harmony::HARMONY,
        }
    }

    /// Whether the model writes its calls' ids (Kimi's `functions.NAME:IDX`);
    /// the others' ids are made from each call's place in the answer.
    pub fn writes_ids(self) -> bool {
        self.syntax().writes_ids
    }

    pub fn name(self) -> &'static str {
        self.syntax().name
    }

    /// How an answer that calls one of `names` begins, up to where the
    /// name has ended, for each way the family writes it: decoding held to
    /// these (a forced call) can only write a call to one of them. None for
    /// harmony, whose calls are headers of their own messages.
    pub fn openings(self, names: &[&str]) -> Option<Vec<String>> {
        let opening = self.syntax().opening?;
        Some(names.iter().flat_map(|name| opening(name)).collect())
    }

    /// Where the first call block begins in `text`, if one has.
    pub fn call_start(self, text: &str) -> Option<usize> {
        text.find(self.syntax().opener)
    }

    /// How many bytes at the end of `text` could be the start of a call
    /// block still being written: a stream holds them back until it knows.
    pub fn held_back(self, text: &str) -> usize {
        partial::overlap(text, self.syntax().opener)
    }

    /// Reads the calls out of a whole answer. `tools` are the tools offered
    /// (OpenAI's `[{type: function, function: {name, parameters}}]` or the
    /// flat `[{name, parameters}]`), whose schemas type XML values. Text
    /// without a call block is all content.
    pub fn parse(self, text: &str, tools: &[Value]) -> Result<ToolAnswer, MalformedCall> {
        let Some(start) = self.call_start(text) else {
            return Ok(ToolAnswer {
                content: text.to_string(),
                calls: Vec::new(),
            });
        };
        let calls = (self.syntax().parse)(&text[start..], &Schemas(tools)).map_err(|reason| {
            MalformedCall {
                format: self.name(),
                reason,
            }
        })?;
        if calls.is_empty() {
            return Err(MalformedCall {
                format: self.name(),
                reason: "a call block holds no complete call".into(),
            });
        }
        Ok(ToolAnswer {
            content: text[..start].trim_end().to_string(),
            calls,
        })
    }

    /// The calls of an answer still being written, as far as they are sure
    /// (see `partial`): each call's id and name are those [`Self::parse`]
    /// will read from the whole answer, every call but the last is whole,
    /// and the last one's arguments are a prefix of its final arguments. A
    /// stream sends them as they grow.
    pub fn partial(self, text: &str, tools: &[Value]) -> Vec<ToolCall> {
        match self.call_start(text) {
            Some(start) => (self.syntax().partial)(&text[start..], &Schemas(tools)),
            None => Vec::new(),
        }
    }
}

/// A call's id from its place in the answer, for formats that write none.
pub(crate) fn call_id(index: usize) -> String {
    format!("call_{index}")
}

/// A call read from `name` and its arguments object.
pub(crate) fn call(index: usize, name: &str, args: Map<String, Value>) -> ToolCall {
    ToolCall {
        id: call_id(index),
        name: name.trim().to_string(),
        arguments: Value::Object(args).to_string(),
    }
}

/// Arguments the model wrote as JSON, checked to be an object and kept as
/// written (trimmed): a stream sends them as the model writes them, and
/// the whole answer must read to what it sent.
pub(crate) fn json_arguments(text: &str) -> Result<String, String> {
    let text = text.trim();
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(_)) => Ok(text.to_string()),
        Ok(other) => Err(format!("arguments are not an object: {other}")),
        Err(e) => Err(format!("arguments are not JSON ({e}): {text}")),
    }
}

/// The tools offered, by name, for their parameters' schemas.
pub(crate) struct Schemas<'a>(&'a [Value]);

impl Schemas<'_> {
    fn parameters(&self, tool: &str) -> Option<&Map<String, Value>> {
        self.0.iter().find_map(|t| {
            let f = t.get("function").unwrap_or(t);
            (f.get("name")?.as_str()? == tool)
                .then(|| f.get("parameters")?.get("properties")?.as_object())
                .flatten()
        })
    }

    /// Whether `tool`'s schema says parameter `key` is a string.
    fn is_string(&self, tool: &str, key: &str) -> bool {
        self.parameters(tool)
            .and_then(|p| p.get(key)?.get("type")?.as_str())
            == Some("string")
    }

    /// A value written as text, typed by the schema (see the module's doc).
    pub(crate) fn value(&self, tool: &str, key: &str, raw: &str) -> Value {
        if self.is_string(tool, key) {
            return Value::String(raw.to_string());
        }
        serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_string()))
    }
}

#[cfg(test)]
mod tests;
