//! `longhaul compare`: how closely a model (typically a quantised pack)
//! predicts a text compared with a reference (the checkpoint it came from).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use longhaul_engine::tools::compare_logits;

#[derive(Args)]
pub struct CompareArgs {
    /// The model to judge against (a checkpoint or a pack).
    #[arg(long, value_parser = super::model_path)]
    reference: PathBuf,
    #[command(flatten)]
    model: super::ModelArgs,
    /// File holding the text both models are scored on.
    #[arg(long, conflicts_with = "prompt", required_unless_present = "prompt")]
    text: Option<PathBuf>,
    /// The text itself, instead of --text.
    #[arg(long)]
    prompt: Option<String>,
    /// Score at most this many tokens from the start of the text.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: CompareArgs) -> anyhow::Result<()> {
    let text = match (&args.text, &args.prompt) {
        (Some(path), _) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --text {}", path.display()))?,
        (None, Some(p)) => p.clone(),
        (None, None) => bail!("give the text to score with --text FILE or --prompt TEXT"),
    };
    let candidate = args.model.open()?;
    let reference = args.model.open_with_path(&args.reference)?;
    if candidate.vocab_size() != reference.vocab_size() {
        bail!(
            "the models have different vocabularies ({} and {} tokens); compare a pack with its own checkpoint",
            candidate.vocab_size(),
            reference.vocab_size()
        );
    }
    let mut ids = reference
        .prompt_ids(&text, false)
        .context("cannot tokenise the text")?;
    ids.truncate(args.max_tokens);
    if ids.len() < 2 {
        bail!(
            "the text is {} token(s) long; at least 2 are needed",
            ids.len()
        );
    }
    let rows = |engine: &longhaul_engine::Engine| -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(engine.logits(&ids)?.to_vec2()?)
    };
    let report = compare_logits(&rows(&reference)?, &rows(&candidate)?, &ids)
        .context("the models' logits cannot be compared")?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} tokens: mean KL {:.5} nats (max {:.5}), top-1 agreement {:.1}%, perplexity {:.3} (reference {:.3}), max |Δlogit| {:.4}",
            report.positions,
            report.mean_kl,
            report.max_kl,
            100.0 * report.top1_agreement,
            report.candidate_perplexity,
            report.reference_perplexity,
            report.max_abs_logit_diff
        );
    }
    Ok(())
}
