//! What the service knows of a registered model before it runs it: the
//! tokenizer with its chat template, the tool-call format they show, the
//! context the model states, how it asks to be sampled and, for a pack,
//! what the pack holds. Every request needs some of these, and each is file
//! work: a tokenizer parsed (a 150k-token vocabulary is a `tokenizer.json`
//! of 7–11 MB), a GGUF header walked, a manifest read (a 1 GiB manifest
//! once took 3.3 s on every model listing). So they are read once per
//! model and kept until a file in its folder changes.
//!
//! A model's folder is stamped by the name, size and modification time of
//! each file in it (links followed, as a Hugging Face snapshot links its
//! blobs): rewriting a template, replacing a tokenizer or repacking the
//! model makes the next request read them again.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use longhaul_engine::tools::{
    Manifest, PackDetails, SamplingDefaults, describe_pack, is_pack, sampling_defaults,
};
use longhaul_engine::{TextTokenizer, ToolFormat};
use serde::Serialize;

use crate::queue::{ModelEntry, ModelKind};

/// How a pack stores its weights: the experts' dtype, the resident
/// quantization asked for, and whether anything was quantised on request
/// (so a lossy pack is never mistaken for the published weights).
#[derive(Debug, Clone, PartialEq, Serialize, ts_rs::TS)]
pub struct PackWeights {
    pub experts: String,
    pub resident: String,
    pub lossy: bool,
}

/// What one model's files say, as read at one stamp (its tokenizer apart:
/// see [`FactsCache::known`]).
#[derive(Default)]
pub struct ModelFacts {
    /// The context length the model states.
    pub context: Option<usize>,
    /// How the checkpoint asks to be sampled (`generation_config.json`).
    pub sampling: Option<SamplingDefaults>,
    /// What a pack holds and how it stores its weights.
    pub pack: Option<(PackDetails, PackWeights)>,
}

impl ModelFacts {
    /// Reads what `path` holds.
    fn read(path: &Path) -> Self {
        Self {
            context: longhaul_engine::tools::context_length(path),
            sampling: sampling_defaults(path).ok().flatten(),
            pack: pack_facts(path),
        }
    }
}

/// A model's own tokenizer and template, and the tool-call format they show.
pub struct Tokenized {
    pub tokenizer: TextTokenizer,
    pub tool_format: Option<ToolFormat>,
}

/// A model's facts, with its tokenizer when it was asked for and has one
/// (a remote model, a GGUF file, whose tokenizer is rebuilt when it loads,
/// or a folder whose tokenizer cannot be read has none).
pub struct Known {
    pub facts: Arc<ModelFacts>,
    pub tokenized: Option<Arc<Tokenized>>,
}

impl Known {
    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.tokenized.as_deref().map(|t| &t.tokenizer)
    }

    pub fn tool_format(&self) -> Option<ToolFormat> {
        self.tokenized.as_deref().and_then(|t| t.tool_format)
    }
}

fn pack_facts(path: &Path) -> Option<(PackDetails, PackWeights)> {
    if !is_pack(path) {
        return None;
    }
    let manifest = Manifest::read(path).ok()?;
    let details = describe_pack(path, &manifest)?;
    let experts = &manifest.experts;
    let resident = manifest.resident.quantization.as_ref();
    let weights = PackWeights {
        experts: experts.dtype.clone(),
        resident: resident
            .and_then(|q| q.requested.clone())
            .unwrap_or_else(|| "as stored".into()),
        lossy: experts.quantization.is_some() || resident.is_some(),
    };
    Some((details, weights))
}

/// When a model's facts were read: each file of its folder (or the file
/// itself) by name, size and modification time.
type Stamp = Vec<(std::ffi::OsString, u64, Option<SystemTime>)>;

fn stamp(path: &Path) -> Stamp {
    let of = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let mut stamp: Stamp = match std::fs::read_dir(path) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| {
                let (len, at) = of(&e.path())?;
                Some((e.file_name(), len, at))
            })
            .collect(),
        Err(_) => of(path)
            .map(|(len, at)| (path.as_os_str().to_owned(), len, at))
            .into_iter()
            .collect(),
    };
    stamp.sort();
    stamp
}

/// Tokenizers kept parsed: a 150k-token vocabulary takes tens of MB, and
/// requests go to one or two models at a time.
const TOKENIZERS_KEPT: usize = 2;

