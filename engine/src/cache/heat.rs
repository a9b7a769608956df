//! The heat histogram: a decayed count of how often each (layer, expert) was
//! routed to. It survives the process in a file next to the pack, so the next
//! run can pin the experts that matter before the first token.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Each lookup multiplies all earlier heat by this (a half-life of ~70k lookups,
/// a few hundred tokens of a large model), so the histogram follows drift in
/// what is being asked without forgetting a session at once.
const DECAY_PER_LOOKUP: f64 = 0.99999;
const HEAT_FILE: &str = "longhaul-heat.json";
const HEAT_VERSION: u32 = 1;

type Key = (usize, usize);

#[derive(Debug, Clone, Default)]
pub struct HeatMap {
    /// Heat as of `tick`, per expert: (value, tick it was last brought up to date).
    entries: HashMap<Key, (f64, u64)>,
    tick: u64,
}

#[derive(Serialize, Deserialize)]
struct HeatFile {
    version: u32,
    /// (layer, expert, heat), hottest first.
    entries: Vec<(usize, usize, f64)>,
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
        match serde_json::from_str::<HeatFile>(&text) {
            Ok(f) if f.version == HEAT_VERSION => Self {
                entries: f
                    .entries
                    .into_iter()
                    .map(|(l, e, h)| ((l, e), (h, 0)))
                    .collect(),
                tick: 0,
            },
            _ => {
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
        };
        crate::private::write(
            &tmp,
            &serde_json::to_vec(&file).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, path)
    }

    pub fn record(&mut self, layer: usize, id: usize) {
        self.tick += 1;
        let tick = self.tick;
        let e = self.entries.entry((layer, id)).or_insert((0.0, tick));
        e.0 = e.0 * DECAY_PER_LOOKUP.powf((tick - e.1) as f64) + 1.0;
        e.1 = tick;
    }

    /// Every expert with its current heat, hottest first.
    pub fn hottest(&self) -> Vec<(Key, f64)> {
        let mut all: Vec<(Key, f64)> = self
            .entries
            .iter()
            .map(|(k, (h, t))| (*k, h * DECAY_PER_LOOKUP.powf((self.tick - t) as f64)))
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
