//! Speculative decoding that never changes a token.
//!
//! A drafter guesses the tokens that follow; one forward pass feeds the
//! token just chosen and the guesses, with logits for every row. Every
//! kernel is batch-invariant, so row `j` holds bitwise the logits a one-row
//! step would have computed at that position; each row is then sampled with
//! plain decoding's own draw for that position (it depends only on the seed
//! and the position). A guess is kept only where that draw picks it, so the
//! answer is the one plain decoding gives, greedy or sampled. The state of
//! rejected rows is cut away (`Session::truncate`; recurrent layers return to
//! the mark taken before the pass).
//!
//! Why it can pay on a machine that streams experts: the pass reads each
//! expert once for all its rows, where a step per token reads them per token.
//! Why it can cost: rejected rows bring their own experts and compute. The
//! [`Gate`] measures both and stops guessing while guessing does not pay.

use std::time::Duration;

/// How a generation guesses ahead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Speculation {
    /// Plain decoding: one token per forward pass.
    #[default]
    Off,
    /// Guesses from earlier text of the same sequence: the tokens that
    /// followed the last time its newest tokens appeared (prompt lookup).
    Lookup,
}

/// Guesses what follows a sequence. Whatever it guesses, the answer stays
/// plain decoding's: guesses only decide how many tokens a pass can yield.
pub trait Drafter {
    /// Up to `max` tokens that may follow `context` (prompt and answer so
    /// far), and the kind of guess it is: guesses of one kind are kept about
    /// as often as each other (for prompt lookup, the length of the match),
    /// and the gate judges each kind on its own record. Kinds are below
    /// [`GUESS_KINDS`].
    fn propose(&mut self, context: &[u32], max: usize) -> (Vec<u32>, usize);

    /// Whether the gate may shorten or skip its guesses (a drafter used to
    /// test verification wants every guess verified).
    fn gated(&self) -> bool {
        true
    }

    /// The kind of every guess, when it is known before guessing (then the
    /// gate decides how many to ask for, and none are made in vain).
    fn fixed_kind(&self) -> Option<usize> {
        None
    }
}

/// Kinds of guess the gate keeps apart.
pub const GUESS_KINDS: usize = 8;

/// Prompt lookup as a [`Drafter`]; a guess's kind is its match length.
#[derive(Debug, Default, Clone, Copy)]
pub struct PromptLookup;

impl Drafter for PromptLookup {
    fn propose(&mut self, context: &[u32], max: usize) -> (Vec<u32>, usize) {
        lookup(context, max)
    }
}

/// Kind of the guesses a draft model makes (prompt lookup's kinds are its
/// match lengths, 2 to 4).
pub const DRAFT_MODEL_KIND: usize = 5;

/// A small model with the same tokenizer as a [`Drafter`]: it continues the
/// sequence greedily. Its session follows the verified sequence: each call
/// cuts it back to what it shares with the context and feeds the rest, so
/// only new tokens are computed.
pub struct DraftModel<'m> {
    session: super::Session<'m>,
}

impl<'m> DraftModel<'m> {
    pub fn new(session: super::Session<'m>) -> Self {
        Self { session }
    }

    fn try_propose(
        &mut self,
        context: &[u32],
        max: usize,
    ) -> Result<Vec<u32>, crate::model::ModelError> {
        let shared = self
            .session
            .ids()
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len().saturating_sub(1));
        self.session.truncate(shared)?;
        let mut logits = self.session.feed(&context[shared..])?;
        self.session.mark();
        let mut guesses = Vec::with_capacity(max);
        for i in 0..max {
            let t = super::sampling::argmax(&logits);
            guesses.push(t);
            if i + 1 < max {
                logits = self.session.feed(&[t])?;
            }
        }
        Ok(guesses)
    }
}

impl Drafter for DraftModel<'_> {
    fn fixed_kind(&self) -> Option<usize> {
        Some(DRAFT_MODEL_KIND)
    }

    fn propose(&mut self, context: &[u32], max: usize) -> (Vec<u32>, usize) {
        if context.is_empty() || max == 0 {
            return (Vec::new(), DRAFT_MODEL_KIND);
        }
        // A draft that fails only costs its guesses: decoding goes on plainly.
        let guesses = self.try_propose(context, max).unwrap_or_default();
        (guesses, DRAFT_MODEL_KIND)
    }
}

