//! What DeepSeek-V3.2's and V4's encoders share: JSON as `json.dumps` writes
//! it, OpenAI-form tools and tool calls, and DSML parameters.

use serde_json::Value;

use crate::tokenizer::ChatMessage;
use crate::tokenizer::python::{DumpOptions, dumps};

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";
pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";
pub const DSML: &str = "｜DSML｜";

/// `json.dumps(value, ensure_ascii=False)`.
pub fn to_json(value: &Value) -> String {
    let v = minijinja::Value::from(minijinja::value::Serde(value));
    // Every JSON value serialises; a failure could only come from a
    // non-JSON value, which serde_json cannot hold.
    dumps(&v, &DumpOptions::default()).unwrap_or_else(|_| value.to_string())
}

/// `tools_from_openai_format`: each tool's `function`.
pub fn tools_from_openai(tools: &Value) -> Result<Vec<Value>, String> {
    let list = tools
        .as_array()
        .ok_or_else(|| "`tools` must be a list".to_string())?;
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            t.get("function")
                .cloned()
                .ok_or_else(|| format!("tool {i} has no `function`"))
        })
        .collect()
}

/// One call as the encoders read it: the function's name and its arguments
/// as the JSON text the model wrote.
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// `tool_calls_from_openai_format`.
pub fn tool_calls_from_openai(calls: &Value) -> Result<Vec<ToolCall>, String> {
    let list = calls
        .as_array()
        .ok_or_else(|| "`tool_calls` must be a list".to_string())?;
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c
                .get("function")
                .ok_or_else(|| format!("tool call {i} has no `function`"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("tool call {i} has no function `name`"))?;
            let arguments = match f.get("arguments") {
                Some(Value::String(a)) => a.clone(),
                other => {
                    return Err(format!(
                        "tool call {i}'s `arguments` must be a JSON string, not {}",
                        other.map_or("nothing".to_string(), Value::to_string)
                    ));
                }
            };
            Ok(ToolCall {
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}

/// `encode_arguments_to_dsml`: one DSML parameter per argument, strings as
/// they are, anything else as JSON. V4 takes arguments that are not a JSON
/// object as one argument named `arguments`; V3.2 refuses them.
pub fn arguments_to_dsml(call: &ToolCall, tolerant: bool) -> Result<String, String> {
    let parsed: Result<serde_json::Map<String, Value>, _> = serde_json::from_str(&call.arguments);
    let arguments = match parsed {
        Ok(map) => map,
        Err(_) if tolerant => {
            let mut m = serde_json::Map::new();
            m.insert("arguments".into(), Value::String(call.arguments.clone()));
            m
        }
        Err(e) => {
            return Err(format!(
                "the arguments of `{}` are not a JSON object: {e}",
                call.name
            ));
        }
    };
    let params: Vec<String> = arguments
        .iter()
        .map(|(k, v)| {
            let (is_str, value) = match v {
                Value::String(s) => ("true", s.clone()),
                other => ("false", to_json(other)),
            };
            format!("<{DSML}parameter name=\"{k}\" string=\"{is_str}\">{value}</{DSML}parameter>")
        })
        .collect();
    Ok(params.join("\n"))
}

/// `<｜DSML｜invoke name="…">` blocks of a message's calls, inside a
/// `<｜DSML｜{block}>` block, led by a blank line.
pub fn tool_calls_block(calls: &[ToolCall], block: &str, tolerant: bool) -> Result<String, String> {
    let invokes = calls
        .iter()
        .map(|c| {
            Ok(format!(
                "<{DSML}invoke name=\"{}\">\n{}\n</{DSML}invoke>",
                c.name,
                arguments_to_dsml(c, tolerant)?
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(format!(
        "\n\n<{DSML}{block}>\n{}\n</{DSML}{block}>",
        invokes.join("\n")
    ))
}

/// `find_last_user_index`: the last user or developer message, -1 when
/// there is none (the encoders compare positions against it).
pub fn last_user_index(messages: &[ChatMessage]) -> isize {
    messages
        .iter()
        .rposition(|m| m.role == "user" || m.role == "developer")
        .map_or(-1, |i| i as isize)
}

/// Python's truth of a JSON value: empty strings, lists and objects, zero,
/// false and null are false.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `"## Response Format…"` for a message's `response_format`.
pub fn response_format(schema: &Value) -> String {
    format!(
        "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{}",
        to_json(schema)
    )
}
