//! The `longhaul` binary end to end: the `logits` JSON contract, greedy `run`
//! against transformers, and clean errors for bad input.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Largest allowed |Δlogit| against transformers, in f32.
const LOGIT_TOLERANCE: f64 = 1e-4;

fn longhaul(args: &[&str]) -> Output {
    Command::new(support::longhaul())
        .args(args)
        .output()
        .expect("run longhaul")
}

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 7);
    dirs
}

fn expected(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap()
}

/// `longhaul pack SRC --out OUT --drives D1,D2,… EXTRA…`
fn pack_cli(src: &Path, out: &Path, drives: &[String], extra: &[&str]) -> Output {
    let drives = drives.join(",");
    let mut args = vec![
        "pack",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--drives",
        &drives,
    ];
    args.extend_from_slice(extra);
    longhaul(&args)
}

/// `count` empty folders standing in for drives.
fn drive_folders(root: &Path, count: usize) -> Vec<String> {
    std::fs::create_dir_all(root).unwrap();
    (0..count)
        .map(|i| {
            let d = root.join(format!("d{i}"));
            std::fs::create_dir(&d).unwrap();
            d.to_str().unwrap().to_string()
        })
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn logits_json_matches_transformers_for_every_fixture() {
    for dir in fixtures() {
        let exp = expected(&dir);
        let ids: Vec<String> = exp["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.to_string())
            .collect();
        let out = longhaul(&[
            "logits",
            "--model",
            dir.to_str().unwrap(),
            "--ids",
            &ids.join(","),
            "--json",
        ]);
        assert!(out.status.success(), "{}: {}", dir.display(), stderr(&out));
        let got: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
        assert_eq!(got["ids"], exp["ids"]);
        let rows = got["logits"].as_array().unwrap();
        let want = exp["logits"].as_array().unwrap();
        assert_eq!(rows.len(), want.len(), "one row per position");
        let mut worst = 0.0f64;
        for (r, w) in rows.iter().zip(want) {
            let (r, w) = (r.as_array().unwrap(), w.as_array().unwrap());
            assert_eq!(r.len(), w.len(), "full vocabulary per row");
            for (a, b) in r.iter().zip(w) {
                worst = worst.max((a.as_f64().unwrap() - b.as_f64().unwrap()).abs());
            }
        }
        assert!(
            worst <= LOGIT_TOLERANCE,
            "{}: max |Δlogit| {worst:e}",
            dir.display()
        );
    }
}

#[test]
fn greedy_run_prints_transformers_text() {
    for dir in fixtures() {
        let exp = expected(&dir);
        let out = longhaul(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            exp["prompt"].as_str().unwrap(),
            "--max-tokens",
            "32",
        ]);
        assert!(out.status.success(), "{}: {}", dir.display(), stderr(&out));
        let err = stderr(&out);
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text,
            format!("{}\n", exp["greedy_text"].as_str().unwrap()),
            "{}",
            dir.display()
        );
        assert!(
            err.contains("prefill:") && err.contains("tok/s"),
            "speeds on stderr: {err}"
        );
    }
}

