//! gpt-oss's harmony calls: a commentary message to a tool,
//! `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`
//! (the recipient may also stand before the channel). The answer splitter
//! writes each as `<|channel|>commentary to=functions.NAME<|message|>{…}`
//! (harmony's framing tokens are not text); this reads them back, the name
//! being the recipient after `functions.`, as vLLM's `openai` parser has it.

use super::Syntax;
use super::partial::open_json;
use super::{ToolCall, call_id, json_arguments};
use crate::generate::channels::{HARMONY_ARGS, HARMONY_CALL};

pub(super) fn parse(block: &str) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for part in block.split(HARMONY_CALL).skip(1) {
        let i = calls.len();
        let (to, arguments) = part
            .split_once(HARMONY_ARGS)
            .ok_or_else(|| format!("call {i} to `{part}` has no message"))?;
        calls.push(ToolCall {
            id: call_id(i),
            name: name_of(to),
            arguments: json_arguments(arguments)?,
        });
    }
    Ok(calls)
}

/// The tool a recipient `functions.NAME` names.
fn name_of(to: &str) -> String {
    to.strip_prefix("functions.")
        .unwrap_or(to)
        .trim()
        .to_string()
}

/// The calls so far of an answer still being written (see `partial`): a
/// call's arguments end where the next call begins.
pub(super) fn partial(block: &str) -> Vec<ToolCall> {
    let parts: Vec<&str> = block.split(HARMONY_CALL).skip(1).collect();
    let mut calls = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let Some((to, arguments)) = part.split_once(HARMONY_ARGS) else {
            break;
        };
        let arguments = if i + 1 == parts.len() {
            open_json(arguments, HARMONY_CALL)
        } else {
            match json_arguments(arguments) {
                Ok(arguments) => arguments,
                Err(_) => break,
            }
        };
        calls.push(ToolCall {
            id: call_id(i),
            name: name_of(to),
            arguments,
        });
    }
    calls
}

/// gpt-oss's harmony messages. A call is the header of a message of its own,
/// which decoding is not held to: no openings.
pub(super) static HARMONY: Syntax = Syntax {
    name: "harmony",
    opener: HARMONY_CALL,
    shown_by: |model| model.token("<|call|>") && model.token("<|channel|>"),
    opening: None,
    parse: |block, _| parse(block),
    partial: |block, _| partial(block),
    writes_ids: false,
};
