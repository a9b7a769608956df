//! [`StreamingExperts`]: the expert provider for packs.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::model::{Expert, ExpertError, ExpertProvider};
use crate::pack::Manifest;
use crate::pack::encoding::ExpertEncoding;
use crate::pack::manifest::{ExpertLayer, Record, Segment, hash_hex};
use crate::store::{DriveSnapshot, DriveStore, StoreConfig, StoreError};
use crate::weights::Dtype;

use super::budget::{CacheCounters, EvictionPolicy, ExpertCache};
use super::heat::HeatMap;

/// The copy of `record` whose slowest segment would finish first, given the
/// bytes each drive already has to read (drives assumed equally fast).
fn fastest_placement<'a>(record: &'a Record, load: &[u64]) -> &'a [Segment] {
    let finish = |segments: &[Segment]| {
        segments
            .iter()
            .map(|s| load.get(s.drive).copied().unwrap_or(0) + s.len)
            .max()
            .unwrap_or(0)
    };
    record
        .placements()
        .min_by_key(|p| finish(p))
        .unwrap_or(record.segments.as_slice())
}

/// Bytes one expert of `layer` takes in RAM: as stored, or widened to f32.
fn expert_ram_bytes(layer: &ExpertLayer, encoding: ExpertEncoding, keep_stored: bool) -> u64 {
    if keep_stored {
        encoding.record_len(layer.hidden, layer.intermediate)
    } else {
        ExpertEncoding::Plain(Dtype::F32).record_len(layer.hidden, layer.intermediate)
    }
}

fn poisoned() -> ExpertError {
    ExpertError::Source("the expert cache was poisoned by an earlier panic".to_string())
}

impl From<StoreError> for ExpertError {
    fn from(e: StoreError) -> Self {
        ExpertError::Source(e.to_string())
    }
}

/// Share of the budget pinned by default. None: on Zipf-skewed synthetic
/// routing, pinning the hottest experts of an earlier run (0.8 of the budget)
/// reached 0.74 of the best-in-hindsight hit rate where frequency-ranked
/// eviction seeded from the same history reached more, because what is hot
/// depends on the prompt as much as on the model.
pub const DEFAULT_PINNED_FRACTION: f64 = 0.0;
/// Lookup count given to the hottest expert of earlier runs when seeding the
/// cache's frequency ranking: a few tokens' worth, so the current prompt
/// soon outweighs history.
const SEED_MAX_USES: f64 = 4.0;

/// One call for experts: (decoder layer, expert ids).
pub type Lookup = (usize, Vec<usize>);

#[derive(Debug, Clone)]
pub struct StreamingOptions {
    /// RAM for routed experts, in bytes; 0 keeps nothing after use.
    pub budget_bytes: u64,
    /// Check every record's checksum after reading it.
    pub verify_checksums: bool,
    pub store: StoreConfig,
    /// Keep every lookup's (layer, ids) for later analysis.
    pub record_trace: bool,
    /// Share of the budget given to the hottest experts of earlier runs
    /// (from the pack's heat histogram), which are never evicted.
    pub pinned_fraction: f64,
    /// Read the pinned experts while opening, so the first tokens hit.
    pub warm_start: bool,
    /// How the unpinned part of the cache makes room.
    pub policy: EvictionPolicy,
    /// Hold cached experts as the pack stores them (BF16 or F16: half the
    /// bytes of f32; Q8_0 about a quarter); the kernels compute from them as
    /// they are. Otherwise they are widened to f32 when read.
    pub keep_stored_dtype: bool,
}

impl Default for StreamingOptions {
    fn default() -> Self {
        Self {
            budget_bytes: 0,
            verify_checksums: true,
            store: StoreConfig::default(),
            record_trace: false,
            pinned_fraction: DEFAULT_PINNED_FRACTION,
            warm_start: true,
            policy: EvictionPolicy::default(),
            keep_stored_dtype: true,
        }
    }
}

pub struct StreamingExperts {
    layers: HashMap<usize, ExpertLayer>,
    encoding: ExpertEncoding,
    store: DriveStore,
    cache: Mutex<ExpertCache>,
    verify: bool,
    /// Every lookup in order, when recording.
    trace: Option<Mutex<Vec<Lookup>>>,
    /// Time the model spent waiting for reads, in microseconds.
    stall_micros: AtomicU64,
    heat: Mutex<HeatMap>,
    pack: PathBuf,
    /// Hold experts as stored rather than widened to f32.
    keep_stored: bool,
}

