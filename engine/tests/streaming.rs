//! Packs: the round trip, bitwise exactness against the same model held in
//! RAM under any budget and drive count, and faults as typed errors.

mod common;

use std::path::{Path, PathBuf};

use longhaul_engine::pack::verify::verify_pack;
use longhaul_engine::pack::{PackOptions, write_pack};
use longhaul_engine::{Engine, EngineOptions};
use proptest::prelude::*;

/// Bytes of one expert of a pack of `fixture`, the unit of the budgets
/// tried: the width its fixture.json gives where experts are packed as
/// published (FP8, INT4, MXFP4 with their scales), else that of f32 rows
/// (3 × hidden × moe_intermediate × 4), from the pack's first layer.
fn expert_bytes(fixture: &str, pack: &Path) -> u64 {
    let dir = common::fixtures_dir().join(fixture);
    if let Some(published) = common::facts(&dir).experts {
        return published.record_bytes;
    }
    let manifest = longhaul_engine::pack::Manifest::read(pack).unwrap();
    let layer = &manifest.experts.layers[0];
    (3 * layer.hidden * layer.intermediate * 4) as u64
}

/// Packs `fixture` over `drives` fresh folders under `root`.
fn pack(root: &Path, fixture: &str, drives: usize, split_threshold: u64) -> PathBuf {
    pack_with(root, fixture, drives, split_threshold, true)
}

/// Packs `fixture`, with records compressed or stored as they are.
fn pack_with(
    root: &Path,
    fixture: &str,
    drives: usize,
    split_threshold: u64,
    compress: bool,
) -> PathBuf {
    let dirs: Vec<PathBuf> = (0..drives)
        .map(|i| root.join(format!("drive{i}")))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let out = root.join(format!("{fixture}-pack"));
    let mut opts = PackOptions::new(common::fixtures_dir().join(fixture), out.clone(), dirs);
    opts.split_threshold = split_threshold;
    opts.compress = compress;
    write_pack(&opts, &|_| {}).unwrap();
    out
}

fn open(path: &Path, budget: u64, queue_depth: usize) -> Engine {
    open_with(path, budget, queue_depth, false)
}

fn open_with(path: &Path, budget: u64, queue_depth: usize, keep_stored_dtype: bool) -> Engine {
    let mut o = EngineOptions::default();
    o.streaming.budget_bytes = budget;
    o.streaming.store.queue_depth = queue_depth;
    o.streaming.keep_stored_dtype = keep_stored_dtype;
    Engine::open_with(path, &o, &|_| {}).unwrap()
}

/// Teacher-forced logits for the whole sequence, then one decode step at a time.
fn all_logits(engine: &Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut rows: Vec<Vec<f32>> = engine.logits(ids).unwrap().to_vec2().unwrap();
    let decoder = engine.decoder();
    let mut cache = decoder.new_state();
    for &id in ids {
        let row: Vec<Vec<f32>> = decoder
            .forward(&[id], &mut cache, longhaul_engine::model::LogitsFor::Last)
            .unwrap()
            .to_vec2()
            .unwrap();
        rows.extend(row);
    }
    rows
}

#[test]
fn packs_round_trip_and_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "qwen3_moe_recent", 3, 4096);
    let report = verify_pack(&pack, &|_, _| {}).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // 2 sparse layers of 12 experts.
    assert_eq!(report.records, 24);
    for f in [
        "config.json",
        "tokenizer.json",
        "generation_config.json",
        "longhaul-pack.json",
    ] {
        assert!(pack.join(f).is_file(), "{f} copied into the pack");
    }
}

#[test]
fn verify_finds_layers_and_records_removed_from_the_manifest() {
    for fixture in [
        "qwen3_moe_recent",
        "mixtral_released",
        "deepseek_v3_released",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let pack = pack(tmp.path(), fixture, 1, u64::MAX);
        let path = pack.join("longhaul-pack.json");
        let original: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(verify_pack(&pack, &|_, _| {}).unwrap().problems.is_empty());
        let mut fewer = original.clone();
        fewer["experts"]["layers"][0]["records"]
            .as_array_mut()
            .unwrap()
            .pop();
        std::fs::write(&path, fewer.to_string()).unwrap();
        let problems = verify_pack(&pack, &|_, _| {}).unwrap().problems;
        assert!(
            problems.len() == 1 && problems[0].contains("records"),
            "{fixture}: {problems:?}"
        );
        let mut no_layer = original.clone();
        no_layer["experts"]["layers"]
            .as_array_mut()
            .unwrap()
            .remove(0);
        std::fs::write(&path, no_layer.to_string()).unwrap();
        let problems = verify_pack(&pack, &|_, _| {}).unwrap().problems;
        assert!(
            problems.len() == 1 && problems[0].contains("no records for the layer"),
            "{fixture}: {problems:?}"
        );
    }
}

