//! A byte-budgeted map of experts: a pinned tier that is never evicted, and
//! an eviction policy for the rest — least frequently used by default, or
//! least recently used.
//!
//! The budget is a hard limit on the bytes the cache holds, pinned included.
//! An expert that does not fit even in an empty cache is simply not kept.
//! Evicting drops the cache's reference at once, so the memory is freed as
//! soon as the forward pass that is using it (if any) lets go.
//!
//! LFU is the default because it measured better: on Zipf-skewed synthetic
//! routing with 17% of the experts fitting, replayed LFU hit 0.40 of lookups
//! where LRU hit 0.22 (the best fixed set in hindsight: 0.46), because a
//! MoE layer touches most of its experts within a few tokens, flushing an
//! LRU cache of the popular ones.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use crate::model::Expert;

type Key = (usize, usize);

/// Which unpinned expert leaves first when room is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// The least often looked up so far (ties: the least recently); an
    /// expert looked up less often than the one it would displace is not kept.
    #[default]
    LeastFrequentlyUsed,
    /// The least recently looked up.
    LeastRecentlyUsed,
}

struct Entry {
    expert: Arc<Expert>,
    bytes: u64,
    pinned: bool,
}

/// Hit, miss and eviction counts.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct CacheCounters {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub held_bytes: u64,
    pub pinned_bytes: u64,
    pub budget_bytes: u64,
}

pub struct ExpertCache {
    budget: u64,
    policy: EvictionPolicy,
    held: u64,
    clock: u64,
    entries: HashMap<Key, Entry>,
    /// Lookups so far and the tick of the last one, for every expert seen.
    uses: HashMap<Key, (u64, u64)>,
    /// Unpinned cached experts in eviction order (first leaves first).
    order: BTreeSet<(u64, u64, Key)>,
    /// Experts that are kept for good once loaded.
    pin_set: HashSet<Key>,
    pinned_held: u64,
    counters: CacheCounters,
}

impl ExpertCache {
    pub fn new(budget: u64) -> Self {
        Self::with_policy(budget, EvictionPolicy::default())
    }

    pub fn with_policy(budget: u64, policy: EvictionPolicy) -> Self {
        Self {
            budget,
            policy,
            held: 0,
            clock: 0,
            entries: HashMap::new(),
            uses: HashMap::new(),
            order: BTreeSet::new(),
            pin_set: HashSet::new(),
            pinned_held: 0,
            counters: CacheCounters {
                budget_bytes: budget,
                ..Default::default()
            },
        }
    }

    /// Position in the eviction order for an expert used `count` times, last at `tick`.
    fn rank(&self, key: Key, (count, tick): (u64, u64)) -> (u64, u64, Key) {
        match self.policy {
            EvictionPolicy::LeastFrequentlyUsed => (count, tick, key),
            EvictionPolicy::LeastRecentlyUsed => (0, tick, key),
        }
    }

    /// Looks up an expert, counting a hit or a miss.
    pub fn get(&mut self, layer: usize, id: usize) -> Option<Arc<Expert>> {
        let key = (layer, id);
        self.clock += 1;
        let before = self.uses.get(&key).copied().unwrap_or((0, 0));
        let after = (before.0 + 1, self.clock);
        self.uses.insert(key, after);
        let (old, new) = (self.rank(key, before), self.rank(key, after));
        match self.entries.get(&key) {
            Some(e) => {
                if !e.pinned {
                    self.order.remove(&old);
                    self.order.insert(new);
                }
                self.counters.hits += 1;
                Some(Arc::clone(&e.expert))
            }
            None => {
                self.counters.misses += 1;
                None
            }
        }
    }

    /// Starts experts off with lookup counts from earlier runs, so frequency
    /// ranking works from the first token.
    pub fn seed_uses(&mut self, seeds: impl IntoIterator<Item = (Key, u64)>) {
        for (key, count) in seeds {
            self.uses.entry(key).or_insert((count, 0));
        }
    }

    /// Designates the experts to keep for good once loaded. Callers keep
    /// their total size within the budget.
    pub fn set_pinned(&mut self, keys: impl IntoIterator<Item = Key>) {
        self.pin_set = keys.into_iter().collect();
    }

