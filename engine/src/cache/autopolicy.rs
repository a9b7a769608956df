//! A pack's eviction policy, kept up to date from its routing: the trace
//! summary is replayed against every candidate (see [`super::choose`]) off
//! the model's thread when the pack opens with enough of a trace, and again
//! every [`RECHOOSE_PASSES`] passes as it grows; an automatic policy then
//! switches to the choice, carrying over the recency and counts the trace
//! holds.
//!
//! Replays run at the lowest priority, and not at all on their own when the
//! budget holds every expert of the pack (no policy ever evicts there, so
//! every one scores alike). Warm, with a full heat file, a replay at open
//! took a fifth of the process's CPU time during a 48-token decode on two
//! cores, and the Q4_K_M Qwen3-MoE decoded at 67–81 tok/s beside
//! llama.cpp's 86–94; without it, at 103–113 beside 83–92.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::choose::{PolicyReport, Shape, choose, replay, warmup_lookups};
use super::heat::Routed;
use super::packed::{RecordBytes, keeps_packed, packed_class, weigh};
use super::policy::EvictionPolicy;
use super::streaming::StreamingExperts;

/// Passes (tokens, or a prompt's chunks) between replays of the trace to
/// choose the policy again: a few minutes of decoding at a token a second,
/// and replays that cost a few seconds of one core.
pub const RECHOOSE_PASSES: u64 = 256;
/// Passes a pack's trace must hold before a policy is chosen from it.
pub const MIN_CHOICE_PASSES: u64 = 32;
/// Passes after which a cache that may keep records packed first weighs
/// doing so (the policy waits for [`MIN_CHOICE_PASSES`]). A first run keeps
/// records packed until weighed: on a BF16 DeepSeek-V3-shaped pack with
/// skewed routing, restoring hits made its first 32 tokens decode at 2.1
/// tok/s where the same pack ran at 5.2 as weights.
pub const FIRST_WEIGH_PASSES: u64 = 8;

/// The pass of a cache's first replay.
pub(super) fn first_replay(may_pack: bool) -> u64 {
    match may_pack {
        true => FIRST_WEIGH_PASSES,
        false => MIN_CHOICE_PASSES,
    }
}

impl StreamingExperts {
    /// [`Self::replay_trace`] when a choice can matter: the budget cannot
    /// hold every expert of the pack.
    pub(super) fn replay_if_useful(&self, now: u64) {
        if !self.holds_every_expert() {
            self.replay_trace(now);
        }
    }

    /// Whether the budget holds every expert of the pack as weights.
    fn holds_every_expert(&self) -> bool {
        let all: u64 = self
            .shared
            .layers
            .values()
            .map(|l| self.ram_bytes(l) * l.records.len() as u64)
            .sum();
        self.shared
            .state
            .lock()
            .is_ok_and(|s| all <= s.cache.counters().budget_bytes)
    }

