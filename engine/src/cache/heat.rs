//! What a pack's earlier runs routed to, kept in a file next to the pack:
//! the heat histogram (a decayed count of how often each (layer, expert) was
//! routed to), from which the next run seeds its cache before the first
//! token; and the routing trace summary (the latest lookups in order, each
//! expert with the rows that took it), on which eviction policies are
//! replayed to choose the pack's own (see [`super::choose`]), with the
//! policy last chosen.
//!
//! The trace is kept to [`TRACE_ACCESSES`] expert lookups: 1,365 tokens of a
//! 24-layer top-8 model, 178 of a 92-layer top-16 one, at 4 bytes a lookup
//! before compression; replaying the 18 candidates over it takes a few
//! seconds off the model's thread.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::policy::EvictionPolicy;
use crate::kernels::math::powf;

/// Each lookup multiplies all earlier heat by this (a half-life of ~70k lookups,
/// a few hundred tokens of a large model), so the histogram follows drift in
/// what is being asked without forgetting a session at once.
const DECAY_PER_LOOKUP: f64 = 0.99999;
const HEAT_FILE: &str = "longhaul-heat.json";
/// Version 2 added the trace and the chosen policy; version 1 files still load.
const HEAT_VERSION: u32 = 2;
const OLDEST_VERSION: u32 = 1;
/// Expert lookups the trace summary keeps (the oldest go first).
pub const TRACE_ACCESSES: usize = 1 << 18;
/// zstd level for the stored trace.
const TRACE_LEVEL: i32 = 3;

type Key = (usize, usize);

/// One lookup as the cache saw it: a layer, and each expert asked for with
/// the number of rows routed to it (one while decoding, up to a chunk's
/// length for a prompt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    pub layer: usize,
    pub experts: Vec<(usize, u32)>,
}

#[derive(Debug, Clone, Default)]
pub struct HeatMap {
    /// Heat as of `tick`, per expert: (value, tick it was last brought up to date).
    entries: HashMap<Key, (f64, u64)>,
    tick: u64,
    /// The latest lookups, oldest first, and the expert lookups they hold.
    trace: VecDeque<Routed>,
    trace_accesses: usize,
    /// The policy chosen from the trace last time.
    pub policy: Option<EvictionPolicy>,
    /// Whether the cache kept compressed records packed when it last ran
    /// (see [`super::packed`]).
    pub packed: Option<bool>,
}

#[derive(Serialize, Deserialize)]
struct HeatFile {
    version: u32,
    /// (layer, expert, heat), hottest first.
    entries: Vec<(usize, usize, f64)>,
    /// The trace: zstd of (layer, count, then count × (expert, rows)) as
    /// little-endian u16s, in base64.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    trace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<EvictionPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    packed: Option<bool>,
}

/// Why a stored trace could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("the trace is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("the trace does not decompress: {0}")]
    Zstd(#[from] std::io::Error),
    #[error("the trace breaks off at byte {0}")]
    Truncated(usize),
}

/// The trace in its stored form (see [`HeatFile::trace`]).
fn encode_trace(trace: &VecDeque<Routed>) -> std::io::Result<String> {
    let mut raw = Vec::new();
    let mut put =
        |v: usize| raw.extend_from_slice(&(v.min(u16::MAX as usize) as u16).to_le_bytes());
    for r in trace {
        put(r.layer);
        put(r.experts.len());
        for &(id, rows) in &r.experts {
            put(id);
            put(rows as usize);
        }
    }
    let packed = zstd::bulk::compress(&raw, TRACE_LEVEL)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(packed))
}

/// Reads a stored trace back, keeping at most [`TRACE_ACCESSES`] lookups.
fn decode_trace(text: &str) -> Result<VecDeque<Routed>, TraceError> {
    let packed = base64::engine::general_purpose::STANDARD.decode(text)?;
    // At most a full trace's bytes: 4 per lookup plus 4 per layer entry.
    let limit = TRACE_ACCESSES as u64 * 8 + 4;
    let mut raw = Vec::new();
    zstd::stream::read::Decoder::new(packed.as_slice())?
        .take(limit)
        .read_to_end(&mut raw)?;
    let mut words = raw.chunks(2).enumerate();
    let mut next = || -> Result<usize, TraceError> {
        match words.next() {
            Some((_, &[a, b])) => Ok(usize::from(u16::from_le_bytes([a, b]))),
            Some((i, _)) => Err(TraceError::Truncated(i * 2)),
            None => Err(TraceError::Truncated(raw.len())),
        }
    };
    let words_total = raw.len().div_ceil(2);
    let mut read = 0usize;
    let mut trace = VecDeque::new();
    let mut accesses = 0;
    while read < words_total && accesses < TRACE_ACCESSES {
        let layer = next()?;
        let count = next()?;
        read += 2 + 2 * count;
        let mut experts = Vec::with_capacity(count.min(TRACE_ACCESSES));
        for _ in 0..count {
            let id = next()?;
            experts.push((id, next()? as u32));
        }
        accesses += count;
        trace.push_back(Routed { layer, experts });
    }
    Ok(trace)
}

impl HeatMap {
    /// The path of a pack's heat file.
    pub fn path(pack: &Path) -> PathBuf {
        pack.join(HEAT_FILE)
    }