/// Longest guess verified in one pass.
pub const MAX_DRAFT: usize = 8;
/// The longest and shortest n-grams prompt lookup matches, longest first.
const LOOKUP_MAX_NGRAM: usize = 4;
const LOOKUP_MIN_NGRAM: usize = 2;

/// Guesses for what follows `context`: the tokens after the most recent
/// earlier occurrence of its last n tokens (n from 4 down to 2), at most
/// `max` of them, with the n that matched; none when nothing matches.
pub fn lookup(context: &[u32], max: usize) -> (Vec<u32>, usize) {
    for n in (LOOKUP_MIN_NGRAM..=LOOKUP_MAX_NGRAM).rev() {
        if context.len() <= n {
            continue;
        }
        let tail = &context[context.len() - n..];
        // The most recent earlier occurrence, whose continuation is in context.
        let found = (0..context.len() - n)
            .rev()
            .find(|&start| &context[start..start + n] == tail);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + max).min(context.len());
            return (context[from..to].to_vec(), n);
        }
    }
    (Vec::new(), 0)
}

/// What speculation did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SpeculationStats {
    /// Forward passes that verified guesses.
    pub verify_passes: usize,
    /// Guessed tokens verified, and those kept.
    pub drafted: usize,
    pub accepted: usize,
    /// Forward passes of one token (no guess, or guessing paused).
    pub plain_steps: usize,
}

impl SpeculationStats {
    /// Share of guesses kept.
    pub fn acceptance(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }
}

/// How much of the past the gate's cost estimates keep per verify pass.
const GATE_DECAY: f64 = 0.8;
/// How much of the past the acceptance estimates keep per guess checked
/// (verified or in the shadow of a plain step): about the last 20. A
/// shorter memory (0.8) opened the gate after a lucky streak of sampled
/// prose and lost 4.5 % to rejected rows (quoted file, temperature 0.7).
const ACCEPTANCE_DECAY: f64 = 0.95;
/// Starting guesses for the estimates, before anything is measured: how
/// often a guess is kept grows with its kind (for prompt lookup, a longer
/// match: 0.5 for 2 tokens, 0.55 for 3, 0.6 for 4), and an extra row costs
/// half a step. So the first guess of a kind is a single token when its
/// match is 3 tokens or longer, and guessing on sampled prose, where nearly
/// every guess is rejected, stops after a row or two. (A rejected one-guess
/// pass on the demo model streaming from 4 × 10 MB/s drives cost 1.3 steps;
/// a pessimistic prior of a whole step kept quoted text from ever being
/// guessed, since a lone guess costs more per row than the 8-guess passes
/// quoting makes worthwhile.)
const PRIOR_CONTINUE_BASE: f64 = 0.4;
const PRIOR_CONTINUE_PER_KIND: f64 = 0.05;
const PRIOR_CONTINUE_MAX: f64 = 0.8;
const PRIOR_ROW_COST: f64 = 0.5;
/// Weight of the priors, in passes.
const PRIOR_WEIGHT: f64 = 1.0;
/// With declined guesses checked in the shadow of plain steps, every kind
/// starts shut, as if four guesses had been checked and 30 % kept: guessing
/// begins once a run of shadows is kept, which quoted text gives within a
/// few tokens, rather than on a prior's promise (which on sampled prose cost
/// 1–2 % in rejected rows) or a lucky pair (a weight of 2 let a demo draft
/// model that agrees with the demo model's greedy answer about a third of
/// the time open the gate, at 0.975×).
const SHADOWED_PRIOR_CONTINUE: f64 = 0.3;
const SHADOWED_PRIOR_WEIGHT: f64 = 4.0;
/// Passes of one length measured (decayed) before their own cost is used.
const MEASURED_WEIGHT: f64 = 1.0;
/// How often a kept guess must be followed by another before untried
/// longer passes are costed hopefully (see [`Gate`]'s `cost`).
const OPTIMISM_MIN_CONTINUE: f64 = 0.8;
/// Plain steps between probes while guessing does not pay; doubles after
/// each probe that does not pay, up to the maximum. A rejected probe costs
/// most of a step (0.6–0.9 on the demo model streaming from 4 × 10 MB/s),
/// so over a 200-token answer these cost about 1 %. Guesses checked in the
/// shadow of plain steps (see [`Gate::record_shadow`]) need no probes.
const PROBE_EVERY: usize = 32;
const PROBE_EVERY_MAX: usize = 512;
/// Guesses a probe verifies: one, the cheapest test.
const PROBE_GUESSES: usize = 1;
/// While the gate is shut, a drafter that guesses only when asked (a draft
/// model) is asked for one guess every this many steps, checked in the
/// shadow of the plain step: it costs a draft model's forward pass, not a
/// rejected row's expert reads. A demo draft model at 4 × 10 MB/s: rare
/// probes (32 steps, doubling) learned its acceptance from 3 guesses in 200
/// tokens, missed that a repetitive answer was guessed 99 % right, and lost
/// a 1.27× speed-up. Every 4 steps found it (1.36×), but a draft with
/// another tokenizer, whose guess re-encodes the text, then cost 2 % where
/// the gate stayed shut; every 8 halves that.
pub const SHADOW_EVERY: usize = 8;
/// A pass must promise at least this many times plain decoding's tokens per
/// unit of time. Above 1: the estimates come from a few passes, and a pass
/// chosen when it only breaks even on paper loses whenever they run high
/// (at a threshold of 0.98, sampled prose ran at 0.980–0.982×).
pub const GATE_MIN_GAIN: f64 = 1.05;

