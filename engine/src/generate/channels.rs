//! Reasoning apart from the answer, as each family writes it.
//!
//! Reasoning models think before they answer: most in a `<think>…</think>`
//! block (DeepSeek-R1 and V3.1+, Qwen3, GLM-4.5, MiniMax-M2, Kimi
//! K2-Thinking), which the template may already have opened at the end of
//! the prompt; gpt-oss in harmony messages, its `analysis` channel the
//! reasoning and its `final` channel the answer. Left in the text, the
//! thinking read as part of the answer ("analysis…assistantfinal…" for
//! gpt-oss, whose markers are special tokens). The splitter sees each token
//! as it is chosen and says which part its text belongs to; tags and
//! markers themselves belong to neither. Tags are recognised as the
//! family's special tokens where they are single tokens and as text where
//! they are not (K2-Thinking writes `<think>` in several tokens).

use crate::tokenizer::{TextStream, TextTokenizer, TokenizerError};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// How a model's answer is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// All of it is the answer.
    #[default]
    Plain,
    /// A leading `<think>…</think>` block is reasoning; `open` when the
    /// prompt already opened it.
    Think {
        open: bool,
        open_id: Option<u32>,
        close_id: Option<u32>,
    },
    /// gpt-oss's harmony messages.
    Harmony(HarmonyTokens),
}

/// The special tokens harmony's messages are framed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarmonyTokens {
    pub start: u32,
    pub end: u32,
    pub message: u32,
    pub channel: u32,
    pub constrain: Option<u32>,
    /// `<|return|>` ends the answer, `<|call|>` a tool call: either ends the turn.
    pub ret: Option<u32>,
    pub call: Option<u32>,
}

impl OutputFormat {
    /// The layout a chat answer of this tokenizer's model takes, the
    /// prompt being `prompt` (its end says whether thinking is open).
    pub fn for_chat(tokenizer: &TextTokenizer, prompt: &str) -> Self {
        let id = |t: &str| tokenizer.token_id(t);
        if let (Some(start), Some(end), Some(message), Some(channel)) = (
            id("<|start|>"),
            id("<|end|>"),
            id("<|message|>"),
            id("<|channel|>"),
        ) {
            return Self::Harmony(HarmonyTokens {
                start,
                end,
                message,
                channel,
                constrain: id("<|constrain|>"),
                ret: id("<|return|>"),
                call: id("<|call|>"),
            });
        }
        let close_id = id(THINK_CLOSE);
        if close_id.is_some() || tokenizer.prompts_mention(THINK_CLOSE) {
            let tail = prompt.trim_end();
            return Self::Think {
                open: tail.ends_with(THINK_OPEN),
                open_id: id(THINK_OPEN),
                close_id,
            };
        }
        Self::Plain
    }
}

/// Which part of the answer a piece of text is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub answer: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing decided yet: a leading `<think>` may still come.
    Before,
    Reasoning,
    Answer,
    /// Reading a harmony header (role, channel, recipient) up to `<|message|>`.
    Header,
    /// Inside a harmony message body.
    Body(Channel),
}

/// A harmony message's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    /// Reasoning.
    Analysis,
    /// Tool calls and what the model says around them.
    Commentary,
    /// The answer.
    Final,
}

impl Channel {
    fn reasoning(self) -> bool {
        self == Self::Analysis
    }
}

/// Splits an answer token by token.
pub struct Splitter<'t> {
    format: OutputFormat,
    stream: TextStream<'t>,
    mode: Mode,
    /// Text held back: a tag may be starting, or a harmony header.
    pending: String,
}

impl<'t> Splitter<'t> {
    pub fn new(tokenizer: &'t TextTokenizer, format: OutputFormat, keep_special: bool) -> Self {
        let mode = match format {
            OutputFormat::Plain => Mode::Answer,
            OutputFormat::Think { open: true, .. } => Mode::Reasoning,
            OutputFormat::Think { .. } => Mode::Before,
            // The prompt ends `<|start|>assistant`: a header follows.
            OutputFormat::Harmony(_) => Mode::Header,
        };
        Self {
            format,
            stream: if keep_special {
                tokenizer.stream_keeping_special()
            } else {
                tokenizer.stream()
            },
            mode,
            pending: String::new(),
        }
    }

