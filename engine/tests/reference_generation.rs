//! Greedy generation and prompt tokenization against transformers.

mod common;

use common::{expected, fixtures, name};
use longhaul_engine::Engine;
use longhaul_engine::generate::{FinishReason, Flow, GenerationSettings, Phase, SamplingParams};

const GREEDY_TOKENS: usize = 32;

/// Greedy decoding of `GREEDY_TOKENS` at most, without guessing ahead, the
/// answer laid out as `output`.
fn greedy(engine: &Engine, output: longhaul_engine::OutputFormat) -> GenerationSettings {
    GenerationSettings {
        output,
        ..common::greedy_settings(GREEDY_TOKENS, engine.eos_token_ids().to_vec())
    }
}

#[test]
fn greedy_tokens_match_transformers() {
    for dir in fixtures() {
        let exp = expected(&dir);
        let engine = Engine::open(&dir).unwrap();
        let prompt = engine.prompt_ids(&exp.prompt, false).unwrap();
        assert_eq!(
            prompt,
            exp.prompt_ids,
            "{}: prompt tokenization",
            name(&dir)
        );
        let settings = greedy(&engine, Default::default());
        let mut streamed = String::new();
        let out = engine
            .generate(&prompt, &settings, |t| {
                streamed.push_str(t);
                Flow::Continue
            })
            .unwrap();
        // transformers keeps the EOS token in its output; Longhaul stops before it.
        let mut want = exp.greedy_tokens.clone();
        if out.finish_reason == FinishReason::Eos {
            let last = want.pop().expect("an EOS token");
            assert!(
                engine.eos_token_ids().contains(&last),
                "{}: ended on {last}",
                name(&dir)
            );
        }
        assert_eq!(out.tokens, want, "{}: greedy tokens", name(&dir));
        assert_eq!(out.text, exp.greedy_text, "{}: decoded text", name(&dir));
        assert_eq!(
            streamed,
            out.text,
            "{}: streamed text equals the final text",
            name(&dir)
        );
        println!(
            "{}: {} tokens, finished by {:?}",
            name(&dir),
            out.tokens.len(),
            out.finish_reason
        );
    }
}

#[test]
fn stop_strings_end_generation_before_the_string() {
    let dir = &fixtures()[0];
    let exp = expected(dir);
    let engine = Engine::open(dir).unwrap();
    let prompt = engine.prompt_ids(&exp.prompt, false).unwrap();
    // A stop string taken from the middle of the known greedy text.
    let chars: Vec<char> = exp.greedy_text.chars().collect();
    let stop: String = chars[8..11].iter().collect();
    let before: String = exp.greedy_text[..exp.greedy_text.find(&stop).unwrap()].to_string();
    let settings = GenerationSettings {
        max_tokens: GREEDY_TOKENS,
        sampling: SamplingParams::default(),
        stop_strings: vec![stop],
        eos_token_ids: engine.eos_token_ids().to_vec(),
        speculation: longhaul_engine::generate::Speculation::Off,
        output: Default::default(),
        keep_special_tokens: false,
        answer_starts: Vec::new(),
    };
    let out = engine
        .generate(&prompt, &settings, |_| Flow::Continue)
        .unwrap();
    assert_eq!(out.finish_reason, FinishReason::StopString);
    assert_eq!(out.text, before);
}

