//! Opening files that must be regular files: extents, resident weights,
//! shards, GGUF files, anything hashed whole. A FIFO blocks in `open()`
//! until a writer comes, and `/dev/zero` never ends: either in a pack's or
//! a model's place once wedged the runner, and with it the service's
//! shutdown. The file is opened without blocking, checked, then read as
//! usual; checking the opened file (not the path first) leaves no gap for
//! the path to change between the two.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Most bytes of a settings file: config.json, generation_config.json,
/// tokenizer_config.json, a chat template (released ones are under 1 MiB;
/// the same bound as a config's sizes).
pub const SETTINGS_LIMIT: u64 = crate::model::config::MAX_CONFIG_SIZE as u64;
/// Most bytes of a vocabulary file (tokenizer.json, tiktoken.model; the
/// largest released is ~30 MiB) or a pack's manifest (Kimi K3's: ~60 MiB).
pub const LARGE_LIMIT: u64 = 256 << 20;

/// Opens `path` for reading, if it is a regular file.
pub fn open(path: &Path) -> io::Result<File> {
    open_with(path, 0)
}

/// The whole of `path`, a regular file of at most `limit` bytes. Model
/// folders are input like any other: a 3 GiB `config.json` was once read
/// whole, and every listing of the models read each one again.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open(path)?;
    let len = file.metadata()?.len();
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is {len} bytes; a file of its kind is at most {limit}",
                path.display()
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // A file that grows while it is read stops at the limit all the same.
    io::Read::read_to_end(&mut io::Read::take(file, limit), &mut bytes)?;
    Ok(bytes)
}

/// [`read`] as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text: {e}", path.display()),
        )
    })
}

/// Opens `path` for reading with the extra open `flags` (`O_DIRECT`), if it
/// is a regular file.
pub fn open_with(path: &Path, flags: i32) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, flags | libc::O_NONBLOCK);
    #[cfg(not(unix))]
    let _ = flags;
    let file = options.open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file ({kind:?})", path.display()),
        ));
    }
    #[cfg(unix)]
    blocking(&file)?;
    Ok(file)
}

/// Clears `O_NONBLOCK` again: reads of a regular file wait as they should.
#[cfg(unix)]
fn blocking(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function's caller owns and keeps
    // open; F_GETFL and F_SETFL take and return plain integers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_or_a_device_is_refused_at_once_and_a_file_reads() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for path in [fifo.as_path(), Path::new("/dev/zero"), dir.path()] {
            let err = open(path).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("not a regular file"), "{path:?}: {err}");
        }
        let file = dir.path().join("f");
        std::fs::write(&file, b"abc").unwrap();
        let mut text = String::new();
        io::Read::read_to_string(&mut open(&file).unwrap(), &mut text).unwrap();
        assert_eq!(text, "abc");
        assert_eq!(read_text(&file, 3).unwrap(), "abc");
        let err = read(&file, 2)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("is 3 bytes") && err.contains("at most 2"),
            "{err}"
        );
    }
}
