//! Attachments: files or folders turned into prompt text, each file under a
//! header with its path. Binary files are skipped and listed, so the user
//! sees what the model will not.
//!
//! Nothing here trusts a path: the kind and size of every file are checked
//! from its metadata before a byte is read (a 3 GB file once took the
//! service to 3.1 GB of RSS, `/dev/zero` got it OOM-killed and a FIFO hung
//! it), files are opened without blocking and re-checked on the open
//! handle, reads stop at the text limit, and folder walks stop at a count
//! of entries. Callers run this on a blocking thread, never on an async one.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Most bytes of text attachments one job may carry.
pub const MAX_ATTACHMENT_BYTES: u64 = 8 * 1024 * 1024;
/// Most folder entries one job's walks may look at (files, folders, links).
pub const MAX_WALK_ENTRIES: usize = 20_000;
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
    #[error("attachment {path} is a {kind}, not a file or folder; attach regular files only")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("attached folders hold more than {limit} entries (at {path}); attach a smaller folder")]
    TooManyEntries { path: PathBuf, limit: usize },
}

/// How much one job's attachments may hold.
#[derive(Debug, Clone, Copy)]
struct Limits {
    text_bytes: u64,
    entries: usize,
}

const LIMITS: Limits = Limits {
    text_bytes: MAX_ATTACHMENT_BYTES,
    entries: MAX_WALK_ENTRIES,
};

/// Reads `paths` (files, or folders walked in name order) into prompt text.
pub fn collect(paths: &[PathBuf]) -> Result<Attachments, AttachError> {
    collect_within(paths, LIMITS)
}

fn collect_within(paths: &[PathBuf], limits: Limits) -> Result<Attachments, AttachError> {
    let mut walk = Walk {
        out: Attachments::default(),
        entries: 0,
        limits,
    };
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|source| AttachError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            walk.folder(path)?;
        } else if meta.is_file() {
            walk.file(path, &meta)?;
        } else {
            return Err(AttachError::NotAFile {
                path: path.clone(),
                kind: kind_of(&meta),
            });
        }
    }
    Ok(walk.out)
}

/// What a non-regular, non-folder entry is, for messages.
fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_fifo() {
        "named pipe (FIFO)"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_symlink() {
        "symbolic link"
    } else {
        "special file"
    }
}

struct Walk {
    out: Attachments,
    entries: usize,
    limits: Limits,
}

impl Walk {
    fn folder(&mut self, dir: &Path) -> Result<(), AttachError> {
        let io = |source| AttachError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            self.entries += 1;
            if self.entries > self.limits.entries {
                return Err(AttachError::TooManyEntries {
                    path: dir.to_path_buf(),
                    limit: self.limits.entries,
                });
            }
            entries.push(entry.map_err(io)?.path());
        }
        entries.sort();
        for path in entries {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let meta = std::fs::symlink_metadata(&path).map_err(|source| AttachError::Io {
                path: path.clone(),
                source,
            })?;
            if meta.is_symlink() {
                self.out.skipped.push((path, "symbolic link".into()));
            } else if meta.is_dir() {
                if SKIPPED_DIRS.contains(&name) {
                    self.out.skipped.push((path, "build or tool folder".into()));
                } else {
                    self.folder(&path)?;
                }
            } else if meta.is_file() {
                self.file(&path, &meta)?;
            } else {
                self.out.skipped.push((path, kind_of(&meta).into()));
            }
        }
        Ok(())
    }

    /// Adds one regular file; `meta` is what the caller saw before opening.
    fn file(&mut self, path: &Path, meta: &Metadata) -> Result<(), AttachError> {
        let io = |source| AttachError::Io {
            path: path.to_path_buf(),
            source,
        };
        let limit = self.limits.text_bytes;
        let too_large = || AttachError::TooLarge {
            path: path.to_path_buf(),
            limit,
        };
        // Non-blocking, so a file swapped for a FIFO after the check cannot
        // hang the open; the handle's own metadata decides.
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(io)?;
        if let Some(e) = crate::faults::attachment_read(path) {
            return Err(io(e));
        }
        let opened = file.metadata().map_err(io)?;
        if !opened.is_file() {
            return Err(AttachError::NotAFile {
                path: path.to_path_buf(),
                kind: kind_of(&opened),
            });
        }
        let size = opened.len().max(meta.len());
        let mut head = Vec::with_capacity(SNIFF_BYTES.min(size as usize));
        (&mut file)
            .take(SNIFF_BYTES as u64)
            .read_to_end(&mut head)
            .map_err(io)?;
        if head.contains(&0) {
            self.out.skipped.push((path.to_path_buf(), "binary".into()));
            return Ok(());
        }
        let room = limit.saturating_sub(self.out.text.len() as u64);
        if size > room {
            return Err(too_large());
        }
        let bytes = read_rest(file, head, room)
            .map_err(io)?
            .ok_or_else(too_large)?;
        let Ok(text) = String::from_utf8(bytes) else {
            self.out
                .skipped
                .push((path.to_path_buf(), "not UTF-8 text".into()));
            return Ok(());
        };
        let piece = format!("=== {} ===\n{}\n\n", path.display(), text.trim_end());
        if self.out.text.len() as u64 + piece.len() as u64 > limit {
            return Err(too_large());
        }
        self.out.text.push_str(&piece);
        self.out.files.push(path.to_path_buf());
        Ok(())
    }
}

