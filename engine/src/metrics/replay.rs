//! Replaying a routing trace against idealised caches, so a measured hit rate
//! can be put next to what was achievable. Each replay runs over the whole
//! trace from an empty cache, like the real one, but counts hits only from
//! `count_from` on (the measured window):
//! - the best fixed set of experts chosen in hindsight (pin the most used that fit);
//! - Belady's optimal offline policy (keep what is needed soonest; an expert
//!   needed later than everything cached is used and not kept), the absolute
//!   bound for any cache of that size.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::Serialize;

use super::Access;

/// Hit rate over `trace[count_from..]` of pinning the `slots` experts most used there.
pub fn oracle_pin_hit_rate(trace: &[Access], slots: usize, count_from: usize) -> f64 {
    let trace = trace.get(count_from..).unwrap_or_default();
    if trace.is_empty() {
        return 0.0;
    }
    let mut counts: HashMap<Access, u64> = HashMap::new();
    for a in trace {
        *counts.entry(*a).or_default() += 1;
    }
    let mut by_use: Vec<u64> = counts.into_values().collect();
    by_use.sort_unstable_by(|a, b| b.cmp(a));
    let hits: u64 = by_use.iter().take(slots).sum();
    hits as f64 / trace.len() as f64
}

/// Hit rate over `trace[count_from..]` of Belady's MIN with room for `slots` experts.
pub fn belady_hit_rate(trace: &[Access], slots: usize, count_from: usize) -> f64 {
    if trace.len() <= count_from || slots == 0 {
        return 0.0;
    }
    // next_use[i]: index of the next access to the same expert after i.
    let mut next_use = vec![usize::MAX; trace.len()];
    let mut last: HashMap<Access, usize> = HashMap::new();
    for (i, a) in trace.iter().enumerate().rev() {
        if let Some(&j) = last.get(a) {
            next_use[i] = j;
        }
        last.insert(*a, i);
    }
    // Cached experts ordered by their next use; the last one is evicted.
    let mut by_next: BTreeSet<(usize, Access)> = BTreeSet::new();
    let mut next_of: HashMap<Access, usize> = HashMap::new();
    let mut hits = 0u64;
    for (i, a) in trace.iter().enumerate() {
        if let Some(n) = next_of.remove(a) {
            hits += u64::from(i >= count_from);
            by_next.remove(&(n, *a));
        } else if by_next.len() == slots {
            // Bypass: an expert needed later than everything cached is not kept.
            if by_next.last().is_some_and(|f| f.0 < next_use[i]) {
                continue;
            }
            if let Some(furthest) = by_next.pop_last() {
                next_of.remove(&furthest.1);
            }
        }
        by_next.insert((next_use[i], *a));
        next_of.insert(*a, next_use[i]);
    }
    hits as f64 / (trace.len() - count_from) as f64
}

/// Hit rate over `trace[count_from..]` of a least-recently-used cache with room for `slots` experts.
pub fn lru_hit_rate(trace: &[Access], slots: usize, count_from: usize) -> f64 {
    if trace.len() <= count_from || slots == 0 {
        return 0.0;
    }
    let mut last_use: HashMap<Access, usize> = HashMap::new();
    let mut by_age: BTreeSet<(usize, Access)> = BTreeSet::new();
    let mut hits = 0u64;
    for (i, a) in trace.iter().enumerate() {
        if let Some(t) = last_use.insert(*a, i) {
            hits += u64::from(i >= count_from);
            by_age.remove(&(t, *a));
        } else if by_age.len() == slots
            && let Some(oldest) = by_age.pop_first()
        {
            last_use.remove(&oldest.1);
        }
        by_age.insert((i, *a));
    }
    hits as f64 / (trace.len() - count_from) as f64
}

/// Hit rate over `trace[count_from..]` of a least-frequently-used cache with
/// room for `slots` experts (counts over the whole history; ties evict the
/// least recently used; a newcomer used less often than the expert it
/// would displace is not kept).
pub fn lfu_hit_rate(trace: &[Access], slots: usize, count_from: usize) -> f64 {
    if trace.len() <= count_from || slots == 0 {
        return 0.0;
    }
    let mut uses: HashMap<Access, (u64, usize)> = HashMap::new();
    let mut cached: BTreeSet<(u64, usize, Access)> = BTreeSet::new();
    let mut hits = 0u64;
    for (i, a) in trace.iter().enumerate() {
        let (count, last) = uses.get(a).copied().unwrap_or((0, 0));
        uses.insert(*a, (count + 1, i));
        if cached.remove(&(count, last, *a)) {
            hits += u64::from(i >= count_from);
        } else if cached.len() == slots {
            // Frequency admission, as the live cache does it.
            if cached.first().is_some_and(|v| v.0 > count + 1) {
                continue;
            }
            cached.pop_first();
        }
        cached.insert((count + 1, i, *a));
    }
    hits as f64 / (trace.len() - count_from) as f64
}

