//! One reader thread of one drive.
//!
//! A segment whose place in its buffer is block-aligned (every segment of a
//! pack written since segments are cut at block boundaries) is read with
//! direct I/O straight into that place: no copy, no allocation. Other
//! segments go through a reused aligned bounce buffer and one copy.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::faults::{Injected, StoreFaults};
use super::queue::DriveQueue;
use super::{Activity, DIRECT_IO_BLOCK, DriveCounters, SegmentRead, StoreError};
use crate::aligned::AlignedBytes;

pub(super) struct Context {
    pub drive: usize,
    pub dir: PathBuf,
    pub direct_io: bool,
    pub queue: Arc<DriveQueue>,
    pub counters: Arc<DriveCounters>,
    pub any: Arc<Mutex<Activity>>,
    pub warned_buffered: Arc<AtomicBool>,
    pub faults: Option<Arc<StoreFaults>>,
}

/// An open file and whether it bypasses the page cache.
struct Handle {
    file: File,
    direct: bool,
}

/// What one reader keeps between reads.
struct Reader<'a> {
    ctx: &'a Context,
    files: HashMap<String, Handle>,
    bounce: Option<AlignedBytes>,
}

pub(super) fn run(ctx: Context) {
    let mut reader = Reader {
        ctx: &ctx,
        files: HashMap::new(),
        bounce: None,
    };
    while let Some(read) = ctx.queue.pop() {
        let c = &ctx.counters;
        let started = Instant::now();
        activity(&c.activity, Activity::start);
        activity(&ctx.any, Activity::start);
        let result = reader.read(&read);
        activity(&ctx.any, Activity::stop);
        activity(&c.activity, Activity::stop);
        let took = started.elapsed().as_micros() as u64;
        c.pending.fetch_sub(read.request.len, Ordering::Relaxed);
        match &result {
            Ok(()) => {
                c.bytes.fetch_add(read.request.len, Ordering::Relaxed);
                c.reads.fetch_add(1, Ordering::Relaxed);
                // Only reads that returned data have a latency: a failed one
                // may fail at once, and is counted as an error instead.
                c.latency.record(took);
            }
            Err(_) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
                // A failed handle may point at a vanished file: reopen next time.
                reader.files.remove(&read.request.file);
            }
        }
        read.target.segment_done(result);
    }
}

fn activity(a: &Mutex<Activity>, f: impl FnOnce(&mut Activity)) {
    if let Ok(mut a) = a.lock() {
        f(&mut a);
    }
}

