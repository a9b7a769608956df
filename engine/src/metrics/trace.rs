//! Routing traces: every expert lookup in order, as the cache saw it.

use std::io::Write;
use std::path::Path;

use super::Access;
use crate::cache::Lookup;

/// Groups decode lookups (one per MoE layer per token) into tokens.
pub fn per_token(decode: &[Lookup]) -> Vec<Vec<Lookup>> {
    let layers = decode
        .iter()
        .map(|(l, _)| *l)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        .max(1);
    decode.chunks(layers).map(<[_]>::to_vec).collect()
}

/// One access per (layer, expert) of every lookup.
pub fn accesses(lookups: &[Lookup]) -> Vec<Access> {
    lookups
        .iter()
        .flat_map(|(l, ids)| ids.iter().map(move |&i| (*l, i)))
        .collect()
}

/// Writes one JSON line per lookup: `{"layer": L, "ids": [...]}`. During a
/// prompt's prefill one lookup covers several tokens; while decoding, each
/// lookup is one token's experts for one layer.
pub fn write_jsonl(path: &Path, lookups: &[Lookup]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(crate::private::create(path)?);
    for (layer, ids) in lookups {
        serde_json::to_writer(&mut out, &serde_json::json!({"layer": layer, "ids": ids}))?;
        out.write_all(b"\n")?;
    }
    out.flush()
}
