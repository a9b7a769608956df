//! The packed cache: keeping compressed expert records as the pack stores
//! them and restoring them at each use, so that a budget holds more experts
//! (1.19 times on the peers' F16 model, 1.43 on a BF16 one), and weighing
//! as decoding goes whether that pays: every hit then costs a restore on
//! the model's thread (1–2.5 GB/s of one core here), which a drive-bound
//! decode hides and a compute-bound one does not.

use crate::pack::Manifest;
use crate::pack::manifest::Record;
use crate::store::DIRECT_IO_BLOCK;

use super::streaming::StreamingOptions;

/// Packed records are held in buffers rounded up to a 64th of their plain
/// size (in whole direct-I/O blocks), so that a layer's records, each
/// compressed to its own length, share a few buffer sizes (the pool reuses
/// buffers by size) at a cost of under 1 % of their bytes on average.
const PACKED_CLASSES: u64 = 64;

/// The buffer size a packed record of `stored` bytes (`plain` restored) is held in.
pub(super) fn packed_class(stored: u64, plain: u64) -> u64 {
    let step = (plain / PACKED_CLASSES).next_multiple_of(DIRECT_IO_BLOCK as u64);
    stored.next_multiple_of(step.max(DIRECT_IO_BLOCK as u64))
}

/// Whether `record` is kept packed by a cache that keeps records packed:
/// compressed, and smaller so.
pub(super) fn keeps_packed(record: &Record) -> bool {
    record.stored_len.is_some()
        && packed_class(record.stored(), record.len)
            < record.len.next_multiple_of(DIRECT_IO_BLOCK as u64)
}

/// Whether the cache may keep compressed records packed and restore them at
/// each use: when they are kept at their stored width (restoring gives back
/// exactly those bytes) and the budget cannot hold every expert's weights.
/// Whether it does is weighed as it runs (see [`weigh`]).
pub(super) fn packs_records(manifest: &Manifest, options: &StreamingOptions) -> bool {
    options.keep_stored_dtype
        && options.pack_cache
        && manifest.records().any(keeps_packed)
        && options.budget_bytes < manifest.plain_expert_bytes()
}

/// Counters at one moment, to measure a window of decoding.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tally {
    pub seconds: f64,
    /// The model waiting for reads, and restoring hits itself.
    pub stall: f64,
    pub model_restore: f64,
    /// Restoring by anyone, and the plain bytes restored.
    pub restore: f64,
    pub restored_bytes: u64,
    /// Bytes read from the drives and the time some drive was reading.
    pub drive_bytes: u64,
    pub drive_busy: f64,
    pub lookups: u64,
    pub passes: u64,
}

impl Tally {
    fn since(&self, e: &Tally) -> Tally {
        Tally {
            seconds: self.seconds - e.seconds,
            stall: self.stall - e.stall,
            model_restore: self.model_restore - e.model_restore,
            restore: self.restore - e.restore,
            restored_bytes: self.restored_bytes.saturating_sub(e.restored_bytes),
            drive_bytes: self.drive_bytes.saturating_sub(e.drive_bytes),
            drive_busy: self.drive_busy - e.drive_busy,
            lookups: self.lookups.saturating_sub(e.lookups),
            passes: self.passes.saturating_sub(e.passes),
        }
    }

    fn add(&mut self, d: &Tally) {
        self.seconds += d.seconds;
        self.stall += d.stall;
        self.model_restore += d.model_restore;
        self.restore += d.restore;
        self.restored_bytes += d.restored_bytes;
        self.drive_bytes += d.drive_bytes;
        self.drive_busy += d.drive_busy;
        self.lookups += d.lookups;
        self.passes += d.passes;
    }
}

/// Rows one expert may take in a pass's first lookup for the pass to count
/// as decoding (a few answers together, or a token and its guesses), not as
/// a prompt: prompts compute far longer per pass and would hide the costs.
const DECODE_ROWS: u64 = 16;

