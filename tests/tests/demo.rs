//! `longhaul demo` end to end: the trained model in `assets/` packed over
//! four drive folders, a task through the queue with experts streaming under
//! a small RAM budget, the job's statistics, a second run that reuses the
//! pack, and the demo against a service that is already running.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::Service;

const DEMO_MAX_TOKENS: &str = "120";

fn demo(data: &Path, extra: &[&str]) -> Output {
    Command::new(support::longhaul())
        .arg("demo")
        .arg("--data-dir")
        .arg(data)
        .args(["--max-tokens", DEMO_MAX_TOKENS])
        .args(extra)
        .output()
        .unwrap()
}

fn checked(o: Output) -> Output {
    assert!(
        o.status.success(),
        "longhaul failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "demo --json printed no JSON object ({e}):\n{}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

/// English prose rather than tokens strung together: enough words, and the
/// short words every English paragraph is full of.
fn assert_reads_as_language(text: &str) {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect();
    assert!(words.len() >= 20, "too few words: {text:?}");
    let common = [
        "the", "a", "an", "to", "of", "is", "and", "in", "it", "that", "for", "be", "are", "can",
        "with", "this", "as", "or", "by", "you", "not", "on",
    ];
    let share = words
        .iter()
        .filter(|w| common.contains(&w.as_str()))
        .count() as f64
        / words.len() as f64;
    // English prose runs at about 0.3; random tokens near 0.
    assert!(
        share >= 0.12,
        "only {share:.2} of the words are common English words: {text:?}"
    );
}

fn mtime(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

#[test]
fn demo_streams_the_trained_model_and_reuses_its_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");

    let first = report(&checked(demo(&data, &["--json"])));
    println!("first run: {first:#}");
    assert_eq!(first["state"], "done");
    assert_eq!(first["pack_reused"], false);
    let text = first["text"].as_str().unwrap();
    assert_reads_as_language(text);
    let tokens = first["tokens"].as_u64().unwrap();
    assert!(tokens >= 20, "{tokens} tokens");

    // Experts really stream: the budget holds a fraction of them, and more
    // bytes are read than it could ever hold.
    let budget = first["budget_bytes"].as_u64().unwrap();
    let experts = first["expert_bytes"].as_u64().unwrap();
    assert_eq!(budget, 8 << 20, "the demo's default budget");
    assert!(budget < experts, "budget {budget} vs experts {experts}");
    let read = first["expert_bytes_read"].as_u64().unwrap();
    assert!(
        read > budget,
        "read {read} bytes with a {budget}-byte budget"
    );
    let drives = first["drives"].as_array().unwrap();
    assert_eq!(drives.len(), 4, "four drive folders");
    let mut per_drive = 0;
    for d in drives {
        let path = PathBuf::from(d["path"].as_str().unwrap());
        assert!(
            path.starts_with(&data),
            "{} under the data dir",
            path.display()
        );
        let bytes = d["bytes_read"].as_u64().unwrap();
        assert!(bytes > 0, "nothing read from {}", path.display());
        per_drive += bytes;
    }
    assert_eq!(per_drive, read, "per-drive bytes add up to the total");
    let hit = first["cache_hit_rate"].as_f64().unwrap();
    assert!(hit > 0.0 && hit < 1.0, "hit rate {hit}");
    // The cache holds experts as f32, twice their BF16 size in the pack. A
    // real model's routing is skewed, so LFU hits far more often than the
    // share of experts it holds (about 0.15 here).
    let held = budget as f64 / (2.0 * experts as f64);
    assert!(
        hit > 2.0 * held,
        "hit rate {hit} with {held:.2} of the experts held"
    );
    assert!(first["tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(first["time_to_first_token_s"].as_f64().unwrap() > 0.0);

    // The second run reuses the pack (not one file rewritten) and, with the
    // same seed, writes the same answer; its report is for people.
    let pack = PathBuf::from(first["pack"].as_str().unwrap());
    let manifest = pack.join("longhaul-pack.json");
    let written = mtime(&manifest);
    let second = checked(demo(&data, &[]));
    let out = String::from_utf8_lossy(&second.stdout);
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("pack: reusing"), "{err}");
    assert_eq!(mtime(&manifest), written, "the pack was not rewritten");
    assert!(out.contains(text), "same seed, same answer:\n{out}");
    for needle in ["tok/s", "hit rate", "of experts", "drive-1", "drive-4"] {
        assert!(out.contains(needle), "`{needle}` missing from:\n{out}");
    }
}

#[test]
fn demo_uses_the_service_already_running() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let service = Service::start_with(&data, &["--budget", "2M"]);
    let r = report(&checked(demo(&data, &["--json"])));
    assert_eq!(r["budget_bytes"], 2 << 20, "the running service's budget");
    let job = service.get(&format!("/api/jobs/{}", r["job"]));
    assert_eq!(job["state"], "done");
    assert_eq!(job["model"], "longhaul-demo");
    assert_eq!(job["output"], r["text"]);
    assert_reads_as_language(r["text"].as_str().unwrap());

    // The trained router is skewed, as real models are, but not collapsed:
    // in every layer the hottest quarter of the experts takes well over a
    // quarter of the selections, and most experts are used at all. (A
    // random-weight model of this shape sends almost everything to a few
    // experts in its deeper layers.)
    let heat = service.get("/api/heat/longhaul-demo");
    let experts = heat["experts"].as_u64().unwrap() as usize;
    assert_eq!(experts, 32);
    let rows = heat["heat"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "a row per layer");
    for (layer, row) in rows.iter().enumerate() {
        let mut v: Vec<f64> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        v.sort_by(|a, b| b.total_cmp(a));
        let total: f64 = v.iter().sum();
        let top = v[..experts / 4].iter().sum::<f64>() / total;
        let used = v.iter().filter(|&&x| x > 0.0).count();
        println!("layer {layer}: hottest quarter {top:.2}, {used} experts used");
        assert!(
            (0.3..0.9).contains(&top),
            "layer {layer}: the hottest quarter takes {top:.2}"
        );
        assert!(
            used >= experts * 2 / 3,
            "layer {layer}: {used} experts used"
        );
    }
}

fn assets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets")
}

/// The shipped model has learnt its language, and a pack of it computes
/// exactly what the checkpoint computes.
#[test]
fn the_demo_model_predicts_held_out_text_and_packs_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let model = assets().join("longhaul-demo-moe");
    let pack = tmp.path().join("pack");
    for d in ["d1", "d2"] {
        std::fs::create_dir(tmp.path().join(d)).unwrap();
    }
    let drives = format!(
        "{},{}",
        tmp.path().join("d1").display(),
        tmp.path().join("d2").display()
    );
    let o = Command::new(support::longhaul())
        .args(["pack", model.to_str().unwrap(), "--out"])
        .arg(&pack)
        .args(["--drives", &drives])
        .output()
        .unwrap();
    checked(o);
    let o = Command::new(support::longhaul())
        .args(["compare", "--reference", model.to_str().unwrap(), "--model"])
        .arg(&pack)
        .args(["--budget", "1M", "--json", "--text"])
        .arg(model.join("validation-sample.txt"))
        .output()
        .unwrap();
    let r = report(&checked(o));
    println!("{r}");
    assert_eq!(r["mean_kl"], 0.0, "a pack changes nothing");
    assert_eq!(r["top1_agreement"], 1.0);
    let perplexity = r["reference_perplexity"].as_f64().unwrap();
    // Guessing uniformly over the 4096-token vocabulary scores 4096, as does
    // the untrained model near enough; the trained one scores about 41 here.
    assert!(
        perplexity < 100.0,
        "perplexity {perplexity} on held-out text"
    );
}