#[test]
fn logits_are_bitwise_identical_to_the_in_memory_model() {
    let fixtures = common::fixtures_with("streams_exactly");
    assert!(fixtures.len() >= 25, "{fixtures:?}");
    for dir in fixtures {
        let fixture = &common::name(&dir);
        let exp = common::expected(&dir);
        let reference = all_logits(&Engine::open(&dir).unwrap(), &exp.ids);
        let tmp = tempfile::tempdir().unwrap();
        for (drives, split, compress) in [(1, u64::MAX, false), (3, 4096, true)] {
            let root = tmp.path().join(format!("{drives}-{split}"));
            let pack = pack_with(&root, fixture, drives, split, compress);
            let manifest = longhaul_engine::pack::Manifest::read(&pack).unwrap();
            assert_eq!(
                manifest.experts.compression.is_some(),
                compress,
                "{fixture}"
            );
            let one = expert_bytes(fixture, &pack);
            for budget in [0, one, 5 * one, u64::MAX] {
                for depth in [1, 4] {
                    for keep in [false, true] {
                        let got = all_logits(&open_with(&pack, budget, depth, keep), &exp.ids);
                        assert!(
                            got == reference,
                            "{fixture}: {drives} drives, split {split}, compressed {compress}, budget {budget}, depth {depth}, stored dtype {keep}: logits differ"
                        );
                    }
                }
            }
        }
    }
}

/// FP8 (block, channel and tensor scales), INT4 and MXFP4 experts are packed as published, with their scales,
/// and stream to bitwise the logits of the checkpoint held in RAM.
#[test]
fn quantised_experts_stream_exactly_as_published() {
    let fixtures = common::fixtures_with("published_experts");
    assert!(fixtures.len() >= 10, "{fixtures:?}");
    for dir in fixtures {
        let experts = common::facts(&dir)
            .experts
            .expect("a published-experts fixture names its expert dtype");
        published_experts_stream_exactly(&common::name(&dir), &experts.dtype);
    }
}

fn published_experts_stream_exactly(fixture: &str, dtype: &str) {
    let dir = common::fixtures_dir().join(fixture);
    let exp = common::expected(&dir);
    let reference = all_logits(&Engine::open(&dir).unwrap(), &exp.ids);
    let tmp = tempfile::tempdir().unwrap();
    for (drives, split) in [(1, u64::MAX), (3, 1024)] {
        let root = tmp.path().join(format!("{drives}"));
        let pack = pack(&root, fixture, drives, split);
        let manifest = longhaul_engine::pack::Manifest::read(&pack).unwrap();
        assert_eq!(manifest.experts.dtype, dtype);
        assert_eq!(manifest.experts.compression, None);
        let record = &manifest.experts.layers[0].records[0];
        assert_eq!(
            record.len,
            expert_bytes(fixture, &pack),
            "{fixture}: the published width plus scales"
        );
        let report = verify_pack(&pack, &|_, _| {}).unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        let one = expert_bytes(fixture, &pack);
        for budget in [0, one, 5 * one, u64::MAX] {
            for keep in [false, true] {
                let got = all_logits(&open_with(&pack, budget, 2, keep), &exp.ids);
                assert!(
                    got == reference,
                    "{fixture}: {drives} drives, budget {budget}, stored {keep}"
                );
            }
        }
    }
}

