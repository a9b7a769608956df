//! The engine's front door: open a model folder once, then score or generate.
//!
//! This is the whole surface the CLI and the service use, so that what a
//! model is made of (architecture, expert source, tokenizer files) stays
//! behind it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::Tensor;
use serde::Serialize;

use crate::cache::{PolicyReport, Routed, StreamingExperts, StreamingOptions};
use crate::generate::channels::OutputFormat;
use crate::generate::{self, Flow, GenerateError, Generation, GenerationSettings, Session};
use crate::import::ModelSource;
use crate::memory::{MemoryError, MemoryPlan, MemorySettings};
use crate::metrics::EngineStats;
use crate::model::layers::embedding::Embedding;
use crate::model::lockstep::LockstepCounters;
use crate::model::{Decoder, LogitsFor, ModelError, ModelSpec, parse_token_ids};
use crate::model::{ExpertError, ExpertProvider};
use crate::pack::{self, Manifest, PackError};
use crate::prefix::{ModelKey, PrefixCache, PrefixStats, PrefixUse};
use crate::tokenizer::{ChatMessage, ChatOptions, TextTokenizer, TokenizerError};
use crate::weights::{FileRows, RawTensor, SafetensorsCheckpoint, TensorSource, WeightsError};

/// A conversation as the model reads it.
#[derive(Debug, Clone)]
pub struct ChatPrompt {
    pub ids: Vec<u32>,
    /// How the answer is laid out: give it to the generation settings.
    pub output: OutputFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{path}: not a model folder (no config.json) or GGUF file")]
    NotAModel { path: PathBuf },
    #[error(transparent)]
    Import(#[from] crate::import::ImportError),
    #[error("{path}: no tokenizer: {source}")]
    NoTokenizer {
        path: PathBuf,
        #[source]
        source: Arc<crate::import::ImportError>,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Pack(#[from] PackError),
    #[error("{path}: {reason}")]
    GenerationConfig { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Memory {
        path: PathBuf,
        #[source]
        source: MemoryError,
    },
}

impl EngineError {
    /// Whether the error came from reading expert weights (a drive missing,
    /// failing or corrupt) rather than from the model or the request: a job
    /// hit by one can go on once the drive is back.
    pub fn is_storage_fault(&self) -> bool {
        matches!(
            self,
            EngineError::Model(ModelError::Experts(ExpertError::Source(_)))
                | EngineError::Generate(GenerateError::Model(ModelError::Experts(
                    ExpertError::Source(_)
                )))
        )
    }
}

/// What a loaded model is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelInfo {
    /// `model_type` as the checkpoint names it (`kimi_linear`, `deepseek_v3`, …).
    pub model_type: String,
    pub layers: usize,
    pub vocab_size: usize,
    /// Layers with a fixed-size recurrent state (linear attention).
    pub linear_layers: usize,
    /// Positions the model was trained for, when its config states it.
    pub context_length: Option<usize>,
}

/// A loaded model with its tokenizer and end-of-sequence ids.
pub struct Engine {
    spec: ModelSpec,
    decoder: Decoder,
    /// Set when the model is a pack: the streaming provider, for its counters.
    streaming: Option<Arc<StreamingExperts>>,
    tokenizer: Option<TextTokenizer>,
    /// Why a GGUF file's tokenizer could not be rebuilt, when it could not.
    no_tokenizer: Option<Arc<crate::import::ImportError>>,
    eos_token_ids: Vec<u32>,
    path: PathBuf,
    /// How the memory limit was spent, when one was given for a pack.
    memory_plan: Option<MemoryPlan>,
    prefix: Option<Arc<PrefixCache>>,
    /// What this model's cached prefixes are addressed by.
    model_key: ModelKey,
}

const CONFIG_FILE: &str = "config.json";
const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// Tokens at a prompt's end that say how its answer is laid out: enough
/// for `<think>` and the whitespace a template puts after it.
const PROMPT_TAIL_TOKENS: usize = 8;

/// How to open a model.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Used when the model is a pack.
    pub streaming: StreamingOptions,
    /// A total memory limit: for a pack, the expert budget is derived from
    /// it (or checked against it), before anything is loaded.
    pub memory: Option<MemorySettings>,
    /// Where prompts' state is kept for the next prompt that begins the
    /// same way (shared by every engine given it).
    pub prefix: Option<Arc<PrefixCache>>,
}

/// How far loading has come, in bytes of stored weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadProgress {
    pub loaded_bytes: u64,
    pub total_bytes: u64,
}

/// Reports bytes as tensors are read, for a progress bar.
struct ProgressSource<'a> {
    inner: &'a SafetensorsCheckpoint,
    loaded: AtomicU64,
    total: u64,
    report: &'a (dyn Fn(LoadProgress) + Sync),
}

