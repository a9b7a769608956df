//! Before a task is queued: the RAM it will take, how long until its first
//! token, and how long until it ends — so a night's work is planned, not
//! discovered in the morning.
//!
//! The best guide is what this model did before: the median speeds of its
//! last finished tasks ([`MEASURED_TASKS`]), whose reads, cache hits and
//! compute were all real. A pack never run yet is forecast from its own
//! figures and its drives' probed read rate: every token reads its experts
//! in every expert layer, less what the cache holds (at best its share of
//! all experts); a prompt is read in chunks of
//! [`PROMPT_CHUNK`] tokens, each reading every
//! expert the chunk's tokens route to once per layer. That counts reads
//! only, so it is a lower bound, and says so.

use serde::Serialize;

use longhaul_engine::PROMPT_CHUNK;
use longhaul_engine::memory::{KV_COPIES, RUNTIME_BYTES, StateBytes};

/// Finished tasks whose speeds make a measured forecast.
pub const MEASURED_TASKS: usize = 5;

/// What a forecast is made from.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub resident_bytes: u64,
    /// RAM for cached experts.
    pub budget_bytes: u64,
    pub state: Option<StateBytes>,
    /// The pack's shape; `None` for a model not packed (it reads nothing).
    pub experts: Option<ExpertShape>,
    /// All drives at once, at the pack's last probe.
    pub drives_mb_per_s: Option<f64>,
    /// Finished tasks' speeds on this model, newest first.
    pub finished: Vec<Finished>,
}

#[derive(Debug, Clone, Copy)]
pub struct ExpertShape {
    /// Bytes of every expert record on the drives.
    pub total_bytes: u64,
    pub layers: usize,
    pub per_layer: usize,
    pub per_token: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub prompt_tokens: usize,
    pub time_to_first_token_s: f64,
    pub tokens_per_second: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ts_rs::TS)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The medians of this model's last finished tasks.
    Measured,
    /// The pack's reads at its drives' probed rate: a lower bound.
    ProbedDrives,
    /// Neither: only the RAM is forecast.
    None,
}