/// Reading the pilot's guesses ahead changes where experts come from and
/// when, never what is computed.
#[test]
fn logits_do_not_depend_on_prefetching() {
    for fixture in ["deepseek_v3_released", "qwen3_moe_recent"] {
        let dir = common::fixtures_dir().join(fixture);
        let exp = common::expected(&dir);
        let reference = all_logits(&Engine::open(&dir).unwrap(), &exp.ids);
        let tmp = tempfile::tempdir().unwrap();
        let pack = pack(tmp.path(), fixture, 2, 4096);
        for budget in [0, 3 * expert_bytes(fixture, &pack), u64::MAX] {
            for prefetch in [false, true] {
                let mut o = EngineOptions::default();
                o.streaming.budget_bytes = budget;
                o.streaming.prefetch = prefetch;
                let engine = Engine::open_with(&pack, &o, &|_| {}).unwrap();
                assert!(
                    all_logits(&engine, &exp.ids) == reference,
                    "{fixture}: budget {budget}, prefetch {prefetch}"
                );
                let pilot = engine.streaming().unwrap().pilot_counters();
                if !prefetch {
                    assert_eq!(pilot.prefetch_reads, 0);
                } else if budget < u64::MAX {
                    assert!(pilot.predicted_layers > 0, "{fixture}: predictions scored");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn exact_under_any_budget_and_drive_count(
        drives in 1usize..5,
        split_kib in 1u64..32,
        budget_experts in 0u64..40,
        depth in 1usize..4,
    ) {
        let fixture = "deepseek_v3_released";
        let dir = common::fixtures_dir().join(fixture);
        let exp = common::expected(&dir);
        let reference = all_logits(&Engine::open(&dir).unwrap(), &exp.ids[..12]);
        let tmp = tempfile::tempdir().unwrap();
        let pack = pack(tmp.path(), fixture, drives, split_kib * 1024);
        let engine = open(&pack, budget_experts * expert_bytes(fixture, &pack), depth);
        prop_assert!(all_logits(&engine, &exp.ids[..12]) == reference);
        let c = engine.streaming().unwrap().cache_counters();
        prop_assert!(c.held_bytes <= c.budget_bytes);
    }
}

#[test]
fn injected_io_errors_short_and_slow_reads_fail_cleanly_and_change_no_answer() {
    let fixture = "deepseek_v3_released";
    let dir = common::fixtures_dir().join(fixture);
    let exp = common::expected(&dir);
    let ids = &exp.ids[..8];
    let reference = all_logits(&Engine::open(&dir).unwrap(), ids);
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), fixture, 2, 4096);
    let faults = std::sync::Arc::new(longhaul_engine::store::StoreFaults::default());
    let mut o = EngineOptions::default();
    // No cache: every step reads, so every fault is met.
    o.streaming.budget_bytes = 0;
    o.streaming.store.faults = Some(faults.clone());
    let engine = Engine::open_with(&pack, &o, &|_| {}).unwrap();
    faults.set_delay(std::time::Duration::from_millis(2));
    assert!(
        all_logits(&engine, ids) == reference,
        "slow drives change nothing"
    );
    faults.set_delay(std::time::Duration::ZERO);
    let mut sampler = longhaul_engine::MetricsSampler::new(&engine.stats().unwrap());
    faults.set_io_error(true);
    let err = engine.logits(ids).unwrap_err();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(err.is_storage_fault(), "{err}");
    // Failed reads are errors with no latency: the figure is for reads that
    // returned data, and none did.
    let m = sampler.sample(&engine.stats().unwrap());
    assert!(m.drives.iter().map(|d| d.errors).sum::<u64>() > 0, "{m:?}");
    assert!(m.drives.iter().all(|d| d.latency_p50_ms.is_none()), "{m:?}");
    let text = err.to_string();
    assert!(
        text.contains("Input/output error") && text.contains("drive"),
        "{text}"
    );
    faults.set_io_error(false);
    faults.set_short_read(true);
    let text = engine.logits(ids).unwrap_err().to_string();
    assert!(
        text.contains("short read") || text.contains("bytes of"),
        "{text}"
    );
    faults.set_short_read(false);
    // Reads issued while the fault was on finish (and fail) first; a request
    // joins a read in flight rather than repeating it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The fault gone, the same engine answers exactly again.
    assert!(all_logits(&engine, ids) == reference);
}

#[test]
fn missing_drive_at_load_names_the_drive() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "deepseek_v3_released", 3, 4096);
    std::fs::remove_dir_all(tmp.path().join("drive2")).unwrap();
    let err = Engine::open_with(&pack, &EngineOptions::default(), &|_| {})
        .err()
        .expect("a pack with a missing drive must not open")
        .to_string();
    assert!(err.contains("drive 2") && err.contains("drive2"), "{err}");
}

