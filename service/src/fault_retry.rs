//! Jobs paused on their drives are retried by themselves. A job paused on
//! a failing read (EIO, a short read, a remote server that stopped
//! answering) is resumed after [`FIRST_RETRY`], then after twice as long
//! each time it pauses again, up to [`LAST_RETRY`]; a job paused on a
//! missing drive folder is resumed once every drive folder of its pack is
//! there. Meanwhile the queue holds the model's other jobs
//! ([`crate::queue::Queue::next_runnable`]), so one failing drive pauses
//! one job, not the whole queue in turn, and the night's work goes on once
//! the drive reads again without anyone pressing Resume.
//!
//! Why a retry rather than a probe of the drive: the read that failed is
//! the only faithful test (an EIO can come from one sector of one extent
//! file), and a retry that meets the fault again pauses within its first
//! read, at the cost of reopening the model. A retry that runs for
//! [`RECOVERED_AFTER`] without pausing again counts as a recovery, so a
//! later fault starts over at [`FIRST_RETRY`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::queue::{DrivePause, PauseCause};
use crate::runner::Runner;

/// The wait before the first retry after a failing read.
pub const FIRST_RETRY: Duration = Duration::from_secs(2);
/// The longest wait between retries (a drive that fails for hours is
/// tried every few minutes, not hammered).
pub const LAST_RETRY: Duration = Duration::from_secs(300);
/// A retried job that runs this long without pausing again has recovered.
pub const RECOVERED_AFTER: Duration = Duration::from_secs(30);

/// What is known of one job's retries.
struct Retry {
    /// Retries made so far in this run of faults.
    attempts: u32,
    /// When the next retry is due (for a failing read).
    due: Instant,
    /// When the job was last resumed by a retry, while it has not paused
    /// again since.
    resumed: Option<Instant>,
}

/// The wait before retry number `attempts` (0-based).
pub fn backoff(attempts: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1u32.checked_shl(attempts).unwrap_or(u32::MAX))
        .min(LAST_RETRY)
}

/// The retries of every job paused on its drives.
#[derive(Default)]
pub struct Retries {
    jobs: HashMap<i64, Retry>,
}

impl Retries {
    /// One round: schedules jobs newly paused on their drives, resumes
    /// those that are due and whose drives are all there, and forgets
    /// jobs that recovered or left the pause some other way.
    /// `drives_ready(model)` says whether every drive folder of a model's
    /// pack is there and readable.
    pub fn tick(&mut self, runner: &Runner, drives_ready: &mut dyn FnMut(&str) -> bool) {
        let Ok(paused) = runner.queue.paused_on_drives() else {
            return;
        };
        let now = Instant::now();
        self.jobs.retain(|id, r| {
            paused.iter().any(|p| p.id == *id)
                || r.resumed
                    .is_some_and(|at| now.duration_since(at) < RECOVERED_AFTER)
        });
        for DrivePause {
            id,
            model,
            cause,
            reason,
        } in paused
        {
            let retry = self.jobs.entry(id).or_insert(Retry {
                attempts: 0,
                due: now,
                resumed: Some(now),
            });
            if retry.resumed.take().is_some() {
                // Newly paused, or paused again after a retry.
                retry.due = now + backoff(retry.attempts);
                let when = match cause {
                    PauseCause::DriveMissing => "when the drive is back".to_string(),
                    _ => format!("in {} s", backoff(retry.attempts).as_secs()),
                };
                let base = reason.as_deref().map_or("", without_retry_note);
                let note = format!("{base}; {RETRY_NOTE}{when}");
                if runner.queue.set_pause_reason(id, &note).is_ok() {
                    runner.announce_queue();
                }
            }
            let due = cause == PauseCause::DriveMissing || now >= retry.due;
            if due && drives_ready(&model) && runner.queue.resume(id).is_ok() {
                retry.attempts += 1;
                retry.resumed = Some(now);
                let _ = runner.queue.log(
                    id,
                    &format!("retrying by itself (attempt {})", retry.attempts),
                );
                runner.control.wake();
                runner.announce_queue();
            }
        }
    }
}

/// What a retried pause's reason says after its cause.
const RETRY_NOTE: &str = "retrying by itself ";

/// A pause reason without the retry note a previous round added, and
/// without the old advice to resume by hand.
fn without_retry_note(reason: &str) -> &str {
    let reason = reason
        .split(&format!("; {RETRY_NOTE}"))
        .next()
        .unwrap_or(reason);
    reason
        .strip_suffix("; resume when it is back")
        .unwrap_or(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_wait_twice_as_long_each_time_up_to_the_last() {
        assert_eq!(backoff(0), FIRST_RETRY);
        assert_eq!(backoff(1), FIRST_RETRY * 2);
        assert_eq!(backoff(3), FIRST_RETRY * 8);
        assert_eq!(backoff(20), LAST_RETRY);
        assert_eq!(backoff(u32::MAX), LAST_RETRY);
    }

    #[test]
    fn a_reason_keeps_its_cause_and_loses_old_notes() {
        assert_eq!(
            without_retry_note("storage fault: EIO; retrying by itself in 4 s"),
            "storage fault: EIO"
        );
        assert_eq!(
            without_retry_note("drive missing: /d is not there; resume when it is back"),
            "drive missing: /d is not there"
        );
        assert_eq!(
            without_retry_note("storage fault: EIO"),
            "storage fault: EIO"
        );
    }
}
