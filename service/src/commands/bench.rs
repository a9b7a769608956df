//! `longhaul bench`: decode speed from a pack, cold, next to its physical
//! ceiling and to what an ideal cache could have done on the same routing.
//!
//! Cold means cold: expert reads use direct I/O, so the page cache neither
//! holds experts from an earlier run nor gets to keep them; the drives'
//! bandwidth is probed first with the same kind of reads.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use longhaul_engine::memory;
use longhaul_engine::tools::{
    DEFAULT_QUEUE_DEPTH, DriveSnapshot, PilotCounters, ProbeReport, Routed, Shape, argmax,
    belady_hit_rate, lfu_hit_rate, lru_hit_rate, oracle_pin_hit_rate, routing_stats, trace,
};
use longhaul_engine::{Engine, EngineOptions, EngineStats, MetricsSampler, SamplingParams};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::size::parse_size;
use super::speculate::{SpeculateArg, parse_speculate};

/// Tokens a chat template adds around a message, at most.
const CHAT_TEMPLATE_TOKENS: usize = 64;

#[derive(Args)]
pub struct BenchArgs {
    /// The pack to run.
    #[arg(long, value_parser = super::model_path)]
    model: PathBuf,
    #[command(flatten)]
    memory: super::MemoryArgs,
    #[arg(long, default_value_t = 32)]
    prompt_tokens: usize,
    /// Prompt positions per forward pass (jobs use the engine's default).
    #[arg(long, default_value_t = longhaul_engine::PROMPT_CHUNK)]
    prompt_chunk: usize,
    /// Tokens to decode.
    #[arg(long = "gen", default_value_t = 32)]
    gen_tokens: usize,
    /// Decode steps left out of the steady-state rate (default: a quarter of --gen).
    #[arg(long)]
    warmup: Option<usize>,
    /// Bytes to read per drive when probing bandwidth.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    probe_bytes: u64,
    /// Reads in flight per drive.
    #[arg(long, default_value_t = DEFAULT_QUEUE_DEPTH)]
    queue_depth: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the routing trace here: one JSON line per expert lookup, prefill then decode.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cache: super::CacheArgs,
    /// Skip checking each expert record's checksum (to measure what checking costs).
    #[arg(long)]
    no_verify_checksums: bool,
    /// The prompt: this file's text instead of --prompt-tokens random tokens.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// With --prompt-file: wrap its text as a user message in the chat template.
    #[arg(long, requires = "prompt_file")]
    chat: bool,
    /// Also decode the --gen tokens plainly and with guesses (`lookup` or
    /// `draft:PATH`; `off` decodes plainly both times, to show the figures'
    /// noise), each by a fresh engine, and report both under `speculation`.
    #[arg(long, value_parser = parse_speculate)]
    speculate: Option<SpeculateArg>,
    /// With --speculate: sampling temperature of both answers (0, the
    /// default, is greedy); --seed seeds the draws.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// With --speculate: nucleus sampling's probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// With --speculate: decode plainly and with guesses this many times
    /// each, alternated; the speed-up is the ratio of the medians.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Also decode N answers to N random prompts at once, for each N listed
    /// (e.g. 1,2,4,8), each N by a fresh engine, and report them under
    /// `together` (aggregate tok/s, bytes read per token, the answer of the
    /// first prompt checked against N = 1's).
    #[arg(long, value_delimiter = ',')]
    together: Vec<usize>,
}

/// Probes the drives of a pack (see [`longhaul_service::probe`]).
pub fn probe_pack(
    pack: &std::path::Path,
    limit: u64,
    queue_depth: usize,
) -> anyhow::Result<ProbeReport> {
    Ok(longhaul_service::probe::probe_pack(
        pack,
        limit,
        queue_depth,
    )?)
}

/// Counters at one moment, to measure the steady decode window.
struct Mark {
    at: Instant,
    wall: f64,
    stall: f64,
    busy_any: Duration,
    drives: Vec<DriveSnapshot>,
    pilot: PilotCounters,
    joined: u64,
    limit_hits: Option<u64>,
    /// Reader time restoring compressed records.
    decompress: f64,
    /// Records read from the drives.
    reads: u64,
}

