//! Kimi K2's sections: `<|tool_calls_section_begin|>`, then per call
//! `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>`.
//! The id is the `functions.NAME:IDX` the model wrote (Kimi's template
//! echoes it back as `## Return of {id}`), the name its part between the
//! last `.` and the `:` (vLLM's `kimi_k2` parser).

use super::Syntax;
use super::partial::open_json;
use super::{ToolCall, json_arguments};

const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARGUMENT_BEGIN: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";

pub(super) fn parse(block: &str) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for part in block.split(CALL_BEGIN).skip(1) {
        let Some((id, rest)) = part.split_once(ARGUMENT_BEGIN) else {
            return Err(format!("no {ARGUMENT_BEGIN} after {CALL_BEGIN}{part}"));
        };
        let Some((arguments, _)) = rest.split_once(CALL_END) else {
            return Err(format!("call `{}` has no {CALL_END}", id.trim()));
        };
        let id = id.trim();
        calls.push(ToolCall {
            id: id.to_string(),
            name: name_of(id)?.to_string(),
            arguments: json_arguments(arguments)?,
        });
    }
    Ok(calls)
}

/// The NAME of an id `functions.NAME:IDX`.
fn name_of(id: &str) -> Result<&str, String> {
    id.rsplit_once(':')
        .filter(|(_, idx)| idx.parse::<u32>().is_ok())
        .map(|(head, _)| head.rsplit('.').next().unwrap_or(head))
        .ok_or_else(|| format!("call id `{id}` is not functions.NAME:IDX"))
}

/// The calls so far of a block still being written (see `partial`).
pub(super) fn partial(block: &str) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    for part in block.split(CALL_BEGIN).skip(1) {
        let Some((id, rest)) = part.split_once(ARGUMENT_BEGIN) else {
            break;
        };
        let id = id.trim();
        let Ok(name) = name_of(id) else {
            break;
        };
        let (arguments, closed) = match rest.split_once(CALL_END) {
            Some((arguments, _)) => match json_arguments(arguments) {
                Ok(arguments) => (arguments, true),
                Err(_) => break,
            },
            None => (open_json(rest, CALL_END), false),
        };
        calls.push(ToolCall {
            id: id.to_string(),
            name: name.to_string(),
            arguments,
        });
        if !closed {
            break;
        }
    }
    calls
}

/// Kimi K2's format.
pub(super) static KIMI: Syntax = Syntax {
    name: "kimi_k2",
    opener: "<|tool_calls_section_begin|>",
    shown_by: |model| model.has("<|tool_calls_section_begin|>"),
    opening: Some(|name| {
        vec![format!(
            "<|tool_calls_section_begin|>{CALL_BEGIN}functions.{name}:"
        )]
    }),
    parse: |block, _| parse(block),
    partial: |block, _| partial(block),
    writes_ids: true,
};
