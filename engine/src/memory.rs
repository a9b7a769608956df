//! How much memory the process may use, and what the kernel reports about
//! its use: the limit a budget is planned against, and the signs (reclaim
//! passes, major faults) that a run pressed on it.
//!
//! The limit is the smaller of physical memory and, on Linux, the memory
//! cgroup's limit, which counts the page cache too: reading through the page
//! cache under a limit makes the kernel reclaim pages all the time, which is
//! why expert reads bypass it.

/// Bytes of physical memory, if the system says.
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

/// The memory cgroup's limit on this process (page cache included), if one is set.
pub fn cgroup_limit_bytes() -> Option<u64> {
    cgroup::read_u64("memory.limit_in_bytes", "memory.max")
        // v1 reports "no limit" as a huge page-aligned number.
        .filter(|&l| l < (1 << 60))
}

/// Times the cgroup's limit was reached (each one a reclaim pass), if known.
pub fn cgroup_limit_hits() -> Option<u64> {
    cgroup::read_u64("memory.failcnt", "").or_else(cgroup::v2_max_events)
}

/// What the process may use: the smaller of physical memory and its cgroup limit.
pub fn available_limit_bytes() -> Option<u64> {
    match (physical_bytes(), cgroup_limit_bytes()) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    }
}

/// Major page faults and peak resident set size of this process so far.
pub fn usage() -> ProcessUsage {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } == 0;
    if !ok {
        return ProcessUsage::default();
    }
    // ru_maxrss is in KiB on Linux and in bytes on macOS.
    let rss_unit = if cfg!(target_os = "macos") { 1 } else { 1024 };
    ProcessUsage {
        major_faults: Some(u.ru_majflt as u64),
        peak_rss_bytes: Some(u.ru_maxrss as u64 * rss_unit),
    }
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, PartialEq, Eq)]
pub struct ProcessUsage {
    pub major_faults: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
}

#[cfg(target_os = "linux")]
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

#[cfg(not(target_os = "linux"))]
mod cgroup {
    pub fn read_u64(_: &str, _: &str) -> Option<u64> {
        None
    }

    pub fn v2_max_events() -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_has_memory_and_the_process_uses_some() {
        let limit = available_limit_bytes().unwrap();
        assert!(limit > 64 << 20);
        assert!(usage().peak_rss_bytes.unwrap() > 0);
    }
}
