//! `encoding_dsv4.py` (DeepSeek-V4): tool results are merged into user
//! turns as `<tool_result>` blocks (sorted into the order of the calls),
//! `<｜User｜>` opens a user run and `<｜Assistant｜>` with `<think>` or
//! `</think>` closes it only where an answer follows, calls are DSML
//! `tool_calls`, a `max` reasoning effort adds its preamble, and earlier
//! reasoning is kept whenever tools are offered.

use serde_json::{Map, Value};

use super::deepseek::{
    self, BOS, DSML, EOS, THINK_END, THINK_START, to_json, tools_from_openai, truthy,
};
use super::{EncoderError, ThinkingMode};
use crate::tokenizer::ChatMessage;

const ENCODER: &str = "encoding_dsv4";
const USER: &str = "<｜User｜>";
const ASSISTANT: &str = "<｜Assistant｜>";
const LATEST_REMINDER: &str = "<｜latest_reminder｜>";
/// `DS_TASK_SP_TOKENS`.
const TASKS: &[(&str, &str)] = &[
    ("action", "<｜action｜>"),
    ("query", "<｜query｜>"),
    ("authority", "<｜authority｜>"),
    ("domain", "<｜domain｜>"),
    ("title", "<｜title｜>"),
    ("read_url", "<｜read_url｜>"),
];
/// Reasoning efforts the release accepts; only `max` adds a preamble.
const EFFORTS: &[&str] = &["max", "high"];

const REASONING_EFFORT_MAX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// `TOOLS_TEMPLATE`, with `{dsml}`, `{start}`, `{end}` and `{schemas}`
/// filled in by [`render_tools`].
const TOOLS_TEMPLATE: &str = r#"## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml}tool_calls>" block like the following:

<{dsml}tool_calls>
<{dsml}invoke name="$TOOL_NAME">
<{dsml}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml}parameter>
...
</{dsml}invoke>
<{dsml}invoke name="$TOOL_NAME2">
...
</{dsml}invoke>
</{dsml}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {start}), you MUST output your complete reasoning inside {start}...{end} BEFORE any tool calls or final response.

Otherwise, output directly after {end} with tool calls or final response.

### Available Tool Schemas

{schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"#;

type Msg = Map<String, Value>;

fn render_tools(tools: &[Value]) -> String {
    let schemas: Vec<String> = tools.iter().map(to_json).collect();
    TOOLS_TEMPLATE
        .replace("{dsml}", DSML)
        .replace("{start}", THINK_START)
        .replace("{end}", THINK_END)
        .replace("{schemas}", &schemas.join("\n"))
}

fn get<'a>(m: &'a Msg, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn text<'a>(m: &'a Msg, key: &str) -> &'a str {
    get(m, key).and_then(Value::as_str).unwrap_or_default()
}

fn role(m: &Msg) -> &str {
    text(m, "role")
}

fn last_user_index(messages: &[Msg]) -> isize {
    messages
        .iter()
        .rposition(|m| matches!(role(m), "user" | "developer"))
        .map_or(-1, |i| i as isize)
}

/// A message as the release's dicts hold it.
fn as_dict(m: &ChatMessage) -> Msg {
    let mut d = Msg::new();
    d.insert("role".into(), Value::String(m.role.clone()));
    d.insert("content".into(), Value::String(m.content.clone()));
    for (k, v) in &m.extra {
        d.insert(k.clone(), v.clone());
    }
    d
}

/// `merge_tool_messages`: tool results become `tool_result` blocks of a
/// user message, and user texts join a run of them.
fn merge_tool_messages(messages: &[Msg]) -> Vec<Msg> {
    let mut merged: Vec<Msg> = Vec::new();
    for m in messages {
        let open_blocks = |merged: &mut Vec<Msg>| -> Option<usize> {
            let last = merged.last()?;
            (role(last) == "user" && last.contains_key("content_blocks")).then(|| merged.len() - 1)
        };
        match role(m) {
            "tool" => {
                let mut block = Msg::new();
                block.insert("type".into(), "tool_result".into());
                block.insert(
                    "tool_use_id".into(),
                    m.get("tool_call_id").cloned().unwrap_or_else(|| "".into()),
                );
                block.insert(
                    "content".into(),
                    m.get("content").cloned().unwrap_or_else(|| "".into()),
                );
                match open_blocks(&mut merged) {
                    Some(i) => push_block(&mut merged[i], block),
                    None => {
                        let mut user = Msg::new();
                        user.insert("role".into(), "user".into());
                        user.insert("content_blocks".into(), Value::Array(vec![block.into()]));
                        merged.push(user);
                    }
                }
            }
            "user" => {
                let content = m.get("content").cloned().unwrap_or_else(|| "".into());
                let mut block = Msg::new();
                block.insert("type".into(), "text".into());
                block.insert("text".into(), content.clone());
                match open_blocks(&mut merged).filter(|&i| get(&merged[i], "task").is_none()) {
                    Some(i) => push_block(&mut merged[i], block),
                    None => {
                        let mut user = Msg::new();
                        user.insert("role".into(), "user".into());
                        user.insert("content".into(), content);
                        user.insert("content_blocks".into(), Value::Array(vec![block.into()]));
                        for key in ["task", "wo_eos", "mask"] {
                            if let Some(v) = m.get(key) {
                                user.insert(key.into(), v.clone());
                            }
                        }
                        merged.push(user);
                    }
                }
            }
            _ => merged.push(m.clone()),
        }
    }
    merged
}

