//! DeepSeek's two formats. V3.1 chains tool tokens:
//! `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`,
//! where V3 and R1 wrote `function<｜tool▁sep｜>NAME\n```json\n{…}\n```` (vLLM's
//! `deepseek_v31` and `deepseek_v3`). V3.2 and V4 write DSML, as their
//! encoders' `parse_tool_calls` reads it:
//!
//! ```text
//! <｜DSML｜function_calls>            (V4: tool_calls)
//! <｜DSML｜invoke name="NAME">
//! <｜DSML｜parameter name="KEY" string="true">text</｜DSML｜parameter>
//! <｜DSML｜parameter name="KEY" string="false">JSON</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜function_calls>
//! ```
//!
//! `string="false"` values are JSON as the release's decoder reads them.

use serde_json::{Map, Value};

use super::partial::{XmlCut, name_end, open_json};
use super::{DS_CALLS_BEGIN, DSML, Syntax};
use super::{Schemas, ToolCall, call, call_id, json_arguments};

const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const SEP: &str = "<｜tool▁sep｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";

pub(super) fn parse_tokens(block: &str) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for part in block.split(CALL_BEGIN).skip(1) {
        let i = calls.len();
        let (call_text, _) = part
            .split_once(CALL_END)
            .ok_or_else(|| format!("call {i} has no {CALL_END}"))?;
        calls.push(token_call(i, call_text)?);
    }
    Ok(calls)
}

/// One whole call between the call tokens.
fn token_call(i: usize, call_text: &str) -> Result<ToolCall, String> {
    let (head, body) = call_text
        .split_once(SEP)
        .ok_or_else(|| format!("call {i} has no {SEP}"))?;
    // V3: `function<sep>NAME\n```json\n{…}\n```` ; V3.1: `NAME<sep>{…}`.
    let (name, arguments) = match body.split_once(FENCE) {
        Some((name, fenced)) if head.trim() == V3_HEAD => {
            (name, fenced.trim_end().trim_end_matches("```"))
        }
        _ => (head, body),
    };
    Ok(ToolCall {
        id: call_id(i),
        name: name.trim().to_string(),
        arguments: json_arguments(arguments)?,
    })
}

const FENCE: &str = "\n```json\n";
const V3_HEAD: &str = "function";

/// The calls so far of a block still being written (see `partial`). V3's
/// fenced arguments come whole at the end.
pub(super) fn partial_tokens(block: &str) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    for part in block.split(CALL_BEGIN).skip(1) {
        let i = calls.len();
        if let Some((call_text, _)) = part.split_once(CALL_END) {
            match token_call(i, call_text) {
                Ok(call) => calls.push(call),
                Err(_) => break,
            }
            continue;
        }
        let Some((head, body)) = part.split_once(SEP) else {
            break;
        };
        let (name, arguments) = if head.trim() == V3_HEAD {
            match body.split_once(FENCE) {
                Some((name, _)) => (name, String::new()),
                None => break,
            }
        } else {
            (head, open_json(body, CALL_END))
        };
        calls.push(ToolCall {
            id: call_id(i),
            name: name.trim().to_string(),
            arguments,
        });
        break;
    }
    calls
}

const INVOKE: &str = "<｜DSML｜invoke name=\"";
const INVOKE_END: &str = "</｜DSML｜invoke>";
const PARAMETER: &str = "<｜DSML｜parameter name=\"";
const PARAMETER_END: &str = "</｜DSML｜parameter>";

/// DSML read while it is written (see `partial`).
pub(super) const DSML_CUT: XmlCut = XmlCut {
    ends: &[PARAMETER_END, INVOKE_END],
    named: |block| name_end(block, INVOKE, &['>'], true),
    call_end: INVOKE_END,
    closers: INVOKE_END,
};

pub(super) fn parse_dsml(block: &str, schemas: &Schemas<'_>) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for invoke in block.split(INVOKE).skip(1) {
        let i = calls.len();
        let (invoke, _) = invoke
            .split_once(INVOKE_END)
            .ok_or_else(|| format!("call {i} has no {INVOKE_END}"))?;
        let (name, mut rest) = invoke
            .split_once("\">")
            .ok_or_else(|| format!("call {i}: the invoke's name is not closed"))?;
        let mut args = Map::new();
        while let Some((_, after)) = rest.split_once(PARAMETER) {
            let (key, after) = after
                .split_once("\" string=\"")
                .ok_or_else(|| format!("call {i}: a parameter has no string=\"true|false\""))?;
            let (kind, after) = after
                .split_once("\">")
                .ok_or_else(|| format!("call {i}: parameter `{key}` is not closed"))?;
            let (value, after) = after
                .split_once(PARAMETER_END)
                .ok_or_else(|| format!("call {i}: parameter `{key}` has no {PARAMETER_END}"))?;
            let value = match kind {
                "true" => Value::String(value.to_string()),
                "false" => serde_json::from_str(value.trim())
                    .unwrap_or_else(|_| schemas.value(name, key, value)),
                other => {
                    return Err(format!(
                        "call {i}: parameter `{key}` has string=\"{other}\""
                    ));
                }
            };
            args.insert(key.to_string(), value);
            rest = after;
        }
        calls.push(call(i, name, args));
    }
    Ok(calls)
}

/// DeepSeek V3.1's tool tokens (and V3's fenced JSON).
pub(super) static TOKENS: Syntax = Syntax {
    name: "deepseek_v31",
    opener: DS_CALLS_BEGIN,
    shown_by: |model| model.has(DS_CALLS_BEGIN),
    opening: Some(|name| {
        vec![
            format!("{DS_CALLS_BEGIN}{CALL_BEGIN}{name}{SEP}"),
            format!("{DS_CALLS_BEGIN}{CALL_BEGIN}{V3_HEAD}{SEP}{name}\n"),
        ]
    }),
    parse: |block, _| parse_tokens(block),
    partial: |block, _| partial_tokens(block),
    writes_ids: false,
};

/// DeepSeek V3.2's and V4's DSML.
pub(super) static DSML_CALLS: Syntax = Syntax {
    name: "dsml",
    opener: "<｜DSML｜",
    shown_by: |model| model.has(DSML),
    opening: Some(|name| {
        ["function_calls", "tool_calls"]
            .iter()
            .map(|block| format!("<{DSML}{block}>\n<{DSML}invoke name=\"{name}\">"))
            .collect()
    }),
    parse: |block, schemas| parse_dsml(block, schemas),
    partial: |block, schemas| DSML_CUT.read(block, |b| parse_dsml(b, schemas)),
    writes_ids: false,
};
