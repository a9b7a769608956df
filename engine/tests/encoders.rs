//! Prompt encoders of releases without a chat template give the bytes the
//! release's own Python encoder gives (`encoding_dsv32.py`,
//! `encoding_dsv4.py`; fixtures by `tools/reference/make_encoder_fixtures.py`).

mod common;

use longhaul_engine::tokenizer::encoders::PromptEncoder;
use longhaul_engine::tokenizer::{ChatMessage, ChatOptions};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    encoder: String,
    name: String,
    thinking_mode: String,
    #[serde(default)]
    reasoning_effort: Option<String>,
    messages: Vec<ChatMessage>,
    expected: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

#[test]
fn deepseek_prompts_are_the_release_encoders_bytes() {
    let path = common::fixtures_dir().join("encoders/cases.json");
    let all: Cases = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for case in &all.cases {
        let encoder = match case.encoder.as_str() {
            "encoding_dsv32" => PromptEncoder::DeepseekV32,
            "encoding_dsv4" => PromptEncoder::DeepseekV4,
            other => panic!("no encoder {other}"),
        };
        let mut options = ChatOptions::generation();
        options
            .args
            .insert("thinking_mode".into(), case.thinking_mode.clone().into());
        if let Some(e) = &case.reasoning_effort {
            options
                .args
                .insert("reasoning_effort".into(), e.clone().into());
        }
        let label = format!(
            "{} {} {} {:?}",
            case.encoder, case.name, case.thinking_mode, case.reasoning_effort
        );
        let got = encoder.encode(&case.messages, &options);
        match (&case.expected, &case.error) {
            (Some(want), _) => assert_eq!(
                got.unwrap_or_else(|e| panic!("{label}: {e}")),
                *want,
                "{label}"
            ),
            (None, Some(kind)) => assert!(
                got.is_err(),
                "{label}: encoded, but the release raised {kind}"
            ),
            _ => panic!("{label}: neither output nor error"),
        }
        checked += 1;
    }
    assert_eq!(checked, all.cases.len());
    assert!(checked >= 30, "{checked} cases");
}

/// A release without a template is prompted through its family's encoder,
/// chosen by its `model_type`; one with a template keeps the template.
#[test]
fn folders_without_a_template_use_their_familys_encoder() {
    use longhaul_engine::tools::TextTokenizer;
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::user("Hi"),
    ];
    for (fixture, source, encoder) in [
        (
            "deepseek_v32_released",
            "encoding_dsv32",
            Some(PromptEncoder::DeepseekV32),
        ),
        (
            "deepseek_v4_released",
            "encoding_dsv4",
            Some(PromptEncoder::DeepseekV4),
        ),
        ("deepseek_v32_recent", "template", None),
    ] {
        let tok = TextTokenizer::from_dir(&common::fixtures_dir().join(fixture)).unwrap();
        assert_eq!(tok.prompt_source(), source, "{fixture}");
        let text = tok.render_chat(&messages, true).unwrap();
        if let Some(e) = encoder {
            assert_eq!(
                text,
                e.encode(&messages, &ChatOptions::generation()).unwrap()
            );
            assert!(
                text.starts_with("<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi"),
                "{text}"
            );
        }
    }
}