/// Chooses how many guesses to verify in the next pass (0: a plain step),
/// from two measured quantities: how likely a kept guess is to be followed
/// by another (so a pass of `k` guesses yields `1 + a + a² + … + aᵏ` tokens
/// on average) and what each extra row adds to a step's time (`r`, so the
/// pass costs `1 + r·k` steps). It takes the `k` with the best tokens per
/// step-time and guesses only when that is at least [`GATE_MIN_GAIN`].
/// Acceptance changes with the text (a quoted file accepts almost every
/// guess, free sampled prose few), so the estimates are kept current while
/// the gate is shut: a guess made and declined is checked against the token
/// plain decoding then picks, for free, and a drafter that only guesses when
/// asked (a draft model) is asked for one such guess every [`SHADOW_EVERY`]
/// steps. A caller that checks no shadows gets a one-guess probe every so
/// often instead.
#[derive(Debug)]
pub struct Gate {
    kinds: [Record; GUESS_KINDS],
    /// What an extra row adds to a step's time, over all passes.
    row_cost: (f64, f64),
    /// A pass's time in steps, for each number of guesses measured: rows
    /// that copy earlier text share experts, so 8 guesses cost far less
    /// than 8 times one, and a lone probe must not make long passes look dear.
    pass_cost: [(f64, f64); MAX_DRAFT + 1],
    step: Option<Duration>,
}

/// What guesses of one kind did.
#[derive(Debug, Clone, Copy)]
struct Record {
    kept: f64,
    missed: f64,
    since_probe: usize,
    probe_every: usize,
    since_shadow: usize,
}

impl Record {
    fn new(kind: usize) -> Self {
        let prior =
            (PRIOR_CONTINUE_BASE + PRIOR_CONTINUE_PER_KIND * kind as f64).min(PRIOR_CONTINUE_MAX);
        Self::with_prior(prior, PRIOR_WEIGHT)
    }

    fn with_prior(prior: f64, weight: f64) -> Self {
        Self {
            kept: prior * weight,
            missed: (1.0 - prior) * weight,
            since_probe: 0,
            probe_every: PROBE_EVERY,
            since_shadow: 0,
        }
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            kinds: std::array::from_fn(Record::new),
            row_cost: (PRIOR_ROW_COST * PRIOR_WEIGHT, PRIOR_WEIGHT),
            pass_cost: [(0.0, 0.0); MAX_DRAFT + 1],
            step: None,
        }
    }
}

impl Gate {
    /// A gate for a drafter whose declined guesses are checked in the shadow
    /// of plain steps (see [`Gate::record_shadow`]): every kind starts shut.
    pub fn shadowed() -> Self {
        Self {
            kinds: [Record::with_prior(SHADOWED_PRIOR_CONTINUE, SHADOWED_PRIOR_WEIGHT);
                GUESS_KINDS],
            ..Self::default()
        }
    }