#[test]
fn drive_removed_after_load_stops_generation_with_drive_file_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "deepseek_v3_released", 3, 4096);
    let engine = open(&pack, 0, 2);
    std::fs::remove_dir_all(tmp.path().join("drive1")).unwrap();
    let err = engine.logits(&[1, 2, 3]).unwrap_err().to_string();
    assert!(
        err.contains("drive 1") && err.contains("experts-01-000.bin") && err.contains("offset"),
        "{err}"
    );
}

#[test]
fn short_read_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "deepseek_v3_released", 2, u64::MAX);
    let extent = tmp
        .path()
        .join("drive0/deepseek_v3_released-pack/experts-00-000.bin");
    let len = std::fs::metadata(&extent).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&extent)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    let engine = open(&pack, 0, 1);
    let err = engine
        .logits(&[1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("drive 0") && err.contains("short read"),
        "{err}"
    );
}

#[test]
fn flipped_byte_is_caught_by_its_checksum() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "deepseek_v3_released", 1, u64::MAX);
    let extent = tmp
        .path()
        .join("drive0/deepseek_v3_released-pack/experts-00-000.bin");
    let mut bytes = std::fs::read(&extent).unwrap();
    bytes[100] ^= 0x40;
    std::fs::write(&extent, bytes).unwrap();
    let report = verify_pack(&pack, &|_, _| {}).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(report.problems[0].contains("checksum mismatch"));
    let engine = open(&pack, 0, 1);
    let ids: Vec<u32> = (0..64).collect();
    let err = engine.logits(&ids).unwrap_err().to_string();
    assert!(
        err.contains("checksum mismatch") && err.contains("drive 0"),
        "{err}"
    );
}

#[test]
fn a_flipped_byte_in_the_resident_file_stops_the_load() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "deepseek_v3_released", 1, u64::MAX);
    let manifest = longhaul_engine::pack::Manifest::read(&pack).unwrap();
    let resident = manifest.resident.path.clone();
    let mut bytes = std::fs::read(&resident).unwrap();
    // Past the header, in the weights: the model would load and compute.
    let at = bytes.len() - 100;
    bytes[at] ^= 0x01;
    std::fs::write(&resident, bytes).unwrap();
    let err = Engine::open(&pack).err().expect("refused").to_string();
    assert!(
        err.contains("damaged") && err.contains(&resident.display().to_string()),
        "{err}"
    );
}

#[test]
fn interrupted_pack_is_not_a_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "deepseek_v3_released", 1, u64::MAX);
    std::fs::remove_file(pack.join("longhaul-pack.json")).unwrap();
    assert!(!longhaul_engine::pack::is_pack(&pack));
    // Without a manifest the folder is not a checkpoint either: it has no weights.
    assert!(Engine::open(&pack).is_err());
}

#[test]
fn absurd_record_sizes_in_a_manifest_are_refused_before_anything_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "deepseek_v3_released", 1, u64::MAX);
    let path = pack.join("longhaul-pack.json");
    let original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let record = "/experts/layers/0/records/0";
    let edits: [(&str, &str, u64); 4] = [
        ("len", "record of 1099511627776 bytes", 1 << 40),
        ("segments/0/len", "segments do not add up", 1 << 40),
        ("len", "record of 1 bytes", 1),
        ("", "larger than any model's", 1 << 40),
    ];
    for (field, want, value) in edits {
        let mut m = original.clone();
        if field.is_empty() {
            *m.pointer_mut("/experts/layers/0/hidden").unwrap() = value.into();
        } else {
            *m.pointer_mut(&format!("{record}/{field}")).unwrap() = value.into();
        }
        std::fs::write(&path, m.to_string()).unwrap();
        let err = Engine::open(&pack).err().expect("refused").to_string();
        assert!(
            err.contains(want) && err.contains("longhaul-pack.json"),
            "{field}: {err}"
        );
    }
}

#[test]
fn packing_twice_into_the_same_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pack_dir = pack(tmp.path(), "deepseek_v3_released", 1, u64::MAX);
    let opts = PackOptions::new(
        common::fixtures_dir().join("deepseek_v3_released"),
        pack_dir,
        vec![tmp.path().join("drive0")],
    );
    let err = write_pack(&opts, &|_| {}).unwrap_err().to_string();
    assert!(err.contains("already holds a pack"), "{err}");
}