impl ProgressSource<'_> {
    fn loaded(&self, name: &str) {
        let bytes = self.inner.stored_len(name).unwrap_or(0);
        let loaded = self.loaded.fetch_add(bytes, Ordering::Relaxed) + bytes;
        (self.report)(LoadProgress {
            loaded_bytes: loaded,
            total_bytes: self.total,
        });
    }
}

impl TensorSource for ProgressSource<'_> {
    fn shape(&self, name: &str) -> Option<&[usize]> {
        self.inner.shape(name)
    }

    fn load(&self, name: &str) -> Result<Tensor, WeightsError> {
        let tensor = self.inner.load(name)?;
        self.loaded(name);
        Ok(tensor)
    }

    fn load_raw(&self, name: &str) -> Result<RawTensor, WeightsError> {
        let raw = self.inner.load_raw(name)?;
        self.loaded(name);
        Ok(raw)
    }

    fn location(&self, name: &str) -> PathBuf {
        self.inner.location(name)
    }

    fn origin(&self) -> PathBuf {
        self.inner.origin()
    }
}

impl Engine {
    /// Opens a Hugging Face checkpoint folder. A folder without
    /// `tokenizer.json` still loads, for scoring token ids.
    pub fn open(path: &Path) -> Result<Self, EngineError> {
        Self::open_with(path, &EngineOptions::default(), &|_| {})
    }

