//! Attachments: files or folders turned into prompt text, each file under a
//! header with its path. Binary files are skipped and listed, so the user
//! sees what the model will not.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Most bytes of text attachments one job may carry.
pub const MAX_ATTACHMENT_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes looked at to decide whether a file is text.
const SNIFF_BYTES: usize = 8192;
/// Folders never descended into.
const SKIPPED_DIRS: &[&str] = &[".git", "node_modules", "target", "__pycache__", ".venv"];

#[derive(Debug, Clone, Default, Serialize)]
pub struct Attachments {
    /// The prompt text: each file under a `=== path ===` header.
    pub text: String,
    pub files: Vec<PathBuf>,
    /// Files left out, with why.
    pub skipped: Vec<(PathBuf, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("attachment {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("attachments hold more than {limit} bytes of text (at {path}); attach fewer files")]
    TooLarge { path: PathBuf, limit: u64 },
}

/// Reads `paths` (files, or folders walked in name order) into prompt text.
pub fn collect(paths: &[PathBuf]) -> Result<Attachments, AttachError> {
    let mut out = Attachments::default();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|source| AttachError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            walk(path, &mut out)?;
        } else {
            add_file(path, &mut out)?;
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Attachments) -> Result<(), AttachError> {
    let io = |source| AttachError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let meta = std::fs::symlink_metadata(&path).map_err(|source| AttachError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_symlink() {
            out.skipped.push((path, "symbolic link".into()));
        } else if meta.is_dir() {
            if SKIPPED_DIRS.contains(&name) {
                out.skipped.push((path, "build or tool folder".into()));
            } else {
                walk(&path, out)?;
            }
        } else if meta.is_file() {
            add_file(&path, out)?;
        }
    }
    Ok(())
}

fn add_file(path: &Path, out: &mut Attachments) -> Result<(), AttachError> {
    let bytes = std::fs::read(path).map_err(|source| AttachError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes[..bytes.len().min(SNIFF_BYTES)].contains(&0) {
        out.skipped.push((path.to_path_buf(), "binary".into()));
        return Ok(());
    }
    let Ok(text) = String::from_utf8(bytes) else {
        out.skipped
            .push((path.to_path_buf(), "not UTF-8 text".into()));
        return Ok(());
    };
    let piece = format!("=== {} ===\n{}\n\n", path.display(), text.trim_end());
    if out.text.len() as u64 + piece.len() as u64 > MAX_ATTACHMENT_BYTES {
        return Err(AttachError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_ATTACHMENT_BYTES,
        });
    }
    out.text.push_str(&piece);
    out.files.push(path.to_path_buf());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_become_headed_text_and_binaries_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("b.rs"), "fn main() {}\n").unwrap();
        std::fs::write(root.join("a.md"), "# Title").unwrap();
        std::fs::write(root.join("logo.png"), [0x89, b'P', 0, 1]).unwrap();
        std::fs::create_dir(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/HEAD"), "ref").unwrap();
        let a = collect(&[root.to_path_buf()]).unwrap();
        assert_eq!(a.files, vec![root.join("a.md"), root.join("b.rs")]);
        assert!(a.text.starts_with(&format!(
            "=== {} ===\n# Title\n",
            root.join("a.md").display()
        )));
        assert!(a.text.contains("fn main() {}"));
        let skipped: Vec<&str> = a.skipped.iter().map(|(_, why)| why.as_str()).collect();
        assert_eq!(skipped, vec!["build or tool folder", "binary"]);
    }

    #[test]
    fn a_missing_attachment_is_named() {
        let err = collect(&[PathBuf::from("/no/such/file.txt")]).unwrap_err();
        assert!(err.to_string().contains("/no/such/file.txt"), "{err}");
    }
}
