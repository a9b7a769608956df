//! Eviction policies: which unpinned expert leaves the cache first, and
//! whether a newcomer is kept at all.
//!
//! No single rule is best for every model. On Zipf-skewed routing, counting
//! lookups (LFU) hit 0.40 where recency (LRU) hit 0.22, because a MoE layer
//! touches most of its experts within a few tokens and flushes an LRU cache of
//! the popular ones; on models whose routing follows the topic, recency with a
//! protected segment (SLRU) or frequency that forgets (a half-life) keeps up
//! with the drift where plain counts do not. So every rule here runs behind one
//! small interface ([`Order`]) that the live cache and the offline replays
//! share, and a pack's own routing trace picks the rule and its parameters
//! (see [`super::choose`]).
//!
//! Time is counted in passes: a pass begins whenever a lookup goes to a layer
//! no deeper than the previous one (a new token, or a prompt's next chunk), so
//! a half-life reads in tokens whatever the model's depth.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};

pub type Key = (usize, usize);

/// The rule that orders unpinned experts for eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The least recently looked up leaves first.
    Lru,
    /// The least often looked up so far leaves first (ties: the least
    /// recently); a newcomer looked up less often than the expert it would
    /// displace is used once and not kept.
    Lfu,
    /// Frequency that forgets: each lookup's weight halves every
    /// `half_life` passes (LRFU; a short half-life approaches LRU, a long
    /// one LFU). Admission as LFU's, on the decayed counts.
    DecayedLfu { half_life: u32 },
    /// Segmented LRU: a newcomer enters a probation segment, a second lookup
    /// moves it to a protected one of `protected_percent` of the budget;
    /// probation empties first.
    Slru { protected_percent: u8 },
    /// Adaptive replacement: a recency list and a frequency list whose split
    /// follows which one's recently evicted experts are asked for again.
    Arc,
}

/// A rule, applied over one pool for every layer or within each layer's
/// equal share of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EvictionPolicy {
    pub rule: Rule,
    /// Each expert layer keeps to its share of the budget: a newcomer
    /// displaces an expert of its own layer once its layer holds its share.
    pub per_layer: bool,
}

impl EvictionPolicy {
    pub const LFU: Self = Self::pool(Rule::Lfu);
    pub const LRU: Self = Self::pool(Rule::Lru);

    pub const fn pool(rule: Rule) -> Self {
        Self {
            rule,
            per_layer: false,
        }
    }
}

impl Default for EvictionPolicy {
    fn default() -> Self {
        Self::LFU
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rule {
            Rule::Lru => write!(f, "lru")?,
            Rule::Lfu => write!(f, "lfu")?,
            Rule::DecayedLfu { half_life } => write!(f, "lfu-decay:{half_life}")?,
            Rule::Slru { protected_percent } => write!(f, "slru:{protected_percent}")?,
            Rule::Arc => write!(f, "arc")?,
        }
        if self.per_layer {
            write!(f, "/layer")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for EvictionPolicy {
    type Err = String;

    /// `lru`, `lfu`, `lfu-decay:H` (half-life H passes), `slru:P` (P% of
    /// the budget protected), `arc`; `/layer` after any of them splits the
    /// budget into equal shares per layer.
    fn from_str(text: &str) -> Result<Self, String> {
        let (name, per_layer) = match text.strip_suffix("/layer") {
            Some(name) => (name, true),
            None => (text, false),
        };
        let (name, arg) = match name.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (name, None),
        };
        let number = |what: &str, max: u32| -> Result<u32, String> {
            let a = arg.ok_or_else(|| format!("`{text}`: {name} needs {what}, as in {name}:N"))?;
            a.parse::<u32>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| format!("`{text}`: {what} must be a whole number from 1 to {max}"))
        };
        let rule = match name {
            "lru" | "lfu" | "arc" if arg.is_some() => {
                return Err(format!("`{text}`: {name} takes no parameter"));
            }
            "lru" => Rule::Lru,
            "lfu" => Rule::Lfu,
            "arc" => Rule::Arc,
            "lfu-decay" => Rule::DecayedLfu {
                half_life: number("a half-life in passes", 1 << 20)?,
            },
            "slru" => Rule::Slru {
                protected_percent: number("a protected share in percent", 99)? as u8,
            },
            _ => {
                return Err(format!(
                    "`{text}` is not a policy; use lru, lfu, lfu-decay:H, slru:P or arc, optionally followed by /layer"
                ));
            }
        };
        Ok(Self { rule, per_layer })
    }
}

impl TryFrom<String> for EvictionPolicy {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<EvictionPolicy> for String {
    fn from(p: EvictionPolicy) -> String {
        p.to_string()
    }
}

/// How a cache's policy is set: chosen from the pack's routing trace (and
/// chosen again as it grows), or fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicySetting {
    #[default]
    Auto,
    Fixed(EvictionPolicy),
}

impl fmt::Display for PolicySetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Fixed(p) => p.fmt(f),
        }
    }
}

