//! One layer's request for experts, handed over as they become available.
//!
//! Experts already held come first; the missing ones are asked of the drives
//! while the window allows (all of a decode step's at once), and each is
//! handed over as it lands, so the model computes it while the others are
//! on their way. Experts the cache keeps packed are restored by the model's
//! own thread whenever nothing has landed, no more of them alive at once
//! than a window holds (the model's thread runs the layer's pending expert
//! computations meanwhile, which frees them); it is a compute thread, so
//! restores never wait for one. The experts asked for are protected from
//! eviction until the request is dropped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak, mpsc};
use std::time::Instant;

use super::pool::PooledBuf;
use super::reads::{Arrival, Held};
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
    /// It was there, packed.
    Packed(Arc<PooledBuf>),
}

/// A layer's experts, handed over as they become available.
pub(super) struct Fetch<'a> {
    pub owner: &'a StreamingExperts,
    pub layer: &'a ExpertLayer,
    pub ready: VecDeque<(usize, Arc<Expert>)>,
    /// Hits the cache keeps packed, not restored yet (position, id, record).
    pub packed: VecDeque<(usize, usize, Arc<PooledBuf>)>,
    /// Experts restored for this request, while someone holds them.
    pub restored: Vec<Weak<Expert>>,
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
    /// Restores the next packed hit, once fewer restored experts than a
    /// window holds are still in use.
    fn restore_next(&mut self) -> Option<Result<(usize, Arc<Expert>), ExpertError>> {
        let (pos, id, record) = self.packed.pop_front()?;
        let size = self.owner.ram_bytes(self.layer).max(1);
        let room = (self.owner.window_bytes / size).max(1) as usize;
        loop {
            self.restored.retain(|w| w.strong_count() > 0);
            if self.restored.len() < room {
                break;
            }
            // Run one of the layer's expert computations, which lets go of one.
            if !matches!(rayon::yield_now(), Some(rayon::Yield::Executed)) {
                std::thread::yield_now();
            }
        }
        let started = Instant::now();
        let key = (self.layer.layer, id);
        let restored = self.owner.shared.unpack(key, &record);
        self.owner
            .restore_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        // A cache no longer keeping records packed keeps the weights it
        // restored instead, if it can make room.
        if let Ok(expert) = &restored
            && !self.owner.keeps_records_packed()
            && let Ok(mut st) = self.owner.shared.state.lock()
        {
            let bytes = self.owner.ram_bytes(self.layer);
            st.cache
                .replace(key.0, key.1, Held::Ready(Arc::clone(expert)), bytes);
        }
        Some(restored.map(|expert| {
            self.restored.push(Arc::downgrade(&expert));
            (pos, expert)
        }))
    }

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
                Demand::Packed(record) => self.packed.push_back((pos, id, record)),
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
        let landed = match self.rx.try_recv() {
            Ok(arrival) => Some(arrival),
            Err(_) if !self.packed.is_empty() => {
                let restored = self.restore_next()?;
                self.failed = restored.is_err();
                return Some(restored);
            }
            Err(_) => None,
        };
        if self.waiting == 0 {
            return None;
        }
        let started = Instant::now();
        let got = match landed {
            Some(arrival) => Ok(arrival),
            None => self.rx.recv(),
        };
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
