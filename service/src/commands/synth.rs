//! `longhaul synth`: write a random-weight checkpoint of any shape and size.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use longhaul_engine::tools::{SynthDtype, synth_spec, write_synthetic};
use serde_json::json;

use super::size::parse_size;

#[derive(Args)]
pub struct SynthArgs {
    /// Architecture: a family's `model_type` (the families' table lists
    /// what each is).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(longhaul_engine::tools::synth_names()))]
    arch: String,
    /// Folder to write the checkpoint into.
    #[arg(long)]
    out: PathBuf,
    /// Total size of routed experts to aim for (sets the layer count), e.g. 12G.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Decoder layers (default 8; --size sets it instead).
    #[arg(long)]
    layers: Option<usize>,
    /// Hidden size (default 1024).
    #[arg(long)]
    hidden: Option<usize>,
    /// Attention heads (default 8).
    #[arg(long)]
    heads: Option<usize>,
    /// Key/value heads, for architectures with grouped-query attention (default 8).
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Routed experts per MoE layer (default 64).
    #[arg(long)]
    experts: Option<usize>,
    /// Experts each token is routed to (default 8).
    #[arg(long)]
    top_k: Option<usize>,
    /// Intermediate size of each routed expert (default 512).
    #[arg(long)]
    moe_intermediate: Option<usize>,
    /// Vocabulary size (default 4096; at least 256, the byte-level tokenizer's alphabet).
    #[arg(long)]
    vocab: Option<usize>,
    /// Skew expert popularity, e.g. zipf:1 (default: none).
    #[arg(long)]
    popularity: Option<String>,
    /// How weights are stored: bf16 (as most models are released), f32,
    /// fp8 (projections as FP8 e4m3 with 128x128 block scales, as
    /// DeepSeek-V3 is published) or int4 (routed experts as INT4 in groups
    /// of 32, compressed-tensors pack-quantized, as Kimi K2-Thinking is).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Seed for the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print a summary as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let mut spec = synth_spec(&args.arch)?;
    let set = |field: &mut usize, value: Option<usize>| {
        if let Some(v) = value {
            *field = v;
        }
    };
    set(&mut spec.hidden, args.hidden);
    set(&mut spec.heads, args.heads);
    spec.kv_heads = args.kv_heads.unwrap_or(spec.heads.min(spec.kv_heads));
    set(&mut spec.experts, args.experts);
    set(&mut spec.top_k, args.top_k);
    set(&mut spec.moe_intermediate, args.moe_intermediate);
    set(&mut spec.vocab, args.vocab);
    set(&mut spec.layers, args.layers);
    spec.dtype = SynthDtype::parse(&args.dtype)?;
    spec.seed = args.seed;
    if let Some(p) = &args.popularity {
        let Some(s) = p.strip_prefix("zipf:") else {
            bail!("--popularity {p}: expected zipf:S, e.g. zipf:1");
        };
        spec.zipf = s
            .parse()
            .with_context(|| format!("--popularity {p}: `{s}` is not a number"))?;
    }
    if let Some(size) = args.size {
        if args.layers.is_some() {
            bail!("give --size or --layers, not both");
        }
        spec.fit_size(size);
    }
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "writing {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let summary = write_synthetic(&spec, &args.out, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let summary = summary.with_context(|| format!("cannot write {}", args.out.display()))?;
    if args.json {
        println!(
            "{}",
            json!({
                "out": args.out,
                "arch": args.arch,
                "layers": summary.layers,
                "parameters": summary.parameters,
                "bytes": summary.bytes,
                "expert_bytes": summary.expert_bytes,
                "expert_record_bytes": spec.expert_bytes(),
                "zipf": spec.zipf,
            })
        );
    } else {
        println!(
            "wrote {} ({} layers, {:.2} B parameters, {:.1} GB of which {:.1} GB routed experts)",
            args.out.display(),
            summary.layers,
            summary.parameters as f64 / 1e9,
            summary.bytes as f64 / 1e9,
            summary.expert_bytes as f64 / 1e9
        );
    }
    Ok(())
}
