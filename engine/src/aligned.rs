//! Owned byte buffers with a chosen alignment.
//!
//! Expert records are read with direct I/O straight into the memory that then
//! serves as the expert's weights, so that memory must be aligned to the
//! drive's block size (4 KiB) and padded to whole blocks. Resident weights use
//! the same type with cache-line alignment, so kernels see one kind of storage.

use std::alloc::Layout;
use std::ptr::NonNull;

/// Alignment of weight storage that is not read with direct I/O: a cache line,
/// and enough for any element type the kernels read.
pub const WEIGHT_ALIGN: usize = 64;

#[derive(Debug, thiserror::Error)]
#[error("cannot allocate {len} bytes aligned to {align}")]
pub struct AllocError {
    pub len: usize,
    pub align: usize,
}

/// Buffers at least this large are mapped straight from the system rather
/// than taken from the allocator's heap: their pages go back to the system
/// when they are dropped. Through the heap, 128 MiB of probe buffers freed
/// before the model loaded stayed resident and pushed a 2 GiB run over its
/// limit.
const MAP_THRESHOLD: usize = 256 << 10;

/// A zero-initialised buffer of `len` bytes whose address is a multiple of
/// `align`, with room up to the next multiple of `align` after `len`.
pub struct AlignedBytes {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
    mapped: bool,
}

// SAFETY: the buffer owns its allocation exclusively; shared access only reads.
unsafe impl Send for AlignedBytes {}
// SAFETY: `&AlignedBytes` hands out shared slices only, except through
// `region_ptr`, whose callers promise disjoint, unobserved writes.
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    /// `len` zero bytes aligned to `align` (a power of two).
    pub fn zeroed(len: usize, align: usize) -> Result<Self, AllocError> {
        let err = || AllocError { len, align };
        let capacity = len.max(1).checked_next_multiple_of(align).ok_or_else(err)?;
        let layout = Layout::from_size_align(capacity, align).map_err(|_| err())?;
        if capacity >= MAP_THRESHOLD && align <= crate::platform::page_size() {
            let ptr = crate::platform::map_anonymous(capacity).ok_or_else(err)?;
            return Ok(Self {
                ptr,
                len,
                layout,
                mapped: true,
            });
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(err)?;
        Ok(Self {
            ptr,
            len,
            layout,
            mapped: false,
        })
    }

    /// A copy of `bytes` aligned to `align`.
    pub fn copy_from(bytes: &[u8], align: usize) -> Result<Self, AllocError> {
        let mut out = Self::zeroed(bytes.len(), align)?;
        out.as_mut_slice().copy_from_slice(bytes);
        Ok(out)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated: `len` rounded up to the alignment.
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    pub fn align(&self) -> usize {
        self.layout.align()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The whole allocation, padding included, for reads in whole blocks.
    pub fn padded_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `capacity` initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity()) }
    }

    /// A raw pointer to `len` bytes at `start` (padding included), for
    /// filling disjoint parts of one buffer from several threads.
    ///
    /// Returns `None` when the range is outside the allocation. Writing
    /// through the pointer is sound only while no other thread reads or
    /// writes the same bytes; the store's readers fill disjoint segments of
    /// a record before anyone reads it.
    pub fn region_ptr(&self, start: usize, len: usize) -> Option<*mut u8> {
        let end = start.checked_add(len)?;
        (end <= self.capacity()).then(|| {
            // SAFETY: `start` is within the allocation.
            unsafe { self.ptr.as_ptr().add(start) }
        })
    }
}

impl AsRef<[u8]> for AlignedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: mapped in `zeroed` with this length; nothing refers to it now.
            unsafe { crate::platform::unmap(self.ptr, self.layout.size()) };
        } else {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBytes")
            .field("len", &self.len)
            .field("align", &self.align())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_padded() {
        for (len, align) in [
            (0, 64),
            (1, 4096),
            (4096, 4096),
            (5000, 4096),
            (33, 64),
            (3 << 20, 4096),
        ] {
            let mut b = AlignedBytes::zeroed(len, align).unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % align, 0);
            assert_eq!(b.len(), len);
            assert!(b.capacity() >= len && b.capacity().is_multiple_of(align));
            assert!(b.padded_mut().iter().all(|&x| x == 0));
        }
        let b = AlignedBytes::copy_from(&[1, 2, 3], 64).unwrap();
        assert_eq!(b.as_slice(), &[1, 2, 3]);
        assert!(b.region_ptr(60, 4).is_some());
        assert!(b.region_ptr(60, 5).is_none());
    }
}