/// A copy of the binary installed under `prefix` as `scripts/install.sh`
/// lays it out, with `files` (relative path, contents) in `lib/longhaul`.
fn install_under(prefix: &Path, files: &[(&str, &str)]) -> PathBuf {
    let bin = prefix.join("bin/longhaul");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(support::longhaul(), &bin).unwrap();
    for (path, text) in files {
        let path = prefix.join("lib/longhaul").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    bin
}

#[test]
fn an_installed_binary_finds_its_demo_model_and_web_ui_beside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("prefix");
    // Recognisable stand-ins: a demo model whose config is not JSON, a UI page with a marker.
    let bin = install_under(
        &prefix,
        &[
            ("assets/longhaul-demo-moe/config.json", "not json"),
            (
                "ui/index.html",
                "<!doctype html><title>installed-ui-marker</title>",
            ),
        ],
    );
    let out = Command::new(&bin)
        .args(["demo", "--data-dir"])
        .arg(tmp.path().join("data"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let installed =
        std::fs::canonicalize(prefix.join("lib/longhaul/assets/longhaul-demo-moe")).unwrap();
    assert!(
        err.contains(&format!("{}/config.json is not JSON", installed.display())),
        "the demo read the installed model, not the source tree's: {err}"
    );

    let s = Service::start_with_binary(&bin, &tmp.path().join("served"));
    let page = s.call_text("GET", "/", None, false).1;
    assert!(page.contains("installed-ui-marker"), "{page}");
}
