//! Files and folders readable by their owner only. What Longhaul writes
//! holds prompts, answers, routing records (which experts a user's work
//! touched) and model state; packs and prefix caches live on drives outside
//! the private data dir, where the umask (commonly 022) once made them
//! readable by every user of the machine.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// The mode of a private file: read and write for the owner.
pub const FILE_MODE: u32 = 0o600;
/// The mode of a private folder: everything for the owner.
pub const DIR_MODE: u32 = 0o700;

/// Options that create files readable by their owner only.
pub fn options() -> OpenOptions {
    let mut options = OpenOptions::new();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, FILE_MODE);
    options
}

/// Creates (or truncates) `path` for writing, private to its owner. A file
/// that already existed is made private too.
pub fn create(path: &Path) -> io::Result<File> {
    let file = options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// Writes `bytes` to `path` (replacing it), private to its owner.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    create(path)?.write_all(bytes)
}

/// Copies `from` to `to` (replacing it), private to its owner whatever
/// `from`'s mode.
pub fn copy(from: &Path, to: &Path) -> io::Result<()> {
    io::copy(&mut File::open(from)?, &mut create(to)?).map(drop)
}

/// Creates folder `path` (its parent must exist), private to its owner;
/// fails if it exists, so it can reserve a name.
pub fn create_dir(path: &Path) -> io::Result<()> {
    let mut builder = DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
    builder.create(path)
}

/// Creates `path` and its missing parents, private to their owner.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    let mut builder = DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
    builder.create(path)
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn what_is_written_is_private_even_over_an_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::write(&open, b"x").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&open, b"y").unwrap();
        copy(&open, &dir.path().join("copy")).unwrap();
        create_dir_all(&dir.path().join("a/b")).unwrap();
        assert_eq!(mode(&open), FILE_MODE);
        assert_eq!(mode(&dir.path().join("copy")), FILE_MODE);
        assert_eq!(mode(&dir.path().join("a")), DIR_MODE);
        assert_eq!(mode(&dir.path().join("a/b")), DIR_MODE);
    }
}