    /// Tokens per step-time of a pass of `k` guesses of `kind`, as estimated now.
    fn value(&self, kind: usize, k: usize) -> f64 {
        let rec = &self.kinds[kind.min(GUESS_KINDS - 1)];
        let a = rec.kept / (rec.kept + rec.missed).max(f64::MIN_POSITIVE);
        let tokens: f64 = (0..=k).map(|i| a.powi(i as i32)).sum();
        tokens / self.cost(k, a)
    }

    /// A pass of `k` guesses in steps: as measured for `k`, else from the
    /// row cost over all passes. For guesses that are nearly always kept
    /// (`a` at least [`OPTIMISM_MIN_CONTINUE`]) an untried length is costed
    /// no dearer than the prior, so that it gets measured: rows of longer
    /// passes share more experts, and a lone guess's cost overstates theirs.
    fn cost(&self, k: usize, a: f64) -> f64 {
        match self.pass_cost.get(k) {
            Some(&(sum, weight)) if weight >= MEASURED_WEIGHT => sum / weight,
            _ => {
                let r = self.row_cost.0 / self.row_cost.1.max(f64::MIN_POSITIVE);
                let r = if a >= OPTIMISM_MIN_CONTINUE {
                    r.min(PRIOR_ROW_COST)
                } else {
                    r
                };
                1.0 + r * k as f64
            }
        }
    }

    /// Guesses of `kind` to verify next, at most `available`.
    pub fn guesses(&mut self, kind: usize, available: usize) -> usize {
        if available == 0 {
            return 0;
        }
        let best = (1..=available)
            .max_by(|&x, &y| self.value(kind, x).total_cmp(&self.value(kind, y)))
            .filter(|&k| self.value(kind, k) >= GATE_MIN_GAIN);
        if let Some(k) = best {
            return k;
        }
        let rec = &mut self.kinds[kind.min(GUESS_KINDS - 1)];
        rec.since_probe += 1;
        if rec.since_probe >= rec.probe_every {
            rec.since_probe = 0;
            rec.probe_every = (rec.probe_every * 2).min(PROBE_EVERY_MAX);
            return PROBE_GUESSES.min(available);
        }
        0
    }

    /// A guess of `kind` made but not verified (the gate said no), checked
    /// against the token plain decoding then chose: acceptance stays current
    /// at no cost, and the kind needs no probes.
    pub fn record_shadow(&mut self, kind: usize, kept: bool) {
        let rec = &mut self.kinds[kind.min(GUESS_KINDS - 1)];
        rec.kept = rec.kept * ACCEPTANCE_DECAY + f64::from(u8::from(kept));
        rec.missed = rec.missed * ACCEPTANCE_DECAY + f64::from(u8::from(!kept));
        rec.since_probe = 0;
    }

    /// Whether to ask a drafter that guesses only when asked for one guess
    /// of `kind` to check in the shadow of the next plain step (the gate
    /// being shut for it): every [`SHADOW_EVERY`] steps.
    pub fn wants_shadow(&mut self, kind: usize) -> bool {
        let rec = &mut self.kinds[kind.min(GUESS_KINDS - 1)];
        rec.since_shadow += 1;
        if rec.since_shadow >= SHADOW_EVERY {
            rec.since_shadow = 0;
            return true;
        }
        false
    }

    pub fn record_step(&mut self, took: Duration) {
        self.step = Some(match self.step {
            Some(s) => s.mul_f64(GATE_DECAY) + took.mul_f64(1.0 - GATE_DECAY),
            None => took,
        });
    }

