//! `tokenizer.ggml.*` as a Hugging Face `tokenizer.json`, so the tokenizer
//! that serves checkpoints serves GGUF files too.
//!
//! Byte-level BPE (`tokenizer.ggml.model = gpt2`) is the vocabulary, the
//! merges in rank order and a pre-tokenizer regex chosen by
//! `tokenizer.ggml.pre` — llama.cpp keeps one regex set per name, and the
//! names map to the expressions the original `tokenizer.json` files state.
//! Control and user-defined tokens are matched whole, as llama.cpp does
//! when it parses special tokens.

use serde_json::{Value, json};

use super::ImportError;
use crate::weights::gguf::{GgufFile, GgufValue};

/// llama.cpp's token types.
const TOKEN_CONTROL: u64 = 3;
const TOKEN_USER_DEFINED: u64 = 4;

/// SentencePiece vocabularies (Llama, Mistral, Mixtral).
const SPM: &str = "llama";
/// SentencePiece's word marker, which stands for a space.
const SPACE_MARK: &str = "\u{2581}";
/// llama.cpp's byte tokens (`<0x0A>`).
const TOKEN_BYTE: u64 = 6;
/// llama.cpp's default special ids for SentencePiece vocabularies.
const SPM_BOS: u64 = 1;
const SPM_EOS: u64 = 2;
const SPM_UNK: u64 = 0;

