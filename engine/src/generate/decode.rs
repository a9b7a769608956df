//! The generation loop, in the steps it takes: the prompt read into the
//! session (from the prefix cache where it holds the prompt's first blocks,
//! and from a resumed answer's saved state), then the answer chosen token by
//! token — or several tokens at once where a drafter's guesses are verified
//! in one pass, keeping only those plain decoding would have chosen — each
//! token turned into text (reasoning apart, stop strings held back) as soon
//! as it is final.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::channels::Splitter;
use super::constrain::Constraint;
use super::speculate::{self, Drafter, Gate};
use super::stop::{Scan, StopScanner};
use super::{
    FinishReason, Flow, GenerateError, Generation, GenerationSettings, GenerationStats,
    PROMPT_CHUNK, Phase, Piece, Sampler, Seen, Session, SpeculationStats,
};
use crate::model::{Decoder, ModelError};
use crate::prefix::PrefixUse;
use crate::tokenizer::TextTokenizer;

/// How often replaying a resumed answer token by token reports progress.
const REPLAY_REPORT_INTERVAL: Duration = Duration::from_millis(250);

/// A verified guess and the logits after it.
type KeptGuess = (u32, Vec<f32>);

/// [`super::generate_resumed`] with guesses from `drafter` (none: plain
/// decoding), whatever `settings.speculation` says, and the prompt's first
/// blocks taken from `prefix` where it holds them (and kept there as
/// computed).
#[allow(clippy::too_many_arguments)]
pub fn generate_drafted(
    model: &Decoder,
    tokenizer: &TextTokenizer,
    prompt: &[u32],
    resumed: &[u32],
    saved: &[Vec<u8>],
    settings: &GenerationSettings,
    drafter: Option<&mut dyn Drafter>,
    prefix: Option<PrefixUse<'_>>,
    mut on_piece: impl FnMut(Piece<'_>) -> Flow,
) -> Result<Generation, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    // Generations running at once on this model share their passes.
    let _together = model.lockstep.join();
    let sampler = Sampler::new(settings.sampling.clone())?;
    let mut answer = Answer::new(tokenizer, model, settings, resumed.len());
    let stopped_in_replay = answer.replay(resumed)?;
    let mut stats = GenerationStats {
        prompt_tokens: prompt.len() + resumed.len(),
        ..Default::default()
    };
    let mut session = Session::new(model);
    let (logits, cancelled) = prefill(
        &mut session,
        prompt,
        &answer.tokens,
        saved,
        prefix.as_ref(),
        &mut stats,
        &mut on_piece,
    )?;
    let mut decoding = Decoding {
        sampler,
        settings,
        prompt_len: prompt.len(),
        guessing: Guessing::new(drafter, prompt, &answer.tokens),
        // What the penalties look at, kept as the answer grows (none when off).
        seen: (settings.sampling.penalizes()).then(|| Seen::new(prompt, &answer.tokens)),
        ahead: VecDeque::new(),
        session,
        answer,
        stats,
        decode_time: Duration::ZERO,
        prefix,
    };
    let finish_reason = if cancelled {
        FinishReason::Cancelled
    } else if stopped_in_replay {
        FinishReason::StopString
    } else {
        decoding.run(logits, &mut on_piece)?
    };
    decoding.finish(finish_reason, resumed.len(), &mut on_piece)
}