fn push_block(m: &mut Msg, block: Msg) {
    if let Some(Value::Array(blocks)) = m.get_mut("content_blocks") {
        blocks.push(block.into());
    }
}

/// `sort_tool_results_by_call_order`: a user message's tool results in the
/// order of the preceding assistant's calls (by id); other blocks stay put.
fn sort_tool_results(messages: &mut [Msg]) {
    let mut order: Vec<(String, usize)> = Vec::new();
    for m in messages.iter_mut() {
        if role(m) == "assistant" && get(m, "tool_calls").is_some_and(truthy) {
            order.clear();
            for (i, tc) in get(m, "tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let id = tc
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .or_else(|| tc.get("function")?.get("id")?.as_str())
                    .unwrap_or_default();
                if !id.is_empty() {
                    order.push((id.to_string(), i));
                }
            }
        } else if role(m) == "user"
            && let Some(Value::Array(blocks)) = m.get_mut("content_blocks")
        {
            let is_result =
                |b: &Value| b.get("type").and_then(Value::as_str) == Some("tool_result");
            let mut results: Vec<Value> = blocks.iter().filter(|b| is_result(b)).cloned().collect();
            if results.len() > 1 && !order.is_empty() {
                let rank = |b: &Value| {
                    let id = b
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    order.iter().find(|(k, _)| k == id).map_or(0, |(_, i)| *i)
                };
                // Python's sort is stable, as this one is.
                results.sort_by_key(rank);
                let mut sorted = results.into_iter();
                for b in blocks.iter_mut().filter(|b| is_result(b)) {
                    if let Some(next) = sorted.next() {
                        *b = next;
                    }
                }
            }
        }
    }
}

/// `_drop_thinking_messages`.
fn drop_thinking(messages: &[Msg]) -> Vec<Msg> {
    let last = last_user_index(messages);
    const KEEP: &[&str] = &[
        "user",
        "system",
        "tool",
        "latest_reminder",
        "direct_search_results",
    ];
    messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            if KEEP.contains(&role(m)) || i as isize >= last {
                Some(m.clone())
            } else if role(m) == "assistant" {
                let mut m = m.clone();
                m.remove("reasoning_content");
                Some(m)
            } else {
                None
            }
        })
        .collect()
}

/// `encode_messages(messages, thinking_mode, reasoning_effort=…)` with no
/// context.
pub fn encode_messages(
    messages: &[ChatMessage],
    mode: ThinkingMode,
    effort: Option<&str>,
) -> Result<String, EncoderError> {
    if let Some(e) = effort.filter(|e| !EFFORTS.contains(e)) {
        return Err(EncoderError::Options {
            encoder: ENCODER,
            reason: format!("`reasoning_effort` is `{e}`; the release takes max or high"),
        });
    }
    let dicts: Vec<Msg> = messages.iter().map(as_dict).collect();
    let mut full = merge_tool_messages(&dicts);
    sort_tool_results(&mut full);
    let drop = !full.iter().any(|m| get(m, "tools").is_some_and(truthy));
    if mode == ThinkingMode::Thinking && drop {
        full = drop_thinking(&full);
    }
    let mut prompt = BOS.to_string();
    for index in 0..full.len() {
        prompt += &render_message(index, &full, mode, drop, effort).map_err(|reason| {
            EncoderError::Message {
                encoder: ENCODER,
                index,
                role: role(&full[index]).to_string(),
                reason,
            }
        })?;
    }
    Ok(prompt)
}

