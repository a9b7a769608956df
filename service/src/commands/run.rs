//! `longhaul run`: stream generated text to stdout, speeds to stderr.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use longhaul_engine::tools::trace;
use longhaul_engine::{
    ChatMessage, ChatOptions, Flow, GenerationSettings, OutputFormat, SamplingParams,
};

use super::speculate::{self, SpeculateArg, parse_speculate};

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: super::ModelArgs,
    #[command(flatten)]
    data: super::DataDir,
    #[command(flatten)]
    prefix: super::PrefixArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A switch for the chat template or prompt encoder (repeatable):
    /// `enable_thinking=false`, `thinking=true`, `reasoning_effort=high`.
    /// VALUE is read as JSON where it is (true, 3, "text"), else as text.
    #[arg(long = "chat-arg", value_name = "KEY=VALUE", value_parser = parse_chat_arg, requires = "chat")]
    chat_args: Vec<(String, serde_json::Value)>,
    /// Print the model's reasoning (its thinking before the answer) to
    /// stderr as it comes; without it, only the answer is printed.
    #[arg(long)]
    show_thinking: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Discourage tokens already in the prompt or the answer, as
    /// transformers' repetition_penalty (1 is off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Taken off a token's logit per time it is in the answer (OpenAI's
    /// frequency_penalty, -2 to 2).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    frequency_penalty: f32,
    /// Taken off the logit of every token in the answer (OpenAI's
    /// presence_penalty, -2 to 2).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    presence_penalty: f32,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// With a pack: write the routing trace here, one JSON line per expert lookup.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Guess ahead and verify the guesses in one pass: `lookup` guesses from
    /// earlier text (the prompt, attachments, the answer so far), `auto`
    /// (the default) is `lookup`, `draft:PATH` guesses with a small model
    /// (with another tokenizer, its guesses travel as text). A gate stops
    /// guessing while it does not pay. The answer is bitwise the same either
    /// way; only the speed differs.
    #[arg(long, default_value = "auto", value_parser = parse_speculate)]
    speculate: SpeculateArg,
}

/// `KEY=VALUE`, VALUE as JSON where it parses, else as text.
pub fn parse_chat_arg(text: &str) -> Result<(String, serde_json::Value), String> {
    let (key, value) = text
        .split_once('=')
        .filter(|(k, _)| !k.trim().is_empty())
        .ok_or_else(|| format!("`{text}`: expected KEY=VALUE, e.g. enable_thinking=false"))?;
    let value = serde_json::from_str(value)
        .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    Ok((key.trim().to_string(), value))
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        repetition_penalty: args.repetition_penalty,
        frequency_penalty: args.frequency_penalty,
        presence_penalty: args.presence_penalty,
    };
    sampling.validate().context("invalid sampling settings")?;
    let prefix = args
        .prefix
        .open(&args.data.data_dir().join(super::PREFIX_DIR))?;
    let engine = args.model.open_with(|o| {
        o.streaming.record_trace = args.trace.is_some();
        o.prefix = prefix;
    })?;
    let (prompt, output) = if args.chat {
        let mut options = ChatOptions::generation();
        options.args.extend(args.chat_args.iter().cloned());
        let chat = engine
            .chat_prompt(&[ChatMessage::user(args.prompt.as_str())], &options)
            .context("cannot prepare the prompt")?;
        (chat.ids, chat.output)
    } else {
        let ids = engine
            .prompt_ids(&args.prompt, false)
            .context("cannot prepare the prompt")?;
        (ids, OutputFormat::Plain)
    };
    let settings = GenerationSettings {
        max_tokens: args.max_tokens,
        sampling,
        stop_strings: args.stop,
        eos_token_ids: engine.eos_token_ids().to_vec(),
        speculation: args.speculate.speculation(),
        output,
        keep_special_tokens: false,
        answer_starts: Vec::new(),
    };
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let mut write = |text: &str| match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Flow::Continue,
        Err(e) => {
            write_error = Some(e);
            Flow::Stop
        }
    };
    let mut thought = false;
    let generation = speculate::generate(&engine, &prompt, &settings, &args.speculate, |p| {
        if args.show_thinking && !p.reasoning.is_empty() {
            if !thought {
                eprintln!("thinking:");
                thought = true;
            }
            eprint!("{}", p.reasoning);
        }
        if thought && !p.text.is_empty() {
            eprintln!("\n(end of thinking)");
            thought = false;
        }
        write(p.text)
    })?;
    if let Some(e) = write_error {
        return Err(e).context("cannot write to stdout");
    }
    writeln!(stdout).context("cannot write to stdout")?;
    let s = &generation.stats;
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.1} tok/s); decode: {} tokens in {:.3} s ({:.2} tok/s); finished: {:?}",
        s.prompt_tokens,
        s.prefill_seconds,
        s.prefill_tokens_per_second(),
        s.generated_tokens,
        s.decode_seconds,
        s.decode_tokens_per_second(),
        generation.finish_reason,
    );
    if s.prefix_positions > 0 {
        eprintln!(
            "prefix cache: {} of {} prompt tokens reused ({:.1} MB of saved state)",
            s.prefix_positions,
            prompt.len(),
            s.prefix_bytes as f64 / 1e6
        );
    }
    if let Some(reason) = &s.prefix_refused {
        eprintln!("warning: prefix cache: {reason}");
    }
    let spec = &s.speculation;
    if spec.verify_passes > 0 {
        eprintln!(
            "speculation: {} verify passes, {} tokens guessed, {} kept ({:.0}%), {} plain steps",
            spec.verify_passes,
            spec.drafted,
            spec.accepted,
            100.0 * spec.acceptance().unwrap_or(0.0),
            spec.plain_steps,
        );
    }
    if let Some(stats) = engine.stats() {
        if let Some(path) = &args.trace {
            trace::write_jsonl(path, &engine.take_trace())
                .with_context(|| format!("writing the routing trace to {}", path.display()))?;
        }
        if let Err(e) = engine.save_heat() {
            eprintln!("warning: could not save the heat histogram: {e}");
        }
        let c = stats.cache;
        let read = stats.drive_bytes();
        let lookups = (c.hits + c.misses).max(1);
        eprintln!(
            "experts: {:.1}% cache hits ({} hits, {} misses, {} evictions), {:.1} MB held of a {:.1} MB budget, {:.1} MB read from drives",
            100.0 * c.hits as f64 / lookups as f64,
            c.hits,
            c.misses,
            c.evictions,
            c.held_bytes as f64 / 1e6,
            c.budget_bytes as f64 / 1e6,
            read as f64 / 1e6
        );
    }
    Ok(())
}
