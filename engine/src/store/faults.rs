//! Failure points for the drive readers, switched on by tests (and by the
//! service's `LONGHAUL_FAULTS`) so that I/O errors, short reads and slow
//! drives are exercised in CI, not only by pulling a drive by hand. Off
//! (the default, no [`StoreFaults`] at all), a read pays nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Faults the readers apply to every read while they are set.
#[derive(Debug, Default)]
pub struct StoreFaults {
    io_error: AtomicBool,
    short_read: AtomicBool,
    delay_micros: AtomicU64,
}

/// What a read should suffer.
pub(super) enum Injected {
    None,
    IoError,
    ShortRead,
}

impl StoreFaults {
    /// Every read fails as with EIO.
    pub fn set_io_error(&self, on: bool) {
        self.io_error.store(on, Ordering::SeqCst);
    }

    /// Every read returns half of what it asked for.
    pub fn set_short_read(&self, on: bool) {
        self.short_read.store(on, Ordering::SeqCst);
    }

    /// Every read first waits `delay` (a slow drive).
    pub fn set_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.delay_micros.store(micros, Ordering::SeqCst);
    }

    /// Waits out the delay, then says what else to do to this read.
    pub(super) fn before_read(&self) -> Injected {
        let micros = self.delay_micros.load(Ordering::SeqCst);
        if micros > 0 {
            std::thread::sleep(Duration::from_micros(micros));
        }
        if self.io_error.load(Ordering::SeqCst) {
            Injected::IoError
        } else if self.short_read.load(Ordering::SeqCst) {
            Injected::ShortRead
        } else {
            Injected::None
        }
    }
}
