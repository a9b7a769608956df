//! Published weight formats through the service: FP8, INT4 and MXFP4
//! checkpoints packed over several drives, queued as jobs, answered as
//! transformers answers them.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use support::{Service, expected, fixture, pack_over_three_drives};

const WAIT: Duration = Duration::from_secs(60);

/// Packs fixture `name` over three drive folders under `root`.
fn pack(name: &str, root: &Path) -> std::path::PathBuf {
    pack_with(name, root, &[])
}

/// [`pack`] with extra `longhaul pack` arguments.
fn pack_with(name: &str, root: &Path, extra: &[&str]) -> std::path::PathBuf {
    let out = root.join(format!("{name}-pack{}", extra.join("")));
    let done = pack_over_three_drives(&fixture(name), root, name, &out, extra);
    assert!(done.status.success(), "{name}: pack failed");
    out
}

#[test]
fn published_formats_answer_through_the_queue_as_transformers_does() {
    let dir = tempfile::tempdir().unwrap();
    let s = Service::start(&dir.path().join("data"));
    let names = ["deepseek_v3_fp8", "kimi_k2_int4", "gpt_oss_mxfp4"];
    for name in names {
        s.add_model(name, &pack(name, dir.path()));
    }
    s.add_model(
        "spine",
        &pack_with("qwen3_moe_recent", dir.path(), &["--resident", "q8_0"]),
    );
    let (_, models) = s.call("GET", "/api/models", None);
    let listed = |name: &str| {
        models["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .cloned()
            .unwrap()
    };
    // Published formats are the weights as released; a spine is labelled lossy.
    assert_eq!(listed("gpt_oss_mxfp4")["weights"]["experts"], "MXFP4");
    assert_eq!(listed("kimi_k2_int4")["weights"]["lossy"], false);
    let spine = listed("spine");
    assert_eq!(spine["weights"]["lossy"], true, "{spine}");
    assert_eq!(spine["weights"]["resident"], "Q8_0", "{spine}");
    for name in names {
        let exp = expected(name);
        let job = s.post(
            "/api/jobs",
            json!({ "model": name, "prompt": exp["prompt"], "max_tokens": 32 }),
        );
        let done = s.wait_final(job["id"].as_i64().unwrap(), WAIT);
        assert_eq!(done["state"], "done", "{name}: {done}");
        assert_eq!(done["output"], exp["greedy_text"], "{name}");
    }
}
