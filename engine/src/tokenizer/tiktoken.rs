//! Tiktoken vocabularies as Moonshot publishes them for Kimi (K2, K2.5,
//! Kimi-Linear, K3): `tiktoken.model` holds the base ranks (a base64 token
//! and its rank per line, 163,584 of them), and `tokenization_kimi.py`
//! (`tokenizer_class: TikTokenTokenizer`) adds the split pattern and the
//! special ids right after the base ranks, named by `tokenizer_config.json`'s
//! `added_tokens_decoder` and `<|reserved_token_ID|>` where unnamed. These
//! folders carry no `tokenizer.json`, so without this reader the model line
//! Longhaul is built for could not tokenize at all.
//!
//! Encoding follows `TikTokenTokenizer.encode`: the text is cut into pieces of
//! at most 400,000 characters, each cut again where a run of whitespace or of
//! non-whitespace (Python's `str.isspace`) passes 25,000 characters, and every
//! piece is encoded by tiktoken's own engine (the `tiktoken-rs` port of its
//! core) with every special token allowed. No BOS is added. Decoding writes
//! each token's bytes and replaces invalid UTF-8, as tiktoken's `decode` does.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use base64::Engine as _;
use rustc_hash::FxHashMap;
use serde_json::Value;
use tiktoken_rs::CoreBPE;

use super::TokenizerError;

/// The vocabulary file.
pub const TIKTOKEN_FILE: &str = "tiktoken.model";
/// Moonshot's Python tokenizer, read only to tell its versions apart.
pub const KIMI_TOKENIZER_CODE: &str = "tokenization_kimi.py";
/// The `tokenizer_class` this reader implements.
pub const KIMI_TOKENIZER_CLASS: &str = "TikTokenTokenizer";

/// Kimi's split: o200k's with runs of Han characters kept apart (the
/// `pat_str` of `tokenization_kimi.py`, identical in every release).
pub const KIMI_PATTERN: &str = r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special ids reserved after the base ranks (`num_reserved_special_tokens`).
const RESERVED_SPECIALS: u32 = 256;
/// Kimi-Linear's `tokenization_kimi.py` reserves two more (`+ 2`), which
/// its file says in these words.
const TWO_MORE_RESERVED: &str = "self.num_reserved_special_tokens + 2";
/// `TIKTOKEN_MAX_ENCODE_CHARS`: the longest piece handed to tiktoken.
const MAX_ENCODE_CHARS: usize = 400_000;
/// `MAX_NO_WHITESPACES_CHARS`: the longest run of one kind within a piece.
const MAX_RUN_CHARS: usize = 25_000;
/// Largest `tiktoken.model` read (Kimi's is 2.8 MB, o200k's 3.6 MB).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// A special token: its text and whether decoding skips it.
#[derive(Debug, Clone, PartialEq)]
struct Special {
    name: String,
    /// `"special": true` in `added_tokens_decoder` (the tool-call markers
    /// and `<think>` are `false`: they stay in decoded text).
    skipped: bool,
}

pub struct Tiktoken {
    bpe: CoreBPE,
    /// Rank → token bytes.
    tokens: Vec<Vec<u8>>,
    specials: BTreeMap<u32, Special>,
    by_name: HashMap<String, u32>,
}

impl Tiktoken {
    /// Reads `tiktoken.model` from `dir`, with the special tokens that
    /// `config` (`tokenizer_config.json`) names.
    pub fn from_dir(dir: &Path, config: &Value) -> Result<Self, TokenizerError> {
        let path = dir.join(TIKTOKEN_FILE);
        let invalid = |reason: String| TokenizerError::Invalid {
            path: path.clone(),
            reason,
        };
        let class = config.get("tokenizer_class").and_then(Value::as_str);
        if class != Some(KIMI_TOKENIZER_CLASS) {
            return Err(TokenizerError::Invalid {
                path: dir.join(super::TOKENIZER_CONFIG_FILE),
                reason: format!(
                    "`tokenizer_class` is {}; a `{TIKTOKEN_FILE}` is read for Kimi's `{KIMI_TOKENIZER_CLASS}` only",
                    class.map_or("missing".to_string(), |c| format!("`{c}`"))
                ),
            });
        }
        let text = read_limited(&path)?;
        let tokens = parse_ranks(&text).map_err(invalid)?;
        let reserved = RESERVED_SPECIALS + if two_more_reserved(dir)? { 2 } else { 0 };
        let specials = specials(config, tokens.len() as u32, reserved).map_err(|reason| {
            TokenizerError::Invalid {
                path: dir.join(super::TOKENIZER_CONFIG_FILE),
                reason,
            }
        })?;
        Self::new(tokens, specials).map_err(invalid)
    }

