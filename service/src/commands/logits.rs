//! `longhaul logits`: the model's raw scores for a token sequence.
//!
//! The JSON form, `{"ids": [...], "logits": [[...], ...]}` with one
//! full-vocabulary row per position, is a stable contract for outside checks.

use std::io::Write;

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;

/// Rows shown per position in the human-readable form.
const TOP_SHOWN: usize = 5;

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: super::ModelArgs,
    /// Comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',', required = true, num_args = 1..)]
    ids: Vec<u32>,
    /// Print one JSON object with the full logits.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct LogitsOutput<'a> {
    ids: &'a [u32],
    logits: Vec<Vec<f32>>,
}

pub fn run(args: LogitsArgs) -> anyhow::Result<()> {
    let engine = args.model.open()?;
    let vocab = engine.vocab_size();
    if let Some(bad) = args.ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("--ids: token id {bad} is outside the model's vocabulary of {vocab}");
    }
    let logits: Vec<Vec<f32>> = engine
        .logits(&args.ids)?
        .to_vec2()
        .context("reading logits")?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(
            &mut out,
            &LogitsOutput {
                ids: &args.ids,
                logits,
            },
        )?;
        writeln!(out)?;
        return Ok(());
    }
    for (pos, (id, row)) in args.ids.iter().zip(&logits).enumerate() {
        let mut ranked: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let top: Vec<String> = ranked
            .iter()
            .take(TOP_SHOWN)
            .map(|(t, l)| format!("{t}:{l:.4}"))
            .collect();
        writeln!(out, "position {pos} (id {id}): top {}", top.join("  "))?;
    }
    Ok(())
}