    /// Replays the trace summary on another thread against every candidate
    /// policy at this cache's budget, keeps the report, and (when the policy
    /// is automatic) switches to the one chosen. `now` is the cache's pass.
    pub(super) fn replay_trace(&self, now: u64) {
        if self.choosing.swap(true, Ordering::AcqRel) {
            return;
        }
        let trace: Vec<Routed> = match self.heat.lock() {
            Ok(h) => h.routed().cloned().collect(),
            Err(_) => {
                self.choosing.store(false, Ordering::Release);
                return;
            }
        };
        let bytes: HashMap<usize, u64> = self
            .shared
            .layers
            .values()
            .map(|l| {
                let all: u64 = (0..l.records.len()).map(|id| self.held_bytes(l, id)).sum();
                (l.layer, all / l.records.len().max(1) as u64)
            })
            .collect();
        let (budget, layers) = (
            self.shared
                .state
                .lock()
                .map_or(0, |s| s.cache.counters().budget_bytes),
            self.shared.layers.len(),
        );
        let (shared, report, choosing) = (
            Arc::clone(&self.shared),
            Arc::clone(&self.report),
            Arc::clone(&self.choosing),
        );
        let automatic = self.automatic;
        let packing = self.packing_inputs();
        let sustained = self.sustained_seconds_per_byte;
        let spawned = std::thread::Builder::new()
            .name("longhaul-policy".into())
            .spawn(move || {
                crate::background::lowest_priority();
                let bytes_of = |layer: usize| bytes.get(&layer).copied().unwrap_or(1);
                let shape = Shape {
                    budget,
                    layers,
                    bytes: &bytes_of,
                };
                let current = shared
                    .state
                    .lock()
                    .map_or(EvictionPolicy::default(), |s| s.cache.policy());
                let mut found = choose(&trace, shape, current);
                found.automatic = automatic;
                if let Some((window, sizes, record)) = &packing {
                    // The policy chosen, replayed with records held packed and as weights.
                    let at = |packed: bool| {
                        let bytes_of = |layer: usize| {
                            let (p, w) = sizes.get(&layer).copied().unwrap_or((1, 1));
                            if packed { p } else { w }
                        };
                        let shape = Shape {
                            budget,
                            layers,
                            bytes: &bytes_of,
                        };
                        replay(&trace, found.chosen, shape, warmup_lookups(&trace))
                    };
                    let now_packed = shared.packing.load(Ordering::Relaxed);
                    found.packing = weigh(
                        window,
                        (at(true), at(false)),
                        *record,
                        sustained,
                        now_packed,
                    );
                    if let Some(c) = &found.packing {
                        shared.packing.store(c.packed, Ordering::Relaxed);
                    }
                }
                // A trace shorter than MIN_CHOICE_PASSES weighs packing only.
                let settled = passes_in(trace.iter()) >= MIN_CHOICE_PASSES;
                if let Ok(mut st) = shared.state.lock() {
                    if automatic && settled && found.chosen != current {
                        let history = with_passes(&trace, now);
                        st.cache.set_policy(found.chosen, &history);
                    }
                    found.chosen = st.cache.policy();
                }
                if let Ok(mut r) = report.lock() {
                    *r = Some(found);
                }
                choosing.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.choosing.store(false, Ordering::Release);
        }
    }

    /// What weighing packed records needs, when the cache may keep them: the
    /// decode passes measured since last time, each layer's bytes per expert
    /// held packed and as weights, and a record's bytes as read and restored.
    #[allow(clippy::type_complexity)]
    fn packing_inputs(
        &self,
    ) -> Option<(
        super::packed::Tally,
        HashMap<usize, (u64, u64)>,
        RecordBytes,
    )> {
        if !self.shared.may_pack {
            return None;
        }
        let window = self.meter.lock().ok()?.take();
        let (mut read, mut plain, mut records) = (0u64, 0u64, 0u64);
        let sizes = self
            .shared
            .layers
            .values()
            .map(|l| {
                let n = l.records.len().max(1) as u64;
                let weights = self.ram_bytes(l);
                let packed: u64 = l
                    .records
                    .iter()
                    .map(|r| match keeps_packed(r) {
                        true => packed_class(r.stored(), r.len),
                        false => weights,
                    })
                    .sum();
                read += l.records.iter().map(|r| r.stored()).sum::<u64>();
                plain += weights * n;
                records += n;
                (l.layer, (packed / n, weights))
            })
            .collect();
        let record = RecordBytes {
            read: read as f64 / records.max(1) as f64,
            plain: plain as f64 / records.max(1) as f64,
        };
        Some((window, sizes, record))
    }

    /// The latest replays of the pack's trace and the policy in use.
    pub fn policy_report(&self) -> Option<PolicyReport> {
        self.report.lock().ok().and_then(|r| r.clone())
    }

    /// Replays the trace now and waits for the report (for benchmarks and tests).
    pub fn replay_now(&self) -> Option<PolicyReport> {
        while self.choosing.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let now = self.shared.state.lock().map_or(0, |s| s.cache.pass());
        self.replay_trace(now);
        while self.choosing.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.policy_report()
    }
}

/// Passes in a trace, counted as the cache counts them.
pub(super) fn passes_in<'a>(trace: impl Iterator<Item = &'a Routed>) -> u64 {
    let (mut passes, mut last) = (0, None);
    for r in trace {
        if last.is_some_and(|l| r.layer <= l) {
            passes += 1;
        }
        last = Some(r.layer);
    }
    passes
}

/// Each expert lookup of `trace` with its weight and pass, the last lookup
/// at pass `now`.
fn with_passes(trace: &[Routed], now: u64) -> Vec<((usize, usize), u32, u64)> {
    let start = now.saturating_sub(passes_in(trace.iter()));
    let (mut pass, mut last) = (start, None);
    let mut out = Vec::new();
    for r in trace {
        if last.is_some_and(|l| r.layer <= l) {
            pass += 1;
        }
        last = Some(r.layer);
        out.extend(r.experts.iter().map(|&(id, w)| ((r.layer, id), w, pass)));
    }
    out
}
