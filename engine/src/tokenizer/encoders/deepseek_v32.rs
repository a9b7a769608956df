//! `encoding_dsv32.py` (DeepSeek-V3.2): BOS, the system text (with the tools
//! described in it), `<｜User｜>…<｜Assistant｜>` and `<think>` after the
//! last user turn in thinking mode (`</think>` otherwise), assistant turns
//! ending in EOS with their calls in DSML `function_calls`, tool results in
//! `<function_results>`. Reasoning of assistant turns before the last user
//! turn is dropped in thinking mode.

use super::deepseek::{
    self, BOS, DSML, EOS, THINK_END, THINK_START, ToolCall, last_user_index, to_json,
    tools_from_openai,
};
use super::{EncoderError, ThinkingMode};
use crate::tokenizer::ChatMessage;

const ENCODER: &str = "encoding_dsv32";

/// `TOOLS_SYSTEM_TEMPLATE`, with `{dsml}`, `{start}`, `{end}` and
/// `{schemas}` filled in by [`render_tools`].
const TOOLS_TEMPLATE: &str = r#"## Tools

You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<{dsml}function_calls>" block like the following as part of your reply to the user:
<{dsml}function_calls>
<{dsml}invoke name="$FUNCTION_NAME">
<{dsml}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml}parameter>
...
</{dsml}invoke>
<{dsml}invoke name="$FUNCTION_NAME2">
...
</{dsml}invoke>
</{dsml}function_calls>

String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, booleans, arrays, objects).

If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:

<{dsml}function_calls>
...
</{dsml}function_calls>

<function_results>
...
</function_results>

{start}...thinking about results{end}

Here are the functions available in JSONSchema format:
<functions>
{schemas}
</functions>
"#;

fn render_tools(tools: &[serde_json::Value]) -> String {
    let schemas: Vec<String> = tools.iter().map(to_json).collect();
    TOOLS_TEMPLATE
        .replace("{dsml}", DSML)
        .replace("{start}", THINK_START)
        .replace("{end}", THINK_END)
        .replace("{schemas}", &schemas.join("\n"))
}

/// `drop_thinking_messages`: earlier assistants lose their reasoning, and
/// developer messages before the last user turn are left out.
fn drop_thinking(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let last = last_user_index(messages);
    messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            if matches!(m.role.as_str(), "user" | "system" | "tool") || i as isize >= last {
                Some(m.clone())
            } else if m.role == "assistant" {
                let mut m = m.clone();
                m.extra.remove("reasoning_content");
                Some(m)
            } else {
                None
            }
        })
        .collect()
}

/// `encode_messages(messages, thinking_mode)` with no context: BOS, then
/// each message.
pub fn encode_messages(
    messages: &[ChatMessage],
    mode: ThinkingMode,
) -> Result<String, EncoderError> {
    let full = if mode == ThinkingMode::Thinking {
        drop_thinking(messages)
    } else {
        messages.to_vec()
    };
    if full.len() < messages.len() {
        return Err(EncoderError::Options {
            encoder: ENCODER,
            reason: "in thinking mode the release's encoder drops developer messages before the last user message and then fails; put them after it or use chat mode".into(),
        });
    }
    let mut prompt = BOS.to_string();
    for index in 0..messages.len() {
        prompt += &render_message(index, &full, mode).map_err(|reason| EncoderError::Message {
            encoder: ENCODER,
            index,
            role: full[index].role.clone(),
            reason,
        })?;
    }
    Ok(prompt)
}

fn tools_and_format(m: &ChatMessage) -> Result<String, String> {
    let mut out = String::new();
    if let Some(tools) = m.field("tools").filter(|v| deepseek::truthy(v)) {
        out += "\n\n";
        out += &render_tools(&tools_from_openai(tools)?);
    }
    if let Some(schema) = m.field("response_format").filter(|v| deepseek::truthy(v)) {
        out += "\n\n";
        out += &deepseek::response_format(schema);
    }
    Ok(out)
}

fn render_message(
    index: usize,
    messages: &[ChatMessage],
    mode: ThinkingMode,
) -> Result<String, String> {
    let m = &messages[index];
    let last_user = last_user_index(messages);
    let thinking = mode == ThinkingMode::Thinking;
    let mut prompt = String::new();
    let calls = match m.field("tool_calls").filter(|v| deepseek::truthy(v)) {
        Some(c) => deepseek::tool_calls_from_openai(c)?,
        None => Vec::new(),
    };
    let after_user = |prompt: &mut String| {
        *prompt += if index as isize == last_user && thinking {
            THINK_START
        } else {
            THINK_END
        };
    };
    match m.role.as_str() {
        "system" => {
            prompt += &m.content;
            prompt += &tools_and_format(m)?;
        }
        "developer" => {
            if m.content.is_empty() {
                return Err("a developer message needs content".into());
            }
            let content = format!(
                "{}\n\n# The user's message is: {}",
                tools_and_format(m)?,
                m.content
            );
            prompt += &format!("<｜User｜>{content}<｜Assistant｜>");
            after_user(&mut prompt);
        }
        "user" => {
            prompt += &format!("<｜User｜>{}<｜Assistant｜>", m.content);
            after_user(&mut prompt);
        }
        "tool" => prompt += &render_tool(index, messages, last_user, thinking)?,
        "assistant" => {
            let tool_calls = if calls.is_empty() {
                String::new()
            } else {
                deepseek::tool_calls_block(&calls, "function_calls", false)?
            };
            let mut reasoning = String::new();
            if thinking && index as isize > last_user {
                let text = m
                    .field("reasoning_content")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                if text.is_empty() && calls.is_empty() {
                    return Err(
                        "in thinking mode, an assistant message after the last user message needs reasoning_content or tool_calls".into(),
                    );
                }
                reasoning = format!("{text}{THINK_END}");
            }
            prompt += &format!("{reasoning}{}{tool_calls}{EOS}", m.content);
        }
        other => return Err(format!("unknown role `{other}`")),
    }
    Ok(prompt)
}

/// A tool result: the first after an assistant opens `<function_results>`,
/// the last closes it and hands the turn back.
fn render_tool(
    index: usize,
    messages: &[ChatMessage],
    last_user: isize,
    thinking: bool,
) -> Result<String, String> {
    let mut prev = index as isize - 1;
    while prev >= 0 && messages[prev as usize].role == "tool" {
        prev -= 1;
    }
    let assistant = (prev >= 0)
        .then(|| &messages[prev as usize])
        .filter(|a| a.role == "assistant")
        .ok_or("a tool result must follow an assistant message with tool calls")?;
    let order = (index as isize - prev) as usize;
    let calls: Vec<ToolCall> = match assistant.field("tool_calls") {
        Some(c) => deepseek::tool_calls_from_openai(c)?,
        None => Vec::new(),
    };
    if calls.len() < order {
        return Err(format!(
            "tool result {order} after an assistant message with {} tool calls",
            calls.len()
        ));
    }
    let mut out = String::new();
    if order == 1 {
        out += "\n\n<function_results>";
    }
    out += &format!("\n<result>{}</result>", messages[index].content);
    if order == calls.len() {
        out += "\n</function_results>";
        out += if index as isize >= last_user && thinking {
            "\n\n<think>"
        } else {
            "\n\n</think>"
        };
    }
    Ok(out)
}
