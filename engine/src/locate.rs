//! Finding a model where users keep it: a folder, a GGUF file or a pack as
//! given; a Hugging Face cache repo folder (`models--ORG--NAME`, whose
//! `refs/main` names the snapshot whose files link into `blobs/`) or an
//! `ORG/NAME` looked up in the cache (`HF_HUB_CACHE`, `HF_HOME/hub`, …); an
//! LM Studio repo folder or `PUBLISHER/REPO` (`~/.lmstudio/models`); an
//! Ollama model `NAME[:TAG]` (`OLLAMA_MODELS` or `~/.ollama/models`, whose
//! manifest names the GGUF blob). Before this, a Hugging Face repo folder
//! was refused with "no config.json" though the model was right there.
//! A name that is found nowhere is refused with every place looked at.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The cache folder of a Hugging Face model repo.
const HF_REPO_PREFIX: &str = "models--";
const HF_MAIN: &str = "main";
/// Ollama's defaults for a name without them.
const OLLAMA_REGISTRY: &str = "registry.ollama.ai";
const OLLAMA_NAMESPACE: &str = "library";
const OLLAMA_TAG: &str = "latest";
/// The manifest layer that is the model's GGUF file.
const OLLAMA_MODEL_LAYER: &str = "application/vnd.ollama.image.model";
/// Largest manifest read.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// How deep a repo folder is searched for GGUF files (`REPO/Q4_K_M/…`).
const GGUF_SEARCH_DEPTH: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    #[error("no model `{name}`: looked for {}", looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    NotFound { name: String, looked: Vec<PathBuf> },
    #[error("{}: no such file or folder", path.display())]
    Missing { path: PathBuf },
    #[error("{}: holds more than one model; name one of: {}", dir.display(), choices.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    Ambiguous { dir: PathBuf, choices: Vec<PathBuf> },
    #[error("{}: {reason}", path.display())]
    Incomplete { path: PathBuf, reason: String },
}

/// Where models are looked for by name.
#[derive(Debug, Clone, Default)]
pub struct ModelPlaces {
    /// Hugging Face hub caches, in precedence order.
    pub hf_caches: Vec<PathBuf>,
    /// LM Studio models folders.
    pub lm_studio: Vec<PathBuf>,
    /// Ollama model roots.
    pub ollama: Vec<PathBuf>,
}

impl ModelPlaces {
    /// The places this user's environment names, as each tool finds its own.
    pub fn from_env() -> Self {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let home = env("HOME");
        let cache = env("XDG_CACHE_HOME").or_else(|| home.as_ref().map(|h| h.join(".cache")));
        let hf_home = env("HF_HOME").or_else(|| cache.as_ref().map(|c| c.join("huggingface")));
        let mut hf_caches: Vec<PathBuf> = [
            env("HF_HUB_CACHE"),
            env("HUGGINGFACE_HUB_CACHE"),
            hf_home.map(|h| h.join("hub")),
        ]
        .into_iter()
        .flatten()
        .collect();
        hf_caches.dedup();
        let mut lm_studio = Vec::new();
        if let Some(h) = &home {
            if let Ok(pointer) = std::fs::read_to_string(h.join(".lmstudio-home-pointer")) {
                lm_studio.push(PathBuf::from(pointer.trim()).join("models"));
            }
            lm_studio.push(h.join(".cache/lm-studio/models"));
            lm_studio.push(h.join(".lmstudio/models"));
        }
        let ollama: Vec<PathBuf> = [
            env("OLLAMA_MODELS"),
            home.map(|h| h.join(".ollama/models")),
            Some(PathBuf::from("/usr/share/ollama/.ollama/models")),
        ]
        .into_iter()
        .flatten()
        .collect();
        Self {
            hf_caches,
            lm_studio,
            ollama,
        }
    }
}

/// A model found: the folder or GGUF file to open, and where it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    pub path: PathBuf,
    /// `Hugging Face cache (revision …)`, `LM Studio`, `Ollama`; `None` when
    /// the path was given as it is.
    pub found_in: Option<String>,
}

