//! Qwen's two formats. Qwen3 and Qwen3-Next write Hermes JSON, one block a
//! call: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`
//! (vLLM's `hermes` parser; an unclosed last block is read too). Qwen3-Coder
//! and Qwen3.5 write XML: `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`
//! (`qwen3_coder`), values typed by the schema, one newline trimmed each side.

use serde_json::{Map, Value};

use super::{Schemas, ToolCall, call, call_id, json_arguments};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The bodies of the `<tool_call>` blocks in `block`; the last may be unclosed.
fn bodies(block: &str) -> impl Iterator<Item = &str> {
    block
        .split(OPEN)
        .skip(1)
        .map(|b| b.split_once(CLOSE).map_or(b, |(body, _)| body))
}

pub(super) fn parse_hermes(block: &str) -> Result<Vec<ToolCall>, String> {
    bodies(block)
        .enumerate()
        .map(|(i, body)| {
            let call: Value = serde_json::from_str(body.trim())
                .map_err(|e| format!("call {i} is not JSON ({e}): {}", body.trim()))?;
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("call {i} has no name: {call}"))?;
            let arguments = match call.get("arguments") {
                // Some models write the arguments as a JSON string.
                Some(Value::String(s)) => json_arguments(s)?,
                Some(Value::Object(o)) => Value::Object(o.clone()).to_string(),
                None | Some(Value::Null) => "{}".into(),
                Some(other) => {
                    return Err(format!("call {i}: arguments are not an object: {other}"));
                }
            };
            Ok(ToolCall {
                id: call_id(i),
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}

/// One newline trimmed off each end, as the XML parsers trim a value.
pub(super) fn trim_newline(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

pub(super) fn parse_xml(block: &str, schemas: &Schemas<'_>) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for body in bodies(block) {
        let i = calls.len();
        let Some(function) = body.split_once("<function=").map(|(_, f)| f) else {
            return Err(format!("call {i} has no <function=NAME>"));
        };
        let (name, mut rest) = function
            .split_once('>')
            .ok_or_else(|| format!("call {i}: <function= is not closed"))?;
        let mut args = Map::new();
        while let Some((_, after)) = rest.split_once("<parameter=") {
            let (key, value) = after
                .split_once('>')
                .ok_or_else(|| format!("call {i}: <parameter= is not closed"))?;
            let (value, tail) = value
                .split_once("</parameter>")
                .ok_or_else(|| format!("call {i}: parameter `{key}` has no </parameter>"))?;
            args.insert(
                key.to_string(),
                schemas.value(name, key, trim_newline(value)),
            );
            rest = tail;
        }
        calls.push(call(i, name, args));
    }
    Ok(calls)
}