/// Reads the prompt, then a resumed answer's `tokens`, into `session`,
/// telling `on_piece` how far it has got: the logits after them, and
/// whether the caller stopped it.
fn prefill(
    session: &mut Session<'_>,
    prompt: &[u32],
    tokens: &[u32],
    saved: &[Vec<u8>],
    prefix: Option<&PrefixUse<'_>>,
    stats: &mut GenerationStats,
    on_piece: &mut impl FnMut(Piece<'_>) -> Flow,
) -> Result<(Vec<f32>, bool), GenerateError> {
    let started = Instant::now();
    let total = prompt.len() + tokens.len();
    let mut report = |session: &Session<'_>| {
        on_piece(Piece {
            phase: Phase::Prompt {
                done: session.len(),
                total,
            },
            token: None,
            text: "",
            reasoning: "",
            tokens_so_far: tokens.len(),
            session,
            settled: false,
            prompt_len: prompt.len(),
            speculation: SpeculationStats::default(),
        }) == Flow::Stop
    };
    let (mut logits, mut cancelled) = read_prompt(session, prompt, prefix, stats, &mut report)?;
    if !cancelled {
        (logits, cancelled) = replay_answer(session, tokens, saved, logits, stats, &mut report)?;
    }
    stats.prefill_seconds = started.elapsed().as_secs_f64();
    Ok((logits, cancelled))
}

/// The answer being chosen after the prompt: the session, the answer so
/// far, guessing ahead, and the figures.
struct Decoding<'a, 'd> {
    session: Session<'a>,
    sampler: Sampler,
    settings: &'a GenerationSettings,
    prompt_len: usize,
    answer: Answer<'a>,
    /// Verified guesses fed ahead of the tokens reported: each with the
    /// logits after it.
    ahead: VecDeque<KeptGuess>,
    guessing: Guessing<'d>,
    seen: Option<Seen>,
    stats: GenerationStats,
    decode_time: Duration,
    prefix: Option<PrefixUse<'a>>,
}

