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

#[test]
fn cached_decode_matches_full_recompute() {
    for dir in fixtures() {
        let exp = expected(&dir);
        let (_, model) = load_checkpoint(&dir).unwrap();
        let mut full_cache = model.new_cache();
        let full: Vec<Vec<f32>> = model
            .forward(&exp.ids, &mut full_cache, LogitsFor::All)
            .unwrap()
            .to_vec2()
            .unwrap();
        // Prefill half, then one token at a time.
        let split = exp.ids.len() / 2;
        let mut cache = model.new_cache();
        let mut stepped: Vec<Vec<f32>> = model
            .forward(&exp.ids[..split], &mut cache, LogitsFor::All)
            .unwrap()
            .to_vec2()
            .unwrap();
        for &id in &exp.ids[split..] {
            let row: Vec<Vec<f32>> = model
                .forward(&[id], &mut cache, LogitsFor::Last)
                .unwrap()
                .to_vec2()
                .unwrap();
            stepped.extend(row);
        }
        let diff = max_abs_diff(&stepped, &full);
        println!("{}: cached vs full max |Δ| = {diff:e}", name(&dir));
        assert!(
            diff <= LOGIT_TOLERANCE,
            "{}: cached decode drifts by {diff:e}",
            name(&dir)
        );
        let argmax = |r: &Vec<f32>| {
            r.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
        };
        assert!(
            stepped
                .iter()
                .zip(&full)
                .all(|(a, b)| argmax(a) == argmax(b)),
            "{}: cached decode changes a greedy choice",
            name(&dir)
        );
    }
}
