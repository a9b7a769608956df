//! Turning a prompt into text: a session over the model's sequence state, token
//! selection, and stop conditions (EOS ids, stop strings, a token budget).

pub mod bridge;
pub mod channels;
mod constrain;
pub mod sampling;
pub mod speculate;
pub mod stop;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::{Decoder, LogitsFor, ModelError, SequenceState};
use crate::prefix::PrefixUse;
use crate::tokenizer::{TextTokenizer, TokenizerError};
pub use sampling::{MAX_OPENAI_PENALTY, Sampler, SamplingError, SamplingParams, Seen};
pub use speculate::{Speculation, SpeculationStats};
use stop::{Scan, StopScanner};

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

/// How often replaying a resumed answer token by token reports progress.
const REPLAY_REPORT_INTERVAL: Duration = Duration::from_millis(250);

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

/// A verified guess and the logits after it.
type KeptGuess = (u32, Vec<f32>);

/// Feeds `id` and `guesses` in one pass and keeps the guesses plain
/// decoding would have chosen: the one at answer position `next + j` is
/// kept when the draw for that position from the row before it picks it.
/// Returns the logits after `id` and the kept guesses, each with the logits
/// after it; the state of the rows after the last kept guess is cut away.
/// Refuses scores with a NaN or +∞ in them (−∞ is a masked token).
fn finite(logits: &[f32], position: usize) -> Result<(), ModelError> {
    if logits.iter().any(|l| l.is_nan() || *l == f32::INFINITY) {
        Err(ModelError::NonFiniteLogits { position })
    } else {
        Ok(())
    }
}