    fn new(tokens: Vec<Vec<u8>>, specials: BTreeMap<u32, Special>) -> Result<Self, String> {
        let encoder: FxHashMap<Vec<u8>, u32> = tokens
            .iter()
            .enumerate()
            .map(|(rank, bytes)| (bytes.clone(), rank as u32))
            .collect();
        let by_name: HashMap<String, u32> = specials
            .iter()
            .map(|(&id, s)| (s.name.clone(), id))
            .collect();
        let special_encoder: FxHashMap<String, u32> =
            by_name.iter().map(|(k, &v)| (k.clone(), v)).collect();
        let bpe = CoreBPE::new(encoder, special_encoder, KIMI_PATTERN)
            .map_err(|e| format!("the split pattern does not compile: {e}"))?;
        Ok(Self {
            bpe,
            tokens,
            specials,
            by_name,
        })
    }

    /// Ids of `text`, special tokens in it matched whole.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let allowed = self.bpe.special_tokens();
        let mut ids = Vec::new();
        for piece in pieces(text) {
            let (part, _) = self
                .bpe
                .encode(piece, &allowed)
                .map_err(|e| TokenizerError::Encode(e.message))?;
            ids.extend(part);
        }
        Ok(ids)
    }

    /// Ids of `text` with special tokens' text encoded as ordinary text
    /// (`allow_special_tokens=False`): for what users and tools wrote.
    pub fn encode_ordinary(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        let none = std::collections::HashSet::new();
        for piece in pieces(text) {
            let (part, _) = self
                .bpe
                .encode(piece, &none)
                .map_err(|e| TokenizerError::Encode(e.message))?;
            ids.extend(part);
        }
        Ok(ids)
    }

    /// The text of `ids`; `skip_special` leaves out the special tokens
    /// marked special.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if let Some(token) = self.tokens.get(id as usize) {
                bytes.extend_from_slice(token);
            } else if let Some(s) = self.specials.get(&id) {
                if !(skip_special && s.skipped) {
                    bytes.extend_from_slice(s.name.as_bytes());
                }
            } else {
                return Err(TokenizerError::Decode(format!(
                    "token id {id} is outside the vocabulary of {}",
                    self.vocab_size()
                )));
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Ids in the vocabulary: base ranks and reserved special ids.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len() + self.specials.len()
    }

    /// The id of a special token, or of a base token given in the
    /// byte-level spelling Hugging Face vocabularies use (`Ġthe`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        if let Some(&id) = self.by_name.get(token) {
            return Some(id);
        }
        let bytes = byte_level_bytes(token)?;
        self.tokens
            .iter()
            .position(|t| *t == bytes)
            .map(|rank| rank as u32)
    }

    /// The vocabulary as Hugging Face spells it (`get_vocab`): base tokens
    /// in GPT-2's byte-level alphabet, special tokens by name.
    pub fn vocab(&self) -> HashMap<String, u32> {
        let alphabet = byte_level_alphabet();
        let mut vocab: HashMap<String, u32> = self
            .tokens
            .iter()
            .enumerate()
            .map(|(rank, bytes)| {
                let text = bytes.iter().map(|&b| alphabet[b as usize]).collect();
                (text, rank as u32)
            })
            .collect();
        vocab.extend(self.by_name.iter().map(|(k, &v)| (k.clone(), v)));
        vocab
    }
}

fn read_limited(path: &Path) -> Result<String, TokenizerError> {
    let io = |source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return Err(TokenizerError::Invalid {
            path: path.to_path_buf(),
            reason: format!(
                "not a vocabulary file: {} bytes (at most {MAX_FILE_BYTES} are read), {}",
                meta.len(),
                if meta.is_file() {
                    "a regular file"
                } else {
                    "not a regular file"
                }
            ),
        });
    }
    crate::regular::read_text(path, MAX_FILE_BYTES).map_err(io)
}