/// Finds the model `name` names (a path, or a name in one of `places`).
pub fn locate(name: &str, places: &ModelPlaces) -> Result<Located, LocateError> {
    let path = Path::new(name);
    if path.exists() {
        return locate_path(path);
    }
    if looks_like_path(name) {
        return Err(LocateError::Missing {
            path: path.to_path_buf(),
        });
    }
    let mut looked = vec![path.to_path_buf()];
    let (repo, revision) = match name.split_once('@') {
        Some((r, rev)) => (r, Some(rev)),
        None => (name, None),
    };
    if let Some((org, repo_name)) = repo.split_once('/')
        && !org.is_empty()
        && !repo_name.is_empty()
        && !repo_name.contains('/')
    {
        for cache in &places.hf_caches {
            let dir = cache.join(format!("{HF_REPO_PREFIX}{org}--{repo_name}"));
            if dir.is_dir() {
                return hf_repo(&dir, revision);
            }
            looked.push(dir);
        }
        for models in &places.lm_studio {
            let dir = models.join(org).join(repo_name);
            if dir.is_dir() {
                return folder(&dir, Some("LM Studio"));
            }
            looked.push(dir);
        }
    }
    for root in &places.ollama {
        let manifest = ollama_manifest(root, name);
        if manifest.is_file() {
            return ollama_model(root, &manifest);
        }
        looked.push(manifest);
    }
    Err(LocateError::NotFound {
        name: name.to_string(),
        looked,
    })
}

/// Whether `name` can only be meant as a path: absolute, relative to `.`,
/// `..` or `~`, or deeper than a repository name's one slash.
fn looks_like_path(name: &str) -> bool {
    Path::new(name).is_absolute()
        || name.starts_with('.')
        || name.starts_with('~')
        || name.split('@').next().unwrap_or(name).matches('/').count() > 1
        || name.contains(std::path::MAIN_SEPARATOR) && std::path::MAIN_SEPARATOR != '/'
}

/// A path given as it is: a model folder, a GGUF file, a Hugging Face cache
/// repo folder, or a folder of GGUF files.
fn locate_path(path: &Path) -> Result<Located, LocateError> {
    if path.is_file() {
        return Ok(Located {
            path: path.to_path_buf(),
            found_in: None,
        });
    }
    if path.join("snapshots").is_dir() {
        return hf_repo(path, None);
    }
    folder(path, None)
}

/// A model folder as it is, or the one GGUF model it holds.
fn folder(dir: &Path, found_in: Option<&str>) -> Result<Located, LocateError> {
    let found_in = found_in.map(str::to_string);
    if dir.join("config.json").exists() || crate::pack::is_pack(dir) {
        check_links(dir)?;
        return Ok(Located {
            path: dir.to_path_buf(),
            found_in,
        });
    }
    let mut ggufs = Vec::new();
    gguf_files(dir, GGUF_SEARCH_DEPTH, &mut ggufs);
    // Projector files of vision models are not language models.
    ggufs.retain(|p| !file_name(p).starts_with("mmproj"));
    // A split model is named by its first part.
    ggufs.retain(|p| split_part(&file_name(p)).is_none_or(|n| n == 1));
    ggufs.sort();
    match ggufs.as_slice() {
        [one] => Ok(Located {
            path: one.clone(),
            found_in,
        }),
        // Nothing recognisable: let the opener say what is missing.
        [] => Ok(Located {
            path: dir.to_path_buf(),
            found_in,
        }),
        _ => Err(LocateError::Ambiguous {
            dir: dir.to_path_buf(),
            choices: ggufs,
        }),
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The part number of a split GGUF's file name (`…-00002-of-00003.gguf`).
fn split_part(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, _total) = stem.rsplit_once("-of-")?;
    rest.rsplit_once('-')?.1.parse().ok()
}

fn gguf_files(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && depth > 0 {
            gguf_files(&p, depth - 1, out);
        } else if crate::import::is_gguf(&p) {
            out.push(p);
        }
    }
}