#[test]
fn metrics_snapshots_report_drive_rates_and_latencies() {
    let tmp = tempfile::tempdir().unwrap();
    let pack = pack(tmp.path(), "deepseek_v3_released", 2, 4096);
    let engine = open(&pack, 0, 1);
    let stats = || engine.stats().unwrap();
    let mut sampler = longhaul_engine::MetricsSampler::new(&stats());
    engine.logits(&[1, 2, 3, 4]).unwrap();
    // Prefetches issued for a next layer may land after the pass returns
    // (under load, after the next sample): wait until the drives are idle.
    let waited = std::time::Instant::now();
    let mut read = stats().drive_bytes();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = stats().drive_bytes();
        if now == read {
            break;
        }
        read = now;
        assert!(
            waited.elapsed().as_secs() < 10,
            "the drives never went idle"
        );
    }
    let m = sampler.sample(&stats());
    assert_eq!(m.drives.len(), 2);
    for d in &m.drives {
        assert!(d.bytes > 0 && d.reads > 0, "{d:?}");
        assert!(d.mb_per_s > 0.0);
        assert!(d.latency_p50_ms.is_some() && d.latency_p99_ms >= d.latency_p50_ms);
    }
    assert_eq!(m.cache.hits, 0, "a zero budget never hits");
    let again = sampler.sample(&stats());
    assert!(
        again.drives.iter().all(|d| d.mb_per_s == 0.0),
        "nothing read since the last sample"
    );
}

#[test]
fn replicated_records_verify_and_stay_exact() {
    let fixture = "deepseek_v3_released";
    let dir = common::fixtures_dir().join(fixture);
    let exp = common::expected(&dir);
    let reference = all_logits(&Engine::open(&dir).unwrap(), &exp.ids[..10]);
    let tmp = tempfile::tempdir().unwrap();
    let drives: Vec<PathBuf> = (0..3)
        .map(|i| tmp.path().join(format!("drive{i}")))
        .collect();
    for d in &drives {
        std::fs::create_dir_all(d).unwrap();
    }
    let pack = tmp.path().join("replicated");
    let mut opts = PackOptions::new(dir.clone(), pack.clone(), drives);
    opts.split_threshold = u64::MAX;
    opts.replicas = 2;
    // Copy every expert of layer 1 and half of layer 2.
    opts.replicate = (0..16)
        .map(|e| (1, e))
        .chain((0..8).map(|e| (2, e)))
        .collect();
    let summary = write_pack(&opts, &|_| {}).unwrap();
    let copies: usize = summary
        .manifest
        .experts
        .layers
        .iter()
        .flat_map(|l| &l.records)
        .map(|r| r.replicas.len())
        .sum();
    assert_eq!(copies, 2 * 24);
    for r in summary
        .manifest
        .experts
        .layers
        .iter()
        .flat_map(|l| &l.records)
    {
        let mut drives: Vec<usize> = r.placements().map(|p| p[0].drive).collect();
        drives.sort();
        drives.dedup();
        assert_eq!(
            drives.len(),
            r.placements().count(),
            "each copy on its own drive"
        );
    }
    let report = verify_pack(&pack, &|_, _| {}).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.records, 32 + 48);
    for budget in [0, u64::MAX] {
        assert!(
            all_logits(&open(&pack, budget, 2), &exp.ids[..10]) == reference,
            "budget {budget}"
        );
    }
    // A corrupt copy is found by verify even though the primary is intact.
    let copy = &summary.manifest.experts.layers[0].records[3].replicas[1][0];
    let path = summary.manifest.drives[copy.drive].join(&copy.file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[copy.offset as usize + 7] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let report = verify_pack(&pack, &|_, _| {}).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].contains("(copy 2)"),
        "{:?}",
        report.problems
    );
}

/// A small checkpoint whose expert rows are whole Q4K super-blocks.
fn blockable_checkpoint(root: &Path) -> PathBuf {
    use longhaul_engine::synth::write_synthetic;
    let mut spec = longhaul_engine::tools::synth_spec("deepseek_v3").unwrap();
    spec.vocab = 512;
    spec.hidden = 256;
    spec.layers = 3;
    spec.heads = 4;
    spec.kv_heads = 4;
    spec.experts = 8;
    spec.top_k = 2;
    spec.moe_intermediate = 256;
    spec.dense_intermediate = 256;
    let out = root.join("blockable");
    write_synthetic(&spec, &out, &|_, _| {}).unwrap();
    out
}