/// Sums the decode passes since the last weighing.
#[derive(Debug, Default)]
pub(super) struct PackMeter {
    /// Counters when the current pass began, and whether it is a decode pass.
    current: Option<(Tally, bool)>,
    window: Tally,
}

impl PackMeter {
    /// A pass begins with `rows` routed through its first layer; `now`
    /// closes the one before.
    pub fn pass_begins(&mut self, now: Tally, rows: u64) {
        if let Some((start, true)) = self.current {
            let mut d = now.since(&start);
            d.passes = 1;
            self.window.add(&d);
        }
        self.current = Some((now, rows <= DECODE_ROWS));
    }

    /// Whether no pass has begun yet.
    pub fn idle(&self) -> bool {
        self.current.is_none()
    }

    /// The decode passes measured since the last call.
    pub fn take(&mut self) -> Tally {
        std::mem::take(&mut self.window)
    }
}

/// Margin by which keeping records packed must be predicted faster before
/// the cache switches to it, and back: the estimate is coarse.
const SWITCH_SHARE: f64 = 0.05;
/// Plain bytes a core restores per second, until measured: what the readers
/// did on the peers' F16 model and a BF16 DeepSeek-V3-shaped one (1.2–2.5 GB/s).
const RESTORE_BYTES_PER_SECOND: f64 = 1.5e9;

/// The choice between keeping records packed and keeping weights, and what
/// it rests on: hit rates replayed at both capacities, and a decode step's
/// predicted time either way from the costs measured.
#[derive(Debug, Clone, Copy, serde::Serialize, PartialEq, ts_rs::TS)]
pub struct PackingChoice {
    pub packed: bool,
    pub hit_rate_packed: f64,
    pub hit_rate_weights: f64,
    pub seconds_per_pass_packed: f64,
    pub seconds_per_pass_weights: f64,
    /// What the prediction used: compute per pass, restore and drive time per byte.
    pub compute_seconds_per_pass: f64,
    pub restore_seconds_per_gb: f64,
    pub drive_seconds_per_gb: f64,
    pub passes_measured: u64,
}

/// Sizes of a record as read and as restored, on average.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecordBytes {
    pub read: f64,
    pub plain: f64,
}

