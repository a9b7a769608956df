//! Records in flight: the table that makes sure no expert is read twice at
//! once, and what happens when a record's last segment lands.
//!
//! A record is read segment by segment (one per drive) straight into a pooled
//! buffer. The reader thread that completes the last segment checks the
//! record's checksum and turns the buffer into an expert without copying it,
//! then files it in the cache (if room was reserved) and hands it to everyone
//! waiting — all off the model's thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use super::budget::ExpertCache;
use super::pool::{BufferPool, PooledBuf};
use crate::aligned::AlignedBytes;
use crate::model::{Expert, ExpertError};
use crate::pack::compress;
use crate::pack::encoding::ExpertEncoding;
use crate::pack::manifest::{ExpertLayer, Segment, hash_hex};
use crate::pilot::Scorecard;
use crate::store::{ReadTarget, StoreError};

pub(super) type Key = (usize, usize);

/// An expert handed to a waiter: its position in the waiter's request.
pub(super) type Arrival = (usize, Result<Arc<Expert>, ExpertError>);

/// What the cache holds of an expert: its weights ready to compute with,
/// or its record as the pack stores it, compressed, to be restored at each
/// use (see [`super::streaming`]'s packed cache).
#[derive(Clone)]
pub(super) enum Held {
    Ready(Arc<Expert>),
    Packed(Arc<PooledBuf>),
}

/// A record that landed: the expert, and the compressed record itself when
/// the cache keeps records packed.
struct Landed {
    expert: Arc<Expert>,
    packed: Option<Arc<PooledBuf>>,
}

/// One record being read.
pub(super) struct Flight {
    pub ticket: u64,
    /// Room was reserved in the cache: the expert is kept once read.
    pub kept: bool,
    /// Started on a prediction and not asked for yet.
    pub speculative: bool,
    /// Bytes read from the drives.
    pub stored: u64,
    /// Who gets the expert, and at which position of their request.
    pub waiters: Vec<(mpsc::Sender<Arrival>, usize)>,
}

/// Everything guarded by one lock: the cache, the flights and the pilot's score.
pub(super) struct State {
    pub cache: ExpertCache<Held>,
    pub flights: HashMap<Key, Flight>,
    pub score: Scorecard,
    /// Demand lookups that found their expert already being read.
    pub joined_flights: u64,
    /// Records read from the drives (demand and prefetch).
    pub reads_started: u64,
    /// Guessed experts read ahead for one use that landed before their layer
    /// asked, with the bytes read for them; its request takes them, and
    /// drops those it did not ask for. They count as speculative bytes until
    /// then, so that guesses waiting for their layer bound the read-ahead.
    pub landed: HashMap<Key, (Arc<Expert>, u64)>,
    /// Bytes of speculative reads on their way (capped at the window).
    pub speculative_bytes: u64,
}

/// What the readers of a pack share with the model's side.
pub(super) struct Shared {
    pub layers: HashMap<usize, ExpertLayer>,
    /// The pack's expert encoding, and the layers' own where they differ.
    pub encoding: ExpertEncoding,
    pub layer_encodings: HashMap<usize, ExpertEncoding>,
    pub verify: bool,
    pub keep_stored: bool,
    /// The cache may keep compressed records as stored and restore them at
    /// each use (see [`super::packed`]), and whether new ones are kept so now.
    pub may_pack: bool,
    pub packing: std::sync::atomic::AtomicBool,
    /// Plain bytes restored from compressed records so far, by anyone.
    pub restored_bytes: AtomicU64,
    pub state: Mutex<State>,
    pub pool: Arc<BufferPool>,
    pub next_ticket: AtomicU64,
    /// Reader time spent restoring compressed records, in microseconds.
    pub decompress_micros: AtomicU64,
}

pub(super) fn poisoned() -> ExpertError {
    ExpertError::Source("the expert cache was poisoned by an earlier panic".to_string())
}

fn name_of((layer, id): Key) -> String {
    format!("layer {layer} expert {id}")
}

impl State {
    /// Keeps a guess that landed for its layer.
    fn land(&mut self, key: Key, expert: &Arc<Expert>, stored: u64) {
        self.speculative_bytes += stored;
        if let Some((_, old)) = self.landed.insert(key, (Arc::clone(expert), stored)) {
            self.speculative_bytes -= old;
        }
    }

    /// The guess for `key` that landed, if any, for its layer's request.
    pub fn take_landed(&mut self, key: Key) -> Option<Arc<Expert>> {
        let (expert, stored) = self.landed.remove(&key)?;
        self.speculative_bytes -= stored;
        Some(expert)
    }

    /// Drops the guesses for `layer` that its request did not ask for.
    pub fn drop_landed(&mut self, layer: usize) {
        let gone: u64 = self
            .landed
            .iter()
            .filter(|(k, _)| k.0 == layer)
            .map(|(_, (_, stored))| stored)
            .sum();
        self.landed.retain(|k, _| k.0 != layer);
        self.speculative_bytes -= gone;
    }
}