impl std::str::FromStr for PolicySetting {
    type Err = String;

    /// `auto`, or a policy (see [`EvictionPolicy`]'s form).
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            _ => text.parse().map(Self::Fixed).map_err(|e| {
                if text.contains(':') || text.contains('/') {
                    e
                } else {
                    format!("`{text}` is not a policy; use auto, lru, lfu, lfu-decay:H, slru:P or arc, optionally followed by /layer")
                }
            }),
        }
    }
}

/// One rule's bookkeeping. Keys in the order are the cache's unpinned
/// experts that have been read; the cache tells the order about every
/// lookup, whether or not it hit.
pub(super) trait Order: Send {
    /// A lookup of `key` at pass `now`, by `weight` rows; `held` if the key
    /// is in the order.
    fn touched(&mut self, key: Key, weight: u32, now: u64, held: bool);
    /// `key` was read into the cache.
    fn inserted(&mut self, key: Key, bytes: u64);
    /// `key` left the order: evicted, or taken out for another reason.
    fn removed(&mut self, key: Key, evicted: bool);
    /// Held keys, the first to leave first.
    fn order(&self) -> Box<dyn Iterator<Item = Key> + '_>;
    /// Whether `newcomer` may displace `victim`.
    fn admits(&self, _newcomer: Key, _victim: Key) -> bool {
        true
    }
    /// Lookups of earlier runs, for rules that count.
    fn seed(&mut self, _key: Key, _uses: u64) {}
}

/// The bookkeeping for `policy` over a budget of `budget` bytes.
pub(super) fn order_for(policy: EvictionPolicy, budget: u64) -> Box<dyn Order> {
    match policy.rule {
        Rule::Lru => Box::<Lru>::default(),
        Rule::Lfu => Box::new(Counted::new(None)),
        Rule::DecayedLfu { half_life } => Box::new(Counted::new(Some(f64::from(half_life)))),
        Rule::Slru { protected_percent } => Box::new(Slru {
            cap: budget / 100 * u64::from(protected_percent),
            ..Default::default()
        }),
        Rule::Arc => Box::new(Arc::new(budget)),
    }
}

#[derive(Default)]
struct Lru {
    seq: u64,
    /// Sequence number of every key's last lookup.
    last: HashMap<Key, u64>,
    by_age: BTreeSet<(u64, Key)>,
    held: HashSet<Key>,
}

impl Order for Lru {
    fn touched(&mut self, key: Key, _: u32, _: u64, held: bool) {
        self.seq += 1;
        if let Some(old) = self.last.insert(key, self.seq)
            && held
        {
            self.by_age.remove(&(old, key));
            self.by_age.insert((self.seq, key));
        }
    }

    fn inserted(&mut self, key: Key, _: u64) {
        let at = *self.last.entry(key).or_insert(self.seq);
        self.held.insert(key);
        self.by_age.insert((at, key));
    }

    fn removed(&mut self, key: Key, _: bool) {
        if self.held.remove(&key)
            && let Some(&at) = self.last.get(&key)
        {
            self.by_age.remove(&(at, key));
        }
    }

    fn order(&self) -> Box<dyn Iterator<Item = Key> + '_> {
        Box::new(self.by_age.iter().map(|&(_, k)| k))
    }
}

