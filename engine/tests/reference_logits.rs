//! Logits against transformers on every committed fixture.

mod common;

use common::{LOGIT_TOLERANCE, expected, fixtures, max_abs_diff, name};
use longhaul_engine::model::{LogitsFor, load_checkpoint};

#[test]
fn teacher_forced_logits_match_transformers() {
    let mut failures = Vec::new();
    for dir in fixtures() {
        let exp = expected(&dir);
        let (_, model) = load_checkpoint(&dir).unwrap_or_else(|e| panic!("{}: {e}", name(&dir)));
        let mut cache = model.new_cache();
        let logits: Vec<Vec<f32>> = model
            .forward(&exp.ids, &mut cache, LogitsFor::All)
            .unwrap()
            .to_vec2()
            .unwrap();
        let diff = max_abs_diff(&logits, &exp.logits);
        println!("{}: max |Δlogit| = {diff:e}", name(&dir));
        if diff > LOGIT_TOLERANCE || diff.is_nan() {
            failures.push(format!("{}: {diff:e}", name(&dir)));
        }
    }
    assert!(
        failures.is_empty(),
        "logits differ from transformers: {failures:?}"
    );
}

/// Every kernel is batch-invariant, so a sequence fed in one pass, in
/// chunks of any size or one token at a time gives bitwise the same logits.
#[test]
fn batched_and_one_token_passes_agree_bitwise() {
    for dir in fixtures() {
        let exp = expected(&dir);
        let (_, model) = load_checkpoint(&dir).unwrap();
        let mut full_cache = model.new_cache();
        let full: Vec<Vec<f32>> = model
            .forward(&exp.ids, &mut full_cache, LogitsFor::All)
            .unwrap()
            .to_vec2()
            .unwrap();
        for chunk in [1, 3, exp.ids.len() / 2 + 1] {
            let mut cache = model.new_cache();
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
                stepped == full,
                "{}: chunks of {chunk} differ from one pass (max |Δ| {:e})",
                name(&dir),
                max_abs_diff(&stepped, &full)
            );
        }
    }
}
