//! Choosing the next token from logits: greedy, or seeded sampling with
//! temperature, top-k and top-p (nucleus) filtering, after the penalties a
//! request asks for: transformers' `repetition_penalty` (over the prompt
//! and the answer, a positive logit divided by it and a negative one
//! multiplied, as `RepetitionPenaltyLogitsProcessor`) and then OpenAI's
//! `frequency_penalty` and `presence_penalty` (over the answer so far,
//! `logit - frequency × count - presence × (count > 0)`, as vLLM computes
//! them), each in f32 in that order, so greedy answers equal those
//! references token for token (`engine/tests/penalties.rs`).

use std::collections::{HashMap, HashSet};

use crate::kernels::math::exp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How to pick tokens. `temperature == 0` means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep only the k most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    pub seed: u64,
    /// 1 is off; above 1 discourages any token already in the prompt or
    /// the answer, below 1 encourages it.
    pub repetition_penalty: f32,
    /// 0 is off; taken off a token's logit once per time it is in the
    /// answer so far (OpenAI: −2 to 2).
    pub frequency_penalty: f32,
    /// 0 is off; taken off the logit of every token in the answer so far.
    pub presence_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
        }
    }
}

/// The most a frequency or presence penalty may be, either way (OpenAI's
/// range).
pub const MAX_OPENAI_PENALTY: f32 = 2.0;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be a finite number ≥ 0, got {0}")]
    Temperature(f32),
    #[error("top-p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("top-k must be at least 1")]
    TopK,
    #[error("repetition penalty must be a finite number > 0 (1 is off), got {0}")]
    RepetitionPenalty(f32),
    #[error("{name} must be a number from -2 to 2 (0 is off), got {value}")]
    OpenAiPenalty { name: &'static str, value: f32 },
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if self.top_k == Some(0) {
            return Err(SamplingError::TopK);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(SamplingError::RepetitionPenalty(self.repetition_penalty));
        }
        for (name, value) in [
            ("frequency penalty", self.frequency_penalty),
            ("presence penalty", self.presence_penalty),
        ] {
            if value.is_nan() || value.abs() > MAX_OPENAI_PENALTY {
                return Err(SamplingError::OpenAiPenalty { name, value });
            }
        }
        Ok(())
    }

    /// Whether any penalty is on.
    pub fn penalizes(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }
}

/// What the penalties look at: the prompt's tokens, and how often each
/// token is in the answer so far.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    prompt: HashSet<u32>,
    answer: HashMap<u32, u32>,
}

impl Seen {
    pub fn new(prompt: &[u32], answer: &[u32]) -> Self {
        let mut seen = Self {
            prompt: prompt.iter().copied().collect(),
            answer: HashMap::new(),
        };
        answer.iter().for_each(|&id| seen.push(id));
        seen
    }

    /// The answer grew by `id`.
    pub fn push(&mut self, id: u32) {
        *self.answer.entry(id).or_insert(0) += 1;
    }

    /// Takes back a [`Seen::push`] of `id` (a guess that was only tried).
    pub fn pop(&mut self, id: u32) {
        if let Some(n) = self.answer.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                self.answer.remove(&id);
            }
        }
    }
}

/// Picks tokens. The random draw for the token at position `step` of the
/// answer depends only on the seed and `step`, never on earlier draws, so a
/// generation resumed after `step` tokens continues exactly as it would have.
pub struct Sampler {
    params: SamplingParams,
}

