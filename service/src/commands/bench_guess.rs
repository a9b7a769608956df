//! `longhaul bench --speculate`: the same greedy answer decoded plainly and
//! with guesses, each by a freshly opened engine (so neither finds experts
//! the other brought in), side by side.
//!
//! A speed-up read off one run is the truth; absolute rates drift with the
//! machine's load, which touches both halves of one run alike.

use std::path::Path;

use longhaul_engine::{
    Engine, EngineOptions, Flow, Generation, GenerationSettings, Phase, SamplingParams,
};
use serde_json::{Value, json};
use xxhash_rust::xxh3::xxh3_64;

use super::speculate::{self, SpeculateArg};

/// One decoding of the benchmark's answer.
struct Decoded {
    generation: Generation,
    /// Expert bytes read from the drives after the prompt.
    expert_bytes: u64,
}

impl Decoded {
    fn figures(&self) -> Value {
        let s = &self.generation.stats;
        json!({
            // The answer's text, hashed: equal hashes, equal text.
            "text_xxh3": format!("{:016x}", xxh3_64(self.generation.text.as_bytes())),
            "tok_s": s.decode_tokens_per_second(),
            "decode_seconds": s.decode_seconds,
            "forward_passes": s.decode_steps,
            "expert_bytes_per_token": self.bytes_per_token(),
        })
    }

    fn bytes_per_token(&self) -> f64 {
        self.expert_bytes as f64 / self.generation.stats.generated_tokens.max(1) as f64
    }
}

/// What both decodings share.
pub struct Run<'a> {
    pub model: &'a Path,
    pub options: &'a EngineOptions,
    pub prompt: &'a [u32],
    pub tokens: usize,
    pub sampling: SamplingParams,
    /// Plain and guessed decodings, alternated, this many times each.
    pub repeat: usize,
}

impl Run<'_> {
    fn decode(&self, arg: &SpeculateArg) -> anyhow::Result<Decoded> {
        let engine = Engine::open_with(self.model, self.options, &|_| {})?;
        let drive_bytes = || engine.stats().map_or(0, |s| s.drive_bytes());
        let settings = GenerationSettings {
            max_tokens: self.tokens,
            sampling: self.sampling.clone(),
            stop_strings: Vec::new(),
            eos_token_ids: Vec::new(),
            speculation: arg.speculation(),
            output: Default::default(),
            keep_special_tokens: false,
            answer_starts: Vec::new(),
        };
        let mut after_prompt = None;
        let generation = speculate::generate(&engine, self.prompt, &settings, arg, |piece| {
            if matches!(piece.phase, Phase::Answer) && after_prompt.is_none() {
                after_prompt = Some(drive_bytes());
            }
            Flow::Continue
        })?;
        let expert_bytes = drive_bytes() - after_prompt.unwrap_or_else(drive_bytes);
        Ok(Decoded {
            generation,
            expert_bytes,
        })
    }

    /// The `speculation` section of the bench report.
    pub fn compare(&self, arg: &SpeculateArg) -> anyhow::Result<Value> {
        eprintln!(
            "decoding {} tokens plainly, then with guesses, {} times",
            self.tokens, self.repeat
        );
        let mut pairs = Vec::with_capacity(self.repeat.max(1));
        for _ in 0..self.repeat.max(1) {
            pairs.push((self.decode(&SpeculateArg::Off)?, self.decode(arg)?));
        }
        let rates = |pick: fn(&(Decoded, Decoded)) -> &Decoded| -> Vec<f64> {
            pairs
                .iter()
                .map(|p| pick(p).generation.stats.decode_tokens_per_second())
                .collect()
        };
        let (plain_rates, rates) = (rates(|p| &p.0), rates(|p| &p.1));
        let same = pairs
            .iter()
            .all(|(p, g)| p.generation.tokens == g.generation.tokens);
        let (plain, guessed) = &pairs[0];
        let stats = &guessed.generation.stats;
        let s = &stats.speculation;
        Ok(json!({
            "mode": match arg {
                SpeculateArg::Off => "off".to_string(),
                SpeculateArg::Lookup => "lookup".to_string(),
                SpeculateArg::Draft(p) => format!("draft:{}", p.display()),
            },
            "temperature": self.sampling.temperature,
            "same_tokens": same,
            "speedup": median(&rates) / median(&plain_rates).max(1e-9),
            "plain_tok_s_runs": plain_rates,
            "guessed_tok_s_runs": rates,
            "plain": plain.figures(),
            "guessed": guessed.figures(),
            "verify_passes": s.verify_passes,
            "plain_steps": s.plain_steps,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance": s.acceptance(),
            // The first token comes from the prompt's pass.
            "tokens_per_pass": stats.generated_tokens.saturating_sub(1) as f64
                / stats.decode_steps.max(1) as f64,
            "expert_bytes_saved_per_token": plain.bytes_per_token() - guessed.bytes_per_token(),
        }))
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