/// Synthetic checkpoints written as FP8 (DeepSeek-V3, rows of 200 and 256:
/// partial and whole blocks), INT4 (Kimi K2-Thinking's layout) and MXFP4
/// (gpt-oss) load narrow, and their packs stream bitwise the same logits.
#[test]
fn synthetic_quantised_checkpoints_load_narrow_and_stream_exactly() {
    use longhaul_engine::model::Quantization;
    use longhaul_engine::synth::{SynthDtype, write_synthetic};
    // (arch, dtype, moe intermediate, quantization, manifest dtype, record bytes)
    let cases = [
        // 400 gate/up rows of 256 and 256 down rows of 200, a byte each plus scales.
        (
            "deepseek_v3",
            SynthDtype::Fp8,
            200,
            Quantization::Fp8Blocks,
            "FP8_E4M3_B128",
            400 * (256 + 2 * 4) + 256 * (200 + 2 * 4),
        ),
        // Groups of 32: a BF16 scale and 16 bytes.
        (
            "deepseek_v3",
            SynthDtype::Int4,
            192,
            Quantization::Int4Groups,
            "INT4_G32",
            (384 * 8 + 256 * 6) * 18,
        ),
        // Blocks of 32: a scale byte and 16 bytes.
        (
            "gpt_oss",
            SynthDtype::Mxfp4,
            192,
            Quantization::Mxfp4,
            "MXFP4",
            (384 * 8 + 256 * 6) * 17,
        ),
    ];
    for (arch, dtype, inter, quantization, name, record_len) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let mut spec = longhaul_engine::tools::synth_spec(arch).unwrap();
        (
            spec.vocab,
            spec.hidden,
            spec.layers,
            spec.heads,
            spec.kv_heads,
        ) = (512, 256, 3, 4, 4);
        (
            spec.experts,
            spec.top_k,
            spec.moe_intermediate,
            spec.dense_intermediate,
        ) = (8, 2, inter, 256);
        spec.dtype = dtype;
        let source = tmp.path().join("synth");
        write_synthetic(&spec, &source, &|_, _| {}).unwrap();
        let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 512).collect();
        let engine = Engine::open(&source).unwrap();
        assert_eq!(engine.spec().quantization, Some(quantization), "{name}");
        let reference = all_logits(&engine, &ids);
        assert!(reference.iter().flatten().all(|v| v.is_finite()), "{name}");
        let drives: Vec<PathBuf> = (0..2).map(|i| tmp.path().join(format!("d{i}"))).collect();
        for d in &drives {
            std::fs::create_dir_all(d).unwrap();
        }
        let pack = tmp.path().join("pack");
        let mut opts = PackOptions::new(source, pack.clone(), drives);
        opts.split_threshold = 16 * 1024;
        let summary = write_pack(&opts, &|_| {}).unwrap();
        assert_eq!(summary.manifest.experts.dtype, name);
        assert_eq!(
            summary.manifest.experts.layers[0].records[0].len, record_len,
            "{name}"
        );
        for budget in [0, u64::MAX] {
            assert!(
                all_logits(&open_with(&pack, budget, 2, true), &ids) == reference,
                "{name}: budget {budget}"
            );
        }
    }
}

#[test]
fn quantised_packs_are_labelled_close_and_exact_under_any_budget() {
    use longhaul_engine::pack::encoding::Quantization;
    let tmp = tempfile::tempdir().unwrap();
    let source = blockable_checkpoint(tmp.path());
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 512).collect();
    let reference = all_logits(&Engine::open(&source).unwrap(), &ids);
    let drives: Vec<PathBuf> = (0..2).map(|i| tmp.path().join(format!("d{i}"))).collect();
    for d in &drives {
        std::fs::create_dir_all(d).unwrap();
    }
    let expert = 3 * 256 * 256 * 4;
    // Random weights are the hard case for 4 bits; what is checked is that
    // both stay close and that 4 bits land further away than 8.
    let mut previous = 0.0;
    for (q, bound) in [(Quantization::Q8_0, 0.05), (Quantization::Q4K, 2.0)] {
        let pack = tmp.path().join(q.name());
        let mut opts = PackOptions::new(source.clone(), pack.clone(), drives.clone());
        opts.quantization = Some(q);
        opts.split_threshold = 32 * 1024;
        let summary = write_pack(&opts, &|_| {}).unwrap();
        let section = &summary.manifest.experts;
        assert_eq!(section.dtype, q.name());
        let report = section.quantization.as_ref().unwrap();
        assert_eq!(report.from, "BF16");
        assert!(report.relative_rms_error > 0.0 && report.relative_rms_error < 0.1);
        assert!(verify_pack(&pack, &|_, _| {}).unwrap().problems.is_empty());

        let first = all_logits(&open(&pack, 0, 1), &ids);
        let diff = common::max_abs_diff(&first, &reference);
        assert!(
            diff > 0.0 && diff < bound,
            "{q:?}: max |Δlogit| {diff} against the unquantised model"
        );
        assert!(
            diff > previous,
            "{q:?} is no further off than the finer one"
        );
        previous = diff;
        for budget in [expert, 3 * expert, u64::MAX] {
            for keep in [false, true] {
                let got = all_logits(&open_with(&pack, budget, 2, keep), &ids);
                assert!(
                    got == first,
                    "{q:?}: budget {budget}, held quantised {keep}: logits differ"
                );
            }
        }
    }
}