/// splitmix64's increment: spreads consecutive steps over the seed space.
const STEP_STRIDE: u64 = 0x9E37_79B9_7F4A_7C15;

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Self { params })
    }

    /// The token for position `step` of the answer after the penalties
    /// over `seen` (`None` when no penalty is on).
    pub fn sample_seen(&self, logits: &[f32], step: usize, seen: Option<&Seen>) -> u32 {
        match seen.filter(|_| self.params.penalizes()) {
            None => self.sample(logits, step),
            Some(seen) => {
                let mut penalized = logits.to_vec();
                self.penalize(&mut penalized, seen);
                self.sample(&penalized, step)
            }
        }
    }

    fn penalize(&self, logits: &mut [f32], seen: &Seen) {
        let r = self.params.repetition_penalty;
        if r != 1.0 {
            let repeated = seen
                .prompt
                .iter()
                .chain(seen.answer.keys().filter(|id| !seen.prompt.contains(id)));
            for &id in repeated {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l < 0.0 { *l * r } else { *l / r };
                }
            }
        }
        let (f, p) = (self.params.frequency_penalty, self.params.presence_penalty);
        if f != 0.0 || p != 0.0 {
            for (&id, &n) in &seen.answer {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = (*l - f * n as f32) - p;
                }
            }
        }
    }

    /// The token for position `step` of the answer (0 for the first).
    pub fn sample(&self, logits: &[f32], step: usize) -> u32 {
        if self.params.temperature == 0.0 {
            return argmax(logits);
        }
        let t = self.params.temperature;
        let mut candidates: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l / t))
            .collect();
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if let Some(k) = self.params.top_k {
            candidates.truncate(k.max(1));
        }
        let max = candidates.first().map_or(0.0, |c| c.1);
        let mut probs: Vec<f32> = candidates.iter().map(|c| exp(c.1 - max)).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if self.params.top_p < 1.0 {
            let mut cumulative = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    cumulative += p;
                    cumulative >= self.params.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut rng =
            StdRng::seed_from_u64(self.params.seed ^ (step as u64 + 1).wrapping_mul(STEP_STRIDE));
        let mut u = rng.random::<f32>() * total;
        for (i, p) in probs.iter().enumerate() {
            if u < *p {
                return candidates[i].0;
            }
            u -= p;
        }
        candidates[probs.len() - 1].0
    }
}

/// Index of the largest logit; the first one on ties, as torch's argmax.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
// Inputs and references for the tests, not answers: std's functions do.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams {
            temperature: 0.8,
            top_k: None,
            top_p: 0.9,
            seed: 42,
            ..Default::default()
        };
        let a = Sampler::new(params.clone()).unwrap();
        let b = Sampler::new(params).unwrap();
        let xs: Vec<u32> = (0..20).map(|step| a.sample(&logits, step)).collect();
        // In any order: each step's draw stands alone, which is what resuming relies on.
        let ys: Vec<u32> = (0..20).rev().map(|step| b.sample(&logits, step)).collect();
        assert_eq!(xs, ys.into_iter().rev().collect::<Vec<_>>());
        assert!(xs.iter().any(|&x| x != xs[0]), "steps draw differently");
    }

    #[test]
    fn invalid_settings_are_refused() {
        let bad = |p: SamplingParams| Sampler::new(p).is_err();
        assert!(bad(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        }));
        assert!(bad(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }));
        assert!(bad(SamplingParams {
            top_k: Some(0),
            ..Default::default()
        }));
        for (r, f, p) in [
            (0.0, 0.0, 0.0),
            (f32::NAN, 0.0, 0.0),
            (1.0, 2.5, 0.0),
            (1.0, 0.0, -3.0),
            (1.0, f32::NAN, 0.0),
        ] {
            assert!(bad(SamplingParams {
                repetition_penalty: r,
                frequency_penalty: f,
                presence_penalty: p,
                ..Default::default()
            }));
        }
    }

    #[test]
    fn penalties_follow_their_definitions() {
        let params = SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..Default::default()
        };
        let s = Sampler::new(params).unwrap();
        // Token 1 in the prompt, token 2 twice in the answer, token 3 in both.
        let seen = Seen::new(&[1, 3], &[2, 2, 3]);
        let mut logits = vec![1.0, 4.0, -2.0, 3.0, 0.5];
        s.penalize(&mut logits, &seen);
        assert_eq!(
            logits,
            vec![1.0, 2.0, (-4.0 - 1.0) - 0.25, (1.5 - 0.5) - 0.25, 0.5]
        );
        let mut tried = seen.clone();
        tried.push(4);
        tried.pop(4);
        assert_eq!(tried.answer, seen.answer);
    }

    proptest! {
        #[test]
        fn samples_stay_inside_top_k_and_top_p(
            logits in proptest::collection::vec(-10.0f32..10.0, 2..64),
            k in 1usize..8,
            p in 0.05f32..1.0,
            seed in any::<u64>(),
        ) {
            let s = Sampler::new(SamplingParams { temperature: 1.0, top_k: Some(k), top_p: p, seed, ..Default::default() }).unwrap();
            let token = s.sample(&logits, 0) as usize;
            let rank = logits.iter().filter(|&&l| l > logits[token]).count();
            prop_assert!(rank < k, "token ranked {rank} with top-k {k}");
        }
    }
}
