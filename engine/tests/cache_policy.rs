//! The expert cache's policies and its packed records: whichever policy
//! evicts and however records are held, logits stay bitwise those of the
//! model in RAM; a pack's policy is chosen from its own trace and
//! remembered.

mod common;

use std::path::Path;

use longhaul_engine::{Engine, EngineOptions, EvictionPolicy, PolicySetting};

const FIXTURE: &str = "qwen3_moe_recent";
/// Bytes of one f32 expert of the fixture (3 × hidden 64 × intermediate 24 × 4).
const EXPERT: u64 = 3 * 64 * 24 * 4;

fn open(pack: &Path, budget: u64, policy: PolicySetting, pack_cache: bool) -> Engine {
    let mut o = EngineOptions::default();
    o.streaming.budget_bytes = budget;
    o.streaming.keep_stored_dtype = true;
    o.streaming.policy = policy;
    o.streaming.pack_cache = pack_cache;
    o.streaming.prefetch = false;
    Engine::open_with(pack, &o, &|_| {}).unwrap()
}

fn logits(engine: &Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    engine.logits(ids).unwrap().to_vec2().unwrap()
}

/// Decodes `ids` one token at a time, as a generation would.
fn decode(engine: &Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut session = engine.session();
    ids.iter().map(|&id| session.feed(&[id]).unwrap()).collect()
}

#[test]
fn a_packed_cache_holds_more_experts_and_computes_the_same() {
    let dir = common::fixtures_dir().join(FIXTURE);
    let exp = common::expected(&dir);
    let ids: Vec<u32> = exp
        .ids
        .iter()
        .cycle()
        .take(4 * exp.ids.len())
        .copied()
        .collect();
    let reference = decode(&Engine::open(&dir).unwrap(), &ids);
    let tmp = tempfile::tempdir().unwrap();
    let pack = common::pack_on_two_drives(&dir, tmp.path());
    let lru = PolicySetting::Fixed(EvictionPolicy::LRU);
    let plain = open(&pack, 6 * EXPERT, lru, false);
    let packed = open(&pack, 6 * EXPERT, lru, true);
    assert!(!plain.streaming().unwrap().keeps_records_packed());
    assert!(packed.streaming().unwrap().keeps_records_packed());
    assert!(decode(&plain, &ids) == reference);
    assert!(
        decode(&packed, &ids) == reference,
        "restored records compute the same"
    );
    let (p, k) = (plain.stats().unwrap().cache, packed.stats().unwrap().cache);
    assert!(
        packed.stats().unwrap().resident_expert_bytes < EXPERT,
        "a packed record takes less than its weights"
    );
    // LRU keeps every expert a smaller LRU cache keeps: more room, more hits.
    assert!(k.hits > p.hits, "packed {k:?} plain {p:?}");
    assert!(k.held_bytes <= k.budget_bytes);
    // A budget that holds every expert's weights keeps them as weights.
    let roomy = open(&pack, u64::MAX, lru, true);
    assert!(!roomy.streaming().unwrap().keeps_records_packed());
}

#[test]
fn logits_do_not_depend_on_the_eviction_policy() {
    let dir = common::fixtures_dir().join(FIXTURE);
    let exp = common::expected(&dir);
    let reference = logits(&Engine::open(&dir).unwrap(), &exp.ids);
    let stepped = decode(&Engine::open(&dir).unwrap(), &exp.ids);
    let tmp = tempfile::tempdir().unwrap();
    let pack = common::pack_on_two_drives(&dir, tmp.path());
    for policy in longhaul_engine::tools::candidates() {
        for pack_cache in [false, true] {
            let engine = open(&pack, 3 * EXPERT, PolicySetting::Fixed(policy), pack_cache);
            assert!(logits(&engine, &exp.ids) == reference, "{policy}");
            assert!(decode(&engine, &exp.ids) == stepped, "{policy}");
            let c = engine.stats().unwrap().cache;
            assert!(c.held_bytes <= c.budget_bytes, "{policy}");
        }
    }
}

#[test]
fn the_policy_is_chosen_from_the_packs_trace_and_remembered() {
    let dir = common::fixtures_dir().join(FIXTURE);
    let exp = common::expected(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let pack = common::pack_on_two_drives(&dir, tmp.path());
    let engine = open(&pack, 4 * EXPERT, PolicySetting::Auto, true);
    for _ in 0..4 {
        decode(&engine, &exp.ids);
    }
    let report = engine.replay_policies().expect("a pack replays its trace");
    assert_eq!(
        report.candidates.len(),
        longhaul_engine::tools::candidates().len()
    );
    assert!(report.automatic);
    let best = &report.candidates[0];
    assert!(
        report
            .candidates
            .windows(2)
            .all(|w| w[0].hit_rate >= w[1].hit_rate)
    );
    assert!(best.hit_rate <= report.belady_hit_rate + 1e-12);
    assert!(
        (best.regret - (report.belady_hit_rate - best.hit_rate)).abs() < 1e-12,
        "regret is measured to Belady"
    );
    let chosen = report.chosen;
    assert_eq!(
        engine.stats().unwrap().policy,
        chosen,
        "the cache runs the choice"
    );
    let chosen_rate = report
        .candidates
        .iter()
        .find(|c| c.policy == chosen)
        .unwrap()
        .hit_rate;
    assert!(chosen_rate + longhaul_engine::tools::SWITCH_MARGIN > best.hit_rate);
    engine.save_heat().unwrap();
    drop(engine);
    // The next run starts with the choice and the trace it was made on.
    let again = open(&pack, 4 * EXPERT, PolicySetting::Auto, true);
    assert_eq!(again.stats().unwrap().policy, chosen);
    // Opening with that trace replays it on its own, off the model's thread.
    let waited = std::time::Instant::now();
    while again.stats().unwrap().policy_report.is_none() {
        assert!(waited.elapsed().as_secs() < 60, "no replay at open");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let replayed = again.replay_policies().unwrap();
    assert_eq!(replayed.lookups, report.lookups, "the trace was kept");
    // A budget that holds every expert never evicts, so every policy scores
    // alike: nothing is replayed on its own (it would only take CPU time
    // from decoding), though a replay asked for still runs.
    let whole = open(&pack, 1 << 30, PolicySetting::Auto, true);
    for _ in 0..4 {
        decode(&whole, &exp.ids);
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(whole.stats().unwrap().policy_report.is_none());
    assert!(whole.replay_policies().is_some());
    // A policy set by hand is replayed for comparison but kept.
    let fixed = EvictionPolicy::LRU;
    let set = open(&pack, 4 * EXPERT, PolicySetting::Fixed(fixed), true);
    let r = set.replay_policies().unwrap();
    assert!(!r.automatic);
    assert_eq!((r.chosen, set.stats().unwrap().policy), (fixed, fixed));
}
