//! A GGUF model — one file or its `-0000N-of-0000M` parts — seen as the
//! Hugging Face checkpoint it was converted from: `config.json` and
//! `tokenizer.json` rebuilt from the metadata, and every tensor under its
//! Hugging Face name, pointing at the blocks where they lie in the file.
//!
//! Why a view and not a converter: the large MoE GGUFs people own are
//! hundreds of gigabytes of quantised blocks, and each block type decodes
//! exactly (see [`crate::kernels::ggml`]). Read in place, a pack holds the
//! file's own bytes and nothing is written twice; the model code, the pack
//! writer and the tokenizer need no GGUF knowledge beyond this module.

mod config;
mod names;
mod tokenizer;

use std::path::{Path, PathBuf};

use crate::model::config::MAX_CONFIG_SIZE;
use crate::weights::SafetensorsCheckpoint;
use crate::weights::gguf::{GgufError, GgufFile, GgufValue};

pub use names::supported_types;

/// The file name suffix of GGUF files.
const EXTENSION: &str = "gguf";
/// Split files name their part as `-NNNNN-of-MMMMM.gguf`.
const SPLIT_DIGITS: usize = 5;
/// The most parts a split name can number (`-99999-of-99999`).
const MAX_SPLIT_PARTS: u64 = 99_999;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: metadata key `{key}` is missing; {needs}")]
    MissingKey {
        path: PathBuf,
        key: String,
        needs: &'static str,
    },
    #[error("{path}: metadata key `{key}` holds {found}; expected {expected}")]
    BadKey {
        path: PathBuf,
        key: String,
        found: String,
        expected: &'static str,
    },
    #[error(
        "{path}: tensor `{tensor}` is stored as {ty}, which Longhaul does not compute with; supported GGUF types: {}",
        supported_types().join(", ")
    )]
    UnsupportedType {
        path: PathBuf,
        tensor: String,
        ty: String,
    },
    #[error("{path}: {what}")]
    Unsupported { path: PathBuf, what: String },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error(transparent)]
    Weights(#[from] crate::weights::WeightsError),
}

/// Whether `path` names a GGUF file (by its extension).
pub fn is_gguf(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(EXTENSION))
    {
        return true;
    }
    // Ollama keeps GGUF files as extensionless blobs: known by their magic.
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == crate::weights::gguf::MAGIC
}

/// A GGUF model opened as a checkpoint.
#[derive(Debug)]
pub struct GgufModel {
    /// The first (or only) file, which holds the metadata.
    pub path: PathBuf,
    /// Every part, first to last.
    pub parts: Vec<PathBuf>,
    /// `config.json`, as the model code reads it.
    pub config: serde_json::Value,
    /// `tokenizer.json` and `tokenizer_config.json`, or why the metadata's
    /// tokenizer cannot be rebuilt: the model still loads and scores token
    /// ids, and asking it for text says why it cannot.
    pub tokenizer: Result<Tokenizer, std::sync::Arc<ImportError>>,
}

/// A tokenizer rebuilt from GGUF metadata.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pub json: serde_json::Value,
    pub config: serde_json::Value,
}

impl GgufModel {
    /// Opens `path`, a GGUF file or the first part of a split one, and its
    /// tensors under their Hugging Face names.
    pub fn open(path: &Path) -> Result<(Self, SafetensorsCheckpoint), ImportError> {
        let first = GgufFile::open(path)?;
        let paths = part_paths(&first)?;
        let mut files = vec![first];
        for p in &paths[1..] {
            files.push(GgufFile::open(p)?);
        }
        let arch = names::Arch::of(&files[0])?;
        let checkpoint = names::checkpoint(arch, &files)?;
        let config = config::config_json(arch, &files[0], &checkpoint)?;
        let tokenizer = tokenizer::tokenizer_json(&files[0])
            .map(|(json, config)| Tokenizer { json, config })
            .map_err(std::sync::Arc::new);
        let model = Self {
            path: path.to_path_buf(),
            parts: paths,
            config,
            tokenizer,
        };
        Ok((model, checkpoint))
    }

