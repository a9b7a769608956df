//! `longhaul drives probe`: measure a pack's drives; `longhaul drives
//! health`: what the disks under them say of themselves.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use longhaul_service::health;

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
    /// Each disk under a pack's drives (or under folders): how it is
    /// attached, its temperature, wear and error counts, from smartctl.
    Health {
        /// Packs (their drive folders are read) or folders.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
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
        DrivesCommand::Health { paths, json } => health(&paths, json),
    }
}

/// The drive folders of a pack, or the folder itself.
fn folders_of(path: &Path) -> Vec<PathBuf> {
    match longhaul_engine::tools::Manifest::read(path) {
        Ok(m) => m.drives,
        Err(_) => vec![path.to_path_buf()],
    }
}

fn health(paths: &[PathBuf], json: bool) -> anyhow::Result<()> {
    for p in paths {
        if !p.exists() {
            anyhow::bail!("{} does not exist", p.display());
        }
    }
    let folders: Vec<PathBuf> = paths.iter().flat_map(|p| folders_of(p)).collect();
    let drives = health::monitor::survey(&folders, longhaul_service::queue::now_unix());
    if json {
        println!("{}", serde_json::to_string(&drives)?);
        return Ok(());
    }
    for d in &drives {
        for line in health::describe(d) {
            println!("{line}");
        }
    }
    Ok(())
}
