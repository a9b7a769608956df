//! Speculative decoding changes no token: with guesses verified in one pass,
//! every fixture family (attention, MLA, linear-attention hybrids) and the
//! trained demo model give bitwise the tokens of plain decoding, greedy and
//! sampled, on prompts built so that guesses are made and some rejected;
//! so do guesses carried as text from a draft model with another tokenizer.

mod common;

use std::path::Path;

use common::{fixtures, name};
use longhaul_engine::generate::speculate::Drafter;
use longhaul_engine::generate::{
    Flow, Generation, GenerationSettings, SamplingParams, Speculation,
};
use longhaul_engine::{Engine, TextBridge};

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

/// Has every guess of a drafter verified: the gate would soon stop one whose
/// guesses are mostly wrong, and then little would be tested.
struct Ungated<D>(D);

impl<D: Drafter> Drafter for Ungated<D> {
    fn propose(&mut self, context: &[u32], max: usize) -> (Vec<u32>, usize) {
        self.0.propose(context, max)
    }

    fn gated(&self) -> bool {
        false
    }

    fn fixed_kind(&self) -> Option<usize> {
        self.0.fixed_kind()
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
        output: Default::default(),
        keep_special_tokens: false,
        answer_starts: Vec::new(),
    }
}

const SAMPLED: SamplingParams = SamplingParams {
    temperature: 0.9,
    top_k: Some(40),
    top_p: 0.95,
    seed: 7,
    repetition_penalty: 1.0,
    frequency_penalty: 0.0,
    presence_penalty: 0.0,
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
        output: Default::default(),
        keep_special_tokens: false,
        answer_starts: Vec::new(),
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

/// Guesses carried as text between tokenizers: the demo draft (a 4,096-token
/// BPE) guesses for every fixture family (511 tokens), a fixture guesses for
/// the demo model, and the draft trained on its own 2,048-token BPE guesses
/// for the demo model well enough that guesses are kept.
#[test]
fn a_draft_model_with_another_tokenizer_keeps_every_models_answer() {
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets");
    let demo = assets.join("longhaul-demo-moe");
    let demo_draft = Engine::open(&assets.join("longhaul-demo-draft")).unwrap();
    let own_tokens = Engine::open(&assets.join("longhaul-demo-draft-2k")).unwrap();
    let fixture_draft = Engine::open(&fixtures()[0]).unwrap();
    let mut pairs: Vec<(_, &Engine)> = fixtures().into_iter().map(|d| (d, &demo_draft)).collect();
    pairs.push((demo.clone(), &fixture_draft));
    pairs.push((demo.clone(), &own_tokens));
    for (dir, guesser) in pairs {
        let engine = Engine::open(&dir).unwrap();
        let (target_tok, draft_tok) = (engine.tokenizer().unwrap(), guesser.tokenizer().unwrap());
        assert!(!target_tok.same_vocabulary(draft_tok));
        let prompt = engine
            .prompt_ids("Explain how to read and write files.", dir == demo)
            .unwrap();
        let mut kept = 0;
        for sampling in [SamplingParams::default(), SAMPLED] {
            let plain = generate(&engine, &prompt, &sampling, Speculation::Off);
            let bridge = TextBridge::new(guesser.session(), draft_tok, target_tok);
            let fast = drafted(&engine, &prompt, &sampling, &mut Ungated(bridge));
            assert_eq!(
                fast.tokens,
                plain.tokens,
                "{}: the bridged guesses changed the answer (temperature {})",
                dir.display(),
                sampling.temperature
            );
            let s = &fast.stats.speculation;
            assert!(s.drafted > 0, "{}: nothing was guessed", dir.display());
            println!(
                "{} guessed by a {}-token vocabulary, temperature {}: {} of {} kept",
                name(&dir),
                guesser.vocab_size(),
                sampling.temperature,
                s.accepted,
                s.drafted
            );
            kept += s.accepted;
        }
        if std::ptr::eq(guesser, &own_tokens) {
            assert!(kept > 0, "a trained draft's bridged guesses are kept");
        }
    }
}

/// Guesses a fixed script for the answer: whatever the answer is, from the
/// position the context has reached.
struct Scripted {
    prompt_len: usize,
    script: Vec<u32>,
}

impl Drafter for Scripted {
    fn propose(&mut self, context: &[u32], max: usize) -> (Vec<u32>, usize) {
        let at = (context.len() - self.prompt_len).min(self.script.len());
        let to = (at + max).min(self.script.len());
        (self.script[at..to].to_vec(), 1)
    }

    fn gated(&self) -> bool {
        false
    }
}

/// Tokens of the answer before the near tie: the tie is decided inside a
/// verify pass, on a row after the first.
const BEFORE_TIE: usize = 2;

/// A prompt built to produce a near tie: of every 200-token window of
/// Longhaul's README, the validation sample and the corpus licence, the
/// place where the demo model's two best next tokens are closest (1.7e-3
/// apart) among those its greedy answer reaches, cut `BEFORE_TIE` tokens
/// before it.
const NEAR_TIE_PROMPT: &str = "bs`, `GET /api/jobs/{id}`). A\njob's text deltas carry their byte offset, so a client also notices a gap by\nitself.\n\nThe service and its files: one service per data dir (a second `serve` on it\nis refused, naming the running one's pid and address; the CLI and the app\nuse the running one). The data dir is 0700 and its files 0600 (a start\ntightens wider ones and says so). Attachments must be regular files or\nfolders (pipes, sockets and devices are refused by name), at most 8 M";

/// The near-tie prompt's ids, the runner-up token at the tie, and the gap
/// between the two best logits there.
fn near_tie(engine: &Engine) -> (Vec<u32>, u32, f32) {
    let prompt = engine.prompt_ids(NEAR_TIE_PROMPT, false).unwrap();
    let plain = generate(
        engine,
        &prompt,
        &SamplingParams::default(),
        Speculation::Off,
    );
    let ids = [&prompt[..], &plain.tokens[..BEFORE_TIE]].concat();
    let rows = engine.logits(&ids).unwrap().to_vec2::<f32>().unwrap();
    let row = rows.last().unwrap();
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    assert_eq!(
        order[0] as u32, plain.tokens[BEFORE_TIE],
        "plain decoding picks the best"
    );
    (prompt, order[1] as u32, row[order[0]] - row[order[1]])
}

/// On a prompt built to produce a near tie, guesses that keep the tie's
/// winner and guesses of its runner-up both leave plain decoding's answer,
/// greedy and sampled: the verify pass computes the tied row bitwise as a
/// one-token step does.
#[test]
fn a_near_tie_decided_inside_a_verify_pass_keeps_plain_decodings_token() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe");
    let engine = Engine::open(&dir).unwrap();
    let (prompt, runner_up, gap) = near_tie(&engine);
    println!("near tie: the two best logits {gap:e} apart");
    assert!(gap < 5e-3, "the two best are {gap} apart: no near tie");
    for sampling in [SamplingParams::default(), SAMPLED] {
        let plain = generate(&engine, &prompt, &sampling, Speculation::Off);
        let mut wrong_at_tie = plain.tokens.clone();
        wrong_at_tie[BEFORE_TIE] = if plain.tokens[BEFORE_TIE] == runner_up {
            runner_up ^ 1
        } else {
            runner_up
        };
        for script in [plain.tokens.clone(), wrong_at_tie] {
            let mut drafter = Scripted {
                prompt_len: prompt.len(),
                script,
            };
            let fast = drafted(&engine, &prompt, &sampling, &mut drafter);
            assert_eq!(
                fast.tokens, plain.tokens,
                "temperature {}",
                sampling.temperature
            );
            assert!(fast.stats.speculation.verify_passes > 0);
        }
    }
}
