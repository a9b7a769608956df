//! `longhaul models`: register, list and remove the service's models.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

#[derive(Args)]
pub struct ModelsArgs {
    #[command(flatten)]
    data: super::DataDirArgs,
    #[command(subcommand)]
    command: ModelsCommand,
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Register a checkpoint, pack or GGUF file (PATH), or a remote OpenAI-compatible server (--remote-url).
    Add {
        /// The name jobs use for the model.
        name: String,
        /// A checkpoint folder, pack folder or GGUF file, or a name: ORG/NAME
        /// in the Hugging Face cache or LM Studio's models, NAME[:TAG] in Ollama's.
        #[arg(value_parser = super::model_path)]
        path: Option<PathBuf>,
        /// Base URL of a remote OpenAI-compatible server, e.g. http://gpu-box:8000.
        #[arg(long, conflicts_with = "path")]
        remote_url: Option<String>,
        /// Bearer key for the remote server.
        #[arg(long, requires = "remote_url")]
        api_key: Option<String>,
        /// The model's name on the remote server (default: NAME).
        #[arg(long, requires = "remote_url")]
        remote_model: Option<String>,
    },
    /// List registered models.
    List {
        /// Print the models as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Forget a model (its files are left alone).
    Remove {
        /// The model's name.
        name: String,
    },
}

pub fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let client = args.data.client()?;
    match args.command {
        ModelsCommand::Add {
            name,
            path,
            remote_url,
            api_key,
            remote_model,
        } => {
            let body = match (path, remote_url) {
                (Some(p), None) => {
                    let p = std::fs::canonicalize(&p).unwrap_or(p);
                    json!({ "name": name, "path": p })
                }
                (None, Some(u)) => {
                    json!({ "name": name, "url": u, "api_key": api_key, "remote_model": remote_model })
                }
                _ => bail!("give a model PATH or --remote-url"),
            };
            let m: Value = client.post("/api/models", &body)?;
            println!("registered `{}`", m["name"].as_str().unwrap_or(&name));
        }
        ModelsCommand::List { json } => {
            let v: Value = client.get("/api/models")?;
            if json {
                println!("{v}");
            } else {
                let models = v["models"].as_array().cloned().unwrap_or_default();
                if models.is_empty() {
                    println!("no models yet: `longhaul models add NAME PATH`");
                }
                for m in models {
                    let place = m["path"].as_str().or(m["url"].as_str()).unwrap_or("?");
                    let w = &m["weights"];
                    let weights = match (w["experts"].as_str(), w["lossy"].as_bool()) {
                        (Some(e), Some(true)) => format!(
                            "  [lossy: experts {e}, resident {}]",
                            w["resident"].as_str().unwrap_or("?")
                        ),
                        (Some(e), _) => format!("  [experts {e}]"),
                        _ => String::new(),
                    };
                    println!(
                        "{:20} {:7} {place}{weights}",
                        m["name"].as_str().unwrap_or("?"),
                        m["kind"].as_str().unwrap_or("?")
                    );
                }
            }
        }
        ModelsCommand::Remove { name } => {
            client.delete(&format!(
                "/api/models/{}",
                longhaul_service::client::path_segment(&name)
            ))?;
            println!("removed `{name}`");
        }
    }
    Ok(())
}