    /// Whether token `id` ends the answer, before it is pushed: harmony's
    /// `<|return|>` and `<|call|>`, and `<|end|>` closing the final
    /// channel's message (an analysis message's `<|end|>` does not).
    pub fn ends(&self, id: u32) -> bool {
        match self.format {
            OutputFormat::Harmony(t) => {
                Some(id) == t.ret
                    || Some(id) == t.call
                    || (id == t.end && self.mode == Mode::Body(Channel::Final))
            }
            OutputFormat::Plain | OutputFormat::Think { .. } => false,
        }
    }

    /// Whether the next token would be the answer's (or may open reasoning
    /// first): where decoding held to a start applies.
    pub fn writing_answer(&self) -> bool {
        matches!(self.mode, Mode::Before | Mode::Answer)
    }

    /// The token that may still open reasoning before the answer.
    pub fn may_open_reasoning(&self) -> Option<u32> {
        match (self.format, self.mode) {
            (OutputFormat::Think { open_id, .. }, Mode::Before) => open_id,
            _ => None,
        }
    }

    /// The text token `id` completes, by part.
    pub fn push(&mut self, id: u32) -> Result<Parts, TokenizerError> {
        let mut out = Parts::default();
        if self.marker(id, &mut out) {
            return Ok(out);
        }
        let text = self.stream.push(id)?;
        self.route(&text, &mut out);
        Ok(out)
    }

    /// What is still held back, by part.
    pub fn finish(&mut self) -> Result<Parts, TokenizerError> {
        let mut out = Parts::default();
        let rest = self.stream.finish()?;
        self.route(&rest, &mut out);
        let held = std::mem::take(&mut self.pending);
        match self.mode {
            Mode::Reasoning => out.reasoning += &held,
            Mode::Body(c) if c.reasoning() => out.reasoning += &held,
            Mode::Before | Mode::Answer | Mode::Body(_) => out.answer += &held,
            // An unfinished header is framing, not text.
            Mode::Header => {}
        }
        Ok(out)
    }

    /// Handles `id` if it is a marker of the format; true when it was.
    fn marker(&mut self, id: u32, out: &mut Parts) -> bool {
        match self.format {
            OutputFormat::Think {
                open_id, close_id, ..
            } => {
                if Some(id) == open_id && self.mode == Mode::Before {
                    // Whitespace before the tag is not part of either.
                    self.pending.clear();
                    self.mode = Mode::Reasoning;
                    return true;
                }
                if Some(id) == close_id && self.mode == Mode::Reasoning {
                    out.reasoning += &std::mem::take(&mut self.pending);
                    self.mode = Mode::Answer;
                    return true;
                }
                false
            }
            OutputFormat::Harmony(t) => {
                if id == t.message && self.mode == Mode::Header {
                    let header = std::mem::take(&mut self.pending);
                    self.mode = Mode::Body(harmony_channel(&header));
                    // A message to a tool is a call: its recipient and body go
                    // into the answer as harmony writes them, for the
                    // tool-call reader (`toolcall::harmony`).
                    if let Some(to) = harmony_recipient(&header) {
                        out.answer += &format!("{HARMONY_CALL}{to}{HARMONY_ARGS}");
                    }
                    return true;
                }
                if [t.start, t.end, t.channel].contains(&id) || Some(id) == t.constrain {
                    if id != t.channel && Some(id) != t.constrain {
                        self.pending.clear();
                    } else {
                        // Keep the header's parts apart.
                        self.pending.push(' ');
                    }
                    self.mode = Mode::Header;
                    return true;
                }
                false
            }
            OutputFormat::Plain => false,
        }
    }