impl Reader<'_> {
    fn read(&mut self, read: &SegmentRead) -> Result<(), StoreError> {
        let r = &read.request;
        let path = self.ctx.dir.join(&r.file);
        let err = |reason: String| StoreError::Read {
            drive: self.ctx.drive,
            path: path.clone(),
            offset: r.offset,
            reason,
        };
        let mut len = usize::try_from(r.len).map_err(|_| err("read too large".to_string()))?;
        match self.ctx.faults.as_ref().map(|f| f.before_read()) {
            Some(Injected::IoError) => {
                return Err(err("Input/output error (os error 5), injected".to_string()));
            }
            Some(Injected::ShortRead) => len /= 2,
            _ => {}
        }
        let wanted = r.len;
        if read.room < len {
            return Err(err(format!(
                "a {len}-byte segment was given {} bytes of buffer",
                read.room
            )));
        }
        let dest = read
            .target
            .buffer()
            .region_ptr(read.at, read.room)
            .ok_or_else(|| err("segment lies outside its buffer".to_string()))?;
        if !self.files.contains_key(&r.file) {
            let handle = open(self.ctx, &path).map_err(|e| err(e.to_string()))?;
            self.files.insert(r.file.clone(), handle);
        }
        let padded = len.next_multiple_of(DIRECT_IO_BLOCK);
        let aligned = r.offset.is_multiple_of(DIRECT_IO_BLOCK as u64)
            && (dest as usize).is_multiple_of(DIRECT_IO_BLOCK);
        let direct = self.files.get(&r.file).is_some_and(|h| h.direct);
        let got = if direct && aligned && padded <= read.room {
            // SAFETY: `region_ptr` checked that `room` bytes from `at` lie in the
            // buffer, and segments of one buffer own disjoint ranges of it
            // (`SegmentRead::room`), which nobody reads before `segment_done`.
            let region = unsafe { std::slice::from_raw_parts_mut(dest, padded) };
            self.direct_into(&r.file, &path, region, r.offset)
                .map_err(|e| err(e.to_string()))?
        } else if direct {
            let start = (r.offset % DIRECT_IO_BLOCK as u64) as usize;
            let span = (start + len).next_multiple_of(DIRECT_IO_BLOCK);
            let mut bounce = self.take_bounce(span).map_err(|e| err(e.to_string()))?;
            let read = self.direct_into(
                &r.file,
                &path,
                &mut bounce.padded_mut()[..span],
                r.offset - start as u64,
            );
            let got = read.map(|n| n.saturating_sub(start).min(len));
            if let Ok(got) = got {
                // SAFETY: as above; `got <= len <= room`.
                let region = unsafe { std::slice::from_raw_parts_mut(dest, got) };
                region.copy_from_slice(&bounce.padded_mut()[start..start + got]);
            }
            self.bounce = Some(bounce);
            got.map_err(|e| err(e.to_string()))?
        } else {
            // SAFETY: as above; a buffered read writes at most `len <= room` bytes.
            let region = unsafe { std::slice::from_raw_parts_mut(dest, len) };
            let handle = self
                .files
                .get(&r.file)
                .ok_or_else(|| err("file handle lost".into()))?;
            read_buffered(&handle.file, region, r.offset).map_err(|e| err(e.to_string()))?
        };
        if (got as u64) < wanted {
            return Err(StoreError::ShortRead {
                drive: self.ctx.drive,
                path,
                offset: r.offset,
                wanted,
                got: got as u64,
            });
        }
        Ok(())
    }

    /// A direct read into `region` (aligned, whole blocks); falls back to
    /// buffered reads for good when the file system refuses the read.
    fn direct_into(
        &mut self,
        name: &str,
        path: &Path,
        region: &mut [u8],
        offset: u64,
    ) -> std::io::Result<usize> {
        let handle = self
            .files
            .get_mut(name)
            .ok_or_else(|| std::io::Error::other("file handle lost"))?;
        match read_direct(&handle.file, region, offset) {
            Err(e) if crate::platform::refuses_uncached(&e) => {
                // Some file systems accept uncached reads at open but refuse the read.
                warn_buffered(self.ctx, path);
                *handle = open_buffered(path)?;
                read_buffered(&handle.file, region, offset)
            }
            other => other,
        }
    }

    /// The reader's bounce buffer (at least `len` bytes), taken out until
    /// the read is done.
    fn take_bounce(&mut self, len: usize) -> Result<AlignedBytes, crate::aligned::AllocError> {
        match self.bounce.take() {
            Some(b) if b.capacity() >= len => Ok(b),
            _ => AlignedBytes::zeroed(len, DIRECT_IO_BLOCK),
        }
    }
}

fn open(ctx: &Context, path: &Path) -> std::io::Result<Handle> {
    if ctx.direct_io {
        match crate::platform::open_uncached(path) {
            Ok(file) => return Ok(Handle { file, direct: true }),
            Err(e) if crate::platform::refuses_uncached(&e) => warn_buffered(ctx, path),
            Err(e) => return Err(e),
        }
    }
    open_buffered(path)
}

fn open_buffered(path: &Path) -> std::io::Result<Handle> {
    Ok(Handle {
        file: crate::regular::open(path)?,
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

/// Reads whole blocks into `region` (aligned, a multiple of the block size)
/// until it is full or the file ends; returns the bytes read.
fn read_direct(file: &File, region: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < region.len() {
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
    Ok(got)
}

/// Reads until `region` is full or the file ends; returns the bytes read.
fn read_buffered(file: &File, region: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < region.len() {
        let n = file.read_at(&mut region[got..], offset + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}
