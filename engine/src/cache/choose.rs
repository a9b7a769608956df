//! Choosing a pack's eviction policy from its own routing.
//!
//! Every candidate policy is replayed over the pack's recent routing trace
//! (see [`super::heat`]) by the cache's own code, at the budget in use, next
//! to Belady's optimum and the best fixed set in hindsight on the same
//! lookups; the best candidate wins, and the policy in use is kept unless
//! another beats it by [`SWITCH_MARGIN`]. Peers' measurements are why it is a
//! choice and not a constant: recency wins on some Qwen models (LRU-128 at
//! 81 %), frequency on DeepSeek-V4 (LRU 8–18 % against a frequency oracle's
//! 46 %), and a protected segment nearly doubles LRU's hits at tight budgets.

use serde::Serialize;

use super::budget::ExpertCache;
use super::heat::Routed;
use super::policy::{EvictionPolicy, Rule};
use crate::metrics::Access;
use crate::metrics::replay::{belady_hit_rate, oracle_pin_hit_rate};

/// Half-lives (in passes: tokens while decoding) tried for decayed counts.
const HALF_LIVES: [u32; 4] = [4, 16, 64, 256];
/// Protected shares tried for segmented LRU.
const PROTECTED_PERCENTS: [u8; 2] = [50, 80];
/// Hit-rate gain another policy must show on the trace before it replaces
/// the one in use: replays of nearly equal policies differ by noise, and each
/// switch forgets part of what the cache learnt.
pub const SWITCH_MARGIN: f64 = 0.005;
/// Share of the trace replayed before hits count: the cache fills first, as
/// a real one does once per run.
const WARMUP_SHARE: f64 = 0.25;

/// Every policy a pack's trace is replayed against, in a fixed order (ties
/// go to the earlier).
pub fn candidates() -> Vec<EvictionPolicy> {
    let mut rules = vec![Rule::Lfu, Rule::Lru];
    rules.extend(HALF_LIVES.map(|half_life| Rule::DecayedLfu { half_life }));
    rules.extend(PROTECTED_PERCENTS.map(|protected_percent| Rule::Slru { protected_percent }));
    rules.push(Rule::Arc);
    [false, true]
        .into_iter()
        .flat_map(|per_layer| {
            rules
                .iter()
                .map(move |&rule| EvictionPolicy { rule, per_layer })
        })
        .collect()
}

/// One policy's replayed hit rate.
#[derive(Debug, Clone, Serialize, PartialEq, ts_rs::TS)]
pub struct Replayed {
    /// As written in settings: `lfu`, `slru:80/layer`, …
    #[ts(type = "string")]
    pub policy: EvictionPolicy,
    pub hit_rate: f64,
    /// Belady's hit rate minus this one.
    pub regret: f64,
}

/// What the replays found, and the policy chosen from them.
#[derive(Debug, Clone, Serialize, PartialEq, ts_rs::TS)]
pub struct PolicyReport {
    #[ts(type = "string")]
    pub chosen: EvictionPolicy,
    /// Chosen from the trace (`false`: set by hand; the replays are for comparison).
    pub automatic: bool,
    /// Every candidate, best first.
    pub candidates: Vec<Replayed>,
    pub belady_hit_rate: f64,
    pub best_fixed_hit_rate: f64,
    /// Expert lookups replayed, and those counted.
    pub lookups: usize,
    pub counted_lookups: usize,
    pub budget_bytes: u64,
    /// Whether the cache keeps compressed records packed, and why (for packs
    /// whose records are compressed and do not all fit as weights).
    pub packing: Option<super::packed::PackingChoice>,
}

/// The shape of the experts a trace is replayed for.
#[derive(Clone, Copy)]
pub struct Shape<'a> {
    pub budget: u64,
    /// Expert layers, for per-layer shares.
    pub layers: usize,
    /// Bytes one expert of a layer takes in the cache.
    pub bytes: &'a dyn Fn(usize) -> u64,
}

/// Hit rate of `policy` on `trace`, counting lookups from access `count_from` on.
pub fn replay(
    trace: &[Routed],
    policy: EvictionPolicy,
    shape: Shape<'_>,
    count_from: usize,
) -> f64 {
    let mut cache: ExpertCache<()> = ExpertCache::with_policy(shape.budget, policy);
    cache.set_layers(shape.layers);
    let (mut at, mut hits, mut counted) = (0usize, 0u64, 0u64);
    for r in trace {
        cache.begin_lookup(r.layer);
        for &(id, weight) in &r.experts {
            let hit = cache.get_weighted(r.layer, id, weight).is_some();
            if !hit {
                cache.insert(r.layer, id, (), (shape.bytes)(r.layer));
            }
            if at >= count_from {
                counted += 1;
                hits += u64::from(hit);
            }
            at += 1;
        }
    }
    hits as f64 / counted.max(1) as f64
}