/// Every local model's facts, each kept until its folder's stamp changes,
/// and the tokenizers last asked for.
#[derive(Default)]
pub struct FactsCache {
    facts: Mutex<HashMap<PathBuf, (Stamp, Arc<ModelFacts>)>>,
    /// Newest last, at most [`TOKENIZERS_KEPT`].
    tokenizers: Mutex<VecDeque<(PathBuf, Stamp, Arc<Tokenized>)>>,
}

impl FactsCache {
    /// `model`'s facts, read again only when its files changed. Blocking:
    /// call it off the async threads.
    pub fn of(&self, model: &ModelEntry) -> Arc<ModelFacts> {
        self.known(model, false).facts
    }

    /// `model`'s facts and, with `tokenizer`, its tokenizer, each read
    /// again only when its files changed. Blocking.
    pub fn known(&self, model: &ModelEntry, tokenizer: bool) -> Known {
        let ModelKind::Local { path } = &model.kind else {
            return Known {
                facts: Arc::default(),
                tokenized: None,
            };
        };
        let now = stamp(path);
        let facts = self.facts_at(path, &now);
        let tokenized = tokenizer.then(|| self.tokenized_at(path, now)).flatten();
        Known { facts, tokenized }
    }

    fn facts_at(&self, path: &Path, now: &Stamp) -> Arc<ModelFacts> {
        if let Ok(cached) = self.facts.lock()
            && let Some((at, facts)) = cached.get(path)
            && at == now
        {
            return Arc::clone(facts);
        }
        // Read outside the lock: another model's request need not wait.
        let facts = Arc::new(ModelFacts::read(path));
        if let Ok(mut cached) = self.facts.lock() {
            cached.insert(path.to_path_buf(), (now.clone(), Arc::clone(&facts)));
        }
        facts
    }

    fn tokenized_at(&self, path: &Path, now: Stamp) -> Option<Arc<Tokenized>> {
        if let Ok(mut kept) = self.tokenizers.lock()
            && let Some(i) = kept.iter().position(|(p, at, _)| p == path && *at == now)
        {
            let entry = kept.remove(i)?;
            let tokenized = Arc::clone(&entry.2);
            kept.push_back(entry);
            return Some(tokenized);
        }
        let tokenizer = TextTokenizer::from_dir(path).ok()?;
        let tokenized = Arc::new(Tokenized {
            tool_format: ToolFormat::detect(&tokenizer),
            tokenizer,
        });
        if let Ok(mut kept) = self.tokenizers.lock() {
            kept.retain(|(p, _, _)| p != path);
            kept.push_back((path.to_path_buf(), now, Arc::clone(&tokenized)));
            while kept.len() > TOKENIZERS_KEPT {
                kept.pop_front();
            }
        }
        Some(tokenized)
    }

    /// Forgets what was read of the model at `path` (it was removed).
    pub fn forget(&self, path: &Path) {
        if let Ok(mut cached) = self.facts.lock() {
            cached.remove(path);
        }
        if let Ok(mut kept) = self.tokenizers.lock() {
            kept.retain(|(p, _, _)| p != path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(path: &Path) -> ModelEntry {
        ModelEntry {
            name: "m".into(),
            kind: ModelKind::Local {
                path: path.to_path_buf(),
            },
            created_ms: 0,
        }
    }

    #[test]
    fn facts_are_kept_until_a_file_of_the_model_changes() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("cannot make a temporary folder");
        };
        let generation = dir.path().join("generation_config.json");
        let write = |text: &str| std::fs::write(&generation, text).map_err(|e| e.to_string());
        assert_eq!(write(r#"{"do_sample": true, "temperature": 0.5}"#), Ok(()));
        let cache = FactsCache::default();
        let model = local(dir.path());
        let first = cache.of(&model);
        assert_eq!(first.sampling.map(|s| s.temperature), Some(0.5));
        assert!(
            Arc::ptr_eq(&first, &cache.of(&model)),
            "read again unchanged"
        );
        // A longer file: its size changes whatever the clock's grain.
        assert_eq!(write(r#"{"do_sample": true, "temperature": 0.25}"#), Ok(()));
        let second = cache.of(&model);
        assert_eq!(second.sampling.map(|s| s.temperature), Some(0.25));
        // A file added beside the others is a change too.
        assert!(std::fs::write(dir.path().join("chat_template.jinja"), "{{ x }}").is_ok());
        assert!(!Arc::ptr_eq(&second, &cache.of(&model)));
    }
}
