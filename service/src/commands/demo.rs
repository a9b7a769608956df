//! `longhaul demo`: the whole system on the small trained model in `assets/`.
//!
//! A new user has no trillion-parameter model on several SSDs yet, and should
//! still see Longhaul work end to end, offline: the demo packs the shipped
//! Qwen3-MoE model over four folders under the data dir that act as drives,
//! runs it with a RAM budget far below the experts' size so that experts
//! really stream, registers it with the job service, sends a task through the
//! queue, prints the answer as it is written and then the job's figures. A
//! second run finds the pack made from the same files and reuses it.
//!
//! When a service already runs on the data dir the demo uses it (its RAM
//! budget applies, and the task shows up in its UI); otherwise it starts one
//! inside this process for the length of the demo.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::ProgressBar;
use longhaul_engine::tools::{Manifest, PackOptions, pack_matches_source};
use longhaul_service::client::Client;
use longhaul_service::http::{ServeConfig, serve};
use longhaul_service::runner::RunnerConfig;
use serde_json::{Value, json};

use super::jobs::{Echo, watch};
use super::pack::{progress_bar, write_pack_showing_progress};
use super::size::{format_size, parse_size};

/// The name the demo model is registered under.
pub const DEMO_MODEL_NAME: &str = "longhaul-demo";
/// The task the demo sends.
pub const DEMO_PROMPT: &str = "Explain how to read and write files.";
/// Nucleus sampling for the demo's answer: small models wander less with it.
const DEMO_TOP_P: f64 = 0.9;
/// Folders under the data dir that act as the demo's drives.
const DRIVES: usize = 4;
const DEMO_DIR: &str = "demo";
const PACK_DIR: &str = "longhaul-demo-moe";
/// How long a service on the data dir gets to answer before the demo starts its own.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the demo's own service gets to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args)]
pub struct DemoArgs {
    #[command(flatten)]
    data: super::DataDirArgs,
    /// The demo checkpoint (default: the one installed with this binary: `assets/longhaul-demo-moe` beside it, in `../lib/longhaul` or in the app bundle's resources).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// RAM for routed experts when the demo starts its own service: far below
    /// the experts' size, so that they stream from the drive folders.
    #[arg(long, value_parser = parse_size, default_value = "8M")]
    budget: u64,
    /// The task to send.
    #[arg(long, default_value = DEMO_PROMPT)]
    prompt: String,
    /// Longest answer, in tokens.
    #[arg(long, default_value_t = 200)]
    max_tokens: u32,
    /// Sampling temperature (0 for the most likely token each time).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Seed for sampling: the same seed gives the same answer.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the statistics (and the answer) as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// The installed demo checkpoint (see [`longhaul_service::install`]).
fn default_checkpoint() -> anyhow::Result<PathBuf> {
    longhaul_service::install::demo_model().map_err(|looked| {
        anyhow::anyhow!(
            "the demo model is not installed with this binary: looked in {}; reinstall with scripts/install.sh, or give its folder with --checkpoint",
            looked
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let data_dir = args.data.data_dir();
    let checkpoint = match args.checkpoint.clone() {
        Some(c) => c,
        None => default_checkpoint()?,
    };
    if !checkpoint.join("config.json").is_file() {
        bail!(
            "{} holds no demo model (no config.json); give its folder with --checkpoint (installed as `lib/longhaul/{}`)",
            checkpoint.display(),
            longhaul_service::install::DEMO_MODEL
        );
    }
    let say = |line: String| {
        if !args.json {
            eprintln!("{line}");
        }
    };
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint.join("config.json"))
            .with_context(|| format!("cannot read {}/config.json", checkpoint.display()))?,
    )
    .with_context(|| format!("{}/config.json is not JSON", checkpoint.display()))?;
    say(format!(
        "Longhaul demo: {} ({} layers, {} routed experts per layer, {} per token)",
        checkpoint.display(),
        config["num_hidden_layers"],
        config["num_experts"],
        config["num_experts_per_tok"],
    ));

    let service = DemoService::attach_or_start(&data_dir, args.data.url.as_deref(), args.budget)?;
    let root = data_dir.join(DEMO_DIR);
    let (pack, reused) = ensure_pack(&checkpoint, &root, args.json)?;
    let manifest = Manifest::read(&pack)?;
    let expert_bytes: u64 = manifest
        .experts
        .layers
        .iter()
        .flat_map(|l| &l.records)
        .map(|r| r.len)
        .sum();
    say(format!(
        "pack: {} {} ({} of experts over {} drive folders in {})",
        if reused { "reusing" } else { "wrote" },
        pack.display(),
        format_size(expert_bytes),
        manifest.drives.len(),
        root.display()
    ));

    let client = &service.client;
    let info: Value = client.get("/api/info")?;
    let budget = info["budget_bytes"].as_u64().unwrap_or(args.budget);
    say(format!(
        "service: {} at {}; RAM for experts {}",
        if service.own.is_some() {
            "started for the demo"
        } else {
            "using the one running"
        },
        client.base(),
        format_size(budget),
    ));
    register(client, &pack)?;

    let body = json!({
        "model": DEMO_MODEL_NAME,
        "title": "Longhaul demo",
        "messages": [{ "role": "user", "content": args.prompt }],
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": DEMO_TOP_P,
        "seed": args.seed,
    });
    let job: Value = client.post("/api/jobs", &body)?;
    let id = job["id"]
        .as_i64()
        .context("the service returned no job id")?;
    say(format!("task (job {id}): {}\n", args.prompt));
    let job = watch(client, id, if args.json { Echo::Quiet } else { Echo::Text })?;
    let report = report(&job, &pack, reused, budget, expert_bytes, &manifest);
    if args.json {
        println!("{report}");
    } else {
        print_report(&report);
    }
    service.stop();
    Ok(())
}

/// Makes the pack under `root`, or reuses the one there when it was made
/// from the checkpoint's current files.
fn ensure_pack(checkpoint: &Path, root: &Path, quiet: bool) -> anyhow::Result<(PathBuf, bool)> {
    let pack = root.join(PACK_DIR);
    if Manifest::read(&pack).is_ok() {
        if pack_matches_source(&pack, checkpoint).unwrap_or(false) {
            return Ok((pack, true));
        }
        if !quiet {
            eprintln!(
                "pack: {} was made from other files; packing again",
                pack.display()
            );
        }
    }
    let drives: Vec<PathBuf> = (1..=DRIVES)
        .map(|i| root.join("drives").join(format!("drive-{i}")))
        .collect();
    // Only the demo writes here: clear what an older or broken pack left.
    for dir in drives.iter().chain([&pack]) {
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("cannot clear {}", dir.display()))?;
        }
    }
    for dir in &drives {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let opts = PackOptions::new(checkpoint.to_path_buf(), pack.clone(), drives);
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        progress_bar()
    };
    let summary = write_pack_showing_progress(&opts, bar);
    summary.with_context(|| format!("cannot pack {}", checkpoint.display()))?;
    Ok((pack, false))
}