#[test]
fn human_readable_logits_show_the_top_tokens() {
    let dir = &fixtures()[0];
    let out = longhaul(&["logits", "--model", dir.to_str().unwrap(), "--ids", "1,2,3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 3);
    assert!(text.starts_with("position 0 (id 1): top "));
}

#[test]
fn corrupt_model_fails_cleanly_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    // A checkpoint in one weights file.
    let src = fixtures()
        .into_iter()
        .find(|d| d.join("model.safetensors").exists())
        .unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
    }
    let weights = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let out = longhaul(&[
        "logits",
        "--model",
        tmp.path().to_str().unwrap(),
        "--ids",
        "1",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("error:") && err.contains("model.safetensors"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout when failing");
}

#[test]
fn bad_arguments_are_explained() {
    let dir = fixtures()[0].to_str().unwrap().to_string();
    let out = longhaul(&["logits", "--model", &dir, "--ids", "1,99999", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("99999 is outside the model's vocabulary of 512"),
        "{}",
        stderr(&out)
    );

    let out = longhaul(&["run", "--model", &dir, "--prompt", "x", "--temperature=-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("temperature"), "{}", stderr(&out));

    let out = longhaul(&["run", "--model", "/nonexistent/model", "--prompt", "x"]);
    assert_eq!(out.status.code(), Some(2), "a --model that names nothing");
    assert!(
        stderr(&out).contains("/nonexistent/model: no such file or folder"),
        "{}",
        stderr(&out)
    );

    let out = longhaul(&["logits", "--model", &dir, "--ids", "1,x"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
}

#[test]
fn pack_verify_and_run_from_a_pack() {
    let dir = fixtures()
        .into_iter()
        .find(|d| d.ends_with("deepseek_v3_released"))
        .unwrap();
    let exp = expected(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let drives = drive_folders(tmp.path(), 3);
    let pack = tmp.path().join("pack");
    let out = pack_cli(&dir, &pack, &drives, &["--split-threshold", "8K", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["records"], 32, "2 MoE layers × 16 experts");
    assert_eq!(summary["drives"].as_array().unwrap().len(), 3);
    // The pack and its folders on the drives are its owner's only.
    support::assert_private(&pack);
    for d in &drives {
        support::assert_private(&Path::new(d).join("pack"));
    }
    // F32 records compress losslessly by default.
    assert_eq!(summary["compression"], "zstd-high-bytes");
    assert!(summary["expert_bytes"].as_u64() < summary["plain_expert_bytes"].as_u64());
    let plain_pack = tmp.path().join("plain-pack");
    let plain_drives = drive_folders(&tmp.path().join("plain"), 2);
    let out = pack_cli(
        &dir,
        &plain_pack,
        &plain_drives,
        &["--compress", "off", "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let plain: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(plain["compression"].is_null());
    assert_eq!(plain["expert_bytes"], plain["plain_expert_bytes"]);

    let out = longhaul(&["pack", "--verify", pack.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["records"], 32);
    assert_eq!(report["problems"].as_array().unwrap().len(), 0);

    let ids: Vec<String> = exp["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    let logits = |model: &Path, budget: &str| {
        let out = longhaul(&[
            "logits",
            "--model",
            model.to_str().unwrap(),
            "--budget",
            budget,
            "--ids",
            &ids.join(","),
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        out.stdout
    };
    let reference = logits(&dir, "0");
    for budget in ["0", "40K", "4G"] {
        assert!(
            logits(&pack, budget) == reference,
            "pack logits differ at budget {budget}"
        );
    }
    assert!(logits(&plain_pack, "40K") == reference, "uncompressed pack");

    let trace = tmp.path().join("run-trace.jsonl");
    let out = longhaul(&[
        "run",
        "--model",
        pack.to_str().unwrap(),
        "--budget",
        "0",
        "--prompt",
        exp["prompt"].as_str().unwrap(),
        "--max-tokens",
        "32",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("cache hits") && err.contains("read from drives"),
        "{err}"
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}\n", exp["greedy_text"].as_str().unwrap())
    );
    // 2 MoE layers: prefill lookups, then one per layer for each of the 31 decode steps.
    let lookups = std::fs::read_to_string(&trace).unwrap().lines().count();
    assert!(lookups >= 2 + 31 * 2, "{lookups} lookups traced");
    support::assert_private(&trace);

    // The run left a heat histogram: copy the hottest half of the experts once more.
    assert!(pack.join("longhaul-heat.json").is_file());
    support::assert_private(&pack.join("longhaul-heat.json"));
    let more = drive_folders(&tmp.path().join("more"), 3);
    let replicated = tmp.path().join("replicated");
    let heat_from = pack.to_str().unwrap();
    let extra = [
        "--replicas",
        "1",
        "--heat-from",
        heat_from,
        "--replica-share",
        "0.5",
    ];
    let out = pack_cli(&dir, &replicated, &more, &extra);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = longhaul(&["pack", "--verify", replicated.to_str().unwrap(), "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let copies = report["records"].as_u64().unwrap();
    assert!(copies > 32 && copies <= 64, "{copies} record copies");
    assert!(
        logits(&replicated, "0") == reference,
        "replicated pack logits differ"
    );
}

/// Checkpoints as published in FP8, INT4 and MXFP4 pack as they are over
/// several drives, verify, and answer from the pack as transformers does.
#[test]
fn published_formats_pack_and_run_through_the_binary() {
    for (name, dtype) in [
        ("deepseek_v3_fp8", "FP8_E4M3_B128"),
        ("kimi_k2_int4", "INT4_G32"),
        ("gpt_oss_mxfp4", "MXFP4"),
    ] {
        let dir = fixtures().into_iter().find(|d| d.ends_with(name)).unwrap();
        let exp = expected(&dir);
        let tmp = tempfile::tempdir().unwrap();
        let drives = drive_folders(tmp.path(), 3);
        let pack = tmp.path().join("pack");
        let out = pack_cli(&dir, &pack, &drives, &["--split-threshold", "2K", "--json"]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["expert_dtype"], dtype, "{name}");
        assert!(
            summary["compression"].is_null(),
            "{name}: stored as published"
        );
        let out = longhaul(&["pack", "--verify", pack.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["problems"].as_array().unwrap().len(), 0, "{name}");
        let out = longhaul(&[
            "run",
            "--model",
            pack.to_str().unwrap(),
            "--budget",
            "0",
            "--prompt",
            exp["prompt"].as_str().unwrap(),
            "--max-tokens",
            "32",
        ]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("{}\n", exp["greedy_text"].as_str().unwrap()),
            "{name}"
        );
    }
}

#[test]
fn pack_errors_are_explained() {
    let dir = fixtures()
        .into_iter()
        .find(|d| d.ends_with("deepseek_v3_released"))
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = pack_cli(
        &dir,
        &tmp.path().join("p"),
        &["/nonexistent/drive".to_string()],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("/nonexistent/drive does not exist"),
        "{}",
        stderr(&out)
    );
    let out = longhaul(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--budget",
        "lots",
        "--prompt",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not a size"), "{}", stderr(&out));
}

/// Fixture `name` packed over two drive folders in a temporary folder.
fn packed_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = fixtures().into_iter().find(|d| d.ends_with(name)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let drives = drive_folders(tmp.path(), 2);
    let pack = tmp.path().join("pack");
    assert!(pack_cli(&dir, &pack, &drives, &[]).status.success());
    (tmp, pack)
}

/// A four-token bench of `pack` as JSON, with `extra` arguments.
fn small_bench(pack: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "bench",
        "--model",
        pack.to_str().unwrap(),
        "--prompt-tokens",
        "4",
        "--gen",
        "4",
        "--probe-bytes",
        "64K",
        "--json",
    ];
    args.extend_from_slice(extra);
    longhaul(&args)
}

/// An untied embedding is read a row per token from the pack instead of
/// held, and the memory plan gives its bytes to the expert budget; a tied
/// one (the LM head needs every row) stays held and counted.
#[test]
fn an_untied_embedding_is_read_from_the_pack_and_its_bytes_go_to_the_budget() {
    for (name, untied) in [("deepseek_v3_released", true), ("qwen3_moe_recent", false)] {
        let (_tmp, pack) = packed_fixture(name);
        let manifest: Value =
            serde_json::from_slice(&std::fs::read(pack.join("longhaul-pack.json")).unwrap())
                .unwrap();
        let resident = &manifest["resident"];
        let file = std::fs::read(resident["path"].as_str().unwrap()).unwrap();
        let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&file[8..8 + header_len]).unwrap();
        let offsets = &header["model.embed_tokens.weight"]["data_offsets"];
        let embed_bytes = offsets[1].as_u64().unwrap() - offsets[0].as_u64().unwrap();
        let out = small_bench(&pack, &["--mem", "512M", "--budget", "auto"]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let b: Value = serde_json::from_slice(&out.stdout).unwrap();
        let plan = &b["memory_plan"];
        let held = resident["size"].as_u64().unwrap() - if untied { embed_bytes } else { 0 };
        assert_eq!(plan["resident_bytes"].as_u64(), Some(held), "{name}");
        assert_eq!(b["budget_bytes"], plan["budget_bytes"], "{name}");
        assert_eq!(b["cache"]["budget_bytes"], plan["budget_bytes"], "{name}");
    }
}

/// `--mem` derives the expert budget from a memory limit, and a limit that
/// cannot hold the model, or a budget that does not fit in it, is refused
/// before anything is loaded, with the numbers.
#[test]
fn a_memory_limit_sets_the_budget_or_is_refused_with_the_numbers() {
    let (_tmp, pack) = packed_fixture("qwen3_moe_recent");
    let bench = |extra: &[&str]| small_bench(&pack, extra);
    let out = bench(&["--mem", "512M", "--budget", "auto"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b: Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = &b["memory_plan"];
    assert_eq!(plan["limit_bytes"], 512u64 << 20);
    assert_eq!(b["budget_bytes"], plan["budget_bytes"]);
    let spent: u64 = [
        "resident_bytes",
        "kv_bytes",
        "window_bytes",
        "runtime_bytes",
        "headroom_bytes",
        "budget_bytes",
    ]
    .iter()
    .map(|k| plan[k].as_u64().unwrap())
    .sum();
    assert_eq!(spent, 512 << 20);
    assert!(stderr(&out).contains("experts up to"), "{}", stderr(&out));

    let out = bench(&["--mem", "64M"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("leaves no room for experts") && err.contains("raise the limit"),
        "{err}"
    );
    let out = bench(&["--mem", "512M", "--budget", "1G"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("does not fit"), "{}", stderr(&out));
    let out = bench(&["--mem", "lots"]);
    assert!(stderr(&out).contains("or `auto`"), "{}", stderr(&out));
}

#[test]
fn synth_pack_and_bench_report_consistent_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("synth");
    let out = longhaul(&[
        "synth",
        "--arch",
        "qwen3_moe",
        "--out",
        model.to_str().unwrap(),
        "--hidden",
        "64",
        "--heads",
        "4",
        "--layers",
        "3",
        "--experts",
        "16",
        "--top-k",
        "4",
        "--moe-intermediate",
        "32",
        "--vocab",
        "300",
        "--popularity",
        "zipf:1",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let synth: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(synth["layers"], 3);
    let drives = drive_folders(tmp.path(), 2);
    let pack = tmp.path().join("pack");
    let out = pack_cli(&model, &pack, &drives, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let trace = tmp.path().join("trace.jsonl");
    let out = longhaul(&[
        "bench",
        "--model",
        pack.to_str().unwrap(),
        "--budget",
        "200K",
        "--prompt-tokens",
        "8",
        "--gen",
        "12",
        "--probe-bytes",
        "1M",
        "--trace",
        trace.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b: Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = |k: &str| b[k].as_f64().unwrap_or_else(|| panic!("{k} in {b}"));
    assert!(f("tok_s") > 0.0 && f("prefill_tok_s") > 0.0);
    for k in [
        "hit_rate",
        "lru_replay_hit_rate",
        "oracle_pin_hit_rate",
        "belady_hit_rate",
    ] {
        assert!((0.0..=1.0).contains(&f(k)), "{k} = {}", f(k));
    }
    assert!(f("belady_hit_rate") + 1e-9 >= f("lru_replay_hit_rate"));
    // Every candidate policy replayed on the run's own lookups, best first,
    // each behind Belady by its regret.
    let replays = &b["policy_replays"];
    let candidates = replays["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 18, "{replays}");
    let rates: Vec<f64> = candidates
        .iter()
        .map(|c| c["hit_rate"].as_f64().unwrap())
        .collect();
    assert!(rates.windows(2).all(|w| w[0] >= w[1]), "{rates:?}");
    let belady = replays["belady_hit_rate"].as_f64().unwrap();
    for c in candidates {
        let regret = c["regret"].as_f64().unwrap();
        assert!((belady - c["hit_rate"].as_f64().unwrap() - regret).abs() < 1e-9);
        assert!(regret >= -1e-9, "{c}");
    }
    assert_eq!(b["policy"], "auto");
    assert!(b["policy_in_use"].is_string());
    assert!(
        f("expert_bytes_per_token") > 0.0,
        "a 200K budget cannot hold 48 experts of 24K"
    );
    assert_eq!(b["routing"]["tokens"], 12);
    assert!(
        b["routing"]["experts_used_per_layer"].as_f64().unwrap() > 4.0,
        "routing varies across tokens"
    );
    assert!(b["cache"]["held_bytes"].as_u64().unwrap() <= 200 * 1024);
    let recall = b["prefetch"]["recall"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&recall), "prefetch recall {recall}");
    assert_eq!(b["drive_busy_share"].as_array().unwrap().len(), 2);
    assert!(b["memory"]["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert!(f("stall_seconds_per_token") >= 0.0 && f("compute_seconds_per_token") > 0.0);
    let lines: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // 3 MoE layers: at least one prefill lookup each, then one per decoded token.
    assert!(lines.len() >= 3 + 12 * 3, "{} lookups", lines.len());
    assert!(
        lines
            .iter()
            .all(|l| l["layer"].is_u64() && l["ids"].is_array() && l["rows"].is_array())
    );
    // The prompt's lookup says how many of its tokens took each expert.
    let prompt_rows: u64 = lines[0]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .sum();
    assert_eq!(prompt_rows, 8 * 4, "8 prompt tokens, 4 experts each");

    let out = longhaul(&[
        "drives",
        "probe",
        "--model",
        pack.to_str().unwrap(),
        "--bytes",
        "1M",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let probe: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(probe["drives"].as_array().unwrap().len(), 2);
    assert!(probe["aggregate_mb_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn quantised_pack_is_labelled_and_compared_with_its_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("synth");
    let out = longhaul(&[
        "synth",
        "--arch",
        "qwen3_moe",
        "--out",
        model.to_str().unwrap(),
        "--hidden",
        "64",
        "--heads",
        "4",
        "--layers",
        "2",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--moe-intermediate",
        "32",
        "--vocab",
        "300",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let drives = drive_folders(tmp.path(), 2);
    let text = "Packs trade a little accuracy for fewer bytes per token.";
    let compare = |pack: &Path| {
        let out = longhaul(&[
            "compare",
            "--reference",
            model.to_str().unwrap(),
            "--model",
            pack.to_str().unwrap(),
            "--prompt",
            text,
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };

    let plain = tmp.path().join("plain");
    assert!(pack_cli(&model, &plain, &drives, &[]).status.success());
    let same = compare(&plain);
    assert_eq!(same["mean_kl"].as_f64(), Some(0.0), "{same}");
    assert_eq!(same["top1_agreement"].as_f64(), Some(1.0), "{same}");

    let q8 = tmp.path().join("q8");
    let out = pack_cli(&model, &q8, &drives, &["--experts", "q8_0", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["expert_dtype"], "Q8_0");
    assert_eq!(summary["quantization"]["from"], "BF16");
    let err = summary["quantization"]["relative_rms_error"]
        .as_f64()
        .unwrap();
    assert!(err > 0.0 && err < 0.02, "{summary}");
    let r = compare(&q8);
    let kl = r["mean_kl"].as_f64().unwrap();
    assert!(kl > 0.0 && kl < 0.01, "{r}");
    assert!(r["positions"].as_u64().unwrap() > 10, "{r}");

    let out = pack_cli(
        &model,
        &tmp.path().join("q5"),
        &drives,
        &["--experts", "q5"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("use q8_0 or q4k"), "{}", stderr(&out));
    let out = pack_cli(
        &model,
        &tmp.path().join("q4k-spine"),
        &drives,
        &["--resident", "q4k"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("q8_0 only"), "{}", stderr(&out));
    // Rows of 64 and 32 are not whole Q4_K blocks: each matrix falls back
    // to Q8_0, and the pack says what was asked for and what was stored.
    let out = pack_cli(
        &model,
        &tmp.path().join("q4k"),
        &drives,
        &["--experts", "q4k", "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["expert_dtype"], "Q8_0", "{summary}");
    assert_eq!(summary["quantization"]["requested"], "Q4K", "{summary}");
    assert!(
        compare(&tmp.path().join("q4k"))["mean_kl"]
            .as_f64()
            .unwrap()
            < 0.01
    );
}

/// A reader that goes away (`longhaul logits … | head -1`) ends the
/// command quietly, as it ends other Unix tools: no panic on stderr.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = fixtures()[0].to_str().unwrap().to_string();
    let ids: Vec<String> = (0..64).map(|i| (i % 300).to_string()).collect();
    let mut child = Command::new(support::longhaul())
        .args(["logits", "--model", &dir, "--ids", &ids.join(","), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{err}");
}

/// `serve` takes no service URL; a remote model's URL is not the service's.
#[test]
fn help_offers_only_the_options_that_mean_something() {
    let help = |args: &[&str]| String::from_utf8(longhaul(args).stdout).unwrap();
    assert!(!help(&["serve", "--help"]).contains("--url"));
    let add = help(&["models", "add", "--help"]);
    assert!(
        add.contains("--remote-url") && add.contains("--data-dir"),
        "{add}"
    );
    let submit = help(&["jobs", "submit", "--help"]);
    assert!(submit.contains("Higher runs sooner"), "{submit}");
}

/// A tokenizer.json whose pattern backtracks without end on the prompt:
/// `run` says so and exits 1, with no panic report (it once exited 101).
#[test]
fn a_tokenizer_pattern_that_gives_up_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let model = support::copy_fixture("deepseek_v3_released", &tmp.path().join("model"));
    support::give_backtracking_pattern(&model);
    let prompt = support::backtracking_prompt();
    let out = longhaul(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        &prompt,
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tokenizer.json") && err.contains("gave up"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A chat template that doubles a string until its fuel runs out stays
/// within a memory limit: the fuel bounds what its strings take (once
/// 3.2 GB, an abort under a 1.5 GB limit); `run` says the template ran out.
#[test]
fn a_template_that_doubles_a_string_stays_within_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let model = support::copy_fixture("deepseek_v3_released", &tmp.path().join("model"));
    std::fs::write(
        model.join("chat_template.jinja"),
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    )
    .unwrap();
    let script = format!(
        "ulimit -v 1500000; exec '{}' run --model '{}' --chat --prompt hi --max-tokens 1",
        support::longhaul().display(),
        model.display()
    );
    let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("ran out of fuel"), "{err}");
}

/// A change made to a manifest.
type Damage = Box<dyn Fn(&mut Value)>;

/// Manifests edited by hand or by damage that once hung or fooled
/// `pack --verify` and the engine: an expert pointed at another's record
/// (its checksum covers bytes, not whose they are), a record with no bytes
/// (a read of nothing never completes), a resident file that is
/// `/dev/zero` or a FIFO (a read that never ends or never begins). Each is
/// refused, in seconds, saying what is wrong.
#[test]
fn damaged_manifests_are_refused_at_once() {
    let dir = fixtures()
        .into_iter()
        .find(|d| d.ends_with("deepseek_v3_released"))
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let drives = drive_folders(tmp.path(), 2);
    let pack = tmp.path().join("pack");
    // Compressed (the default for these F32 records), as `stored_len` needs.
    let out = pack_cli(&dir, &pack, &drives, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let manifest = pack.join("longhaul-pack.json");
    let original: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let fifo = tmp.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let cases: Vec<(Damage, &str)> = vec![
        (
            Box::new(|m| {
                let records = &mut m["experts"]["layers"][0]["records"];
                records[1] = records[0].clone();
            }),
            "share bytes",
        ),
        (
            Box::new(|m| {
                let record = &mut m["experts"]["layers"][0]["records"][1];
                record["stored_len"] = serde_json::json!(0);
                record["segments"] = serde_json::json!([]);
            }),
            "empty record",
        ),
        (
            Box::new(|m| m["resident"]["path"] = serde_json::json!("/dev/zero")),
            "not a regular file",
        ),
        (
            Box::new(move |m| m["resident"]["path"] = serde_json::json!(fifo)),
            "not a regular file",
        ),
    ];
    for (damage, says) in cases {
        let mut m = original.clone();
        damage(&mut m);
        std::fs::write(&manifest, m.to_string()).unwrap();
        let out = longhaul(&["pack", "--verify", pack.to_str().unwrap()]);
        let said = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
        assert!(!out.status.success(), "{says}: {said}");
        assert!(said.contains(says), "{says}: {said}");
    }
}

/// Drive folders on one device are named when packing and probing:
/// striping over them reads no faster than one.
#[test]
fn drive_folders_on_one_device_are_named_when_packing_and_probing() {
    let tmp = tempfile::tempdir().unwrap();
    let source = support::synth_model(tmp.path());
    let pack = tmp.path().join("pack");
    let out = support::pack_over_three_drives(&source, tmp.path(), "same", &pack, &[]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("same-d0")
            && stderr.contains("same-d2")
            && stderr
                .contains("are on one device: striping over them reads no faster than one of them"),
        "{stderr}"
    );
    let probed = std::process::Command::new(support::longhaul())
        .args(["drives", "probe", "--model"])
        .arg(&pack)
        .args(["--bytes", "1M"])
        .output()
        .unwrap();
    assert!(probed.status.success(), "{probed:?}");
    let stdout = String::from_utf8_lossy(&probed.stdout);
    assert!(stdout.contains("are on one device"), "{stdout}");
}
