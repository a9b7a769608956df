//! The seam between the engine and the operating system: Linux, where
//! Longhaul is built and measured, and macOS, the product's platform.
//! Everything that differs between them is answered here, one function
//! per need, each side documented with the system call it makes and why;
//! the rest of the engine calls these and names no operating system.
//!
//! | need | Linux | macOS |
//! |---|---|---|
//! | expert reads that bypass the page cache | `open(O_DIRECT)` | `fcntl(F_NOCACHE)` |
//! | a checkpoint's pages let go after packing | `posix_fadvise(DONTNEED)` | nothing (no cgroup counts them) |
//! | large buffers on large pages | `madvise(MADV_HUGEPAGE)` | nothing (16 KiB pages on Apple Silicon) |
//! | background threads out of the way | `setpriority` on the thread | `pthread_set_qos_class_self_np(UTILITY)` |
//! | the memory a run may plan for | the memory cgroup's limit | what the VM reports free and reclaimable |
//! | a signal to stop reading ahead | none (the cgroup's limit is planned for) | `kern.memorystatus_vm_pressure_level` |
//! | peak resident set size | `ru_maxrss` in KiB | `ru_maxrss` in bytes |

use std::fs::File;
use std::io;
use std::path::Path;
use std::ptr::NonNull;

#[cfg(target_os = "linux")]
#[path = "linux.rs"]
mod os;
#[cfg(target_os = "macos")]
#[path = "macos.rs"]
mod os;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!("Longhaul runs on Linux and macOS");

pub use os::{PEAK_RSS_UNIT, memory_pressed};

/// Opens `path` (a regular file) for reads that bypass the page cache: an
/// expert is read once into the memory that holds it, and through the
/// page cache it would take RAM twice and, under a limit that counts the
/// cache, make the kernel reclaim all the time.
pub fn open_uncached(path: &Path) -> io::Result<File> {
    os::open_uncached(path)
}

/// Whether `e` is a file system refusing uncached reads (at open or at the
/// read): the store then reads through the page cache.
pub fn refuses_uncached(e: &io::Error) -> bool {
    e.raw_os_error().is_some_and(os::refusal)
}

/// Lets go of the page cache's copy of `file`, where a memory limit counts
/// it. A hint: nothing fails if it is ignored.
pub fn forget_cached(file: &File) {
    os::forget_cached(file)
}

/// `len` zeroed bytes of private anonymous memory, page-aligned (large
/// buffers on large pages where the system offers them).
pub fn map_anonymous(len: usize) -> Option<NonNull<u8>> {
    os::map_anonymous(len)
}

/// Returns a mapping made by [`map_anonymous`] to the system.
///
/// # Safety
/// `ptr` and `len` must be a mapping [`map_anonymous`] returned, not yet
/// unmapped, that nothing refers to any more.
pub unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: the caller's promise.
    unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
}

/// The size of a memory page.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// Bytes of physical memory, if the system says.
pub fn physical_bytes() -> Option<u64> {
    os::physical_bytes()
}

/// The bound the system sets on this process's memory beyond physical
/// memory, if it sets one.
pub fn memory_bound_bytes() -> Option<u64> {
    os::memory_bound_bytes()
}

/// The memory a run plans for by default, given `share`, the share of
/// physical memory Longhaul takes when nothing else bounds it.
pub fn plan_limit(share: Option<u64>) -> Option<u64> {
    os::plan_limit(share)
}

/// Times the process's memory bound was reached (each a reclaim pass), if
/// the system counts them.
pub fn memory_bound_hits() -> Option<u64> {
    os::memory_bound_hits()
}

/// Lowers the calling thread to the lowest scheduling priority: it then
/// runs on what the compute threads leave idle. Failure leaves the
/// priority as it was, which is only slower.
pub fn lower_thread_priority() {
    os::lower_thread_priority()
}

/// Pages the macOS VM reports that a process could have without anything
/// being written out: free (speculative read-ahead included), file-backed
/// (clean cache, dropped and read again if needed) and purgeable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub(crate) struct VmPages {
    pub free: u64,
    pub file_backed: u64,
    pub purgeable: u64,
}

/// The bytes of `pages`, in pages of `page` bytes.
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub(crate) fn reclaimable_bytes(pages: VmPages, page: u64) -> u64 {
    (pages.free + pages.file_backed + pages.purgeable).saturating_mul(page)
}

/// `kern.memorystatus_vm_pressure_level`'s warning (2) and critical (4),
/// against normal (1) (`<sys/kern_memorystatus.h>`).
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub(crate) fn pressure_level_is_high(level: i32) -> bool {
    level >= 2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In pages of Apple Silicon's 16 KiB.
    #[test]
    fn reclaimable_memory_counts_free_cache_and_purgeable_pages() {
        let pages = VmPages {
            free: 7_500,
            file_backed: 250_000,
            purgeable: 3_000,
        };
        assert_eq!(reclaimable_bytes(pages, 16384), 260_500 * 16384);
        let none = VmPages {
            free: 0,
            file_backed: 0,
            purgeable: 0,
        };
        assert_eq!(reclaimable_bytes(none, 16384), 0);
    }

    #[test]
    fn only_warning_and_critical_pressure_stop_reading_ahead() {
        assert!(!pressure_level_is_high(1));
        assert!(pressure_level_is_high(2) && pressure_level_is_high(4));
    }

    #[test]
    fn a_buffer_maps_and_unmaps() {
        let len = 4 << 20;
        let ptr = map_anonymous(len).unwrap();
        assert_eq!(ptr.as_ptr() as usize % page_size(), 0);
        // SAFETY: just mapped, `len` bytes, unused.
        unsafe {
            ptr.as_ptr().add(len - 1).write(7);
            unmap(ptr, len);
        }
    }
}