/// Registers the pack as the demo model, replacing an entry of that name
/// that points elsewhere.
fn register(client: &Client, pack: &Path) -> anyhow::Result<()> {
    let models: Value = client.get("/api/models")?;
    let canonical = std::fs::canonicalize(pack).unwrap_or_else(|_| pack.to_path_buf());
    let existing = models["models"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == DEMO_MODEL_NAME);
    if let Some(m) = existing {
        if m["path"].as_str().map(PathBuf::from) == Some(canonical.clone()) {
            return Ok(());
        }
        client.delete(&format!("/api/models/{DEMO_MODEL_NAME}"))?;
    }
    let _: Value = client.post(
        "/api/models",
        &json!({ "name": DEMO_MODEL_NAME, "path": canonical }),
    )?;
    Ok(())
}

/// The job's figures as one object.
fn report(
    job: &Value,
    pack: &Path,
    reused: bool,
    budget: u64,
    expert_bytes: u64,
    manifest: &Manifest,
) -> Value {
    let stats = &job["stats"];
    let read = stats["drive_bytes_read"].as_array();
    let drives: Vec<Value> = manifest
        .drives
        .iter()
        .map(|d| {
            let bytes = read
                .into_iter()
                .flatten()
                .find(|r| r["path"].as_str().map(Path::new) == Some(d.as_path()))
                .and_then(|r| r["bytes"].as_u64())
                .unwrap_or(0);
            json!({ "path": d, "bytes_read": bytes })
        })
        .collect();
    json!({
        "job": job["id"],
        "model": DEMO_MODEL_NAME,
        "pack": pack,
        "pack_reused": reused,
        "state": job["state"],
        "finish_reason": job["finish_reason"],
        "text": job["output"],
        "prompt_tokens": stats["prompt_tokens"],
        "tokens": job["tokens"],
        "tokens_per_second": stats["tokens_per_second"],
        "time_to_first_token_s": stats["time_to_first_token_s"],
        "wall_seconds": stats["wall_seconds"],
        "cache_hit_rate": stats["cache_hit_rate"],
        "budget_bytes": budget,
        "expert_bytes": expert_bytes,
        "expert_bytes_read": stats["expert_bytes_read"],
        "drives": drives,
    })
}

