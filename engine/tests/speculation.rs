//! Speculative decoding changes no token: with guesses verified in one pass,
//! every fixture family (attention, MLA, linear-attention hybrids) and the
//! trained demo model give bitwise the tokens of plain decoding, greedy and
//! sampled, on prompts built so that guesses are made and some rejected.

mod common;

use std::path::Path;

use common::{fixtures, name};
use longhaul_engine::Engine;
use longhaul_engine::generate::speculate::Drafter;
use longhaul_engine::generate::{
    Flow, Generation, GenerationSettings, SamplingParams, Speculation,
};

/// Guesses the plain answer, wrong at every answer position `i` with
/// `i % 5 == 3`: runs of kept guesses, then a rejection, over and over.
struct Oracle {
    prompt_len: usize,
    answer: Vec<u32>,
}

impl Drafter for Oracle {
    fn propose(&mut self, context: &[u32], max: usize) -> (Vec<u32>, usize) {
        let at = context.len() - self.prompt_len;
        let guesses = (at..(at + max).min(self.answer.len()))
            .map(|i| {
                if i % 5 == 3 {
                    self.answer[i] ^ 1
                } else {
                    self.answer[i]
                }
            })
            .collect();
        (guesses, 1)
    }

    fn gated(&self) -> bool {
        false
    }
}

/// The answer with guesses from `drafter`, every other setting as `sampling`.
fn drafted(
    engine: &Engine,
    prompt: &[u32],
    sampling: &SamplingParams,
    drafter: &mut dyn Drafter,
) -> Generation {
    engine
        .generate_drafted(
            prompt,
            &settings(sampling, Speculation::Off),
            drafter,
            |_| Flow::Continue,
        )
        .unwrap()
}

fn settings(sampling: &SamplingParams, spec: Speculation) -> GenerationSettings {
    GenerationSettings {
        max_tokens: 48,
        sampling: sampling.clone(),
        stop_strings: Vec::new(),
        eos_token_ids: Vec::new(),
        speculation: spec,
    }
}

const SAMPLED: SamplingParams = SamplingParams {
    temperature: 0.9,
    top_k: Some(40),
    top_p: 0.95,
    seed: 7,
};

fn generate(
    engine: &Engine,
    prompt: &[u32],
    sampling: &SamplingParams,
    spec: Speculation,
) -> Generation {
    let settings = GenerationSettings {
        max_tokens: 48,
        sampling: sampling.clone(),
        stop_strings: Vec::new(),
        eos_token_ids: Vec::new(),
        speculation: spec,
    };
    engine
        .generate(prompt, &settings, |_| Flow::Continue)
        .unwrap()
}

/// A prompt that repeats itself, so prompt lookup finds guesses.
fn repetitive(engine: &Engine) -> Vec<u32> {
    let once = engine
        .prompt_ids(
            "the cache keeps hot experts; the drive streams cold experts; ",
            false,
        )
        .unwrap();
    once.iter().copied().cycle().take(once.len() * 4).collect()
}

/// Plain decoding against guesses from `oracle` (a drafter that knows the
/// answer but errs on purpose); returns (guessed, kept).
fn check(dir: &Path) -> (usize, usize) {
    let engine = Engine::open(dir).unwrap();
    let prompt = repetitive(&engine);
    let mut guessed = (0, 0);
    for sampling in [SamplingParams::default(), SAMPLED] {
        let plain = generate(&engine, &prompt, &sampling, Speculation::Off);
        let mut oracle = Oracle {
            prompt_len: prompt.len(),
            answer: plain.tokens.clone(),
        };
        let fast = drafted(&engine, &prompt, &sampling, &mut oracle);
        assert_eq!(
            fast.tokens,
            plain.tokens,
            "{}: speculation changed the answer (temperature {})",
            dir.display(),
            sampling.temperature
        );
        assert_eq!(fast.text, plain.text);
        let s = &fast.stats.speculation;
        assert!(
            s.accepted > 0 && s.accepted < s.drafted,
            "{}: {} of {} guesses kept",
            dir.display(),
            s.accepted,
            s.drafted
        );
        guessed.0 += s.drafted;
        guessed.1 += s.accepted;
    }
    guessed
}

#[test]
fn every_family_gives_plain_decodings_tokens_with_guesses_kept_and_rejected() {
    for dir in fixtures() {
        let (d, a) = check(&dir);
        println!("{}: {a} of {d} guesses kept", name(&dir));
    }
}

#[test]
fn prompt_lookup_on_the_trained_demo_model_keeps_its_answer_and_guesses_from_the_prompt() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe");
    check(&dir);
    let engine = Engine::open(&dir).unwrap();
    let prompt = repetitive(&engine);
    for sampling in [SamplingParams::default(), SAMPLED] {
        let plain = generate(&engine, &prompt, &sampling, Speculation::Off);
        let fast = generate(&engine, &prompt, &sampling, Speculation::Lookup);
        assert_eq!(
            fast.tokens, plain.tokens,
            "temperature {}",
            sampling.temperature
        );
        let s = &fast.stats.speculation;
        println!(
            "demo, temperature {}: {} of {} looked-up guesses kept in {} passes",
            sampling.temperature, s.accepted, s.drafted, s.verify_passes
        );
        if sampling.temperature == 0.0 {
            assert!(s.verify_passes > 0, "the repeated prompt gives guesses");
        }
    }
}

#[test]
fn the_demo_draft_model_keeps_the_demo_models_answer() {
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets");
    let engine = Engine::open(&assets.join("longhaul-demo-moe")).unwrap();
    let draft = Engine::open(&assets.join("longhaul-demo-draft")).unwrap();
    let prompt = engine
        .prompt_ids("Explain how to read and write files.", true)
        .unwrap();
    for sampling in [SamplingParams::default(), SAMPLED] {
        let plain = generate(&engine, &prompt, &sampling, Speculation::Off);
        let mut drafter = longhaul_engine::DraftModel::new(draft.session());
        let fast = drafted(&engine, &prompt, &sampling, &mut drafter);
        assert_eq!(
            fast.tokens, plain.tokens,
            "temperature {}",
            sampling.temperature
        );
        let s = &fast.stats.speculation;
        println!(
            "draft model, temperature {}: {} of {} guesses kept in {} passes",
            sampling.temperature, s.accepted, s.drafted, s.verify_passes
        );
    }
}
