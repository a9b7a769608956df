//! Measured read latencies: the last reads' own times, not histogram buckets.
//!
//! Power-of-two buckets reported a bucket's upper edge, so every drive of a
//! pack read "1.02 ms" at p50 whatever it did, and a drive whose reads all
//! failed at once had a latency too. The window keeps the times of the last
//! [`LATENCY_WINDOW`] successful reads (4 bytes each: 8 KiB per drive), and
//! percentiles are taken over the reads since the previous sample, by rank
//! on the sorted times — each one a time some read took.

use std::sync::Mutex;

/// Successful reads whose times are kept per drive. At 1 MiB per read and
/// 3 GB/s this is the last 0.7 s of reading; at one sample a second, a
/// drive read faster than that has its percentiles from its last 2,048 reads.
pub const LATENCY_WINDOW: usize = 2048;

/// The times of the last reads, oldest overwritten first.
#[derive(Debug, Default)]
pub struct LatencyWindow {
    inner: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    micros: Vec<u32>,
    /// Reads recorded ever; `recorded % LATENCY_WINDOW` is the next slot.
    recorded: u64,
}

impl LatencyWindow {
    /// Records one successful read's time.
    pub fn record(&self, micros: u64) {
        let Ok(mut r) = self.inner.lock() else {
            return;
        };
        let value = u32::try_from(micros).unwrap_or(u32::MAX);
        let slot = (r.recorded % LATENCY_WINDOW as u64) as usize;
        if r.micros.len() < LATENCY_WINDOW {
            r.micros.push(value);
        } else {
            r.micros[slot] = value;
        }
        r.recorded += 1;
    }

    /// The kept times, oldest first, and how many reads were ever recorded.
    pub fn copy(&self) -> Latencies {
        let Ok(r) = self.inner.lock() else {
            return Latencies::default();
        };
        let mut micros = r.micros.clone();
        if micros.len() == LATENCY_WINDOW {
            micros.rotate_left((r.recorded % LATENCY_WINDOW as u64) as usize);
        }
        Latencies {
            micros,
            recorded: r.recorded,
        }
    }
}

/// A copy of a drive's latency window.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Latencies {
    /// Times of the last successful reads in microseconds, oldest first.
    pub micros: Vec<u32>,
    /// Successful reads recorded since the drive's readers started.
    pub recorded: u64,
}

impl Latencies {
    /// Percentiles (each `q` in 0–1) in milliseconds over the reads recorded
    /// after `since` reads (as many of them as the window still holds), by
    /// nearest rank; `None` when no read finished since.
    pub fn quantiles_ms_since(&self, since: u64, qs: &[f64]) -> Option<Vec<f64>> {
        let fresh = self
            .recorded
            .saturating_sub(since)
            .min(self.micros.len() as u64) as usize;
        if fresh == 0 {
            return None;
        }
        let mut recent = self.micros[self.micros.len() - fresh..].to_vec();
        recent.sort_unstable();
        Some(
            qs.iter()
                .map(|q| {
                    let rank = (q.clamp(0.0, 1.0) * fresh as f64).ceil().max(1.0) as usize;
                    f64::from(recent[rank.min(fresh) - 1]) / 1000.0
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_times_reads_took_since_the_last_sample() {
        let w = LatencyWindow::default();
        for us in [900, 1100, 1300, 5000] {
            w.record(us);
        }
        let first = w.copy();
        assert_eq!(
            first.quantiles_ms_since(0, &[0.5, 0.99]),
            Some(vec![1.1, 5.0])
        );
        // Nothing read since: no figure, not the old one.
        assert_eq!(first.quantiles_ms_since(first.recorded, &[0.5]), None);
        w.record(250);
        w.record(350);
        let second = w.copy();
        assert_eq!(
            second.quantiles_ms_since(first.recorded, &[0.5, 1.0]),
            Some(vec![0.25, 0.35])
        );
    }

    #[test]
    fn the_window_keeps_the_newest_reads_in_order() {
        let w = LatencyWindow::default();
        for i in 0..(LATENCY_WINDOW as u64 + 10) {
            w.record(i);
        }
        let l = w.copy();
        assert_eq!(l.micros.len(), LATENCY_WINDOW);
        assert_eq!(l.micros[0], 10);
        assert_eq!(*l.micros.last().unwrap(), LATENCY_WINDOW as u32 + 9);
        // Asked since before the window began: the whole window, no more.
        let q = l.quantiles_ms_since(0, &[0.0]).unwrap();
        assert_eq!(q, vec![0.010]);
    }
}
