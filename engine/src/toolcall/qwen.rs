//! Qwen's two formats. Qwen3 and Qwen3-Next write Hermes JSON, one block a
//! call: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`
//! (vLLM's `hermes` parser; an unclosed last block is read too). Qwen3-Coder
//! and Qwen3.5 write XML: `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`
//! (`qwen3_coder`), values typed by the schema, one newline trimmed each side.

use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Syntax;
use super::partial::{XmlCut, name_end, overlap};
use super::{Schemas, ToolCall, call, call_id, json_arguments};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const ARGUMENTS: &str = "\"arguments\"";

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
        .map(|(i, body)| hermes_call(i, body))
        .collect()
}

/// One call's JSON; its arguments are kept as written (see `partial`).
fn hermes_call(i: usize, body: &str) -> Result<ToolCall, String> {
    let body = body.trim();
    let call: HashMap<String, Box<RawValue>> =
        serde_json::from_str(body).map_err(|e| format!("call {i} is not JSON ({e}): {body}"))?;
    let name = call
        .get("name")
        .and_then(|n| serde_json::from_str::<String>(n.get()).ok())
        .ok_or_else(|| format!("call {i} has no name: {body}"))?;
    let arguments = match call.get("arguments").map(|a| a.get()) {
        None | Some("null") => "{}".into(),
        // Some models write the arguments as a JSON string.
        Some(quoted) if quoted.starts_with('"') => {
            let text: String = serde_json::from_str(quoted)
                .map_err(|e| format!("call {i}: arguments are not a string ({e})"))?;
            json_arguments(&text)?
        }
        Some(raw) => json_arguments(raw).map_err(|e| format!("call {i}: {e}"))?,
    };
    Ok(ToolCall {
        id: call_id(i),
        name,
        arguments,
    })
}

/// The calls so far of Hermes blocks still being written (see `partial`).
/// An open call is given once its name stands before `"arguments"`; its
/// arguments so far are the object as written, short of the `}` and
/// whitespace that may close the call's own object instead. Arguments
/// written as a string come whole at the end.
pub(super) fn partial_hermes(block: &str) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    for (i, part) in block.split(OPEN).skip(1).enumerate() {
        match part.split_once(CLOSE) {
            Some((body, _)) => match hermes_call(i, body) {
                Ok(call) => calls.push(call),
                Err(_) => break,
            },
            None => {
                calls.extend(open_hermes(i, part));
                break;
            }
        }
    }
    calls
}

fn open_hermes(i: usize, part: &str) -> Option<ToolCall> {
    let body = &part[..part.len() - overlap(part, CLOSE)];
    let at = body.find(ARGUMENTS)?;
    let head = body[..at].trim().trim_end_matches(',');
    let head: Value = serde_json::from_str(&format!("{head}}}")).ok()?;
    let name = head.get("name")?.as_str()?;
    let value = body[at + ARGUMENTS.len()..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let arguments = if value.starts_with('{') {
        value.trim_end_matches(|c: char| c == '}' || c.is_whitespace())
    } else {
        ""
    };
    Some(ToolCall {
        id: call_id(i),
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

/// One newline trimmed off each end, as the XML parsers trim a value.
pub(super) fn trim_newline(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

/// Qwen's XML read while it is written (see `partial`).
pub(super) const XML_CUT: XmlCut = XmlCut {
    ends: &["</parameter>", "</function>"],
    named: |block| name_end(block, "<function=", &['>'], true),
    call_end: "</function>",
    closers: "",
};

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

/// Qwen3's Hermes JSON.
pub(super) static HERMES: Syntax = Syntax {
    name: "hermes",
    opener: OPEN,
    shown_by: |model| model.has(OPEN),
    opening: Some(|name| vec![format!("{OPEN}\n{{\"name\": \"{name}\"")]),
    parse: |block, _| parse_hermes(block),
    partial: |block, _| partial_hermes(block),
    writes_ids: false,
};

/// Qwen3-Coder's and Qwen3.5's XML: Hermes' marker, with the template
/// writing `<function=`.
pub(super) static XML: Syntax = Syntax {
    name: "qwen3_xml",
    opener: OPEN,
    shown_by: |model| model.has(OPEN) && model.prompts_mention("<function="),
    opening: Some(|name| vec![format!("{OPEN}\n<function={name}>")]),
    parse: |block, schemas| parse_xml(block, schemas),
    partial: |block, schemas| XML_CUT.read(block, |b| parse_xml(b, schemas)),
    writes_ids: false,
};