    /// Keeps `expert` if it fits, evicting unpinned experts in policy order
    /// first; pinned experts are never evicted.
    pub fn insert(&mut self, layer: usize, id: usize, expert: Arc<Expert>, bytes: u64) {
        let key = (layer, id);
        if bytes > self.budget || self.entries.contains_key(&key) {
            return;
        }
        let uses = self.uses.get(&key).copied().unwrap_or((0, self.clock));
        if self.policy == EvictionPolicy::LeastFrequentlyUsed
            && self.held + bytes > self.budget
            && self.order.first().is_some_and(|v| v.0 > uses.0)
        {
            // Frequency admission: a newcomer used less often than the
            // expert it would displace is used once and not kept.
            return;
        }
        while self.held + bytes > self.budget {
            let Some((_, _, victim)) = self.order.pop_first() else {
                break;
            };
            if let Some(old) = self.entries.remove(&victim) {
                self.held -= old.bytes;
                self.counters.evictions += 1;
            }
        }
        if self.held + bytes > self.budget {
            return;
        }
        let pinned = self.pin_set.contains(&key);
        if pinned {
            self.pinned_held += bytes;
        } else {
            let rank = self.rank(key, uses);
            self.order.insert(rank);
        }
        self.entries.insert(
            key,
            Entry {
                expert,
                bytes,
                pinned,
            },
        );
        self.held += bytes;
    }

    pub fn counters(&self) -> CacheCounters {
        CacheCounters {
            held_bytes: self.held,
            pinned_bytes: self.pinned_held,
            ..self.counters
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn expert() -> Arc<Expert> {
        let m =
            |r: usize, c: usize| crate::kernels::Matrix::from_f32(r, c, &vec![0.0; r * c]).unwrap();
        Arc::new(Expert::new(m(4, 2), m(2, 2)).unwrap())
    }

    #[test]
    fn lfu_keeps_the_often_used_expert() {
        let mut c = ExpertCache::new(20);
        for _ in 0..3 {
            c.get(0, 0);
        }
        c.insert(0, 0, expert(), 10);
        c.get(0, 1);
        c.insert(0, 1, expert(), 10);
        c.get(0, 2);
        c.insert(0, 2, expert(), 10);
        assert!(c.get(0, 0).is_some(), "used 4 times: kept");
        assert!(c.get(0, 1).is_none(), "used once, earlier: evicted");
    }

    #[test]
    fn lfu_does_not_displace_a_more_used_expert_for_a_newcomer() {
        let mut c = ExpertCache::new(10);
        for _ in 0..2 {
            c.get(0, 0);
        }
        c.insert(0, 0, expert(), 10);
        c.get(0, 1);
        c.insert(0, 1, expert(), 10);
        assert!(c.get(0, 0).is_some(), "used 3 times: kept over a newcomer");
        assert_eq!(c.counters().evictions, 0);
        // Once the newcomer has been used as often, it takes the place.
        for _ in 0..3 {
            c.get(0, 1);
        }
        c.insert(0, 1, expert(), 10);
        assert!(c.get(0, 1).is_some());
        assert_eq!(c.counters().evictions, 1);
    }

    #[test]
    fn evicts_least_recently_used() {
        let mut c = ExpertCache::with_policy(20, EvictionPolicy::LeastRecentlyUsed);
        c.insert(0, 0, expert(), 10);
        c.insert(0, 1, expert(), 10);
        assert!(c.get(0, 0).is_some());
        c.insert(0, 2, expert(), 10);
        assert!(c.get(0, 1).is_none(), "1 was least recently used");
        assert!(c.get(0, 0).is_some() && c.get(0, 2).is_some());
        assert_eq!(c.counters().evictions, 1);
    }

    #[test]
    fn zero_budget_keeps_nothing() {
        let mut c = ExpertCache::new(0);
        c.insert(0, 0, expert(), 1);
        assert!(c.get(0, 0).is_none());
        assert_eq!(c.counters().held_bytes, 0);
    }

    #[test]
    fn pinned_experts_are_never_evicted() {
        let mut c = ExpertCache::new(20);
        c.set_pinned([(0, 0)]);
        c.insert(0, 0, expert(), 10);
        for id in 1..10 {
            c.insert(0, id, expert(), 10);
        }
        assert!(c.get(0, 0).is_some());
        assert_eq!(c.counters().pinned_bytes, 10);
    }

    proptest! {
        #[test]
        fn never_exceeds_its_budget(
            budget in 0u64..200,
            pins in proptest::collection::vec((0usize..4, 0usize..16), 0..4),
            ops in proptest::collection::vec((0usize..4, 0usize..16, 1u64..60), 1..200),
        ) {
            let mut c = ExpertCache::new(budget);
            c.set_pinned(pins);
            for (layer, id, bytes) in ops {
                if c.get(layer, id).is_none() {
                    c.insert(layer, id, expert(), bytes);
                }
                prop_assert!(c.counters().held_bytes <= budget);
            }
        }
    }
}