    /// The files a model folder would hold beside its weights.
    pub fn aux_files(&self) -> Vec<(&'static str, String)> {
        let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
        let mut files = vec![("config.json", pretty(&self.config))];
        if let Ok(t) = &self.tokenizer {
            files.push(("tokenizer.json", t.json.to_string()));
            files.push(("tokenizer_config.json", pretty(&t.config)));
        }
        files
    }
}

/// Every part of the model `first` begins: itself alone, or the parts its
/// `split.count` names, found beside it by the split naming rule.
fn part_paths(first: &GgufFile) -> Result<Vec<PathBuf>, ImportError> {
    let path = &first.path;
    let number = |key: &str| -> Result<Option<u64>, ImportError> {
        match first.metadata.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| ImportError::BadKey {
                path: path.clone(),
                key: key.to_string(),
                found: format!("{v:?}"),
                expected: "an unsigned integer",
            }),
        }
    };
    let count = number("split.count")?.unwrap_or(1);
    if count <= 1 {
        return Ok(vec![path.clone()]);
    }
    if count > MAX_SPLIT_PARTS {
        return Err(ImportError::Invalid {
            path: path.clone(),
            what: format!(
                "split.count is {count}; split names have {SPLIT_DIGITS} digits, so at most {MAX_SPLIT_PARTS} parts"
            ),
        });
    }
    let no = number("split.no")?.unwrap_or(0);
    if no != 0 {
        return Err(ImportError::Invalid {
            path: path.clone(),
            what: format!(
                "this is part {} of {count} of a split model; give the first part (…-00001-of-{count:05}.gguf)",
                no + 1
            ),
        });
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let suffix = format!("-{:0w$}-of-{count:0w$}.{EXTENSION}", 1, w = SPLIT_DIGITS);
    let Some(stem) = name.strip_suffix(&suffix) else {
        return Err(ImportError::Invalid {
            path: path.clone(),
            what: format!(
                "split.count is {count}, but the file is not named …{suffix}, so its other parts cannot be found"
            ),
        });
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let parts: Vec<PathBuf> = (1..=count)
        .map(|k| {
            dir.join(format!(
                "{stem}-{k:0w$}-of-{count:0w$}.{EXTENSION}",
                w = SPLIT_DIGITS
            ))
        })
        .collect();
    if let Some(missing) = parts.iter().find(|p| !p.is_file()) {
        return Err(ImportError::Invalid {
            path: path.clone(),
            what: format!("part {} of the split model is missing", missing.display()),
        });
    }
    Ok(parts)
}

/// Metadata helpers that name the key and the file in their errors.
pub(crate) struct Meta<'a> {
    pub file: &'a GgufFile,
    /// The architecture's key prefix, e.g. `qwen3moe`.
    pub arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch)
    }

    pub fn get(&self, name: &str) -> Option<&GgufValue> {
        self.file.metadata.get(&self.key(name))
    }

    /// A size or count, bounded as `config.json`'s are: a block count of
    /// 10^9 once had the importer build a list of 10^9 layers before any
    /// check, and the failed allocation aborted the process.
    pub fn u64_opt(&self, name: &str) -> Result<Option<u64>, ImportError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                None => Err(self.bad(name, v, "an unsigned integer")),
                Some(n) if n > MAX_CONFIG_SIZE as u64 => {
                    Err(self.bad(name, v, "a size no model exceeds (at most 2^24)"))
                }
                Some(n) => Ok(Some(n)),
            },
        }
    }

    pub fn u64(&self, name: &str, needs: &'static str) -> Result<u64, ImportError> {
        self.u64_opt(name)?.ok_or_else(|| ImportError::MissingKey {
            path: self.file.path.clone(),
            key: self.key(name),
            needs,
        })
    }

    /// A finite float: JSON has no NaN, so a NaN `rope.freq_base` once
    /// became a null in the config and silently the default base.
    pub fn f64_opt(&self, name: &str) -> Result<Option<f64>, ImportError> {
        let v = match self.get(name) {
            None => return Ok(None),
            Some(GgufValue::F32(v)) => f64::from(*v),
            Some(GgufValue::F64(v)) => *v,
            Some(v) => return Err(self.bad(name, v, "a float")),
        };
        if v.is_finite() {
            Ok(Some(v))
        } else {
            Err(self.bad(name, &GgufValue::F64(v), "a finite number"))
        }
    }

    pub fn str_opt(&self, name: &str) -> Result<Option<&str>, ImportError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(name, v, "a string")),
        }
    }

    fn bad(&self, name: &str, v: &GgufValue, expected: &'static str) -> ImportError {
        ImportError::BadKey {
            path: self.file.path.clone(),
            key: self.key(name),
            found: format!("{v:?}"),
            expected,
        }
    }
}