impl Shared {
    /// How layer `layer`'s records are encoded.
    pub fn encoding(&self, layer: usize) -> ExpertEncoding {
        self.layer_encodings
            .get(&layer)
            .copied()
            .unwrap_or(self.encoding)
    }
    /// A compressed record restored into a buffer of its plain length.
    fn restore(
        &self,
        stored: &Arc<PooledBuf>,
        plain_len: u64,
        name: &str,
    ) -> Result<Arc<PooledBuf>, ExpertError> {
        let started = std::time::Instant::now();
        let fail = |reason: String| ExpertError::Source(format!("{name}: {reason}"));
        let len = usize::try_from(plain_len).map_err(|_| fail("record too large".into()))?;
        let size = self
            .encoding
            .element_bytes()
            .ok_or_else(|| fail("a compressed record of a quantised pack".into()))?;
        let mut plain = self.pool.take(len).map_err(|e| fail(e.to_string()))?;
        compress::decompress((**stored).as_ref(), size, plain.as_mut_slice())
            .map_err(|e| fail(format!("cannot restore the compressed record: {e}")))?;
        self.restored_bytes.fetch_add(plain_len, Ordering::Relaxed);
        self.decompress_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        Ok(Arc::new(plain))
    }

    /// Files an arrived (or failed) record and wakes its waiters.
    fn arrived(&self, key: Key, landed: Result<Landed, ExpertError>) {
        let outcome = landed
            .as_ref()
            .map(|l| Arc::clone(&l.expert))
            .map_err(Clone::clone);
        let flight = {
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            let Some(flight) = st.flights.remove(&key) else {
                return;
            };
            if flight.speculative {
                st.speculative_bytes -= flight.stored;
            }
            let unclaimed = flight.speculative && flight.waiters.is_empty();
            match &landed {
                Ok(l) if flight.kept => {
                    let held = match &l.packed {
                        Some(record) => {
                            // Its layer is about to ask: keep the weights
                            // for it rather than restoring them twice.
                            if unclaimed {
                                st.land(key, &l.expert, flight.stored);
                            }
                            Held::Packed(Arc::clone(record))
                        }
                        None => Held::Ready(Arc::clone(&l.expert)),
                    };
                    st.cache.fill(key.0, key.1, held);
                }
                Err(_) if flight.kept => st.cache.cancel(key.0, key.1),
                Ok(l) if unclaimed => st.land(key, &l.expert, flight.stored),
                _ => {}
            }
            flight
        };
        for (tx, pos) in flight.waiters {
            // A waiter that gave up (an error elsewhere) no longer listens.
            let _ = tx.send((pos, outcome.clone()));
        }
    }

    /// Turns a record the cache kept packed into its expert again (its
    /// checksum was checked when it was read).
    pub fn unpack(&self, key: Key, record: &Arc<PooledBuf>) -> Result<Arc<Expert>, ExpertError> {
        self.decode(key, record, &[], false).map(|l| l.expert)
    }

    /// Checks a complete record (when `verify`) and turns its buffer into an expert.
    fn decode(
        &self,
        key: Key,
        buf: &Arc<PooledBuf>,
        segments: &[Segment],
        verify: bool,
    ) -> Result<Landed, ExpertError> {
        let (layer_index, id) = key;
        let layer = self
            .layers
            .get(&layer_index)
            .ok_or(ExpertError::NoSuchLayer { layer: layer_index })?;
        let record = layer.records.get(id).ok_or(ExpertError::NoSuchExpert {
            layer: layer_index,
            id,
            count: layer.records.len(),
        })?;
        let plain = if record.stored_len.is_some() {
            self.restore(buf, record.len, &name_of(key))?
        } else {
            Arc::clone(buf)
        };
        let packed = (self.may_pack && buf.aligned().capacity() < plain.aligned().capacity())
            .then(|| Arc::clone(buf));
        let buf = &plain;
        let bytes: &[u8] = (**buf).as_ref();
        if verify && hash_hex(bytes) != record.xxh3_128 {
            let places: Vec<String> = segments
                .iter()
                .map(|s| format!("drive {} {} at offset {}", s.drive, s.file, s.offset))
                .collect();
            return Err(ExpertError::Source(format!(
                "layer {layer_index} expert {id}: checksum mismatch in {} (the record is corrupt)",
                places.join(", ")
            )));
        }
        let name = name_of(key);
        let shared: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::clone(buf) as _;
        self.encoding(layer_index)
            .decode(
                shared,
                layer.hidden,
                layer.intermediate,
                self.keep_stored,
                &name,
            )
            .map(|expert| Landed {
                expert: Arc::new(expert),
                packed,
            })
            .map_err(|e| ExpertError::Source(e.to_string()))
    }
}

/// A record being assembled from its segments.
pub(super) struct RecordRead {
    pub shared: Arc<Shared>,
    pub key: Key,
    pub buf: Arc<PooledBuf>,
    pub remaining: AtomicUsize,
    pub error: Mutex<Option<StoreError>>,
    pub segments: Vec<Segment>,
}

impl ReadTarget for RecordRead {
    fn buffer(&self) -> &AlignedBytes {
        self.buf.aligned()
    }

    fn segment_done(&self, result: Result<(), StoreError>) {
        if let Err(e) = result
            && let Ok(mut first) = self.error.lock()
        {
            first.get_or_insert(e);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let failed = self.error.lock().ok().and_then(|mut e| e.take());
            let outcome = match failed {
                Some(e) => Err(ExpertError::Source(e.to_string())),
                None => self
                    .shared
                    .decode(self.key, &self.buf, &self.segments, self.shared.verify),
            };
            self.shared.arrived(self.key, outcome);
        }
    }
}
