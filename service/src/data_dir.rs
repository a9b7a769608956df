//! The service's data dir: one service at a time, readable by its owner only.
//!
//! Two services on one data dir both claimed the queue: the second marked the
//! first one's running job interrupted and ran it again (606 tokens for a
//! `max_tokens` of 350, wrong text), and deleted the first one's `endpoint`
//! on exit. So a service holds an advisory lock on `service.lock` for its
//! whole life; the kernel releases it when the process dies, crash included,
//! so a stale lock file never blocks a start. The lock file names its holder
//! (pid, then its address once bound) for the error a second start gets.
//!
//! The data dir holds prompts, answers, attachment contents and remote API
//! keys: it is kept 0700 and its files 0600, and a start tightens what an
//! older version or another tool left wider, and says so.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside the data dir.
pub const LOCK_FILE: &str = "service.lock";
/// Subfolders whose files are private too (the KV state of running jobs).
const PRIVATE_SUBDIRS: &[&str] = &["state"];
#[cfg(unix)]
use longhaul_engine::private::DIR_MODE;
#[cfg(unix)]
use longhaul_engine::private::FILE_MODE;

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data dir {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another Longhaul service ({holder}) is using the data dir {dir}; use it (`longhaul jobs`, the app attaches to it), stop it, or pass another --data-dir"
    )]
    InUse { dir: PathBuf, holder: String },
}

/// A data dir this process serves from, locked until dropped.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    lock: File,
    /// Paths whose permissions the start tightened.
    pub tightened: Vec<PathBuf>,
}

impl DataDir {
    /// Creates (0700) or opens `path`, tightens permissions and takes the lock.
    pub fn claim(path: &Path) -> Result<Self, DataDirError> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| DataDirError::Io { path: p, source }
        };
        create_private_dir(path).map_err(io(path))?;
        let lock_path = path.join(LOCK_FILE);
        let mut lock = private_options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(DataDirError::InUse {
                    dir: path.to_path_buf(),
                    holder: if holder.is_empty() {
                        "starting".to_string()
                    } else {
                        holder.to_string()
                    },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&lock_path)(e)),
        }
        write_holder(&mut lock, &format!("pid {}", std::process::id())).map_err(io(&lock_path))?;
        let tightened = tighten(path).map_err(io(path))?;
        Ok(Self {
            path: path.to_path_buf(),
            lock,
            tightened,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records where this service answers, for the error a second start gets.
    pub fn set_address(&mut self, url: &str) -> Result<(), DataDirError> {
        let text = format!("pid {}, {url}", std::process::id());
        write_holder(&mut self.lock, &text).map_err(|source| DataDirError::Io {
            path: self.path.join(LOCK_FILE),
            source,
        })
    }
}

fn write_holder(lock: &mut File, text: &str) -> std::io::Result<()> {
    lock.set_len(0)?;
    lock.seek(SeekFrom::Start(0))?;
    lock.write_all(text.as_bytes())?;
    lock.sync_data()
}

pub use longhaul_engine::private::write as write_private;
pub(crate) use longhaul_engine::private::{
    create_dir_all as create_private_dir, options as private_options,
};

/// Tightens the data dir, its files and the private subfolders' files.
fn tighten(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut tightened = Vec::new();
    if set_mode_if_wider(dir, true)? {
        tightened.push(dir.to_path_buf());
    }
    tighten_files(dir, &mut tightened)?;
    for sub in PRIVATE_SUBDIRS {
        let sub = dir.join(sub);
        if sub.is_dir() {
            if set_mode_if_wider(&sub, true)? {
                tightened.push(sub.clone());
            }
            tighten_files(&sub, &mut tightened)?;
        }
    }
    Ok(tightened)
}

fn tighten_files(dir: &Path, tightened: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        // Links are left alone: their targets are not the data dir's.
        if entry.file_type()?.is_file() && set_mode_if_wider(&entry.path(), false)? {
            tightened.push(entry.path());
        }
    }
    Ok(())
}

/// Removes group and other permissions; true when there were any.
#[cfg(unix)]
fn set_mode_if_wider(path: &Path, dir: bool) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return Ok(false);
    }
    let private = if dir { DIR_MODE } else { FILE_MODE };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(private))?;
    Ok(true)
}

#[cfg(not(unix))]
fn set_mode_if_wider(_path: &Path, _dir: bool) -> std::io::Result<bool> {
    Ok(false)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn one_claim_at_a_time_and_a_dead_holder_frees_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let mut first = DataDir::claim(&dir).unwrap();
        first.set_address("http://127.0.0.1:7433").unwrap();
        let err = DataDir::claim(&dir).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, DataDirError::InUse { .. }), "{text}");
        assert!(text.contains("http://127.0.0.1:7433"), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(first);
        // The lock file stays behind, as after a crash; it does not block.
        assert!(dir.join(LOCK_FILE).is_file());
        DataDir::claim(&dir).unwrap();
    }

    #[test]
    fn new_data_dirs_are_private_and_old_ones_are_tightened() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let claimed = DataDir::claim(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(LOCK_FILE)), 0o600);
        assert!(claimed.tightened.is_empty());
        drop(claimed);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("queue.sqlite"), b"").unwrap();
        std::fs::set_permissions(
            dir.join("queue.sqlite"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::fs::create_dir(dir.join("state")).unwrap();
        std::fs::write(dir.join("state/job-1.kv"), b"").unwrap();
        std::fs::set_permissions(
            dir.join("state/job-1.kv"),
            std::fs::Permissions::from_mode(0o664),
        )
        .unwrap();
        let claimed = DataDir::claim(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("queue.sqlite")), 0o600);
        assert_eq!(mode(&dir.join("state/job-1.kv")), 0o600);
        let mut tightened = claimed.tightened.clone();
        tightened.sort();
        assert_eq!(
            tightened,
            vec![
                dir.clone(),
                dir.join("queue.sqlite"),
                dir.join("state"),
                dir.join("state/job-1.kv")
            ]
        );
    }
}
