//! `longhaul serve`: the job service with its HTTP API.

use std::io::IsTerminal;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use longhaul_service::client::{DEFAULT_PORT, ENDPOINT_FILE};
use longhaul_service::http::{ServeConfig, serve};
use longhaul_service::runner::RunnerConfig;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    data: super::DataDir,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Address to listen on; anything but loopback needs --allow-remote.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,
    /// Serve beyond this machine (any Host header; the token still applies).
    #[arg(long)]
    allow_remote: bool,
    #[command(flatten)]
    memory: super::MemoryArgs,
    #[command(flatten)]
    cache: super::CacheArgs,
    #[command(flatten)]
    prefix: super::PrefixArgs,
    /// Jobs of one model that may run at once, decoding together (each
    /// MoE layer reads the union of their experts once; answers are the
    /// same as alone). More than one pays when decoding is bound by compute
    /// or the cache is small, not when the drives are the limit.
    #[arg(long, default_value_t = longhaul_service::runner::DEFAULT_TOGETHER, value_parser = parse_together)]
    together: usize,
    /// A built web UI to serve at / (default: the one installed with this binary: `ui/` beside it, in `../lib/longhaul` or in the app bundle's resources).
    #[arg(long)]
    ui_dir: Option<PathBuf>,
}

fn parse_together(text: &str) -> Result<usize, String> {
    let most = longhaul_service::runner::crash::MAX_RUNNING;
    text.parse::<usize>()
        .ok()
        .filter(|n| (1..=most).contains(n))
        .ok_or_else(|| format!("`{text}`: give a whole number of jobs from 1 to {most}"))
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if !args.allow_remote && !args.host.is_loopback() {
        anyhow::bail!(
            "--host {} is not a loopback address; add --allow-remote to serve beyond this machine (the token still applies)",
            args.host
        );
    }
    let data_dir = args.data.data_dir();
    let mut runner = RunnerConfig {
        state_dir: Some(data_dir.join("state")),
        together: args.together,
        ..RunnerConfig::default()
    };
    let (budget, memory) = args.memory.resolve(super::PLANNED_CONTEXT_TOKENS)?;
    runner.streaming.budget_bytes = budget;
    runner.memory = memory;
    args.cache.apply(&mut runner.streaming);
    runner.prefix = args.prefix.open(&data_dir.join(super::PREFIX_DIR))?;
    runner.streaming.store.faults = longhaul_service::faults::store_faults();
    let config = ServeConfig {
        data_dir: data_dir.clone(),
        addr: SocketAddr::new(args.host, args.port),
        allow_remote: args.allow_remote,
        runner,
        ui_dir: args.ui_dir.or_else(longhaul_service::install::web_ui),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let endpoint = data_dir.join(ENDPOINT_FILE);
    // Only a service that got as far as serving owns `endpoint`: one that
    // failed to start must not remove the running one's.
    let serving = std::cell::Cell::new(false);
    let result = runtime.block_on(serve(
        config,
        |addr, token| {
            serving.set(true);
            let url = format!("http://{addr}");
            if let Err(e) = longhaul_service::data_dir::write_private(&endpoint, url.as_bytes()) {
                eprintln!("warning: cannot write {}: {e}", endpoint.display());
            }
            eprintln!(
                "Longhaul is serving on {url} (data in {})",
                data_dir.display()
            );
            // The token goes into the address only on a terminal: logs
            // that capture this output must not hold it.
            if std::io::stderr().is_terminal() {
                eprintln!("Open {url}/#token={token} in a browser, or use `longhaul jobs`.");
            } else {
                eprintln!(
                    "Open {url}/ in a browser with the token in {}, or use `longhaul jobs`.",
                    longhaul_service::http::token_path(&data_dir).display()
                );
            }
        },
        shutdown_signal(),
    ));
    if serving.get() {
        let _ = std::fs::remove_file(&endpoint);
    }
    result.context("the service stopped with an error")
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    eprintln!("stopping: the running job keeps its output and resumes at the next start");
}