impl Decoding<'_, '_> {
    /// Chooses tokens from `logits` (those after the prompt) on until the
    /// answer ends, and why it ended.
    fn run(
        &mut self,
        mut logits: Vec<f32>,
        on_piece: &mut impl FnMut(Piece<'_>) -> Flow,
    ) -> Result<FinishReason, GenerateError> {
        loop {
            if self.answer.tokens.len() >= self.settings.max_tokens {
                return Ok(FinishReason::MaxTokens);
            }
            finite(&logits, self.answer.tokens.len())?;
            let id = self
                .answer
                .choose(&self.sampler, &logits, self.seen.as_ref());
            if self.settings.eos_token_ids.contains(&id) || self.answer.splitter.ends(id) {
                return Ok(FinishReason::Eos);
            }
            if let Some(reason) = self.take(id, on_piece)? {
                return Ok(reason);
            }
            logits = match self.ahead.pop_front() {
                // A guess verified earlier: its logits are computed already.
                Some((guess, after)) => {
                    debug_assert_eq!(guess, id, "a kept guess is the token sampled");
                    after
                }
                None => self.pass(id)?,
            };
        }
    }

    /// Adds token `id` to the answer and reports it; why the answer ends
    /// with it, if it does.
    fn take(
        &mut self,
        id: u32,
        on_piece: &mut impl FnMut(Piece<'_>) -> Flow,
    ) -> Result<Option<FinishReason>, GenerateError> {
        if let Some(s) = &mut self.seen {
            s.push(id);
        }
        self.guessing.took(id);
        let added = self.answer.add(id)?;
        let flow = on_piece(Piece {
            phase: Phase::Answer,
            token: Some(id),
            text: &added.shown,
            reasoning: &added.reasoning,
            tokens_so_far: self.answer.tokens.len(),
            session: &self.session,
            settled: self.ahead.is_empty(),
            prompt_len: self.prompt_len,
            speculation: self.stats.speculation,
        });
        Ok(if added.stopped {
            Some(FinishReason::StopString)
        } else if flow == Flow::Stop {
            Some(FinishReason::Cancelled)
        } else if self.answer.tokens.len() >= self.settings.max_tokens {
            Some(FinishReason::MaxTokens)
        } else {
            None
        })
    }

    /// The forward pass after token `id`: `id` alone, or with guesses
    /// verified in the same pass (those kept wait in `ahead`). The logits
    /// after `id`.
    fn pass(&mut self, id: u32) -> Result<Vec<f32>, GenerateError> {
        let step = Instant::now();
        let room = self.settings.max_tokens - self.answer.tokens.len();
        // Guesses are drawn unconstrained: none while a start is held to.
        let (guesses, kind) = self.guessing.propose(room, self.answer.constraint.active());
        let logits = if guesses.is_empty() {
            // A step's own cost, without a shadow guess's.
            let fed = Instant::now();
            let logits = self.session.feed(&[id])?;
            self.guessing.gate.record_step(fed.elapsed());
            self.stats.speculation.plain_steps += 1;
            logits
        } else {
            let position = self.answer.tokens.len();
            let (after, kept) = verify(
                &mut self.session,
                &self.sampler,
                id,
                &guesses,
                position,
                self.seen.as_mut(),
            )?;
            self.ahead.extend(kept);
            let took = step.elapsed();
            self.guessing
                .gate
                .record_verify(kind, guesses.len(), self.ahead.len(), took);
            let spec = &mut self.stats.speculation;
            spec.verify_passes += 1;
            spec.drafted += guesses.len();
            spec.accepted += self.ahead.len();
            after
        };
        self.decode_time += step.elapsed();
        self.stats.decode_steps += 1;
        if let Some(p) = &self.prefix {
            p.cache.keep(p.model, &self.session)?;
        }
        Ok(logits)
    }

    /// The generation as it ended: the prefix cache keeps where the answer
    /// ended (the next turn of a conversation goes on from there), and
    /// text held back till the end is released unless a stop string or
    /// the caller ended it.
    fn finish(
        mut self,
        finish_reason: FinishReason,
        resumed: usize,
        on_piece: &mut impl FnMut(Piece<'_>) -> Flow,
    ) -> Result<Generation, GenerateError> {
        if let Some(p) = &self.prefix {
            p.cache.keep_tail(p.model, &self.session)?;
        }
        if !matches!(
            finish_reason,
            FinishReason::StopString | FinishReason::Cancelled
        ) && let Some(last) = self.answer.finish()?
        {
            on_piece(Piece {
                phase: Phase::Answer,
                token: None,
                text: &last.shown,
                reasoning: &last.reasoning,
                tokens_so_far: self.answer.tokens.len(),
                session: &self.session,
                settled: self.ahead.is_empty(),
                prompt_len: self.prompt_len,
                speculation: self.stats.speculation,
            });
        }
        let mut stats = self.stats;
        stats.generated_tokens = self.answer.tokens.len() - resumed.min(self.answer.tokens.len());
        stats.decode_seconds = self.decode_time.as_secs_f64();
        Ok(Generation {
            tokens: self.answer.tokens,
            text: self.answer.text,
            reasoning: self.answer.reasoning,
            finish_reason,
            stats,
        })
    }
}

/// Reads `prompt` into `session`: its first blocks from the prefix cache
/// where it holds them, the rest in passes of [`PROMPT_CHUNK`] that end on
/// multiples of it (wherever a restored prefix ended), so each block's end
/// is seen and kept. `report` is told of each pass and answers whether to
/// stop. Returns the logits after the prompt's last position (empty when
/// the prefix cache held all of it, or when it was stopped) and whether the
/// caller stopped it.
fn read_prompt(
    session: &mut Session<'_>,
    prompt: &[u32],
    prefix: Option<&PrefixUse<'_>>,
    stats: &mut GenerationStats,
    report: &mut impl FnMut(&Session<'_>) -> bool,
) -> Result<(Vec<f32>, bool), GenerateError> {
    if let Some(p) = prefix {
        let restored = p.cache.restore(p.model, session, prompt);
        stats.prefix_positions = restored.positions;
        stats.prefix_bytes = restored.bytes;
        stats.prefix_refused = restored.refused;
    }
    let mut logits = Vec::new();
    let mut cancelled = report(session);
    let mut at = session.len();
    while at < prompt.len() && !cancelled {
        let end = ((at / PROMPT_CHUNK + 1) * PROMPT_CHUNK).min(prompt.len());
        logits = session.feed(&prompt[at..end])?;
        at = end;
        if let Some(p) = prefix {
            p.cache.keep(p.model, session)?;
        }
        cancelled = report(session);
    }
    if let Some(p) = prefix.filter(|_| !cancelled) {
        p.cache.keep_tail(p.model, session)?;
    }
    Ok((logits, cancelled))
}

/// Puts a resumed answer's `tokens` into the session after the prompt: the
/// first from `saved` state (snapshots kept by the caller, in order) where
/// it holds them, the others fed one at a time, exactly as they were first
/// computed — a batched pass sums in another order, and its last-bit
/// differences could tip a sampled token. Saved state covers at most all but
/// the last token: its logits, which pick the next token, come only from
/// feeding it. Returns the logits after the last position (`logits`, the
/// prompt's, when there are no tokens) and whether the caller stopped it.
fn replay_answer(
    session: &mut Session<'_>,
    tokens: &[u32],
    saved: &[Vec<u8>],
    mut logits: Vec<f32>,
    stats: &mut GenerationStats,
    report: &mut impl FnMut(&Session<'_>) -> bool,
) -> Result<(Vec<f32>, bool), GenerateError> {
    let mut restored = 0;
    for bytes in saved {
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
    let mut cancelled = false;
    let mut last_report = Instant::now();
    for &id in &tokens[restored..] {
        if cancelled {
            break;
        }
        logits = session.feed(&[id])?;
        if last_report.elapsed() >= REPLAY_REPORT_INTERVAL {
            last_report = Instant::now();
            cancelled = report(session);
        }
    }
    if !cancelled && restored < tokens.len() {
        cancelled = report(session);
    }
    Ok((logits, cancelled))
}

/// The answer as it is written: its tokens, its text and reasoning, and what
/// turns tokens into them (the output channels, the stop strings, a start
/// the answer is held to).
struct Answer<'t> {
    splitter: Splitter<'t>,
    stops: StopScanner,
    constraint: Constraint<'t>,
    tokens: Vec<u32>,
    text: String,
    reasoning: String,
}

/// What one token (or the end) made final.
struct Added {
    shown: String,
    reasoning: String,
    /// A stop string ended the answer.
    stopped: bool,
}

impl<'t> Answer<'t> {
    fn new(
        tokenizer: &'t TextTokenizer,
        model: &Decoder,
        settings: &'t GenerationSettings,
        capacity: usize,
    ) -> Self {
        let texts = if settings.answer_starts.is_empty() {
            &[][..]
        } else {
            tokenizer.token_texts(model.vocab_size)
        };
        Self {
            splitter: Splitter::new(tokenizer, settings.output, settings.keep_special_tokens),
            stops: StopScanner::new(settings.stop_strings.clone()),
            constraint: Constraint::new(&settings.answer_starts, texts),
            tokens: Vec::with_capacity(capacity),
            text: String::new(),
            reasoning: String::new(),
        }
    }

    /// Takes a resumed answer's tokens through the text without reporting
    /// them again; true when a stop string ended it among them.
    fn replay(&mut self, resumed: &[u32]) -> Result<bool, GenerateError> {
        for &id in resumed {
            if self.add(id)?.stopped {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The next token drawn from `logits`, held to the answer's start while
    /// one is asked for.
    fn choose(&mut self, sampler: &Sampler, logits: &[f32], seen: Option<&Seen>) -> u32 {
        let position = self.tokens.len();
        if self.constraint.active() && self.splitter.writing_answer() {
            let mut held = logits.to_vec();
            self.constraint
                .mask(&mut held, self.splitter.may_open_reasoning());
            sampler.sample_seen(&held, position, seen)
        } else {
            sampler.sample_seen(logits, position, seen)
        }
    }

    /// Adds token `id` to the answer.
    fn add(&mut self, id: u32) -> Result<Added, GenerateError> {
        self.tokens.push(id);
        let parts = self.splitter.push(id)?;
        self.constraint.push(&parts.answer);
        let (shown, stopped) = match self.stops.push(&parts.answer) {
            Scan::Continue(s) => (s, false),
            Scan::Stop(s) => (s, true),
        };
        self.text.push_str(&shown);
        self.reasoning.push_str(&parts.reasoning);
        Ok(Added {
            shown,
            reasoning: parts.reasoning,
            stopped,
        })
    }

    /// The text held back until the end (a partial stop string that never
    /// completed, an unfinished character), if there is any.
    fn finish(&mut self) -> Result<Option<Added>, GenerateError> {
        let parts = self.splitter.finish()?;
        let rest = match self.stops.push(&parts.answer) {
            Scan::Continue(s) => s + &self.stops.finish(),
            Scan::Stop(s) => s,
        };
        if rest.is_empty() && parts.reasoning.is_empty() {
            return Ok(None);
        }
        self.text.push_str(&rest);
        self.reasoning.push_str(&parts.reasoning);
        Ok(Some(Added {
            shown: rest,
            reasoning: parts.reasoning,
            stopped: false,
        }))
    }
}

/// Guessing ahead: the drafter, the gate that decides how many of its
/// guesses are worth a verify pass, and what it guesses from.
struct Guessing<'d> {
    drafter: Option<&'d mut dyn Drafter>,
    /// Declined guesses are checked in the shadow of plain steps, so every
    /// kind starts shut until guesses are seen to be kept.
    gate: Gate,
    /// A guess the gate declined, checked against the next token chosen.
    shadow: Option<(usize, u32)>,
    /// The prompt and the answer so far, kept as it grows rather than
    /// copied every step (empty without a drafter).
    context: Vec<u32>,
}

impl<'d> Guessing<'d> {
    fn new(drafter: Option<&'d mut dyn Drafter>, prompt: &[u32], answer: &[u32]) -> Self {
        let mut context = Vec::new();
        if drafter.is_some() {
            context.extend_from_slice(prompt);
            context.extend_from_slice(answer);
        }
        Self {
            drafter,
            gate: Gate::shadowed(),
            shadow: None,
            context,
        }
    }

    /// Token `id` was chosen: it joins the context, and settles a shadow
    /// guess.
    fn took(&mut self, id: u32) {
        if self.drafter.is_some() {
            self.context.push(id);
        }
        if let Some((kind, guess)) = self.shadow.take() {
            self.gate.record_shadow(kind, guess == id);
        }
    }

    /// At most `room` guesses to verify after the token just chosen, and the
    /// kind that made them; none without a drafter or while `held` (the
    /// answer is held to a start).
    fn propose(&mut self, room: usize, held: bool) -> (Vec<u32>, usize) {
        let Some(d) = self.drafter.as_deref_mut().filter(|_| !held) else {
            return (Vec::new(), 0);
        };
        let most = speculate::MAX_DRAFT.min(room);
        let ask = match d.fixed_kind() {
            Some(k) if d.gated() => self.gate.guesses(k, most),
            _ => most,
        };
        let (mut guesses, kind) = match (ask, d.fixed_kind()) {
            (0, Some(k)) if self.gate.wants_shadow(k) => d.propose(&self.context, 1),
            (0, _) => (Vec::new(), 0),
            _ => d.propose(&self.context, ask),
        };
        let allowed = if d.gated() && d.fixed_kind().is_none() {
            self.gate.guesses(kind, guesses.len())
        } else {
            ask
        };
        if allowed == 0 {
            self.shadow = guesses.first().map(|&first| (kind, first));
        }
        guesses.truncate(allowed);
        (guesses, kind)
    }
}

/// Refuses scores with a NaN or +∞ in them (−∞ is a masked token).
fn finite(logits: &[f32], position: usize) -> Result<(), ModelError> {
    if logits.iter().any(|l| l.is_nan() || *l == f32::INFINITY) {
        Err(ModelError::NonFiniteLogits { position })
    } else {
        Ok(())
    }
}

/// Feeds `id` and `guesses` in one pass and keeps the guesses plain
/// decoding would have chosen: the one at answer position `next + j` is
/// kept when the draw for that position from the row before it picks it.
/// Returns the logits after `id` and the kept guesses, each with the logits
/// after it; the state of the rows after the last kept guess is cut away.
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
