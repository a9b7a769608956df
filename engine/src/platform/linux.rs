//! Linux's side of the platform seam (see the table in `platform`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;

/// `ru_maxrss` is in KiB on Linux.
pub const PEAK_RSS_UNIT: u64 = 1024;

/// `open(2)` with `O_DIRECT`: reads go from the drive to the buffer, which
/// must be aligned to the drive's block (the store's buffers are).
pub fn open_uncached(path: &Path) -> io::Result<File> {
    crate::regular::open_with(path, libc::O_DIRECT)
}

/// Some file systems (tmpfs, some FUSE ones) refuse `O_DIRECT` with
/// `EINVAL`, at open or only at the first read.
pub fn refusal(errno: i32) -> bool {
    errno == libc::EINVAL
}

/// `posix_fadvise(POSIX_FADV_DONTNEED)`: a memory cgroup counts the page
/// cache against the process, so a checkpoint read while packing must not
/// stay there.
pub fn forget_cached(file: &File) {
    // SAFETY: a valid open descriptor; the call only gives advice.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Huge pages: buffers this large are placed on a 2 MiB boundary and the
/// kernel is asked to back them with huge pages (transparent huge pages are
/// commonly "madvise"). Decoding streams every weight from DRAM each token,
/// and with 4 KiB pages the page walks take a share of it: a decode step's
/// 192 experts from DRAM took 18.3 ms against 18.8 ms, a small gain near
/// the measuring machine's run-to-run noise.
const HUGE_PAGE: usize = 2 << 20;

/// `mmap(2)` of private anonymous memory; from [`HUGE_PAGE`] on, on a huge
/// page boundary with `madvise(MADV_HUGEPAGE)`.
pub fn map_anonymous(len: usize) -> Option<NonNull<u8>> {
    if len < HUGE_PAGE {
        return map_pages(len);
    }
    let padded = len.checked_add(HUGE_PAGE)?;
    let base = map_pages(padded)?.as_ptr() as usize;
    let start = base.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (start - base, base + padded - (start + len));
    // SAFETY: both ranges lie in the mapping just made and nothing uses them.
    unsafe {
        if head > 0 {
            libc::munmap(base as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
        // Advice only: without huge pages the buffer works the same.
        libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    NonNull::new(start as *mut u8)
}

fn map_pages(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping with no address hint; the result
    // is checked before use.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(raw.cast())
}

/// `sysconf(_SC_PHYS_PAGES)` pages of `_SC_PAGESIZE` bytes.
pub fn physical_bytes() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && size > 0).then(|| pages as u64 * size as u64)
}

/// The memory cgroup's limit (v1 `memory.limit_in_bytes`, v2 `memory.max`),
/// which counts the page cache too.
pub fn memory_bound_bytes() -> Option<u64> {
    cgroup::read_u64("memory.limit_in_bytes", "memory.max")
        // v1 reports "no limit" as a huge page-aligned number.
        .filter(|&l| l < (1 << 60))
}

/// The cgroup's limit when one is set (it is what the kernel enforces),
/// else `share`.
pub fn plan_limit(share: Option<u64>) -> Option<u64> {
    memory_bound_bytes().or(share)
}

/// The cgroup's `memory.failcnt` (v1) or `max` events (v2).
pub fn memory_bound_hits() -> Option<u64> {
    cgroup::read_u64("memory.failcnt", "").or_else(cgroup::v2_max_events)
}

/// No signal: expert reads bypass the page cache and the plan keeps within
/// the cgroup's limit, so reading ahead adds nothing the plan did not count.
pub fn memory_pressed() -> bool {
    false
}

/// `setpriority(PRIO_PROCESS, gettid(), 19)`: on Linux a thread's nice
/// value is its own, and 19 weighs 15 against 1024 at nice 0.
pub fn lower_thread_priority() {
    /// The weakest nice value.
    const NICEST: libc::c_int = 19;
    // SAFETY: plain system calls on the calling thread.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICEST);
    }
}

mod cgroup {
    use std::path::PathBuf;

    /// This process's memory cgroup folder: `(v1 path, v2 path)`.
    fn dirs() -> (Option<PathBuf>, Option<PathBuf>) {
        let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
            return (None, None);
        };
        let (mut v1, mut v2) = (None, None);
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            let (Some(controllers), Some(path)) = (controllers, path) else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            if controllers.split(',').any(|c| c == "memory") {
                v1 = Some(PathBuf::from("/sys/fs/cgroup/memory").join(rel));
            } else if controllers.is_empty() {
                v2 = Some(PathBuf::from("/sys/fs/cgroup").join(rel));
            }
        }
        (v1, v2)
    }

    fn read(path: PathBuf) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    /// A number from the v1 file `v1_name`, or else from the v2 file `v2_name`.
    pub fn read_u64(v1_name: &str, v2_name: &str) -> Option<u64> {
        let (v1, v2) = dirs();
        let from_v1 = v1.and_then(|d| read(d.join(v1_name)));
        let from_v2 = || (!v2_name.is_empty()).then(|| v2.and_then(|d| read(d.join(v2_name))))?;
        from_v1.or_else(from_v2)?.trim().parse().ok()
    }

    /// cgroup v2: how often usage hit `memory.max`.
    pub fn v2_max_events() -> Option<u64> {
        let (_, v2) = dirs();
        let text = read(v2?.join("memory.events"))?;
        text.lines()
            .find_map(|l| l.strip_prefix("max "))
            .and_then(|n| n.trim().parse().ok())
    }
}
