//! A byte-budgeted map of experts: a pinned tier that is never evicted, and
//! an eviction policy (see [`super::policy`]) for the rest.
//!
//! The budget is a hard limit on the bytes the cache holds, pinned included,
//! and counts experts still being read: a read reserves its room before it
//! starts. Experts the next layer is predicted to need are protected and
//! never evicted to make room; an expert that does not fit even in an empty
//! cache is simply not kept.
//! Evicting drops the cache's reference at once, so the memory is freed as
//! soon as the forward pass that is using it (if any) lets go.
//!
//! The map is generic over what it holds, so that offline replays of a
//! routing trace run this very code with nothing in it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use super::policy::{EvictionPolicy, Key, Order, order_for};
use crate::model::Expert;

struct Entry<V> {
    /// `None` while the expert is being read into its reserved room.
    value: Option<V>,
    bytes: u64,
    pinned: bool,
}

/// Hit, miss and eviction counts.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq, ts_rs::TS)]
pub struct CacheCounters {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub held_bytes: u64,
    pub pinned_bytes: u64,
    pub budget_bytes: u64,
}

pub struct ExpertCache<V = Arc<Expert>> {
    budget: u64,
    policy: EvictionPolicy,
    order: Box<dyn Order>,
    held: u64,
    /// Passes so far (see [`super::policy`]) and the layer last looked up.
    pass: u64,
    last_layer: Option<usize>,
    entries: HashMap<Key, Entry<V>>,
    /// Bytes held per layer, and the number of expert layers, for per-layer shares.
    layer_held: HashMap<usize, u64>,
    layers: usize,
    /// Experts that are kept for good once loaded.
    pin_set: HashSet<Key>,
    pinned_held: u64,
    /// Experts predicted for the coming layers: never evicted.
    protected: HashSet<Key>,
    counters: CacheCounters,
}

impl<V: Clone> ExpertCache<V> {
    pub fn new(budget: u64) -> Self {
        Self::with_policy(budget, EvictionPolicy::default())
    }

    pub fn with_policy(budget: u64, policy: EvictionPolicy) -> Self {
        Self {
            budget,
            policy,
            order: order_for(policy, budget),
            held: 0,
            pass: 0,
            last_layer: None,
            entries: HashMap::new(),
            layer_held: HashMap::new(),
            layers: 1,
            pin_set: HashSet::new(),
            pinned_held: 0,
            protected: HashSet::new(),
            counters: CacheCounters {
                budget_bytes: budget,
                ..Default::default()
            },
        }
    }

    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Raises the budget by `bytes` (memory given back by something else):
    /// nothing has to leave, so nothing does.
    pub fn grow_budget(&mut self, bytes: u64) {
        self.budget += bytes;
        self.counters.budget_bytes = self.budget;
    }

    /// Switches to another policy. The new one learns the held experts in
    /// `history`'s order (their lookups, oldest first; experts it does not
    /// name go first), so recency and counts carry over as far as the
    /// history reaches.
    pub fn set_policy(&mut self, policy: EvictionPolicy, history: &[(Key, u32, u64)]) {
        let mut order = order_for(policy, self.budget);
        for &(key, weight, pass) in history {
            order.touched(key, weight, pass, false);
        }
        let mut held: Vec<(Key, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.pinned && e.value.is_some())
            .map(|(k, e)| (*k, e.bytes))
            .collect();
        held.sort_unstable();
        for (key, bytes) in held {
            order.inserted(key, bytes);
        }
        self.order = order;
        self.policy = policy;
    }

    /// The number of expert layers, for per-layer shares of the budget.
    pub fn set_layers(&mut self, layers: usize) {
        self.layers = layers.max(1);
    }

    /// Marks the start of a lookup of `layer`'s experts: a layer no deeper
    /// than the previous one begins a new pass.
    pub fn begin_lookup(&mut self, layer: usize) {
        if self.last_layer.is_some_and(|l| layer <= l) {
            self.pass += 1;
        }
        self.last_layer = Some(layer);
    }

