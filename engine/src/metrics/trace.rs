//! Routing traces: every expert lookup in order, as the cache saw it.

use std::io::Write;
use std::path::Path;

use super::Access;
use crate::cache::Routed;

/// Groups decode lookups (one per MoE layer per token) into tokens.
pub fn per_token(decode: &[Routed]) -> Vec<Vec<Routed>> {
    let layers = decode
        .iter()
        .map(|r| r.layer)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        .max(1);
    decode.chunks(layers).map(<[_]>::to_vec).collect()
}

/// One access per (layer, expert) of every lookup.
pub fn accesses(lookups: &[Routed]) -> Vec<Access> {
    lookups
        .iter()
        .flat_map(|r| r.experts.iter().map(move |&(i, _)| (r.layer, i)))
        .collect()
}

/// Writes one JSON line per lookup: `{"layer": L, "ids": [...], "rows":
/// [...]}`. During a prompt's prefill one lookup covers several tokens, and
/// `rows` says how many took each expert; while decoding, each lookup is one
/// token's experts for one layer (rows all 1).
pub fn write_jsonl(path: &Path, lookups: &[Routed]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(crate::private::create(path)?);
    for r in lookups {
        let (ids, rows): (Vec<usize>, Vec<u32>) = r.experts.iter().copied().unzip();
        serde_json::to_writer(
            &mut out,
            &serde_json::json!({"layer": r.layer, "ids": ids, "rows": rows}),
        )?;
        out.write_all(b"\n")?;
    }
    out.flush()
}