/// A Hugging Face cache repo folder: the snapshot `refs/<revision>` names
/// (`main` by default), or a snapshot whose name starts with the revision,
/// or its only snapshot.
fn hf_repo(dir: &Path, revision: Option<&str>) -> Result<Located, LocateError> {
    let snapshots = dir.join("snapshots");
    let wanted = revision.unwrap_or(HF_MAIN);
    let from_ref = std::fs::read_to_string(dir.join("refs").join(wanted))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let mut all: Vec<String> = std::fs::read_dir(&snapshots)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    all.sort();
    let commit = match (from_ref, revision) {
        (Some(c), _) => c,
        (None, Some(r)) => match all.iter().filter(|s| s.starts_with(r)).collect::<Vec<_>>()[..] {
            [one] => one.clone(),
            _ => {
                return Err(LocateError::Incomplete {
                    path: dir.join("refs").join(r),
                    reason: format!(
                        "no ref or single snapshot named `{r}`; snapshots: {}",
                        all.join(", ")
                    ),
                });
            }
        },
        (None, None) => match &all[..] {
            [one] => one.clone(),
            _ => {
                return Err(LocateError::Ambiguous {
                    dir: dir.to_path_buf(),
                    choices: all.iter().map(|s| snapshots.join(s)).collect(),
                });
            }
        },
    };
    let snapshot = snapshots.join(&commit);
    if !snapshot.is_dir() {
        return Err(LocateError::Incomplete {
            path: snapshot,
            reason: format!(
                "`refs/{wanted}` names revision {commit}, which is not in the cache's snapshots"
            ),
        });
    }
    let short: String = commit.chars().take(12).collect();
    folder(
        &snapshot,
        Some(&format!("Hugging Face cache, revision {short}")),
    )
}

/// Files of a model folder that are links to nothing (a cache download
/// that did not finish), named with what they should point at.
fn check_links(dir: &Path) -> Result<(), LocateError> {
    let mut names = vec!["config.json".to_string()];
    let index = dir.join("model.safetensors.index.json");
    if let Ok(text) = std::fs::read_to_string(&index)
        && let Ok(v) = serde_json::from_str::<Value>(&text)
        && let Some(map) = v.get("weight_map").and_then(Value::as_object)
    {
        let mut shards: Vec<String> = map
            .values()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        shards.sort();
        shards.dedup();
        names.extend(shards);
    }
    for name in names {
        let p = dir.join(&name);
        if p.symlink_metadata().is_ok() && !p.exists() {
            let target = std::fs::read_link(&p).unwrap_or_default();
            return Err(LocateError::Incomplete {
                path: p,
                reason: format!(
                    "links to {}, which is not there: the download did not finish",
                    target.display()
                ),
            });
        }
    }
    Ok(())
}

/// `NAME[:TAG]`, `NAMESPACE/NAME[:TAG]` or `HOST/NAMESPACE/NAME[:TAG]`'s manifest.
fn ollama_manifest(root: &Path, name: &str) -> PathBuf {
    let (path, tag) = match name.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') => (p, t),
        _ => (name, OLLAMA_TAG),
    };
    let parts: Vec<&str> = path.split('/').collect();
    let (host, namespace, model) = match parts[..] {
        [m] => (OLLAMA_REGISTRY, OLLAMA_NAMESPACE, m),
        [ns, m] => (OLLAMA_REGISTRY, ns, m),
        [h, ns, m] => (h, ns, m),
        _ => (OLLAMA_REGISTRY, OLLAMA_NAMESPACE, path),
    };
    root.join("manifests")
        .join(host)
        .join(namespace)
        .join(model)
        .join(tag)
}

