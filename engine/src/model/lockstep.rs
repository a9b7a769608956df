//! Sequences decoding together. Threads that each run a generation on the
//! same model meet here: their forward passes wait for one another and run
//! as one pass over all their rows, so each MoE layer reads the union of
//! their experts once instead of once per sequence. Every kernel is
//! batch-invariant, so a sequence's logits are bitwise what its own pass
//! would give, whoever it runs with.
//!
//! A pass starts when every member is waiting, or when the first has waited
//! [`GATHER`] since the previous pass ended, so that a member busy between
//! passes (sampling, saving its output) delays the others by at most that.
//! Measuring from the previous pass's end keeps members in step: one that
//! arrives just after a pass began would otherwise start the next one alone
//! and the two would alternate forever.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use candle_core::Tensor;
use serde::Serialize;

use super::layers::decoder::{Decoder, LogitsFor, Part};
use super::{ExpertError, ModelError, SequenceState};

/// How long a waiting pass holds for members that are not waiting yet: a
/// few sampling steps of a 150k vocabulary, well under a decode step that
/// reads from drives (0.2–1 s).
pub const GATHER: Duration = Duration::from_millis(5);

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The lockstep this thread decodes in, if any (0: none).
    static MEMBER_OF: Cell<usize> = const { Cell::new(0) };
}

/// Passes run together so far.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct LockstepCounters {
    pub passes: u64,
    /// Sequences over all passes (their mean is passes' width).
    pub sequences: u64,
    pub rows: u64,
}

struct Request {
    ticket: u64,
    ids: Vec<u32>,
    state: SequenceState,
    which: LogitsFor,
}

type Outcome = (SequenceState, Result<Tensor, ModelError>);

#[derive(Default)]
struct Inner {
    members: usize,
    waiting: Vec<Request>,
    done: HashMap<u64, Outcome>,
    running: bool,
    next_ticket: u64,
    /// When the first of `waiting` arrived, and when the last pass ended.
    first_wait: Option<Instant>,
    last_end: Option<Instant>,
    counters: LockstepCounters,
}

impl Inner {
    /// How long until a pass may start (zero: now); `None` with nothing waiting.
    fn due_in(&self, now: Instant) -> Option<Duration> {
        let first = self.first_wait?;
        if self.waiting.len() >= self.members {
            return Some(Duration::ZERO);
        }
        let since = self.last_end.map_or(first, |end| end.max(first));
        Some(GATHER.saturating_sub(now.duration_since(since)))
    }
}

/// Where the threads decoding on one model meet (see the module doc).
pub struct Lockstep {
    id: usize,
    inner: Mutex<Inner>,
    turn: Condvar,
}

impl Default for Lockstep {
    fn default() -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            inner: Mutex::new(Inner::default()),
            turn: Condvar::new(),
        }
    }
}

/// Membership of a lockstep for the life of a generation on this thread.
pub struct Member<'a> {
    lockstep: &'a Lockstep,
    before: usize,
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        MEMBER_OF.with(|m| m.set(self.before));
        if let Ok(mut inner) = self.lockstep.inner.lock() {
            inner.members = inner.members.saturating_sub(1);
        }
        // Others may have been waiting for this member.
        self.lockstep.turn.notify_all();
    }
}

impl Lockstep {
    /// Makes this thread's passes on the model run with the other members'
    /// until the returned guard is dropped. A thread already a member stays one.
    pub fn join(&self) -> Option<Member<'_>> {
        if self.is_member() {
            return None;
        }
        let before = MEMBER_OF.with(|m| m.replace(self.id));
        if let Ok(mut inner) = self.inner.lock() {
            inner.members += 1;
        }
        Some(Member {
            lockstep: self,
            before,
        })
    }

    /// Whether this thread is a member.
    pub fn is_member(&self) -> bool {
        MEMBER_OF.with(|m| m.get() == self.id)
    }

    pub fn counters(&self) -> LockstepCounters {
        self.inner.lock().map(|i| i.counters).unwrap_or_default()
    }

    /// Runs one member's pass with whichever others are waiting.
    pub fn pass(
        &self,
        decoder: &Decoder,
        ids: &[u32],
        state: &mut SequenceState,
        which: LogitsFor,
    ) -> Result<Tensor, ModelError> {
        decoder.check_ids(ids)?;
        let poisoned = || ModelError::Internal("a pass shared with other sequences panicked");
        let mut inner = self.inner.lock().map_err(|_| poisoned())?;
        let ticket = inner.next_ticket;
        inner.next_ticket += 1;
        inner.first_wait.get_or_insert_with(Instant::now);
        inner.waiting.push(Request {
            ticket,
            ids: ids.to_vec(),
            state: std::mem::replace(state, SequenceState::new(0)),
            which,
        });
        loop {
            if let Some((back, result)) = inner.done.remove(&ticket) {
                *state = back;
                return result;
            }
            let due = inner.due_in(Instant::now());
            match due {
                Some(d) if d.is_zero() && !inner.running => {
                    let batch = std::mem::take(&mut inner.waiting);
                    inner.first_wait = None;
                    inner.running = true;
                    drop(inner);
                    let outcomes = run(decoder, batch);
                    inner = self.inner.lock().map_err(|_| poisoned())?;
                    inner.counters.passes += 1;
                    inner.counters.sequences += outcomes.len() as u64;
                    inner.counters.rows += outcomes.iter().map(|o| o.2 as u64).sum::<u64>();
                    for (ticket, outcome, _) in outcomes {
                        inner.done.insert(ticket, outcome);
                    }
                    inner.running = false;
                    inner.last_end = Some(Instant::now());
                    if !inner.waiting.is_empty() {
                        inner.first_wait = Some(Instant::now());
                    }
                    self.turn.notify_all();
                }
                Some(d) if !inner.running => {
                    inner = self.turn.wait_timeout(inner, d).map_err(|_| poisoned())?.0;
                }
                _ => inner = self.turn.wait(inner).map_err(|_| poisoned())?,
            }
        }
    }
}

/// Runs the waiting requests as one pass; each gets its state back with its
/// logits, or the pass's error (an expert read's as itself, so callers
/// still see a drive fault as one).
fn run(decoder: &Decoder, mut batch: Vec<Request>) -> Vec<(u64, Outcome, usize)> {
    // A panic must not leave the others waiting for a pass that never ends.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut parts: Vec<Part<'_>> = batch
            .iter_mut()
            .map(|r| Part {
                ids: &r.ids,
                state: &mut r.state,
                which: r.which,
            })
            .collect();
        decoder.forward_parts(&mut parts)
    }))
    .unwrap_or(Err(ModelError::Internal(
        "a pass shared with other sequences panicked",
    )));
    match result {
        Ok(logits) => batch
            .into_iter()
            .zip(logits)
            .map(|(r, l)| (r.ticket, (r.state, Ok(l)), r.ids.len()))
            .collect(),
        Err(e) => {
            let shared = Arc::new(e);
            batch
                .into_iter()
                .map(|r| {
                    let error = match shared.as_ref() {
                        ModelError::Experts(e) => ModelError::Experts(ExpertError::clone(e)),
                        _ => ModelError::Together(Arc::clone(&shared)),
                    };
                    (r.ticket, (r.state, Err(error)), r.ids.len())
                })
                .collect()
        }
    }
}