impl Mark {
    fn take(s: &EngineStats) -> Self {
        Self {
            at: Instant::now(),
            wall: 0.0,
            stall: s.stall_seconds,
            busy_any: s.drives_busy,
            drives: s.drives.clone(),
            pilot: s.pilot,
            joined: s.joined_flights,
            limit_hits: memory::bound_hits(),
            decompress: s.decompress_seconds,
            reads: s.records_read,
        }
    }

    /// What happened between `earlier` and this mark.
    fn since(&self, earlier: &Mark) -> Mark {
        Mark {
            at: self.at,
            wall: self.at.duration_since(earlier.at).as_secs_f64(),
            stall: self.stall - earlier.stall,
            busy_any: self.busy_any.saturating_sub(earlier.busy_any),
            drives: self
                .drives
                .iter()
                .zip(&earlier.drives)
                .map(|(d, e)| DriveSnapshot {
                    bytes: d.bytes - e.bytes,
                    busy_micros: d.busy_micros.saturating_sub(e.busy_micros),
                    ..d.clone()
                })
                .collect(),
            pilot: self.pilot.since(&earlier.pilot),
            joined: self.joined - earlier.joined,
            limit_hits: self.limit_hits.zip(earlier.limit_hits).map(|(a, b)| a - b),
            decompress: self.decompress - earlier.decompress,
            reads: self.reads - earlier.reads,
        }
    }

    /// Share of the window each drive had a read in progress.
    fn busy_shares(&self) -> Vec<f64> {
        self.drives
            .iter()
            .map(|d| d.busy_micros as f64 / 1e6 / self.wall.max(1e-9))
            .collect()
    }

    /// Share of the drives' busy time during which the model computed
    /// rather than waited: how much read time the pipeline hid.
    fn hidden_share(&self) -> f64 {
        let busy = self.busy_any.as_secs_f64();
        if busy <= 0.0 {
            return 1.0;
        }
        (1.0 - self.stall / busy).clamp(0.0, 1.0)
    }
}