    /// Loads a pack's heat file; a missing or unreadable one gives an empty map.
    pub fn load(pack: &Path) -> Self {
        let Ok(text) = crate::regular::read_text(&Self::path(pack), crate::regular::LARGE_LIMIT)
        else {
            return Self::default();
        };
        let file = serde_json::from_str::<HeatFile>(&text)
            .ok()
            .filter(|f| (OLDEST_VERSION..=HEAT_VERSION).contains(&f.version));
        match file {
            Some(f) => {
                let trace = match f.trace.is_empty() {
                    true => VecDeque::new(),
                    false => decode_trace(&f.trace).unwrap_or_else(|e| {
                        tracing::warn!(
                            "{}: {e}; the trace starts anew",
                            Self::path(pack).display()
                        );
                        VecDeque::new()
                    }),
                };
                Self {
                    entries: f
                        .entries
                        .into_iter()
                        .map(|(l, e, h)| ((l, e), (h, 0)))
                        .collect(),
                    tick: 0,
                    trace_accesses: trace.iter().map(|r| r.experts.len()).sum(),
                    trace,
                    policy: f.policy,
                    packed: f.packed,
                }
            }
            None => {
                tracing::warn!(
                    "{}: unreadable heat histogram; starting cold",
                    Self::path(pack).display()
                );
                Self::default()
            }
        }
    }

    /// Writes the map next to the pack (atomically: a temporary file, then a rename).
    pub fn save(&self, pack: &Path) -> std::io::Result<()> {
        let path = Self::path(pack);
        let tmp = path.with_extension("json.partial");
        let file = HeatFile {
            version: HEAT_VERSION,
            entries: self
                .hottest()
                .into_iter()
                .map(|((l, e), h)| (l, e, h))
                .collect(),
            trace: encode_trace(&self.trace)?,
            policy: self.policy,
            packed: self.packed,
        };
        crate::private::write(
            &tmp,
            &serde_json::to_vec(&file).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, path)
    }

    /// Adds a lookup to the trace summary, letting the oldest go past
    /// [`TRACE_ACCESSES`].
    pub fn trace(&mut self, lookup: Routed) {
        if lookup.experts.is_empty() {
            return;
        }
        self.trace_accesses += lookup.experts.len();
        self.trace.push_back(lookup);
        while self.trace_accesses > TRACE_ACCESSES {
            match self.trace.pop_front() {
                Some(old) => self.trace_accesses -= old.experts.len(),
                None => break,
            }
        }
    }

    /// The trace summary, oldest lookup first.
    pub fn routed(&self) -> impl ExactSizeIterator<Item = &Routed> {
        self.trace.iter()
    }

    pub fn record(&mut self, layer: usize, id: usize) {
        self.tick += 1;
        let tick = self.tick;
        let e = self.entries.entry((layer, id)).or_insert((0.0, tick));
        e.0 = e.0 * powf(DECAY_PER_LOOKUP, (tick - e.1) as f64) + 1.0;
        e.1 = tick;
    }

    /// Every expert with its current heat, hottest first.
    pub fn hottest(&self) -> Vec<(Key, f64)> {
        let mut all: Vec<(Key, f64)> = self
            .entries
            .iter()
            .map(|(k, (h, t))| (*k, h * powf(DECAY_PER_LOOKUP, (self.tick - t) as f64)))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hottest_first_and_survives_a_round_trip() {
        let mut h = HeatMap::default();
        for _ in 0..3 {
            h.record(1, 7);
        }
        h.record(0, 2);
        assert_eq!(h.hottest()[0].0, (1, 7));
        let dir = tempfile::tempdir().unwrap();
        h.save(dir.path()).unwrap();
        let back = HeatMap::load(dir.path());
        assert_eq!(back.len(), 2);
        assert_eq!(back.hottest()[0].0, (1, 7));
    }

    #[test]
    fn the_trace_and_policy_survive_a_round_trip_and_keep_to_their_length() {
        let mut h = HeatMap::default();
        let lookup = |layer, id| Routed {
            layer,
            experts: vec![(id, 3), (id + 1, 1)],
        };
        for t in 0..(TRACE_ACCESSES / 2 + 10) {
            h.trace(lookup(t % 5, t % 300));
        }
        assert_eq!(h.routed().len(), TRACE_ACCESSES / 2, "the oldest went");
        h.policy = Some("slru:80".parse().unwrap());
        h.packed = Some(false);
        let dir = tempfile::tempdir().unwrap();
        h.save(dir.path()).unwrap();
        let back = HeatMap::load(dir.path());
        assert!(back.routed().eq(h.routed()));
        assert_eq!((back.policy, back.packed), (h.policy, h.packed));
    }

    #[test]
    fn a_version_one_file_loads_without_a_trace_and_a_broken_trace_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            HeatMap::path(dir.path()),
            r#"{"version":1,"entries":[[0,3,2.5]]}"#,
        )
        .unwrap();
        let h = HeatMap::load(dir.path());
        assert_eq!((h.len(), h.routed().len()), (1, 0));
        std::fs::write(
            HeatMap::path(dir.path()),
            r#"{"version":2,"entries":[[0,3,2.5]],"trace":"AAAA"}"#,
        )
        .unwrap();
        let h = HeatMap::load(dir.path());
        assert_eq!((h.len(), h.routed().len()), (1, 0));
        assert!(decode_trace("not base64!").is_err());
    }

    #[test]
    fn old_heat_decays() {
        let mut h = HeatMap::default();
        h.record(0, 0);
        for _ in 0..200_000 {
            h.record(0, 1);
        }
        let hot = h.hottest();
        assert_eq!(hot[0].0, (0, 1));
        assert!(hot[1].1 < 0.2, "a single old lookup fades");
    }
}
