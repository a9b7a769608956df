//! Chat templates render byte for byte as transformers renders them
//! (`render_jinja_template`, committed by
//! `tools/reference/make_template_fixtures.py`): Python's printing, its
//! `tojson`, `strftime_now(format)`, `dict`, namespaces, loop controls,
//! list and string methods, switches, and the errors it raises.

mod common;

use longhaul_engine::tokenizer::{ChatMessage, ChatOptions, ChatTemplate, TextTokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    template: String,
    args: serde_json::Map<String, serde_json::Value>,
    add_generation_prompt: bool,
    expected: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Cases {
    now: i64,
    bos_token: String,
    eos_token: String,
    messages: Vec<ChatMessage>,
    cases: Vec<Case>,
}

fn cases() -> Cases {
    let path = common::fixtures_dir().join("templates/cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let all = cases();
    let mut agreed = 0;
    for case in &all.cases {
        let options = ChatOptions {
            add_generation_prompt: case.add_generation_prompt,
            args: case.args.clone(),
            now: Some(all.now),
        };
        let got = ChatTemplate::new(case.template.clone()).render(
            &all.messages,
            &options,
            Some(&all.bos_token),
            Some(&all.eos_token),
        );
        let label = format!(
            "{} (generation prompt: {})",
            case.name, case.add_generation_prompt
        );
        match (&case.expected, &case.error) {
            (Some(want), _) => {
                let got = got.unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_eq!(&got, want, "{label}");
            }
            (None, Some(kind)) => {
                let err = got
                    .err()
                    .unwrap_or_else(|| panic!("{label}: rendered, but transformers raised {kind}"))
                    .to_string();
                if case.name == "list_append_refused" {
                    assert!(err.contains("append"), "{label}: {err}");
                } else {
                    assert!(
                        err.contains("System messages are not supported"),
                        "{label}: {err}"
                    );
                }
            }
            _ => panic!("{label}: the case has neither output nor error"),
        }
        agreed += 1;
    }
    assert_eq!(agreed, all.cases.len());
}

/// `chat_template.json` (a processor's legacy file) is read when the
/// tokenizer has no template of its own; `chat_template.jinja` wins over it.
#[test]
fn chat_template_json_is_read_after_the_tokenizers_own() {
    let tmp = tempfile::tempdir().unwrap();
    let demo = common::fixtures_dir().join("qwen3_moe_recent");
    std::fs::copy(
        demo.join("tokenizer.json"),
        tmp.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(tmp.path().join("tokenizer_config.json"), "{}").unwrap();
    let json_template =
        r#"{"chat_template": "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"}"#;
    std::fs::write(tmp.path().join("chat_template.json"), json_template).unwrap();
    let tok = TextTokenizer::from_dir(tmp.path()).unwrap();
    let hi = [ChatMessage::user("hi")];
    assert_eq!(tok.render_chat(&hi, false).unwrap(), "[user]hi");
    std::fs::write(
        tmp.path().join("chat_template.jinja"),
        "<{{ messages[0].content }}>",
    )
    .unwrap();
    let tok = TextTokenizer::from_dir(tmp.path()).unwrap();
    assert_eq!(tok.render_chat(&hi, false).unwrap(), "<hi>");
    std::fs::write(tmp.path().join("chat_template.json"), "[1]").unwrap();
    std::fs::remove_file(tmp.path().join("chat_template.jinja")).unwrap();
    let err = TextTokenizer::from_dir(tmp.path())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("chat_template.json"), "{err}");
}

/// The fuel that bounds a template's work and memory leaves every real
/// template room for a long agent session: 1,000 messages of 2 KiB each,
/// with every fixture's own template.
#[test]
fn every_fixture_template_renders_a_long_conversation_within_its_fuel() {
    let text = "word ".repeat(400);
    let messages: Vec<ChatMessage> = (0..1000)
        .map(|i| ChatMessage {
            role: if i % 2 == 0 { "user" } else { "assistant" }.to_string(),
            content: text.clone(),
            extra: serde_json::Map::new(),
        })
        .collect();
    let mut rendered = 0;
    for entry in std::fs::read_dir(common::fixtures_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(tok) = TextTokenizer::from_dir(&dir) else {
            continue;
        };
        match tok.render_chat(&messages, true) {
            Ok(prompt) => assert!(prompt.len() > 1000 * 2000, "{}", dir.display()),
            Err(e) if e.to_string().contains("no chat template") => continue,
            // Templates that refuse a conversation's shape say so by name.
            Err(e) => assert!(!e.to_string().contains("fuel"), "{}: {e}", dir.display()),
        }
        rendered += 1;
    }
    assert!(rendered >= 10, "{rendered} templates");
}
