//! macOS's side of the platform seam (see the table in `platform`). None of
//! it runs on the machines Longhaul is built and tested on: it is checked
//! by cross-compiling for `aarch64-apple-darwin`, and its arithmetic by the
//! tests in `platform` (see the README's platform table).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;

use super::{VmPages, reclaimable_bytes};

/// `ru_maxrss` is in bytes on macOS.
pub const PEAK_RSS_UNIT: u64 = 1;

/// `fcntl(F_NOCACHE, 1)` on a plain descriptor: macOS has no `O_DIRECT`;
/// with `F_NOCACHE` reads go from the drive to the buffer (aligned
/// requests skip the unified buffer cache; the store's are aligned) and
/// nothing read stays cached. `F_RDADVISE` is not used for the pilot's
/// guesses: it reads ahead into the buffer cache, where a later
/// `F_NOCACHE` read takes and keeps those pages, and the pilot's
/// prefetches are already real reads into the cache's own buffers.
pub fn open_uncached(path: &Path) -> io::Result<File> {
    let file = crate::regular::open_with(path, 0)?;
    // SAFETY: a descriptor this function owns; F_NOCACHE takes an int.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// A file system that does not take `F_NOCACHE` (some network and FUSE
/// ones) answers `EINVAL` or `ENOTSUP`.
pub fn refusal(errno: i32) -> bool {
    errno == libc::EINVAL || errno == libc::ENOTSUP
}

/// Nothing: macOS sets no per-process bound that counts the unified buffer
/// cache, and the cache gives its pages up under pressure on its own.
pub fn forget_cached(_: &File) {}

/// `mmap(2)` of private anonymous memory. Apple Silicon's pages are
/// 16 KiB, and anonymous memory gets no larger pages on request, so there
/// is no advice to give.
pub fn map_anonymous(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping with no address hint; the result
    // is checked before use.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANON,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(raw.cast())
}

/// `sysctlbyname` of a number the kernel keeps as a C integer of `T`'s width.
fn sysctl<T: Copy + Default>(name: &CStr) -> Option<T> {
    let mut value = T::default();
    let mut size = std::mem::size_of::<T>();
    // SAFETY: `value` is a writable `T` of `size` bytes; the kernel writes
    // at most `size` bytes and says how many it wrote.
    let rc = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            (&raw mut value).cast(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0 && size == std::mem::size_of::<T>()).then_some(value)
}

/// `hw.memsize`: bytes of physical memory.
pub fn physical_bytes() -> Option<u64> {
    sysctl::<u64>(c"hw.memsize").filter(|&b| b > 0)
}

/// None: macOS has no memory cgroup; what others use is in [`plan_limit`].
pub fn memory_bound_bytes() -> Option<u64> {
    None
}

/// The share of physical memory, but no more than the VM reports free or
/// reclaimable without writing anything out now (`vm.page_free_count` and
/// `vm.page_speculative_count`, `vm.page_pageable_external_count`: the
/// file cache, and `vm.page_purgeable_count`, in pages of `hw.pagesize`):
/// on a Mac whose other applications hold most of the memory, planning
/// for a share of it would make the system compress and swap them. Read
/// by `sysctlbyname`, not `host_statistics64`: the `vm_statistics64` the
/// `libc` crate declares is longer than current kernels fill, and Mach's
/// host port is deprecated there.
pub fn plan_limit(share: Option<u64>) -> Option<u64> {
    // A count the kernel does not give leaves the share as it is.
    let Some(reclaimable) = reclaimable_now() else {
        return share;
    };
    Some(share.map_or(reclaimable, |s| s.min(reclaimable)))
}

fn reclaimable_now() -> Option<u64> {
    let pages = VmPages {
        free: u64::from(sysctl::<u32>(c"vm.page_free_count")?)
            + u64::from(sysctl::<u32>(c"vm.page_speculative_count").unwrap_or(0)),
        file_backed: sysctl::<u32>(c"vm.page_pageable_external_count")?.into(),
        purgeable: sysctl::<i32>(c"vm.page_purgeable_count")?
            .try_into()
            .unwrap_or(0),
    };
    let page = sysctl::<u64>(c"hw.pagesize").or_else(|| u64::try_from(super::page_size()).ok())?;
    Some(reclaimable_bytes(pages, page))
}

/// None: no cgroup counts reclaim passes.
pub fn memory_bound_hits() -> Option<u64> {
    None
}

/// How often the pressure level is read again: a prefetch decision is
/// made per layer (hundreds a second), the level moves in seconds.
const PRESSURE_REFRESH: std::time::Duration = std::time::Duration::from_millis(250);

/// `kern.memorystatus_vm_pressure_level` at warning (2) or critical (4):
/// the level Activity Monitor draws yellow and red, before the system
/// swaps. Read at most every [`PRESSURE_REFRESH`].
pub fn memory_pressed() -> bool {
    use std::sync::Mutex;
    static LAST: Mutex<Option<(std::time::Instant, bool)>> = Mutex::new(None);
    let Ok(mut last) = LAST.lock() else {
        return false;
    };
    if let Some((at, pressed)) = *last
        && at.elapsed() < PRESSURE_REFRESH
    {
        return pressed;
    }
    let pressed = sysctl::<i32>(c"kern.memorystatus_vm_pressure_level")
        .is_some_and(super::pressure_level_is_high);
    *last = Some((std::time::Instant::now(), pressed));
    pressed
}

/// `pthread_set_qos_class_self_np(QOS_CLASS_UTILITY)`: macOS schedules
/// threads by quality of service, and utility work yields to the
/// user-initiated compute threads (and may go to efficiency cores).
pub fn lower_thread_priority() {
    // SAFETY: sets the calling thread's own quality of service.
    unsafe {
        libc::pthread_set_qos_class_self_np(libc::qos_class_t::QOS_CLASS_UTILITY, 0);
    }
}
