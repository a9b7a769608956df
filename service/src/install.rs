//! Where an installed Longhaul finds its own files: the web UI and the demo
//! model. They are looked for relative to the running binary, never at a
//! path fixed when it was built — a moved or deleted source checkout once
//! broke `longhaul demo` and the desktop app's first run.
//!
//! Roots, nearest first: the binary's folder; `../lib/longhaul` (a Unix
//! prefix, as `scripts/install.sh` lays it out — not `share/longhaul`, which
//! under `~/.local` is the default data dir); `../Resources` (a macOS app
//! bundle, whose binaries sit in `Contents/MacOS`). A binary that runs from
//! Cargo's build folder (the tests', `cargo run`'s) also looks in the source
//! tree it was built from; an installed one never does.

use std::path::{Path, PathBuf};

/// The demo model under a root.
pub const DEMO_MODEL: &str = "assets/longhaul-demo-moe";
/// The built web UI under a root (`ui/dist` in the source tree).
pub const WEB_UI: &str = "ui";
const WEB_UI_IN_SOURCE: &str = "ui/dist";

/// Folders that may hold Longhaul's files, nearest to the binary first.
pub fn roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        roots.push(dir.join("../lib/longhaul"));
        roots.push(dir.join("../Resources"));
        if in_build_folder(&dir) {
            roots.push(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")));
        }
        roots.insert(0, dir);
    }
    roots
}

/// Whether `dir` is a profile folder of Cargo's build folder
/// (`target/PROFILE`), where Cargo keeps its `.fingerprint` records.
fn in_build_folder(dir: &Path) -> bool {
    dir.join(".fingerprint").is_dir()
}

/// The first `relative` folder under a root that holds `marker`, or every
/// folder looked at.
fn find(relative: &[&str], marker: &str) -> Result<PathBuf, Vec<PathBuf>> {
    let candidates: Vec<PathBuf> = roots()
        .iter()
        .flat_map(|root| relative.iter().map(move |r| root.join(r)))
        .collect();
    candidates
        .iter()
        .find(|c| c.join(marker).is_file())
        .map(|c| std::fs::canonicalize(c).unwrap_or_else(|_| c.clone()))
        .ok_or(candidates)
}

/// The demo checkpoint, or the folders where it was looked for.
pub fn demo_model() -> Result<PathBuf, Vec<PathBuf>> {
    find(&[DEMO_MODEL], "config.json")
}

/// The built web UI, if one is installed.
pub fn web_ui() -> Option<PathBuf> {
    find(&[WEB_UI, WEB_UI_IN_SOURCE], "index.html").ok()
}
