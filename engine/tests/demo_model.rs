//! The trained demo model in `assets/` against transformers' own numbers
//! (`reference.json`, written by `tools/demo_model/train.py` from the same
//! BF16 checkpoint), and its draft on the same tokenizer.

mod common;

use std::path::{Path, PathBuf};

use common::{LOGIT_TOLERANCE, max_abs_diff};
use longhaul_engine::Engine;
use longhaul_engine::generate::{FinishReason, Flow, Generation};
use longhaul_engine::model::{LogitsFor, load_checkpoint};
use longhaul_engine::tokenizer::ChatMessage;
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    ids: Vec<u32>,
    /// Rows for the first positions of `ids` (the file stays small).
    logits: Vec<Vec<f32>>,
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_tokens: Vec<u32>,
    greedy_text: String,
}

fn assets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets")
}

fn demo() -> PathBuf {
    assets().join("longhaul-demo-moe")
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(demo().join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("reference.json parses")
}

/// The model's logits at every position of `ids`, fed in one pass.
fn teacher_forced(dir: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    let (_, model) = load_checkpoint(dir).expect("model loads");
    let mut cache = model.new_state();
    model
        .forward(ids, &mut cache, LogitsFor::All)
        .unwrap()
        .to_vec2()
        .unwrap()
}

fn greedy(engine: &Engine, prompt: &[u32], max_tokens: usize) -> Generation {
    let settings = common::greedy_settings(max_tokens, engine.eos_token_ids().to_vec());
    engine
        .generate(prompt, &settings, |_| Flow::Continue)
        .unwrap()
}

#[test]
fn demo_model_logits_match_transformers() {
    let r = reference();
    let logits = teacher_forced(&demo(), &r.ids);
    let diff = max_abs_diff(&logits[..r.logits.len()], &r.logits);
    println!(
        "demo model: max |Δlogit| = {diff:e} over {} positions",
        r.logits.len()
    );
    // reference.json rounds logits to 5 decimals.
    assert!(
        diff <= LOGIT_TOLERANCE + 1e-5,
        "logits differ from transformers by {diff:e}"
    );
}

#[test]
fn demo_model_answers_the_demo_prompt_as_transformers_does() {
    let r = reference();
    let engine = Engine::open(&demo()).expect("demo model opens");
    let prompt = engine
        .chat_ids(&[ChatMessage::user(&r.prompt)])
        .expect("chat template renders");
    assert_eq!(prompt, r.prompt_ids, "chat prompt tokens");
    let out = greedy(&engine, &prompt, r.greedy_tokens.len());
    let mut want = r.greedy_tokens.clone();
    if out.finish_reason == FinishReason::Eos {
        want.pop();
    }
    assert_eq!(out.tokens, want, "greedy tokens");
    assert_eq!(out.text.trim(), r.greedy_text.trim(), "greedy text");
    println!("demo model, greedy: {}", out.text);
}

#[test]
fn draft_model_shares_the_tokenizer_and_guesses_the_next_token() {
    let draft = assets().join("longhaul-demo-draft");
    let same = |name: &str| {
        std::fs::read(demo().join(name)).expect(name)
            == std::fs::read(draft.join(name)).expect(name)
    };
    assert!(
        same("tokenizer.json"),
        "the draft uses the demo model's tokenizer"
    );
    // What speculative decoding needs: the draft often guesses the demo
    // model's next token. Compare their choices over a validation passage.
    let r = reference();
    let argmaxes = |dir: &Path| -> Vec<usize> {
        teacher_forced(dir, &r.ids)
            .iter()
            .map(|row| {
                row.iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(i, _)| i)
            })
            .collect()
    };
    let (big, small) = (argmaxes(&demo()), argmaxes(&draft));
    let agree = big.iter().zip(&small).filter(|(a, b)| a == b).count() as f64 / big.len() as f64;
    println!("draft agrees with the demo model on {agree:.2} of next tokens");
    // By chance: 1 in 4096.
    assert!(
        agree > 0.3,
        "the draft agrees on only {agree:.2} of next tokens"
    );
}

#[test]
fn a_long_prompt_reports_its_reading_and_can_be_stopped_between_passes() {
    use longhaul_engine::{PROMPT_CHUNK, Phase};
    let engine = Engine::open(&demo()).unwrap();
    let r = reference();
    // Three passes and a bit, from the demo's own ids.
    let prompt: Vec<u32> = r
        .ids
        .iter()
        .copied()
        .cycle()
        .take(3 * PROMPT_CHUNK + 5)
        .collect();
    let settings = common::greedy_settings(4, Vec::new());
    let mut seen = Vec::new();
    let whole = engine
        .generate_resumed(&prompt, &[], &[], &settings, |p| {
            if let Phase::Prompt { done, total } = p.phase {
                assert_eq!(total, prompt.len());
                assert_eq!(p.session.len(), done, "the state holds what was read");
                seen.push(done);
            }
            Flow::Continue
        })
        .unwrap();
    let n = prompt.len();
    let c = PROMPT_CHUNK;
    assert_eq!(seen, vec![0, c, 2 * c, 3 * c, n], "one report per pass");
    assert_eq!(whole.tokens.len(), 4);

    // Stopping after the second pass ends the generation there.
    let stopped = engine
        .generate_resumed(&prompt, &[], &[], &settings, |p| match p.phase {
            Phase::Prompt { done, .. } if done >= 2 * PROMPT_CHUNK => Flow::Stop,
            Phase::Prompt { .. } => Flow::Continue,
            Phase::Answer => panic!("no token after a stop in the prompt"),
        })
        .unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Cancelled);
    assert!(stopped.tokens.is_empty());
}