impl StreamingExperts {
    pub fn open(
        pack: &Path,
        manifest: &Manifest,
        options: &StreamingOptions,
    ) -> Result<Self, ExpertError> {
        let encoding = ExpertEncoding::parse(&manifest.experts.dtype).ok_or_else(|| {
            ExpertError::Source(format!(
                "{}: expert dtype `{}` is not one Longhaul computes with",
                pack.display(),
                manifest.experts.dtype
            ))
        })?;
        let store = DriveStore::open(&manifest.drives, &options.store)
            .map_err(|e| ExpertError::Source(e.to_string()))?;
        let me = Self {
            layers: manifest
                .experts
                .layers
                .iter()
                .map(|l| (l.layer, l.clone()))
                .collect(),
            encoding,
            store,
            cache: Mutex::new(ExpertCache::with_policy(
                options.budget_bytes,
                options.policy,
            )),
            verify: options.verify_checksums,
            trace: options.record_trace.then(|| Mutex::new(Vec::new())),
            stall_micros: AtomicU64::new(0),
            heat: Mutex::new(HeatMap::default()),
            pack: pack.to_path_buf(),
            keep_stored: options.keep_stored_dtype,
        };
        let heat = HeatMap::load(pack);
        me.apply_heat(&heat, options)?;
        if let Ok(mut h) = me.heat.lock() {
            *h = heat;
        }
        Ok(me)
    }

    /// Uses the histogram of earlier runs: pins the hottest experts that fit
    /// in the pinned share of the budget, seeds the frequency counts, and
    /// (when warm-starting) reads the hottest experts that fit in the budget.
    fn apply_heat(&self, heat: &HeatMap, options: &StreamingOptions) -> Result<(), ExpertError> {
        let hottest: Vec<((usize, usize), f64, u64)> = heat
            .hottest()
            .into_iter()
            .filter_map(|(key @ (layer, id), h)| {
                let l = self.layers.get(&layer).filter(|l| id < l.records.len())?;
                Some((key, h, self.ram_bytes(l)))
            })
            .collect();
        let fits = |room: u64| {
            let mut used = 0;
            hottest
                .iter()
                .take_while(|(_, _, bytes)| {
                    used += bytes;
                    used <= room
                })
                .map(|(key, _, _)| *key)
                .collect::<Vec<_>>()
        };
        let pin_room =
            (options.budget_bytes as f64 * options.pinned_fraction.clamp(0.0, 1.0)) as u64;
        let top = hottest.first().map_or(1.0, |h| h.1.max(f64::MIN_POSITIVE));
        {
            let mut cache = self.cache.lock().map_err(|_| poisoned())?;
            cache.set_pinned(fits(pin_room));
            cache.seed_uses(
                hottest
                    .iter()
                    .map(|(key, h, _)| (*key, (h / top * SEED_MAX_USES).round() as u64)),
            );
        }
        if options.warm_start {
            let mut by_layer: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (layer, id) in fits(options.budget_bytes) {
                by_layer.entry(layer).or_default().push(id);
            }
            for (layer, ids) in by_layer {
                let l = &self.layers[&layer];
                let loaded = self.load(l, &ids)?;
                let mut cache = self.cache.lock().map_err(|_| poisoned())?;
                for (id, expert) in ids.into_iter().zip(loaded) {
                    cache.insert(layer, id, expert, self.ram_bytes(l));
                }
            }
        }
        Ok(())
    }

    /// Saves the heat histogram next to the pack for the next run.
    pub fn save_heat(&self) -> std::io::Result<()> {
        let heat = self
            .heat
            .lock()
            .map_err(|_| std::io::Error::other("heat histogram poisoned"))?;
        heat.save(&self.pack)
    }

    pub fn cache_counters(&self) -> CacheCounters {
        self.cache.lock().map(|c| c.counters()).unwrap_or_default()
    }

    pub fn drive_snapshots(&self) -> Vec<DriveSnapshot> {
        self.store.snapshot()
    }

