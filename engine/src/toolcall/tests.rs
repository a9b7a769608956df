//! Each family's format read from answers written as the family writes
//! them (the examples of its template's tool prompt and vLLM's parser tests).

use serde_json::{Value, json};

use super::*;

fn weather_tools() -> Vec<Value> {
    vec![json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": { "city": { "type": "string" }, "days": { "type": "integer" } },
            },
        },
    })]
}

fn read(format: ToolFormat, text: &str) -> ToolAnswer {
    format.parse(text, &weather_tools()).unwrap()
}

fn args(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap()
}

#[test]
fn kimi_keeps_the_id_it_wrote() {
    let text = "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Beijing\"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Shanghai\"}<|tool_call_end|><|tool_calls_section_end|>";
    let a = read(ToolFormat::Kimi, text);
    assert_eq!(a.content, "Let me look.");
    assert_eq!(a.calls.len(), 2);
    assert_eq!(
        (a.calls[1].id.as_str(), a.calls[1].name.as_str()),
        ("functions.get_weather:1", "get_weather")
    );
    assert_eq!(args(&a.calls[1]), json!({ "city": "Shanghai" }));
}

#[test]
fn deepseek_v31_and_v3_tool_tokens() {
    let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Hangzhou\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let a = read(ToolFormat::DeepseekTokens, v31);
    assert_eq!(
        (a.content.as_str(), a.calls[0].name.as_str()),
        ("", "get_weather")
    );
    assert_eq!(args(&a.calls[0]), json!({ "city": "Hangzhou" }));
    let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Hangzhou\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(read(ToolFormat::DeepseekTokens, v3).calls, a.calls);
}

#[test]
fn dsml_strings_stay_text_and_the_rest_is_json() {
    let text = "Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">杭州</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
    let a = read(ToolFormat::Dsml, text);
    assert_eq!(a.content, "Checking.");
    assert_eq!(args(&a.calls[0]), json!({ "city": "杭州", "days": 3 }));
    // V4 names the block tool_calls.
    let v4 = text.replace("function_calls", "tool_calls");
    assert_eq!(read(ToolFormat::Dsml, &v4).calls, a.calls);
}

#[test]
fn hermes_json_blocks_and_an_unclosed_last_one() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Beijing\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}";
    let a = read(ToolFormat::Hermes, text);
    assert_eq!(a.calls.len(), 2);
    assert_eq!(a.calls[0].id, "call_0");
    assert_eq!(args(&a.calls[1]), json!({ "city": "Paris" }));
}

#[test]
fn qwen_xml_values_are_typed_by_the_schema() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let a = read(ToolFormat::QwenXml, text);
    // `city` is a string in the schema: its digits stay text.
    assert_eq!(args(&a.calls[0]), json!({ "city": "123", "days": 3 }));
}

#[test]
fn glm_with_and_without_newlines() {
    let spaced = "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
    let compact = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>";
    let a = read(ToolFormat::Glm, spaced);
    assert_eq!(a.calls, read(ToolFormat::Glm, compact).calls);
    assert_eq!(args(&a.calls[0]), json!({ "city": "Beijing", "days": 3 }));
    let bare = read(ToolFormat::Glm, "<tool_call>list_files</tool_call>");
    assert_eq!(
        (
            bare.calls[0].name.as_str(),
            bare.calls[0].arguments.as_str()
        ),
        ("list_files", "{}")
    );
}

#[test]
fn minimax_invokes_in_either_quote() {
    let text = "Sure.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Beijing</parameter>\n<parameter name='days'>3</parameter>\n</invoke>\n</minimax:tool_call>";
    let a = read(ToolFormat::Minimax, text);
    assert_eq!(a.content, "Sure.");
    assert_eq!(args(&a.calls[0]), json!({ "city": "Beijing", "days": 3 }));
}

#[test]
fn harmony_calls_as_the_splitter_writes_them() {
    let text =
        "Checking.<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Paris\"}";
    let a = read(ToolFormat::Harmony, text);
    assert_eq!(
        (a.content.as_str(), a.calls[0].name.as_str()),
        ("Checking.", "get_weather")
    );
    assert_eq!(args(&a.calls[0]), json!({ "city": "Paris" }));
}

#[test]
fn text_without_a_call_is_all_content_and_a_broken_call_is_named() {
    for format in [
        ToolFormat::Kimi,
        ToolFormat::Dsml,
        ToolFormat::Hermes,
        ToolFormat::Glm,
    ] {
        let a = read(format, "No tools needed: 4.");
        assert_eq!(
            (a.content.as_str(), a.calls.len()),
            ("No tools needed: 4.", 0)
        );
    }
    let broken = ToolFormat::Hermes.parse(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"",
        &[],
    );
    let e = broken.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("hermes tool call: call 0 is not JSON"), "{e}");
    let e = ToolFormat::Glm
        .parse("<tool_call>get_weather<arg_key>city</arg_key>", &[])
        .err();
    assert!(e.is_some_and(|e| e.reason.contains("no </tool_call>")));
    let e = ToolFormat::Kimi
        .parse(
            "<|tool_calls_section_begin|><|tool_calls_section_end|>",
            &[],
        )
        .err();
    assert!(e.is_some_and(|e| e.reason == "a call block holds no complete call"));
}