    /// The current pass.
    pub fn pass(&self) -> u64 {
        self.pass
    }

    /// Looks up an expert, counting a hit or a miss (an expert still being
    /// read is a miss here).
    pub fn get(&mut self, layer: usize, id: usize) -> Option<V> {
        self.get_weighted(layer, id, 1)
    }

    /// [`ExpertCache::get`] for a lookup on behalf of `weight` rows (a
    /// prompt's chunk routes many tokens to one expert).
    pub fn get_weighted(&mut self, layer: usize, id: usize, weight: u32) -> Option<V> {
        let key = (layer, id);
        let ready = self
            .entries
            .get(&key)
            .and_then(|e| Some((e.value.clone()?, e.pinned)));
        let in_order = ready.as_ref().is_some_and(|(_, pinned)| !pinned);
        self.order.touched(key, weight, self.pass, in_order);
        match ready {
            Some((value, _)) => {
                self.counters.hits += 1;
                Some(value)
            }
            None => {
                self.counters.misses += 1;
                None
            }
        }
    }

    /// The expert if it is held and read, without counting a lookup.
    pub fn peek(&self, layer: usize, id: usize) -> Option<V> {
        self.entries.get(&(layer, id)).and_then(|e| e.value.clone())
    }

    /// Whether the cache holds or is reading `(layer, id)`.
    pub fn contains(&self, layer: usize, id: usize) -> bool {
        self.entries.contains_key(&(layer, id))
    }

    /// Starts experts off with lookup counts from earlier runs, so counting
    /// policies work from the first token.
    pub fn seed_uses(&mut self, seeds: impl IntoIterator<Item = (Key, u64)>) {
        for (key, count) in seeds {
            self.order.seed(key, count);
        }
    }

    /// Designates the experts to keep for good once loaded. Callers keep
    /// their total size within the budget.
    pub fn set_pinned(&mut self, keys: impl IntoIterator<Item = Key>) {
        self.pin_set = keys.into_iter().collect();
    }

    /// Keeps `(layer, id)` from eviction until [`ExpertCache::unprotect_layer`].
    pub fn protect(&mut self, layer: usize, id: usize) {
        self.protected.insert((layer, id));
    }

    /// Ends the protection of every expert of `layer`.
    pub fn unprotect_layer(&mut self, layer: usize) {
        self.protected.retain(|k| k.0 != layer);
    }

    /// Bytes one layer may hold under a per-layer policy.
    fn layer_share(&self) -> u64 {
        self.budget / self.layers as u64
    }

    /// The expert eviction would take to make room for `newcomer`: the
    /// first in policy order that is not protected (the order holds no
    /// pinned or unread ones) and, under a per-layer policy, of the
    /// newcomer's layer once it holds its share, else of a layer over its
    /// share if there is one.
    fn first_victim(&self, newcomer: Key, bytes: u64) -> Option<Key> {
        let free = |k: &Key| !self.protected.contains(k);
        if !self.policy.per_layer {
            return self.order.order().find(free);
        }
        let share = self.layer_share();
        let held = |layer| self.layer_held.get(&layer).copied().unwrap_or(0);
        if held(newcomer.0) + bytes > share {
            return self.order.order().find(|k| free(k) && k.0 == newcomer.0);
        }
        self.order
            .order()
            .find(|k| free(k) && held(k.0) > share)
            .or_else(|| self.order.order().find(free))
    }