    fn route(&mut self, text: &str, out: &mut Parts) {
        match self.mode {
            Mode::Body(c) if c.reasoning() => out.reasoning += text,
            Mode::Answer | Mode::Body(_) => out.answer += text,
            Mode::Header => self.pending += text,
            Mode::Before => {
                self.pending += text;
                let lead = self.pending.trim_start();
                if let Some(after) = lead.strip_prefix(THINK_OPEN) {
                    let after = after.to_string();
                    self.pending.clear();
                    self.mode = Mode::Reasoning;
                    self.route(&after, out);
                } else if !THINK_OPEN.starts_with(lead) {
                    out.answer += &std::mem::take(&mut self.pending);
                    self.mode = Mode::Answer;
                }
            }
            Mode::Reasoning => {
                self.pending += text;
                if let Some(at) = self.pending.find(THINK_CLOSE) {
                    out.reasoning += &self.pending[..at];
                    out.answer += &self.pending[at + THINK_CLOSE.len()..];
                    self.pending.clear();
                    self.mode = Mode::Answer;
                } else {
                    // Hold back only what could begin the closing tag.
                    let keep = (1..THINK_CLOSE.len())
                        .rev()
                        .find(|&n| self.pending.ends_with(&THINK_CLOSE[..n]))
                        .unwrap_or(0);
                    let cut = self.pending.len() - keep;
                    out.reasoning += &self.pending[..cut];
                    self.pending.drain(..cut);
                }
            }
        }
    }
}

/// What stands before a harmony call's recipient and after it, in the text
/// of an answer: `<|channel|>commentary to=functions.NAME<|message|>ARGS`.
pub const HARMONY_CALL: &str = "<|channel|>commentary to=";
pub const HARMONY_ARGS: &str = "<|message|>";

/// The recipient a harmony header names (`to=functions.get_weather`), when
/// it is a tool's: a message to a tool is a call.
fn harmony_recipient(header: &str) -> Option<&str> {
    header
        .split_whitespace()
        .find_map(|w| w.strip_prefix("to="))
        .filter(|to| !to.is_empty() && *to != "assistant" && *to != "user")
}

