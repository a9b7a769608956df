//! GLM-4.5 to 4.7: `<tool_call>NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>`
//! pairs and `</tool_call>`; 4.5 and 4.6 put newlines between the parts,
//! 4.7 none (vLLM's `glm45` and `glm47` parsers; this reads both). The name
//! ends at the first newline or `<arg_key>`; values are typed by the schema.

use serde_json::Map;

use super::Syntax;
use super::partial::{XmlCut, name_end};
use super::{Schemas, ToolCall, call};

/// GLM's calls read while they are written (see `partial`).
pub(super) const CUT: XmlCut = XmlCut {
    ends: &["</arg_value>", "</tool_call>"],
    named: |block| name_end(block, "<tool_call>", &['\n', '<'], false),
    call_end: "</tool_call>",
    closers: "</tool_call>",
};

pub(super) fn parse(block: &str, schemas: &Schemas<'_>) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for part in block.split("<tool_call>").skip(1) {
        let i = calls.len();
        let (body, _) = part
            .split_once("</tool_call>")
            .ok_or_else(|| format!("call {i} has no </tool_call>"))?;
        let name_end = body.find(['\n', '<']).unwrap_or(body.len());
        let name = body[..name_end].trim();
        if name.is_empty() {
            return Err(format!("call {i} has no name"));
        }
        let mut args = Map::new();
        let mut rest = &body[name_end..];
        while let Some((_, after)) = rest.split_once("<arg_key>") {
            let (key, after) = after
                .split_once("</arg_key>")
                .ok_or_else(|| format!("call {i}: <arg_key> is not closed"))?;
            let (_, after) = after
                .split_once("<arg_value>")
                .ok_or_else(|| format!("call {i}: argument `{key}` has no <arg_value>"))?;
            let (value, after) = after
                .split_once("</arg_value>")
                .ok_or_else(|| format!("call {i}: argument `{key}` has no </arg_value>"))?;
            let key = key.trim();
            args.insert(key.to_string(), schemas.value(name, key, value));
            rest = after;
        }
        calls.push(call(i, name, args));
    }
    Ok(calls)
}

/// GLM-4.5 to 4.7's format.
pub(super) static GLM: Syntax = Syntax {
    name: "glm4_moe",
    opener: "<tool_call>",
    shown_by: |model| model.has("<arg_key>"),
    opening: Some(|name| {
        ["\n", "<arg_key>", "</tool_call>"]
            .iter()
            .map(|after| format!("<tool_call>{name}{after}"))
            .collect()
    }),
    parse: |block, schemas| parse(block, schemas),
    partial: |block, schemas| CUT.read(block, |b| parse(b, schemas)),
    writes_ids: false,
};
