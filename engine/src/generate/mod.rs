//! Turning a prompt into text: a session over the model's sequence state, token
//! selection, and stop conditions (EOS ids, stop strings, a token budget).

pub mod bridge;
pub mod channels;
mod constrain;
mod decode;
pub mod sampling;
pub mod speculate;
pub mod stop;

use serde::Serialize;

use crate::model::{Decoder, LogitsFor, ModelError, SequenceState};
use crate::prefix::PrefixUse;
use crate::tokenizer::{TextTokenizer, TokenizerError};
pub use decode::generate_drafted;
pub use sampling::{MAX_OPENAI_PENALTY, Sampler, SamplingError, SamplingParams, Seen};
pub use speculate::{Speculation, SpeculationStats};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the prompt is empty after tokenization")]
    EmptyPrompt,
}

/// One sequence: the tokens fed so far and the model's state after them.
#[derive(Clone)]
pub struct Session<'m> {
    model: &'m Decoder,
    state: SequenceState,
    ids: Vec<u32>,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("len", &self.len())
            .field("state_bytes", &self.state.bytes())
            .finish()
    }
}

impl<'m> Session<'m> {
    pub fn new(model: &'m Decoder) -> Self {
        Self {
            state: model.new_state(),
            model,
            ids: Vec::new(),
        }
    }

    /// Positions processed so far.
    pub fn len(&self) -> usize {
        self.state.len()
    }

    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    /// The tokens fed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The model's state so far.
    pub fn state(&self) -> &SequenceState {
        &self.state
    }

    /// Feeds `ids` in one batched pass; returns the logits after the last one.
    pub fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        let logits = self.model.forward(ids, &mut self.state, LogitsFor::Last)?;
        self.ids.extend_from_slice(ids);
        Ok(logits.squeeze(0)?.to_vec1()?)
    }

    /// Feeds `ids` in one batched pass; returns the logits after each of
    /// them, each bitwise what feeding them one at a time would give.
    pub fn feed_all(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        let logits = self.model.forward(ids, &mut self.state, LogitsFor::All)?;
        self.ids.extend_from_slice(ids);
        Ok(logits.to_vec2()?)
    }

    /// The state from position `start` on, as bytes for [`Session::restore`].
    pub fn snapshot_since(&self, start: usize) -> Result<Vec<u8>, ModelError> {
        self.state.save_since(start)
    }

    /// Applies a snapshot taken at this session's length; `following` are
    /// the tokens at the positions it covers (it may cover fewer). Returns
    /// how many positions it held. A snapshot that does not fit is refused
    /// with the reason and changes nothing.
    pub fn restore(&mut self, bytes: &[u8], following: &[u32]) -> Result<usize, ModelError> {
        let n = SequenceState::positions_in(bytes)?;
        let ids = following.get(..n).ok_or_else(|| {
            ModelError::StateMismatch(format!(
                "it covers {n} positions, only {} tokens follow",
                following.len()
            ))
        })?;
        // Checked whole before anything changes, so no copy of the state is needed.
        self.state.extend_from_bytes(bytes)?;
        self.ids.extend_from_slice(ids);
        Ok(n)
    }

    /// Remembers the state here, so that cutting back to this length or
    /// past it replays only what follows.
    pub fn mark(&mut self) {
        self.state.checkpoint();
    }

    /// Cuts the session back to its first `len` positions, exactly as if
    /// only those had been fed. Layers whose state cannot be cut return to
    /// the latest mark at or before `len` and the tokens after it are fed
    /// again (one pass; every kernel is batch-invariant, so the bits agree).
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        let reached = self.state.truncate(len);
        if reached < len.min(self.ids.len()) {
            let replay = self.ids[reached..len].to_vec();
            self.ids.truncate(reached);
            self.model
                .forward(&replay, &mut self.state, LogitsFor::Last)?;
            self.ids.extend_from_slice(&replay);
        }
        self.ids.truncate(len);
        Ok(())
    }
}

/// What to generate and when to stop.
#[derive(Debug, Clone)]
pub struct GenerationSettings {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    pub eos_token_ids: Vec<u32>,
    /// Guessing ahead; it never changes a token (see [`speculate`]).
    pub speculation: Speculation,
    /// How the answer is laid out: reasoning is told apart from it and kept
    /// out of the text (and of stop strings).
    pub output: channels::OutputFormat,
    /// Whether special tokens are written out in the text (`<tool_call>`,
    /// Kimi's `<|tool_call_begin|>`): when tools were offered, so the
    /// family's call markers reach whoever reads the calls.
    pub keep_special_tokens: bool,
    /// Texts the answer must begin with one of (after any reasoning and
    /// leading whitespace): a family's call opener up to a tool's name when
    /// a call is forced. Empty: the answer is free.
    pub answer_starts: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// A stop string appeared in the text.
    StopString,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The caller asked to stop.
    Cancelled,
}