/// Whether the folder's `tokenization_kimi.py` is Kimi-Linear's, which
/// reserves two more special ids.
fn two_more_reserved(dir: &Path) -> Result<bool, TokenizerError> {
    let path = dir.join(KIMI_TOKENIZER_CODE);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() && m.len() <= MAX_FILE_BYTES => {
            let code = crate::regular::read_text(&path, MAX_FILE_BYTES)
                .map_err(|source| TokenizerError::Io { path, source })?;
            Ok(code.contains(TWO_MORE_RESERVED))
        }
        _ => Ok(false),
    }
}

/// Tokens by rank from `tiktoken.model`'s lines (`BASE64 RANK`). Ranks must
/// be 0..n, each once, and every byte must be a token of its own, so that
/// any text can be encoded and special ids follow the ranks.
fn parse_ranks(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut by_rank: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut seen: FxHashMap<Vec<u8>, u32> = FxHashMap::default();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
        let at = || format!("line {}", n + 1);
        let (token, rank) = line
            .split_once(' ')
            .ok_or_else(|| format!("{}: expected `BASE64 RANK`", at()))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(token)
            .map_err(|e| format!("{}: the token is not base64: {e}", at()))?;
        let rank: u32 = rank
            .trim()
            .parse()
            .map_err(|_| format!("{}: rank `{rank}` is not a number", at()))?;
        if let Some(other) = seen.insert(bytes.clone(), rank) {
            return Err(format!(
                "{}: the token of rank {rank} is also rank {other}",
                at()
            ));
        }
        if by_rank.insert(rank, bytes).is_some() {
            return Err(format!("{}: rank {rank} appears twice", at()));
        }
    }
    let count = by_rank.len();
    if let Some((&last, _)) = by_rank.last_key_value()
        && last as usize + 1 != count
    {
        return Err(format!(
            "{count} ranks, but the highest is {last}: ranks must run from 0 without gaps"
        ));
    }
    if let Some(byte) = (0..=255u8).find(|b| !seen.contains_key(&vec![*b])) {
        return Err(format!(
            "byte 0x{byte:02x} is not a token of its own; every byte must be"
        ));
    }
    Ok(by_rank.into_values().collect())
}

/// The reserved special ids after `base` ranks, named from
/// `added_tokens_decoder` (`<|reserved_token_ID|>` where unnamed).
fn specials(config: &Value, base: u32, reserved: u32) -> Result<BTreeMap<u32, Special>, String> {
    let mut named: BTreeMap<u32, Special> = BTreeMap::new();
    if let Some(added) = config.get("added_tokens_decoder") {
        let added = added
            .as_object()
            .ok_or("`added_tokens_decoder` is not an object")?;
        for (key, token) in added {
            let id: u32 = key
                .parse()
                .map_err(|_| format!("`added_tokens_decoder` key `{key}` is not an id"))?;
            let name = token
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("`added_tokens_decoder.{key}` has no `content` string"))?;
            if !(base..base + reserved).contains(&id) {
                // Kimi's tokenizer names only ids in the reserved range.
                continue;
            }
            let skipped = token
                .get("special")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            named.insert(
                id,
                Special {
                    name: name.to_string(),
                    skipped,
                },
            );
        }
    }
    let mut out = BTreeMap::new();
    let mut names: HashMap<String, u32> = HashMap::new();
    for id in base..base + reserved {
        let special = named.remove(&id).unwrap_or_else(|| Special {
            name: format!("<|reserved_token_{id}|>"),
            skipped: true,
        });
        if let Some(other) = names.insert(special.name.clone(), id) {
            return Err(format!(
                "`added_tokens_decoder` names ids {other} and {id} both `{}`",
                special.name
            ));
        }
        out.insert(id, special);
    }
    Ok(out)
}

/// The pieces tiktoken is handed: at most [`MAX_ENCODE_CHARS`] characters,
/// cut again where a run of whitespace or non-whitespace would pass
/// [`MAX_RUN_CHARS`] (`_split_whitespaces_or_nonwhitespaces`).
fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut starts: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .step_by(MAX_ENCODE_CHARS)
        .collect();
    starts.push(text.len());
    for window in starts.windows(2) {
        let chunk = &text[window[0]..window[1]];
        let mut run = 0usize;
        let mut space = chunk.chars().next().is_some_and(python_isspace);
        let mut start = 0;
        for (i, c) in chunk.char_indices() {
            let now = python_isspace(c);
            if space != now {
                run = 1;
                space = now;
            } else {
                run += 1;
                if run > MAX_RUN_CHARS {
                    out.push(&chunk[start..i]);
                    start = i;
                    run = 1;
                }
            }
        }
        out.push(&chunk[start..]);
    }
    out
}