#[test]
fn seeded_sampling_is_reproducible_and_differs_across_seeds() {
    let dir = &fixtures()[0];
    let engine = Engine::open(dir).unwrap();
    let prompt = engine.prompt_ids("Draft an architecture", false).unwrap();
    let run = |seed| {
        let settings = GenerationSettings {
            max_tokens: 24,
            sampling: SamplingParams {
                temperature: 1.0,
                top_k: Some(50),
                top_p: 0.95,
                seed,
                ..Default::default()
            },
            stop_strings: Vec::new(),
            eos_token_ids: Vec::new(),
            speculation: longhaul_engine::generate::Speculation::Off,
            output: Default::default(),
            keep_special_tokens: false,
            answer_starts: Vec::new(),
        };
        engine
            .generate(&prompt, &settings, |_| Flow::Continue)
            .unwrap()
            .tokens
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn chat_prompts_render_the_checkpoint_template() {
    let dir = &fixtures()[0];
    let engine = Engine::open(dir).unwrap();
    let tok = engine.tokenizer().unwrap();
    let ids = engine.prompt_ids("  hello  ", true).unwrap();
    assert_eq!(
        tok.decode(&ids).unwrap(),
        "user\nhello\nassistant\n",
        "special tokens are dropped when decoding"
    );
    assert_eq!(ids[0], tok.token_id("<|im_start|>").unwrap());
}

/// Stops a generation after `cut` tokens, then resumes it from the tokens
/// produced so far — with the attention state saved on the way in two
/// pieces when `with_state`, else recomputing it; returns (text shown before
/// the cut, the resumed generation, text shown after).
fn cut_and_resume(
    engine: &Engine,
    prompt: &[u32],
    settings: &GenerationSettings,
    cut: usize,
    with_state: bool,
) -> (String, longhaul_engine::generate::Generation, String) {
    let mut before = String::new();
    let mut saved: Vec<Vec<u8>> = Vec::new();
    let mut saved_upto = 0;
    let first = engine
        .generate_resumed(prompt, &[], &[], settings, |p| {
            if p.phase != Phase::Answer {
                return Flow::Continue;
            }
            before.push_str(p.text);
            // Save what the cache holds at the halfway point and at the cut.
            if with_state && (p.tokens_so_far == cut / 2 || p.tokens_so_far >= cut) {
                let start = p.prompt_len + saved_upto;
                saved.push(p.session.snapshot_since(start).unwrap());
                saved_upto = p.session.len() - p.prompt_len;
            }
            if p.tokens_so_far >= cut {
                Flow::Stop
            } else {
                Flow::Continue
            }
        })
        .unwrap();
    let mut after = String::new();
    let resumed = engine
        .generate_resumed(prompt, &first.tokens, &saved, settings, |p| {
            after.push_str(p.text);
            Flow::Continue
        })
        .unwrap();
    assert_eq!(first.text, before, "what was shown is what was kept");
    (before, resumed, after)
}

#[test]
fn a_resumed_generation_ends_as_an_uninterrupted_one() {
    // Attention-only models, a hybrid whose linear layers' state is
    // overwritten every token, sparse attention whose indexer keeps keys of
    // its own, and compressed attention whose entries close every few tokens.
    let fixtures = common::fixtures_with("resume");
    assert!(fixtures.len() >= 6, "{fixtures:?}");
    for dir in fixtures {
        resumes_exactly(&Engine::open(&dir).unwrap());
    }
}

fn resumes_exactly(engine: &Engine) {
    let prompt = engine.prompt_ids("Draft an architecture", false).unwrap();
    for sampling in [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.9,
            top_k: Some(40),
            top_p: 0.95,
            seed: 11,
            ..Default::default()
        },
        // Penalties count the answer from before the resume.
        SamplingParams {
            temperature: 0.9,
            top_k: Some(40),
            top_p: 0.95,
            seed: 11,
            repetition_penalty: 1.2,
            frequency_penalty: 0.3,
            presence_penalty: 0.2,
        },
    ] {
        let mut settings = GenerationSettings {
            max_tokens: 20,
            sampling: sampling.clone(),
            stop_strings: Vec::new(),
            eos_token_ids: Vec::new(),
            speculation: longhaul_engine::generate::Speculation::Off,
            output: Default::default(),
            keep_special_tokens: false,
            answer_starts: Vec::new(),
        };
        let whole = engine
            .generate(&prompt, &settings, |_| Flow::Continue)
            .unwrap();
        // A stop string from the middle of the answer exercises text held back.
        let chars: Vec<char> = whole.text.chars().collect();
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
        settings.stop_strings = vec![stop];
        let whole = engine
            .generate(&prompt, &settings, |_| Flow::Continue)
            .unwrap();
        for cut in 1..=whole.tokens.len() {
            for with_state in [false, true] {
                let (before, resumed, after) =
                    cut_and_resume(engine, &prompt, &settings, cut, with_state);
                let what = format!("{sampling:?}, cut at {cut}, saved state {with_state}");
                assert_eq!(resumed.tokens, whole.tokens, "{what}");
                assert_eq!(resumed.text, whole.text, "{what}");
                assert_eq!(resumed.finish_reason, whole.finish_reason, "{what}");
                assert_eq!(
                    before + &after,
                    whole.text,
                    "nothing shown twice or lost: {what}"
                );
            }
        }
    }
}

#[test]
fn saved_attention_state_replaces_recomputing_the_answer() {
    let engine = Engine::open(&common::fixtures_dir().join("deepseek_v3_fp8")).unwrap();
    let prompt = engine.prompt_ids("Draft an architecture", false).unwrap();
    let settings = GenerationSettings {
        max_tokens: 12,
        sampling: SamplingParams::default(),
        stop_strings: Vec::new(),
        eos_token_ids: Vec::new(),
        speculation: longhaul_engine::generate::Speculation::Off,
        output: Default::default(),
        keep_special_tokens: false,
        answer_starts: Vec::new(),
    };
    let mut rows = Vec::new();
    let first = engine
        .generate_resumed(&prompt, &[], &[], &settings, |p| {
            if p.tokens_so_far == 8 {
                rows = p.session.snapshot_since(p.prompt_len).unwrap();
                return Flow::Stop;
            }
            Flow::Continue
        })
        .unwrap();
    assert_eq!(first.tokens.len(), 8);
    // The saved rows cover the 7 answer tokens fed before the 8th was chosen:
    // resuming feeds only the 8th, so its "prefill" is the prompt plus one.
    let resumed = engine
        .generate_resumed(&prompt, &first.tokens, &[rows.clone()], &settings, |_| {
            Flow::Continue
        })
        .unwrap();
    let whole = engine
        .generate(&prompt, &settings, |_| Flow::Continue)
        .unwrap();
    assert_eq!(resumed.tokens, whole.tokens);
    // Rows from a model with other attention widths are refused and the
    // answer is recomputed instead.
    let other = Engine::open(&common::fixtures_dir().join("kimi_k2_recent")).unwrap();
    let other_prompt = other.prompt_ids("Draft an architecture", false).unwrap();
    let other_first = other
        .generate_resumed(&other_prompt, &[], &[], &settings, |p| {
            if p.tokens_so_far == 8 {
                Flow::Stop
            } else {
                Flow::Continue
            }
        })
        .unwrap();
    let recomputed = other
        .generate_resumed(
            &other_prompt,
            &other_first.tokens,
            &[rows],
            &settings,
            |_| Flow::Continue,
        )
        .unwrap();
    let other_whole = other
        .generate(&other_prompt, &settings, |_| Flow::Continue)
        .unwrap();
    assert_eq!(recomputed.tokens, other_whole.tokens);
    let reason = recomputed.stats.restore_refused.expect("a reason");
    assert!(
        reason.contains("saved for 3 layers, the model has 2"),
        "{reason}"
    );
    assert_eq!(recomputed.stats.restored_positions, 0);
    assert_eq!(resumed.stats.restored_positions, 7);
}

/// gpt-oss as published (harmony's tokens, the release's template and
/// generation config): a scripted checkpoint answers in harmony's analysis
/// and final channels, as transformers' greedy generation does; the analysis
/// is the reasoning, the final message the answer, and `<|return|>` ends it,
/// from the folder and from its pack.
#[test]
fn gpt_oss_answers_in_harmony_channels_from_the_folder_and_a_pack() {
    use longhaul_engine::{ChatMessage, ChatOptions};
    let dir = common::fixtures_dir().join("gpt_oss_harmony");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let messages: Vec<ChatMessage> = serde_json::from_value(exp["chat_messages"].clone()).unwrap();
    let want_ids: Vec<u32> = serde_json::from_value(exp["chat_ids"].clone()).unwrap();
    let mut want_tokens: Vec<u32> = serde_json::from_value(exp["chat_tokens"].clone()).unwrap();
    // transformers keeps the token that ended the turn; Longhaul stops before it.
    let ended = want_tokens.pop().unwrap();
    let options = ChatOptions {
        now: exp["chat_now"].as_i64(),
        ..ChatOptions::generation()
    };
    let tmp = tempfile::tempdir().unwrap();
    let pack = common::pack_on_two_drives(&dir, tmp.path());
    for path in [&dir, &pack] {
        let engine = Engine::open(path).unwrap();
        let tok = engine.tokenizer().unwrap();
        assert_eq!(
            tok.render_chat_with(&messages, &options).unwrap(),
            exp["chat_text"].as_str().unwrap(),
            "{}: the published template renders as transformers renders it",
            path.display()
        );
        let chat = engine.chat_prompt(&messages, &options).unwrap();
        assert_eq!(chat.ids, want_ids, "{}", path.display());
        assert!(engine.eos_token_ids().contains(&ended));
        let settings = greedy(&engine, chat.output);
        let mut streamed = String::new();
        let out = engine
            .generate(&chat.ids, &settings, |t| {
                streamed.push_str(t);
                Flow::Continue
            })
            .unwrap();
        assert_eq!(out.tokens, want_tokens, "{}", path.display());
        assert_eq!(out.finish_reason, FinishReason::Eos);
        assert_eq!(out.reasoning, exp["chat_reasoning"].as_str().unwrap());
        assert_eq!(out.text, exp["chat_answer"].as_str().unwrap());
        assert_eq!(streamed, out.text, "only the answer streams as text");
    }
}