/// LFU, or with a half-life, LRFU. Decayed counts are kept as
/// `log2(Σ w · 2^(t / half_life))`: every count grows with time instead of
/// all shrinking, so untouched keys keep their order and no count is ever
/// updated but the one looked up.
struct Counted {
    half_life: Option<f64>,
    seq: u64,
    /// Every key's count (or log-domain decayed count) and last lookup.
    score: HashMap<Key, (f64, u64)>,
    by_score: BTreeSet<(u64, u64, Key)>,
    held: HashSet<Key>,
}

impl Counted {
    fn new(half_life: Option<f64>) -> Self {
        Self {
            half_life,
            seq: 0,
            score: HashMap::new(),
            by_score: BTreeSet::new(),
            held: HashSet::new(),
        }
    }

    fn rank(&self, key: Key) -> (u64, u64, Key) {
        let (s, at) = self.score.get(&key).copied().unwrap_or((0.0, 0));
        // Scores are never negative, so their bits sort as the numbers do.
        (s.max(0.0).to_bits(), at, key)
    }

    fn add(&self, old: Option<f64>, weight: f64, now: u64) -> f64 {
        match self.half_life {
            None => old.unwrap_or(0.0) + weight,
            Some(h) => {
                let new = now as f64 / h + weight.log2();
                match old {
                    None => new,
                    Some(old) => {
                        let top = old.max(new);
                        top + ((old - top).exp2() + (new - top).exp2()).log2()
                    }
                }
            }
        }
    }
}

impl Order for Counted {
    fn touched(&mut self, key: Key, weight: u32, now: u64, held: bool) {
        self.seq += 1;
        let before = self.rank(key);
        let old = self.score.get(&key).map(|s| s.0);
        let score = self.add(old, f64::from(weight.max(1)), now);
        self.score.insert(key, (score, self.seq));
        if held {
            self.by_score.remove(&before);
            self.by_score.insert(self.rank(key));
        }
    }

    fn inserted(&mut self, key: Key, _: u64) {
        self.held.insert(key);
        self.by_score.insert(self.rank(key));
    }

    fn removed(&mut self, key: Key, _: bool) {
        if self.held.remove(&key) {
            self.by_score.remove(&self.rank(key));
        }
    }

    fn order(&self) -> Box<dyn Iterator<Item = Key> + '_> {
        Box::new(self.by_score.iter().map(|&(_, _, k)| k))
    }

    fn admits(&self, newcomer: Key, victim: Key) -> bool {
        let score = |k| self.score.get(&k).map_or(0.0, |s| s.0);
        score(victim) <= score(newcomer)
    }

    fn seed(&mut self, key: Key, uses: u64) {
        if !self.score.contains_key(&key) && uses > 0 {
            let s = self.add(None, uses as f64, 0);
            self.score.insert(key, (s, 0));
        }
    }
}

#[derive(Default)]
struct Slru {
    /// Bytes the protected segment may hold.
    cap: u64,
    seq: u64,
    /// Held keys: (protected, position, bytes).
    at: HashMap<Key, (bool, u64, u64)>,
    probation: BTreeSet<(u64, Key)>,
    protected: BTreeSet<(u64, Key)>,
    protected_bytes: u64,
}

impl Slru {
    fn place(&mut self, key: Key, protect: bool, bytes: u64) {
        self.seq += 1;
        self.at.insert(key, (protect, self.seq, bytes));
        if protect {
            self.protected.insert((self.seq, key));
            self.protected_bytes += bytes;
        } else {
            self.probation.insert((self.seq, key));
        }
    }

    fn take(&mut self, key: Key) -> Option<u64> {
        let (protect, pos, bytes) = self.at.remove(&key)?;
        if protect {
            self.protected.remove(&(pos, key));
            self.protected_bytes -= bytes;
        } else {
            self.probation.remove(&(pos, key));
        }
        Some(bytes)
    }
}

impl Order for Slru {
    fn touched(&mut self, key: Key, _: u32, _: u64, held: bool) {
        if !held {
            return;
        }
        if let Some(bytes) = self.take(key) {
            self.place(key, true, bytes);
        }
        // The protected segment's oldest go back to probation's newest end.
        while self.protected_bytes > self.cap {
            let Some(&(_, oldest)) = self.protected.first() else {
                break;
            };
            if let Some(bytes) = self.take(oldest) {
                self.place(oldest, false, bytes);
            }
        }
    }

