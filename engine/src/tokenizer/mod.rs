//! Text in and out: the checkpoint's own tokenizer (`tokenizer.json`, or
//! Kimi's `tiktoken.model`), its special tokens and its chat template.

mod chat;
pub mod encoders;
pub mod python;
pub mod tiktoken;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use chat::{ChatMessage, ChatOptions, ChatTemplate, TemplateError};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("tokenizing failed: {0}")]
    Encode(String),
    /// The pre-tokenizer's regular expression gave up on a text (Oniguruma
    /// stops a search past its backtracking limit, and the tokenizers crate
    /// panics on that error).
    #[error(
        "{path}: the pre-tokenizer's pattern gave up on this text ({reason}); this tokenizer.json cannot read it"
    )]
    PatternGaveUp { path: PathBuf, reason: String },
    #[error("decoding failed: {0}")]
    Decode(String),
    #[error(
        "{dir}: no tokenizer: looked for {TOKENIZER_FILE} and {} (with tokenizer_config.json)",
        tiktoken::TIKTOKEN_FILE
    )]
    NoTokenizer { dir: PathBuf },
    #[error(
        "{dir}: this checkpoint has no chat template (chat_template.jinja, tokenizer_config.json `chat_template` or chat_template.json) and its model type has no prompt encoder; send a plain prompt instead"
    )]
    NoChatTemplate { dir: PathBuf },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Encoder(#[from] encoders::EncoderError),
}

thread_local! {
    /// Whether this thread is inside [`caught`], whose panic is an error.
    static CATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, returning its panic as `Err` without the panic report the
/// default hook prints (a backtrace in the service's log for what is an
/// error of the input). Other threads' panics are reported as before.
fn caught<T>(f: impl FnOnce() -> T) -> Result<T, Box<dyn std::any::Any + Send>> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CATCHING.with(std::cell::Cell::get) {
                report(info);
            }
        }));
    });
    CATCHING.with(|c| c.set(true));
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(false));
    out
}

/// The message a panic carried.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "no message".into())
}

/// How a conversation becomes prompt text.
enum PromptBuilder {
    /// The release's Jinja template.
    Template(ChatTemplate),
    /// The family's own encoder, for releases that ship code instead.
    Encoder(encoders::PromptEncoder),
    None,
}

/// A checkpoint's tokenizer with what `tokenizer_config.json` says about it.
pub struct TextTokenizer {
    inner: Vocabulary,
    dir: PathBuf,
    prompt: PromptBuilder,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Each token's text, special tokens spelled out, decoded when first
    /// asked for (for decoding held to a start).
    texts: std::sync::OnceLock<Vec<Option<String>>>,
}

/// How ids and text map to each other.
enum Vocabulary {
    /// A Hugging Face `tokenizer.json`.
    Hf(Box<tokenizers::Tokenizer>),
    /// Kimi's `tiktoken.model`.
    Tiktoken(Box<tiktoken::Tiktoken>),
}

const TOKENIZER_FILE: &str = "tokenizer.json";
const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// A processor's legacy template file: `{"chat_template": "..."}`.
const CHAT_TEMPLATE_JSON_FILE: &str = "chat_template.json";

impl TextTokenizer {
    /// Whether `dir` holds a tokenizer this reader knows.
    pub fn exists_in(dir: &Path) -> bool {
        dir.join(TOKENIZER_FILE).is_file() || dir.join(tiktoken::TIKTOKEN_FILE).is_file()
    }

