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

/// DeepSeek-V3's three splits, applied one after another (digits in threes,
/// runs of CJK, then words and punctuation).
const DEEPSEEK3_REGEXES: &[&str] = &[
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// Kimi K2's split: o200k's with runs of Han characters kept apart.
const KIMI_K2_REGEX: &str = crate::tokenizer::tiktoken::KIMI_PATTERN;

/// `tokenizer.ggml.pre` names read, and their splits, applied in order
/// (none: GPT-2's own, which `ByteLevel` applies). llama.cpp's `default` is
/// a split set of its own, not GPT-2's: refused.
const PRE_TOKENIZERS: [(&str, &[&str]); 7] = [
    ("kimi-k2", &[KIMI_K2_REGEX]),
    ("gpt-4o", &[GPT4O_REGEX]),
    ("gpt-2", &[]),
    ("qwen2", &[QWEN2_REGEX]),
    ("llama-bpe", &[LLAMA3_REGEX]),
    ("llama3", &[LLAMA3_REGEX]),
    ("deepseek-v3", DEEPSEEK3_REGEXES),
];

/// A GGUF vocabulary as both tokenizer kinds read it.
struct Vocab<'a> {
    file: &'a GgufFile,
    tokens: Vec<String>,
    types: Vec<u64>,
}

impl<'a> Vocab<'a> {
    fn read(file: &'a GgufFile) -> Result<Self, ImportError> {
        let tokens =
            strings(file, "tokenizer.ggml.tokens")?.ok_or_else(|| ImportError::MissingKey {
                path: file.path.clone(),
                key: "tokenizer.ggml.tokens".into(),
                needs: "it is the vocabulary",
            })?;
        let types = match file.metadata.get("tokenizer.ggml.token_type") {
            Some(GgufValue::Array(v)) => v.iter().map(|t| t.as_u64().unwrap_or(1)).collect(),
            _ => Vec::new(),
        };
        Ok(Self {
            file,
            tokens,
            types,
        })
    }

