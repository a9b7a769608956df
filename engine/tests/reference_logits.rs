//! Logits against transformers on every committed fixture.

mod common;

use common::{LOGIT_TOLERANCE, expected, facts, fixtures, max_abs_diff, name};
use longhaul_engine::generate::Session;
use longhaul_engine::model::{LogitsFor, load_checkpoint};

/// Every fixture's teacher-forced logits, computed once for the tests
/// below (they run side by side; the second waits for the first).
fn teacher_forced() -> &'static [(std::path::PathBuf, Vec<Vec<f32>>)] {
    static LOGITS: std::sync::OnceLock<Vec<(std::path::PathBuf, Vec<Vec<f32>>)>> =
        std::sync::OnceLock::new();
    LOGITS.get_or_init(|| {
        fixtures()
            .into_iter()
            .map(|dir| {
                let exp = expected(&dir);
                let (_, model) =
                    load_checkpoint(&dir).unwrap_or_else(|e| panic!("{}: {e}", name(&dir)));
                let mut cache = model.new_state();
                let logits = model
                    .forward(&exp.ids, &mut cache, LogitsFor::All)
                    .unwrap()
                    .to_vec2()
                    .unwrap();
                (dir, logits)
            })
            .collect()
    })
}

#[test]
fn teacher_forced_logits_match_transformers() {
    let mut failures = Vec::new();
    for (dir, logits) in teacher_forced() {
        let diff = max_abs_diff(logits, &expected(dir).logits);
        println!("{}: max |Δlogit| = {diff:e}", name(dir));
        if diff > facts(dir).tolerance || diff.is_nan() {
            failures.push(format!("{}: {diff:e}", name(dir)));
        }
    }
    assert!(
        failures.is_empty(),
        "logits differ from transformers: {failures:?}"
    );
}

/// Where the logits' bits on the reference machine (x86-64) are kept.
const LOGIT_BITS_FILE: &str = "tests/logit_bits.json";

/// Every fixture's teacher-forced logits, bit for bit, are those the
/// reference machine computed (`tests/logit_bits.json`: an xxh3 of each
/// fixture's f32 bits): so aarch64 (Linux under qemu in CI), a machine
/// without AVX-512 and this one all compute the same numbers, not merely
/// numbers within the tolerance. `LONGHAUL_WRITE_LOGIT_BITS=1` writes the
/// file, on x86-64 only.
#[test]
fn logits_are_the_bits_the_reference_machine_computes() {
    let mut got = std::collections::BTreeMap::new();
    for (dir, logits) in teacher_forced() {
        let bytes: Vec<u8> = logits
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        got.insert(
            name(dir),
            format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)),
        );
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(LOGIT_BITS_FILE);
    if std::env::var_os("LONGHAUL_WRITE_LOGIT_BITS").is_some() {
        #[cfg(not(target_arch = "x86_64"))]
        panic!("the reference bits are written on x86-64");
        #[cfg(target_arch = "x86_64")]
        {
            let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
            std::fs::write(&path, text).unwrap();
            return;
        }
    }
    let want: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let differ: Vec<&String> = got.keys().filter(|k| want.get(*k) != got.get(*k)).collect();
    assert!(
        differ.is_empty() && got.len() == want.len(),
        "logits differ in their bits from the reference machine's for {differ:?} ({} fixtures here, {} there)",
        got.len(),
        want.len()
    );
}

/// Each fixture's facts hold of it: the family named is the one its
/// config is read by, and no fixture is allowed more than the exactness
/// rule's 1e-4.
#[test]
fn every_fixture_states_its_facts_truly() {
    for dir in fixtures() {
        let f = facts(&dir);
        let raw = longhaul_engine::model::RawConfig::read(&dir.join("config.json"))
            .unwrap_or_else(|e| panic!("{}: {e}", name(&dir)));
        let model_type = raw
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let family = longhaul_engine::model::family::family_of(model_type)
            .unwrap_or_else(|| panic!("{}: no family reads {model_type}", name(&dir)));
        assert_eq!(f.family, family.model_types()[0], "{}", name(&dir));
        assert!(
            f.tolerance <= LOGIT_TOLERANCE,
            "{}: {}",
            name(&dir),
            f.tolerance
        );
    }
}

/// Every kernel is batch-invariant, so a sequence fed in one pass, in
/// chunks of any size or one token at a time gives bitwise the same logits.
#[test]
fn batched_and_one_token_passes_agree_bitwise() {
    for (dir, full) in teacher_forced() {
        let exp = expected(dir);
        let (_, model) = load_checkpoint(dir).unwrap();
        for chunk in [1, 3, exp.ids.len() / 2 + 1] {
            let mut cache = model.new_state();
            let mut stepped: Vec<Vec<f32>> = Vec::new();
            for part in exp.ids.chunks(chunk) {
                let rows: Vec<Vec<f32>> = model
                    .forward(part, &mut cache, LogitsFor::All)
                    .unwrap()
                    .to_vec2()
                    .unwrap();
                stepped.extend(rows);
            }
            assert!(
                stepped == *full,
                "{}: chunks of {chunk} differ from one pass (max |Δ| {:e})",
                name(dir),
                max_abs_diff(&stepped, full)
            );
        }
    }
}

/// Decoding N tokens, cutting back to M and decoding again gives bitwise
/// what decoding M and then the rest gives — with a mark before M (layers
/// that cannot drop rows return to it) and without one (they start over).
#[test]
fn a_session_cut_back_decodes_as_one_that_never_went_further() {
    for dir in fixtures() {
        let exp = expected(&dir);
        let (_, model) = load_checkpoint(&dir).unwrap();
        let n = exp.ids.len();
        let mut plain = Session::new(&model);
        let want: Vec<Vec<f32>> = exp
            .ids
            .iter()
            .map(|&id| plain.feed(&[id]).unwrap())
            .collect();
        for (cut, mark) in [(n / 2, Some(n / 3)), (n / 2, None), (1, Some(0))] {
            let mut s = Session::new(&model);
            for (i, &id) in exp.ids.iter().enumerate() {
                if Some(i) == mark {
                    s.mark();
                }
                s.feed(&[id]).unwrap();
            }
            s.truncate(cut).unwrap();
            assert_eq!(s.len(), cut);
            for (i, &id) in exp.ids.iter().enumerate().skip(cut) {
                assert!(
                    s.feed(&[id]).unwrap() == want[i],
                    "{}: cut to {cut} (mark {mark:?}), position {i} differs",
                    name(&dir)
                );
            }
        }
    }
}