#[test]
fn a_stream_holds_back_only_what_could_open_a_call() {
    let f = ToolFormat::Hermes;
    assert_eq!(f.held_back("The answer <tool"), "<tool".len());
    assert_eq!(f.held_back("The answer <b>"), 0);
    assert_eq!(f.held_back("<"), 1);
    assert_eq!(f.held_back(""), 0);
    // A multi-byte opener is held back only at its character boundaries.
    let d = ToolFormat::DeepseekTokens;
    assert_eq!(d.held_back("x<｜tool▁"), "<｜tool▁".len());
    assert_eq!(f.call_start("a <tool_call>"), Some(2));
}

/// A tokenizer whose template writes `template`, over a fixture's vocabulary.
fn with_template(template: &str) -> TextTokenizer {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_moe_released");
    let json = std::fs::read(dir.join("tokenizer.json")).unwrap();
    TextTokenizer::from_parts(&dir, &json, &json!({}), Some(template.to_string())).unwrap()
}

#[test]
fn the_format_follows_the_template_and_vocabulary() {
    for (template, format) in [
        (
            "{{ '<|tool_calls_section_begin|>' }}",
            Some(ToolFormat::Kimi),
        ),
        ("{{ '<｜DSML｜function_calls>' }}", Some(ToolFormat::Dsml)),
        (
            "{{ '<｜tool▁calls▁begin｜>' }}",
            Some(ToolFormat::DeepseekTokens),
        ),
        ("{{ '<minimax:tool_call>' }}", Some(ToolFormat::Minimax)),
        (
            "{{ '<tool_call>' }}{{ '<arg_key>' }}",
            Some(ToolFormat::Glm),
        ),
        ("{{ '<tool_call>\n<function=' }}", Some(ToolFormat::QwenXml)),
        ("{{ '<tool_call>' }}", Some(ToolFormat::Hermes)),
        ("{{ messages[0].content }}", None),
    ] {
        assert_eq!(
            ToolFormat::detect(&with_template(template)),
            format,
            "{template}"
        );
    }
}

#[test]
fn gpt_oss_speaks_harmony_calls() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt_oss_harmony");
    let tok = TextTokenizer::from_dir(&dir).unwrap();
    assert_eq!(ToolFormat::detect(&tok), Some(ToolFormat::Harmony));
}

/// Answers as each family writes them, with more than one call where the
/// format allows, nested JSON and values that hold the format's own marks.
fn streamed_answers() -> Vec<(ToolFormat, &'static str)> {
    vec![
        (
            ToolFormat::Kimi,
            "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Beijing\", \"opts\": {\"days\": [1, 2]}} <|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Shanghai\"}<|tool_call_end|><|tool_calls_section_end|>",
        ),
        (
            ToolFormat::DeepseekTokens,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Hangzhou\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"杭州\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolFormat::DeepseekTokens,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Hangzhou\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolFormat::Dsml,
            "Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">杭州</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a}\", \"opts\": {\"x\": [1, {\"y\": 2}]}}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}",
        ),
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
        ),
        (
            ToolFormat::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
        ),
        (
            ToolFormat::Glm,
            "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call><tool_call>list_files</tool_call>",
        ),
        (
            ToolFormat::Glm,
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
        ),
        (
            ToolFormat::Minimax,
            "Sure.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Beijing</parameter>\n<parameter name='days'>3</parameter>\n</invoke>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo</parameter>\n</invoke>\n</minimax:tool_call>",
        ),
        (
            ToolFormat::Harmony,
            "Checking.<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Paris\", \"days\": 2}<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Nice\"}",
        ),
    ]
}

/// What a stream sends cannot be taken back: over every prefix of an
/// answer, the calls so far name the final calls, all but the last are
/// whole, the last one's arguments are a prefix of its final arguments,
/// and each reading extends the one before.
#[test]
fn calls_read_while_written_are_prefixes_of_the_whole_answer() {
    for (format, text) in streamed_answers() {
        let whole = read(format, text).calls;
        let mut before: Vec<ToolCall> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            let now = format.partial(&text[..cut], &weather_tools());
            let at = || format!("{} at {cut}: {:?}", format.name(), &text[..cut]);
            assert!(
                now.len() <= whole.len() && now.len() >= before.len(),
                "{}",
                at()
            );
            for (k, call) in now.iter().enumerate() {
                let last = k + 1 == now.len();
                assert_eq!(
                    (&call.id, &call.name),
                    (&whole[k].id, &whole[k].name),
                    "{}",
                    at()
                );
                assert!(last || call == &whole[k], "{}", at());
                assert!(whole[k].arguments.starts_with(&call.arguments), "{}", at());
                if let Some(b) = before.get(k) {
                    assert!(call.arguments.starts_with(&b.arguments), "{}", at());
                }
            }
            seen.extend(now.first().map(|c| c.arguments.clone()));
            before = now;
        }
        assert_eq!(before.len(), whole.len(), "{}", format.name());
        // V3's fenced arguments and an empty object come whole; the rest
        // arrive in pieces.
        let pieces = if text.contains("```") || text.contains("{}") {
            2
        } else {
            4
        };
        assert!(seen.len() >= pieces, "{}: {seen:?}", format.name());
    }
}

#[test]
fn json_arguments_are_kept_as_written() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":  \"Paris\"}}\n</tool_call>";
    let a = read(ToolFormat::Hermes, text);
    assert_eq!(a.calls[0].arguments, "{\"city\":  \"Paris\"}");
    let xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n";
    let now = ToolFormat::QwenXml.partial(xml, &weather_tools());
    assert_eq!(now[0].arguments, "{\"city\":\"Paris\"");
}
