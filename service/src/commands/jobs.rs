//! `longhaul jobs`: submit long-form tasks to the service and follow them.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use longhaul_service::client::Client;
use serde_json::{Value, json};

#[derive(Args)]
pub struct JobsArgs {
    #[command(flatten)]
    data: super::DataDirArgs,
    #[command(subcommand)]
    command: JobsCommand,
}

#[derive(Subcommand)]
enum JobsCommand {
    /// Queue a task. The prompt is PROMPT, or the contents of --prompt-file.
    Submit(Box<SubmitArgs>),
    /// List jobs, newest first.
    List {
        /// Print the jobs as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Show one job with its output so far.
    Show {
        /// The job's id (`jobs list` shows them).
        id: i64,
        /// Print the job as one JSON object.
        #[arg(long)]
        json: bool,
        /// Print the model's reasoning before its answer.
        #[arg(long)]
        show_thinking: bool,
    },
    /// Follow a job: its text as it is written, and a progress bar with tokens/s and ETA.
    Watch {
        /// The job's id.
        id: i64,
    },
    /// End a job for good: its output so far is kept, it does not run again.
    Cancel {
        /// The job's id.
        id: i64,
    },
    /// Stop a job where it is (running or waiting) until `jobs resume`; nothing is lost.
    Pause {
        /// The job's id.
        id: i64,
    },
    /// Queue a paused job again; it continues where it stopped.
    Resume {
        /// The job's id.
        id: i64,
    },
    /// Delete an ended job (done, failed or cancelled) and its output, for good.
    Delete {
        /// The job's id.
        id: i64,
    },
    /// Move a waiting job to INDEX (0 = next) among jobs of its priority.
    Move { id: i64, index: usize },
    /// Write a job as Markdown or JSON, with its settings and statistics.
    Export {
        id: i64,
        #[arg(long, default_value = "markdown", value_parser = ["markdown", "json"])]
        format: String,
        /// File to write (default: stdout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Args)]
struct SubmitArgs {
    /// The task, as text (or give --prompt-file).
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long, conflicts_with = "prompt")]
    prompt_file: Option<PathBuf>,
    /// A registered model name.
    #[arg(long)]
    model: String,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A switch for the chat template or prompt encoder (repeatable):
    /// `enable_thinking=false`, `thinking=true`, `reasoning_effort=high`.
    #[arg(long = "chat-arg", value_name = "KEY=VALUE", value_parser = super::run::parse_chat_arg, requires = "chat")]
    chat_args: Vec<(String, Value)>,
    /// Files or folders whose text goes before the prompt (repeatable).
    #[arg(long = "attach")]
    attach: Vec<PathBuf>,
    /// A name for the job in lists and exports (default: the prompt's start).
    #[arg(long)]
    title: Option<String>,
    /// Higher runs sooner: waiting jobs run by priority, highest first, then
    /// in queue order.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i64,
    /// Most tokens to generate (default: 1,024).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Sampling temperature; 0 picks the likeliest token every time (greedy).
    /// Unset sampling settings take the model's generation_config.json.
    #[arg(long)]
    temperature: Option<f32>,
    /// Guess ahead and verify the guesses (the answer is the same either
    /// way): auto (while it pays, the default), lookup (always) or off.
    #[arg(long, value_parser = ["auto", "lookup", "off"])]
    speculate: Option<String>,
    /// Sample only from the smallest set of tokens whose probability reaches P.
    #[arg(long)]
    top_p: Option<f32>,
    /// Sample only from the K likeliest tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Seed of the sampler: the same seed, prompt and settings give the same text.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Follow the job after queueing it.
    #[arg(long)]
    watch: bool,
    /// Print the queued job as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: JobsArgs) -> anyhow::Result<()> {
    let client = args.data.client()?;
    match args.command {
        JobsCommand::Submit(s) => submit(&client, *s),
        JobsCommand::List { json } => list(&client, json),
        JobsCommand::Show {
            id,
            json,
            show_thinking,
        } => {
            let job: Value = client.get(&format!("/api/jobs/{id}"))?;
            if json {
                println!("{job}");
            } else {
                println!(
                    "job {} · {} · {} · {} tokens",
                    job["id"],
                    job["title"].as_str().unwrap_or(""),
                    job["state"].as_str().unwrap_or(""),
                    job["tokens"]
                );
                if let Some(e) = job["error"].as_str() {
                    println!("error: {e}");
                }
                if let Some(r) = job["pause_reason"].as_str() {
                    println!("paused: {r}");
                }
                println!();
                if let Some(r) = job["reasoning"].as_str().filter(|_| show_thinking) {
                    println!("thinking:\n{r}\n(end of thinking)\n");
                }
                println!("{}", job["output"].as_str().unwrap_or(""));
            }
            Ok(())
        }
        JobsCommand::Watch { id } => watch(&client, id, Echo::Text).map(drop),
        JobsCommand::Cancel { id } => act(&client, id, "cancel"),
        JobsCommand::Pause { id } => act(&client, id, "pause"),
        JobsCommand::Resume { id } => act(&client, id, "resume"),
        JobsCommand::Delete { id } => {
            client.delete(&format!("/api/jobs/{id}"))?;
            println!("job {id} deleted");
            Ok(())
        }
        JobsCommand::Move { id, index } => {
            let job: Value =
                client.post(&format!("/api/jobs/{id}/move"), &json!({ "index": index }))?;
            println!(
                "job {id} is now number {} in the queue",
                job["queue_position"]
            );
            Ok(())
        }
        JobsCommand::Export { id, format, out } => {
            let text = client.get_text(&format!("/api/jobs/{id}/export?format={format}"))?;
            match out {
                Some(path) => {
                    longhaul_engine::private::write(&path, text.as_bytes())
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    eprintln!("wrote {}", path.display());
                }
                None => print!("{text}"),
            }
            Ok(())
        }
    }
}

fn submit(client: &Client, s: SubmitArgs) -> anyhow::Result<()> {
    let prompt = match (s.prompt, s.prompt_file) {
        (Some(p), None) => p,
        (None, Some(f)) => std::fs::read_to_string(&f)
            .with_context(|| format!("cannot read --prompt-file {}", f.display()))?,
        _ => bail!("give the task as PROMPT or --prompt-file FILE"),
    };
    let attachments: Vec<PathBuf> = s
        .attach
        .iter()
        .map(|p| {
            std::fs::canonicalize(p)
                .with_context(|| format!("--attach {}: no such file or folder", p.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut body = json!({
        "model": s.model,
        "title": s.title,
        "priority": s.priority,
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "seed": s.seed,
        "stop": if s.stop.is_empty() { None } else { Some(s.stop) },
        "speculate": s.speculate,
        "attachments": attachments,
    });
    if s.chat {
        body["messages"] = json!([{ "role": "user", "content": prompt }]);
        if !s.chat_args.is_empty() {
            body["chat_template_kwargs"] = Value::Object(s.chat_args.into_iter().collect());
        }
    } else {
        body["prompt"] = json!(prompt);
    }
    // Say what is being sent before sending it.
    let mut preview = json!({ "model": body["model"], "attachments": body["attachments"] });
    for key in ["prompt", "messages", "chat_template_kwargs"] {
        if !body[key].is_null() {
            preview[key] = body[key].clone();
        }
    }
    let p: Value = client.post("/api/jobs/preview", &preview)?;
    if !s.json {
        let files = p["attachment_files"].as_array().map_or(0, Vec::len);
        eprintln!(
            "prompt: {}{} tokens{}",
            if p["estimate"] == true { "about " } else { "" },
            p["prompt_tokens"],
            if files > 0 {
                format!(", {files} attached files")
            } else {
                String::new()
            }
        );
        for skipped in p["skipped"].as_array().into_iter().flatten() {
            eprintln!(
                "skipped {} ({})",
                skipped["path"].as_str().unwrap_or("?"),
                skipped["reason"].as_str().unwrap_or("?")
            );
        }
    }
    let job: Value = client.post("/api/jobs", &body)?;
    if s.json {
        println!("{job}");
    } else {
        eprintln!(
            "queued job {} ({}), number {} in the queue",
            job["id"],
            job["title"].as_str().unwrap_or(""),
            job["queue_position"]
        );
    }
    if s.watch {
        let id = job["id"]
            .as_i64()
            .context("the service returned no job id")?;
        watch(client, id, Echo::Text)?;
    }
    Ok(())
}

fn list(client: &Client, json: bool) -> anyhow::Result<()> {
    let v: Value = client.get("/api/jobs")?;
    if json {
        println!("{v}");
        return Ok(());
    }
    let jobs = v["jobs"].as_array().cloned().unwrap_or_default();
    if jobs.is_empty() {
        println!("no jobs yet: `longhaul jobs submit --model NAME \"...\"`");
    }
    for j in jobs {
        let pos = j["queue_position"]
            .as_u64()
            .map_or(String::new(), |p| format!("#{p}"));
        println!(
            "{:>5}  {:11} {:>4} {:>7} tok  {:16} {}",
            j["id"],
            j["state"].as_str().unwrap_or(""),
            pos,
            j["tokens"],
            j["model"].as_str().unwrap_or(""),
            j["title"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

fn act(client: &Client, id: i64, action: &str) -> anyhow::Result<()> {
    let job: Value = client.post(&format!("/api/jobs/{id}/{action}"), &json!({}))?;
    println!("job {id} is {}", job["state"].as_str().unwrap_or("?"));
    Ok(())
}

/// Whether `watch` prints the job's text on stdout.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    Text,
    /// Only the progress bar (on stderr): stdout is kept for a JSON report.
    Quiet,
}

/// Follows a job to its end, printing its text as it arrives (unless quiet)
/// with a progress bar on stderr; returns the job as it ended.
/// What a job that is not producing text is doing, for the progress bar.
fn waiting_message(job: &Value) -> String {
    match (job["state"].as_str(), job["queue_position"].as_u64()) {
        (_, Some(pos)) => format!("waiting in line: number {pos} in the queue"),
        (Some("queued"), None) => "waiting in line".into(),
        (Some("interrupted"), None) => "interrupted; it continues when the service runs it".into(),
        (Some("paused"), None) => format!(
            "paused: {}",
            job["pause_reason"]
                .as_str()
                .unwrap_or("until `jobs resume`")
        ),
        (Some(state), None) => state.to_string(),
        (None, None) => String::new(),
    }
}

/// What a running job is doing: reading its prompt (how far, how fast,
/// how long still) or answering (speed and time to `max_tokens`).
fn progress_message(progress: &Value) -> String {
    let prompt = &progress["prompt"];
    if let (Some(done), Some(total)) = (prompt["done"].as_u64(), prompt["total"].as_u64()) {
        let mut text = format!("reading the prompt: {done}/{total}");
        if let Some(r) = prompt["per_second"].as_f64() {
            text += &format!(", {r:.0} tok/s");
        }
        if let Some(e) = prompt["eta_seconds"].as_f64() {
            text += &format!(", {} left", short_duration(e));
        }
        return text;
    }
    let rate = progress["tokens_per_second"].as_f64();
    let eta = progress["eta_seconds"].as_f64();
    match (rate, eta) {
        (Some(r), Some(e)) => format!("{r:.2} tok/s, ETA {}", short_duration(e)),
        (Some(r), None) => format!("{r:.2} tok/s"),
        _ => progress["state"].as_str().unwrap_or("").to_string(),
    }
}

pub fn watch(client: &Client, id: i64, echo: Echo) -> anyhow::Result<Value> {
    let out = |text: &str| {
        if echo == Echo::Text {
            print!("{text}");
            let _ = std::io::stdout().flush();
        }
    };
    let job: Value = client.get(&format!("/api/jobs/{id}"))?;
    let max = job["request"]["settings"]["max_tokens"]
        .as_u64()
        .unwrap_or(0);
    let bar = ProgressBar::new(max).with_style(
        ProgressStyle::with_template("{spinner} {msg} {bar:30} {pos}/{len} tokens")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut shown = job["output"].as_str().unwrap_or("").to_string();
    bar.suspend(|| out(&shown));
    bar.set_position(job["tokens"].as_u64().unwrap_or(0));
    bar.set_message(match job.get("live").filter(|l| !l.is_null()) {
        Some(live) => progress_message(live),
        None => waiting_message(&job),
    });
    let ended = ["done", "failed", "cancelled"].contains(&job["state"].as_str().unwrap_or(""));
    if !ended {
        client.events(|name, data| {
            if name != "job" || data["id"].as_i64() != Some(id) {
                return true;
            }
            let Some(offset) = data["offset"].as_u64().map(|o| o as usize) else {
                // Only the job's place in the queue.
                bar.set_message(waiting_message(data));
                return true;
            };
            let delta = data["delta"].as_str().unwrap_or("");
            if offset == shown.len() && !delta.is_empty() {
                shown.push_str(delta);
                bar.suspend(|| out(delta));
            } else if offset > shown.len() {
                // Missed text: take it from the job.
                if let Ok(j) = client.get::<Value>(&format!("/api/jobs/{id}")) {
                    let text = j["output"].as_str().unwrap_or("");
                    if text.len() > shown.len() && text.starts_with(shown.as_str()) {
                        let fresh = text[shown.len()..].to_string();
                        bar.suspend(|| out(&fresh));
                        shown.push_str(&fresh);
                    }
                }
            }
            bar.set_position(data["tokens"].as_u64().unwrap_or(0));
            bar.set_message(progress_message(data));
            let state = data["state"].as_str().unwrap_or("");
            !["done", "failed", "cancelled", "paused"].contains(&state)
        })?;
    }
    bar.finish_and_clear();
    // The committed output is the truth; print what the events did not carry.
    let job: Value = client.get(&format!("/api/jobs/{id}"))?;
    let text = job["output"].as_str().unwrap_or("");
    if text.len() > shown.len() && text.starts_with(shown.as_str()) {
        out(&text[shown.len()..]);
    }
    if echo == Echo::Text {
        println!();
    }
    let state = job["state"].as_str().unwrap_or("?");
    let stats = &job["stats"];
    eprintln!(
        "job {id} {state}{}: {} tokens, {:.2} tok/s, {:.0} s",
        job["finish_reason"]
            .as_str()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
        job["tokens"],
        stats["tokens_per_second"].as_f64().unwrap_or(0.0),
        stats["wall_seconds"].as_f64().unwrap_or(0.0),
    );
    match state {
        "failed" => bail!(
            "job {id} failed: {}",
            job["error"].as_str().unwrap_or("unknown error")
        ),
        "paused" => bail!(
            "job {id} paused: {}",
            job["pause_reason"].as_str().unwrap_or("")
        ),
        _ => {}
    }
    Ok(job)
}

fn short_duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_that_is_not_writing_says_what_it_waits_for() {
        let at = |state: &str, pos: Option<u64>| {
            waiting_message(&json!({ "state": state, "queue_position": pos }))
        };
        assert_eq!(
            at("queued", Some(3)),
            "waiting in line: number 3 in the queue"
        );
        assert_eq!(at("queued", None), "waiting in line");
        assert!(at("interrupted", None).contains("continues"));
        let paused = json!({ "state": "paused", "pause_reason": "drive missing" });
        assert_eq!(waiting_message(&paused), "paused: drive missing");
    }
}
