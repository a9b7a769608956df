//! Removing what an unfinished pack wrote. A pack that failed (a full
//! drive) or was interrupted (the service killed mid-pack) once left its
//! extent and resident files on the drives — 154 MB and 629 MB in two
//! such cases — and its empty folder blocked its name.

use std::io;
use std::path::{Path, PathBuf};

use super::MANIFEST_FILE;

/// What [`discard_unfinished`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Discarded {
    pub files: usize,
    pub bytes: u64,
}

/// Whether `name` is a file the pack writer puts in a drive's folder:
/// extents and the resident file, finished or partial.
fn written_by_packing(name: &str) -> bool {
    let name = name.strip_suffix(".partial").unwrap_or(name);
    (name.starts_with("experts-") && name.ends_with(".bin")) || name == "resident.safetensors"
}

/// Removes an unfinished pack: in each of `drives`, the writer's files in
/// the folder named after `out` (and the folder, once empty), then `out`
/// itself, which must be a folder made for this pack. A finished pack (its
/// manifest written) is left alone and refused.
pub fn discard_unfinished(out: &Path, drives: &[PathBuf]) -> io::Result<Discarded> {
    if out.join(MANIFEST_FILE).exists() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} holds a finished pack; it is not removed", out.display()),
        ));
    }
    let mut gone = Discarded::default();
    if let Some(name) = out.file_name() {
        for drive in drives {
            discard_drive_files(&drive.join(name), &mut gone)?;
        }
    }
    match std::fs::remove_dir_all(out) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(gone),
    }
}

/// Removes a finished pack the user asked to delete with its model: the
/// writer's files in each drive folder its manifest names (each folder too,
/// once empty: anything else in it stays), then the pack folder.
pub fn discard_pack(out: &Path) -> Result<Discarded, crate::pack::PackError> {
    let manifest = super::Manifest::read(out)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| crate::pack::PackError::Io { path, source }
    };
    let mut gone = Discarded::default();
    for dir in &manifest.drives {
        discard_drive_files(dir, &mut gone).map_err(io(dir))?;
    }
    gone.bytes += folder_bytes(out);
    std::fs::remove_dir_all(out).map_err(io(out))?;
    Ok(gone)
}

fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The writer's files in `dir`, and `dir` once empty.
fn discard_drive_files(dir: &Path, gone: &mut Discarded) -> io::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = entry.file_name().to_str().is_some_and(written_by_packing);
        if ours && entry.file_type().is_ok_and(|t| t.is_file()) {
            let bytes = entry.metadata().map_or(0, |m| m.len());
            std::fs::remove_file(&path)?;
            gone.files += 1;
            gone.bytes += bytes;
        }
    }
    // Left in place when it holds anything the writer did not make.
    let _ = std::fs::remove_dir(dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_writers_files_go_and_a_finished_pack_stays() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("packs/m");
        let drive = root.path().join("d0");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::create_dir_all(drive.join("m")).unwrap();
        std::fs::write(drive.join("m/experts-00-000.bin.partial"), [0u8; 10]).unwrap();
        std::fs::write(drive.join("m/experts-00-001.bin"), [0u8; 5]).unwrap();
        std::fs::write(drive.join("m/resident.safetensors.partial"), [0u8; 3]).unwrap();
        std::fs::write(drive.join("m/notes.txt"), b"mine").unwrap();
        let gone = discard_unfinished(&out, std::slice::from_ref(&drive)).unwrap();
        assert_eq!(
            gone,
            Discarded {
                files: 3,
                bytes: 18
            }
        );
        assert!(!out.exists());
        assert!(drive.join("m/notes.txt").exists(), "not the writer's");
        std::fs::remove_file(drive.join("m/notes.txt")).unwrap();
        discard_unfinished(&out, std::slice::from_ref(&drive)).unwrap();
        assert!(!drive.join("m").exists(), "empty: removed");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join(MANIFEST_FILE), b"{}").unwrap();
        assert!(discard_unfinished(&out, &[drive]).is_err());
        assert!(out.join(MANIFEST_FILE).exists());
    }
}
