//! [`StreamingExperts`]: the expert provider for packs.
//!
//! The model asks for a layer's experts with `fetch` and gets them one by one
//! as they become available: cached ones at once, the rest as their reads
//! land, so it computes each while the others are still on their way. All of
//! a layer's missing records are queued at once, each split over the drives,
//! so every drive has work. `prefetch` (the pilot's guess at the next layer)
//! queues reads behind every demand read and reserves cache room for them, so
//! the guesses are there when the layer asks and are not evicted before.
//! The budget counts bytes being read, and the in-flight table makes a
//! second request for a record that is on its way wait for that read.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::model::{ExpertError, ExpertProvider, ExpertStream};
use crate::pack::Manifest;
use crate::pack::encoding::ExpertEncoding;
use crate::pack::manifest::{ExpertLayer, Record, Segment};
use crate::pilot::PilotCounters;
use crate::store::probe::ProbeReport;
use crate::store::{
    DriveSnapshot, DriveStore, Priority, ReadTarget, SegmentRead, StoreConfig, StoreError,
};

use super::autopolicy::{MIN_CHOICE_PASSES, RECHOOSE_PASSES, first_replay, passes_in};
use super::budget::{CacheCounters, ExpertCache};
use super::choose::PolicyReport;
use super::fetch::{Demand, Fetch};
use super::heat::{HeatMap, Routed};
use super::packed::{PackMeter, Tally, keeps_packed, packed_class, packs_records};
use super::policy::PolicySetting;
use super::pool::BufferPool;
use super::reads::{Arrival, Flight, Held, RecordRead, Shared, State, poisoned};

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
    encoding.ram_len(layer.hidden, layer.intermediate, keep_stored)
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
/// Bytes of records one request may have on their way: a decode step's
/// misses fit at once (eight 3 MB experts), and ten in flight plus as many
/// prefetches keep four drives five deep; a long prompt, which may need every
/// expert of a layer, streams through it. Prefetch reads on their way are
/// capped the same. 64 MiB measured no faster (a 256-token prompt under
/// 2 GiB: 6.63 s against 6.47 s) and left less memory for the cache.
pub const DEFAULT_WINDOW_BYTES: u64 = 32 << 20;

/// Free record buffers kept for the next reads, in windows: one layer's
/// demand reads and its prefetches.
const FREE_BUFFER_WINDOWS: u64 = 2;
/// Records a window holds at least, whatever `window_bytes` says: with
/// Kimi-K2-sized experts (24.8 MB at INT4) a 32 MiB window held one record,
/// each drive read one 6 MB segment at a time, and a 32-token prompt read at
/// 0.67 of the drives' rate.
pub const WINDOW_RECORDS: u64 = 4;

/// The bytes a window holds for a pack whose largest record is
/// `largest_record` bytes: the option's, or [`WINDOW_RECORDS`] records.
pub fn window_for(window_bytes: u64, largest_record: u64) -> u64 {
    window_bytes.max(WINDOW_RECORDS * largest_record)
}

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
    /// How the unpinned part of the cache makes room: chosen from the
    /// pack's routing trace, or set.
    pub policy: PolicySetting,
    /// Hold cached experts as the pack stores them (BF16 or F16: half the
    /// bytes of f32; Q8_0 about a quarter); the kernels compute from them as
    /// they are. Otherwise they are widened to f32 when read.
    pub keep_stored_dtype: bool,
    /// Read the experts the pilot predicts for the next layer ahead of time.
    pub prefetch: bool,
    /// Bytes of demand reads one request may have on their way at once, and
    /// likewise of prefetch reads and of cached records being restored.
    pub window_bytes: u64,
    /// Keep compressed records packed in the cache when the budget cannot
    /// hold every expert's weights (see [`packs_records`]).
    pub pack_cache: bool,
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
            policy: PolicySetting::default(),
            keep_stored_dtype: true,
            prefetch: true,
            window_bytes: DEFAULT_WINDOW_BYTES,
            pack_cache: true,
        }
    }
}