/// Timings of one generation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    /// Time in forward passes after the prefill.
    pub decode_seconds: f64,
    /// Forward passes after the prefill (a verify pass may yield several tokens).
    pub decode_steps: usize,
    /// Positions of a resumed answer taken from saved state, not recomputed.
    pub restored_positions: usize,
    /// Why saved state was refused (it was recomputed instead), if it was.
    pub restore_refused: Option<String>,
    /// Prompt positions taken from the prefix cache, not computed.
    pub prefix_positions: usize,
    /// Bytes of state those positions were restored from.
    pub prefix_bytes: u64,
    /// Why a cached prefix block was not used, when one was not.
    pub prefix_refused: Option<String>,
    pub speculation: SpeculationStats,
}

impl GenerationStats {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_seconds)
    }

    /// Tokens chosen after the first (whose logits came from the prefill)
    /// per second of decoding passes.
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_seconds)
    }
}

fn rate(n: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// The answer.
    pub text: String,
    /// The reasoning before (or around) it, where the model thinks aloud.
    pub reasoning: String,
    pub finish_reason: FinishReason,
    pub stats: GenerationStats,
}

/// Whether the caller wants generation to go on after a piece of text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Generates from `prompt`, calling `on_text` with each piece of text as soon
/// as it is final (stop strings are never shown, even in part).
pub fn generate(
    model: &Decoder,
    tokenizer: &TextTokenizer,
    prompt: &[u32],
    settings: &GenerationSettings,
    mut on_text: impl FnMut(&str) -> Flow,
) -> Result<Generation, GenerateError> {
    generate_resumed(
        model,
        tokenizer,
        prompt,
        &[],
        &[],
        settings,
        None,
        |piece| {
            if piece.text.is_empty() {
                Flow::Continue
            } else {
                on_text(piece.text)
            }
        },
    )
}

/// Prompt positions fed per forward pass. Every kernel is batch-invariant,
/// so the pieces give bitwise the logits of one pass; between them the
/// caller sees progress and can stop (a 5,400-token prompt in one pass held
/// the runner 75 s past a cancel), and activations stay bounded however
/// long the prompt. A pass asks for nearly every expert of a layer, so the
/// experts are read about once per pass: on a 1.2 GB-expert synthetic
/// DeepSeek-V3 streamed cold with a 128 MiB cache, 2,048 prompt tokens read
/// at 286 tok/s in passes of 1,024, 259 in passes of 512 and ~200 in
/// passes of 256. 512 is also llama.cpp's default micro-batch, so a
/// frontier model's experts are not read more often than there.
pub const PROMPT_CHUNK: usize = 512;

/// Which part of a generation a [`Piece`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading the prompt (and, when resuming, the answer so far):
    /// `done` of `total` positions are in the sequence state.
    Prompt { done: usize, total: usize },
    /// Choosing the answer's tokens.
    Answer,
}

/// One step of a generation as it is produced: the token just chosen (none
/// for the text released at the end, and while the prompt is read) and the
/// text it made final.
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    pub phase: Phase,
    pub token: Option<u32>,
    /// Text of the answer the token made final.
    pub text: &'a str,
    /// Text of the reasoning it made final.
    pub reasoning: &'a str,
    /// Tokens of the answer so far, this one included.
    pub tokens_so_far: usize,
    /// The session: the prompt's positions, then the answer's tokens fed
    /// so far. Saving snapshots of it lets a resumed run skip recomputing
    /// them.
    pub session: &'a Session<'a>,
    /// Whether the session holds exactly the answer's tokens but the newest
    /// (false while verified guesses are fed ahead of what was reported:
    /// a snapshot then would cover tokens not yet reported).
    pub settled: bool,
    pub prompt_len: usize,
    /// What guessing ahead has done so far in this generation.
    pub speculation: SpeculationStats,
}

/// Generates from `prompt` as if the answer had already begun with
/// `resumed` (tokens this function produced earlier for the same prompt and
/// settings). The prompt is fed in one pass, as it was the first time; the
/// state of the first resumed tokens is taken from `saved` (snapshots
/// of [`Piece::session`] kept by the caller, in order) where it holds them,
/// and the other resumed tokens are fed one at a time, exactly as they were
/// computed — a batched pass sums in another order, and its last-bit
/// differences could tip a sampled token. The tokens are replayed through
/// the text and stop-string state without being reported again, and sampling
/// continues at their position: with the same settings the result is bitwise
/// the one an uninterrupted run gives. The prompt's first blocks come from
/// `prefix` where it holds them. `on_piece` sees each new token.
#[allow(clippy::too_many_arguments)]
pub fn generate_resumed(
    model: &Decoder,
    tokenizer: &TextTokenizer,
    prompt: &[u32],
    resumed: &[u32],
    saved: &[Vec<u8>],
    settings: &GenerationSettings,
    prefix: Option<PrefixUse<'_>>,
    on_piece: impl FnMut(Piece<'_>) -> Flow,
) -> Result<Generation, GenerateError> {
    let mut lookup = speculate::PromptLookup;
    let drafter: Option<&mut dyn speculate::Drafter> = match settings.speculation {
        Speculation::Off => None,
        Speculation::Lookup => Some(&mut lookup),
    };
    generate_drafted(
        model, tokenizer, prompt, resumed, saved, settings, drafter, prefix, on_piece,
    )
}