    /// Time spent waiting for expert reads so far.
    pub fn stall_seconds(&self) -> f64 {
        self.stall_micros.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Bytes of one expert as held in the cache, for sizing a budget in experts.
    pub fn resident_expert_bytes(&self) -> u64 {
        self.layers.values().next().map_or(0, |l| self.ram_bytes(l))
    }

    /// The lookups recorded so far (empty unless recording), leaving the record empty.
    pub fn take_trace(&self) -> Vec<Lookup> {
        self.trace
            .as_ref()
            .and_then(|t| t.lock().ok().map(|mut t| std::mem::take(&mut *t)))
            .unwrap_or_default()
    }

    /// Reads, checks and converts the given experts of one layer. Each record
    /// is checked and converted as soon as its last segment arrives, while
    /// the other reads are still in flight.
    fn load(&self, layer: &ExpertLayer, ids: &[usize]) -> Result<Vec<Arc<Expert>>, ExpertError> {
        let mut requests = Vec::new();
        // For each request: (position in `ids`, segment index within the record).
        let mut owner = Vec::new();
        // Bytes each drive is expected to read before a new request would finish.
        let mut load: Vec<u64> = self.store.pending_bytes();
        let mut chosen: Vec<&[Segment]> = Vec::with_capacity(ids.len());
        for (pos, &id) in ids.iter().enumerate() {
            let record = layer.records.get(id).ok_or(ExpertError::NoSuchExpert {
                layer: layer.layer,
                id,
                count: layer.records.len(),
            })?;
            let segments = fastest_placement(record, &load);
            for (seg, s) in segments.iter().enumerate() {
                if let Some(l) = load.get_mut(s.drive) {
                    *l += s.len;
                }
                requests.push(s.request());
                owner.push((pos, seg));
            }
            chosen.push(segments);
        }
        let mut parts: Vec<Vec<Option<Vec<u8>>>> =
            chosen.iter().map(|c| vec![None; c.len()]).collect();
        let mut out: Vec<Option<Arc<Expert>>> = vec![None; ids.len()];
        self.store
            .read_each(&requests, |slot, bytes| -> Result<(), ExpertError> {
                let (pos, seg) = owner[slot];
                parts[pos][seg] = Some(bytes);
                if parts[pos].iter().all(Option::is_some) {
                    let record: Vec<u8> = parts[pos]
                        .iter_mut()
                        .filter_map(Option::take)
                        .flatten()
                        .collect();
                    out[pos] = Some(self.convert(layer, ids[pos], chosen[pos], record)?);
                }
                Ok(())
            })?;
        out.into_iter()
            .map(|e| {
                e.ok_or(ExpertError::Source(
                    "a record was not fully read".to_string(),
                ))
            })
            .collect()
    }

    /// Checks one record's checksum and turns its bytes into an expert.
    fn convert(
        &self,
        layer: &ExpertLayer,
        id: usize,
        segments: &[Segment],
        bytes: Vec<u8>,
    ) -> Result<Arc<Expert>, ExpertError> {
        let record = &layer.records[id];
        if self.verify && hash_hex(&bytes) != record.xxh3_128 {
            let places: Vec<String> = segments
                .iter()
                .map(|s| format!("drive {} {} at offset {}", s.drive, s.file, s.offset))
                .collect();
            return Err(ExpertError::Source(format!(
                "layer {} expert {id}: checksum mismatch in {} (the record is corrupt)",
                layer.layer,
                places.join(", ")
            )));
        }
        let name = format!("layer {} expert {id}", layer.layer);
        self.encoding
            .decode(
                Arc::new(bytes),
                layer.hidden,
                layer.intermediate,
                self.keep_stored,
                &name,
            )
            .map(Arc::new)
            .map_err(|e| ExpertError::Source(e.to_string()))
    }

    /// Bytes one expert of `layer` takes in the cache.
    fn ram_bytes(&self, layer: &ExpertLayer) -> u64 {
        expert_ram_bytes(layer, self.encoding, self.keep_stored)
    }
}

impl ExpertProvider for StreamingExperts {
    fn experts(&self, layer: usize, ids: &[usize]) -> Result<Vec<Arc<Expert>>, ExpertError> {
        let records = self
            .layers
            .get(&layer)
            .ok_or(ExpertError::NoSuchLayer { layer })?;
        if let Some(Ok(mut trace)) = self.trace.as_ref().map(|t| t.lock()) {
            trace.push((layer, ids.to_vec()));
        }
        if let Ok(mut heat) = self.heat.lock() {
            ids.iter().for_each(|&id| heat.record(layer, id));
        }
        let mut found: Vec<Option<Arc<Expert>>> = {
            let mut cache = self.cache.lock().map_err(|_| poisoned())?;
            ids.iter().map(|&id| cache.get(layer, id)).collect()
        };
        let missing: Vec<usize> = ids
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(&id, _)| id)
            .collect();
        if !missing.is_empty() {
            let started = Instant::now();
            let loaded = self.load(records, &missing);
            self.stall_micros
                .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            let loaded = loaded?;
            let bytes = self.ram_bytes(records);
            let mut cache = self.cache.lock().map_err(|_| poisoned())?;
            let mut loaded = missing.iter().zip(loaded);
            for slot in found.iter_mut().filter(|f| f.is_none()) {
                if let Some((&id, expert)) = loaded.next() {
                    cache.insert(layer, id, Arc::clone(&expert), bytes);
                    *slot = Some(expert);
                }
            }
        }
        found
            .into_iter()
            .map(|f| {
                f.ok_or(ExpertError::Source(
                    "an expert went missing while loading".to_string(),
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(drive: usize, len: u64) -> Segment {
        Segment {
            drive,
            file: String::new(),
            offset: 0,
            len,
        }
    }

    #[test]
    fn reads_go_to_the_copy_that_finishes_first() {
        let record = Record {
            len: 10,
            xxh3_128: String::new(),
            segments: vec![seg(0, 10)],
            replicas: vec![vec![seg(2, 10)]],
        };
        assert_eq!(
            fastest_placement(&record, &[0, 0, 0])[0].drive,
            0,
            "ties keep the primary"
        );
        assert_eq!(
            fastest_placement(&record, &[50, 0, 0])[0].drive,
            2,
            "drive 0 is busy"
        );
        assert_eq!(fastest_placement(&record, &[50, 0, 80])[0].drive, 0);
    }
}
