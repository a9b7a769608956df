//! MiniMax-M2: `<minimax:tool_call>` around one or more
//! `<invoke name="NAME"><parameter name="KEY">VALUE</parameter></invoke>`
//! (vLLM's `minimax_m2` parser): names in either quote, values stripped of
//! surrounding whitespace and typed by the schema.

use serde_json::Map;

use super::Syntax;
use super::partial::{XmlCut, name_end};
use super::{Schemas, ToolCall, call};

/// MiniMax's calls read while they are written (see `partial`).
pub(super) const CUT: XmlCut = XmlCut {
    ends: &["</parameter>", "</invoke>"],
    named: |block| name_end(block, "<invoke name=", &['>'], true),
    call_end: "</invoke>",
    closers: "</invoke></minimax:tool_call>",
};

/// `name="X">` or `name='X'>` at the start of `s`: X and what follows.
fn named(s: &str) -> Option<(&str, &str)> {
    let (head, rest) = s.split_once('>')?;
    let name = head.trim().trim_matches(['"', '\'']);
    Some((name, rest))
}

pub(super) fn parse(block: &str, schemas: &Schemas<'_>) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    for scope in block.split("<minimax:tool_call>").skip(1) {
        let (scope, _) = scope
            .split_once("</minimax:tool_call>")
            .ok_or("a <minimax:tool_call> block is not closed")?;
        for invoke in scope.split("<invoke name=").skip(1) {
            let i = calls.len();
            let (invoke, _) = invoke
                .split_once("</invoke>")
                .ok_or_else(|| format!("call {i} has no </invoke>"))?;
            let (name, mut rest) =
                named(invoke).ok_or_else(|| format!("call {i}: <invoke name= is not closed"))?;
            let mut args = Map::new();
            while let Some((_, after)) = rest.split_once("<parameter name=") {
                let (key, after) = named(after)
                    .ok_or_else(|| format!("call {i}: <parameter name= is not closed"))?;
                let (value, after) = after
                    .split_once("</parameter>")
                    .ok_or_else(|| format!("call {i}: parameter `{key}` has no </parameter>"))?;
                args.insert(key.to_string(), schemas.value(name, key, value.trim()));
                rest = after;
            }
            calls.push(call(i, name, args));
        }
    }
    Ok(calls)
}

/// MiniMax-M2's format.
pub(super) static MINIMAX: Syntax = Syntax {
    name: "minimax_m2",
    opener: "<minimax:tool_call>",
    shown_by: |model| model.has("<minimax:tool_call>"),
    opening: Some(|name| vec![format!("<minimax:tool_call>\n<invoke name=\"{name}\">")]),
    parse: |block, schemas| parse(block, schemas),
    partial: |block, schemas| CUT.read(block, |b| parse(b, schemas)),
    writes_ids: false,
};
