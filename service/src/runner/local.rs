//! Running jobs on this machine: one engine, kept loaded between jobs and
//! replaced when a job needs another model.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use longhaul_engine::StreamingOptions;
use longhaul_engine::memory::MemorySettings;
use longhaul_engine::{Engine, EngineError, EngineOptions, OutputFormat, PrefixCache};
use longhaul_engine::{FinishReason, GenerationSettings, Phase, SamplingParams, Speculation};

use crate::drive_errors::ErrorLedger;

use super::{Outcome, Produced, RunError, Sink, Usage};
use crate::queue::{DriveBytes, Input, PromptInput, Runnable, Speculate};

/// The loaded model, shared with the metrics sampler.
#[derive(Default)]
pub struct LoadedModel {
    slot: Mutex<Option<(PathBuf, Arc<Engine>)>>,
    /// Counts loads, so that each engine's drive counters are told apart.
    loads: AtomicUsize,
    /// Read errors per drive over every load.
    pub errors: ErrorLedger,
    /// The draft model last used, kept loaded for the next job that asks.
    draft: Mutex<Option<(PathBuf, Arc<Engine>)>>,
}

impl LoadedModel {
    pub fn current(&self) -> Option<(PathBuf, Arc<Engine>)> {
        self.slot.lock().ok().and_then(|s| s.clone())
    }

    /// Puts `next` in place of the loaded model, counting the outgoing
    /// engine's drive errors first.
    pub fn replace(&self, next: Option<(PathBuf, Arc<Engine>)>) {
        let Ok(mut slot) = self.slot.lock() else {
            return;
        };
        if slot.is_some() {
            self.observe_errors(slot.as_ref().map(|(_, e)| e));
        }
        if next.is_some() {
            self.loads.fetch_add(1, Ordering::Relaxed);
        }
        *slot = next;
    }

    /// The draft model at `path`, loaded into RAM (a draft is small: it is
    /// read whole, not streamed) unless it already is.
    pub fn draft(&self, path: &Path) -> Result<Arc<Engine>, RunError> {
        let mut slot = self
            .draft
            .lock()
            .map_err(|_| RunError::Failed("the draft model's slot is poisoned".into()))?;
        if let Some((p, e)) = slot.as_ref()
            && p == path
        {
            return Ok(Arc::clone(e));
        }
        *slot = None;
        let engine = Engine::open(path).map_err(|e| {
            RunError::Failed(format!(
                "cannot load the draft model at {}: {e}",
                path.display()
            ))
        })?;
        let engine = Arc::new(engine);
        *slot = Some((path.to_path_buf(), Arc::clone(&engine)));
        Ok(engine)
    }

    /// Takes in the loaded engine's drive errors (the metrics sampler does,
    /// once a second).
    pub fn observe_errors(&self, engine: Option<&Arc<Engine>>) {
        if let Some(stats) = engine.and_then(|e| e.stats()) {
            let now = crate::queue::now_unix();
            self.errors
                .observe(self.loads.load(Ordering::Relaxed), &stats.drives, now);
        }
    }
}

pub struct LocalBackend {
    /// The draft model's folder or pack, when the job asks for one.
    pub draft: Option<PathBuf>,
    pub streaming: StreamingOptions,
    pub memory: Option<MemorySettings>,
    pub prefix: Option<Arc<PrefixCache>>,
    pub loaded: Arc<LoadedModel>,
}

fn engine_error(e: EngineError) -> RunError {
    if e.is_storage_fault() {
        RunError::Fault(e.to_string())
    } else {
        RunError::Failed(e.to_string())
    }
}

