//! One reader thread of one drive.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use super::{DIRECT_IO_BLOCK, DriveCounters, Job, StoreError};

pub(super) struct Context {
    pub drive: usize,
    pub direct_io: bool,
    pub jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
    pub counters: Arc<DriveCounters>,
    pub warned_buffered: Arc<AtomicBool>,
}

/// An open file and whether it bypasses the page cache.
struct Handle {
    file: File,
    direct: bool,
}

pub(super) fn run(ctx: Context) {
    let mut files: HashMap<PathBuf, Handle> = HashMap::new();
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let job = {
            let Ok(rx) = ctx.jobs.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let started = Instant::now();
        let result = read(&ctx, &mut files, &mut buffer, &job);
        let c = &ctx.counters;
        let micros = started.elapsed().as_micros() as u64;
        c.busy_micros.fetch_add(micros, Ordering::Relaxed);
        c.record_latency(micros);
        c.pending.fetch_sub(job.len, Ordering::Relaxed);
        match &result {
            Ok(b) => {
                c.bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
                c.reads.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
                // A failed handle may point at a vanished file: reopen next time.
                files.remove(&job.path);
            }
        }
        // The requester may have given up; nothing to do then.
        let _ = job.reply.send((job.slot, result));
    }
}

fn read(
    ctx: &Context,
    files: &mut HashMap<PathBuf, Handle>,
    buffer: &mut Vec<u8>,
    job: &Job,
) -> Result<Vec<u8>, StoreError> {
    let err = |reason: String| StoreError::Read {
        drive: ctx.drive,
        path: job.path.clone(),
        offset: job.offset,
        reason,
    };
    if !files.contains_key(&job.path) {
        let handle = open(ctx, &job.path).map_err(|e| err(e.to_string()))?;
        files.insert(job.path.clone(), handle);
    }
    let handle = files
        .get_mut(&job.path)
        .ok_or_else(|| err("file handle lost".to_string()))?;
    let len = usize::try_from(job.len).map_err(|_| err("read too large".to_string()))?;
    let got = if handle.direct && job.offset.is_multiple_of(DIRECT_IO_BLOCK as u64) {
        match read_direct(&handle.file, buffer, job.offset, len) {
            Ok(got) => got,
            // Some file systems accept O_DIRECT at open but refuse the read.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                warn_buffered(ctx, &job.path);
                *handle = open_buffered(&job.path).map_err(|e| err(e.to_string()))?;
                read_buffered(&handle.file, buffer, job.offset, len)
                    .map_err(|e| err(e.to_string()))?
            }
            Err(e) => return Err(err(e.to_string())),
        }
    } else {
        read_buffered(&handle.file, buffer, job.offset, len).map_err(|e| err(e.to_string()))?
    };
    if got.len() < len {
        return Err(StoreError::ShortRead {
            drive: ctx.drive,
            path: job.path.clone(),
            offset: job.offset,
            wanted: job.len,
            got: got.len() as u64,
        });
    }
    Ok(got[..len].to_vec())
}

fn open(ctx: &Context, path: &Path) -> std::io::Result<Handle> {
    if ctx.direct_io {
        match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(file) => return Ok(Handle { file, direct: true }),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => warn_buffered(ctx, path),
            Err(e) => return Err(e),
        }
    }
    open_buffered(path)
}

fn open_buffered(path: &Path) -> std::io::Result<Handle> {
    Ok(Handle {
        file: File::open(path)?,
        direct: false,
    })
}

fn warn_buffered(ctx: &Context, path: &Path) {
    if !ctx.warned_buffered.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{}: the file system refuses direct I/O; reading through the page cache instead",
            path.display()
        );
    }
}

/// Reads at least `len` bytes (rounded up to whole blocks) into an aligned
/// part of `buffer`, which is grown and reused across reads.
fn read_direct<'a>(
    file: &File,
    buffer: &'a mut Vec<u8>,
    offset: u64,
    len: usize,
) -> std::io::Result<&'a [u8]> {
    let padded = len.next_multiple_of(DIRECT_IO_BLOCK);
    if buffer.len() < padded + DIRECT_IO_BLOCK {
        buffer.resize(padded + DIRECT_IO_BLOCK, 0);
    }
    let start = buffer.as_ptr().align_offset(DIRECT_IO_BLOCK);
    let region = &mut buffer[start..start + padded];
    let mut got = 0;
    while got < padded {
        let n = file.read_at(&mut region[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
        if !got.is_multiple_of(DIRECT_IO_BLOCK) {
            // A partial block means end of file.
            break;
        }
    }
    Ok(&buffer[start..start + got.min(padded)])
}

fn read_buffered<'a>(
    file: &File,
    buffer: &'a mut Vec<u8>,
    offset: u64,
    len: usize,
) -> std::io::Result<&'a [u8]> {
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
    let mut got = 0;
    while got < len {
        let n = file.read_at(&mut buffer[got..len], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(&buffer[..got])
}