fn memory_report(
    start: &memory::ProcessUsage,
    limit_hits_at_start: Option<u64>,
    steady: &Mark,
) -> serde_json::Value {
    let end = memory::usage();
    json!({
        "limit_bytes": memory::available_limit_bytes(),
        "cgroup_limit_bytes": memory::bound_bytes(),
        "cgroup_limit_hits": memory::bound_hits().zip(limit_hits_at_start).map(|(a, b)| a - b),
        "cgroup_limit_hits_while_decoding": steady.limit_hits,
        "major_faults": end.major_faults.zip(start.major_faults).map(|(a, b)| a - b),
        "peak_rss_bytes": end.peak_rss_bytes,
    })
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if !longhaul_engine::tools::is_pack(&args.model) {
        bail!(
            "{} is not a pack; make one with `longhaul pack`",
            args.model.display()
        );
    }
    if args.gen_tokens < 2 {
        bail!("--gen must be at least 2");
    }
    let start_usage = memory::usage();
    let limit_hits_at_start = memory::bound_hits();
    let probe = probe_pack(&args.model, args.probe_bytes, args.queue_depth)?;
    let options = engine_options(&args)?;
    let heat_was_warm = longhaul_engine::tools::HeatMap::path(&args.model).is_file();
    let load_started = Instant::now();
    let engine = Engine::open_with(&args.model, &options, &|_| {})?;
    let load_seconds = load_started.elapsed().as_secs_f64();
    if engine.stats().is_none() {
        bail!("the pack did not open with streaming experts");
    }
    let stats = || engine.stats().unwrap_or_default();
    let budget = stats().cache.budget_bytes;
    if let Some(plan) = engine.memory_plan() {
        eprintln!("{plan}");
    }
    let prompt = prompt_ids(&args, &engine)?;
    let prefill = Prefill::run(&engine, &prompt, args.prompt_chunk)?;
    let warmup = args
        .warmup
        .unwrap_or(args.gen_tokens / 4)
        .min(args.gen_tokens - 1);
    let mut sampler = MetricsSampler::new(&stats());
    let decode = Decode::run(
        &engine,
        prefill.session,
        prefill.token,
        args.gen_tokens,
        warmup,
    )?;
    let replays = Replays::of(&prefill.trace, &decode, budget, warmup);
    if let Some(path) = &args.trace {
        trace::write_jsonl(path, &replays.all)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let decode_metrics = sampler.sample(&stats());
    engine
        .save_heat()
        .with_context(|| format!("saving the heat histogram next to {}", args.model.display()))?;
    let end = &decode.end;
    let mut report = json!({
        "model": args.model,
        "budget_bytes": budget,
        "memory_plan": engine.memory_plan(),
        "budget_experts": replays.slots,
        "heat_warm_at_start": heat_was_warm,
        "policy": args.cache.policy.to_string(),
        "policy_in_use": end.policy.to_string(),
        "pinned_fraction": args.cache.pinned_fraction,
        "cache_dtype": args.cache.cache_dtype,
        "checksums_verified": !args.no_verify_checksums,
        "expert_bytes_in_ram": end.resident_expert_bytes,
        "load_seconds": load_seconds,
        "prompt_tokens": prompt.len(),
        "prompt_chunk": args.prompt_chunk,
        "prefill_tok_s": prompt.len() as f64 / prefill.seconds.max(1e-9),
        "time_to_first_token_s": prefill.ttft,
        "prefill_stall_seconds": prefill.mark.stall,
        "prefill_decompress_seconds": prefill.mark.decompress,
        "prefill_any_drive_busy_share": prefill.mark.busy_any.as_secs_f64() / prefill.mark.wall.max(1e-9),
        "gen_tokens": args.gen_tokens,
        "warmup_tokens": warmup,
    });
    let seen = Seen {
        probe: &probe,
        start_usage: &start_usage,
        limit_hits_at_start,
        drives: json!(decode_metrics.drives),
        prefill_lookups: prefill.trace.len(),
    };
    if let (Some(r), serde_json::Value::Object(more)) = (
        report.as_object_mut(),
        decode_results(&args, &decode, &replays, &seen),
    ) {
        r.extend(more);
    }
    drop(engine);
    compare_runs(&args, &options, &prompt, warmup, &mut report)?;
    if args.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// The comparisons asked for beside the run, each by fresh engines, added
/// to `report`: guessing ahead against plain decoding (`speculation`) and
/// answers decoded together (`together`).
fn compare_runs(
    args: &BenchArgs,
    options: &EngineOptions,
    prompt: &[u32],
    warmup: usize,
    report: &mut serde_json::Value,
) -> anyhow::Result<()> {
    // `off` compares plain decoding with itself: the noise of the figures.
    if let Some(arg) = &args.speculate {
        let sampling = SamplingParams {
            temperature: args.temperature,
            top_k: None,
            top_p: args.top_p,
            seed: args.seed,
            ..Default::default()
        };
        sampling.validate().context("invalid sampling settings")?;
        let run = super::bench_guess::Run {
            model: &args.model,
            options,
            prompt,
            tokens: args.gen_tokens,
            sampling,
            repeat: args.repeat,
        };
        report["speculation"] = run.compare(arg)?;
    }
    if !args.together.is_empty() {
        let mut together_options = options.clone();
        together_options.streaming.record_trace = false;
        let run = super::bench_together::Together {
            model: &args.model,
            options: &together_options,
            prompt_tokens: args.prompt_tokens,
            tokens: args.gen_tokens,
            warmup,
            seed: args.seed,
        };
        report["together"] = run.compare(&args.together)?;
    }
    Ok(())
}

/// The engine's settings for a bench run: its memory plan sized for the
/// prompt and the answer, the cache settings asked for, and the routing
/// trace recorded for the replays.
fn engine_options(args: &BenchArgs) -> anyhow::Result<EngineOptions> {
    let mut options = EngineOptions::default();
    // A prompt file's tokens are at most its bytes (and a chat template's few).
    let prompt_bound = match &args.prompt_file {
        Some(path) => {
            std::fs::metadata(path)
                .with_context(|| format!("cannot read the prompt file {}", path.display()))?
                .len() as usize
                + CHAT_TEMPLATE_TOKENS
        }
        None => args.prompt_tokens.max(1),
    };
    let context = (prompt_bound + args.gen_tokens) as u64;
    args.memory.apply(&mut options, context)?;
    options.streaming.record_trace = true;
    args.cache.apply(&mut options.streaming);
    options.streaming.verify_checksums = !args.no_verify_checksums;
    options.streaming.store.queue_depth = args.queue_depth;
    Ok(options)
}

/// The prompt's ids: the prompt file's text, or `--prompt-tokens` tokens
/// drawn from the vocabulary with `--seed`.
fn prompt_ids(args: &BenchArgs, engine: &Engine) -> anyhow::Result<Vec<u32>> {
    Ok(match &args.prompt_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the prompt file {}", path.display()))?;
            engine
                .prompt_ids(&text, args.chat)
                .with_context(|| format!("cannot prepare the prompt from {}", path.display()))?
        }
        None => {
            let mut rng = SmallRng::seed_from_u64(args.seed);
            let vocab = engine.vocab_size() as u32;
            (0..args.prompt_tokens.max(1))
                .map(|_| rng.random_range(0..vocab))
                .collect()
        }
    })
}

