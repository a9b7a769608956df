//! Which job the service was running when it crashed.
//!
//! Interrupted jobs resume first at the next start, so a job that crashes
//! the service (an abort, an illegal instruction) would crash every restart,
//! and the desktop app restarts the service forever. A kill (SIGKILL, the
//! OOM killer, a power cut) leaves no trace and the job resumes as ever; a
//! crash is caught by a signal handler that writes the running jobs' ids to
//! `crash` in the data dir before the process dies (one line each: jobs
//! decoding together crash together), and the next start counts it against
//! each of them; they then run alone until they end, so the one at fault is
//! found and the others go on. The handler only uses async-signal-safe calls (`pwrite`,
//! `fsync`, `raise`) on a file opened in advance.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicI64, Ordering};

/// The crash record's name inside the data dir.
pub const CRASH_FILE: &str = "crash";
/// Signals a crash dies of: `abort` (failed allocations, panics that
/// abort, Rust's stack-overflow report) and illegal instructions.
#[cfg(unix)]
const FATAL_SIGNALS: [libc::c_int; 2] = [libc::SIGABRT, libc::SIGILL];

static FILE: AtomicI32 = AtomicI32::new(-1);
/// Jobs running at once, at most (see the runner's `together`).
pub const MAX_RUNNING: usize = 16;
/// The running jobs' ids, 0 in a free slot.
static JOBS: [AtomicI64; MAX_RUNNING] = [const { AtomicI64::new(0) }; MAX_RUNNING];

/// A crash the previous service left on record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    /// The jobs that were running.
    pub jobs: Vec<i64>,
    pub signal: String,
}

/// Reads and clears the record a crashed service left in `data_dir`.
pub fn take_last(data_dir: &Path) -> Option<Crash> {
    let path = record_path(data_dir);
    let text = std::fs::read_to_string(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    let mut lines = text.lines().filter_map(|line| {
        let mut words = line.split_whitespace();
        Some((
            words.next()?.parse::<i64>().ok()?,
            words.next()?.parse::<i32>().ok()?,
        ))
    });
    let (first, signal) = lines.next()?;
    let jobs = std::iter::once(first)
        .chain(lines.map(|(job, _)| job))
        .collect();
    let signal = match signal {
        #[cfg(unix)]
        libc::SIGABRT => "abort (SIGABRT)".to_string(),
        #[cfg(unix)]
        libc::SIGILL => "illegal instruction (SIGILL)".to_string(),
        other => format!("signal {other}"),
    };
    Some(Crash { jobs, signal })
}

fn record_path(data_dir: &Path) -> PathBuf {
    data_dir.join(CRASH_FILE)
}

/// Opens the record file and installs the handlers, once per process.
#[cfg(unix)]
pub fn install(data_dir: &Path) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let file = crate::data_dir::private_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(record_path(data_dir))?;
    // Empty until a crash; an empty record is no record.
    let old = FILE.swap(file.into_raw_fd(), Ordering::SeqCst);
    if old >= 0 {
        // SAFETY: `old` came from `into_raw_fd` and nothing else owns it.
        unsafe { libc::close(old) };
    }
    for signal in FATAL_SIGNALS {
        // SAFETY: a zeroed sigaction with a plain handler is valid; the
        // handler only makes async-signal-safe calls.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fatal_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

#[cfg(not(unix))]
pub fn install(_data_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Marks `job` as running (with any others).
pub fn started(job: i64) {
    for slot in &JOBS {
        if slot
            .compare_exchange(0, job, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

/// Marks `job` as no longer running.
pub fn ended(job: i64) {
    for slot in &JOBS {
        let _ = slot.compare_exchange(job, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

#[cfg(unix)]
extern "C" fn on_fatal_signal(signal: libc::c_int) {
    let fd = FILE.load(Ordering::SeqCst);
    let mut buf = [0u8; 48 * MAX_RUNNING];
    let mut len = 0;
    for slot in &JOBS {
        let job = slot.load(Ordering::SeqCst);
        if job > 0 {
            len += write_decimal(&mut buf[len..len + 20], job);
            buf[len] = b' ';
            len += 1;
            len += write_decimal(&mut buf[len..len + 20], i64::from(signal));
            buf[len] = b'\n';
            len += 1;
        }
    }
    if fd >= 0 && len > 0 {
        // SAFETY: pwrite and fsync are async-signal-safe; `buf` is ours.
        unsafe {
            libc::pwrite(fd, buf.as_ptr().cast(), len, 0);
            libc::fsync(fd);
        }
    }
    // SA_RESETHAND restored the default action: die of the same signal.
    // SAFETY: raise is async-signal-safe.
    unsafe {
        libc::raise(signal);
    }
}

/// Writes `n`'s magnitude in decimal without allocating; returns the length
/// (0, writing nothing, when `buf` is too short).
fn write_decimal(buf: &mut [u8], n: i64) -> usize {
    let mut digits = [0u8; 20];
    let (mut n, mut count) = (n.unsigned_abs(), 0);
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if count > buf.len() {
        return 0;
    }
    for i in 0..count {
        buf[i] = digits[count - 1 - i];
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_written_without_allocating() {
        let mut buf = [0u8; 20];
        for n in [0i64, 7, 10, 1234567890123, i64::MAX] {
            let len = write_decimal(&mut buf, n);
            assert_eq!(std::str::from_utf8(&buf[..len]).unwrap(), n.to_string());
        }
    }

    #[test]
    fn a_record_names_the_job_and_signal_once() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(take_last(dir.path()), None);
        std::fs::write(record_path(dir.path()), "42 6\n").unwrap();
        let crash = take_last(dir.path()).unwrap();
        assert_eq!(crash.jobs, vec![42]);
        assert!(crash.signal.contains("SIGABRT"), "{}", crash.signal);
        assert_eq!(take_last(dir.path()), None, "a record is read once");
        std::fs::write(record_path(dir.path()), "").unwrap();
        assert_eq!(take_last(dir.path()), None, "an empty record is none");
        std::fs::write(record_path(dir.path()), "7 4\n9 4\n").unwrap();
        assert_eq!(
            take_last(dir.path()).unwrap().jobs,
            vec![7, 9],
            "jobs together"
        );
    }
}