/// Weighs keeping records packed against keeping weights for the passes
/// measured in `t`, with hit rates `packed` and `weights` replayed at the
/// two capacities. A pass takes the longer of the model's work (compute,
/// and restoring every packed hit) and the drives' (reading every miss);
/// the mode in use stays unless the other is [`SWITCH_SHARE`] faster.
///
/// The drives' time per byte is what the window measured, but never less
/// than `sustained` (seconds per byte at the rate the drives' probe
/// measured, 0 when unknown): drives that idle between a pass's reads
/// serve the next ones in a burst, faster than they can keep up. On the
/// peers' model from four 200 MB/s drives under 3 GiB, the window measured
/// 0.65 s/GB (the probe: 1.23), so weights were predicted at 0.15 s a pass
/// against 0.20 packed; the cache switched, and its passes went from 0.22 s
/// packed to 0.27 as weights, reading 0.46 of lookups instead of 0.35.
pub(super) fn weigh(
    t: &Tally,
    (packed, weights): (f64, f64),
    bytes: RecordBytes,
    sustained: f64,
    now_packed: bool,
) -> Option<PackingChoice> {
    if t.passes == 0 || t.lookups == 0 || t.drive_bytes == 0 {
        return None;
    }
    let passes = t.passes as f64;
    let lookups = t.lookups as f64 / passes;
    let compute = ((t.seconds - t.stall - t.model_restore) / passes).max(0.0);
    let restore = match t.restored_bytes {
        0 => 1.0 / RESTORE_BYTES_PER_SECOND,
        b => t.restore / b as f64,
    };
    let drive = (t.drive_busy / t.drive_bytes as f64).max(sustained);
    let reads = |h: f64| (1.0 - h) * lookups * bytes.read * drive;
    let with_packed = (compute + packed * lookups * bytes.plain * restore).max(reads(packed));
    let with_weights = compute.max(reads(weights));
    let choose_packed = match now_packed {
        true => with_packed <= with_weights * (1.0 + SWITCH_SHARE),
        false => with_packed < with_weights * (1.0 - SWITCH_SHARE),
    };
    Some(PackingChoice {
        packed: choose_packed,
        hit_rate_packed: packed,
        hit_rate_weights: weights,
        seconds_per_pass_packed: with_packed,
        seconds_per_pass_weights: with_weights,
        compute_seconds_per_pass: compute,
        restore_seconds_per_gb: restore * 1e9,
        drive_seconds_per_gb: drive * 1e9,
        passes_measured: t.passes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(compute: f64, stall: f64, restore: f64, read_gb: f64) -> Tally {
        Tally {
            seconds: 10.0 * (compute + stall + restore),
            stall: 10.0 * stall,
            model_restore: 10.0 * restore,
            restore: 10.0 * restore,
            // Restored at 1.25 GB/s, as BF16 records were on this machine.
            restored_bytes: (10.0 * restore * 1.25e9) as u64,
            drive_bytes: (10.0 * read_gb * 1e9) as u64,
            drive_busy: 10.0 * read_gb * 1.25,
            lookups: 10 * 200,
            passes: 10,
        }
    }

    const RECORD: RecordBytes = RecordBytes {
        read: 2.6e6,
        plain: 3.1e6,
    };

    #[test]
    fn drive_bound_decoding_keeps_records_packed() {
        // The peers' F16 model: 0.05 s of compute, the drives busy 0.4 s.
        let t = tally(0.05, 0.35, 0.0, 0.32);
        let c = weigh(&t, (0.38, 0.32), RECORD, 0.0, true).unwrap();
        assert!(c.packed, "{c:?}");
        assert!(c.seconds_per_pass_packed < c.seconds_per_pass_weights);
    }

    #[test]
    fn compute_bound_decoding_keeps_weights() {
        // A skewed model that mostly hits: restoring every hit costs more
        // than the reads it saves.
        let t = tally(0.05, 0.01, 0.30, 0.1);
        let c = weigh(&t, (0.80, 0.69), RECORD, 0.0, true).unwrap();
        assert!(!c.packed, "{c:?}");
        assert!(weigh(&Tally::default(), (0.8, 0.7), RECORD, 0.0, true).is_none());
    }

    #[test]
    fn drives_timed_in_bursts_are_weighed_at_their_sustained_rate() {
        // The 3 GiB cell: the window saw the drives busy 0.65 s per GB; they
        // sustain 1.23 (their probe, 813 MB/s). Measured alone, weights
        // look faster; at the rate the drives keep up, packed records are.
        // Ten passes of 192 lookups, 0.351 of them read (2.64 MB each).
        let read = 10.0 * 0.351 * 192.0 * 2.64e6;
        let mut t = Tally {
            seconds: 2.2,
            stall: 0.45,
            model_restore: 1.39,
            restore: 1.0,
            restored_bytes: (1.0 / 0.42e-9) as u64,
            drive_bytes: read as u64,
            drive_busy: read * 0.65e-9,
            lookups: 1920,
            passes: 10,
        };
        let record = RecordBytes {
            read: 2.64e6,
            plain: 3.15e6,
        };
        let hits = (0.649, 0.54);
        let bursty = weigh(&t, hits, record, 0.0, true).unwrap();
        assert!(!bursty.packed, "{bursty:?}");
        let sustained = weigh(&t, hits, record, 1.0 / 813e6, true).unwrap();
        assert!(sustained.packed, "{sustained:?}");
        assert!((sustained.drive_seconds_per_gb - 1.23).abs() < 0.01);
        // A window slower than the probe keeps what it measured.
        t.drive_busy = read * 2.0e-9;
        let slow = weigh(&t, hits, record, 1.0 / 813e6, true).unwrap();
        assert!((slow.drive_seconds_per_gb - 2.0).abs() < 1e-6);
    }
}