    /// Reserves room for `(layer, id)` before it is read, evicting unpinned,
    /// unprotected experts in policy order. `protect` marks a predicted
    /// expert: it is admitted whatever the policy says and protected.
    /// Returns whether the expert will be kept; if not, it is read for one
    /// use only.
    pub fn reserve(&mut self, layer: usize, id: usize, bytes: u64, protect: bool) -> bool {
        let key = (layer, id);
        if bytes > self.budget || self.entries.contains_key(&key) {
            return false;
        }
        if !protect
            && self.held + bytes > self.budget
            && self
                .first_victim(key, bytes)
                .is_some_and(|v| !self.order.admits(key, v))
        {
            // Admission: a newcomer the policy ranks below the expert it
            // would displace is used once and not kept.
            return false;
        }
        while self.held + bytes > self.budget {
            let Some(victim) = self.first_victim(key, bytes) else {
                return false;
            };
            self.order.removed(victim, true);
            if let Some(old) = self.entries.remove(&victim) {
                self.held -= old.bytes;
                *self.layer_held.entry(victim.0).or_default() -= old.bytes;
                self.counters.evictions += 1;
            }
        }
        let pinned = self.pin_set.contains(&key);
        if pinned {
            self.pinned_held += bytes;
        }
        if protect {
            self.protected.insert(key);
        }
        self.entries.insert(
            key,
            Entry {
                value: None,
                bytes,
                pinned,
            },
        );
        self.held += bytes;
        *self.layer_held.entry(layer).or_default() += bytes;
        true
    }

    /// Hands a reserved expert its weights once read.
    pub fn fill(&mut self, layer: usize, id: usize, value: V) {
        let key = (layer, id);
        if let Some(e) = self.entries.get_mut(&key)
            && e.value.is_none()
        {
            e.value = Some(value);
            if !e.pinned {
                self.order.inserted(key, e.bytes);
            }
        }
    }

    /// Replaces a held expert's value with one of `bytes` (weights restored
    /// from its packed record), making room by evicting others in policy
    /// order. Returns whether it was replaced; if there is no room, the old
    /// value stays.
    pub fn replace(&mut self, layer: usize, id: usize, value: V, bytes: u64) -> bool {
        let key = (layer, id);
        let Some(old) = self
            .entries
            .get(&key)
            .filter(|e| e.value.is_some())
            .map(|e| e.bytes)
        else {
            return false;
        };
        if bytes > self.budget {
            return false;
        }
        let grow = bytes.saturating_sub(old);
        if self.held - old + bytes > self.budget {
            // Only others may make room; the expert itself stays put.
            let was_protected = !self.protected.insert(key);
            while self.held + grow > self.budget {
                let Some(victim) = self.first_victim(key, grow) else {
                    break;
                };
                self.order.removed(victim, true);
                if let Some(v) = self.entries.remove(&victim) {
                    self.held -= v.bytes;
                    *self.layer_held.entry(victim.0).or_default() -= v.bytes;
                    self.counters.evictions += 1;
                }
            }
            if !was_protected {
                self.protected.remove(&key);
            }
            if self.held + grow > self.budget {
                return false;
            }
        }
        let Some(e) = self.entries.get_mut(&key) else {
            return false;
        };
        self.held = self.held - old + bytes;
        *self.layer_held.entry(layer).or_default() += bytes;
        *self.layer_held.entry(layer).or_default() -= old;
        if e.pinned {
            self.pinned_held = self.pinned_held - old + bytes;
        }
        e.value = Some(value);
        e.bytes = bytes;
        if !e.pinned {
            // Bytes-aware orders learn the new size.
            self.order.removed(key, false);
            self.order.inserted(key, bytes);
        }
        true
    }

    /// Gives up a reservation whose read failed.
    pub fn cancel(&mut self, layer: usize, id: usize) {
        let key = (layer, id);
        if self.entries.get(&key).is_some_and(|e| e.value.is_none())
            && let Some(e) = self.entries.remove(&key)
        {
            self.held -= e.bytes;
            *self.layer_held.entry(layer).or_default() -= e.bytes;
            if e.pinned {
                self.pinned_held -= e.bytes;
            }
        }
    }