pub struct StreamingExperts {
    pub(super) shared: Arc<Shared>,
    store: DriveStore,
    /// Every lookup in order, when recording.
    trace: Option<Mutex<Vec<Routed>>>,
    /// Time the model spent waiting for reads, in microseconds.
    pub(super) stall_micros: AtomicU64,
    /// Time the model's thread spent restoring packed cache hits, in microseconds.
    pub(super) restore_micros: AtomicU64,
    pub(super) heat: Mutex<HeatMap>,
    pack: PathBuf,
    prefetch: bool,
    pub(super) window_bytes: u64,
    /// Bytes every expert of the pack takes in the cache.
    all_experts_bytes: u64,
    /// The policy follows the trace (else it was set).
    pub(super) automatic: bool,
    /// The latest replays of the trace, and whether one is running.
    pub(super) report: Arc<Mutex<Option<PolicyReport>>>,
    pub(super) choosing: Arc<AtomicBool>,
    /// The pass at which the trace is replayed next.
    next_choice: AtomicU64,
    /// Decode passes measured, to weigh keeping records packed.
    pub(super) meter: Mutex<PackMeter>,
    /// Seconds per byte at the rate the pack's last probe of these drives
    /// measured (0 without one): the least a read can cost when the drives
    /// are what a pass waits for.
    pub(super) sustained_seconds_per_byte: f64,
    opened: std::time::Instant,
}