    /// Loads `tokenizer.json` (or Kimi's `tiktoken.model`) and, when
    /// present, `tokenizer_config.json` and `chat_template.jinja` from `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = if config_path.is_file() {
            let text = crate::regular::read_text(&config_path, crate::regular::SETTINGS_LIMIT)
                .map_err(|source| TokenizerError::Io {
                    path: config_path.clone(),
                    source,
                })?;
            serde_json::from_str::<Value>(&text).map_err(|e| TokenizerError::Invalid {
                path: config_path.clone(),
                reason: format!("not valid JSON: {e}"),
            })?
        } else {
            Value::Null
        };
        let template_path = dir.join(CHAT_TEMPLATE_FILE);
        let template = if template_path.is_file() {
            Some(
                crate::regular::read_text(&template_path, crate::regular::SETTINGS_LIMIT).map_err(
                    |source| TokenizerError::Io {
                        path: template_path.clone(),
                        source,
                    },
                )?,
            )
        } else {
            None
        };
        // transformers: the tokenizer's template (its file, then its
        // config); a multimodal release's processor template after both.
        let template = match template {
            Some(t) => Some(t),
            None if config.get("chat_template").is_none_or(Value::is_null) => legacy_template(dir)?,
            None => None,
        };
        let path = dir.join(TOKENIZER_FILE);
        if !path.is_file() && dir.join(tiktoken::TIKTOKEN_FILE).is_file() {
            let inner = Vocabulary::Tiktoken(Box::new(tiktoken::Tiktoken::from_dir(dir, &config)?));
            return Self::with_vocabulary(dir, inner, &config, template);
        }
        if !path.is_file() {
            return Err(TokenizerError::NoTokenizer {
                dir: dir.to_path_buf(),
            });
        }
        let bytes = crate::regular::read(&path, crate::regular::LARGE_LIMIT).map_err(|source| {
            TokenizerError::Io {
                path: path.clone(),
                source,
            }
        })?;
        Self::from_parts(dir, &bytes, &config, template)
    }

    /// A tokenizer from `tokenizer.json`'s bytes, `tokenizer_config.json`'s
    /// value and a chat template that overrides the config's; `origin` names
    /// where they came from in errors.
    pub fn from_parts(
        origin: &Path,
        tokenizer_json: &[u8],
        config: &Value,
        template: Option<String>,
    ) -> Result<Self, TokenizerError> {
        let invalid = |reason| TokenizerError::Invalid {
            path: origin.join(TOKENIZER_FILE),
            reason,
        };
        // The tokenizers crate panics on some malformed parts (a decoder
        // whose JSON breaks off: `expect("Helper")`) instead of failing.
        let inner = caught(|| tokenizers::Tokenizer::from_bytes(tokenizer_json))
            .map_err(|panic| invalid(format!("cannot be read: {}", panic_text(&*panic))))?
            .map_err(|e| invalid(e.to_string()))?;
        Self::with_vocabulary(origin, Vocabulary::Hf(Box::new(inner)), config, template)
    }

    fn with_vocabulary(
        origin: &Path,
        inner: Vocabulary,
        config: &Value,
        template: Option<String>,
    ) -> Result<Self, TokenizerError> {
        let template_source = match template {
            Some(t) => Some(t),
            None => {
                chat_template_from_config(config).map_err(|reason| TokenizerError::Invalid {
                    path: origin.join(TOKENIZER_CONFIG_FILE),
                    reason,
                })?
            }
        };
        let prompt = match template_source {
            Some(t) => PromptBuilder::Template(ChatTemplate::new(t)),
            None => {
                match model_type(origin).and_then(|t| encoders::PromptEncoder::for_model_type(&t)) {
                    Some(e) => PromptBuilder::Encoder(e),
                    None => PromptBuilder::None,
                }
            }
        };
        Ok(Self {
            inner,
            dir: origin.to_path_buf(),
            prompt,
            bos_token: special_token(config, "bos_token"),
            eos_token: special_token(config, "eos_token"),
            texts: std::sync::OnceLock::new(),
        })
    }

    /// Tokenizes `text`; `add_special_tokens` applies the tokenizer's own
    /// post-processing (e.g. a leading BOS), as transformers does for plain prompts.
    /// Kimi's tokenizer never adds one.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        match &self.inner {
            Vocabulary::Hf(t) => {
                let encoded = caught(|| t.encode(text, add_special_tokens)).map_err(|panic| {
                    TokenizerError::PatternGaveUp {
                        path: self.dir.join(TOKENIZER_FILE),
                        reason: panic_text(&*panic),
                    }
                })?;
                let enc = encoded.map_err(|e| TokenizerError::Encode(e.to_string()))?;
                Ok(enc.get_ids().to_vec())
            }
            Vocabulary::Tiktoken(t) => t.encode(text),
        }
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_skipping(ids, true)
    }

    /// The text of `ids` with special tokens written out (`<|im_start|>`), as
    /// [`TextTokenizer::encode`] reads them back.
    pub fn decode_with_special(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_skipping(ids, false)
    }

    fn decode_skipping(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        match &self.inner {
            Vocabulary::Hf(t) => t
                .decode(ids, skip_special)
                .map_err(|e| TokenizerError::Decode(e.to_string())),
            Vocabulary::Tiktoken(t) => t.decode(ids, skip_special),
        }
    }

    /// Whether both tokenizers give every token the same id, so ids pass
    /// between their models unchanged.
    pub fn same_vocabulary(&self, other: &TextTokenizer) -> bool {
        self.vocab() == other.vocab()
    }

    fn vocab(&self) -> std::collections::HashMap<String, u32> {
        match &self.inner {
            Vocabulary::Hf(t) => t.get_vocab(true),
            Vocabulary::Tiktoken(t) => t.vocab(),
        }
    }

    /// The text of each of the first `n` token ids on its own, special
    /// tokens spelled out; none for an id the vocabulary cannot decode.
    pub fn token_texts(&self, n: usize) -> &[Option<String>] {
        let texts = self.texts.get_or_init(|| {
            (0..n as u32)
                .map(|id| self.decode_with_special(&[id]).ok())
                .collect()
        });
        &texts[..n.min(texts.len())]
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Vocabulary::Hf(t) => t.token_to_id(token),
            Vocabulary::Tiktoken(t) => t.token_id(token),
        }
    }

    /// Renders `messages` with the checkpoint's chat template.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let options = ChatOptions {
            add_generation_prompt,
            ..ChatOptions::default()
        };
        self.render_chat_with(messages, &options)
    }

    /// Renders `messages` with the template's switches and instant.
    pub fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<String, TokenizerError> {
        match &self.prompt {
            PromptBuilder::Template(template) => Ok(template.render(
                messages,
                options,
                self.bos_token.as_deref(),
                self.eos_token.as_deref(),
            )?),
            PromptBuilder::Encoder(encoder) => Ok(encoder.encode(messages, options)?),
            PromptBuilder::None => Err(TokenizerError::NoChatTemplate {
                dir: self.dir.clone(),
            }),
        }
    }

    /// Whether the prompts this tokenizer builds write `text` (a template
    /// that writes `</think>` is a reasoning model's, even where the tag is
    /// no token of its own).
    pub fn prompts_mention(&self, text: &str) -> bool {
        match &self.prompt {
            PromptBuilder::Template(t) => t.source().contains(text),
            PromptBuilder::Encoder(e) => e.mentions(text),
            PromptBuilder::None => false,
        }
    }

    /// Where prompts come from: `template`, the family's encoder (its
    /// name) or `none`.
    pub fn prompt_source(&self) -> &'static str {
        match &self.prompt {
            PromptBuilder::Template(_) => "template",
            PromptBuilder::Encoder(e) => e.name(),
            PromptBuilder::None => "none",
        }
    }

    /// A streaming decoder that yields text as soon as it is complete UTF-8.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            tokenizer: self,
            ids: Vec::new(),
            emitted: 0,
            skip_special: true,
        }
    }

    /// A streaming decoder that writes special tokens out, as
    /// [`TextTokenizer::decode_with_special`] does.
    pub fn stream_keeping_special(&self) -> TextStream<'_> {
        TextStream {
            skip_special: false,
            ..self.stream()
        }
    }
}

