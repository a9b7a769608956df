//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

pub mod mutate;

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Largest allowed |Δlogit| against transformers, in f32.
pub const LOGIT_TOLERANCE: f32 = 1e-4;

/// What `tools/reference/make_fixtures.py` recorded from transformers.
#[derive(Debug, Deserialize)]
pub struct Expected {
    pub ids: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_tokens: Vec<u32>,
    pub greedy_text: String,
}

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every fixture folder, sorted by name.
pub fn fixtures() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures folder")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 7,
        "expected the committed fixtures, found {dirs:?}"
    );
    dirs
}

/// What a fixture's own `fixture.json` says of it, for the tests to find
/// it by: its family, the largest |Δlogit| allowed against its reference,
/// the checks beyond every fixture's that run it, the width of its experts
/// where they are packed as published, and what in the release it covers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Facts {
    pub family: String,
    pub tolerance: f32,
    #[serde(default)]
    pub checks: Vec<String>,
    pub experts: Option<PublishedExperts>,
    #[serde(default)]
    pub covers: Vec<String>,
}

/// Experts packed at their published width: the pack's dtype name and the
/// bytes of one record (weights and scales).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedExperts {
    pub dtype: String,
    pub record_bytes: u64,
}

pub fn facts(dir: &Path) -> Facts {
    let path = dir.join("fixture.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fixtures whose facts name `check`, sorted by name.
pub fn fixtures_with(check: &str) -> Vec<PathBuf> {
    fixtures()
        .into_iter()
        .filter(|dir| facts(dir).checks.iter().any(|c| c == check))
        .collect()
}

pub fn expected(dir: &Path) -> Expected {
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("expected.json parses")
}

pub fn name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

/// Max |a − b| over two equally shaped matrices.
pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "row count");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "row width");
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

/// Packs checkpoint `dir` over two drive folders made under `tmp`; returns
/// the pack's folder.
pub fn pack_on_two_drives(dir: &Path, tmp: &Path) -> PathBuf {
    use longhaul_engine::pack::{PackOptions, write_pack};
    let drives: Vec<PathBuf> = (0..2).map(|i| tmp.join(format!("d{i}"))).collect();
    for d in &drives {
        std::fs::create_dir_all(d).expect("drive folder");
    }
    let pack = tmp.join("pack");
    write_pack(
        &PackOptions::new(dir.to_path_buf(), pack.clone(), drives),
        &|_| {},
    )
    .expect("pack the fixture");
    pack
}

/// Greedy decoding of at most `max_tokens`, ending at `eos_token_ids`: no
/// stop strings, no guessing ahead, the answer laid out plainly.
pub fn greedy_settings(
    max_tokens: usize,
    eos_token_ids: Vec<u32>,
) -> longhaul_engine::GenerationSettings {
    longhaul_engine::GenerationSettings {
        max_tokens,
        sampling: longhaul_engine::SamplingParams::default(),
        stop_strings: Vec::new(),
        eos_token_ids,
        speculation: longhaul_engine::generate::Speculation::Off,
        output: Default::default(),
        keep_special_tokens: false,
        answer_starts: Vec::new(),
    }
}