    fn inserted(&mut self, key: Key, bytes: u64) {
        self.place(key, false, bytes);
    }

    fn removed(&mut self, key: Key, _: bool) {
        self.take(key);
    }

    fn order(&self) -> Box<dyn Iterator<Item = Key> + '_> {
        Box::new(
            self.probation
                .iter()
                .chain(&self.protected)
                .map(|&(_, k)| k),
        )
    }
}

/// Megiddo and Modha's ARC, in bytes: T1 holds experts seen once lately,
/// T2 those seen again; B1 and B2 remember what each let go. A miss on B1
/// grows T1's target, a miss on B2 shrinks it.
struct Arc {
    cap: u64,
    seq: u64,
    /// Target bytes for T1.
    target: f64,
    /// Held keys: (in T2, position, bytes).
    at: HashMap<Key, (bool, u64, u64)>,
    t1: BTreeSet<(u64, Key)>,
    t2: BTreeSet<(u64, Key)>,
    t1_bytes: u64,
    t2_bytes: u64,
    /// Ghosts: (in B2, position, bytes).
    ghost: HashMap<Key, (bool, u64, u64)>,
    b1: BTreeSet<(u64, Key)>,
    b2: BTreeSet<(u64, Key)>,
    b1_bytes: u64,
    b2_bytes: u64,
    /// Misses on a ghost: these enter T2 when read.
    returning: HashSet<Key>,
}

impl Arc {
    fn new(cap: u64) -> Self {
        Self {
            cap,
            seq: 0,
            target: 0.0,
            at: HashMap::new(),
            t1: BTreeSet::new(),
            t2: BTreeSet::new(),
            t1_bytes: 0,
            t2_bytes: 0,
            ghost: HashMap::new(),
            b1: BTreeSet::new(),
            b2: BTreeSet::new(),
            b1_bytes: 0,
            b2_bytes: 0,
            returning: HashSet::new(),
        }
    }

    fn hold(&mut self, key: Key, in_t2: bool, bytes: u64) {
        self.seq += 1;
        self.at.insert(key, (in_t2, self.seq, bytes));
        if in_t2 {
            self.t2.insert((self.seq, key));
            self.t2_bytes += bytes;
        } else {
            self.t1.insert((self.seq, key));
            self.t1_bytes += bytes;
        }
    }

    fn unhold(&mut self, key: Key) -> Option<(bool, u64)> {
        let (in_t2, pos, bytes) = self.at.remove(&key)?;
        if in_t2 {
            self.t2.remove(&(pos, key));
            self.t2_bytes -= bytes;
        } else {
            self.t1.remove(&(pos, key));
            self.t1_bytes -= bytes;
        }
        Some((in_t2, bytes))
    }

    fn unghost(&mut self, key: Key) -> Option<(bool, u64)> {
        let (in_b2, pos, bytes) = self.ghost.remove(&key)?;
        if in_b2 {
            self.b2.remove(&(pos, key));
            self.b2_bytes -= bytes;
        } else {
            self.b1.remove(&(pos, key));
            self.b1_bytes -= bytes;
        }
        Some((in_b2, bytes))
    }

    fn trim_ghosts(&mut self) {
        while self.b1_bytes + self.t1_bytes > self.cap {
            let Some(&(_, k)) = self.b1.first() else {
                break;
            };
            self.unghost(k);
        }
        while self.b1_bytes + self.b2_bytes + self.t1_bytes + self.t2_bytes > 2 * self.cap {
            let Some(&(_, k)) = self.b2.first().or(self.b1.first()) else {
                break;
            };
            self.unghost(k);
        }
    }
}