    /// Every token and its id, as `tokenizer.json`'s `vocab`.
    fn ids(&self) -> serde_json::Map<String, Value> {
        self.tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), json!(i)))
            .collect()
    }

    fn key(&self, k: &str) -> Option<&GgufValue> {
        self.file.metadata.get(k)
    }

    fn ty(&self, i: usize) -> u64 {
        self.types.get(i).copied().unwrap_or(1)
    }

    fn flag(&self, k: &str, default: bool) -> bool {
        match self.key(k) {
            Some(GgufValue::Bool(b)) => *b,
            _ => default,
        }
    }

    /// Token `id_key`'s id (or `default`) and text.
    fn special(&self, id_key: &str, default: Option<u64>) -> Option<(u64, String)> {
        let id = self.key(id_key).and_then(GgufValue::as_u64).or(default)?;
        Some((id, self.tokens.get(id as usize)?.clone()))
    }

    /// `tokenizer.json` around `model`, with the control and user-defined
    /// tokens matched whole, a BOS put first when `add_bos`, and the
    /// matching `tokenizer_config.json`.
    fn finish(
        &self,
        model: Value,
        [normalizer, pre_tokenizer, decoder]: [Value; 3],
        bos: Option<(u64, String)>,
        eos: Option<(u64, String)>,
        add_bos: bool,
    ) -> (Value, Value) {
        let added: Vec<Value> = (0..self.tokens.len())
            .filter(|&i| matches!(self.ty(i), TOKEN_CONTROL | TOKEN_USER_DEFINED))
            .map(|i| {
                json!({"id": i, "content": self.tokens[i], "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": self.ty(i) == TOKEN_CONTROL})
            })
            .collect();
        let post_processor = match (&bos, add_bos) {
            (Some((id, b)), true) => json!({"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {b.as_str(): {"id": b, "ids": [id], "tokens": [b]}}}),
            _ => Value::Null,
        };
        let tokenizer = json!({
            "version": "1.0",
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": decoder,
            "model": model,
        });
        let mut config = json!({"add_bos_token": add_bos});
        if let Some(t) = self
            .key("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
        {
            config["chat_template"] = json!(t);
        }
        if let Some((_, b)) = bos {
            config["bos_token"] = json!(b);
        }
        if let Some((_, e)) = eos {
            config["eos_token"] = json!(e);
        }
        (tokenizer, config)
    }
}

/// `tokenizer.json` and `tokenizer_config.json` for `file`.
pub fn tokenizer_json(file: &GgufFile) -> Result<(Value, Value), ImportError> {
    let unsupported = |what: String| ImportError::Unsupported {
        path: file.path.clone(),
        what,
    };
    let model = file
        .metadata
        .get("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| ImportError::MissingKey {
            path: file.path.clone(),
            key: "tokenizer.ggml.model".into(),
            needs: "it names the tokenizer's kind",
        })?;
    match model {
        SPM => spm_json(&Vocab::read(file)?),
        GPT2 => bpe_json(&Vocab::read(file)?),
        other => Err(unsupported(format!(
            "tokenizer.ggml.model `{other}` is not supported; byte-level BPE (`gpt2`) and SentencePiece (`llama`) are"
        ))),
    }
}

/// Byte-level BPE: the merges in rank order, split first by the regex
/// `tokenizer.ggml.pre` names.
fn bpe_json(v: &Vocab) -> Result<(Value, Value), ImportError> {
    let pre = v
        .key("tokenizer.ggml.pre")
        .and_then(GgufValue::as_str)
        .unwrap_or("default");
    let splits = PRE_TOKENIZERS
        .iter()
        .find(|(name, _)| *name == pre)
        .map(|(_, regexes)| *regexes)
        .ok_or_else(|| {
            let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|p| p.0).collect();
            ImportError::Unsupported {
                path: v.file.path.clone(),
                what: format!(
                    "tokenizer.ggml.pre `{pre}` is not supported; supported: {}",
                    known.join(", ")
                ),
            }
        })?;
    let merges = strings(v.file, "tokenizer.ggml.merges")?.unwrap_or_default();
    let vocab = v.ids();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
        "use_regex": splits.is_empty()});
    let pre_tokenizer = if splits.is_empty() {
        byte_level
    } else {
        let mut steps: Vec<Value> = splits
            .iter()
            .map(|regex| {
                json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
                    "invert": false})
            })
            .collect();
        steps.push(byte_level);
        json!({"type": "Sequence", "pretokenizers": steps})
    };
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
        "use_regex": false});
    let model = json!({"type": "BPE", "dropout": null, "unk_token": null,
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
        "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges});
    let bos = v.special("tokenizer.ggml.bos_token_id", None);
    let eos = v.special("tokenizer.ggml.eos_token_id", None);
    let add_bos = v.flag("tokenizer.ggml.add_bos_token", false);
    // llama.cpp normalises nothing before splitting; neither does this.
    let parts = [Value::Null, pre_tokenizer, decoder];
    Ok(v.finish(model, parts, bos, eos, add_bos))
}

/// A SentencePiece vocabulary as llama.cpp tokenizes it: spaces become
/// `▁` and one is put before the text (`add_space_prefix`, default on);
/// then the adjacent pair whose joined text is the highest-scoring token is
/// merged, again and again; characters no token covers become byte tokens.
/// As BPE that is one merge per way of splitting each token in two, ranked
/// by the token's score (the rule transformers' converter uses).
fn spm_json(v: &Vocab) -> Result<(Value, Value), ImportError> {
    let scores: Vec<f32> = match v.key("tokenizer.ggml.scores") {
        Some(GgufValue::Array(s)) => s
            .iter()
            .map(|s| match s {
                GgufValue::F32(f) => *f,
                _ => 0.0,
            })
            .collect(),
        _ => Vec::new(),
    };
    let add_space_prefix = v.flag("tokenizer.ggml.add_space_prefix", true);
    let vocab = v.ids();
    let unk = v.special("tokenizer.ggml.unknown_token_id", Some(SPM_UNK));
    let mergeable = |i: usize| v.ty(i) != TOKEN_CONTROL && v.ty(i) != TOKEN_BYTE;
    let merges = spm_merges(&v.tokens, &scores, mergeable);
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": SPACE_MARK}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE_MARK}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE_MARK}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let model = json!({"type": "BPE", "dropout": null, "unk_token": unk.map(|(_, t)| t),
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
        "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges});
    let parts = [
        json!({"type": "Sequence", "normalizers": normalizers}),
        Value::Null,
        json!({"type": "Sequence", "decoders": decoders}),
    ];
    let bos = v.special("tokenizer.ggml.bos_token_id", Some(SPM_BOS));
    let eos = v.special("tokenizer.ggml.eos_token_id", Some(SPM_EOS));
    let add_bos = v.flag("tokenizer.ggml.add_bos_token", true);
    Ok(v.finish(model, parts, bos, eos, add_bos))
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