impl LocalBackend {
    /// The engine for `path`, loading it (and dropping the previous one) if needed.
    fn engine(&self, path: &Path) -> Result<Arc<Engine>, RunError> {
        if let Some((p, e)) = self.loaded.current()
            && p == path
        {
            return Ok(e);
        }
        // Let go of the old model before loading the next: RAM holds one.
        self.loaded.replace(None);
        let options = EngineOptions {
            streaming: self.streaming.clone(),
            memory: self.memory,
            prefix: self.prefix.clone(),
        };
        let engine = Engine::open_with(path, &options, &|_| {}).map_err(|e| {
            let text = format!("cannot load the model at {}: {e}", path.display());
            if e.is_storage_fault() {
                RunError::Fault(text)
            } else {
                RunError::Failed(text)
            }
        })?;
        let engine = Arc::new(engine);
        self.loaded
            .replace(Some((path.to_path_buf(), Arc::clone(&engine))));
        Ok(engine)
    }

    pub fn run(
        &self,
        path: &Path,
        job: &Runnable,
        saved: &[Vec<u8>],
        sink: &mut Sink<'_>,
    ) -> Result<Outcome, RunError> {
        let engine = self.engine(path)?;
        let request = &job.request;
        // The prompt as admitted when it was; rendered here otherwise.
        let (prompt, output) = match (&job.prompt_ids, &request.input) {
            (Some(ids), Input::Prompt(_)) => Ok((ids.clone(), OutputFormat::Plain)),
            (Some(ids), Input::Messages(_)) => engine.chat_output(ids).map(|o| (ids.clone(), o)),
            (None, _) => match request.prompt_input() {
                PromptInput::Plain(text) => engine
                    .prompt_ids(&text, false)
                    .map(|ids| (ids, OutputFormat::Plain)),
                PromptInput::Chat(messages, options) => engine
                    .chat_prompt(&messages, &options)
                    .map(|c| (c.ids, c.output)),
            },
        }
        .map_err(engine_error)?;
        let s = &request.settings;
        let settings = GenerationSettings {
            max_tokens: s.max_tokens,
            sampling: SamplingParams {
                temperature: s.temperature,
                top_k: s.top_k,
                top_p: s.top_p,
                seed: s.seed,
                repetition_penalty: s.repetition_penalty,
                frequency_penalty: s.frequency_penalty,
                presence_penalty: s.presence_penalty,
            },
            stop_strings: s.stop.clone(),
            eos_token_ids: engine.eos_token_ids().to_vec(),
            output,
            // Tools offered: the family's call markers stay in the text.
            keep_special_tokens: !request.tools.is_empty(),
            // A forced call: the answer opens a call to one of the names.
            answer_starts: request
                .forced_names()
                .and_then(|names| {
                    // The format the answer will be read in, as admitted.
                    let format = request.tool_format.or_else(|| engine.tool_format())?;
                    format.openings(&names)
                })
                .unwrap_or_default(),
            speculation: match s.speculate {
                Speculate::Auto | Speculate::Lookup => Speculation::Lookup,
                Speculate::Off => Speculation::Off,
            },
        };
        let draft = match (&self.draft, s.speculate) {
            (Some(path), Speculate::Auto | Speculate::Lookup) => Some(self.loaded.draft(path)?),
            _ => None,
        };
        let before = counters(&engine);
        let usage = || counters(&engine).since(&before);
        let on_piece = |piece: longhaul_engine::Piece<'_>| {
            let tokens: Vec<u32> = piece.token.into_iter().collect();
            sink(Produced {
                phase: piece.phase,
                tokens: &tokens,
                count: tokens.len(),
                text: piece.text,
                reasoning: piece.reasoning,
                // Snapshots only of a session that holds just what was
                // reported (verified guesses may be fed ahead of it).
                state: (piece.settled || piece.phase != Phase::Answer)
                    .then_some((piece.session, piece.prompt_len)),
                usage: Some(&usage),
                speculation: Some(piece.speculation),
            })
        };
        let resumed = Resumed {
            prompt: &prompt,
            committed: &job.committed_tokens,
            saved,
        };
        let generation = generate(&engine, draft.as_deref(), &resumed, &settings, on_piece)?;
        let usage = usage();
        if let Err(e) = engine.save_heat() {
            tracing::warn!("cannot save the heat histogram: {e}");
        }
        Ok(Outcome {
            finish_reason: match generation.finish_reason {
                FinishReason::Eos => "eos",
                FinishReason::StopString => "stop",
                FinishReason::MaxTokens => "length",
                FinishReason::Cancelled => "stopped",
            },
            prompt_tokens: prompt.len(),
            usage,
            reported_tokens: None,
            state_refused: generation.stats.restore_refused.clone(),
            speculation: Some(generation.stats.speculation),
            prefix_reused: (
                generation.stats.prefix_positions,
                generation.stats.prefix_bytes,
            ),
            prefix_refused: generation.stats.prefix_refused.clone(),
        })
    }
}