/// Where a model's weights and settings come from: a Hugging Face folder
/// (`config.json`, tokenizer files and safetensors shards) or a GGUF file
/// seen as one.
#[derive(Debug)]
pub struct ModelSource {
    pub path: PathBuf,
    pub checkpoint: SafetensorsCheckpoint,
    gguf: Option<GgufModel>,
}

/// Files a model folder holds beside its weights, copied into packs.
pub const AUX_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    crate::tokenizer::tiktoken::TIKTOKEN_FILE,
    crate::tokenizer::tiktoken::KIMI_TOKENIZER_CODE,
];

impl ModelSource {
    /// Opens a checkpoint folder or a GGUF file (the first part of a split one).
    pub fn open(path: &Path) -> Result<Self, ImportError> {
        if is_gguf(path) {
            let (model, checkpoint) = GgufModel::open(path)?;
            return Ok(Self {
                path: path.to_path_buf(),
                checkpoint,
                gguf: Some(model),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            checkpoint: SafetensorsCheckpoint::open(path)?,
            gguf: None,
        })
    }

    /// The GGUF model, when the source is one.
    pub fn gguf(&self) -> Option<&GgufModel> {
        self.gguf.as_ref()
    }

    /// The model's `config.json`, parsed.
    pub fn spec(&self) -> Result<crate::model::ModelSpec, crate::model::ConfigError> {
        match &self.gguf {
            None => crate::model::ModelSpec::read(&self.path.join("config.json")),
            Some(m) => {
                let raw = crate::model::config::RawConfig::parse(&m.path, &m.config.to_string())?;
                crate::model::ModelSpec::parse(&raw)
            }
        }
    }

    /// The text of auxiliary file `name`, when the source has it.
    pub fn aux_text(&self, name: &str) -> Option<String> {
        match &self.gguf {
            None => {
                crate::regular::read_text(&self.path.join(name), crate::regular::LARGE_LIMIT).ok()
            }
            Some(m) => m
                .aux_files()
                .into_iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t),
        }
    }

    /// Files whose contents identify the source: the weights, and for a
    /// folder its auxiliary files.
    pub fn identity_files(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self
            .checkpoint
            .files()
            .iter()
            .map(|f| f.path().to_path_buf())
            .collect();
        if self.gguf.is_none() {
            paths.extend(
                AUX_FILES
                    .iter()
                    .map(|n| self.path.join(n))
                    .filter(|p| p.is_file()),
            );
        }
        paths
    }

    /// Writes the auxiliary files into `dir` (a pack folder); an error
    /// names the file.
    pub fn write_aux(&self, dir: &Path) -> Result<(), (PathBuf, std::io::Error)> {
        for name in AUX_FILES {
            let to = dir.join(name);
            let written = match &self.gguf {
                None => {
                    let from = self.path.join(name);
                    if !from.is_file() {
                        continue;
                    }
                    crate::private::copy(&from, &to)
                }
                Some(_) => match self.aux_text(name) {
                    Some(text) => crate::private::write(&to, text.as_bytes()),
                    None => continue,
                },
            };
            written.map_err(|e| (to, e))?;
        }
        Ok(())
    }
}