#[test]
fn quantising_rows_that_fit_no_block_is_refused() {
    use longhaul_engine::pack::encoding::Quantization;
    let tmp = tempfile::tempdir().unwrap();
    let drive = tmp.path().join("d0");
    std::fs::create_dir_all(&drive).unwrap();
    let out = tmp.path().join("q4k");
    let mut opts = PackOptions::new(
        common::fixtures_dir().join("deepseek_v3_released"),
        out.clone(),
        vec![drive],
    );
    opts.quantization = Some(Quantization::Q4K);
    // Gate/up rows of 64 would fall back to Q8_0; down rows of 24 fit nothing.
    let err = write_pack(&opts, &|_| {}).unwrap_err().to_string();
    assert!(
        err.contains("blocks of 256") && err.contains("down rows hold 24"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written for a refused pack");
}

/// `pack --resident q8_0`: the resident matrices (not routers or norms)
/// are stored as Q8_0, labelled lossy in the manifest; the pack loads,
/// stays close to the checkpoint, and streams exactly under any budget.
#[test]
fn a_q8_0_spine_is_labelled_close_and_exact_under_any_budget() {
    use longhaul_engine::pack::encoding::Quantization;
    let fixture = "qwen3_moe_recent";
    let dir = common::fixtures_dir().join(fixture);
    let exp = common::expected(&dir);
    let reference = all_logits(&Engine::open(&dir).unwrap(), &exp.ids);
    let tmp = tempfile::tempdir().unwrap();
    let drives: Vec<PathBuf> = (0..2).map(|i| tmp.path().join(format!("d{i}"))).collect();
    for d in &drives {
        std::fs::create_dir_all(d).unwrap();
    }
    let plain = pack(&tmp.path().join("plain"), fixture, 2, 4096);
    let out = tmp.path().join("spine");
    let mut opts = PackOptions::new(dir.clone(), out.clone(), drives.clone());
    opts.resident_quantization = Some(Quantization::Q8_0);
    let summary = write_pack(&opts, &|_| {}).unwrap();
    let q = summary.manifest.resident.quantization.clone().unwrap();
    assert_eq!(q.requested.as_deref(), Some("Q8_0"));
    assert!(
        q.relative_rms_error > 0.0 && q.relative_rms_error < 0.01,
        "{q:?}"
    );
    assert!(
        summary.manifest.experts.quantization.is_none(),
        "experts as stored"
    );
    let plain_size = longhaul_engine::pack::Manifest::read(&plain)
        .unwrap()
        .resident
        .size;
    assert!(
        summary.resident_bytes < plain_size * 2 / 3,
        "{} vs {plain_size}",
        summary.resident_bytes
    );
    let full = all_logits(&open(&out, u64::MAX, 2), &exp.ids);
    for budget in [0, expert_bytes(fixture, &out)] {
        assert!(
            all_logits(&open(&out, budget, 2), &exp.ids) == full,
            "budget {budget}"
        );
    }
    let worst = full
        .iter()
        .flatten()
        .zip(reference.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // A random-weight fixture's logits are nearly flat; the trained demo
    // model keeps every top-1 token (see the README's figures).
    assert!(worst > 0.0, "a lossy spine changes the logits");
    let agree = full
        .iter()
        .zip(&reference)
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    assert!(
        agree * 5 >= full.len() * 4,
        "top-1 agrees at {agree} of {} (max |Δlogit| {worst})",
        full.len()
    );
    // Only q8_0 is offered for the spine.
    let mut bad = PackOptions::new(dir, tmp.path().join("q4k-spine"), drives);
    bad.resident_quantization = Some(Quantization::Q4K);
    let err = write_pack(&bad, &|_| {}).unwrap_err().to_string();
    assert!(err.contains("q8_0 only"), "{err}");
    assert!(
        !tmp.path().join("q4k-spine").exists(),
        "refused before writing"
    );
}

/// Index of the largest logit (the first of equals).
fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 { (i, v) } else { best }
        })
        .0
}

