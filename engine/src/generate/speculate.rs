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
    /// Up to `max` tokens that may follow `context` (prompt and answer so far).
    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32>;
}

/// Prompt lookup as a [`Drafter`].
#[derive(Debug, Default, Clone, Copy)]
pub struct PromptLookup;

impl Drafter for PromptLookup {
    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        lookup(context, max)
    }
}

/// Longest guess verified in one pass.
pub const MAX_DRAFT: usize = 8;
/// The longest and shortest n-grams prompt lookup matches, longest first.
const LOOKUP_MAX_NGRAM: usize = 4;
const LOOKUP_MIN_NGRAM: usize = 2;

/// Guesses for what follows `context`: the tokens after the most recent
/// earlier occurrence of its last n tokens (n from 4 down to 2), at most
/// `max` of them; none when nothing matches.
pub fn lookup(context: &[u32], max: usize) -> Vec<u32> {
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
            return context[from..to].to_vec();
        }
    }
    Vec::new()
}

/// What speculation did in one generation.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
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

/// Passes measured before the gate judges (the first ones also warm caches).
const GATE_WARMUP: usize = 4;
/// Plain steps taken before guessing is tried again after it did not pay.
const GATE_BACKOFF_STEPS: usize = 32;
/// Guessing must keep at least this share of plain decoding's token rate.
pub const GATE_FLOOR: f64 = 0.98;

/// Decides whether to guess, from measured rates: tokens per second from
/// verify passes against tokens per second from plain steps. Guessing that
/// falls below [`GATE_FLOOR`] of the plain rate is paused for
/// [`GATE_BACKOFF_STEPS`] steps and then tried again, since acceptance
/// changes with the text (a quoted file accepts almost everything, free
/// prose little).
#[derive(Debug, Default)]
pub struct Gate {
    step: (usize, Duration),
    verify: (usize, Duration),
    passes: usize,
    paused_for: usize,
}

impl Gate {
    /// Whether to guess before the next pass.
    pub fn allows(&mut self) -> bool {
        if self.paused_for > 0 {
            self.paused_for -= 1;
            return false;
        }
        true
    }

    pub fn record_step(&mut self, took: Duration) {
        self.step.0 += 1;
        self.step.1 += took;
    }

    /// A verify pass that produced `tokens` (accepted guesses plus the
    /// token after them) in `took`.
    pub fn record_verify(&mut self, tokens: usize, took: Duration) {
        self.verify.0 += tokens;
        self.verify.1 += took;
        self.passes += 1;
        if self.passes >= GATE_WARMUP && self.step.0 > 0 && self.paying() == Some(false) {
            self.paused_for = GATE_BACKOFF_STEPS;
            // Judge the next tries on their own.
            self.verify = (0, Duration::ZERO);
            self.passes = 0;
        }
    }

    /// Whether guessing has paid so far (none: not measured yet).
    fn paying(&self) -> Option<bool> {
        let rate = |(n, t): (usize, Duration)| {
            let s = t.as_secs_f64();
            (s > 0.0).then(|| n as f64 / s)
        };
        Some(rate(self.verify)? >= GATE_FLOOR * rate(self.step)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_earlier_occurrence() {
        // "a b c d" then later "a b c" → guess "d e".
        let ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(lookup(&ctx, 2), vec![4, 5]);
        // The latest match wins, and the guess stops at the context's end.
        let ctx = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(lookup(&ctx, 4), vec![2, 7, 8]);
        assert!(lookup(&[1, 2, 3, 4], 4).is_empty(), "nothing repeats");
        assert!(lookup(&[5, 5], 4).is_empty(), "too short to match");
    }

    #[test]
    fn the_gate_pauses_guessing_that_does_not_pay_and_tries_again() {
        let mut g = Gate::default();
        g.record_step(Duration::from_millis(100));
        for _ in 0..GATE_WARMUP {
            assert!(g.allows());
            // One token per 300 ms against 10 per second plain.
            g.record_verify(1, Duration::from_millis(300));
        }
        for _ in 0..GATE_BACKOFF_STEPS {
            assert!(!g.allows(), "paused");
        }
        assert!(g.allows(), "tried again");
        // Paying guesses keep going.
        let mut g = Gate::default();
        g.record_step(Duration::from_millis(100));
        for _ in 0..10 {
            assert!(g.allows());
            g.record_verify(4, Duration::from_millis(150));
        }
        assert!(g.allows());
    }
}
