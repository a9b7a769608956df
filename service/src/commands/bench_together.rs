//! `longhaul bench --together N,…`: N greedy answers to N different prompts
//! decoded at once on one model, each on its own thread, so their passes run
//! together and each MoE layer reads the union of their experts once. For
//! each N a freshly opened engine (nothing cached from the others) decodes;
//! the figures are over the steady window, when every answer is past its
//! warmup and none has ended.
//!
//! Job 0 answers the same prompt at every N, so its tokens at N > 1 are
//! checked against N = 1: decoding together must not change a token.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use longhaul_engine::{Engine, EngineOptions, Flow, GenerationSettings, Phase, SamplingParams};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// What every run shares.
pub struct Together<'a> {
    pub model: &'a Path,
    pub options: &'a EngineOptions,
    pub prompt_tokens: usize,
    pub tokens: usize,
    pub warmup: usize,
    pub seed: u64,
}

/// One answer: its tokens and when each came.
struct Answer {
    tokens: Vec<u32>,
    at: Vec<Instant>,
}

impl Together<'_> {
    /// Job `j`'s prompt: random tokens from seed `seed + j`.
    fn prompt(&self, engine: &Engine, j: usize) -> Vec<u32> {
        let mut rng = SmallRng::seed_from_u64(self.seed.wrapping_add(j as u64));
        let vocab = engine.vocab_size() as u32;
        (0..self.prompt_tokens.max(1))
            .map(|_| rng.random_range(0..vocab))
            .collect()
    }

    fn settings(&self) -> GenerationSettings {
        GenerationSettings {
            max_tokens: self.tokens,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            eos_token_ids: Vec::new(),
            speculation: longhaul_engine::Speculation::Off,
            output: Default::default(),
            keep_special_tokens: false,
            answer_starts: Vec::new(),
        }
    }

    /// Decodes `n` answers at once on a fresh engine; the figures, and job 0's tokens.
    fn run(&self, n: usize) -> anyhow::Result<(Value, Vec<u32>)> {
        let engine = Engine::open_with(self.model, self.options, &|_| {})?;
        let prompts: Vec<Vec<u32>> = (0..n).map(|j| self.prompt(&engine, j)).collect();
        let settings = self.settings();
        let stats = || engine.stats().unwrap_or_default();
        // Drive bytes and lookups when the last answer passes its warmup.
        let marks = std::sync::Mutex::new(Vec::new());
        let passed = std::sync::atomic::AtomicUsize::new(0);
        let answers: Vec<anyhow::Result<Answer>> = std::thread::scope(|scope| {
            let handles: Vec<_> = prompts
                .iter()
                .map(|prompt| {
                    let (engine, settings, marks, passed) = (&engine, &settings, &marks, &passed);
                    scope.spawn(move || -> anyhow::Result<Answer> {
                        let mut answer = Answer {
                            tokens: Vec::new(),
                            at: Vec::new(),
                        };
                        engine.generate_resumed(prompt, &[], &[], settings, |piece| {
                            if let (Phase::Answer, Some(t)) = (piece.phase, piece.token) {
                                answer.tokens.push(t);
                                answer.at.push(Instant::now());
                                if answer.tokens.len() == self.warmup + 1 {
                                    let now =
                                        passed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    if now + 1 == n
                                        && let Ok(mut m) = marks.lock()
                                    {
                                        m.push(stats());
                                    }
                                }
                            }
                            Flow::Continue
                        })?;
                        Ok(answer)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a decoding thread panicked")))
                })
                .collect()
        });
        let answers: Vec<Answer> = answers.into_iter().collect::<anyhow::Result<_>>()?;
        let end = stats();
        let start = marks
            .into_inner()
            .ok()
            .and_then(|m| m.into_iter().next())
            .context("no answer got past its warmup")?;
        // The steady window: every answer past its warmup, none ended.
        let from = answers
            .iter()
            .filter_map(|a| a.at.get(self.warmup).copied())
            .max()
            .context("no answer got past its warmup")?;
        let to = answers
            .iter()
            .filter_map(|a| a.at.last().copied())
            .min()
            .context("an answer is empty")?;
        let in_window = answers
            .iter()
            .map(|a| a.at.iter().filter(|&&t| t > from && t <= to).count())
            .sum::<usize>();
        let seconds = to.duration_since(from).as_secs_f64().max(1e-9);
        // Bytes and lookups from the warmup mark to the end, per token
        // decoded after the mark.
        let after_mark = answers
            .iter()
            .map(|a| a.tokens.len().saturating_sub(self.warmup + 1))
            .sum::<usize>()
            .max(1) as f64;
        let lookups = (end.cache.hits + end.cache.misses) - (start.cache.hits + start.cache.misses);
        let passes = engine.together_counters();
        let figures = json!({
            "jobs": n,
            "aggregate_tok_s": in_window as f64 / seconds,
            "per_job_tok_s": in_window as f64 / seconds / n as f64,
            "expert_bytes_per_token": (end.drive_bytes() - start.drive_bytes()) as f64 / after_mark,
            "records_read_per_token": (end.records_read - start.records_read) as f64 / after_mark,
            "hit_rate": (end.cache.hits - start.cache.hits) as f64 / lookups.max(1) as f64,
            "rows_per_pass": passes.rows as f64 / passes.passes.max(1) as f64,
            "sequences_per_pass": passes.sequences as f64 / passes.passes.max(1) as f64,
        });
        let first = answers
            .into_iter()
            .next()
            .map(|a| a.tokens)
            .unwrap_or_default();
        Ok((figures, first))
    }

    /// Every N in turn; job 0's answer is checked against N = 1's.
    pub fn compare(&self, counts: &[usize]) -> anyhow::Result<Value> {
        let mut alone: Option<Vec<u32>> = None;
        let mut rows = Vec::new();
        let mut base_rate = None;
        for &n in counts {
            let (mut figures, first) = self.run(n.max(1))?;
            if n <= 1 {
                alone = Some(first.clone());
            }
            if let Some(a) = &alone {
                figures["job0_same_as_alone"] = json!(*a == first);
            }
            let rate = figures["aggregate_tok_s"].as_f64().unwrap_or(0.0);
            base_rate = base_rate.or((n <= 1).then_some(rate));
            if let Some(b) = base_rate {
                figures["speedup_over_one"] = json!(rate / b.max(1e-9));
            }
            eprintln!(
                "together {n}: {:.3} tok/s in all, {:.1} MB read per token",
                rate,
                figures["expert_bytes_per_token"].as_f64().unwrap_or(0.0) / 1e6
            );
            rows.push(figures);
        }
        if alone.is_some() && rows.iter().any(|r| r["job0_same_as_alone"] == json!(false)) {
            anyhow::bail!("decoding together changed job 0's answer: {rows:?}");
        }
        Ok(Value::Array(rows))
    }
}