    /// Keeps `value` if it fits (see [`ExpertCache::reserve`]).
    pub fn insert(&mut self, layer: usize, id: usize, value: V, bytes: u64) {
        if self.reserve(layer, id, bytes, false) {
            self.fill(layer, id, value);
        }
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
    use crate::cache::policy::Rule;
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
        let mut c = ExpertCache::with_policy(20, EvictionPolicy::LRU);
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

    fn any_policy() -> impl Strategy<Value = EvictionPolicy> {
        let rule = prop_oneof![
            Just(Rule::Lru),
            Just(Rule::Lfu),
            (1u32..50).prop_map(|half_life| Rule::DecayedLfu { half_life }),
            (1u8..100).prop_map(|protected_percent| Rule::Slru { protected_percent }),
            Just(Rule::Arc),
        ];
        (rule, any::<bool>()).prop_map(|(rule, per_layer)| EvictionPolicy { rule, per_layer })
    }

    #[test]
    fn a_replaced_value_makes_room_by_evicting_others() {
        let mut c = ExpertCache::with_policy(30, EvictionPolicy::LRU);
        for id in 0..3 {
            c.insert(0, id, expert(), 10);
        }
        c.get(0, 0);
        assert!(
            c.replace(0, 2, expert(), 18),
            "room made from the least recent"
        );
        assert!(c.peek(0, 1).is_none() && c.peek(0, 0).is_some());
        assert_eq!(c.counters().held_bytes, 28);
        assert!(
            !c.replace(0, 2, expert(), 31),
            "larger than the budget: unchanged"
        );
        assert_eq!(c.counters().held_bytes, 28);
        assert!(!c.replace(0, 9, expert(), 5), "not held");
    }

    #[test]
    fn a_per_layer_policy_keeps_each_layer_to_its_share() {
        let mut c = ExpertCache::with_policy(40, "lru/layer".parse().unwrap());
        c.set_layers(2);
        for id in 0..2 {
            c.insert(1, id, expert(), 10);
        }
        for id in 0..4 {
            c.insert(0, id, expert(), 10);
        }
        assert!(
            c.peek(1, 0).is_some() && c.peek(1, 1).is_some(),
            "layer 1 kept its share"
        );
        assert!(c.peek(0, 2).is_some() && c.peek(0, 3).is_some());
        assert!(c.peek(0, 0).is_none(), "layer 0 made room in its own share");
    }

    proptest! {
        #[test]
        fn never_exceeds_its_budget(
            budget in 0u64..200,
            policy in any_policy(),
            pins in proptest::collection::vec((0usize..4, 0usize..16), 0..4),
            ops in proptest::collection::vec((0usize..4, 0usize..16, 1u64..60), 1..200),
        ) {
            let mut c = ExpertCache::with_policy(budget, policy);
            c.set_layers(4);
            c.set_pinned(pins);
            for (layer, id, bytes) in ops {
                c.begin_lookup(layer);
                if c.get(layer, id).is_none() {
                    c.insert(layer, id, expert(), bytes);
                }
                prop_assert!(c.counters().held_bytes <= budget);
            }
        }

        #[test]
        fn switching_policy_keeps_what_is_held(
            policy in any_policy(),
            next in any_policy(),
            ops in proptest::collection::vec((0usize..2, 0usize..8), 1..100),
        ) {
            let mut c = ExpertCache::with_policy(50, policy);
            let mut history = Vec::new();
            for (layer, id) in ops {
                c.begin_lookup(layer);
                history.push(((layer, id), 1, c.pass()));
                if c.get(layer, id).is_none() {
                    c.insert(layer, id, expert(), 10);
                }
            }
            let held = c.counters().held_bytes;
            c.set_policy(next, &history);
            prop_assert_eq!(c.counters().held_bytes, held);
            // Everything held is still evictable under the new policy.
            for id in 100..105 {
                prop_assert!(c.reserve(0, id, 10, true), "room was made for {}", id);
                c.fill(0, id, expert());
            }
            prop_assert_eq!(c.counters().held_bytes, 50);
        }
    }
}