    /// Opens a checkpoint folder or a pack, reporting progress as resident
    /// weights are read. For a pack, routed experts stream from its drives
    /// through a cache of `options.streaming.budget_bytes`.
    pub fn open_with(
        path: &Path,
        options: &EngineOptions,
        report: &(dyn Fn(LoadProgress) + Sync),
    ) -> Result<Self, EngineError> {
        let gguf = crate::import::is_gguf(path);
        let config = path.join(CONFIG_FILE);
        if !gguf && !config.is_file() {
            return Err(EngineError::NotAModel {
                path: path.to_path_buf(),
            });
        }
        let source = if gguf {
            Some(ModelSource::open(path)?)
        } else {
            None
        };
        let spec = match &source {
            Some(s) => s.spec(),
            None => ModelSpec::read(&config),
        }
        .map_err(ModelError::from)?;
        let gguf_tokenizer = match source.as_ref().and_then(ModelSource::gguf) {
            Some(m) => Some(gguf_tokenizer(m)?),
            None => None,
        };
        let no_tokenizer = match &gguf_tokenizer {
            Some(Err(reason)) => Some(Arc::clone(reason)),
            _ => None,
        };
        let mut memory_plan = None;
        let mut resident_file = None;
        let (checkpoint, streaming, checked, model_key) = if pack::is_pack(path) {
            let manifest = Manifest::read(path)?;
            let model_key = pack_key(path, &manifest);
            let mut streaming_options = options.streaming.clone();
            if let Some(m) = &options.memory {
                let prefix_ram = options.prefix.as_ref().map_or(0, |p| p.ram_limit());
                let plan = plan_memory(path, &spec, &manifest, &streaming_options, m, prefix_ram)?;
                streaming_options.budget_bytes = plan.budget_bytes.min(if m.budget_given {
                    streaming_options.budget_bytes
                } else {
                    u64::MAX
                });
                memory_plan = Some(plan);
            }
            resident_file = Some(manifest.resident.path.clone());
            let resident =
                SafetensorsCheckpoint::open_files(path, vec![manifest.resident.path.clone()])
                    .map_err(ModelError::from)?;
            // Every byte computed with is checked before it is used: streamed
            // records as they land, the resident file here, whole.
            let total = manifest.resident.size + resident.total_bytes();
            let mut checked = 0;
            pack::verify::check_resident(&manifest, |n| {
                checked += n;
                report(LoadProgress {
                    loaded_bytes: checked,
                    total_bytes: total,
                });
            })?;
            let experts = StreamingExperts::open(path, &manifest, &streaming_options)
                .map_err(ModelError::from)?;
            (
                resident,
                Some(Arc::new(experts)),
                manifest.resident.size,
                model_key,
            )
        } else {
            let source = match source {
                Some(s) => s,
                None => ModelSource::open(path)?,
            };
            let model_key = files_key(&source.identity_files());
            let checkpoint = source.checkpoint;
            let limit = options
                .memory
                .map(|m| m.limit_bytes)
                .or_else(crate::memory::available_limit_bytes);
            crate::memory::check_fits(checkpoint.total_bytes(), limit).map_err(|source| {
                EngineError::Memory {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            (checkpoint, None, 0, model_key)
        };
        let source = ProgressSource {
            total: checked + checkpoint.total_bytes(),
            inner: &checkpoint,
            loaded: AtomicU64::new(checked),
            report,
        };
        let provider = streaming.clone().map(|s| s as Arc<dyn ExpertProvider>);
        let mut decoder = spec.build(&source, provider)?;
        // The embedding is read from the drive whether or not memory was
        // planned; a plan gives its bytes to the cache.
        if let Some(file) = &resident_file
            && let Some(freed) = read_embedding_rows(&mut decoder, file)?
            && let Some(plan) = memory_plan.as_mut()
        {
            plan.resident_bytes -= freed;
            plan.budget_bytes += freed;
            // A budget planned from the limit grows into the room; one given
            // by hand stays as given.
            if let (Some(s), Some(false)) = (&streaming, options.memory.map(|m| m.budget_given)) {
                s.grow_budget(freed);
            }
        }
        // The weights are in RAM now; their file's pages would only count
        // against the memory limit.
        checkpoint.drop_page_cache();
        let tokenizer = if let Some(t) = gguf_tokenizer {
            t.ok()
        } else if TextTokenizer::exists_in(path) {
            Some(TextTokenizer::from_dir(path)?)
        } else {
            None
        };
        let mut eos_token_ids = read_generation_eos(path)?;
        for id in &spec.common().eos_token_ids {
            if !eos_token_ids.contains(id) {
                eos_token_ids.push(*id);
            }
        }
        Ok(Self {
            spec,
            decoder,
            streaming,
            tokenizer,
            no_tokenizer,
            eos_token_ids,
            path: path.to_path_buf(),
            memory_plan,
            prefix: options.prefix.clone(),
            model_key,
        })
    }

    /// The format this model writes tool calls in, from its vocabulary and
    /// template; none without a tokenizer or a sign of calls.
    pub fn tool_format(&self) -> Option<crate::toolcall::ToolFormat> {
        self.tokenizer
            .as_ref()
            .and_then(crate::toolcall::ToolFormat::detect)
    }

    /// The prefix cache's counters, when the engine has one.
    pub fn prefix_stats(&self) -> Option<PrefixStats> {
        self.prefix.as_ref().map(|p| p.stats())
    }

    fn prefix_use(&self) -> Option<PrefixUse<'_>> {
        self.prefix.as_deref().map(|cache| PrefixUse {
            cache,
            model: &self.model_key,
        })
    }

    /// How the memory limit was spent, when one was given for a pack.
    pub fn memory_plan(&self) -> Option<&MemoryPlan> {
        self.memory_plan.as_ref()
    }

    /// What the model is.
    pub fn info(&self) -> ModelInfo {
        ModelInfo {
            model_type: self.spec.model_type.clone(),
            layers: self.spec.common().num_layers,
            vocab_size: self.decoder.vocab_size,
            linear_layers: self.decoder.linear_layers(),
            context_length: self.spec.common().context_length,
        }
    }

    /// Every cache, drive and pilot counter, read now, when running from a
    /// pack (a model in RAM streams nothing).
    pub fn stats(&self) -> Option<EngineStats> {
        self.streaming.as_ref().map(|s| s.stats())
    }

    /// Saves the experts' heat histogram next to the pack, for the next run
    /// to pin the hottest; nothing to save for a model in RAM.
    pub fn save_heat(&self) -> std::io::Result<()> {
        match &self.streaming {
            Some(s) => s.save_heat(),
            None => Ok(()),
        }
    }

    /// The expert lookups recorded since the last call (with
    /// `StreamingOptions::record_trace`), leaving the record empty.
    pub fn take_trace(&self) -> Vec<Routed> {
        self.streaming
            .as_ref()
            .map(|s| s.take_trace())
            .unwrap_or_default()
    }

    /// Replays the pack's routing trace summary against every candidate
    /// eviction policy now, and waits for the report (switching policy if
    /// it is chosen automatically); `None` for a model in RAM.
    pub fn replay_policies(&self) -> Option<PolicyReport> {
        self.streaming.as_ref().and_then(|s| s.replay_now())
    }

    /// Passes run for generations decoding together on this model so far
    /// (every generation joins; alone, each pass is its own).
    pub fn together_counters(&self) -> LockstepCounters {
        self.decoder.lockstep.counters()
    }

    /// A new sequence on this model.
    pub fn session(&self) -> Session<'_> {
        Session::new(&self.decoder)
    }

    /// The streaming provider (the engine's own tests look inside).
    #[cfg(feature = "internals")]
    pub fn streaming(&self) -> Option<&StreamingExperts> {
        self.streaming.as_deref()
    }

    #[cfg(feature = "internals")]
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    #[cfg(feature = "internals")]
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn vocab_size(&self) -> usize {
        self.decoder.vocab_size
    }

    pub fn tokenizer(&self) -> Result<&TextTokenizer, EngineError> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| match &self.no_tokenizer {
                Some(reason) => EngineError::NoTokenizer {
                    path: self.path.clone(),
                    source: Arc::clone(reason),
                },
                None => EngineError::Tokenizer(TokenizerError::NoTokenizer {
                    dir: self.path.clone(),
                }),
            })
    }

    /// Logits `[ids.len(), vocab]` for every position of `ids`.
    pub fn logits(&self, ids: &[u32]) -> Result<Tensor, EngineError> {
        let mut cache = self.decoder.new_state();
        Ok(self.decoder.forward(ids, &mut cache, LogitsFor::All)?)
    }

    /// Prompt token ids for plain text, or for a chat rendered with the model's template.
    pub fn prompt_ids(&self, prompt: &str, chat: bool) -> Result<Vec<u32>, EngineError> {
        let tokenizer = self.tokenizer()?;
        Ok(if chat {
            let text = tokenizer.render_chat(&[ChatMessage::user(prompt)], true)?;
            tokenizer.encode(&text, false)?
        } else {
            tokenizer.encode(prompt, true)?
        })
    }

    /// A conversation rendered with the template's switches and instant
    /// (`options`), as ids ready for the assistant's answer, with how that
    /// answer is laid out (reasoning apart from it).
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<ChatPrompt, EngineError> {
        let tokenizer = self.tokenizer()?;
        let text = tokenizer.render_chat_with(messages, options)?;
        Ok(ChatPrompt {
            ids: tokenizer.encode(&text, false)?,
            output: OutputFormat::for_chat(tokenizer, &text),
        })
    }

    /// The layout of a chat answer after `prompt_ids`, a conversation
    /// rendered and tokenized earlier by this model's tokenizer: what
    /// [`Engine::chat_prompt`] returned with them. Only the prompt's end
    /// decides it (whether it opened a thinking block).
    pub fn chat_output(&self, prompt_ids: &[u32]) -> Result<OutputFormat, EngineError> {
        let tokenizer = self.tokenizer()?;
        let tail = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_TAIL_TOKENS)..];
        let text = tokenizer.decode_with_special(tail)?;
        Ok(OutputFormat::for_chat(tokenizer, &text))
    }

    /// Token ids of a conversation rendered by the model's chat template,
    /// ready for the assistant's answer.
    pub fn chat_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        let tokenizer = self.tokenizer()?;
        let text = tokenizer.render_chat(messages, true)?;
        Ok(tokenizer.encode(&text, false)?)
    }

    /// Continues an answer that already holds `resumed` tokens (see
    /// [`generate::generate_resumed`]).
    pub fn generate_resumed(
        &self,
        prompt_ids: &[u32],
        resumed: &[u32],
        saved: &[Vec<u8>],
        settings: &GenerationSettings,
        on_piece: impl FnMut(generate::Piece<'_>) -> Flow,
    ) -> Result<Generation, EngineError> {
        Ok(generate::generate_resumed(
            &self.decoder,
            self.tokenizer()?,
            prompt_ids,
            resumed,
            saved,
            settings,
            self.prefix_use(),
            on_piece,
        )?)
    }

    /// [`Engine::generate_resumed`] with guesses from `drafter` (see
    /// [`generate::speculate`]); the tokens are plain decoding's.
    pub fn generate_drafted(
        &self,
        prompt_ids: &[u32],
        settings: &GenerationSettings,
        drafter: &mut dyn generate::speculate::Drafter,
        on_piece: impl FnMut(generate::Piece<'_>) -> Flow,
    ) -> Result<Generation, EngineError> {
        self.generate_resumed_drafted(prompt_ids, &[], &[], settings, drafter, on_piece)
    }

    /// [`Engine::generate_resumed`] with guesses from `drafter`: a job
    /// resumed after a pause guesses with its draft model as before.
    pub fn generate_resumed_drafted(
        &self,
        prompt_ids: &[u32],
        resumed: &[u32],
        saved: &[Vec<u8>],
        settings: &GenerationSettings,
        drafter: &mut dyn generate::speculate::Drafter,
        on_piece: impl FnMut(generate::Piece<'_>) -> Flow,
    ) -> Result<Generation, EngineError> {
        Ok(generate::generate_drafted(
            &self.decoder,
            self.tokenizer()?,
            prompt_ids,
            resumed,
            saved,
            settings,
            Some(drafter),
            self.prefix_use(),
            on_piece,
        )?)
    }

    pub fn generate(
        &self,
        prompt_ids: &[u32],
        settings: &GenerationSettings,
        on_text: impl FnMut(&str) -> Flow,
    ) -> Result<Generation, EngineError> {
        Ok(generate::generate(
            &self.decoder,
            self.tokenizer()?,
            prompt_ids,
            settings,
            on_text,
        )?)
    }
}

/// Has `decoder` read its embedding a row per token from the pack's
/// resident `file` instead of holding it, when nothing else (a tied LM head)
/// shares it; the bytes given back, if it was.
fn read_embedding_rows(decoder: &mut Decoder, file: &Path) -> Result<Option<u64>, EngineError> {
    let Some(held) = decoder.embed.held_alone() else {
        return Ok(None);
    };
    let Some(rows) = FileRows::find(file, held).map_err(ModelError::from)? else {
        return Ok(None);
    };
    let freed = held.stored_bytes();
    decoder.embed = Embedding::Read {
        cols: rows.cols(),
        rows: Box::new(rows),
    };
    Ok(Some(freed))
}

/// Plans a pack's memory before anything is loaded: resident weights as
/// stored, the attention cache for the context asked, one-use read buffers,
/// and what is left for experts (or a check of the budget given).
fn plan_memory(
    path: &Path,
    spec: &ModelSpec,
    manifest: &Manifest,
    streaming: &StreamingOptions,
    m: &MemorySettings,
    prefix_ram: u64,
) -> Result<MemoryPlan, EngineError> {
    let err = |source| EngineError::Memory {
        path: path.to_path_buf(),
        source,
    };
    let smallest_expert = manifest.records().map(|r| r.len).min().unwrap_or(0);
    // Reads a request waits for, one-use ones included, hold up to a window,
    // and guesses read ahead for one use another. Compressed records also
    // land in a buffer of their own before they are restored.
    let windows = if manifest.experts.compression.is_some() {
        3
    } else {
        2
    };
    // A pass carries at most a prompt chunk's rows, and no more rows than
    // the context holds.
    let rows = m.context_tokens.min(crate::generate::PROMPT_CHUNK as u64);
    let intermediate = manifest
        .experts
        .layers
        .iter()
        .map(|l| l.intermediate)
        .max()
        .unwrap_or(0);
    let runtime =
        crate::memory::runtime_bytes(rows, spec.common().hidden_size as u64, intermediate as u64);
    let plan_with = |windows: u64| {
        MemoryPlan::new(
            m.limit_bytes,
            manifest.resident.size,
            m.context_tokens,
            spec.state_bytes(),
            (
                windows
                    * crate::cache::window_for(
                        streaming.window_bytes,
                        manifest.largest_record_bytes(),
                    ),
                prefix_ram,
                runtime,
            ),
            smallest_expert,
        )
    };
    let mut plan = plan_with(windows).map_err(err)?;
    // A cache that keeps records packed restores hits into a window of
    // their own (see StreamingOptions::pack_cache).
    let all_plain = manifest.plain_expert_bytes();
    let budget = match m.budget_given {
        true => streaming.budget_bytes,
        false => plan.budget_bytes,
    };
    if windows == 3 && streaming.keep_stored_dtype && streaming.pack_cache && budget < all_plain {
        plan = plan_with(windows + 1).map_err(err)?;
    }
    if m.budget_given {
        plan.check(streaming.budget_bytes).map_err(err)?;
    }
    Ok(plan)
}

/// The tokenizer a GGUF file's metadata describes.
/// The tokenizer a GGUF file's metadata describes, or why there is none.
fn gguf_tokenizer(
    model: &crate::import::GgufModel,
) -> Result<Result<TextTokenizer, Arc<crate::import::ImportError>>, EngineError> {
    match &model.tokenizer {
        Err(reason) => Ok(Err(Arc::clone(reason))),
        Ok(t) => Ok(Ok(TextTokenizer::from_parts(
            &model.path,
            t.json.to_string().as_bytes(),
            &t.config,
            None,
        )?)),
    }
}

/// A model folder's `generation_config.json`, if it has one.
fn read_generation_config(dir: &Path) -> Result<Option<serde_json::Value>, EngineError> {
    let path = dir.join(GENERATION_CONFIG_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let invalid = |reason: String| EngineError::GenerationConfig {
        path: path.clone(),
        reason,
    };
    let text = crate::regular::read_text(&path, crate::regular::SETTINGS_LIMIT)
        .map_err(|e| invalid(e.to_string()))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| invalid(format!("not valid JSON: {e}")))
}

/// `top_k` when a checkpoint samples and does not name one: transformers'
/// `GenerationConfig` default, so Longhaul samples as the model's own
/// reference does.
pub const REFERENCE_DEFAULT_TOP_K: usize = 50;

/// How a checkpoint asks to be sampled (its `generation_config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ts_rs::TS)]
pub struct SamplingDefaults {
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
}

/// The sampling `dir`'s `generation_config.json` asks for: `None` when it
/// has none or does not sample (`do_sample` absent or false: greedy), else
/// its temperature, top-p and top-k with transformers' defaults (1.0, 1.0,
/// 50) for what it leaves out; a top-k of 0 means none.
pub fn sampling_defaults(dir: &Path) -> Result<Option<SamplingDefaults>, EngineError> {
    let Some(config) = read_generation_config(dir)? else {
        return Ok(None);
    };
    if config.get("do_sample").and_then(serde_json::Value::as_bool) != Some(true) {
        return Ok(None);
    }
    let number = |key: &str, default: f64| {
        config
            .get(key)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(default)
    };
    let top_k = match config.get("top_k").and_then(serde_json::Value::as_u64) {
        None => Some(REFERENCE_DEFAULT_TOP_K),
        Some(0) => None,
        Some(k) => usize::try_from(k).ok(),
    };
    Ok(Some(SamplingDefaults {
        temperature: number("temperature", 1.0),
        top_p: number("top_p", 1.0),
        top_k,
    }))
}

fn read_generation_eos(dir: &Path) -> Result<Vec<u32>, EngineError> {
    let path = dir.join(GENERATION_CONFIG_FILE);
    let invalid = |reason: String| EngineError::GenerationConfig {
        path: path.clone(),
        reason,
    };
    let Some(value) = read_generation_config(dir)? else {
        return Ok(Vec::new());
    };
    match value.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(v) => parse_token_ids(v)
            .ok_or_else(|| invalid("`eos_token_id` must be an id or a list of ids".to_string())),
    }
}

/// A pack's identity: its source's files (sizes and hashes, as packed), its
/// resident file and expert records, and its copied config; where its
/// drives are does not matter.
fn pack_key(path: &Path, manifest: &Manifest) -> ModelKey {
    let mut identity = Vec::new();
    for f in &manifest.source.files {
        identity.extend_from_slice(f.name.as_bytes());
        identity.extend_from_slice(&f.size.to_le_bytes());
        identity.extend_from_slice(f.xxh3_128.as_bytes());
    }
    identity.extend_from_slice(manifest.resident.xxh3_128.as_bytes());
    // How the experts are stored (a quantised pack computes other values)
    // and each record's checksum.
    identity.extend(serde_json::to_vec(&manifest.experts).unwrap_or_default());
    identity.extend(
        crate::regular::read(&path.join(CONFIG_FILE), crate::regular::SETTINGS_LIMIT)
            .unwrap_or_default(),
    );
    ModelKey::new(&identity)
}

/// A folder's or GGUF file's identity without reading its weights (a
/// frontier checkpoint is hundreds of gigabytes): each file's name, size and
/// modification time, and the small files' contents.
fn files_key(files: &[PathBuf]) -> ModelKey {
    let mut identity = Vec::new();
    for path in files {
        let meta = std::fs::metadata(path).ok();
        let size = meta.as_ref().map_or(0, |m| m.len());
        let modified = meta
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        identity.extend_from_slice(path.to_string_lossy().as_bytes());
        identity.extend_from_slice(&size.to_le_bytes());
        identity.extend_from_slice(&modified.to_le_bytes());
        if size <= SMALL_IDENTITY_FILE {
            identity.extend(crate::regular::read(path, SMALL_IDENTITY_FILE).unwrap_or_default());
        }
    }
    ModelKey::new(&identity)
}

/// Files up to this size (configs, tokenizers, templates) identify a model
/// by their contents too.
const SMALL_IDENTITY_FILE: u64 = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults(config: &str) -> Option<SamplingDefaults> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(GENERATION_CONFIG_FILE), config).unwrap();
        sampling_defaults(dir.path()).unwrap()
    }

    #[test]
    fn sampling_defaults_follow_generation_config_as_transformers_reads_it() {
        assert_eq!(
            defaults(r#"{"temperature": 0.7}"#),
            None,
            "no do_sample: greedy"
        );
        assert_eq!(
            defaults(r#"{"do_sample": false, "temperature": 0.7}"#),
            None
        );
        assert_eq!(
            defaults(r#"{"do_sample": true}"#),
            Some(SamplingDefaults {
                temperature: 1.0,
                top_p: 1.0,
                top_k: Some(50)
            })
        );
        assert_eq!(
            defaults(r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 0}"#),
            Some(SamplingDefaults {
                temperature: 0.6,
                top_p: 0.95,
                top_k: None
            })
        );
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(sampling_defaults(dir.path()).unwrap(), None, "no file");
        std::fs::write(dir.path().join(GENERATION_CONFIG_FILE), "{").unwrap();
        assert!(matches!(
            sampling_defaults(dir.path()),
            Err(EngineError::GenerationConfig { .. })
        ));
    }
}
