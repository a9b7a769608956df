//! Read errors per drive folder since the service started, over every
//! model load.
//!
//! An engine's counters start at zero, and the runner drops the engine when
//! a read fault pauses its job (to check the drives afresh on resume): the
//! errors of an EIO storm lived a fraction of a second between metric
//! samples, and the drives view read "0 errors" through it. The ledger takes
//! each engine's counts once a second and once more as it is dropped, and
//! adds them to those of the engines before.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use longhaul_engine::tools::DriveSnapshot;

#[derive(Default)]
pub struct ErrorLedger {
    tallies: Mutex<HashMap<PathBuf, Tally>>,
}

#[derive(Default, Clone, Copy)]
struct Tally {
    /// Errors counted by engines before the current one.
    before: u64,
    /// The current engine's count at the last look, and which load it is.
    seen: u64,
    load: usize,
    last_at: Option<f64>,
}

impl ErrorLedger {
    /// Takes in load `load`'s error count for each drive at `now` (seconds
    /// since the epoch).
    pub fn observe(&self, load: usize, drives: &[DriveSnapshot], now: f64) {
        let Ok(mut t) = self.tallies.lock() else {
            return;
        };
        for d in drives {
            let tally = t.entry(d.path.clone()).or_default();
            if tally.load != load {
                tally.before += tally.seen;
                tally.seen = 0;
                tally.load = load;
            }
            if d.errors > tally.seen {
                tally.last_at = Some(now);
            }
            tally.seen = tally.seen.max(d.errors);
        }
    }

    /// Errors on `path` since the start, and when the last was seen.
    pub fn get(&self, path: &Path) -> (u64, Option<f64>) {
        self.tallies
            .lock()
            .ok()
            .and_then(|t| t.get(path).map(|t| (t.before + t.seen, t.last_at)))
            .unwrap_or((0, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drive(path: &str, errors: u64) -> DriveSnapshot {
        DriveSnapshot {
            path: PathBuf::from(path),
            errors,
            ..DriveSnapshot::default()
        }
    }

    #[test]
    fn errors_add_up_over_loads_and_remember_when() {
        let l = ErrorLedger::default();
        l.observe(1, &[drive("/a", 0)], 10.0);
        assert_eq!(l.get(Path::new("/a")), (0, None));
        l.observe(1, &[drive("/a", 5)], 11.0);
        l.observe(1, &[drive("/a", 5)], 12.0);
        assert_eq!(l.get(Path::new("/a")), (5, Some(11.0)));
        // The model reloaded: its counters start again at zero.
        l.observe(2, &[drive("/a", 0)], 13.0);
        assert_eq!(l.get(Path::new("/a")), (5, Some(11.0)));
        l.observe(2, &[drive("/a", 2)], 14.0);
        assert_eq!(l.get(Path::new("/a")), (7, Some(14.0)));
        assert_eq!(l.get(Path::new("/b")), (0, None));
    }
}