fn verify(
    session: &mut Session<'_>,
    sampler: &Sampler,
    id: u32,
    guesses: &[u32],
    next: usize,
    mut seen: Option<&mut Seen>,
) -> Result<(Vec<f32>, Vec<KeptGuess>), ModelError> {
    session.mark();
    let base = session.len();
    let mut batch = Vec::with_capacity(guesses.len() + 1);
    batch.push(id);
    batch.extend_from_slice(guesses);
    let mut rows = session.feed_all(&batch)?.into_iter();
    let Some(first) = rows.next() else {
        return Err(ModelError::StateMismatch(
            "a verify pass returned no logits".into(),
        ));
    };
    let mut kept = Vec::new();
    let mut before = &first;
    for (j, (guess, after)) in guesses.iter().zip(rows).enumerate() {
        finite(before, next + j)?;
        // Each guess is drawn as plain decoding would: after the guesses before it.
        if sampler.sample_seen(before, next + j, seen.as_deref()) != *guess {
            break;
        }
        if let Some(s) = seen.as_deref_mut() {
            s.push(*guess);
        }
        kept.push((*guess, after));
        before = &kept[kept.len() - 1].1;
    }
    // The kept guesses join the answer when they are sampled again.
    if let Some(s) = seen {
        kept.iter().for_each(|(g, _)| s.pop(*g));
    }
    session.truncate(base + 1 + kept.len())?;
    Ok((first, kept))
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

/// [`generate_resumed`] with guesses from `drafter` (none: plain decoding),
/// whatever `settings.speculation` says, and the prompt's first blocks
/// taken from `prefix` where it holds them (and kept there as computed).
#[allow(clippy::too_many_arguments)]
pub fn generate_drafted(
    model: &Decoder,
    tokenizer: &TextTokenizer,
    prompt: &[u32],
    resumed: &[u32],
    saved: &[Vec<u8>],
    settings: &GenerationSettings,
    mut drafter: Option<&mut dyn speculate::Drafter>,
    prefix: Option<PrefixUse<'_>>,
    mut on_piece: impl FnMut(Piece<'_>) -> Flow,
) -> Result<Generation, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    // Generations running at once on this model share their passes.
    let _together = model.lockstep.join();
    let sampler = Sampler::new(settings.sampling.clone())?;
    let mut session = Session::new(model);
    let mut splitter =
        channels::Splitter::new(tokenizer, settings.output, settings.keep_special_tokens);
    let mut stops = StopScanner::new(settings.stop_strings.clone());
    let texts = if settings.answer_starts.is_empty() {
        &[][..]
    } else {
        tokenizer.token_texts(model.vocab_size)
    };
    let mut constraint = constrain::Constraint::new(&settings.answer_starts, texts);
    let mut stats = GenerationStats {
        prompt_tokens: prompt.len() + resumed.len(),
        ..Default::default()
    };
    let mut tokens = Vec::with_capacity(resumed.len());
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut stopped_in_replay = false;
    for &id in resumed {
        tokens.push(id);
        let parts = splitter.push(id)?;
        constraint.push(&parts.answer);
        reasoning.push_str(&parts.reasoning);
        match stops.push(&parts.answer) {
            Scan::Continue(shown) => text.push_str(&shown),
            Scan::Stop(shown) => {
                text.push_str(&shown);
                stopped_in_replay = true;
                break;
            }
        }
    }

    let started = Instant::now();
    let total = prompt.len() + tokens.len();
    let mut report = |session: &Session<'_>, done: usize| {
        on_piece(Piece {
            phase: Phase::Prompt { done, total },
            token: None,
            text: "",
            reasoning: "",
            tokens_so_far: tokens.len(),
            session,
            settled: false,
            prompt_len: prompt.len(),
            speculation: SpeculationStats::default(),
        })
    };
    let mut logits = Vec::new();
    if let Some(p) = &prefix {
        let restored = p.cache.restore(p.model, &mut session, prompt);
        stats.prefix_positions = restored.positions;
        stats.prefix_bytes = restored.bytes;
        stats.prefix_refused = restored.refused;
    }
    let mut cancelled = report(&session, session.len()) == Flow::Stop;
    // Passes end on multiples of the chunk, wherever a restored prefix
    // ended, so each block's end is seen and kept.
    let mut at = session.len();
    while at < prompt.len() && !cancelled {
        let end = ((at / PROMPT_CHUNK + 1) * PROMPT_CHUNK).min(prompt.len());
        logits = session.feed(&prompt[at..end])?;
        at = end;
        if let Some(p) = &prefix {
            p.cache.keep(p.model, &session)?;
        }
        cancelled = report(&session, session.len()) == Flow::Stop;
    }
    if let Some(p) = prefix.as_ref().filter(|_| !cancelled) {
        p.cache.keep_tail(p.model, &session)?;
    }
    // Saved state covers at most all but the last resumed token: its logits,
    // which pick the next token, come only from feeding it.
    let mut restored = 0;
    for bytes in saved.iter().take_while(|_| !cancelled) {
        let Some(following) = tokens.get(restored..tokens.len().saturating_sub(1)) else {
            break;
        };
        match session.restore(bytes, following) {
            Ok(n) => restored += n,
            Err(e) => {
                stats.restore_refused = Some(e.to_string());
                break;
            }
        }
    }
    stats.restored_positions = restored;
    // Resumed tokens one at a time, exactly as they were first computed.
    let mut last_report = Instant::now();
    for &id in &tokens[restored..] {
        if cancelled {
            break;
        }
        logits = session.feed(&[id])?;
        if last_report.elapsed() >= REPLAY_REPORT_INTERVAL {
            last_report = Instant::now();
            cancelled = report(&session, session.len()) == Flow::Stop;
        }
    }
    if !cancelled && restored < tokens.len() {
        cancelled = report(&session, session.len()) == Flow::Stop;
    }
    stats.prefill_seconds = started.elapsed().as_secs_f64();
    let mut decode_time = Duration::ZERO;

    // Verified guesses fed ahead of the tokens reported: each with the
    // logits after it.
    let mut ahead: VecDeque<KeptGuess> = VecDeque::new();
    // Declined guesses are checked in the shadow of plain steps, so every
    // kind starts shut until guesses are seen to be kept.
    let mut gate = speculate::Gate::shadowed();
    // A guess the gate declined, checked against the next token chosen.
    let mut shadow: Option<(usize, u32)> = None;
    // What a drafter guesses from: the prompt and the answer so far, kept
    // as it grows rather than copied every step.
    let mut context: Vec<u32> = Vec::new();
    if drafter.is_some() {
        context.extend_from_slice(prompt);
        context.extend_from_slice(&tokens);
    }
    // What the penalties look at, kept as the answer grows (none when off).
    let mut seen = settings
        .sampling
        .penalizes()
        .then(|| Seen::new(prompt, &tokens));
    let finish_reason = loop {
        if cancelled {
            break FinishReason::Cancelled;
        }
        if stopped_in_replay {
            break FinishReason::StopString;
        }
        if tokens.len() >= settings.max_tokens {
            break FinishReason::MaxTokens;
        }
        finite(&logits, tokens.len())?;
        let id = if constraint.active() && splitter.writing_answer() {
            let mut held = logits.clone();
            constraint.mask(&mut held, splitter.may_open_reasoning());
            sampler.sample_seen(&held, tokens.len(), seen.as_ref())
        } else {
            sampler.sample_seen(&logits, tokens.len(), seen.as_ref())
        };
        if settings.eos_token_ids.contains(&id) || splitter.ends(id) {
            break FinishReason::Eos;
        }
        tokens.push(id);
        if let Some(s) = &mut seen {
            s.push(id);
        }
        if drafter.is_some() {
            context.push(id);
        }
        if let Some((kind, guess)) = shadow.take() {
            gate.record_shadow(kind, guess == id);
        }
        let parts = splitter.push(id)?;
        constraint.push(&parts.answer);
        let (shown, stopped) = match stops.push(&parts.answer) {
            Scan::Continue(s) => (s, false),
            Scan::Stop(s) => (s, true),
        };
        text.push_str(&shown);
        reasoning.push_str(&parts.reasoning);
        let flow = on_piece(Piece {
            phase: Phase::Answer,
            token: Some(id),
            text: &shown,
            reasoning: &parts.reasoning,
            tokens_so_far: tokens.len(),
            session: &session,
            settled: ahead.is_empty(),
            prompt_len: prompt.len(),
            speculation: stats.speculation,
        });
        if stopped {
            break FinishReason::StopString;
        }
        if flow == Flow::Stop {
            break FinishReason::Cancelled;
        }
        if tokens.len() >= settings.max_tokens {
            break FinishReason::MaxTokens;
        }
        // A guess verified earlier: its logits are computed already.
        if let Some((guess, after)) = ahead.pop_front() {
            debug_assert_eq!(guess, id, "a kept guess is the token sampled");
            logits = after;
            continue;
        }
        let step = Instant::now();
        let mut kind = 0;
        // Guesses are drawn unconstrained: none while a start is held to.
        let guesses = match drafter.as_deref_mut().filter(|_| !constraint.active()) {
            Some(d) => {
                let room = settings.max_tokens - tokens.len();
                let most = speculate::MAX_DRAFT.min(room);
                let ask = match d.fixed_kind() {
                    Some(k) if d.gated() => gate.guesses(k, most),
                    _ => most,
                };
                let (mut g, k) = match (ask, d.fixed_kind()) {
                    (0, Some(k)) if gate.wants_shadow(k) => d.propose(&context, 1),
                    (0, _) => (Vec::new(), 0),
                    _ => d.propose(&context, ask),
                };
                let allowed = if d.gated() && d.fixed_kind().is_none() {
                    gate.guesses(k, g.len())
                } else {
                    ask
                };
                if allowed == 0 {
                    shadow = g.first().map(|&first| (k, first));
                }
                g.truncate(allowed);
                kind = k;
                g
            }
            None => Vec::new(),
        };
        if guesses.is_empty() {
            // A step's own cost, without a shadow guess's.
            let fed = Instant::now();
            logits = session.feed(&[id])?;
            gate.record_step(fed.elapsed());
            stats.speculation.plain_steps += 1;
        } else {
            let (after, kept) = verify(
                &mut session,
                &sampler,
                id,
                &guesses,
                tokens.len(),
                seen.as_mut(),
            )?;
            logits = after;
            ahead.extend(kept);
            gate.record_verify(kind, guesses.len(), ahead.len(), step.elapsed());
            let spec = &mut stats.speculation;
            spec.verify_passes += 1;
            spec.drafted += guesses.len();
            spec.accepted += ahead.len();
        }
        decode_time += step.elapsed();
        stats.decode_steps += 1;
        if let Some(p) = &prefix {
            p.cache.keep(p.model, &session)?;
        }
    };
    // Where the answer ended: the next turn of a conversation goes on
    // from here.
    if let Some(p) = &prefix {
        p.cache.keep_tail(p.model, &session)?;
    }
    if !matches!(
        finish_reason,
        FinishReason::StopString | FinishReason::Cancelled
    ) {
        let parts = splitter.finish()?;
        let rest = match stops.push(&parts.answer) {
            Scan::Continue(s) => s + &stops.finish(),
            Scan::Stop(s) => s,
        };
        if !rest.is_empty() || !parts.reasoning.is_empty() {
            text.push_str(&rest);
            reasoning.push_str(&parts.reasoning);
            on_piece(Piece {
                phase: Phase::Answer,
                token: None,
                text: &rest,
                reasoning: &parts.reasoning,
                tokens_so_far: tokens.len(),
                session: &session,
                settled: ahead.is_empty(),
                prompt_len: prompt.len(),
                speculation: stats.speculation,
            });
        }
    }
    stats.generated_tokens = tokens.len() - resumed.len().min(tokens.len());
    stats.decode_seconds = decode_time.as_secs_f64();
    Ok(Generation {
        tokens,
        text,
        reasoning,
        finish_reason,
        stats,
    })
}
