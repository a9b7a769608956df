//! Tokenizers as model makers publish them, against their reference
//! implementations' output (committed; made by `tools/reference/`).

mod common;

use longhaul_engine::tools::TextTokenizer;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    text: Option<String>,
    repeat: Option<String>,
    times: Option<usize>,
    ids: Option<Vec<u32>>,
    count: Option<usize>,
    head: Option<Vec<u32>>,
    tail: Option<Vec<u32>>,
    fnv1a: Option<String>,
}

#[derive(Deserialize)]
struct Decode {
    ids: Vec<u32>,
    text: String,
}

#[derive(Deserialize)]
struct Expected {
    base_ranks: u32,
    cases: Vec<Case>,
    decodes: Vec<Decode>,
}

/// 64-bit FNV-1a over the ids as little-endian u32s, as the reference
/// script digests long encodings.
fn fnv1a(ids: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in ids.iter().flat_map(|i| i.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Kimi's `tiktoken.model` with its `tokenizer_config.json`: every text
/// encodes to the ids `TikTokenTokenizer.encode` gives (the `tiktoken`
/// package with Kimi's split and pieces), and decodes back to its bytes.
#[test]
fn kimi_tiktoken_encodes_as_tiktoken_does() {
    let dir = common::fixtures_dir().join("kimi_tiktoken");
    let tok = TextTokenizer::from_dir(&dir).unwrap();
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected_tokens.json")).unwrap())
            .unwrap();
    let (mut agreed, mut tried) = (0, 0);
    for case in &expected.cases {
        let text = match (&case.text, &case.repeat, case.times) {
            (Some(t), _, _) => t.clone(),
            (None, Some(r), Some(n)) => r.repeat(n),
            _ => panic!("a case names its text"),
        };
        let label: String = text.chars().take(24).collect();
        let ids = tok.encode(&text, true).unwrap();
        tried += 1;
        let same = match &case.ids {
            Some(want) => &ids == want,
            None => {
                let edge = case.head.as_ref().map_or(0, Vec::len);
                Some(ids.len()) == case.count
                    && case.head.as_deref() == Some(&ids[..edge])
                    && case.tail.as_deref() == Some(&ids[ids.len() - edge..])
                    && case.fnv1a.as_deref() == Some(fnv1a(&ids).as_str())
            }
        };
        assert!(same, "{label:?}: ids differ from tiktoken's");
        agreed += 1;
        assert_eq!(
            tok.decode_with_special(&ids).unwrap(),
            text,
            "{label:?} decodes back"
        );
    }
    assert_eq!(agreed, tried);
    for d in &expected.decodes {
        assert_eq!(
            tok.decode_with_special(&d.ids).unwrap(),
            d.text,
            "{:?}",
            d.ids
        );
    }
    // The special ids follow the base ranks, named by `added_tokens_decoder`.
    let base = expected.base_ranks;
    assert_eq!(tok.token_id("[BOS]"), Some(base));
    assert_eq!(tok.token_id("<|im_end|>"), Some(base + 2));
    assert_eq!(tok.token_id("[PAD]"), Some(base + 255));
    // Decoding for the answer leaves out special tokens but keeps the
    // tool-call markers, which are not special.
    let ids = tok
        .encode("<|im_end|>hi<|tool_call_begin|>", false)
        .unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), "hi<|tool_call_begin|>");
}

/// A folder with neither tokenizer names both files it looked for.
#[test]
fn a_folder_without_a_tokenizer_says_what_it_looked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let err = TextTokenizer::from_dir(tmp.path())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("tiktoken.model"),
        "{err}"
    );
    // A tiktoken vocabulary for another tokenizer class is refused by name.
    let dir = common::fixtures_dir().join("kimi_tiktoken");
    std::fs::copy(
        dir.join("tiktoken.model"),
        tmp.path().join("tiktoken.model"),
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("tokenizer_config.json"),
        r#"{"tokenizer_class": "QWenTokenizer"}"#,
    )
    .unwrap();
    let err = TextTokenizer::from_dir(tmp.path())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("QWenTokenizer"), "{err}");
}

/// Kimi K2 as Moonshot publishes it (`tiktoken.model`, `tokenizer_config.json`
/// naming the special ids, `chat_template.jinja`, no `tokenizer.json`): a
/// conversation with a tool call renders and tokenizes as transformers and
/// tiktoken do, from the folder and from a pack of it, which keeps the
/// vocabulary and template.
#[test]
fn a_kimi_folder_as_published_chats_from_the_folder_and_a_pack() {
    use longhaul_engine::Engine;
    use longhaul_engine::tokenizer::ChatMessage;
    let dir = common::fixtures_dir().join("kimi_k2_published");
    assert!(!dir.join("tokenizer.json").exists());
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let messages: Vec<ChatMessage> =
        serde_json::from_value(expected["chat_messages"].clone()).unwrap();
    let want: Vec<u32> = serde_json::from_value(expected["chat_ids"].clone()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let pack = common::pack_on_two_drives(&dir, tmp.path());
    assert!(pack.join("tiktoken.model").is_file() && pack.join("chat_template.jinja").is_file());
    for path in [&dir, &pack] {
        let engine = Engine::open(path).unwrap();
        let tok = engine.tokenizer().unwrap();
        assert_eq!(
            tok.render_chat(&messages, true).unwrap(),
            expected["chat_text"].as_str().unwrap(),
            "{}",
            path.display()
        );
        assert_eq!(
            engine.chat_ids(&messages).unwrap(),
            want,
            "{}",
            path.display()
        );
    }
}

/// A tokenizer.json whose decoder's JSON is broken (a stray byte before a
/// key) makes the tokenizers crate panic rather than fail: it is refused
/// with an error naming the file.
#[test]
fn a_broken_decoder_is_an_error_not_a_crash() {
    let dir = common::fixtures_dir().join("qwen3_moe_released");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    json["decoder"] = serde_json::json!({ "type": "ByteLevel", "marker": true });
    let text = json.to_string();
    let broken = text.replacen("\"marker\"", "x \"trim_offsets\"", 1);
    assert_ne!(text, broken);
    let err = TextTokenizer::from_parts(
        dir.as_path(),
        broken.as_bytes(),
        &serde_json::Value::Null,
        None,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        err.contains("tokenizer.json") && err.contains("cannot be read"),
        "{err}"
    );
}

/// A pre-tokenizer pattern that backtracks without end, as a hostile or
/// broken tokenizer.json may hold: the text that sets it off is refused
/// with an error naming the file, and the tokenizer goes on reading others.
#[test]
fn a_pattern_that_gives_up_is_an_error_not_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::fixtures_dir().join("qwen3_moe_released");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    json["pre_tokenizer"] = serde_json::json!({
        "type": "Split", "pattern": { "Regex": "(a+)+$" },
        "behavior": "Isolated", "invert": false,
    });
    std::fs::write(tmp.path().join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::copy(
        dir.join("tokenizer_config.json"),
        tmp.path().join("tokenizer_config.json"),
    )
    .unwrap();
    let tok = TextTokenizer::from_dir(tmp.path()).unwrap();
    let hostile = format!("{}b", "a".repeat(5000));
    let err = tok.encode(&hostile, false).err().map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(
        err.contains("tokenizer.json") && err.contains("gave up"),
        "{err}"
    );
    assert!(!tok.encode("hello", false).unwrap().is_empty());
}