/// Where a generation starts: its prompt, the answer committed before a
/// pause, and the attention state saved with it.
struct Resumed<'a> {
    prompt: &'a [u32],
    committed: &'a [u32],
    saved: &'a [Vec<u8>],
}

/// Generates with `draft` guessing when there is one — by token ids with the
/// model's vocabulary, through text with another — else as `settings` say.
fn generate(
    engine: &Engine,
    draft: Option<&Engine>,
    r: &Resumed<'_>,
    settings: &GenerationSettings,
    on_piece: impl FnMut(longhaul_engine::Piece<'_>) -> longhaul_engine::Flow,
) -> Result<longhaul_engine::Generation, RunError> {
    let Some(draft) = draft else {
        return engine
            .generate_resumed(r.prompt, r.committed, r.saved, settings, on_piece)
            .map_err(engine_error);
    };
    // The draft's guesses replace prompt lookup's.
    let settings = GenerationSettings {
        speculation: Speculation::Off,
        ..settings.clone()
    };
    let (target, theirs) = match (engine.tokenizer(), draft.tokenizer()) {
        (Ok(target), Ok(theirs)) => (target, theirs),
        // A draft whose tokenizer cannot be read guesses nothing.
        _ => {
            return engine
                .generate_resumed(r.prompt, r.committed, r.saved, &settings, on_piece)
                .map_err(engine_error);
        }
    };
    // The same vocabulary guesses token ids; another's guesses travel as text.
    let mut drafter: Box<dyn longhaul_engine::Drafter + '_> = if theirs.same_vocabulary(target) {
        Box::new(longhaul_engine::DraftModel::new(draft.session()))
    } else {
        Box::new(longhaul_engine::TextBridge::new(
            draft.session(),
            theirs,
            target,
        ))
    };
    let generation = engine.generate_resumed_drafted(
        r.prompt,
        r.committed,
        r.saved,
        &settings,
        drafter.as_mut(),
        on_piece,
    );
    generation.map_err(engine_error)
}

/// An engine's read and cache counters at one moment.
#[derive(Default)]
struct Counters {
    bytes: u64,
    drives: Vec<(PathBuf, u64)>,
    hits: u64,
    misses: u64,
}

impl Counters {
    /// What was read and looked up between `before` and these counters.
    fn since(&self, before: &Counters) -> Usage {
        let drive_bytes = self
            .drives
            .iter()
            .map(|(path, bytes)| DriveBytes {
                path: path.clone(),
                bytes: bytes.saturating_sub(
                    before
                        .drives
                        .iter()
                        .find(|(p, _)| p == path)
                        .map_or(0, |(_, b)| *b),
                ),
            })
            .collect();
        Usage {
            expert_bytes_read: self.bytes.saturating_sub(before.bytes),
            drive_bytes,
            lookups: (
                self.hits.saturating_sub(before.hits),
                self.misses.saturating_sub(before.misses),
            ),
        }
    }
}

fn counters(engine: &Engine) -> Counters {
    engine.stats().map_or_else(Counters::default, |s| {
        let drives: Vec<(PathBuf, u64)> = s.drives.into_iter().map(|d| (d.path, d.bytes)).collect();
        Counters {
            bytes: drives.iter().map(|(_, b)| b).sum(),
            drives,
            hits: s.cache.hits,
            misses: s.cache.misses,
        }
    })
}