impl StreamingExperts {
    pub fn open(
        pack: &Path,
        manifest: &Manifest,
        options: &StreamingOptions,
    ) -> Result<Self, ExpertError> {
        let parse = |dtype: &str| {
            ExpertEncoding::parse(dtype)
                .filter(|e| e.formats().is_some())
                .ok_or_else(|| {
                    ExpertError::Source(format!(
                        "{}: expert dtype `{dtype}` is not one Longhaul computes with",
                        pack.display(),
                    ))
                })
        };
        let encoding = parse(&manifest.experts.dtype)?;
        let mut layer_encodings = HashMap::new();
        for l in &manifest.experts.layers {
            if let Some(d) = &l.dtype {
                layer_encodings.insert(l.layer, parse(d)?);
            }
        }
        let store = DriveStore::open(&manifest.drives, &options.store)?;
        let heat = HeatMap::load(pack);
        let (policy, automatic) = match options.policy {
            PolicySetting::Fixed(p) => (p, false),
            PolicySetting::Auto => (heat.policy.unwrap_or_default(), true),
        };
        let mut cache = ExpertCache::with_policy(options.budget_bytes, policy);
        cache.set_layers(manifest.experts.layers.len());
        let may_pack = packs_records(manifest, options);
        let window = window_for(options.window_bytes, manifest.largest_record_bytes());
        // The mode the pack last settled in, when it may pack.
        let packing = may_pack && heat.packed.unwrap_or(true);
        let state = State {
            cache,
            flights: HashMap::new(),
            score: Default::default(),
            joined_flights: 0,
            reads_started: 0,
            landed: HashMap::new(),
            speculative_bytes: 0,
        };
        let me = Self {
            shared: Arc::new(Shared {
                layers: manifest
                    .experts
                    .layers
                    .iter()
                    .map(|l| (l.layer, l.clone()))
                    .collect(),
                encoding,
                layer_encodings,
                verify: options.verify_checksums,
                keep_stored: options.keep_stored_dtype,
                may_pack,
                packing: AtomicBool::new(packing),
                restored_bytes: AtomicU64::new(0),
                state: Mutex::new(state),
                pool: Arc::new(BufferPool::with_free_cap(FREE_BUFFER_WINDOWS * window)),
                next_ticket: AtomicU64::new(1),
                decompress_micros: AtomicU64::new(0),
            }),
            store,
            trace: options.record_trace.then(|| Mutex::new(Vec::new())),
            stall_micros: AtomicU64::new(0),
            restore_micros: AtomicU64::new(0),
            heat: Mutex::new(HeatMap::default()),
            pack: pack.to_path_buf(),
            prefetch: options.prefetch,
            window_bytes: window,
            all_experts_bytes: 0,
            automatic,
            report: Arc::new(Mutex::new(None)),
            choosing: Arc::new(AtomicBool::new(false)),
            next_choice: AtomicU64::new(first_replay(may_pack)),
            meter: Mutex::new(PackMeter::default()),
            sustained_seconds_per_byte: ProbeReport::load(pack)
                .and_then(|p| p.seconds_per_byte(&manifest.drives))
                .unwrap_or(0.0),
            opened: std::time::Instant::now(),
        };
        let me = Self {
            all_experts_bytes: me
                .shared
                .layers
                .values()
                .flat_map(|l| (0..l.records.len()).map(move |id| (l, id)))
                .map(|(l, id)| me.held_bytes(l, id))
                .sum(),
            ..me
        };
        me.apply_heat(&heat, options)?;
        let passes = passes_in(heat.routed());
        if let Ok(mut h) = me.heat.lock() {
            *h = heat;
        }
        // The first replay with decode passes measured comes after
        // MIN_CHOICE_PASSES, whatever the trace already holds.
        if passes >= MIN_CHOICE_PASSES {
            me.replay_if_useful(0);
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
                let l = self
                    .shared
                    .layers
                    .get(&layer)
                    .filter(|l| id < l.records.len())?;
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
        let warm = if options.warm_start {
            fits(options.budget_bytes)
        } else {
            Vec::new()
        };
        let (tx, rx) = mpsc::channel();
        let mut waiting = 0;
        {
            let mut st = self.shared.state.lock().map_err(|_| poisoned())?;
            st.cache.set_pinned(fits(pin_room));
            st.cache.seed_uses(
                hottest
                    .iter()
                    .map(|(key, h, _)| (*key, (h / top * SEED_MAX_USES).round() as u64)),
            );
            for (pos, &(layer, id)) in warm.iter().enumerate() {
                let Some(l) = self.shared.layers.get(&layer) else {
                    continue;
                };
                if st.cache.reserve(layer, id, self.held_bytes(l, id), false) {
                    if let Err(e) = self.start_read(&mut st, l, id, Priority::Prefetch, true, false)
                    {
                        st.cache.cancel(layer, id);
                        return Err(e);
                    }
                    if let Some(f) = st.flights.get_mut(&(layer, id)) {
                        f.waiters.push((tx.clone(), pos));
                        waiting += 1;
                    }
                }
            }
        }
        for _ in 0..waiting {
            let (_, outcome) = rx.recv().map_err(|_| poisoned())?;
            outcome?;
        }
        Ok(())
    }

    /// Every counter, read now.
    pub fn stats(&self) -> crate::metrics::EngineStats {
        let (buffers_allocated, buffers_reused) = self.buffer_takes();
        crate::metrics::EngineStats {
            cache: self.cache_counters(),
            pilot: self.pilot_counters(),
            drives: self.drive_snapshots(),
            joined_flights: self.joined_flights(),
            records_read: self.records_read(),
            drives_busy: self.drives_busy(),
            buffer_bytes: self.buffer_bytes(),
            peak_buffer_bytes: self.peak_buffer_bytes(),
            buffers_allocated,
            buffers_reused,
            decompress_seconds: self.decompress_seconds(),
            restore_seconds: self.restore_micros.load(Ordering::Relaxed) as f64 / 1e6,
            stall_seconds: self.stall_seconds(),
            resident_expert_bytes: self.resident_expert_bytes(),
            largest_record_bytes: self.largest_record_bytes(),
            policy: self
                .shared
                .state
                .lock()
                .map(|s| s.cache.policy())
                .unwrap_or_default(),
            policy_report: self.policy_report(),
        }
    }

    /// Saves the heat histogram and trace summary next to the pack for the
    /// next run, with the policy chosen from them.
    pub fn save_heat(&self) -> std::io::Result<()> {
        let policy = self.shared.state.lock().map(|s| s.cache.policy()).ok();
        let mut heat = self
            .heat
            .lock()
            .map_err(|_| std::io::Error::other("heat histogram poisoned"))?;
        if self.automatic {
            heat.policy = policy;
        }
        if self.shared.may_pack {
            heat.packed = Some(self.packing());
        }
        heat.save(&self.pack)
    }

    /// Gives the cache `bytes` more of the budget: memory the model no
    /// longer holds (an embedding read a row at a time).
    pub fn grow_budget(&self, bytes: u64) {
        if let Ok(mut s) = self.shared.state.lock() {
            s.cache.grow_budget(bytes);
        }
    }

    pub fn cache_counters(&self) -> CacheCounters {
        self.shared
            .state
            .lock()
            .map(|s| s.cache.counters())
            .unwrap_or_default()
    }

    /// How well the pilot's predictions matched what layers asked for.
    pub fn pilot_counters(&self) -> PilotCounters {
        self.shared
            .state
            .lock()
            .map(|s| s.score.counters())
            .unwrap_or_default()
    }

    /// Demand lookups that found their expert already on its way (mostly
    /// prefetched ones not yet landed).
    pub fn joined_flights(&self) -> u64 {
        self.shared
            .state
            .lock()
            .map(|s| s.joined_flights)
            .unwrap_or_default()
    }

    /// Records read from the drives so far, prefetches included.
    pub fn records_read(&self) -> u64 {
        self.shared
            .state
            .lock()
            .map(|s| s.reads_started)
            .unwrap_or_default()
    }

    pub fn drive_snapshots(&self) -> Vec<DriveSnapshot> {
        self.store.snapshot()
    }

    /// Wall time so far during which any drive was reading.
    pub fn drives_busy(&self) -> Duration {
        self.store.busy_any()
    }

    /// Bytes of record buffers allocated (held by the cache, in flight or free).
    pub fn buffer_bytes(&self) -> u64 {
        self.shared.pool.allocated_bytes()
    }

    /// Record buffers allocated and reused so far.
    pub fn buffer_takes(&self) -> (u64, u64) {
        self.shared.pool.takes()
    }

    /// The most bytes of record buffers held at once (cache, reads, compute).
    pub fn peak_buffer_bytes(&self) -> u64 {
        self.shared.pool.peak_held_bytes()
    }

    /// Reader time spent restoring compressed records so far.
    pub fn decompress_seconds(&self) -> f64 {
        self.shared.decompress_micros.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Time spent waiting for expert reads so far.
    pub fn stall_seconds(&self) -> f64 {
        self.stall_micros.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Bytes of one expert as held in the cache, for sizing a budget in experts.
    pub fn resident_expert_bytes(&self) -> u64 {
        // On average: packed records differ in size.
        let experts: usize = self.shared.layers.values().map(|l| l.records.len()).sum();
        self.all_experts_bytes / experts.max(1) as u64
    }

    /// Bytes of the largest expert record, for sizing read windows.
    pub fn largest_record_bytes(&self) -> u64 {
        self.shared
            .layers
            .values()
            .flat_map(|l| &l.records)
            .map(|r| r.len)
            .max()
            .unwrap_or(0)
    }

    /// The lookups recorded so far (empty unless recording), leaving the record empty.
    pub fn take_trace(&self) -> Vec<Routed> {
        self.trace
            .as_ref()
            .and_then(|t| t.lock().ok().map(|mut t| std::mem::take(&mut *t)))
            .unwrap_or_default()
    }

    /// Bytes expert `id` of `layer` takes in the cache: its packed record's
    /// buffer when the cache keeps records packed, else its weights.
    pub(super) fn held_bytes(&self, layer: &ExpertLayer, id: usize) -> u64 {
        match layer.records.get(id) {
            Some(r) if self.packing() && keeps_packed(r) => packed_class(r.stored(), r.len),
            _ => self.ram_bytes(layer),
        }
    }

    /// Whether the cache keeps compressed records it reads now packed (see
    /// [`super::packed`]).
    pub fn keeps_records_packed(&self) -> bool {
        self.packing()
    }

    pub(super) fn packing(&self) -> bool {
        self.shared.packing.load(Ordering::Relaxed)
    }

    /// The counters a window of decoding is measured by (see [`PackMeter`]).
    fn tally(&self, st: &State) -> Tally {
        let c = st.cache.counters();
        let micros = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        Tally {
            seconds: self.opened.elapsed().as_secs_f64(),
            stall: micros(&self.stall_micros),
            model_restore: micros(&self.restore_micros),
            restore: micros(&self.shared.decompress_micros),
            restored_bytes: self.shared.restored_bytes.load(Ordering::Relaxed),
            drive_bytes: self.store.snapshot().iter().map(|d| d.bytes).sum(),
            drive_busy: self.store.busy_any().as_secs_f64(),
            lookups: c.hits + c.misses,
            passes: 0,
        }
    }

    /// Bytes one expert of `layer` takes in RAM as weights.
    pub(super) fn ram_bytes(&self, layer: &ExpertLayer) -> u64 {
        expert_ram_bytes(
            layer,
            self.shared.encoding(layer.layer),
            self.shared.keep_stored,
        )
    }

    /// Starts reading one record, registering its flight (with no waiters
    /// yet) under the caller's lock so that no arrival can miss it.
    fn start_read(
        &self,
        st: &mut State,
        layer: &ExpertLayer,
        id: usize,
        priority: Priority,
        kept: bool,
        speculative: bool,
    ) -> Result<(), ExpertError> {
        let key = (layer.layer, id);
        let record = layer.records.get(id).ok_or(ExpertError::NoSuchExpert {
            layer: layer.layer,
            id,
            count: layer.records.len(),
        })?;
        let segments = fastest_placement(record, &self.store.pending_bytes()).to_vec();
        let too_large = || {
            ExpertError::Source(format!(
                "layer {} expert {id}: record too large",
                layer.layer
            ))
        };
        let len = usize::try_from(record.stored()).map_err(|_| too_large())?;
        let class = match self.packing() && keeps_packed(record) {
            true => packed_class(record.stored(), record.len),
            false => record.len,
        };
        let class = usize::try_from(class).map_err(|_| too_large())?;
        let buf = self
            .shared
            .pool
            .take_sized(len, class)
            .map_err(|e| ExpertError::Source(e.to_string()))?;
        if speculative {
            st.speculative_bytes += record.stored();
        }
        let ticket = self.shared.next_ticket.fetch_add(1, Ordering::Relaxed);
        let read = Arc::new(RecordRead {
            shared: Arc::clone(&self.shared),
            key,
            buf: Arc::new(buf),
            remaining: AtomicUsize::new(segments.len()),
            error: Mutex::new(None),
            segments: segments.clone(),
        });
        st.reads_started += 1;
        st.flights.insert(
            key,
            Flight {
                ticket,
                kept,
                speculative,
                stored: record.stored(),
                waiters: Vec::new(),
            },
        );
        let capacity = read.buffer().capacity();
        let mut at = 0usize;
        for (j, s) in segments.iter().enumerate() {
            let len = s.len as usize;
            let room = if j + 1 == segments.len() {
                capacity - at
            } else {
                len
            };
            let submitted = self.store.submit(
                SegmentRead {
                    request: s.request(),
                    at,
                    room,
                    ticket,
                    target: Arc::clone(&read) as Arc<dyn ReadTarget>,
                },
                priority,
            );
            if let Err(e) = submitted {
                // Segments already queued land in a flight nobody waits for.
                if let Some(f) = st.flights.remove(&key)
                    && f.speculative
                {
                    st.speculative_bytes -= f.stored;
                }
                return Err(e.into());
            }
            at += len;
        }
        Ok(())
    }

    /// Gets one missing expert for a request: joins a read already on its
    /// way, or starts one (kept if the cache admits it, else read for this
    /// one use); either counts against the request's window until it lands.
    /// Returns the expert itself if it landed meanwhile.
    pub(super) fn demand(
        &self,
        layer: &ExpertLayer,
        id: usize,
        pos: usize,
        tx: &mpsc::Sender<Arrival>,
    ) -> Result<Demand, ExpertError> {
        let key = (layer.layer, id);
        let mut st = self.shared.state.lock().map_err(|_| poisoned())?;
        if let Some(f) = st.flights.get_mut(&key) {
            f.waiters.push((tx.clone(), pos));
            let promoted = f.speculative.then_some((f.ticket, f.stored));
            f.speculative = false;
            if let Some((ticket, stored)) = promoted {
                self.store.promote(ticket);
                st.speculative_bytes -= stored;
            }
            st.joined_flights += 1;
            return Ok(Demand::Joined);
        }
        match st.cache.peek(layer.layer, id) {
            Some(Held::Ready(expert)) => return Ok(Demand::Ready(expert)),
            Some(Held::Packed(record)) => return Ok(Demand::Packed(record)),
            None => {}
        }
        let bytes = self.held_bytes(layer, id);
        let kept = st.cache.reserve(layer.layer, id, bytes, false);
        if let Err(e) = self.start_read(&mut st, layer, id, Priority::Demand, kept, false) {
            st.cache.cancel(layer.layer, id);
            return Err(e);
        }
        if let Some(f) = st.flights.get_mut(&key) {
            f.waiters.push((tx.clone(), pos));
        }
        Ok(Demand::Started)
    }
}

impl ExpertProvider for StreamingExperts {
    fn fetch<'a>(
        &'a self,
        layer: usize,
        ids: &[usize],
        rows: &[u32],
    ) -> Result<ExpertStream<'a>, ExpertError> {
        let records = self
            .shared
            .layers
            .get(&layer)
            .ok_or(ExpertError::NoSuchLayer { layer })?;
        if let Some(&id) = ids.iter().find(|&&id| id >= records.records.len()) {
            return Err(ExpertError::NoSuchExpert {
                layer,
                id,
                count: records.records.len(),
            });
        }
        let weight = |pos: usize| rows.get(pos).copied().unwrap_or(1).max(1);
        let routed = Routed {
            layer,
            experts: ids
                .iter()
                .enumerate()
                .map(|(p, &id)| (id, weight(p)))
                .collect(),
        };
        if let Some(Ok(mut trace)) = self.trace.as_ref().map(|t| t.lock()) {
            trace.push(routed.clone());
        }
        if let Ok(mut heat) = self.heat.lock() {
            ids.iter().for_each(|&id| heat.record(layer, id));
            heat.trace(routed);
        }
        let (tx, rx) = mpsc::channel();
        let mut fetch = Fetch {
            owner: self,
            layer: records,
            ids: ids.to_vec(),
            ready: VecDeque::new(),
            packed: VecDeque::new(),
            handed: Vec::new(),
            unread: VecDeque::new(),
            tx,
            rx,
            waiting: 0,
            window: BTreeMap::new(),
            failed: false,
        };
        let replay_at = {
            let mut st = self.shared.state.lock().map_err(|_| poisoned())?;
            st.score.demanded(layer, ids);
            let before = st.cache.pass();
            st.cache.begin_lookup(layer);
            let pass = st.cache.pass();
            if let Ok(mut m) = self.meter.lock()
                && (pass != before || m.idle())
            {
                let widest = rows.iter().copied().max().unwrap_or(1);
                m.pass_begins(self.tally(&st), u64::from(widest));
            }
            let due = pass >= self.next_choice.load(Ordering::Relaxed);
            if due {
                let next = match pass < MIN_CHOICE_PASSES {
                    true => MIN_CHOICE_PASSES,
                    false => pass + RECHOOSE_PASSES,
                };
                self.next_choice.store(next, Ordering::Relaxed);
            }
            // Guesses for this layer that it did not ask for may go now;
            // what it asked for stays until the request is done with it, so
            // the cache never lets go of an expert still being computed
            // with (its memory would only be freed later, over the budget).
            st.cache.unprotect_layer(layer);
            for (pos, &id) in ids.iter().enumerate() {
                st.cache.protect(layer, id);
                let held = st.cache.get_weighted(layer, id, weight(pos));
                match (st.take_landed((layer, id)), held) {
                    (Some(expert), _) | (None, Some(Held::Ready(expert))) => {
                        fetch.ready.push_back((pos, expert));
                    }
                    (None, Some(Held::Packed(record))) => fetch.packed.push_back((pos, id, record)),
                    (None, None) => fetch.unread.push_back((pos, id)),
                }
            }
            // Guesses for this layer that landed and were not asked for go.
            st.drop_landed(layer);
            (due && pass > 0).then_some(pass)
        };
        if let Some(pass) = replay_at {
            self.replay_if_useful(pass);
        }
        // Ask the drives for everything missing before the model moves on.
        fetch.top_up()?;
        Ok(Box::new(fetch))
    }

    fn wants_hints(&self) -> bool {
        // Once every expert is held there is nothing to guess.
        self.prefetch
            && self
                .shared
                .state
                .lock()
                .is_ok_and(|st| st.cache.counters().held_bytes < self.all_experts_bytes)
    }

    fn prefetch(&self, layer: usize, ids: &[usize]) {
        let Some(records) = self.shared.layers.get(&layer) else {
            return;
        };
        let Ok(mut st) = self.shared.state.lock() else {
            return;
        };
        // Predictions are scored whether or not they are read, so the gate
        // below always has a fresh precision to go by.
        st.score.predicted(layer, ids);
        // Reading ahead stops while the system says memory is short: a
        // guess is worth less than keeping the machine from swapping.
        if !self.prefetch || !st.score.worth_reading() || crate::platform::memory_pressed() {
            return;
        }
        for &id in ids.iter().filter(|&&id| id < records.records.len()) {
            let bytes = self.held_bytes(records, id);
            if st.cache.contains(layer, id) {
                st.cache.protect(layer, id);
                continue;
            }
            if st.flights.contains_key(&(layer, id)) || st.landed.contains_key(&(layer, id)) {
                continue;
            }
            if st.speculative_bytes >= self.window_bytes {
                // Enough guesses on their way; the rest are read on demand.
                break;
            }
            // A guess is read ahead, not cached ahead: it enters the cache
            // only if a demand read of it would (frequency admission), so a
            // prediction never displaces an expert the cache chose to keep.
            let kept = st.cache.reserve(layer, id, bytes, false);
            if kept {
                st.cache.protect(layer, id);
            }
            if self
                .start_read(&mut st, records, id, Priority::Prefetch, kept, true)
                .is_ok()
            {
                st.score
                    .prefetch_started(layer, id, records.records[id].stored());
            } else if kept {
                st.cache.cancel(layer, id);
            }
        }
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
            stored_len: None,
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