/// Reads the rest of `file` after `head`, at most `room` bytes in all
/// (`None` when there were more: the file grew after its size was checked).
fn read_rest(file: File, mut bytes: Vec<u8>, room: u64) -> std::io::Result<Option<Vec<u8>>> {
    let left = room.saturating_sub(bytes.len() as u64);
    file.take(left + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= room).then_some(bytes))
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

    fn fifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn pipes_and_devices_are_refused_by_name_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe");
        fifo(&pipe);
        let err = collect(std::slice::from_ref(&pipe)).unwrap_err();
        assert!(matches!(err, AttachError::NotAFile { .. }), "{err}");
        assert!(err.to_string().contains("named pipe"), "{err}");
        let err = collect(&[PathBuf::from("/dev/zero")]).unwrap_err();
        assert!(
            err.to_string().contains("/dev/zero is a character device"),
            "{err}"
        );
        // Inside a folder they are listed as skipped, and the walk goes on.
        std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
        let a = collect(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(a.files, vec![dir.path().join("notes.txt")]);
        assert_eq!(a.skipped, vec![(pipe, "named pipe (FIFO)".to_string())]);
    }

    #[test]
    fn a_huge_file_is_refused_from_its_size_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.log");
        let file = std::fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut &file, &b"a line of text\n".repeat(1000)).unwrap();
        // Sparse: 3 GiB on paper, nothing on disk; reading it would take 3 GiB.
        file.set_len(3 << 30).unwrap();
        let err = collect(std::slice::from_ref(&path)).unwrap_err();
        assert!(matches!(err, AttachError::TooLarge { .. }), "{err}");
        assert!(err.to_string().contains("huge.log"), "{err}");
    }

    #[test]
    fn text_and_folder_walks_stop_at_their_limits() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::write(dir.path().join(format!("{i}.txt")), "x".repeat(100)).unwrap();
        }
        let small = |text_bytes, entries| Limits {
            text_bytes,
            entries,
        };
        let all = collect_within(&[dir.path().to_path_buf()], small(10_000, 5)).unwrap();
        assert_eq!(all.files.len(), 5);
        let err = collect_within(&[dir.path().to_path_buf()], small(10_000, 4)).unwrap_err();
        assert!(
            matches!(err, AttachError::TooManyEntries { limit: 4, .. }),
            "{err}"
        );
        let err = collect_within(&[dir.path().to_path_buf()], small(300, 100)).unwrap_err();
        assert!(
            matches!(err, AttachError::TooLarge { limit: 300, .. }),
            "{err}"
        );
        // A file that grows past its checked size is still cut at the limit.
        let path = dir.path().join("0.txt");
        let file = std::fs::File::open(&path).unwrap();
        assert_eq!(read_rest(file, Vec::new(), 50).unwrap(), None);
        let file = std::fs::File::open(&path).unwrap();
        assert_eq!(
            read_rest(file, Vec::new(), 100).unwrap().map(|b| b.len()),
            Some(100)
        );
    }
}
