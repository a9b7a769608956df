//! What one run of a job has done so far: the figures a commit saves, the
//! live progress shows, and the end records. One place computes them, so
//! Tasks, Results and the saved job never disagree about a running job.

use std::time::Instant;

use crate::events::PromptProgress;
use crate::queue::{JobStats, Runnable};

use super::Usage;
use super::rate::RollingRate;

pub struct Tally {
    started: Instant,
    /// Seconds from the run's start to its first new token.
    pub first_token: Option<f64>,
    /// Tokens of the answer, committed or not (earlier runs' included).
    pub total: usize,
    /// Tokens this run produced.
    pub new_tokens: usize,
    rate: RollingRate,
    /// Prompt positions read and in all, and when the first was counted.
    prompt: Option<(usize, usize, Instant, usize)>,
    prompt_len: Option<usize>,
    usage: Usage,
    speculation: crate::queue::SpeculationTally,
    prefix: (usize, u64),
}

impl Tally {
    pub fn new(job: &Runnable) -> Self {
        Self {
            started: Instant::now(),
            first_token: None,
            total: job.committed_count,
            new_tokens: 0,
            rate: RollingRate::default(),
            prompt: None,
            prompt_len: None,
            usage: Usage::default(),
            speculation: Default::default(),
            prefix: (0, 0),
        }
    }

    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// `count` new tokens arrived now.
    pub fn add_tokens(&mut self, count: usize, now: Instant) {
        if count > 0 {
            self.first_token.get_or_insert(self.elapsed());
            self.rate.tick(now);
            self.prompt = None;
        }
        self.total += count;
        self.new_tokens += count;
    }

    /// `done` of `total` prompt positions are read.
    pub fn prompt_read(&mut self, done: usize, total: usize, now: Instant) {
        match &mut self.prompt {
            Some(p) => {
                p.0 = done;
                p.1 = total;
            }
            None => self.prompt = Some((done, total, now, done)),
        }
    }

    pub fn set_prompt_len(&mut self, len: usize) {
        self.prompt_len = Some(len);
    }

    /// The prompt's length, unless the run said it already.
    pub fn default_prompt_len(&mut self, len: usize) {
        self.prompt_len.get_or_insert(len);
    }

    /// What guessing ahead has done in this run so far.
    pub fn set_speculation(&mut self, s: &longhaul_engine::SpeculationStats) {
        self.speculation = crate::queue::SpeculationTally {
            verify_passes: s.verify_passes,
            drafted: s.drafted,
            accepted: s.accepted,
            plain_steps: s.plain_steps,
        };
    }

    /// Prompt tokens this run took from the prefix cache, and their bytes.
    pub fn set_prefix(&mut self, reused: (usize, u64)) {
        self.prefix = reused;
    }

    pub fn set_usage(&mut self, usage: Usage) {
        self.usage = usage;
    }

    /// Tokens per second over the last few seconds of decoding.
    pub fn rate(&self) -> Option<f64> {
        self.rate.per_second()
    }

    /// Where the prompt reading is, while it goes on.
    pub fn prompt(&self) -> Option<PromptProgress> {
        let (done, total, since, first) = self.prompt?;
        let read = done.saturating_sub(first);
        let seconds = since.elapsed().as_secs_f64();
        let per_second = (read > 0 && seconds > 0.0).then(|| read as f64 / seconds);
        Some(PromptProgress {
            done,
            total,
            per_second,
            eta_seconds: per_second.map(|r| total.saturating_sub(done) as f64 / r),
        })
    }

    /// The job's figures: earlier runs' (`base`) with this run's so far.
    pub fn stats(&self, job: &Runnable) -> JobStats {
        let mut stats = job.stats.clone().unwrap_or_default();
        stats.resumes += u32::from(job.resumed);
        stats.generated_tokens = self.total;
        let wall = self.elapsed();
        stats.wall_seconds += wall;
        if stats.time_to_first_token_s.is_none() {
            stats.time_to_first_token_s = self.first_token;
        }
        let decode_seconds = self.first_token.map_or(0.0, |f| wall - f);
        if self.new_tokens > 1 && decode_seconds > 0.0 {
            stats.tokens_per_second = (self.new_tokens - 1) as f64 / decode_seconds;
        }
        if let Some(len) = self.prompt_len {
            stats.prompt_tokens = len;
        }
        // Like the prompt's length: the latest run's.
        (stats.prefix_tokens, stats.prefix_bytes) = self.prefix;
        stats.expert_bytes_read += self.usage.expert_bytes_read;
        stats.add_drive_bytes(&self.usage.drive_bytes);
        stats.speculation.verify_passes += self.speculation.verify_passes;
        stats.speculation.drafted += self.speculation.drafted;
        stats.speculation.accepted += self.speculation.accepted;
        stats.speculation.plain_steps += self.speculation.plain_steps;
        let (hits, misses) = self.usage.lookups;
        if hits + misses > 0 {
            stats.cache_hit_rate = Some(hits as f64 / (hits + misses) as f64);
        }
        stats
    }
}
