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
    /// The ids asked for, by position.
    pub ids: Vec<usize>,
    pub ready: VecDeque<(usize, Arc<Expert>)>,
    /// Hits the cache keeps packed, not restored yet (position, id, record).
    pub packed: VecDeque<(usize, usize, Arc<PooledBuf>)>,
    /// Experts this request read or restored and handed over, while the
    /// model still holds them: they count against the window, so that reads
    /// landing faster than a prompt's experts are computed do not pile up
    /// (with 45 MB experts they held 0.5 GB past the budget).
    pub handed: Vec<Weak<Expert>>,
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
    /// Bytes of the experts handed over and still held.
    fn handed_bytes(&mut self) -> u64 {
        self.handed.retain(|w| w.strong_count() > 0);
        self.handed.len() as u64 * self.owner.ram_bytes(self.layer)
    }

    /// Lets the model's thread run one of the layer's pending expert
    /// computations, which lets go of an expert.
    fn let_one_go() {
        if !matches!(rayon::yield_now(), Some(rayon::Yield::Executed)) {
            std::thread::yield_now();
        }
    }

    /// Restores the next packed hit, once the experts handed over and still
    /// held leave room in the window.
    fn restore_next(&mut self) -> Option<Result<(usize, Arc<Expert>), ExpertError>> {
        let (pos, id, record) = self.packed.pop_front()?;
        let size = self.owner.ram_bytes(self.layer);
        loop {
            let held = self.handed_bytes();
            if held == 0 || held + size <= self.owner.window_bytes {
                break;
            }
            Self::let_one_go();
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
            self.hand_over(id, &expert);
            (pos, expert)
        }))
    }

    /// Counts an expert handed over against the window while the model
    /// holds it, unless the cache keeps it (its memory is the budget's).
    fn hand_over(&mut self, id: usize, expert: &Arc<Expert>) {
        let cached = self.owner.shared.state.lock().is_ok_and(|st| {
            matches!(st.cache.peek(self.layer.layer, id),
                Some(Held::Ready(e)) if Arc::ptr_eq(&e, expert))
        });
        if !cached {
            self.handed.push(Arc::downgrade(expert));
        }
    }

    /// Asks the drives for more misses while the window has room (always at
    /// least one read).
    pub fn top_up(&mut self) -> Result<(), ExpertError> {
        while let Some(&(pos, id)) = self.unread.front() {
            let in_window: u64 = self.window.values().sum::<u64>() + self.handed_bytes();
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

impl Fetch<'_> {
    /// Hands over a record that landed.
    fn landed(
        &mut self,
        got: Result<Arrival, mpsc::RecvError>,
    ) -> Option<Result<(usize, Arc<Expert>), ExpertError>> {
        self.waiting -= 1;
        match got {
            Ok((pos, Ok(expert))) => {
                self.window.remove(&pos);
                if let Some(&id) = self.ids.get(pos) {
                    self.hand_over(id, &expert);
                }
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

impl Iterator for Fetch<'_> {
    type Item = Result<(usize, Arc<Expert>), ExpertError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            if let Err(e) = self.top_up() {
                self.failed = true;
                return Some(Err(e));
            }
            if let Some(r) = self.ready.pop_front() {
                return Some(Ok(r));
            }
            match self.rx.try_recv() {
                Ok(arrival) => return self.landed(Ok(arrival)),
                Err(_) if !self.packed.is_empty() => {
                    let restored = self.restore_next()?;
                    self.failed = restored.is_err();
                    return Some(restored);
                }
                Err(_) => {}
            }
            if self.waiting > 0 {
                let started = Instant::now();
                let got = self.rx.recv();
                self.owner
                    .stall_micros
                    .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                return self.landed(got);
            }
            if self.unread.is_empty() {
                return None;
            }
            // The window is full of experts still being computed.
            Self::let_one_go();
        }
    }
}