/// The channel a harmony header names (`analysis`, `final`, `commentary`);
/// the role and recipient around it do not matter here. A header naming
/// none is the answer's.
fn harmony_channel(header: &str) -> Channel {
    header
        .split_whitespace()
        .find_map(|w| match w {
            "analysis" => Some(Channel::Analysis),
            "commentary" => Some(Channel::Commentary),
            "final" => Some(Channel::Final),
            _ => None,
        })
        .unwrap_or(Channel::Final)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level tokenizer with the given added tokens after the 256 bytes.
    fn tokenizer(added: &[&str], template: &str) -> TextTokenizer {
        let alphabet: Vec<char> = (0u32..256)
            .map(|b| {
                let printable =
                    (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
                if printable {
                    char::from_u32(b).unwrap_or('?')
                } else {
                    char::from_u32(
                        256 + (0..b)
                            .filter(|x| {
                                !((33..=126).contains(x)
                                    || (161..=172).contains(x)
                                    || (174..=255).contains(x))
                            })
                            .count() as u32,
                    )
                    .unwrap_or('?')
                }
            })
            .collect();
        let mut vocab = serde_json::Map::new();
        for (i, c) in alphabet.iter().enumerate() {
            vocab.insert(c.to_string(), i.into());
        }
        let added: Vec<serde_json::Value> = added
            .iter()
            .enumerate()
            .map(|(i, t)| {
                serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "added_tokens": added, "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []}
        });
        let config = serde_json::json!({"chat_template": template});
        TextTokenizer::from_parts(
            std::path::Path::new("test"),
            json.to_string().as_bytes(),
            &config,
            None,
        )
        .unwrap()
    }

    fn split(tok: &TextTokenizer, format: OutputFormat, text: &str) -> Parts {
        let ids = tok.encode(text, false).unwrap();
        let mut s = Splitter::new(tok, format, false);
        let mut all = Parts::default();
        for id in ids {
            let p = s.push(id).unwrap();
            all.reasoning += &p.reasoning;
            all.answer += &p.answer;
        }
        let p = s.finish().unwrap();
        all.reasoning += &p.reasoning;
        all.answer += &p.answer;
        all
    }

    #[test]
    fn think_blocks_split_as_tokens_and_as_text() {
        // Tags as special tokens.
        let tok = tokenizer(&["<think>", "</think>"], "");
        let f = OutputFormat::for_chat(&tok, "<user>hi<assistant>");
        assert!(matches!(
            f,
            OutputFormat::Think {
                open: false,
                open_id: Some(_),
                ..
            }
        ));
        let p = split(&tok, f, "\n<think>plan it</think>\n\nThe answer.");
        assert_eq!(
            (p.reasoning.as_str(), p.answer.as_str()),
            ("plan it", "\n\nThe answer.")
        );
        // A prompt that opened thinking: everything up to the tag is reasoning.
        let open = OutputFormat::for_chat(&tok, "<assistant><think>\n");
        let p = split(&tok, open, "still thinking</think>Done");
        assert_eq!(
            (p.reasoning.as_str(), p.answer.as_str()),
            ("still thinking", "Done")
        );
        // Tags written as text (no such tokens), named by the template.
        let plain = tokenizer(&[], "{{ '<think></think>' }}");
        let f = OutputFormat::for_chat(&plain, "x");
        let p = split(&plain, f, "<think>a < b</thi</think> ok");
        assert_eq!(
            (p.reasoning.as_str(), p.answer.as_str()),
            ("a < b</thi", " ok")
        );
        // No thinking at all: the answer as it is.
        let p = split(&plain, f, "  <thin> is not a tag");
        assert_eq!(
            (p.reasoning.as_str(), p.answer.as_str()),
            ("", "  <thin> is not a tag")
        );
        assert_eq!(
            OutputFormat::for_chat(&tokenizer(&[], ""), "x"),
            OutputFormat::Plain
        );
    }

    #[test]
    fn harmony_channels_split_analysis_from_final() {
        let tok = tokenizer(
            &[
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|channel|>",
                "<|constrain|>",
            ],
            "",
        );
        let f = OutputFormat::for_chat(&tok, "<|start|>assistant");
        assert!(matches!(f, OutputFormat::Harmony(_)));
        let p = split(
            &tok,
            f,
            "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
        );
        assert_eq!(
            (p.reasoning.as_str(), p.answer.as_str()),
            ("User greets.", "Hello!")
        );
    }

    #[test]
    fn harmony_ends_at_return_call_and_the_final_message_end() {
        let tok = tokenizer(
            &[
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|channel|>",
                "<|return|>",
                "<|call|>",
            ],
            "",
        );
        let f = OutputFormat::for_chat(&tok, "<|start|>assistant");
        let id = |t: &str| tok.token_id(t).unwrap();
        let mut s = Splitter::new(&tok, f, false);
        let ends = |s: &mut Splitter, text: &str| -> Vec<bool> {
            tok.encode(text, false)
                .unwrap()
                .into_iter()
                .map(|t| {
                    let end = s.ends(t);
                    s.push(t).unwrap();
                    end
                })
                .collect()
        };
        assert!(!ends(&mut s, "<|channel|>analysis<|message|>x").contains(&true));
        assert!(!s.ends(id("<|end|>")), "an analysis message's end goes on");
        assert!(s.ends(id("<|return|>")) && s.ends(id("<|call|>")));
        ends(
            &mut s,
            "<|end|><|start|>assistant<|channel|>final<|message|>y",
        );
        assert!(
            s.ends(id("<|end|>")),
            "the final message's end ends the answer"
        );
    }

    #[test]
    fn a_harmony_message_to_a_tool_is_written_out_as_a_call() {
        let tok = tokenizer(
            &[
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|channel|>",
                "<|constrain|>",
                "<|call|>",
            ],
            "",
        );
        let f = OutputFormat::for_chat(&tok, "<|start|>assistant");
        let mut s = Splitter::new(&tok, f, false);
        let mut answer = String::new();
        let text = "<|channel|>analysis<|message|>need weather<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        for t in tok.encode(text, false).unwrap() {
            answer += &s.push(t).unwrap().answer;
        }
        answer += &s.finish().unwrap().answer;
        assert_eq!(
            answer,
            "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Paris\"}"
        );
    }
}
