//! A byte-budgeted map of experts: a pinned tier that is never evicted, and
//! least-recently-used eviction for the rest.
//!
//! The budget is a hard limit on the bytes the cache holds, pinned included. An expert that
//! does not fit even in an empty cache is simply not kept. Evicting drops the
//! cache's reference at once, so the memory is freed as soon as the forward
//! pass that is using it (if any) lets go.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use crate::model::Expert;

type Key = (usize, usize);

struct Entry {
    expert: Arc<Expert>,
    bytes: u64,
    last_used: u64,
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
    held: u64,
    clock: u64,
    entries: HashMap<Key, Entry>,
    /// last_used tick → key of unpinned entries, oldest first.
    recency: BTreeMap<u64, Key>,
    /// Experts that are kept for good once loaded.
    pin_set: HashSet<Key>,
    pinned_held: u64,
    counters: CacheCounters,
}

impl ExpertCache {
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            held: 0,
            clock: 0,
            entries: HashMap::new(),
            recency: BTreeMap::new(),
            pin_set: HashSet::new(),
            pinned_held: 0,
            counters: CacheCounters {
                budget_bytes: budget,
                ..Default::default()
            },
        }
    }

    /// Looks up an expert, counting a hit or a miss.
    pub fn get(&mut self, layer: usize, id: usize) -> Option<Arc<Expert>> {
        self.clock += 1;
        let tick = self.clock;
        match self.entries.get_mut(&(layer, id)) {
            Some(e) => {
                if !e.pinned {
                    self.recency.remove(&e.last_used);
                    self.recency.insert(tick, (layer, id));
                }
                e.last_used = tick;
                self.counters.hits += 1;
                Some(Arc::clone(&e.expert))
            }
            None => {
                self.counters.misses += 1;
                None
            }
        }
    }

    /// Designates the experts to keep for good once loaded. Callers keep
    /// their total size within the budget.
    pub fn set_pinned(&mut self, keys: impl IntoIterator<Item = Key>) {
        self.pin_set = keys.into_iter().collect();
    }

    /// Keeps `expert` if it fits, evicting the least recently used unpinned
    /// experts first; pinned experts are never evicted.
    pub fn insert(&mut self, layer: usize, id: usize, expert: Arc<Expert>, bytes: u64) {
        if bytes > self.budget || self.entries.contains_key(&(layer, id)) {
            return;
        }
        while self.held + bytes > self.budget {
            let Some((_, key)) = self.recency.pop_first() else {
                break;
            };
            if let Some(old) = self.entries.remove(&key) {
                self.held -= old.bytes;
                self.counters.evictions += 1;
            }
        }
        if self.held + bytes > self.budget {
            return;
        }
        let pinned = self.pin_set.contains(&(layer, id));
        self.clock += 1;
        if pinned {
            self.pinned_held += bytes;
        } else {
            self.recency.insert(self.clock, (layer, id));
        }
        self.entries.insert(
            (layer, id),
            Entry {
                expert,
                bytes,
                last_used: self.clock,
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
    use candle_core::{Device, Tensor};
    use proptest::prelude::*;

    fn expert() -> Arc<Expert> {
        let t = |r, c| Tensor::zeros((r, c), candle_core::DType::F32, &Device::Cpu).unwrap();
        Arc::new(Expert::new(t(4, 2), t(2, 2)).unwrap())
    }

    #[test]
    fn evicts_least_recently_used() {
        let mut c = ExpertCache::new(20);
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
