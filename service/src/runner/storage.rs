//! When the data dir cannot be written (a full disk, an I/O error), the
//! running job is paused with the reason rather than left `running` with
//! no word, as it once was forever. The pause itself needs a write, so the
//! runner retries it until the disk has room again; meanwhile the service
//! keeps answering and `/api/queue` says what is wrong. No output is lost:
//! what was not committed is produced again, identically, on resume, and the
//! saved attention state is cut to the committed output when read.

use std::time::Duration;

use super::Runner;
use crate::queue::{PauseCause, QueueError};

/// How often a blocked write is tried again.
const STORAGE_RETRY: Duration = Duration::from_secs(1);

impl Runner {
    /// Pauses job `id` after `fault` stopped it, retrying until it is recorded.
    pub(super) fn pause_after_storage_fault(&self, id: i64, fault: &QueueError) {
        let reason = format!(
            "the data dir could not be written ({}); make room, then resume",
            root_cause(fault)
        );
        tracing::error!("job {id}: {reason}");
        self.control.set_storage_fault(Some(reason.clone()));
        self.announce_queue();
        loop {
            match self.queue.pause(id, PauseCause::Storage, &reason) {
                Ok(_) => break,
                Err(e) if e.is_storage_fault() => {
                    if !self.control.sleep(STORAGE_RETRY) {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!("job {id}: cannot pause: {e}");
                    break;
                }
            }
        }
        let _ = self.queue.log(id, &format!("paused: {reason}"));
        self.control.set_storage_fault(None);
    }

    /// Waits out a storage fault that kept a job from starting, so the
    /// runner does not spin on it.
    pub(super) fn wait_for_storage(&self, fault: &QueueError) {
        self.control.set_storage_fault(Some(format!(
            "the data dir could not be written ({}); waiting for room",
            root_cause(fault)
        )));
        self.announce_queue();
        self.control.sleep(STORAGE_RETRY);
        self.control.set_storage_fault(None);
    }
}

/// SQLite's own words ("database or disk is full"), without the context.
fn root_cause(e: &QueueError) -> String {
    match e {
        QueueError::Sql { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}