impl Order for Arc {
    fn touched(&mut self, key: Key, _: u32, _: u64, held: bool) {
        if held {
            if let Some((_, bytes)) = self.unhold(key) {
                self.hold(key, true, bytes);
            }
            return;
        }
        let (b1, b2) = (self.b1_bytes.max(1) as f64, self.b2_bytes.max(1) as f64);
        match self.unghost(key) {
            Some((false, bytes)) => {
                self.target =
                    (self.target + (b2 / b1).max(1.0) * bytes as f64).min(self.cap as f64);
                self.returning.insert(key);
            }
            Some((true, bytes)) => {
                self.target = (self.target - (b1 / b2).max(1.0) * bytes as f64).max(0.0);
                self.returning.insert(key);
            }
            None => {}
        }
    }

    fn inserted(&mut self, key: Key, bytes: u64) {
        let in_t2 = self.returning.remove(&key);
        self.hold(key, in_t2, bytes);
        self.trim_ghosts();
    }

    fn removed(&mut self, key: Key, evicted: bool) {
        let Some((in_t2, bytes)) = self.unhold(key) else {
            return;
        };
        if evicted {
            self.seq += 1;
            self.ghost.insert(key, (in_t2, self.seq, bytes));
            if in_t2 {
                self.b2.insert((self.seq, key));
                self.b2_bytes += bytes;
            } else {
                self.b1.insert((self.seq, key));
                self.b1_bytes += bytes;
            }
            self.trim_ghosts();
        }
    }

    fn order(&self) -> Box<dyn Iterator<Item = Key> + '_> {
        let t1 = self.t1.iter().map(|&(_, k)| k);
        let t2 = self.t2.iter().map(|&(_, k)| k);
        if self.t1_bytes as f64 > self.target || self.t2.is_empty() {
            Box::new(t1.chain(t2))
        } else {
            Box::new(t2.chain(t1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_read_back_as_written() {
        for text in [
            "lru",
            "lfu",
            "lfu-decay:64",
            "slru:80",
            "arc",
            "lfu/layer",
            "lfu-decay:8/layer",
        ] {
            let p: EvictionPolicy = text.parse().unwrap();
            assert_eq!(p.to_string(), text);
        }
        for bad in [
            "mru",
            "lfu:3",
            "slru",
            "slru:0",
            "slru:100",
            "lfu-decay:x",
            "arc/",
        ] {
            assert!(bad.parse::<EvictionPolicy>().is_err(), "{bad}");
        }
    }

    #[test]
    fn decayed_counts_forget_old_lookups() {
        let mut c = Counted::new(Some(2.0));
        for _ in 0..4 {
            c.touched((0, 0), 1, 0, false);
        }
        c.touched((0, 1), 1, 10, false);
        c.inserted((0, 0), 1);
        c.inserted((0, 1), 1);
        // Four lookups five half-lives ago weigh 4/32 against one now.
        assert_eq!(c.order().next(), Some((0, 0)));
        assert!(c.admits((0, 1), (0, 0)));
        let mut plain = Counted::new(None);
        for _ in 0..4 {
            plain.touched((0, 0), 1, 0, false);
        }
        plain.touched((0, 1), 1, 10, false);
        plain.inserted((0, 0), 1);
        plain.inserted((0, 1), 1);
        assert_eq!(
            plain.order().next(),
            Some((0, 1)),
            "LFU keeps the old counts"
        );
    }

    #[test]
    fn slru_empties_probation_before_the_protected_segment() {
        let mut s = Slru {
            cap: 2,
            ..Default::default()
        };
        for id in 0..3 {
            s.inserted((0, id), 1);
        }
        s.touched((0, 0), 1, 0, true);
        let order: Vec<Key> = s.order().collect();
        assert_eq!(order, vec![(0, 1), (0, 2), (0, 0)]);
    }

    #[test]
    fn arc_moves_a_second_lookup_to_its_frequency_list_and_learns_from_ghosts() {
        let mut a = Arc::new(2);
        a.inserted((0, 0), 1);
        a.inserted((0, 1), 1);
        a.touched((0, 0), 1, 0, true);
        assert_eq!(
            a.order().next(),
            Some((0, 1)),
            "T1 first while over target 0"
        );
        a.removed((0, 1), true);
        a.touched((0, 1), 1, 1, false);
        assert!(a.target > 0.0, "a miss on B1 grows T1's target");
        a.inserted((0, 1), 1);
        assert!(a.at[&(0, 1)].0, "a ghost comes back into T2");
    }
}