/// The synthetic Kimi-Linear shape (KDA on three layers of four, MLA on the
/// fourth, a dense first layer, shared experts) packs over three drives and
/// streams bitwise the logits of the checkpoint in RAM.
#[test]
fn synthetic_kimi_linear_streams_exactly() {
    use longhaul_engine::synth::write_synthetic;
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = longhaul_engine::tools::synth_spec("kimi_linear").unwrap();
    (
        spec.vocab,
        spec.hidden,
        spec.layers,
        spec.heads,
        spec.kv_heads,
    ) = (512, 128, 5, 4, 4);
    (spec.experts, spec.top_k, spec.moe_intermediate) = (32, 8, 32);
    let source = tmp.path().join("synth");
    write_synthetic(&spec, &source, &|_, _| {}).unwrap();
    let config = std::fs::read_to_string(source.join("config.json")).unwrap();
    assert!(
        config.contains("\"full_attn_layers\": [\n      4\n    ]"),
        "{config}"
    );
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 512).collect();
    let reference = all_logits(&Engine::open(&source).unwrap(), &ids);
    let drives: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("d{i}"))).collect();
    for d in &drives {
        std::fs::create_dir_all(d).unwrap();
    }
    let pack = tmp.path().join("pack");
    write_pack(&PackOptions::new(source, pack.clone(), drives), &|_| {}).unwrap();
    let one = 3 * 128 * 32 * 2;
    for budget in [0, 4 * one, u64::MAX] {
        assert!(
            all_logits(&open(&pack, budget, 4), &ids) == reference,
            "budget {budget}: logits differ"
        );
    }
}

/// Records every expert a model asks its provider for.
struct Recording {
    inner: std::sync::Arc<dyn longhaul_engine::model::layers::experts::ExpertProvider>,
    asked: std::sync::Mutex<Vec<Vec<usize>>>,
}

impl longhaul_engine::model::layers::experts::ExpertProvider for Recording {
    fn fetch<'a>(
        &'a self,
        layer: usize,
        ids: &[usize],
        rows: &[u32],
    ) -> Result<
        longhaul_engine::model::layers::experts::ExpertStream<'a>,
        longhaul_engine::model::layers::experts::ExpertError,
    > {
        self.asked.lock().unwrap().push(ids.to_vec());
        self.inner.fetch(layer, ids, rows)
    }
}

/// LongCat-Flash's identity experts take tokens but are never asked of the
/// expert provider (the cache, the drives): only ids below
/// `n_routed_experts` are, and the answer is the model's in RAM.
#[test]
fn identity_experts_are_never_read() {
    use longhaul_engine::model::{LogitsFor, ModelSpec};
    let dir = common::fixtures_dir().join("longcat_flash_released");
    let exp = common::expected(&dir);
    let spec = ModelSpec::read(&dir.join("config.json")).unwrap();
    let source = longhaul_engine::weights::SafetensorsCheckpoint::open(&dir).unwrap();
    let ram = spec.build(&source, None).unwrap();
    let recording = std::sync::Arc::new(Recording {
        inner: ram.experts.clone(),
        asked: Default::default(),
    });
    let recorded = spec.build(&source, Some(recording.clone())).unwrap();
    let (mut a, mut b) = (ram.new_state(), recorded.new_state());
    for &id in &exp.ids {
        let want = ram.forward(&[id], &mut a, LogitsFor::All).unwrap();
        let got = recorded.forward(&[id], &mut b, LogitsFor::All).unwrap();
        assert!(got.to_vec2::<f32>().unwrap() == want.to_vec2::<f32>().unwrap());
    }
    let asked = recording.asked.lock().unwrap();
    // 8 computed experts, top-3 of 12 scored: a pass that asked for fewer
    // than 3 routed some of its token to an identity expert.
    assert!(asked.iter().flatten().all(|&e| e < 8), "{asked:?}");
    assert!(
        asked.iter().any(|ids| ids.len() < 3),
        "no token took an identity expert: {asked:?}"
    );
}