/// Python's `str.isspace` for one character: Unicode whitespace plus the
/// four information separators U+001C..U+001F, which Python counts and
/// Rust's `char::is_whitespace` does not.
fn python_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// GPT-2's byte-level alphabet: the character standing for each byte.
fn byte_level_alphabet() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        out[b as usize] = if printable {
            b as char
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    out
}

/// The bytes a byte-level spelling stands for, if every character is one.
fn byte_level_bytes(token: &str) -> Option<Vec<u8>> {
    let alphabet = byte_level_alphabet();
    token
        .chars()
        .map(|c| alphabet.iter().position(|&a| a == c).map(|b| b as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(extra: &[&[u8]]) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut lines: Vec<String> = (0..=255u8).map(|b| format!("{} {b}", b64(&[b]))).collect();
        for (i, t) in extra.iter().enumerate() {
            lines.push(format!("{} {}", b64(t), 256 + i));
        }
        lines.join("\n")
    }

    fn config() -> Value {
        serde_json::json!({
            "tokenizer_class": "TikTokenTokenizer",
            "added_tokens_decoder": {
                "259": {"content": "[BOS]", "special": true},
                "261": {"content": "<|im_end|>", "special": true},
                "262": {"content": "<|tool_call_begin|>", "special": false},
            }
        })
    }

    fn small() -> Tiktoken {
        let tokens = parse_ranks(&vocab(&[b"he", b"ll", b"hell"])).unwrap();
        let specials = specials(&config(), tokens.len() as u32, 4).unwrap();
        Tiktoken::new(tokens, specials).unwrap()
    }

    #[test]
    fn merges_by_rank_and_matches_specials_whole() {
        let t = small();
        assert_eq!(t.encode("hello").unwrap(), [258, b'o' as u32]);
        assert_eq!(
            t.encode("hell<|im_end|>").unwrap(),
            [258, 261],
            "a special token in the text is its id"
        );
        assert_eq!(t.encode_ordinary("<|im_end|>").unwrap().len(), 10);
        // Unnamed reserved ids get placeholder names.
        assert_eq!(t.encode("<|reserved_token_260|>").unwrap(), [260]);
        assert_eq!(
            t.decode(&[258, 261, 262], true).unwrap(),
            "hell<|tool_call_begin|>"
        );
        assert_eq!(t.decode(&[258, 261], false).unwrap(), "hell<|im_end|>");
        assert!(t.decode(&[263], false).is_err());
        assert_eq!(t.vocab_size(), 263);
        assert_eq!(t.token_id("<|im_end|>"), Some(261));
        assert_eq!(t.token_id("hell"), Some(258));
        assert_eq!(t.vocab().get("Ġ"), Some(&32));
    }

    #[test]
    fn bad_vocabularies_are_refused_with_the_line() {
        let gap = vocab(&[]) + "\naGk= 300";
        assert!(parse_ranks(&gap).unwrap_err().contains("without gaps"));
        let twice = vocab(&[b"he", b"he"]);
        assert!(parse_ranks(&twice).unwrap_err().contains("line 258"));
        let missing: String = vocab(&[]).lines().skip(1).collect::<Vec<_>>().join("\n");
        assert!(parse_ranks(&missing).is_err());
        assert!(parse_ranks("!!! 0").unwrap_err().contains("base64"));
        let dup = serde_json::json!({"added_tokens_decoder": {
            "256": {"content": "x"}, "257": {"content": "x"}}});
        assert!(specials(&dup, 256, 4).unwrap_err().contains("both"));
    }

    #[test]
    fn long_runs_are_cut_as_kimi_cuts_them() {
        let text = format!("{}{}", "a".repeat(MAX_RUN_CHARS + 10), " ".repeat(3));
        let p = pieces(&text);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].len(), MAX_RUN_CHARS);
        assert_eq!(p.concat(), text);
        assert!(
            pieces("").is_empty(),
            "as Python: no piece of an empty text"
        );
        assert!(python_isspace('\u{1f}') && !'\u{1f}'.is_whitespace());
    }
}
