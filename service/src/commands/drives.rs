//! `longhaul drives probe`: measure a pack's drives.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::size::parse_size;

#[derive(Args)]
pub struct DrivesArgs {
    #[command(subcommand)]
    command: DrivesCommand,
}

#[derive(Subcommand)]
enum DrivesCommand {
    /// Raw read bandwidth of each drive of a pack, all drives at once.
    Probe {
        /// The pack whose drives to measure.
        #[arg(long, value_parser = super::model_path)]
        model: PathBuf,
        /// Bytes to read per drive.
        #[arg(long, value_parser = parse_size, default_value = "256M")]
        bytes: u64,
        #[arg(long, default_value_t = 2)]
        queue_depth: usize,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: DrivesArgs) -> anyhow::Result<()> {
    match args.command {
        DrivesCommand::Probe {
            model,
            bytes,
            queue_depth,
            json,
        } => {
            let report = super::bench::probe_pack(&model, bytes, queue_depth)?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                for d in &report.drives {
                    println!(
                        "{}: {:.1} MB/s ({:.1} MB read)",
                        d.path.display(),
                        d.mb_per_s,
                        d.bytes as f64 / 1e6
                    );
                }
                println!("all drives at once: {:.1} MB/s", report.aggregate_mb_per_s);
                let folders: Vec<_> = report.drives.iter().map(|d| d.path.clone()).collect();
                for warning in longhaul_service::devices::warnings(&folders) {
                    println!("note: {warning}; the figure for all at once is that device's own");
                }
            }
            Ok(())
        }
    }
}
