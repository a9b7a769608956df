//! `longhaul`: run, score and (later) serve Mixture-of-Experts models.

mod commands;
mod report;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "longhaul",
    version,
    about = "Run Mixture-of-Experts models larger than memory, offline",
    // A later option replaces an earlier one, so scripts can append their
    // own `--budget auto` to a command line that already gives one.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// See Longhaul work end to end on the small model it ships: pack, queue, stream, statistics.
    Demo(commands::demo::DemoArgs),
    /// Generate text from a prompt, streaming it to stdout.
    Run(commands::run::RunArgs),
    /// Print the model's logits for a sequence of token ids.
    Logits(commands::logits::LogitsArgs),
    /// Pack a checkpoint or GGUF file over several drives for streaming, or verify a pack.
    Pack(commands::pack::PackArgs),
    /// Write a random-weight checkpoint of any shape and size.
    Synth(commands::synth::SynthArgs),
    /// Measure decoding from a pack, cold, against the drives' ceiling.
    Bench(commands::bench::BenchArgs),
    /// Score how closely a model (e.g. a quantised pack) predicts a text compared with a reference.
    Compare(commands::compare::CompareArgs),
    /// Run the job service: queue, runner and HTTP API.
    Serve(commands::serve::ServeArgs),
    /// Register and list the service's models.
    Models(commands::models::ModelsArgs),
    /// Submit, follow and steer jobs on the service.
    Jobs(commands::jobs::JobsArgs),
    /// Inspect and measure drives.
    Drives(commands::drives::DrivesArgs),
}

/// Commands that print and end behave as other Unix tools when their
/// reader goes away (`longhaul jobs list | head -2`): they stop, quietly.
/// Rust ignores SIGPIPE, so a closed pipe would otherwise make `println!`
/// panic. The service keeps ignoring it: a browser closing its connection
/// must not end the service.
fn die_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal, before any
    // thread is started; no handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Demo(_)) {
        die_quietly_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Logits(args) => commands::logits::run(args),
        Command::Pack(args) => commands::pack::run(args),
        Command::Synth(args) => commands::synth::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Drives(args) => commands::drives::run(args),
        Command::Compare(args) => commands::compare::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Models(args) => commands::models::run(args),
        Command::Jobs(args) => commands::jobs::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", report::error_text(&e));
            ExitCode::FAILURE
        }
    }
}