/// Incremental detokenisation: decodes the whole suffix since the last
/// complete character so that multi-byte characters and merged spaces come
/// out exactly as a full decode would print them.
pub struct TextStream<'a> {
    tokenizer: &'a TextTokenizer,
    ids: Vec<u32>,
    emitted: usize,
    skip_special: bool,
}

impl TextStream<'_> {
    /// Adds one token and returns the new text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let text = self
            .tokenizer
            .decode_skipping(&self.ids, self.skip_special)?;
        // A trailing replacement character means a multi-byte character is
        // still incomplete: wait for the next token.
        if text.ends_with('\u{FFFD}')
            || text.len() < self.emitted
            || !text.is_char_boundary(self.emitted)
        {
            return Ok(String::new());
        }
        let new = text[self.emitted..].to_string();
        self.emitted = text.len();
        Ok(new)
    }

    /// Whatever text is still held back (an incomplete character at the end
    /// decodes to U+FFFD, as a full decode would print it).
    pub fn finish(&mut self) -> Result<String, TokenizerError> {
        let text = self
            .tokenizer
            .decode_skipping(&self.ids, self.skip_special)?;
        let rest = text.get(self.emitted..).unwrap_or_default().to_string();
        self.emitted = text.len();
        Ok(rest)
    }
}

/// `model_type` of the folder's `config.json`, if it states one.
fn model_type(dir: &Path) -> Option<String> {
    let text =
        crate::regular::read_text(&dir.join("config.json"), crate::regular::SETTINGS_LIMIT).ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    value.get("model_type")?.as_str().map(str::to_string)
}

/// The template of a `chat_template.json`, if the folder has one.
fn legacy_template(dir: &Path) -> Result<Option<String>, TokenizerError> {
    let path = dir.join(CHAT_TEMPLATE_JSON_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let invalid = |reason: String| TokenizerError::Invalid {
        path: path.clone(),
        reason,
    };
    let text =
        crate::regular::read_text(&path, crate::regular::SETTINGS_LIMIT).map_err(|source| {
            TokenizerError::Io {
                path: path.clone(),
                source,
            }
        })?;
    let value: Value =
        serde_json::from_str(&text).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    match value.get("chat_template") {
        Some(Value::String(t)) => Ok(Some(t.clone())),
        _ => Err(invalid(
            "expected an object with a `chat_template` string".to_string(),
        )),
    }
}

fn chat_template_from_config(config: &Value) -> Result<Option<String>, String> {
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // A list of named templates: take the default one.
        Some(Value::Array(items)) => {
            let named = |want: &str| {
                items.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == want)
                        .then(|| t.get("template")?.as_str().map(str::to_string))
                        .flatten()
                })
            };
            named("default").map(Some).ok_or_else(|| {
                "`chat_template` lists templates but none is named `default`".to_string()
            })
        }
        Some(_) => {
            Err("`chat_template` must be a string or a list of {name, template}".to_string())
        }
    }
}

/// A special token given as a string or as `{"content": ...}`.
fn special_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}
