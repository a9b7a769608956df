//! `longhaul pack`: turn a checkpoint into a pack striped over drives, or
//! verify an existing pack.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use longhaul_engine::tools::HeatMap;
use longhaul_engine::tools::Quantization;
use longhaul_engine::tools::verify_pack;
use longhaul_engine::tools::{
    DEFAULT_ALIGNMENT, DEFAULT_SPLIT_THRESHOLD, PackError, PackOptions, PackPhase, PackProgress,
    PackSummary, write_pack,
};
use serde_json::json;

use super::size::parse_size;

#[derive(Args)]
pub struct PackArgs {
    /// Checkpoint folder or GGUF file (the first part of a split one) to
    /// pack, or a model name (ORG/NAME in the Hugging Face cache or LM
    /// Studio's models, NAME[:TAG] in Ollama's); with --verify, the pack to check.
    #[arg(value_parser = super::model_path)]
    source: PathBuf,
    /// Pack folder to create: manifest, config and tokenizer files.
    #[arg(long, required_unless_present = "verify")]
    out: Option<PathBuf>,
    /// Drive folders to stripe experts over, comma-separated.
    #[arg(long, value_delimiter = ',', required_unless_present = "verify")]
    drives: Vec<PathBuf>,
    /// Where to put the resident (non-expert) weights; default: the first drive.
    #[arg(long)]
    resident_dir: Option<PathBuf>,
    /// Records of at least twice this size are split over several drives, in segments no smaller than it.
    #[arg(long, value_parser = parse_size, default_value_t = DEFAULT_SPLIT_THRESHOLD)]
    split_threshold: u64,
    /// Alignment of every record (a power of two, at least 512).
    #[arg(long, value_parser = parse_size, default_value_t = DEFAULT_ALIGNMENT)]
    alignment: u64,
    /// Extra copies of the hottest experts, on other drives; reads go to the copy expected to finish first.
    #[arg(long, default_value_t = 0)]
    replicas: usize,
    /// An earlier pack of the same model whose heat histogram names the hottest experts.
    #[arg(long, requires = "replicas")]
    heat_from: Option<PathBuf>,
    /// Share of the experts in that histogram, hottest first, that get copies.
    #[arg(long, default_value_t = 0.1)]
    replica_share: f64,
    /// Store experts quantised (q8_0: ~8.5 bits per weight; q4k: ~4.5) instead of exactly as in the checkpoint. Fewer bytes per token, at some accuracy; the manifest labels it and records the weight error.
    #[arg(long, value_name = "q8_0|q4k", value_parser = parse_quantization)]
    experts: Option<Quantization>,
    /// Store the resident matrices (attention, shared experts, dense layers,
    /// embeddings, LM head; not routers or norms) as Q8_0: about half of
    /// BF16, for machines whose RAM cannot hold them as stored. Lossy: the
    /// manifest and `models` label it; `longhaul compare` measures the cost.
    #[arg(long, value_name = "q8_0", value_parser = parse_resident)]
    resident: Option<Quantization>,
    /// Compress float expert records losslessly where that saves at least 5%
    /// (on: the default; fewer bytes to read per token, restored by the
    /// reader threads at about 5 GB/s per core), or store them as they are.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    compress: String,
    /// Re-read every record of the pack SOURCE and check its checksum.
    #[arg(long)]
    verify: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_resident(s: &str) -> Result<Quantization, String> {
    match Quantization::parse(s) {
        Some(Quantization::Q8_0) => Ok(Quantization::Q8_0),
        _ => Err(format!(
            "`{s}`: resident matrices are quantised to q8_0 only"
        )),
    }
}

fn parse_quantization(s: &str) -> Result<Quantization, String> {
    Quantization::parse(s).ok_or_else(|| format!("`{s}` is not a quantisation; use q8_0 or q4k"))
}

pub fn progress_bar() -> ProgressBar {
    ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "{msg:18} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// Writes a pack with its phase and bytes on `bar` (hidden for no display).
pub fn write_pack_showing_progress(
    opts: &PackOptions,
    bar: ProgressBar,
) -> Result<PackSummary, PackError> {
    let phase = std::cell::Cell::new(None);
    let summary = write_pack(opts, &|p: PackProgress| {
        // Each phase counts its own bytes: its rate and ETA start afresh.
        if phase.replace(Some(p.phase)) != Some(p.phase) {
            bar.reset();
        }
        bar.set_message(match p.phase {
            PackPhase::HashingSource => "hashing source",
            PackPhase::WritingExperts => "writing experts",
            PackPhase::WritingResident => "writing resident weights",
        });
        bar.set_length(p.total_bytes);
        bar.set_position(p.done_bytes);
    });
    bar.finish_and_clear();
    summary
}

pub fn run(args: PackArgs) -> anyhow::Result<()> {
    if args.verify {
        return verify(args);
    }
    let (Some(out), false) = (args.out.clone(), args.drives.is_empty()) else {
        bail!("--out and --drives are required to make a pack");
    };
    let mut opts = PackOptions::new(args.source.clone(), out.clone(), args.drives.clone());
    opts.resident_dir = args.resident_dir.clone();
    opts.split_threshold = args.split_threshold;
    opts.alignment = args.alignment;
    opts.quantization = args.experts;
    opts.resident_quantization = args.resident;
    opts.compress = args.compress == "on";
    if args.replicas > 0 {
        let Some(heat_pack) = &args.heat_from else {
            bail!(
                "--replicas needs --heat-from PACK: an earlier pack whose heat histogram names the hottest experts"
            );
        };
        let heat = HeatMap::load(heat_pack);
        if heat.is_empty() {
            bail!(
                "{} has no heat histogram yet; run the model from it first",
                heat_pack.display()
            );
        }
        let take = (heat.len() as f64 * args.replica_share.clamp(0.0, 1.0)).ceil() as usize;
        opts.replicas = args.replicas;
        opts.replicate = heat
            .hottest()
            .into_iter()
            .take(take)
            .map(|(key, _)| key)
            .collect();
    }
    for warning in longhaul_service::devices::warnings(&args.drives) {
        eprintln!("warning: {warning}");
    }
    let summary = write_pack_showing_progress(&opts, progress_bar());
    let summary = summary.with_context(|| format!("cannot pack {}", args.source.display()))?;
    if args.json {
        println!(
            "{}",
            json!({
                "pack": out,
                "drives": summary.manifest.drives,
                "records": summary.records,
                "expert_bytes": summary.expert_bytes,
                "plain_expert_bytes": summary.plain_expert_bytes,
                "compression": summary.manifest.experts.compression,
                "resident_bytes": summary.resident_bytes,
                "expert_dtype": summary.manifest.experts.dtype,
                "quantization": summary.manifest.experts.quantization,
                "resident_quantization": summary.manifest.resident.quantization,
                "left_out": summary.manifest.left_out,
            })
        );
    } else {
        println!(
            "packed {} expert records ({:.1} MB) over {} drives and {:.1} MB of resident weights into {}",
            summary.records,
            summary.expert_bytes as f64 / 1e6,
            summary.manifest.drives.len(),
            summary.resident_bytes as f64 / 1e6,
            out.display()
        );
        for block in &summary.manifest.left_out {
            println!(
                "left out the checkpoint's {}: {} tensors, {:.1} MB ({}, …); the model does not run it",
                block.block.describe(),
                block.tensors,
                block.bytes as f64 / 1e6,
                block.first
            );
        }
        if let Some(c) = &summary.manifest.experts.compression {
            println!(
                "records compressed losslessly ({c}): {:.1} MB on the drives for {:.1} MB of weights ({:.0}%)",
                summary.expert_bytes as f64 / 1e6,
                summary.plain_expert_bytes as f64 / 1e6,
                100.0 * summary.expert_bytes as f64 / summary.plain_expert_bytes.max(1) as f64
            );
        }
        if let Some(q) = &summary.manifest.experts.quantization {
            println!(
                "experts quantised from {} to {}: relative RMS weight error {:.4}",
                q.from, summary.manifest.experts.dtype, q.relative_rms_error
            );
            if let Some(asked) = &q.requested {
                println!(
                    "{asked} was asked for; matrices whose rows are not whole {asked} blocks were stored as Q8_0 (`gate-up/down` in the dtype)"
                );
            }
        }
        if let Some(q) = &summary.manifest.resident.quantization {
            println!(
                "resident matrices quantised to {} (a lossy spine, labelled in the manifest): relative RMS weight error {:.4}; measure its cost with `longhaul compare`",
                q.requested.as_deref().unwrap_or("Q8_0"),
                q.relative_rms_error
            );
        }
    }
    Ok(())
}

fn verify(args: PackArgs) -> anyhow::Result<()> {
    let bar = progress_bar();
    bar.set_message("verifying");
    let report = verify_pack(&args.source, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let report = report.with_context(|| format!("cannot verify {}", args.source.display()))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for p in &report.problems {
            eprintln!("problem: {p}");
        }
        println!(
            "checked {} record copies ({:.1} MB) and the resident file ({:.1} MB): {}",
            report.records,
            report.record_bytes as f64 / 1e6,
            report.resident_bytes as f64 / 1e6,
            if report.problems.is_empty() {
                "all intact".to_string()
            } else {
                format!("{} problems", report.problems.len())
            }
        );
    }
    if !report.problems.is_empty() {
        bail!(
            "{} problems found in {}",
            report.problems.len(),
            args.source.display()
        );
    }
    Ok(())
}