/// How a model routes: how many distinct experts each layer uses, and how
/// much consecutive tokens share.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RoutingStats {
    pub tokens: usize,
    /// Mean over layers of the distinct experts used across all tokens.
    pub experts_used_per_layer: f64,
    /// Mean fraction of a token's experts (per layer) that the previous token also used.
    pub consecutive_overlap: f64,
    /// Share of lookups that went to the most used 10% of (layer, expert) pairs.
    pub top_decile_share: f64,
}

/// Statistics of per-token routing: `tokens[t][layer] = expert ids`.
pub fn routing_stats(tokens: &[Vec<(usize, Vec<usize>)>]) -> RoutingStats {
    let mut used: HashMap<usize, HashSet<usize>> = HashMap::new();
    let mut counts: HashMap<Access, u64> = HashMap::new();
    let (mut overlap_sum, mut overlap_n) = (0.0, 0u64);
    let mut previous: HashMap<usize, &Vec<usize>> = HashMap::new();
    for token in tokens {
        for (layer, ids) in token {
            used.entry(*layer).or_default().extend(ids);
            for id in ids {
                *counts.entry((*layer, *id)).or_default() += 1;
            }
            if let Some(prev) = previous.get(layer)
                && !ids.is_empty()
            {
                let shared = ids.iter().filter(|i| prev.contains(i)).count();
                overlap_sum += shared as f64 / ids.len() as f64;
                overlap_n += 1;
            }
            previous.insert(*layer, ids);
        }
    }
    let mut by_use: Vec<u64> = counts.values().copied().collect();
    by_use.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = by_use.iter().sum();
    let decile = by_use.len().div_ceil(10);
    RoutingStats {
        tokens: tokens.len(),
        experts_used_per_layer: if used.is_empty() {
            0.0
        } else {
            used.values().map(|s| s.len() as f64).sum::<f64>() / used.len() as f64
        },
        consecutive_overlap: if overlap_n == 0 {
            0.0
        } else {
            overlap_sum / overlap_n as f64
        },
        top_decile_share: if total == 0 {
            0.0
        } else {
            by_use.iter().take(decile).sum::<u64>() as f64 / total as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn belady_beats_lru_on_a_cyclic_trace() {
        let trace: Vec<Access> = (0..30).map(|i| (0, i % 4)).collect();
        assert_eq!(
            lru_hit_rate(&trace, 3, 0),
            0.0,
            "LRU thrashes on a cycle one larger than the cache"
        );
        // MIN keeps 0, 1, 2 and never caches 3 (always needed last): after
        // the three cold misses it misses only the 7 lookups of expert 3.
        assert!((belady_hit_rate(&trace, 3, 0) - 20.0 / 30.0).abs() < 1e-12);
        assert!((belady_hit_rate(&trace, 3, 3) - 20.0 / 27.0).abs() < 1e-12);
    }

    #[test]
    fn lfu_keeps_the_frequent_expert() {
        let mut trace = vec![(0, 0); 5];
        trace.extend([(0, 1), (0, 2), (0, 0), (0, 3), (0, 0)]);
        assert!(
            (lfu_hit_rate(&trace, 2, 5) - 0.4).abs() < 1e-12,
            "expert 0 stays; 1, 2, 3 churn"
        );
        assert!(
            (lru_hit_rate(&trace, 2, 5) - 0.2).abs() < 1e-12,
            "LRU loses expert 0 once"
        );
    }

    #[test]
    fn oracle_pins_the_most_used() {
        let trace = vec![(0, 1), (0, 1), (0, 1), (0, 2), (0, 3)];
        assert!((oracle_pin_hit_rate(&trace, 1, 0) - 0.6).abs() < 1e-12);
    }

    #[test]
    fn routing_stats_measure_overlap() {
        let tokens = vec![
            vec![(0, vec![1, 2])],
            vec![(0, vec![2, 3])],
            vec![(0, vec![2, 3])],
        ];
        let s = routing_stats(&tokens);
        assert_eq!(s.experts_used_per_layer, 3.0);
        assert!((s.consecutive_overlap - 0.75).abs() < 1e-12);
    }

    proptest! {
        #[test]
        fn belady_is_an_upper_bound(
            trace in proptest::collection::vec((0usize..2, 0usize..8), 1..300),
            slots in 0usize..10,
        ) {
            let b = belady_hit_rate(&trace, slots, 0);
            prop_assert!(b + 1e-12 >= lru_hit_rate(&trace, slots, 0));
            prop_assert!(b + 1e-12 >= lfu_hit_rate(&trace, slots, 0));
            let from = trace.len() / 2;
            prop_assert!(belady_hit_rate(&trace, slots, from) + 1e-12 >= lru_hit_rate(&trace, slots, from));
            // A cache of the same size that starts empty cannot beat MIN either.
            let distinct: HashSet<_> = trace.iter().collect();
            prop_assert!(b <= 1.0 - distinct.len().min(trace.len()) as f64 / trace.len() as f64 + 1e-12);
        }
    }
}
