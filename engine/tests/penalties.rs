//! Penalties against their references: transformers' repetition_penalty
//! and OpenAI's frequency and presence penalties (as vLLM computes them),
//! greedy on the Qwen3-MoE fixture, from `tools/reference/penalties.py`.
//! The same tokens whether guesses are drafted (prompt lookup) or not, and
//! after a resume mid-answer.

mod common;

use longhaul_engine::Engine;
use longhaul_engine::generate::{Flow, GenerationSettings, SamplingParams, Speculation};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    repetition_penalty: f32,
    frequency_penalty: f32,
    presence_penalty: f32,
    tokens: Vec<u32>,
}

#[derive(Deserialize)]
struct Reference {
    prompt_ids: Vec<u32>,
    plain_tokens: Vec<u32>,
    cases: Vec<Case>,
}

fn settings(case: Option<&Case>, n: usize, speculation: Speculation) -> GenerationSettings {
    GenerationSettings {
        sampling: SamplingParams {
            repetition_penalty: case.map_or(1.0, |c| c.repetition_penalty),
            frequency_penalty: case.map_or(0.0, |c| c.frequency_penalty),
            presence_penalty: case.map_or(0.0, |c| c.presence_penalty),
            ..Default::default()
        },
        speculation,
        ..common::greedy_settings(n, Vec::new())
    }
}

#[test]
fn penalized_answers_equal_their_references_token_for_token() {
    let dir = common::fixtures_dir().join("qwen3_moe_released");
    let reference: Reference =
        serde_json::from_slice(&std::fs::read(dir.join("penalties.json")).unwrap()).unwrap();
    let engine = Engine::open(&dir).unwrap();
    let prompt = &reference.prompt_ids;
    let n = reference.plain_tokens.len();
    let plain = engine
        .generate(prompt, &settings(None, n, Speculation::Off), |_| {
            Flow::Continue
        })
        .unwrap();
    assert_eq!(plain.tokens, reference.plain_tokens, "without penalties");
    let mut drafted = 0;
    for case in &reference.cases {
        let what = format!(
            "repetition {} frequency {} presence {}",
            case.repetition_penalty, case.frequency_penalty, case.presence_penalty
        );
        assert_ne!(
            case.tokens, reference.plain_tokens,
            "{what}: a case that changes the answer"
        );
        for speculation in [Speculation::Off, Speculation::Lookup] {
            let out = engine
                .generate(prompt, &settings(Some(case), n, speculation), |_| {
                    Flow::Continue
                })
                .unwrap();
            assert_eq!(out.tokens, case.tokens, "{what}, guessing {speculation:?}");
            drafted += out.stats.speculation.drafted;
        }
        // Resumed after half the answer: the penalties count what came before.
        let half = &case.tokens[..n / 2];
        let resumed = engine
            .generate_resumed(
                prompt,
                half,
                &[],
                &settings(Some(case), n, Speculation::Off),
                |_| Flow::Continue,
            )
            .unwrap();
        assert_eq!(resumed.tokens, case.tokens, "{what}, resumed");
    }
    assert!(drafted > 0, "guesses were verified under penalties");
}
