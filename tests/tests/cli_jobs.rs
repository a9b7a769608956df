//! `longhaul models` and `longhaul jobs` against a running service, reading
//! its token and address from the data dir.

mod support;

use std::process::{Command, Output};

use serde_json::Value;
use support::{Service, expected, fixture};

fn longhaul(data: &std::path::Path, args: &[&str]) -> Output {
    Command::new(support::longhaul())
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_cli_submits_watches_and_exports_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let _service = Service::start(&data);
    let exp = expected("deepseek_v3_released");
    let model = fixture("deepseek_v3_released");

    let o = longhaul(&data, &["models", "add", "tiny", model.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    let o = longhaul(&data, &["models", "list", "--json"]);
    let models: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(models["models"][0]["name"], "tiny");

    let o = longhaul(
        &data,
        &[
            "jobs",
            "submit",
            "--model",
            "tiny",
            "--max-tokens",
            "32",
            "--title",
            "cli task",
            "--watch",
            exp["prompt"].as_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(
        text(&o),
        format!("{}\n", exp["greedy_text"].as_str().unwrap()),
        "watch prints the answer"
    );
    assert!(err(&o).contains("done (length)"), "{}", err(&o));
    assert!(
        err(&o).contains(&format!(
            "prompt: {} tokens",
            exp["prompt_ids"].as_array().unwrap().len()
        )),
        "{}",
        err(&o)
    );

    let o = longhaul(&data, &["jobs", "list"]);
    assert!(
        text(&o).contains("cli task") && text(&o).contains("done"),
        "{}",
        text(&o)
    );
    let o = longhaul(&data, &["jobs", "show", "1", "--json"]);
    let job: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(job["output"], exp["greedy_text"]);
    let out = tmp.path().join("job.md");
    let o = longhaul(
        &data,
        &["jobs", "export", "1", "--out", out.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", err(&o));
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.starts_with("# cli task") && md.contains("## Result"));
    support::assert_private(&out);

    // Errors from the service come back as clear messages.
    let o = longhaul(&data, &["jobs", "submit", "--model", "nope", "hi"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("no model named `nope`"), "{}", err(&o));
    let o = longhaul(&data, &["jobs", "resume", "1"]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("job 1 is done; it cannot resume"),
        "{}",
        err(&o)
    );
}

#[test]
fn without_a_service_the_cli_says_how_to_start_one() {
    let tmp = tempfile::tempdir().unwrap();
    let o = longhaul(tmp.path(), &["jobs", "list"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("longhaul serve"), "{}", err(&o));
}

#[test]
fn serving_beyond_this_machine_needs_the_explicit_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let o = longhaul(tmp.path(), &["serve", "--host", "0.0.0.0", "--port", "0"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("add --allow-remote"), "{}", err(&o));
}