/// The GGUF blob an Ollama manifest names as its model layer.
fn ollama_model(root: &Path, manifest: &Path) -> Result<Located, LocateError> {
    let bad = |reason: String| LocateError::Incomplete {
        path: manifest.to_path_buf(),
        reason,
    };
    let size = std::fs::metadata(manifest).map(|m| m.len()).unwrap_or(0);
    if size > MAX_MANIFEST_BYTES {
        return Err(bad(format!("{size} bytes is too large for a manifest")));
    }
    let text = std::fs::read_to_string(manifest).map_err(|e| bad(e.to_string()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let digest = v
        .get("layers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|l| l.get("mediaType").and_then(Value::as_str) == Some(OLLAMA_MODEL_LAYER))
        .and_then(|l| l.get("digest"))
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("no `{OLLAMA_MODEL_LAYER}` layer")))?;
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
        .ok_or_else(|| bad(format!("digest `{digest}` is not sha256:<64 hex digits>")))?;
    let blob = root.join("blobs").join(format!("sha256-{hex}"));
    if !blob.is_file() {
        return Err(LocateError::Incomplete {
            path: blob,
            reason: "the model's blob is not there: the pull did not finish".into(),
        });
    }
    Ok(Located {
        path: blob,
        found_in: Some("Ollama".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gguf(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"GGUF\x03\0\0\0").unwrap();
    }

    #[test]
    fn a_hugging_face_cache_repo_resolves_to_its_main_snapshot() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("hub");
        let repo = cache.join("models--moonshotai--Kimi-K2-Instruct");
        let rev = "a".repeat(40);
        let snap = repo.join("snapshots").join(&rev);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), &rev).unwrap();
        std::fs::write(repo.join("blobs/123"), "{}").unwrap();
        std::os::unix::fs::symlink("../../blobs/123", snap.join("config.json")).unwrap();
        std::os::unix::fs::symlink("../../blobs/missing", snap.join("model.safetensors")).unwrap();
        let places = ModelPlaces {
            hf_caches: vec![cache.clone()],
            ..ModelPlaces::default()
        };
        for name in [repo.to_str().unwrap(), "moonshotai/Kimi-K2-Instruct"] {
            let found = locate(name, &places).unwrap();
            assert_eq!(found.path, snap, "{name}");
            assert!(found.found_in.unwrap().contains("aaaaaaaaaaaa"));
        }
        // A shard that links to nothing is named.
        std::fs::write(
            snap.join("model.safetensors.index.json"),
            r#"{"weight_map": {"x": "model.safetensors"}}"#,
        )
        .unwrap();
        let err = locate("moonshotai/Kimi-K2-Instruct", &places)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model.safetensors") && err.contains("did not finish"),
            "{err}"
        );
        let err = locate("moonshotai/Nope", &places).unwrap_err().to_string();
        assert!(err.contains("models--moonshotai--Nope"), "{err}");
    }

    #[test]
    fn lm_studio_and_ollama_models_resolve_to_their_gguf() {
        let tmp = tempfile::tempdir().unwrap();
        let lms = tmp.path().join("lms");
        let repo = lms.join("lmstudio-community/Qwen3-30B-A3B-GGUF");
        gguf(&repo.join("Qwen3-30B-A3B-Q4_K_M-00001-of-00002.gguf"));
        gguf(&repo.join("Qwen3-30B-A3B-Q4_K_M-00002-of-00002.gguf"));
        gguf(&repo.join("mmproj-F16.gguf"));
        let root = tmp.path().join("ollama");
        let hex = "b".repeat(64);
        gguf(&root.join("blobs").join(format!("sha256-{hex}")));
        let manifest = root.join("manifests/registry.ollama.ai/library/qwen3/30b");
        std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
        std::fs::write(
            &manifest,
            format!(
                r#"{{"layers": [{{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:{}"}},
                    {{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:{hex}"}}]}}"#,
                "c".repeat(64)
            ),
        )
        .unwrap();
        let places = ModelPlaces {
            lm_studio: vec![lms.clone()],
            ollama: vec![root.clone()],
            ..ModelPlaces::default()
        };
        let found = locate("lmstudio-community/Qwen3-30B-A3B-GGUF", &places).unwrap();
        assert!(file_name(&found.path).ends_with("-00001-of-00002.gguf"));
        let found = locate("qwen3:30b", &places).unwrap();
        assert_eq!(found.path, root.join("blobs").join(format!("sha256-{hex}")));
        assert!(
            crate::import::is_gguf(&found.path),
            "an extensionless blob is a GGUF"
        );
        gguf(&repo.join("Qwen3-30B-A3B-Q8_0.gguf"));
        let err = locate(repo.to_str().unwrap(), &places)
            .unwrap_err()
            .to_string();
        assert!(err.contains("Q8_0") && err.contains("Q4_K_M"), "{err}");
        let err = locate("qwen3:7b", &places).unwrap_err().to_string();
        assert!(err.contains("library/qwen3/7b"), "{err}");
        // A path is only a path: no store is searched for it.
        let gone = tmp.path().join("gone/model");
        let err = locate(gone.to_str().unwrap(), &places).unwrap_err();
        assert!(
            matches!(err, LocateError::Missing { ref path } if *path == gone),
            "{err}"
        );
        assert!(matches!(
            locate("./gone", &places),
            Err(LocateError::Missing { .. })
        ));
    }
}
