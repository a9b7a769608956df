//! One drive's queue of reads: demand reads before prefetch reads.
//!
//! A read the model is waiting for always goes ahead of a guess about the
//! next layer, and a guess that turns out to be needed can be moved to the
//! front before a reader has started it.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use super::{Priority, SegmentRead};

#[derive(Default)]
struct Queues {
    demand: VecDeque<SegmentRead>,
    prefetch: VecDeque<SegmentRead>,
    closed: bool,
}

#[derive(Default)]
pub(super) struct DriveQueue {
    queues: Mutex<Queues>,
    ready: Condvar,
}

impl DriveQueue {
    /// Adds a read; `false` when the queue is closed.
    pub fn push(&self, read: SegmentRead, priority: Priority) -> bool {
        let Ok(mut q) = self.queues.lock() else {
            return false;
        };
        if q.closed {
            return false;
        }
        match priority {
            Priority::Demand => q.demand.push_back(read),
            Priority::Prefetch => q.prefetch.push_back(read),
        }
        drop(q);
        self.ready.notify_one();
        true
    }

    /// Moves the not yet started prefetch reads of `ticket` to the demand queue.
    pub fn promote(&self, ticket: u64) {
        let Ok(mut q) = self.queues.lock() else {
            return;
        };
        let (moved, kept): (VecDeque<_>, VecDeque<_>) =
            q.prefetch.drain(..).partition(|r| r.ticket == ticket);
        q.prefetch = kept;
        q.demand.extend(moved);
    }

    /// The next read, waiting for one; `None` once the queue is closed and empty.
    pub fn pop(&self) -> Option<SegmentRead> {
        let mut q = self.queues.lock().ok()?;
        loop {
            if let Some(r) = q.demand.pop_front().or_else(|| q.prefetch.pop_front()) {
                return Some(r);
            }
            if q.closed {
                return None;
            }
            q = self.ready.wait(q).ok()?;
        }
    }

    /// Stops taking reads; readers finish what is queued and exit.
    pub fn close(&self) {
        if let Ok(mut q) = self.queues.lock() {
            q.closed = true;
        }
        self.ready.notify_all();
    }
}