    /// A verify pass of `guessed` guesses of `kind` that kept `kept`, in `took`.
    pub fn record_verify(&mut self, kind: usize, guessed: usize, kept: usize, took: Duration) {
        let step = self.step.filter(|s| !s.is_zero());
        let rec = &mut self.kinds[kind.min(GUESS_KINDS - 1)];
        rec.kept = rec.kept * ACCEPTANCE_DECAY + kept as f64;
        rec.missed = rec.missed * ACCEPTANCE_DECAY + f64::from(u8::from(kept < guessed));
        if let Some(step) = step {
            let steps = (took.as_secs_f64() / step.as_secs_f64()).max(1.0);
            let extra = (steps - 1.0) / guessed.max(1) as f64;
            self.row_cost = (
                self.row_cost.0 * GATE_DECAY + extra,
                self.row_cost.1 * GATE_DECAY + 1.0,
            );
            if let Some(c) = self.pass_cost.get_mut(guessed) {
                *c = (c.0 * GATE_DECAY + steps, c.1 * GATE_DECAY + 1.0);
            }
        }
        if self.value(kind, guessed.max(1)) >= GATE_MIN_GAIN {
            self.kinds[kind.min(GUESS_KINDS - 1)].probe_every = PROBE_EVERY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_earlier_occurrence() {
        // "a b c d" then later "a b c" → guess "d e".
        let ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(lookup(&ctx, 2), (vec![4, 5], 3));
        // The latest match wins, and the guess stops at the context's end.
        let ctx = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(lookup(&ctx, 4), (vec![2, 7, 8], 2));
        assert!(lookup(&[1, 2, 3, 4], 4).0.is_empty(), "nothing repeats");
        assert!(lookup(&[5, 5], 4).0.is_empty(), "too short to match");
    }

    #[test]
    fn the_gate_guesses_while_it_pays_and_probes_while_it_does_not() {
        let step = Duration::from_millis(100);
        // Guesses that are nearly all kept, on rows that cost little: guess long.
        let mut g = Gate::default();
        g.record_step(step);
        for _ in 0..10 {
            let k = g.guesses(4, MAX_DRAFT);
            assert!(k > 0);
            g.record_verify(4, k, k, step.mul_f64(1.0 + 0.1 * k as f64));
        }
        assert_eq!(g.guesses(4, MAX_DRAFT), MAX_DRAFT);
        // Guesses that are never kept: stop, then probe rarely.
        let mut g = Gate::default();
        g.record_step(step);
        for _ in 0..10 {
            if g.guesses(2, MAX_DRAFT) > 0 {
                g.record_verify(2, 1, 0, step.mul_f64(1.1));
            }
        }
        let probes = (0..1000).filter(|_| g.guesses(2, MAX_DRAFT) > 0).count();
        assert!((1..=8).contains(&probes), "{probes} probes in 1000 steps");
        // Another kind of guess is judged on its own record.
        assert!(g.guesses(4, MAX_DRAFT) > 0);
    }

    #[test]
    fn guesses_checked_in_the_shadow_of_plain_steps_open_the_gate_or_keep_it_shut_without_probes() {
        let step = Duration::from_millis(100);
        // Two-token matches start shut (their prior does not promise enough).
        let mut g = Gate::default();
        g.record_step(step);
        assert_eq!(g.guesses(2, MAX_DRAFT), 0);
        // Declined guesses that plain decoding then picks open it.
        let opened = (0..PROBE_EVERY).find(|_| {
            let k = g.guesses(2, MAX_DRAFT);
            g.record_shadow(2, true);
            k > 0
        });
        assert!(opened.is_some(), "kept shadows open the gate");
        // Declined guesses that are wrong keep it shut, and nothing is probed.
        let mut g = Gate::default();
        g.record_step(step);
        let verified = (0..1000)
            .filter(|_| {
                let k = g.guesses(2, MAX_DRAFT);
                g.record_shadow(2, false);
                k > 0
            })
            .count();
        assert_eq!(verified, 0);
        // A shadowed gate starts every kind shut; a short run of kept shadows opens it.
        let mut g = Gate::shadowed();
        g.record_step(step);
        assert_eq!(g.guesses(4, MAX_DRAFT), 0);
        let opened = (1..=10).find(|_| {
            g.record_shadow(4, true);
            g.guesses(4, MAX_DRAFT) > 0
        });
        assert!(
            matches!(opened, Some(3..=6)),
            "opened after {opened:?} kept shadows"
        );
        // A drafter that guesses only when asked is asked every few steps.
        let asked = (0..10 * SHADOW_EVERY).filter(|_| g.wants_shadow(5)).count();
        assert_eq!(asked, 10);
    }
}
