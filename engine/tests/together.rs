//! Sequences decoding together: one pass over several sequences gives each
//! bitwise the logits of a pass of its own, for every family; generations
//! running at once on one model share their passes and each answer is the
//! one it gives alone.

mod common;

use common::{expected, fixtures, name};
use longhaul_engine::model::layers::decoder::Part;
use longhaul_engine::model::{LogitsFor, load_checkpoint};
use longhaul_engine::{Engine, EngineOptions, Flow, GenerationSettings, SamplingParams};

/// Each sequence alone: its rows after `before` rows already fed.
fn alone(model: &longhaul_engine::model::Decoder, ids: &[u32], before: usize) -> Vec<Vec<f32>> {
    let mut state = model.new_state();
    if before > 0 {
        model
            .forward(&ids[..before], &mut state, LogitsFor::All)
            .unwrap();
    }
    model
        .forward(&ids[before..], &mut state, LogitsFor::All)
        .unwrap()
        .to_vec2()
        .unwrap()
}

#[test]
fn one_pass_over_several_sequences_gives_each_its_own_logits() {
    for dir in fixtures() {
        let exp = expected(&dir);
        let (_, model) = load_checkpoint(&dir).unwrap();
        let ids = &exp.ids;
        let n = ids.len();
        // Three sequences at different lengths, fed 1, 3 and n/2 rows: a
        // decode step, guesses being checked and a prompt's chunk.
        let shapes = [(n - 1, n), (2, 5.min(n)), (0, n / 2)];
        let mut states: Vec<_> = shapes.iter().map(|_| model.new_state()).collect();
        for (state, &(before, _)) in states.iter_mut().zip(&shapes) {
            if before > 0 {
                model
                    .forward(&ids[..before], state, LogitsFor::All)
                    .unwrap();
            }
        }
        let mut parts: Vec<Part<'_>> = states
            .iter_mut()
            .zip(&shapes)
            .map(|(state, &(before, end))| Part {
                ids: &ids[before..end],
                state,
                which: LogitsFor::All,
            })
            .collect();
        let together = model.forward_parts(&mut parts).unwrap();
        for (got, &(before, end)) in together.iter().zip(&shapes) {
            let got: Vec<Vec<f32>> = got.to_vec2().unwrap();
            let want = alone(&model, &ids[..end], before);
            assert!(
                got == want,
                "{}: rows {before}..{end} differ together",
                name(&dir)
            );
        }
        // The states moved on as their own passes would have moved them.
        for (state, &(_, end)) in states.iter().zip(&shapes) {
            assert_eq!(state.len(), end, "{}", name(&dir));
        }
    }
}

fn settings(max_tokens: usize, seed: u64, temperature: f32) -> GenerationSettings {
    GenerationSettings {
        sampling: SamplingParams {
            temperature,
            seed,
            ..Default::default()
        },
        ..common::greedy_settings(max_tokens, Vec::new())
    }
}

#[test]
fn generations_at_once_share_passes_and_answer_as_alone() {
    let dir = common::fixtures_dir().join("deepseek_v3_released");
    let exp = expected(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let pack = common::pack_on_two_drives(&dir, tmp.path());
    let mut options = EngineOptions::default();
    // A few experts' room: most lookups read from the drives.
    options.streaming.budget_bytes = 4 * 3 * 64 * 24 * 4;
    let open = || Engine::open_with(&pack, &options, &|_| {}).unwrap();
    // Different prompts, lengths and samplers; one ends early.
    let jobs: Vec<(Vec<u32>, GenerationSettings)> = (0..4)
        .map(|j| {
            let prompt: Vec<u32> = exp.ids.iter().skip(j).take(3 + 2 * j).copied().collect();
            let s = settings(
                if j == 2 { 3 } else { 9 },
                j as u64,
                if j % 2 == 1 { 0.8 } else { 0.0 },
            );
            (prompt, s)
        })
        .collect();
    let run = |engine: &Engine, (prompt, s): &(Vec<u32>, GenerationSettings)| {
        let mut tokens = Vec::new();
        let g = engine
            .generate_resumed(prompt, &[], &[], s, |p| {
                tokens.extend(p.token);
                Flow::Continue
            })
            .unwrap();
        (tokens, g.text)
    };
    let alone: Vec<_> = jobs.iter().map(|j| run(&open(), j)).collect();
    let engine = open();
    let together: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs.iter().map(|j| s.spawn(|| run(&engine, j))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        together, alone,
        "answers decoded together differ from alone"
    );
    let c = engine.together_counters();
    assert!(
        c.sequences > c.passes,
        "passes were shared: {} sequences in {} passes",
        c.sequences,
        c.passes
    );
}