#[derive(Debug, Clone, Serialize, ts_rs::TS)]
pub struct Forecast {
    pub ram_bytes: u64,
    pub first_token_seconds: Option<f64>,
    pub total_seconds: Option<f64>,
    pub tokens_per_second: Option<f64>,
    /// Expert bytes read per answer token, cold (no cache).
    pub read_bytes_per_token: Option<u64>,
    pub basis: Basis,
    /// What the forecast rests on, in words.
    pub words: String,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite() && *x > 0.0);
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The forecast for a prompt of `prompt` tokens and an answer of up to `answer`.
pub fn forecast(i: &Inputs, prompt: usize, answer: usize) -> Forecast {
    let context = (prompt + answer) as u64;
    let kv = i
        .state
        .map_or(0, |s| (context * s.per_token + s.fixed) * KV_COPIES);
    let ram_bytes = i.resident_bytes + i.budget_bytes + kv + RUNTIME_BYTES;
    let per_expert = i
        .experts
        .map(|e| e.total_bytes / (e.layers * e.per_layer).max(1) as u64);
    let read_bytes_per_token = i
        .experts
        .zip(per_expert)
        .map(|(e, b)| b * (e.layers * e.per_token) as u64);
    let measured: Vec<Finished> = i.finished.iter().take(MEASURED_TASKS).copied().collect();
    let decode = median(measured.iter().map(|f| f.tokens_per_second).collect());
    let per_prompt_token = median(
        measured
            .iter()
            .filter(|f| f.prompt_tokens > 0)
            .map(|f| f.time_to_first_token_s / f.prompt_tokens as f64)
            .collect(),
    );
    if let (Some(tps), Some(ttft_per)) = (decode, per_prompt_token) {
        let first = ttft_per * prompt as f64;
        return Forecast {
            ram_bytes,
            first_token_seconds: Some(first),
            total_seconds: Some(first + answer as f64 / tps),
            tokens_per_second: Some(tps),
            read_bytes_per_token,
            basis: Basis::Measured,
            words: format!(
                "from the medians of this model's last {} finished task{}",
                measured.len(),
                if measured.len() == 1 { "" } else { "s" }
            ),
        };
    }
    let (Some(e), Some(per_expert), Some(mbps)) = (i.experts, per_expert, i.drives_mb_per_s) else {
        return Forecast {
            ram_bytes,
            first_token_seconds: None,
            total_seconds: None,
            tokens_per_second: None,
            read_bytes_per_token,
            basis: Basis::None,
            words: "no time forecast yet: probe the pack's drives, or run one task on it".into(),
        };
    };
    let bytes_per_s = mbps * 1e6;
    let held = (i.budget_bytes as f64 / e.total_bytes.max(1) as f64).min(1.0);
    let per_token = read_bytes_per_token.unwrap_or(0) as f64 * (1.0 - held);
    let seconds_per_token = per_token / bytes_per_s;
    // Experts a chunk of n tokens routes to in one layer, if routing were
    // uniform: each is missed by all n with (1 - k/E)^n.
    let touched = |n: usize| {
        let miss = 1.0 - e.per_token as f64 / e.per_layer.max(1) as f64;
        e.per_layer as f64 * (1.0 - miss.powi(n as i32))
    };
    let chunks = prompt / PROMPT_CHUNK;
    let rest = prompt % PROMPT_CHUNK;
    let chunk_bytes = |n: usize| touched(n) * e.layers as f64 * per_expert as f64 * (1.0 - held);
    let first = (chunks as f64 * chunk_bytes(PROMPT_CHUNK) + chunk_bytes(rest)) / bytes_per_s;
    let tps = (seconds_per_token > 0.0).then(|| 1.0 / seconds_per_token);
    Forecast {
        ram_bytes,
        first_token_seconds: Some(first),
        total_seconds: Some(first + answer as f64 * seconds_per_token),
        tokens_per_second: tps,
        read_bytes_per_token,
        basis: Basis::ProbedDrives,
        words: format!(
            "at least: the pack's reads at its drives' probed {mbps:.0} MB/s, the cache holding {:.0}% of the experts; compute adds to it",
            held * 100.0
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Kimi-K2-sized pack: 60 expert layers of 384 experts, 8 per token,
    /// 22 MB each (INT4).
    fn kimi() -> Inputs {
        Inputs {
            resident_bytes: 20_000_000_000,
            budget_bytes: 64_000_000_000,
            state: Some(StateBytes::per_token(70_000)),
            experts: Some(ExpertShape {
                total_bytes: 60 * 384 * 22_000_000,
                layers: 60,
                per_layer: 384,
                per_token: 8,
            }),
            drives_mb_per_s: Some(12_000.0),
            finished: Vec::new(),
        }
    }

    #[test]
    fn a_pack_never_run_is_forecast_from_its_reads_at_the_probed_rate() {
        let f = forecast(&kimi(), 4096, 2048);
        assert_eq!(f.basis, Basis::ProbedDrives);
        assert_eq!(f.read_bytes_per_token, Some(60 * 8 * 22_000_000));
        // 10.56 GB per token, 12.6% of it cached, at 12 GB/s: 0.77 s a token.
        let tps = f.tokens_per_second.unwrap();
        assert!((tps - 1.30).abs() < 0.01, "{tps}");
        // 8 chunks of 512 tokens each read nearly every expert once per layer.
        let first = f.first_token_seconds.unwrap();
        assert!(
            (first - 8.0 * 506.88 * 0.8737 / 12.0).abs() < 1.0,
            "{first}"
        );
        assert!(f.words.starts_with("at least"), "{}", f.words);
        let kv = (4096 + 2048) * 70_000 * KV_COPIES;
        assert_eq!(f.ram_bytes, 84_000_000_000 + kv + RUNTIME_BYTES);
    }

    #[test]
    fn finished_tasks_make_the_forecast_when_there_are_some() {
        let mut i = kimi();
        i.finished = vec![
            Finished {
                prompt_tokens: 1000,
                time_to_first_token_s: 100.0,
                tokens_per_second: 1.5,
            },
            Finished {
                prompt_tokens: 2000,
                time_to_first_token_s: 300.0,
                tokens_per_second: 1.1,
            },
            Finished {
                prompt_tokens: 500,
                time_to_first_token_s: 40.0,
                tokens_per_second: 1.2,
            },
        ];
        let f = forecast(&i, 1000, 3600);
        assert_eq!(f.basis, Basis::Measured);
        assert_eq!(f.tokens_per_second, Some(1.2));
        // The median 0.1 s per prompt token.
        assert_eq!(f.first_token_seconds, Some(100.0));
        assert_eq!(f.total_seconds, Some(100.0 + 3000.0));
        assert!(f.words.contains("last 3 finished tasks"), "{}", f.words);
    }

    #[test]
    fn without_a_probe_or_a_run_only_the_ram_is_forecast() {
        let mut i = kimi();
        i.drives_mb_per_s = None;
        let f = forecast(&i, 10, 10);
        assert_eq!(f.basis, Basis::None);
        assert_eq!(f.total_seconds, None);
        assert!(f.ram_bytes > i.resident_bytes);
        assert!(f.words.contains("probe"), "{}", f.words);
    }
}