/// The prompt read: the session after it, the first token chosen, how long
/// that took, the lookups it made and what the store did meanwhile.
struct Prefill<'e> {
    session: longhaul_engine::Session<'e>,
    token: u32,
    seconds: f64,
    ttft: f64,
    trace: Vec<Routed>,
    mark: Mark,
}

impl<'e> Prefill<'e> {
    fn run(engine: &'e Engine, prompt: &[u32], chunk: usize) -> anyhow::Result<Self> {
        let stats = || engine.stats().unwrap_or_default();
        let mut session = engine.session();
        let before = Mark::take(&stats());
        let started = Instant::now();
        let mut logits = Vec::new();
        for piece in prompt.chunks(chunk.max(1)) {
            logits = session.feed(piece)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        let token = argmax(&logits);
        let ttft = started.elapsed().as_secs_f64();
        let trace = engine.take_trace();
        Ok(Self {
            session,
            token,
            seconds,
            ttft,
            trace,
            mark: Mark::take(&stats()).since(&before),
        })
    }
}

/// Greedy decoding timed token by token, the first `warmup` tokens left out
/// of the steady figures.
struct Decode {
    tokens: usize,
    warmup: usize,
    per_token: Vec<serde_json::Value>,
    steady_seconds: f64,
    steady_bytes: u64,
    steady_stall: f64,
    /// The store over the steady tokens.
    steady: Mark,
    seconds: f64,
    trace: Vec<Routed>,
    /// The cache's counters when decoding began and when the steady tokens did.
    before: longhaul_engine::tools::CacheCounters,
    steady_from: longhaul_engine::tools::CacheCounters,
    end: EngineStats,
}

impl Decode {
    fn run(
        engine: &Engine,
        mut session: longhaul_engine::Session<'_>,
        mut token: u32,
        tokens: usize,
        warmup: usize,
    ) -> anyhow::Result<Self> {
        let stats = || engine.stats().unwrap_or_default();
        let (mut steady_seconds, mut steady_bytes, mut steady_stall) = (0.0, 0u64, 0.0);
        let mut per_token = Vec::with_capacity(tokens);
        let started = Instant::now();
        let before = stats().cache;
        let mut steady_counters = before;
        let mut steady_from = Mark::take(&stats());
        for step in 0..tokens {
            if step == warmup {
                let now = stats();
                steady_counters = now.cache;
                steady_from = Mark::take(&now);
            }
            let now = stats();
            let (bytes0, stall0) = (now.drive_bytes(), now.stall_seconds);
            let t = Instant::now();
            let logits = session.feed(&[token])?;
            let seconds = t.elapsed().as_secs_f64();
            token = argmax(&logits);
            let now = stats();
            let (bytes, stall) = (now.drive_bytes() - bytes0, now.stall_seconds - stall0);
            per_token
                .push(json!({"seconds": seconds, "expert_bytes": bytes, "stall_seconds": stall}));
            if step >= warmup {
                steady_seconds += seconds;
                steady_bytes += bytes;
                steady_stall += stall;
            }
        }
        let steady = Mark::take(&stats()).since(&steady_from);
        let seconds = started.elapsed().as_secs_f64();
        let trace = engine.take_trace();
        Ok(Self {
            tokens,
            warmup,
            per_token,
            steady_seconds,
            steady_bytes,
            steady_stall,
            steady,
            seconds,
            trace,
            before,
            steady_from: steady_counters,
            end: stats(),
        })
    }