/// Replays every candidate on `trace` and chooses: the best, unless
/// `current` is within [`SWITCH_MARGIN`] of it. Hits count after the first
/// quarter of the trace's expert lookups.
pub fn choose(trace: &[Routed], shape: Shape<'_>, current: EvictionPolicy) -> PolicyReport {
    choose_counting(trace, shape, current, warmup_lookups(trace))
}

/// Expert lookups of `trace` replayed before hits count.
pub fn warmup_lookups(trace: &[Routed]) -> usize {
    let lookups: usize = trace.iter().map(|r| r.experts.len()).sum();
    (lookups as f64 * WARMUP_SHARE) as usize
}

/// [`choose`], counting hits from expert lookup `count_from` on.
pub fn choose_counting(
    trace: &[Routed],
    shape: Shape<'_>,
    current: EvictionPolicy,
    count_from: usize,
) -> PolicyReport {
    let accesses: Vec<Access> = trace
        .iter()
        .flat_map(|r| r.experts.iter().map(move |&(id, _)| (r.layer, id)))
        .collect();
    let typical = trace.first().map_or(1, |r| (shape.bytes)(r.layer).max(1));
    let slots = (shape.budget / typical) as usize;
    let belady = belady_hit_rate(&accesses, slots, count_from);
    let mut candidates: Vec<Replayed> = candidates()
        .into_iter()
        .map(|policy| {
            let hit_rate = replay(trace, policy, shape, count_from);
            Replayed {
                policy,
                hit_rate,
                regret: belady - hit_rate,
            }
        })
        .collect();
    // Stable: equal rates keep the candidates' order.
    candidates.sort_by(|a, b| b.hit_rate.total_cmp(&a.hit_rate));
    let rate_of = |p: EvictionPolicy| {
        candidates
            .iter()
            .find(|c| c.policy == p)
            .map(|c| c.hit_rate)
    };
    let chosen = match (candidates.first(), rate_of(current)) {
        (Some(best), Some(now)) if best.hit_rate < now + SWITCH_MARGIN => current,
        (Some(best), _) => best.policy,
        (None, _) => current,
    };
    PolicyReport {
        chosen,
        automatic: true,
        candidates,
        belady_hit_rate: belady,
        best_fixed_hit_rate: oracle_pin_hit_rate(&accesses, slots, count_from),
        lookups: accesses.len(),
        counted_lookups: accesses.len() - count_from.min(accesses.len()),
        budget_bytes: shape.budget,
        packing: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(layer: usize, ids: &[usize]) -> Routed {
        Routed {
            layer,
            experts: ids.iter().map(|&i| (i, 1)).collect(),
        }
    }

    #[test]
    fn a_hot_expert_between_scans_is_left_to_frequency() {
        // Each token asks for expert 0 of layer 0, then five experts of
        // layer 1 never seen before: a 4-slot LRU loses expert 0 every time.
        let trace: Vec<Routed> = (0..400)
            .flat_map(|t| {
                let scan: Vec<usize> = (0..5).map(|i| 5 * t + i).collect();
                [routed(0, &[0]), routed(1, &scan)]
            })
            .collect();
        let shape = Shape {
            budget: 4,
            layers: 2,
            bytes: &|_| 1,
        };
        let lru = replay(&trace, EvictionPolicy::LRU, shape, 600);
        let lfu = replay(&trace, EvictionPolicy::LFU, shape, 600);
        assert!(lfu > lru + 0.15, "lfu {lfu} lru {lru}");
        let report = choose(&trace, shape, EvictionPolicy::LRU);
        assert_ne!(report.chosen, EvictionPolicy::LRU);
        assert!(report.candidates[0].hit_rate <= report.belady_hit_rate + 1e-12);
        assert_eq!(report.candidates.len(), candidates().len());
    }

    #[test]
    fn drifting_popularity_is_left_to_recency() {
        // The hot set moves every 50 tokens: plain counts hold on to the old one.
        let trace: Vec<Routed> = (0..600)
            .map(|t| {
                let base = (t / 50) * 4;
                routed(0, &[base + t % 4, 100 + t % 37])
            })
            .collect();
        let shape = Shape {
            budget: 6,
            layers: 1,
            bytes: &|_| 1,
        };
        let report = choose(&trace, shape, EvictionPolicy::LFU);
        assert_ne!(report.chosen.rule, Rule::Lfu, "{report:?}");
        let lfu = replay(&trace, EvictionPolicy::LFU, shape, 150);
        let best = report.candidates[0].hit_rate;
        assert!(best > lfu + 0.1, "best {best} lfu {lfu}");
    }

    #[test]
    fn the_policy_in_use_stays_within_the_margin() {
        let trace: Vec<Routed> = (0..100).map(|t| routed(0, &[t % 3])).collect();
        let shape = Shape {
            budget: 3,
            layers: 1,
            bytes: &|_| 1,
        };
        // Everything fits: every policy hits the same.
        let lru = "lru".parse().unwrap();
        assert_eq!(choose(&trace, shape, lru).chosen, lru);
    }
}
