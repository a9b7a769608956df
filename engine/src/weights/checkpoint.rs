//! A Hugging Face checkpoint folder: one `model.safetensors`, or shards named
//! by `model.safetensors.index.json`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use super::{
    RawTensor, SafetensorsFile, TensorInfo, TensorSource, WeightsError, tensor_from_bytes,
};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// All safetensors files of one checkpoint, with a name → file index.
#[derive(Debug)]
pub struct SafetensorsCheckpoint {
    dir: PathBuf,
    files: Vec<SafetensorsFile>,
    index: BTreeMap<String, usize>,
}

impl SafetensorsCheckpoint {
    /// Opens the checkpoint in folder `dir`.
    pub fn open(dir: &Path) -> Result<Self, WeightsError> {
        Self::open_files(dir, shard_paths(dir)?)
    }

    /// Opens the given safetensors files as one checkpoint (`dir` names it in errors).
    pub fn open_files(dir: &Path, paths: Vec<PathBuf>) -> Result<Self, WeightsError> {
        let files = paths
            .iter()
            .map(|p| SafetensorsFile::open(p))
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_files(dir, files)
    }

    /// Files already opened, as one checkpoint; a tensor in two is refused.
    pub fn from_files(dir: &Path, opened: Vec<SafetensorsFile>) -> Result<Self, WeightsError> {
        let mut files: Vec<SafetensorsFile> = Vec::with_capacity(opened.len());
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        for file in opened {
            let path = file.path().to_path_buf();
            let slot = files.len();
            for name in file.tensors().keys() {
                if let Some(&first) = index.get(name) {
                    let first: &SafetensorsFile = &files[first];
                    return Err(WeightsError::Duplicate {
                        name: name.clone(),
                        first: first.path().to_path_buf(),
                        second: path.clone(),
                    });
                }
                index.insert(name.clone(), slot);
            }
            files.push(file);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            index,
        })
    }

    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    /// The file holding `name` and where in it.
    pub fn info(&self, name: &str) -> Option<(&SafetensorsFile, &TensorInfo)> {
        let file = &self.files[*self.index.get(name)?];
        Some((file, file.tensors().get(name)?))
    }

    /// Bytes stored for `name`, if present.
    pub fn stored_len(&self, name: &str) -> Option<u64> {
        self.info(name).map(|(_, info)| info.len)
    }

    /// Bytes of all tensors in the checkpoint.
    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .flat_map(|f| f.tensors().values())
            .map(|t| t.len)
            .sum()
    }

    /// Asks the system to drop the files' pages from its cache: once their
    /// tensors are in RAM they would only count against a memory limit
    /// (a cgroup counts the page cache). A hint; nothing fails if ignored.
    pub fn drop_page_cache(&self) {
        for f in &self.files {
            if let Ok(file) = std::fs::File::open(f.path()) {
                crate::platform::forget_cached(&file);
            }
        }
    }

    /// Every tensor name in the checkpoint.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }
}

fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>, WeightsError> {
    let index_path = dir.join(INDEX_FILE);
    if index_path.is_file() {
        let text = crate::regular::read_text(&index_path, crate::regular::LARGE_LIMIT).map_err(
            |source| WeightsError::Io {
                path: index_path.clone(),
                source,
            },
        )?;
        let invalid = |reason: String| WeightsError::InvalidFile {
            path: index_path.clone(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
        let map = value
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| invalid("missing object `weight_map`".to_string()))?;
        let mut shards = BTreeSet::new();
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| invalid(format!("`weight_map.{tensor}` is not a file name")))?;
            if file.contains('/') || file.contains("..") {
                return Err(invalid(format!(
                    "shard name `{file}` must be a plain file name"
                )));
            }
            shards.insert(file.to_string());
        }
        if shards.is_empty() {
            return Err(invalid("`weight_map` lists no shards".to_string()));
        }
        return Ok(shards.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(WeightsError::NoWeights {
        dir: dir.to_path_buf(),
    })
}

impl TensorSource for SafetensorsCheckpoint {
    fn shape(&self, name: &str) -> Option<&[usize]> {
        self.info(name).map(|(_, info)| info.shape.as_slice())
    }

    fn load(&self, name: &str) -> Result<Tensor, WeightsError> {
        let (file, info) = self.info(name).ok_or_else(|| WeightsError::Missing {
            name: name.to_string(),
            dir: self.dir.clone(),
        })?;
        let bytes = file.read_bytes(info)?;
        tensor_from_bytes(name, &bytes, info.dtype, &info.shape, file.path())
    }

    fn load_raw(&self, name: &str) -> Result<RawTensor, WeightsError> {
        let (file, info) = self.info(name).ok_or_else(|| WeightsError::Missing {
            name: name.to_string(),
            dir: self.dir.clone(),
        })?;
        Ok(RawTensor {
            dtype: info.dtype,
            bytes: file.read_bytes(info)?,
        })
    }

    fn location(&self, name: &str) -> PathBuf {
        self.info(name)
            .map(|(f, _)| f.path().to_path_buf())
            .unwrap_or_else(|| self.dir.clone())
    }

    fn origin(&self) -> PathBuf {
        self.dir.clone()
    }
}
