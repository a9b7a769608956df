//! The calls of an answer still being written, for a stream to send as
//! they grow (Chat Completions' `tool_calls` deltas, Responses'
//! `function_call_arguments.delta`, Messages' `input_json_delta`). A
//! fragment sent cannot be taken back, so what is read of a call's
//! arguments so far must be a prefix of what the whole answer reads to.
//! Two rules keep that, one per kind of format:
//!
//! - Arguments a model writes as JSON (Kimi, DeepSeek V3.1, Hermes,
//!   harmony) are returned as written, trimmed: their text so far is that
//!   text, short of trailing whitespace and of an end marker half-written.
//! - Arguments built from XML parameters (Qwen3-Coder, GLM, MiniMax, DSML)
//!   are an object serialized in the order written: the text so far is the
//!   object of the parameters already closed, short of its final `}`. It is
//!   read by cutting the answer after the last closed part, closing it with
//!   the format's closers and handing it to the format's own parser, so the
//!   partial and the whole reading cannot disagree on a value.
//!
//! A call's id and name are given only once they are whole, and every call
//! but the last is given whole.

use super::ToolCall;

/// How many bytes at the end of `text` are the start of `marker` (at a
/// character boundary of both).
pub(super) fn overlap(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| marker.is_char_boundary(n) && text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

/// What is sure of JSON arguments still being written: `region` is the
/// text after their opening marker, `end` the marker that will close them.
/// Text that cannot begin an object yields nothing (the whole answer will
/// not read as a call, and the stream falls back to text).
pub(super) fn open_json(region: &str, end: &str) -> String {
    let sure = region[..region.len() - overlap(region, end)].trim();
    if sure.starts_with('{') {
        sure.to_string()
    } else {
        String::new()
    }
}

/// Where an XML-style format's answer so far can be cut and still read as
/// whole calls, and what closes it.
pub(super) struct XmlCut {
    /// Markers after which the answer reads as whole calls: a closed
    /// parameter, a closed call.
    pub ends: &'static [&'static str],
    /// Where the last call's name surely ends in the block, if it has.
    pub named: fn(&str) -> Option<usize>,
    /// The marker a call ends with, to count the calls already closed.
    pub call_end: &'static str,
    /// What closes the cut text's open call and block.
    pub closers: &'static str,
}

impl XmlCut {
    /// The calls of `block` so far, read by `parse` (see the module's doc).
    pub fn read(
        &self,
        block: &str,
        parse: impl Fn(&str) -> Result<Vec<ToolCall>, String>,
    ) -> Vec<ToolCall> {
        let cut = self
            .ends
            .iter()
            .filter_map(|end| block.rfind(end).map(|at| at + end.len()))
            .chain((self.named)(block))
            .max();
        let Some(cut) = cut else {
            return Vec::new();
        };
        let Ok(mut calls) = parse(&format!("{}{}", &block[..cut], self.closers)) else {
            return Vec::new();
        };
        let closed = block.matches(self.call_end).count();
        if calls.len() > closed
            && let Some(last) = calls.last_mut()
        {
            // Parameters still to come go before the object's `}`.
            last.arguments.pop();
        }
        calls
    }
}

/// Where a name opened by the last `open` ends at the first of `ends`
/// (`past`: the cut goes after that character rather than before it).
pub(super) fn name_end(block: &str, open: &str, ends: &[char], past: bool) -> Option<usize> {
    let start = block.rfind(open)? + open.len();
    let at = start + block[start..].find(ends)?;
    Some(if past { at + 1 } else { at })
}