    fn steady_tokens(&self) -> f64 {
        (self.tokens - self.warmup) as f64
    }
}

/// The run's own lookups replayed: every candidate policy in bytes as the
/// cache holds them, and the textbook ones over expert slots, each counting
/// hits in the steady window as the real cache does.
struct Replays {
    /// Every lookup since load (prefill, then one per token, layer and expert).
    all: Vec<Routed>,
    ids_per_token: Vec<Vec<(usize, Vec<usize>)>>,
    accesses: Vec<(usize, usize)>,
    /// Where the steady window's lookups start in `accesses`.
    count_from: usize,
    /// Experts the budget holds.
    slots: usize,
    policies: serde_json::Value,
}

impl Replays {
    fn of(prefill: &[Routed], decode: &Decode, budget: u64, warmup: usize) -> Self {
        let tokens = trace::per_token(&decode.trace);
        let layers = tokens.first().map_or(1, Vec::len);
        let ids_per_token = tokens
            .iter()
            .map(|t| {
                t.iter()
                    .map(|r| (r.layer, r.experts.iter().map(|e| e.0).collect()))
                    .collect()
            })
            .collect();
        let mut accesses = trace::accesses(prefill);
        let warmup_lookups = (warmup * layers).min(decode.trace.len());
        let count_from = accesses.len() + trace::accesses(&decode.trace[..warmup_lookups]).len();
        accesses.extend(trace::accesses(&decode.trace));
        let slots = (budget / decode.end.resident_expert_bytes.max(1)) as usize;
        let all: Vec<Routed> = prefill.iter().chain(&decode.trace).cloned().collect();
        let expert_bytes = decode.end.resident_expert_bytes.max(1);
        let shape = Shape {
            budget,
            layers,
            bytes: &|_| expert_bytes,
        };
        let policies =
            longhaul_engine::tools::choose_counting(&all, shape, decode.end.policy, count_from);
        Self {
            all,
            ids_per_token,
            accesses,
            count_from,
            slots,
            policies: json!(policies),
        }
    }
}

/// What was measured around the decode: the drives' probe, memory when the
/// run began, the drives while it decoded and the prefill's lookups.
struct Seen<'a> {
    probe: &'a ProbeReport,
    start_usage: &'a memory::ProcessUsage,
    limit_hits_at_start: Option<u64>,
    drives: serde_json::Value,
    prefill_lookups: usize,
}