fn tools_and_format(m: &Msg) -> Result<String, String> {
    let mut out = String::new();
    if let Some(tools) = get(m, "tools").filter(|v| truthy(v)) {
        out += "\n\n";
        out += &render_tools(&tools_from_openai(tools)?);
    }
    if let Some(schema) = get(m, "response_format").filter(|v| truthy(v)) {
        out += "\n\n";
        out += &deepseek::response_format(schema);
    }
    Ok(out)
}

/// A user message's blocks: texts as they are, tool results in
/// `<tool_result>`, joined by blank lines.
fn user_blocks(blocks: &[Value]) -> String {
    let parts: Vec<String> = blocks
        .iter()
        .map(|b| {
            let kind = b.get("type").and_then(Value::as_str).unwrap_or("None");
            match kind {
                "text" => b
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                "tool_result" => {
                    let content = match b.get("content") {
                        Some(Value::Array(items)) => items
                            .iter()
                            .map(|i| match i.get("type").and_then(Value::as_str) {
                                Some("text") => i
                                    .get("text")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_string(),
                                other => format!("[Unsupported {}]", other.unwrap_or("None")),
                            })
                            .collect::<Vec<_>>()
                            .join("\n\n"),
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Null) | None => String::new(),
                        Some(other) => other.to_string(),
                    };
                    format!("<tool_result>{content}</tool_result>")
                }
                other => format!("[Unsupported {other}]"),
            }
        })
        .collect();
    parts.join("\n\n")
}

fn render_message(
    index: usize,
    messages: &[Msg],
    mode: ThinkingMode,
    drop: bool,
    effort: Option<&str>,
) -> Result<String, String> {
    let m = &messages[index];
    let last_user = last_user_index(messages);
    let thinking = mode == ThinkingMode::Thinking;
    let mut prompt = String::new();
    if index == 0 && thinking && effort == Some("max") {
        prompt += REASONING_EFFORT_MAX;
    }
    match role(m) {
        "system" => {
            prompt += text(m, "content");
            prompt += &tools_and_format(m)?;
        }
        "developer" => {
            let content = text(m, "content");
            if content.is_empty() {
                return Err("a developer message needs content".into());
            }
            prompt += &format!("{USER}{content}{}", tools_and_format(m)?);
        }
        "user" => {
            prompt += USER;
            match get(m, "content_blocks").and_then(Value::as_array) {
                Some(blocks) if !blocks.is_empty() => prompt += &user_blocks(blocks),
                _ => prompt += text(m, "content"),
            }
        }
        "latest_reminder" => {
            prompt += LATEST_REMINDER;
            prompt += text(m, "content");
        }
        "assistant" => {
            let calls = match get(m, "tool_calls").filter(|v| truthy(v)) {
                Some(c) => deepseek::tool_calls_from_openai(c)?,
                None => Vec::new(),
            };
            let tool_calls = if calls.is_empty() {
                String::new()
            } else {
                deepseek::tool_calls_block(&calls, "tool_calls", true)?
            };
            let prev_has_task = index > 0 && get(&messages[index - 1], "task").is_some();
            let mut reasoning = String::new();
            if thinking && !prev_has_task && (!drop || index as isize > last_user) {
                reasoning = format!("{}{THINK_END}", text(m, "reasoning_content"));
            }
            let eos = if get(m, "wo_eos").is_some_and(truthy) {
                ""
            } else {
                EOS
            };
            prompt += &format!("{reasoning}{}{tool_calls}{eos}", text(m, "content"));
        }
        other => return Err(format!("unknown role `{other}`")),
    }
    // What follows decides the transition: only before an answer (or at
    // the end) does the assistant's turn open.
    if messages
        .get(index + 1)
        .is_some_and(|next| !matches!(role(next), "assistant" | "latest_reminder"))
    {
        return Ok(prompt);
    }
    if let Some(task) = get(m, "task") {
        let name = task.as_str().unwrap_or_default();
        let token = TASKS
            .iter()
            .find(|(t, _)| *t == name)
            .map(|(_, tok)| *tok)
            .ok_or_else(|| format!("task `{task}` is not one of the release's"))?;
        if name == "action" {
            prompt += ASSISTANT;
            prompt += if thinking { THINK_START } else { THINK_END };
        }
        prompt += token;
    } else if matches!(role(m), "user" | "developer") {
        prompt += ASSISTANT;
        prompt += if thinking && (!drop || index as isize >= last_user) {
            THINK_START
        } else {
            THINK_END
        };
    }
    Ok(prompt)
}
