//! Reused record buffers.
//!
//! An expert record is read into a block-aligned buffer that then serves as
//! the expert's weights for as long as anyone holds the expert; when the last
//! holder lets go, the buffer goes back to the pool for the next read. All
//! records of a layer have one size, so after the first tokens no read
//! allocates, and the process's memory stays where the budget put it instead
//! of drifting with the allocator's fragmentation. Free buffers beyond a cap
//! go back to the system: packed records come in a few sizes, and a cache
//! that stops keeping records packed would otherwise keep every buffer of
//! the old sizes (on a BF16 pack under 2 GiB that was 1.5 GB, and the
//! process was killed for it).

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::aligned::{AlignedBytes, AllocError};
use crate::store::DIRECT_IO_BLOCK;

#[derive(Debug, Default)]
pub struct BufferPool {
    /// Free buffers by capacity, and their bytes.
    free: Mutex<HashMap<usize, Vec<AlignedBytes>>>,
    free_bytes: AtomicU64,
    /// Most bytes of free buffers kept (0: no cap).
    free_cap: u64,
    /// Bytes of every buffer the pool has allocated (held or free).
    allocated: AtomicU64,
    /// Buffers allocated so far (fresh memory, zeroed by the kernel on first
    /// touch), against those reused.
    allocations: AtomicU64,
    reuses: AtomicU64,
    /// Bytes of buffers held now, and the most ever held at once.
    held: AtomicU64,
    peak_held: AtomicU64,
}

impl BufferPool {
    /// A pool that keeps at most `free_cap` bytes of free buffers.
    pub fn with_free_cap(free_cap: u64) -> Self {
        Self {
            free_cap,
            ..Self::default()
        }
    }

    /// A buffer for a `len`-byte record: a free one of the right size, or a new one.
    pub fn take(self: &Arc<Self>, len: usize) -> Result<PooledBuf, AllocError> {
        self.take_sized(len, len)
    }

    /// A buffer for `len` bytes from the size class of `class` bytes (at
    /// least `len`): compressed records, each of its own length, are read
    /// into buffers of their plain size so that every buffer of a layer can
    /// serve every record of it.
    pub fn take_sized(self: &Arc<Self>, len: usize, class: usize) -> Result<PooledBuf, AllocError> {
        let capacity = len.max(class).max(1).next_multiple_of(DIRECT_IO_BLOCK);
        let reused = self
            .free
            .lock()
            .ok()
            .and_then(|mut f| f.get_mut(&capacity).and_then(Vec::pop));
        let buf = match reused {
            Some(b) => {
                self.free_bytes
                    .fetch_sub(b.capacity() as u64, Ordering::Relaxed);
                self.reuses.fetch_add(1, Ordering::Relaxed);
                b
            }
            None => {
                let b = AlignedBytes::zeroed(capacity, DIRECT_IO_BLOCK)?;
                self.allocations.fetch_add(1, Ordering::Relaxed);
                self.allocated
                    .fetch_add(b.capacity() as u64, Ordering::Relaxed);
                b
            }
        };
        let held = self
            .held
            .fetch_add(buf.capacity() as u64, Ordering::Relaxed)
            + buf.capacity() as u64;
        self.peak_held.fetch_max(held, Ordering::Relaxed);
        Ok(PooledBuf {
            buf: ManuallyDrop::new(buf),
            len,
            pool: Arc::clone(self),
        })
    }

    /// Bytes of every buffer allocated so far, in use or free.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Buffers allocated and buffers reused so far.
    pub fn takes(&self) -> (u64, u64) {
        (
            self.allocations.load(Ordering::Relaxed),
            self.reuses.load(Ordering::Relaxed),
        )
    }

    /// The most bytes of buffers held at once so far.
    pub fn peak_held_bytes(&self) -> u64 {
        self.peak_held.load(Ordering::Relaxed)
    }
}

/// A pooled buffer holding one record of `len` bytes; returns to its pool on drop.
#[derive(Debug)]
pub struct PooledBuf {
    buf: ManuallyDrop<AlignedBytes>,
    len: usize,
    pool: Arc<BufferPool>,
}

impl PooledBuf {
    /// The whole aligned buffer, for readers to fill.
    pub fn aligned(&self) -> &AlignedBytes {
        &self.buf
    }

    /// The record's bytes, to fill while nobody else holds the buffer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[..self.len]
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        // SAFETY: `buf` is not used again after this.
        let b = unsafe { ManuallyDrop::take(&mut self.buf) };
        self.pool
            .held
            .fetch_sub(b.capacity() as u64, Ordering::Relaxed);
        let pool = &self.pool;
        let cap = b.capacity() as u64;
        if pool.free_cap > 0 && pool.free_bytes.load(Ordering::Relaxed) + cap > pool.free_cap {
            pool.allocated.fetch_sub(cap, Ordering::Relaxed);
            return;
        }
        if let Ok(mut free) = pool.free.lock() {
            pool.free_bytes.fetch_add(cap, Ordering::Relaxed);
            free.entry(b.capacity()).or_default().push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_after_their_holders_let_go() {
        let pool = Arc::new(BufferPool::default());
        let a = pool.take(5000).unwrap();
        assert_eq!(a.as_ref().len(), 5000);
        assert_eq!(
            a.aligned().as_slice().as_ptr() as usize % DIRECT_IO_BLOCK,
            0
        );
        let ptr = a.aligned().as_slice().as_ptr();
        drop(a);
        let b = pool.take(6000).unwrap();
        assert_eq!(b.aligned().as_slice().as_ptr(), ptr, "same size class");
        assert_eq!(pool.allocated_bytes(), 8192);
    }

    #[test]
    fn free_buffers_past_the_cap_go_back_to_the_system() {
        let pool = Arc::new(BufferPool::with_free_cap(8192));
        let held: Vec<PooledBuf> = (0..3).map(|_| pool.take(4096).unwrap()).collect();
        assert_eq!(pool.allocated_bytes(), 3 * 4096);
        drop(held);
        assert_eq!(pool.allocated_bytes(), 2 * 4096, "two kept free, one freed");
        let again: Vec<PooledBuf> = (0..2).map(|_| pool.take(4096).unwrap()).collect();
        assert_eq!(pool.allocated_bytes(), 2 * 4096, "the free ones are reused");
        drop(again);
    }
}