/// The decode's figures: speed, bytes and stalls per token, what hid the
/// reads, memory, the cache's hit rates against the replays, the ceiling
/// the drives set, and each token's own.
fn decode_results(
    args: &BenchArgs,
    decode: &Decode,
    replays: &Replays,
    seen: &Seen<'_>,
) -> serde_json::Value {
    let probe = seen.probe;
    let (end, steady) = (&decode.end, &decode.steady);
    let counters = end.cache;
    let steady_tokens = decode.steady_tokens();
    let per_token_steady = |v: f64| v / steady_tokens;
    let tok_s = steady_tokens / decode.steady_seconds.max(1e-9);
    let missed_per_token = decode.steady_bytes as f64 / steady_tokens;
    let aggregate = probe.aggregate_mb_per_s * 1e6;
    let ceiling_tok_s = (missed_per_token > 0.0).then(|| aggregate / missed_per_token);
    let lookups = |c: &longhaul_engine::tools::CacheCounters| c.hits + c.misses;
    let steady_lookups = lookups(&counters) - lookups(&decode.steady_from);
    let steady_hits = counters.hits - decode.steady_from.hits;
    let decode_lookups = lookups(&counters) - lookups(&decode.before);
    let decode_hits = counters.hits - decode.before.hits;
    let pilot = &steady.pilot;
    let prefetch = json!({
        "enabled": !args.cache.no_prefetch,
        "recall": pilot.recall(),
        "precision": pilot.precision(),
        "prefetched_bytes_per_token": per_token_steady(pilot.prefetch_bytes as f64),
        "wasted_bytes_per_token": per_token_steady(pilot.wasted_bytes as f64),
        "waste_per_useful_byte": pilot.waste_per_useful_byte(),
        "demand_joined_a_read_per_token": per_token_steady(steady.joined as f64),
        "counters": pilot,
    });
    let (accesses, slots, from) = (&replays.accesses, replays.slots, replays.count_from);
    json!({
        "tok_s": tok_s,
        "inclusive_tok_s": decode.tokens as f64 / decode.seconds.max(1e-9),
        "expert_bytes_per_token": missed_per_token,
        "stall_fraction": decode.steady_stall / decode.steady_seconds.max(1e-9),
        "stall_seconds_per_token": per_token_steady(decode.steady_stall),
        "compute_seconds_per_token": per_token_steady(decode.steady_seconds - decode.steady_stall),
        "decompress_seconds_per_token": per_token_steady(steady.decompress),
        "drive_busy_share": steady.busy_shares(),
        "any_drive_busy_share": steady.busy_any.as_secs_f64() / steady.wall.max(1e-9),
        "read_time_hidden_share": steady.hidden_share(),
        "prefetch": prefetch,
        "memory": memory_report(seen.start_usage, seen.limit_hits_at_start, steady),
        "record_buffer_bytes": end.buffer_bytes,
        "record_buffer_peak_bytes": end.peak_buffer_bytes,
        "record_buffers_allocated": end.buffers_allocated,
        "record_buffers_reused": end.buffers_reused,
        "kernels": longhaul_engine::tools::instruction_set(),
        // Per format, the fast path its products take here, or `portable`.
        "kernel_paths": longhaul_engine::tools::product_paths()
            .into_iter()
            .map(|(format, path)| (format.to_string(), json!(path)))
            .collect::<serde_json::Map<_, _>>(),
        "hit_rate": steady_hits as f64 / steady_lookups.max(1) as f64,
        "records_read_per_token": per_token_steady(steady.reads as f64),
        "lookups_per_token": per_token_steady(steady_lookups as f64),
        "effective_hit_rate": 1.0 - steady.reads as f64 / steady_lookups.max(1) as f64,
        "decode_hit_rate": decode_hits as f64 / decode_lookups.max(1) as f64,
        "lru_replay_hit_rate": lru_hit_rate(accesses, slots, from),
        "lfu_replay_hit_rate": lfu_hit_rate(accesses, slots, from),
        "oracle_pin_hit_rate": oracle_pin_hit_rate(accesses, slots, from),
        "belady_hit_rate": belady_hit_rate(accesses, slots, from),
        "policy_replays": replays.policies,
        "pack_trace_policies": end.policy_report,
        "ceiling_tok_s": ceiling_tok_s,
        "efficiency": ceiling_tok_s.map(|c| tok_s / c),
        "probe": probe,
        "drives_while_decoding": seen.drives,
        "cache": counters,
        "routing": routing_stats(&replays.ids_per_token),
        "prefill_lookups": seen.prefill_lookups,
        "per_token": decode.per_token,
    })
}