fn print_report(r: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let size = |v: &Value| format_size(v.as_u64().unwrap_or(0));
    println!();
    println!("job {} {}", r["job"], r["state"].as_str().unwrap_or("?"));
    println!(
        "  tokens      {} in {:.1} s: {:.1} tok/s, first token after {:.2} s",
        r["tokens"],
        f(&r["wall_seconds"]),
        f(&r["tokens_per_second"]),
        f(&r["time_to_first_token_s"]),
    );
    println!(
        "  cache       hit rate {:.1} % with {} of RAM for {} of experts",
        f(&r["cache_hit_rate"]) * 100.0,
        size(&r["budget_bytes"]),
        size(&r["expert_bytes"]),
    );
    println!("  read        {} of experts", size(&r["expert_bytes_read"]));
    for d in r["drives"].as_array().into_iter().flatten() {
        println!(
            "    {:>10}  {}",
            size(&d["bytes_read"]),
            d["path"].as_str().unwrap_or("?")
        );
    }
}

/// The service the demo talks to: one already running on the data dir, or
/// one started in this process until the demo ends.
struct DemoService {
    client: Client,
    own: Option<OwnService>,
}

struct OwnService {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl DemoService {
    fn attach_or_start(data_dir: &Path, url: Option<&str>, budget: u64) -> anyhow::Result<Self> {
        if let Ok(client) = Client::new(data_dir, url)
            && answers(client.base())
        {
            return Ok(Self { client, own: None });
        }
        if let Some(u) = url {
            bail!("no Longhaul service answers at {u}");
        }
        let mut runner = RunnerConfig {
            state_dir: Some(data_dir.join("state")),
            ..RunnerConfig::default()
        };
        runner.streaming.budget_bytes = budget;
        let config = ServeConfig {
            data_dir: data_dir.to_path_buf(),
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            allow_remote: false,
            runner,
            ui_dir: None,
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("cannot start the async runtime: {e}")));
                    return;
                }
            };
            let failed = ready_tx.clone();
            let result = runtime.block_on(serve(
                config,
                |addr, _token| {
                    let _ = ready_tx.send(Ok(addr));
                },
                async {
                    let _ = stopped.await;
                },
            ));
            if let Err(e) = result {
                let _ = failed.send(Err(e.to_string()));
            }
        });
        let addr = match ready_rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => bail!("cannot start the demo's service: {e}"),
            Err(_) => bail!("the demo's service did not start within {START_TIMEOUT:?}"),
        };
        let client = Client::new(data_dir, Some(&format!("http://{addr}")))?;
        Ok(Self {
            client,
            own: Some(OwnService { stop, thread }),
        })
    }

    fn stop(self) {
        if let Some(own) = self.own {
            let _ = own.stop.send(());
            let _ = own.thread.join();
        }
    }
}

/// Whether a Longhaul service answers at `base`.
fn answers(base: &str) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(PROBE_TIMEOUT))
        .build()
        .into();
    agent
        .get(format!("{base}/api/health"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_json::<Value>().ok())
        .is_some_and(|v| v["service"] == "longhaul")
}