/// GPT-2's split, which `ByteLevel` applies itself (`use_regex`).
const GPT2: &str = "gpt2";
/// Qwen2/Qwen3's split (their `tokenizer.json`).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// o200k's split (gpt-oss; llama.cpp's `gpt-4o`).
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` names read, and their split (`None`: GPT-2's own).
/// llama.cpp's `default` is a split set of its own, not GPT-2's: refused.
const PRE_TOKENIZERS: [(&str, Option<&str>); 5] = [
    ("gpt-4o", Some(GPT4O_REGEX)),
    ("gpt-2", None),
    ("qwen2", Some(QWEN2_REGEX)),
    ("llama-bpe", Some(LLAMA3_REGEX)),
    ("llama3", Some(LLAMA3_REGEX)),
];

/// `tokenizer.json` and `tokenizer_config.json` for `file`.
pub fn tokenizer_json(file: &GgufFile) -> Result<(Value, Value), ImportError> {
    let key = |k: &str| file.metadata.get(k);
    let missing = |k: &str, needs: &'static str| ImportError::MissingKey {
        path: file.path.clone(),
        key: k.to_string(),
        needs,
    };
    let unsupported = |what: String| ImportError::Unsupported {
        path: file.path.clone(),
        what,
    };
    let model = key("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| missing("tokenizer.ggml.model", "it names the tokenizer's kind"))?;
    if model == SPM {
        return spm_json(file);
    }
    if model != GPT2 {
        return Err(unsupported(format!(
            "tokenizer.ggml.model `{model}` is not supported; byte-level BPE (`gpt2`) and SentencePiece (`llama`) are"
        )));
    }
    let pre = key("tokenizer.ggml.pre")
        .and_then(GgufValue::as_str)
        .unwrap_or("default");
    let split = PRE_TOKENIZERS
        .iter()
        .find(|(name, _)| *name == pre)
        .map(|(_, regex)| *regex)
        .ok_or_else(|| {
            let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|p| p.0).collect();
            unsupported(format!(
                "tokenizer.ggml.pre `{pre}` is not supported; supported: {}",
                known.join(", ")
            ))
        })?;
    let tokens = strings(file, "tokenizer.ggml.tokens")?
        .ok_or_else(|| missing("tokenizer.ggml.tokens", "it is the vocabulary"))?;
    let merges = strings(file, "tokenizer.ggml.merges")?.unwrap_or_default();
    let types = match key("tokenizer.ggml.token_type") {
        Some(GgufValue::Array(v)) => v.iter().map(|t| t.as_u64().unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (token, ty)) in tokens
        .iter()
        .zip(types.iter().chain(std::iter::repeat(&1)))
        .enumerate()
    {
        if *ty == TOKEN_CONTROL || *ty == TOKEN_USER_DEFINED {
            added.push(
                json!({"id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *ty == TOKEN_CONTROL}),
            );
        }
        vocab.insert(token.clone(), json!(id));
    }
    let id = |k: &str| key(k).and_then(GgufValue::as_u64);
    let token_text = |i: Option<u64>| i.and_then(|i| tokens.get(i as usize)).cloned();
    let bos = token_text(id("tokenizer.ggml.bos_token_id"));
    let eos = token_text(id("tokenizer.ggml.eos_token_id"));
    let add_bos = matches!(
        key("tokenizer.ggml.add_bos_token"),
        Some(GgufValue::Bool(true))
    );
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
        "use_regex": split.is_none()});
    let pre_tokenizer = match split {
        None => byte_level.clone(),
        Some(regex) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level.clone(),
        ]}),
    };
    let post_processor = match (&bos, add_bos) {
        (Some(b), true) => json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {b.as_str(): {"id": b, "ids": [id("tokenizer.ggml.bos_token_id")], "tokens": [b]}}}),
        _ => Value::Null,
    };
    let tokenizer = json!({
        "version": "1.0",
        "added_tokens": added,
        // llama.cpp normalises nothing before splitting; neither does this.
        "normalizer": Value::Null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    });
    let mut config = json!({"add_bos_token": add_bos});
    if let Some(t) = key("tokenizer.chat_template").and_then(GgufValue::as_str) {
        config["chat_template"] = json!(t);
    }
    if let Some(b) = bos {
        config["bos_token"] = json!(b);
    }
    if let Some(e) = eos {
        config["eos_token"] = json!(e);
    }
    Ok((tokenizer, config))
}

/// A SentencePiece vocabulary as llama.cpp tokenizes it: spaces become
/// `▁` and one is put before the text (`add_space_prefix`, default on);
/// then the adjacent pair whose joined text is the highest-scoring token is
/// merged, again and again; characters no token covers become byte tokens.
/// As BPE that is one merge per way of splitting each token in two, ranked
/// by the token's score (the rule transformers' converter uses).
fn spm_json(file: &GgufFile) -> Result<(Value, Value), ImportError> {
    let key = |k: &str| file.metadata.get(k);
    let tokens =
        strings(file, "tokenizer.ggml.tokens")?.ok_or_else(|| ImportError::MissingKey {
            path: file.path.clone(),
            key: "tokenizer.ggml.tokens".into(),
            needs: "it is the vocabulary",
        })?;
    let scores: Vec<f32> = match key("tokenizer.ggml.scores") {
        Some(GgufValue::Array(v)) => v
            .iter()
            .map(|s| match s {
                GgufValue::F32(f) => *f,
                _ => 0.0,
            })
            .collect(),
        _ => vec![0.0; tokens.len()],
    };
    let types: Vec<u64> = match key("tokenizer.ggml.token_type") {
        Some(GgufValue::Array(v)) => v.iter().map(|t| t.as_u64().unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };
    let ty = |i: usize| types.get(i).copied().unwrap_or(1);
    let id = |k: &str, default: u64| key(k).and_then(GgufValue::as_u64).unwrap_or(default);
    let flag = |k: &str, default: bool| match key(k) {
        Some(GgufValue::Bool(b)) => *b,
        _ => default,
    };
    let add_space_prefix = flag("tokenizer.ggml.add_space_prefix", true);
    let add_bos = flag("tokenizer.ggml.add_bos_token", true);
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), json!(i));
        if ty(i) == TOKEN_CONTROL || ty(i) == TOKEN_USER_DEFINED {
            added.push(
                json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty(i) == TOKEN_CONTROL}),
            );
        }
    }
    let text = |i: u64| tokens.get(i as usize).cloned();
    let (bos, eos, unk) = (
        text(id("tokenizer.ggml.bos_token_id", SPM_BOS)),
        text(id("tokenizer.ggml.eos_token_id", SPM_EOS)),
        text(id("tokenizer.ggml.unknown_token_id", SPM_UNK)),
    );
    let mergeable = |i: usize| ty(i) != TOKEN_CONTROL && ty(i) != TOKEN_BYTE;
    let merges = spm_merges(&tokens, &scores, mergeable);
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": SPACE_MARK}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE_MARK}));
    let post_processor = match (&bos, add_bos) {
        (Some(b), true) => json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {b.as_str(): {"id": b, "ids": [id("tokenizer.ggml.bos_token_id", SPM_BOS)], "tokens": [b]}}}),
        _ => Value::Null,
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE_MARK}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let tokenizer = json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    });
    let mut config = json!({"add_bos_token": add_bos});
    if let Some(t) = key("tokenizer.chat_template").and_then(GgufValue::as_str) {
        config["chat_template"] = json!(t);
    }
    if let Some(b) = bos {
        config["bos_token"] = json!(b);
    }
    if let Some(e) = eos {
        config["eos_token"] = json!(e);
    }
    Ok((tokenizer, config))
}

/// Every `[left, right]` pair of tokens that joins into a token, highest
/// joined score first (ties: lower left id, then lower right id).
fn spm_merges(tokens: &[String], scores: &[f32], mergeable: impl Fn(usize) -> bool) -> Vec<Value> {
    let ids: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| mergeable(*i))
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f32, usize, usize)> = Vec::new();
    for (i, t) in tokens.iter().enumerate().filter(|(i, _)| mergeable(*i)) {
        for (at, _) in t.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (ids.get(&t[..at]), ids.get(&t[at..])) {
                merges.push((scores.get(i).copied().unwrap_or(0.0), l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges
        .into_iter()
        .map(|(_, l, r)| json!([tokens[l], tokens[r]]))
        .collect()
}

/// An array of strings at `key`, if present.
fn strings(file: &GgufFile, key: &str) -> Result<Option<Vec<String>>, ImportError> {
    match file.metadata.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(|| ImportError::BadKey {
                path: file.path.clone(),
                key: key.to_string(),
                found: "an array holding non-strings".to_string(),
                expected: "an array of strings",
            }),
        Some(v) => Err(ImportError::BadKey {
            path: file.path.clone(),
            key: key.to_string(),
            found: format!("{v:?}"),
            expected: "an array of strings",
        }),
    }
}
