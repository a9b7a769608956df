//! One layer's request for experts, handed over as they become available.
//!
//! Experts already held come first; the missing ones are asked of the drives
//! while the window allows (all of a decode step's at once), and each is
//! handed over as it lands, so the model computes it while the others are
//! on their way. The experts asked for are protected from eviction until the
//! request is dropped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use super::reads::Arrival;
use super::streaming::StreamingExperts;
use crate::model::{Expert, ExpertError};
use crate::pack::manifest::ExpertLayer;

/// What [`StreamingExperts::demand`] did.
pub(super) enum Demand {
    /// The expert will arrive on the request's channel: another read had
    /// started it (a prefetch, now promoted).
    Joined,
    /// Likewise, from a read this request started.
    Started,
    /// It was already there.
    Ready(Arc<Expert>),
}

/// A layer's experts, handed over as they become available.
pub(super) struct Fetch<'a> {
    pub owner: &'a StreamingExperts,
    pub layer: &'a ExpertLayer,
    pub ready: VecDeque<(usize, Arc<Expert>)>,
    /// Misses not asked of the drives yet (position, id).
    pub unread: VecDeque<(usize, usize)>,
    pub tx: mpsc::Sender<Arrival>,
    pub rx: mpsc::Receiver<Arrival>,
    /// Arrivals still due.
    pub waiting: usize,
    /// Bytes of the reads this request waits for, by position.
    pub window: BTreeMap<usize, u64>,
    pub failed: bool,
}

impl Fetch<'_> {
    /// Asks the drives for more misses while the window has room (always at
    /// least one read).
    pub fn top_up(&mut self) -> Result<(), ExpertError> {
        while let Some(&(pos, id)) = self.unread.front() {
            let in_window: u64 = self.window.values().sum();
            let next = self.owner.ram_bytes(self.layer);
            if in_window > 0 && in_window + next > self.owner.window_bytes {
                break;
            }
            self.unread.pop_front();
            match self.owner.demand(self.layer, id, pos, &self.tx)? {
                Demand::Joined | Demand::Started => {
                    self.waiting += 1;
                    self.window.insert(pos, next);
                }
                Demand::Ready(expert) => self.ready.push_back((pos, expert)),
            }
        }
        Ok(())
    }
}

impl Drop for Fetch<'_> {
    fn drop(&mut self) {
        if let Ok(mut st) = self.owner.shared.state.lock() {
            st.cache.unprotect_layer(self.layer.layer);
        }
    }
}

impl Iterator for Fetch<'_> {
    type Item = Result<(usize, Arc<Expert>), ExpertError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if let Err(e) = self.top_up() {
            self.failed = true;
            return Some(Err(e));
        }
        if let Some(r) = self.ready.pop_front() {
            return Some(Ok(r));
        }
        if self.waiting == 0 {
            return None;
        }
        let started = Instant::now();
        let got = self.rx.recv();
        self.owner
            .stall_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.waiting -= 1;
        match got {
            Ok((pos, Ok(expert))) => {
                self.window.remove(&pos);
                Some(Ok((pos, expert)))
            }
            Ok((_, Err(e))) => {
                self.failed = true;
                Some(Err(e))
            }
            Err(_) => {
                self.failed = true;
                Some(Err(ExpertError::Source(
                    "the drive readers stopped".to_string(),
                )))
            }
        }
    }
}
